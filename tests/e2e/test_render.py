"""`gpufleet render` of the prod stack with the real engine, the operator's chart left out (it cannot
be fetched here): the manifests carry the pool labels, the config checksum, the IRSA role and the
Slinky fields the operator needs."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpufleet.components.slinky import KINDS, crd_manifest
from gpufleet.components.slinky_schema import strict_json_schema
from gpufleet.fleetspec import labels, load_stack_file

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rendered(pulumi_bin_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "prod"
    # Without the policy pack: prod's images-pinned rule blocks any deployment before a release recorded
    # the images' digests (tests/e2e/test_preview.py checks that); the manifests are what this checks.
    r = subprocess.run([sys.executable, "-m", "gpufleet", "render", "--stack", "prod", "--out", str(out),
                        "--without-operator-chart", "--no-policies"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "charts are left out of this render" in r.stderr and "slurm-operator-values.yaml" in r.stderr
    docs = [d for f in sorted(out.rglob("*.yaml")) if f.name != "slurm-operator-values.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]
    return out, docs


def find(docs, kind, name):
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_prod_manifests_carry_labels_checksum_and_irsa(rendered):
    out, docs = rendered
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet", (d["kind"], d["metadata"]["name"])
    dep = find(docs, "Deployment", "gpufleet-reconciler")
    tpl = dep["spec"]["template"]
    assert re.fullmatch(r"[0-9a-f]{64}", tpl["metadata"]["annotations"]["gpufleet.io/config-checksum"])
    assert tpl["spec"]["nodeSelector"] == spec.system_pool.node_selector
    sa = find(docs, "ServiceAccount", "gpufleet-reconciler")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == spec.healing.reconciler.iam_role_arn
    for pool in spec.pools:
        ns = find(docs, "NodeSet", pool.name)
        assert ns["spec"]["template"]["spec"]["nodeSelector"] == {labels.NODE_POOL: pool.name}
    assert find(docs, "PrometheusRule", "gpufleet-alerts")
    values = yaml.safe_load((out / "slurm-operator-values.yaml").read_text())
    assert values["certManager"] == {"enabled": True}
    assert not [d for d in docs if d["kind"] == "Release"]


def test_prod_slinky_manifests_fit_the_operator_schema(rendered):
    _, docs = rendered
    for d in docs:
        if d["apiVersion"] == "slinky.slurm.net/v1beta1":
            assert d["kind"] in KINDS
            schema = crd_manifest(d["kind"])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate({"apiVersion": d["apiVersion"], "kind": d["kind"], "spec": d["spec"]},
                                strict_json_schema(schema))  # slurm-operator 1.2.1's CRDs
    login = find(docs, "LoginSet", "login")["spec"]
    assert login["sssdConfRef"] == {"name": "slurm-sssd-conf", "key": "sssd.conf"}
    assert login["service"]["spec"]["type"] == "LoadBalancer"
    ctl = find(docs, "Controller", "slurm")["spec"]
    assert ctl["accountingRef"] == {"name": "slurm"} and "GresTypes=gpu" in ctl["extraConf"]
    assert ctl["persistence"]["resources"] == {"requests": {"storage": "20Gi"}}
    acct = find(docs, "Accounting", "slurm")["spec"]
    assert acct["storageConfig"]["passwordKeyRef"] == {"name": "slurm-accounting-db", "key": "password"}
    token = find(docs, "Token", "gpufleet-reconciler")
    assert token["metadata"]["namespace"] == "slurm" and token["spec"]["username"] == "gpufleet"  # beside its key
    assert "DisableRootJobs=YES" in ctl["extraConf"].splitlines()
    assert find(docs, "RestApi", "slurm")  # its Service: slurm-restapi (restapi_keys.go)
    args = find(docs, "Deployment", "gpufleet-reconciler")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--slurm-url") + 1] == "http://slurm-restapi.slurm:6820"
    assert args[args.index("--slurm-token-secret") + 1] == "slurm/gpufleet-reconciler-slurm-token/SLURM_JWT"


def test_prod_render_holds_no_secret_value_and_names_the_secrets_to_provide(rendered):
    """Issue 24: a render applied as-is by a GitOps tool must not carry a placeholder for the Slurm key or the
    JWT key. The Secrets holding a stack secret are left out and named; Secrets without one stay."""
    out, docs = rendered
    secrets = {f"{d['metadata'].get('namespace', '')}/{d['metadata']['name']}" for d in docs if d["kind"] == "Secret"}
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    assert secrets == {f"{spec.slurm.namespace}/slurm-sssd-conf"}  # no stack secret in it: rendered
    required = (out / "SECRETS-REQUIRED.md").read_text()
    for name, config_key in [(f"{spec.slurm.namespace}/slurm-auth-slurm", spec.slurm.munge_key_secret),
                             (f"{spec.slurm.namespace}/slurm-auth-jwt", spec.slurm.jwt_key_secret),
                             (f"{spec.healing.reconciler.namespace}/gpufleet-notifications", "slackWebhookUrl")]:
        assert f"Secret `{name}`" in required and f"(stack secret `{config_key}`)" in required, (name, required)
    assert f"Secret `{spec.healing.reconciler.namespace}/slurm-auth-jwt`" not in required  # the key stays with Slurm
    text = "".join(f.read_text() for f in out.rglob("*") if f.is_file())
    assert "gpufleet-render-placeholder" not in text and "placeholder-not-a-real-secret" not in text
