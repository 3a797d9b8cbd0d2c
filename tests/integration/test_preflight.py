"""`gpufleet preflight` against the local control plane, which lacks on purpose most of what a real
cluster needs for prod: each missing prerequisite is named, with exit 1; what it has passes."""
from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from gpufleet.components.slinky import KINDS, crd_manifest
from gpufleet.cli import app
from localenv.fake_nodes import fake_node
from tests.fixtures.kube_cluster import create_or_keep
from tests.unit.test_components import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    # A prod pool's node that joined without a device plugin, and gpufleet's own Slinky definitions.
    core.create_node(fake_node("pf-h100-a-0", {"eks.amazonaws.com/nodegroup": "gpu-prod-h100-a"}, [], cpus=8,
                               memory="32Gi", gpus=0))
    try:
        core.create_namespace({"metadata": {"name": "slurm", "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    except ApiException as e:
        if e.status != 409:
            raise
        core.patch_namespace("slurm", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    for kind in KINDS:
        create_or_keep(client.ApiextensionsV1Api(api).create_custom_resource_definition, crd_manifest(kind))
    yield kube_cluster
    core.delete_node("pf-h100-a-0")
    core.patch_namespace("slurm", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": None}}})


def test_prod_against_the_local_cluster_names_each_missing_prerequisite(cluster, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(app, ["preflight", "--stack", "prod", "--kubeconfig", str(cluster.kubeconfig_path),
                                 "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.output)
    bad = {}
    for f in doc["findings"]:
        if not f["ok"]:
            bad.setdefault(f["check"], []).append(f["detail"])
    assert set(bad) == {"cert-manager", "prometheus-operator", "storage-class", "gpu-device-plugin",
                        "load-balancer-controller", "pod-security", "slinky-operator"}, bad
    assert any("fsx-lustre missing" in d for d in bad["storage-class"])
    assert any("h100-a: 1 of 1 node(s) advertise fewer than 8" in d for d in bad["gpu-device-plugin"])
    assert bad["pod-security"] == ["namespace slurm: enforce=baseline (slurmd runs privileged in NodeSet pods)"]
    assert "gpufleet's own Slinky definitions" in bad["slinky-operator"][0]


def test_the_human_readable_report_gives_the_fix(cluster, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(app, ["preflight", "--stack", "prod", "--kubeconfig", str(cluster.kubeconfig_path)])
    assert r.exit_code == 1
    assert "MISSING  cert-manager" in r.output and "fix: install cert-manager" in r.output
    assert "checks passed; " in r.output and " missing" in r.output
