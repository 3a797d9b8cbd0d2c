"""Components under Pulumi's mocks: which resources each environment declares, and their shape."""
from __future__ import annotations

import json
from pathlib import Path

import pulumi
import pytest


class Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outputs = dict(args.inputs)
        if "metadata" in outputs and isinstance(outputs["metadata"], dict):
            outputs["metadata"] = {**outputs["metadata"]}
            outputs["metadata"].setdefault("name", args.name)
        return [args.name + "_id", outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, typ: str, name: str) -> pulumi.runtime.MockResourceArgs:
        (r,) = [r for r in self.of_type(typ) if r.inputs.get("metadata", {}).get("name") == name]
        return r


MOCKS = Mocks()
pulumi.runtime.set_mocks(MOCKS, preview=False)

from components import GpuFleet, GpuFleetArgs  # noqa: E402  (mocks first, then the code under test)
from components.reconciler import cluster_rules, namespace_rules  # noqa: E402
from fleetspec import labels, load_stack_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET_VALUE = "s3cr3t-munge-key-value"


def build(env: str):
    """Run the fleet under the mocks to completion: every child registered before we look."""
    spec = load_stack_file(ROOT / f"Pulumi.{env}.yaml").fleet
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        secrets = {k: pulumi.Output.secret(f"{SECRET_VALUE}-{k}") for k in spec.secret_keys()}
        GpuFleet(env, GpuFleetArgs(spec, secrets, local_kubeconfig="/tmp/kubeconfig"))

    program()
    return spec


K8S = "kubernetes:"
CR = "kubernetes:slinky.slurm.net/v1beta1:"


@pytest.mark.parametrize("env", ["local", "staging", "prod"])
def test_each_environment_declares_its_fleet(env):
    spec = build(env)
    types = [r.typ for r in MOCKS.resources]
    assert types.count("kubernetes:slinky.slurm.net/v1beta1:NodeSet") == len(spec.pools)
    assert types.count("kubernetes:core/v1:ConfigMap") == len(spec.pools) + 1  # capacity per pool + policy
    assert types.count("kubernetes:core/v1:PersistentVolumeClaim") == len(spec.storage)
    assert types.count("pulumi:providers:kubernetes") == 1
    assert "kubernetes:apps/v1:Deployment" in types and "kubernetes:policy/v1:PodDisruptionBudget" in types
    helm = types.count("kubernetes:helm.sh/v3:Release")
    crds = types.count("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    if spec.slurm.operator.mode == "helm":
        assert helm == 2 and crds == 1  # the operator charts; gpufleet's own Remediation CRD
    else:
        assert helm == 0 and crds == 7  # six Slinky kinds + Remediation
    # the resource count grows with pools, never with nodes
    assert len(MOCKS.resources) < 40 + 3 * len(spec.pools)



def test_components_are_parented_and_typed():
    build("prod")
    comps = {r.typ for r in MOCKS.resources if r.typ.startswith("gpufleet:")}
    assert comps == {"gpufleet:index:GpuFleet", "gpufleet:cluster:ClusterAccess", "gpufleet:pool:GpuNodePool",
                     "gpufleet:storage:SharedStorage", "gpufleet:slurm:SlinkySlurm",
                     "gpufleet:reconciler:Reconciler"}
    # every Kubernetes object carries the standard labels
    for r in MOCKS.resources:
        if r.typ.startswith(K8S) and "metadata" in r.inputs:
            lab = r.inputs["metadata"].get("labels", {})
            assert lab.get("app.kubernetes.io/part-of") == "gpufleet", r.name



def test_nodeset_per_pool_bound_by_selector_and_tolerations():
    spec = build("prod")
    for pool in spec.pools:
        ns = MOCKS.named(CR + "NodeSet", pool.name).inputs["spec"]
        assert ns["replicas"] == pool.nodes
        assert ns["template"]["spec"]["nodeSelector"] == {labels.POOL: pool.name}
        tol = ns["template"]["spec"]["tolerations"]
        assert {t["key"] for t in tol} == {t.key for t in pool.taints}
        assert labels.SPARE_TAINT not in {t["key"] for t in tol}  # never lands on an unpromoted spare
        assert ns["slurmd"]["resources"]["limits"]["nvidia.com/gpu"] == pool.gpus_per_node
        assert {m["mountPath"] for m in ns["slurmd"]["volumeMounts"]} == {"/checkpoints", "/datasets"}
    conf = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]["extraConf"]
    assert "PartitionName=train Nodes=h100-a,h100-b State=UP Default=YES" in conf



