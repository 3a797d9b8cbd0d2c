"""gpufleet's copy of slurm-operator v1.2.1's CRDs (crds-only mode) on a real API server: every
resource each environment's stack declares is accepted under strict field validation (kubectl's
default); a misspelt, misplaced or mistyped field, and what the release's validating webhook refuses
(internal/webhook/*_webhook.go: ClusterName over 40 characters, maxUnavailable 0, fields fixed after
deployment), is refused, as with the release; what the release accepts is accepted."""
from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.components.slinky import GROUP, KINDS, VERSION, crd_manifest
from tests.fixtures.kube_cluster import create_or_keep

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slinky_api(kube_cluster):
    api = kube_cluster.api_client()
    ext = client.ApiextensionsV1Api(api)
    for kind in KINDS:
        create_or_keep(ext.create_custom_resource_definition, crd_manifest(kind))
    deadline = time.monotonic() + 30
    for kind in KINDS:
        name = f"{kind.lower()}s.{GROUP}"
        while not any(c.type == "Established" and c.status == "True"
                      for c in (ext.read_custom_resource_definition(name).status.conditions or [])):
            assert time.monotonic() < deadline, f"CRD {name} not Established"
            time.sleep(0.2)
    core = client.CoreV1Api(api)
    for ns in ("slurm", "gpufleet-system", "crd-test"):
        create_or_keep(core.create_namespace, {"metadata": {"name": ns}})
    return client.CustomObjectsApi(api)


def create(api, kind: str, name: str, namespace: str, spec: dict, dry_run: bool = False):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, f"{kind.lower()}s", body,
                                               field_validation="Strict", dry_run="All" if dry_run else None)


@pytest.mark.parametrize("env", ["prod", "staging", "local"])
def test_every_slinky_resource_of_each_stack_is_accepted(slinky_api, env):
    from tests.unit.test_components import MOCKS, build  # the stack under Pulumi's mocks

    build(env)
    crs = [r for r in MOCKS.resources if r.typ.startswith(f"kubernetes:{GROUP}/{VERSION}:")]
    assert {"Controller", "NodeSet", "RestApi", "Token"} <= {r.typ.rsplit(":", 1)[-1] for r in crs}
    # A dry run in a namespace of the test's own: the schema and the CEL rules do not look at the namespace, and
    # the stack's own ("slurm") may hold the Slinky stand-in's NodeSets of the same names from other tests.
    for r in crs:
        meta = r.inputs["metadata"]
        create(slinky_api, r.typ.rsplit(":", 1)[-1], meta["name"], "crd-test", _ints(r.inputs["spec"]), dry_run=True)


def _ints(v):
    """Pulumi's mocks carry numbers as floats (a protobuf Struct); the engine sends 2 as 2, and CEL tells them apart."""
    if isinstance(v, dict):
        return {k: _ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_ints(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


KEYS = {"slurmKeyRef": {"name": "k", "key": "slurm.key"}, "jwtKeyRef": {"name": "j", "key": "jwt.key"}}


@pytest.mark.parametrize("kind,spec,needle", [
    ("Controller", {**KEYS, "clusterName": "c" * 41}, "ClusterName exceeds 40 characters"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}},
     "maxUnavailable must be > 0"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "updateStrategy": {"rollingUpdate": {"maxUnavailable": "0%"}}},
     "maxUnavailable must be > 0"),
    ("NodeSet", {"controllerRef": {"name": ""}}, "controllerRef.name must not be empty"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "updateStrategy": {"type": "ScheduledUpdate", "scheduledUpdate": {
        "startTime": "2026-12-01T00:00:00Z", "duration": "30s"}}}, "at least 1 minute"),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "taintKubeNodes": True}, 'unknown field "spec.taintKubeNodes"'),
    ("LoginSet", {"controllerRef": {"name": "slurm"}, "sssdConfRef": {"name": "", "key": "sssd.conf"}},
     "sssdConfRef.name must not be empty"),
])
def test_what_the_releases_webhook_refuses_is_refused(slinky_api, kind, spec, needle):
    with pytest.raises(ApiException) as err:
        create(slinky_api, kind, "bad", "crd-test", spec, dry_run=True)
    message = json.loads(err.value.body)["message"]
    assert err.value.status in (400, 422) and needle in message, message


def test_what_the_release_accepts_is_accepted_and_fixed_fields_stay_fixed(slinky_api):
    create(slinky_api, "NodeSet", "ok", "crd-test", {
        "controllerRef": {"name": "slurm"}, "pinToNode": True, "updateStrategy": {"type": "ScheduledUpdate",
        "scheduledUpdate": {"startTime": "2026-12-01T00:00:00Z", "duration": "2h"}},
        "partition": {"enabled": True, "config": "MaxTime=60"}}, dry_run=True)
    create(slinky_api, "Controller", "fixed", "crd-test", {**KEYS, "clusterName": "c" * 40,
                                                            "persistence": {"enabled": True}})
    for change, needle in (({"clusterName": "other"}, "cannot change ClusterName"),
                           ({"persistence": {"enabled": False}}, "cannot change persistence.enabled"),
                           ({"jwtKeyRef": {"name": "j2", "key": "jwt.key"}}, "JwtKeyRef or JwtHs256KeyRef")):
        with pytest.raises(ApiException) as err:
            slinky_api.patch_namespaced_custom_object(GROUP, VERSION, "crd-test", "controllers", "fixed",
                                                      {"spec": change})
        assert needle in json.loads(err.value.body)["message"]
    slinky_api.patch_namespaced_custom_object(GROUP, VERSION, "crd-test", "controllers", "fixed",
                                              {"spec": {"extraConf": "KillWait=5"}})


@pytest.mark.parametrize("kind,spec,needle", [
    ("LoginSet", {"controllerRef": {"name": "slurm"}, "sssdConfRefs": {"name": "s", "key": "sssd.conf"}},
     'unknown field "spec.sssdConfRefs"'),
    ("Accounting", {"slurmKeyRef": {"name": "k", "key": "k"}, "jwtKeyRef": {"name": "j", "key": "j"},
                    "passwordKeyRef": {"name": "db", "key": "password"}}, 'unknown field "spec.passwordKeyRef"'),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "partition": {"enabled": "yes"}}, "spec.partition.enabled"),
    ("Token", {"username": "slurm", "secretRef": {"name": "t", "key": "SLURM_JWT"}}, "jwtKeyRef or jwtHs256KeyRef"),
    ("Controller", {"slurmKeyRef": {"name": "k", "key": "k"}}, "jwtKeyRef or jwtHs256KeyRef"),
    ("RestApi", {"replicas": 1}, "spec.controllerRef"),
])
def test_a_misspelt_misplaced_or_mistyped_field_is_rejected(slinky_api, kind, spec, needle):
    with pytest.raises(ApiException) as err:
        create(slinky_api, kind, "bad", "crd-test", spec, dry_run=True)
    message = json.loads(err.value.body)["message"]
    assert err.value.status in (400, 422) and needle in message, message
