"""The Slinky side of the stack against the pinned slurm-operator release (1.2.1): every environment's
resources fit that release's schema, and carry what it needs to deploy (issue 20, items 1, 2 and 4).

The schema is components/slinky_schema.py, written from slurm-operator v1.2.1
config/crd/bases/slinky.slurm.net_*.yaml (scripts/check-slinky-schema.py compares the two); the CEL
rules, its own and the webhook's, run on a real API server in tests/integration/test_slinky_crds.py.
"""
from __future__ import annotations

import jsonschema
import pytest
import yaml

from gpufleet.components.slinky import (
    config_files, controller_extra_conf, login_service, restapi_url, topology_yaml,
)
from gpufleet.components.slinky_schema import KINDS, WEBHOOK_RULES, crd_manifest, strict_json_schema
from gpufleet.fleetspec import CONFIG_KEY, SpecError, parse_fleet
from gpufleet.fleetspec.models import SLINKY_RELEASE, SLURM_IMAGE_TAG
from tests.unit.test_components import CR, MOCKS, ROOT, build

ENVS = ["local", "staging", "prod"]


def _schema(kind: str) -> dict:
    return strict_json_schema(crd_manifest(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _crs(kind: str) -> list:
    return MOCKS.of_type(CR + kind)


def _spec_doc(env: str = "prod") -> dict:
    return yaml.safe_load((ROOT / f"Pulumi.{env}.yaml").read_text())["config"][CONFIG_KEY]


@pytest.mark.parametrize("env", ENVS)
def test_every_environment_renders_slinky_resources_the_pinned_release_accepts(env):
    """Each CR, as Pulumi would send it, against the release's schema with unknown fields refused."""
    build(env)
    seen = {}
    for kind in KINDS:
        for r in _crs(kind):
            body = {"apiVersion": r.inputs["apiVersion"], "kind": kind, "spec": r.inputs["spec"]}
            jsonschema.validate(body, _schema(kind))
            seen[kind] = seen.get(kind, 0) + 1
    assert {"Controller", "NodeSet", "LoginSet", "RestApi", "Token"} <= set(seen)
    assert seen["Controller"] == 1


@pytest.mark.parametrize("kind,spec,where", [
    # fields of other releases, or misspelt: v1.0.x's NodeSet.taintKubeNodes is gone in 1.2.0
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "taintKubeNodes": True}, "taintKubeNodes"),
    ("NodeSet", {"controllerRef": {"name": "slurm", "namespace": "slurm"}}, "namespace"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "updateStrategy": {"type": "Recreate"}}, "Recreate"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "scalingMode": "Deployment"}, "Deployment"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "partition": {"config": "MaxTime=1"}}, "enabled"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "partition": {"enabled": True, "config": "a\nb"}}, "config"),
    ("NodeSet", {"replicas": 2}, "controllerRef"),
    ("LoginSet", {"controllerRef": {"name": "slurm"}}, "sssdConfRef"),
    ("Controller", {"persistence": {"size": "4Gi"}}, "size"),
    ("Controller", {"persistence": {"enabled": True, "resources": {"requests": {"storage": "4 gigs"}}}}, "4 gigs"),
    ("Controller", {"externalConfig": {"host": "ctld"}}, "port"),
    ("Accounting", {"storageConfig": {"host": "db"}}, "passwordKeyRef"),
    ("Token", {"jwtKeyRef": {"name": "k", "key": "jwt.key"}}, "username"),
    ("Token", {"username": "slurm", "secretRef": {"name": "s"}}, "key"),
])
def test_the_pinned_schema_refuses_what_the_release_refuses(kind, spec, where):
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate({"spec": spec}, _schema(kind))
    assert where in str(e.value)