def test_pool_capacity_declares_spares_with_their_taint():
    spec = build("prod")
    for pool in spec.pools:
        cm = MOCKS.named("kubernetes:core/v1:ConfigMap", f"gpufleet-pool-{pool.name}")
        cap = json.loads(cm.inputs["data"]["capacity.json"])
        assert (cap["nodes"], cap["spares"], cap["provider"]) == (pool.nodes, pool.spares, pool.provider)
        assert cap["spareLabels"][labels.ROLE] == labels.ROLE_SPARE
        assert cap["activeLabels"][labels.ROLE] == labels.ROLE_ACTIVE
        assert {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"} in cap["spareTaints"]
        assert labels.SPARE_TAINT not in {t["key"] for t in cap["activeTaints"]}



def test_reconciler_rbac_is_least_privilege():
    for rule in cluster_rules() + namespace_rules():
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    verbs = {(g, r): set(v) for rule in cluster_rules() for g in rule["apiGroups"] for r in rule["resources"]
             for v in [rule["verbs"]]}
    assert verbs[("", "pods/eviction")] == {"create"}
    assert "delete" not in verbs[("", "nodes")] and "delete" not in verbs[("", "pods")]
    assert ("", "secrets") not in verbs


def test_reconciler_deployment_policy_and_bindings():
    spec = build("prod")
    cm = MOCKS.named("kubernetes:core/v1:ConfigMap", "gpufleet-policy")
    healing = json.loads(cm.inputs["data"]["fleet.json"])["healing"]
    assert healing == json.loads(spec.healing.model_dump_json())
    dep = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]
    assert dep["replicas"] == 2 and "--leader-elect" in dep["template"]["spec"]["containers"][0]["args"]
    pdb = MOCKS.named("kubernetes:policy/v1:PodDisruptionBudget", "gpufleet-reconciler").inputs["spec"]
    assert pdb["minAvailable"] == 1
    for b in MOCKS.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"):
        assert b.inputs["roleRef"]["name"] != "cluster-admin"
    privileged = [r.inputs["metadata"]["name"] for r in MOCKS.resources
                  if r.typ in ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet")
                  and any(c.get("securityContext", {}).get("privileged")
                          for c in r.inputs["spec"]["template"]["spec"]["containers"])]
    assert privileged == ["gpufleet-agent"]



def test_secrets_stay_secret():
    build("prod")
    holders = []
    for r in MOCKS.resources:
        text = json.dumps(r.inputs, default=str)
        if SECRET_VALUE in text:
            holders.append((r.typ, r.inputs["metadata"]["name"]))
    # the values reach exactly the Secrets that need them, and nothing else
    assert sorted(holders) == [("kubernetes:core/v1:Secret", "gpufleet-notifications"),
                               ("kubernetes:core/v1:Secret", "slurm-auth-jwths256"),
                               ("kubernetes:core/v1:Secret", "slurm-auth-slurm")]
    cm = MOCKS.named("kubernetes:core/v1:ConfigMap", "gpufleet-policy")
    assert '"url_secret": "slackWebhookUrl"' in cm.inputs["data"]["fleet.json"]


def test_missing_secret_is_refused_before_any_resource():
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        GpuFleet("prod-missing", GpuFleetArgs(spec, {"mungeKey": "x", "slurmJwtKey": "y"}))

    with pytest.raises(ValueError, match="slackWebhookUrl"):
        program()
    assert not [r for r in MOCKS.resources if r.name.startswith("prod-missing-")]
