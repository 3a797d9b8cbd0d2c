"""`gpufleet preflight`: what each stack needs of a cluster, decided from what the cluster shows
(`evaluate` is pure; tests/integration/test_preflight.py runs it against the local API server)."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpufleet.fleetspec import labels, load_stack_file
from gpufleet import preflight as pf
from gpufleet.cli import app
from tests.unit.test_components import ROOT

PROD = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
STAGING = load_stack_file(ROOT / "Pulumi.staging.yaml").fleet


def _gpu_nodes(spec, gpus=None):
    return tuple({"name": f"{p.name}-{i}", "labels": {labels.NODE_POOL: p.name}, "gpus": p.gpus_per_node if gpus is None else gpus}
                 for p in spec.pools for i in range(2))


def ready_cluster(spec, **over) -> pf.ClusterFacts:
    """A cluster with everything `spec` needs."""
    crds = {c: {} for c in (*pf.CERT_MANAGER_CRDS, pf.PROMETHEUS_RULE_CRD, pf.AWS_LB_CONTROLLER_CRD)}
    classes = {"gp3": True, "fsx-lustre": False}
    facts = dict(crds=crds, storage_classes=classes, nodes=_gpu_nodes(spec), namespaces={"kube-system": {}})
    facts.update(over)
    return pf.ClusterFacts(**facts)


def missing(findings) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in findings:
        if not f.ok:
            out.setdefault(f.check, []).append(f.detail)
    return out


@pytest.mark.parametrize("spec", [PROD, STAGING], ids=["prod", "staging"])
def test_a_cluster_with_every_prerequisite_passes(spec):
    findings = pf.evaluate(spec, ready_cluster(spec))
    assert missing(findings) == {}
    assert {f.check for f in findings} >= {"storage-class", "gpu-device-plugin", "pod-security", "slinky-operator"}


def test_a_bare_cluster_names_each_missing_prerequisite_of_prod():
    bad = missing(pf.evaluate(PROD, pf.ClusterFacts(
        nodes=({"name": "h100-a-0", "labels": {"eks.amazonaws.com/nodegroup": "gpu-prod-h100-a"}, "gpus": 0},),
        namespaces={"slurm": {pf.PSA_ENFORCE: "baseline"}})))
    assert set(bad) == {"cert-manager", "prometheus-operator", "storage-class", "gpu-device-plugin",
                        "load-balancer-controller", "pod-security"}
    assert any("fsx-lustre" in d for d in bad["storage-class"]) and any("gp3" in d for d in bad["storage-class"])
    assert any("pool h100-a: 1 of 1 node(s) advertise fewer than 8" in d for d in bad["gpu-device-plugin"])
    assert any("pool a100: no node" in d for d in bad["gpu-device-plugin"])
    assert bad["pod-security"] == ["namespace slurm: enforce=baseline (slurmd runs privileged in NodeSet pods)"]


def test_staging_needs_no_cert_manager_prometheus_or_load_balancer_controller():
    facts = ready_cluster(STAGING, crds={})
    assert missing(pf.evaluate(STAGING, facts)) == {}


def test_a_claim_without_a_class_needs_a_default_one():
    facts = ready_cluster(STAGING, storage_classes={"gp3": False, "fsx-lustre": False})
    doc = STAGING.model_copy(update={"slurm": STAGING.slurm.model_copy(update={
        "controller_storage": STAGING.slurm.controller_storage.model_copy(update={"storage_class": None})})})
    assert "default missing" in missing(pf.evaluate(doc, facts))["storage-class"][0]
    assert missing(pf.evaluate(doc, ready_cluster(STAGING))) == {}


@pytest.mark.parametrize("operators,crd_labels,expect", [
    ((), {}, None),
    (({"namespace": "slinky", "name": "slurm-operator", "version": "1.0.1"},), {}, "gpufleet pins 1.2.1"),
    (({"namespace": "slinky", "name": "slurm-operator", "version": "1.2.1"},), {}, "would collide"),
    ((), {"app.kubernetes.io/managed-by": "Helm"}, "would collide"),
    ((), {"gpufleet.io/slinky-definitions": "crds-only"}, "gpufleet's own Slinky definitions"),
])
def test_an_existing_slinky_operator_is_named_with_its_version(operators, crd_labels, expect):
    crds = dict(ready_cluster(PROD).crds)
    if crd_labels:
        crds.update({c: crd_labels for c in pf.SLINKY_CRDS})
    bad = missing(pf.evaluate(PROD, ready_cluster(PROD, crds=crds, slinky_operators=operators)))
    if expect is None:
        assert "slinky-operator" not in bad
    else:
        assert expect in bad["slinky-operator"][0]


def test_pulumi_up_of_a_real_stack_stops_when_preflight_fails(monkeypatch):
    """`gpufleet pulumi -s prod up` runs the preflight first: a missing prerequisite stops it before
    pulumi runs (exec is never reached)."""
    import os

    from gpufleet import stack as stack_mod

    monkeypatch.setattr(stack_mod, "pulumi_binary", lambda: "/bin/false")
    monkeypatch.setattr(pf, "run_preflight", lambda spec, path, ctx: pf.evaluate(spec, pf.ClusterFacts()))
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("pulumi ran despite a failed preflight"))
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://example-state")
    r = CliRunner().invoke(app, ["pulumi", "-s", "prod", "up", "--yes"])
    assert r.exit_code == 1, r.output
    assert "MISSING  cert-manager" in r.output and "`pulumi up` not run" in r.output