def test_the_pinned_schema_accepts_the_releases_own_fields():
    """What 1.2.x added (and gpufleet does not write) is accepted, as by the release."""
    jsonschema.validate({"spec": {"controllerRef": {"name": "slurm"}, "pinToNode": True, "oversubscribeNode": False,
                                  "pruneSlurmNodeRecords": "NodeNotFound", "ordinalPadding": 3,
                                  "updateStrategy": {"type": "ScheduledUpdate",
                                                     "scheduledUpdate": {"startTime": "2026-12-01T00:00:00Z",
                                                                         "duration": "2h", "flags": ["MAINT"]}},
                                  "workloadDisruptionProtection": False}}, _schema("NodeSet"))
    jsonschema.validate({"spec": {"persistence": {"enabled": True, "existingClaim": "state"},
                                  "metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "30s"}},
                                  "jwksKeyRef": {"name": "jwks", "key": "jwks.json"}}}, _schema("Controller"))
    jsonschema.validate({"status": {"nodeSetHash": "abc", "selector": "app=x", "slurmIdle": 3,
                                    "ordinalToNode": {"0": "node-a"}}}, _schema("NodeSet"))


def test_local_definitions_carry_the_webhooks_rules_and_the_crd_shape():
    for kind in KINDS:
        crd = crd_manifest(kind)
        version = crd["spec"]["versions"][0]
        rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"].get("x-kubernetes-validations", [])
        ours = [r for r in rules if r["message"].endswith("(slurm-operator webhook)")]
        assert len(ours) == len(WEBHOOK_RULES[kind])
        assert crd["metadata"]["labels"]["gpufleet.io/slinky-release"] == SLINKY_RELEASE
        assert ("scale" in version["subresources"]) == (kind in ("NodeSet", "LoginSet"))
    ctl = crd_manifest("Controller")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert any("size(self.clusterName) <= 40" in r["rule"] for r in ctl["x-kubernetes-validations"])
    assert crd_manifest("Controller", with_webhook=False)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["x-kubernetes-validations"][0]["rule"].startswith("!self.external")


# --- item 1: one release, one Slurm, one REST version ---------------------------------------------------

@pytest.mark.parametrize("env", ENVS)
def test_every_environment_runs_the_pinned_release_and_its_slurm(env):
    spec = build(env)
    assert spec.slurm.operator.chart_version == SLINKY_RELEASE == "1.2.1"
    assert spec.slurm.image_tag == SLURM_IMAGE_TAG == "26.05-ubuntu26.04"
    images = {r.inputs["spec"][c]["image"] for r in MOCKS.resources if r.typ.startswith(CR)
              for c in ("slurmctld", "slurmd", "slurmrestd", "slurmdbd", "login") if c in r.inputs.get("spec", {})}
    assert images and all(i.endswith(":26.05-ubuntu26.04") for i in images)
    for rel in MOCKS.of_type("kubernetes:helm.sh/v3:Release"):
        assert rel.inputs["version"] == "1.2.1"


@pytest.mark.parametrize("field,value,message", [
    ("operator", {"mode": "helm", "chart_version": "1.0.1"}, "pins slurm-operator 1.2.1"),
    ("image_tag", "25.11-ubuntu24.04", "26.05"),
    ("cluster_name", "a" * 41, "40"),
    ("nodeset_update", {"max_unavailable": 0}, "at least 1"),
    ("nodeset_update", {"max_unavailable": "0%"}, "percentage"),
    ("extra_conf", ["ReturnToService=1"], "set by gpufleet or the Slinky operator"),
    ("extra_conf", ["PartitionName=x Nodes=y"], "set by gpufleet or the Slinky operator"),
    ("extra_conf", ["KillWait"], "Key=Value"),
])
def test_the_spec_refuses_what_the_pinned_release_would(field, value, message):
    doc = _spec_doc()
    doc["slurm"][field] = value
    with pytest.raises(SpecError) as e:
        parse_fleet(doc)
    assert message in str(e.value) and f"slurm.{field}" in str(e.value)


# --- item 4: the prod stack deploys on the pinned release -------------------------------------------------

def test_prod_controller_keeps_its_state_on_a_claim_the_spec_sizes():
    spec = build("prod")
    ctl = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]
    assert ctl["persistence"] == {"enabled": True, "accessModes": ["ReadWriteOnce"],
                                  "resources": {"requests": {"storage": "20Gi"}}, "storageClassName": "gp3"}
    assert spec.slurm.controller_storage.size == "20Gi"
    assert ctl["clusterName"] == spec.slurm.cluster_name and len(ctl["clusterName"]) <= 40


