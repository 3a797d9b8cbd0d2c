"""gpufleet's Slinky CRDs (crds-only mode) on a real API server: every resource the prod stack
declares is accepted under strict field validation (kubectl's default), and a misspelt, misplaced
or mistyped field is rejected, as the operator's own CRDs would reject it."""
from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.slinky import GROUP, KINDS, VERSION, crd_manifest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slinky_api(kube_cluster):
    api = kube_cluster.api_client()
    ext = client.ApiextensionsV1Api(api)
    for kind in KINDS:
        try:
            ext.create_custom_resource_definition(crd_manifest(kind))
        except ApiException as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + 30
    for kind in KINDS:
        name = f"{kind.lower()}s.{GROUP}"
        while not any(c.type == "Established" and c.status == "True"
                      for c in (ext.read_custom_resource_definition(name).status.conditions or [])):
            assert time.monotonic() < deadline, f"CRD {name} not Established"
            time.sleep(0.2)
    core = client.CoreV1Api(api)
    for ns in ("slurm", "gpufleet-system", "crd-test"):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as e:
            if e.status != 409:
                raise
    return client.CustomObjectsApi(api)


def create(api, kind: str, name: str, namespace: str, spec: dict, dry_run: bool = False):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, f"{kind.lower()}s", body,
                                               field_validation="Strict", dry_run="All" if dry_run else None)


def test_every_slinky_resource_of_the_prod_stack_is_accepted(slinky_api):
    from tests.unit.test_components import MOCKS, build  # the prod stack under Pulumi's mocks

    build("prod")
    crs = [r for r in MOCKS.resources if r.typ.startswith(f"kubernetes:{GROUP}/{VERSION}:")]
    assert {r.typ.rsplit(":", 1)[-1] for r in crs} == set(KINDS)
    for r in crs:
        meta = r.inputs["metadata"]
        create(slinky_api, r.typ.rsplit(":", 1)[-1], meta["name"], meta["namespace"], r.inputs["spec"])


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