@pytest.mark.parametrize("env", ENVS)
def test_partitions_are_gpufleets_only_and_nothing_duplicates_the_operators_lines(env):
    """slurm-operator v1.2.1 controllerbuilder/controller_config.go writes `NodeSet=<name> Feature=<name>`
    for each NodeSet (and a partition per NodeSet when partition.enabled): gpufleet writes neither, so
    `sbatch -p <pool>` finds no partition around gpufleet's limits."""
    spec = build(env)
    extra = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]["extraConf"].splitlines()
    keys = [line.split("=", 1)[0] for line in extra]
    assert "NodeSet" not in keys and keys.count("GresTypes") == 1 and keys.count("ReturnToService") == 1
    parts = [line for line in extra if line.startswith("PartitionName=")]
    assert [p.split()[0].split("=")[1] for p in parts] == [p.name for p in spec.slurm.partitions]
    for pool in spec.pools:
        ns = MOCKS.named(CR + "NodeSet", pool.name).inputs["spec"]
        assert ns["partition"] == {"enabled": False}
        assert ns["extraConf"] == f"Gres=gpu:{pool.gpus_per_node}"  # Features=<NodeSet> is the operator's
    infer = next((p for p in parts if p.startswith("PartitionName=infer ")), None)
    if infer:
        assert "MaxTime=1-00:00:00" in infer or env != "prod"


def test_the_stack_declares_return_to_service_and_extra_lines_reach_every_environment():
    doc = _spec_doc("staging")
    doc["slurm"]["extra_conf"] = ["SchedulerParameters=sched_interval=2", "KillWait=5"]
    conf = controller_extra_conf(parse_fleet(doc))
    assert conf.splitlines()[:3] == ["DisableRootJobs=YES", "GresTypes=gpu", "ReturnToService=2"]
    assert conf.endswith("SchedulerParameters=sched_interval=2\nKillWait=5\n")


@pytest.mark.parametrize("env", ENVS)
def test_gpu_pools_update_one_node_at_a_time(env):
    spec = build(env)
    for pool in spec.pools:
        ns = MOCKS.named(CR + "NodeSet", pool.name).inputs["spec"]
        assert ns["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_gres_and_topology_files_are_ones_the_webhook_knows():
    build("prod")
    data = MOCKS.named("kubernetes:core/v1:ConfigMap", "slurm-config-files").inputs["data"]
    assert set(data) == {"gres.conf", "topology.yaml"}
    assert "AutoDetect=nvidia" in data["gres.conf"] and "nvml" not in data["gres.conf"]
    topo = yaml.safe_load(data["topology.yaml"])
    assert topo == [{"topology": "flat", "cluster_default": True, "flat": True},
                    {"topology": "blocks", "block": {"block_sizes": [128],
                                                      "blocks": [{"block": "block-a"}, {"block": "block-b"}]}}]
    extra = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]["extraConf"]
    assert "PartitionName=train Nodes=h100-a,h100-b State=UP Default=YES Topology=blocks" in extra
    assert "PartitionName=infer Nodes=l40s State=UP MaxTime=1-00:00:00\n" in extra  # no block: flat
    doc = _spec_doc("staging")
    for pool in doc["pools"]:
        pool.pop("topology_block", None)
    assert topology_yaml(parse_fleet(doc)) is None and set(config_files(parse_fleet(doc))) == {"gres.conf"}


def test_endpoints_name_the_services_the_operator_creates():
    """api/v1beta1/loginset_keys.go, restapi_keys.go at v1.2.1: a LoginSet's Service is named after it,
    a RestApi's `<name>-restapi`."""
    spec = build("prod")
    assert login_service(spec) == "login.slurm.svc:22"
    assert restapi_url(spec) == "http://slurm-restapi.slurm:6820"
    assert MOCKS.named(CR + "LoginSet", "login") and MOCKS.named(CR + "RestApi", "slurm")
