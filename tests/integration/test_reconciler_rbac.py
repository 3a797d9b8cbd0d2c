"""The reconciler's RBAC is exactly what it uses, enforced by a real API server.

Each call the reconciler makes (reconciler/adapters/kube.py, records.py, leader.py, providers.py) is made
here with a ServiceAccount token minted for a ServiceAccount bound to the stack's rules (components/reconciler.py): every call is allowed, and for each granted verb a ServiceAccount bound to
the rules minus that one verb is refused (403) the call that needs it. A verb the reconciler stopped
using, or a call that needs a verb not granted, fails here before a pod finds out.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from components.reconciler import cluster_rules, namespace_rules
from fleetspec import labels, load_stack_file, remediation_crd
from gpufleet.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = "gpufleet-rbac"
NODE = "rbac-target"
GROUP, VERSION, PLURAL = labels.GROUP, remediation_crd.manifest()["spec"]["versions"][0]["name"], remediation_crd.PLURAL


@dataclass(frozen=True)
class Call:
    group: str
    resource: str
    verb: str
    namespaced: bool
    run: Callable[[client.ApiClient], object]


def _watch_once(fn, *args):
    w = watch.Watch()
    for _ in w.stream(fn, *args, timeout_seconds=1, _request_timeout=5):
        break
    w.stop()


def _remediation(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": remediation_crd.manifest()["spec"]["names"]["kind"],
            "metadata": {"name": name}, "spec": {"node": NODE, "pool": "h100", "xid": 79}}


def _write_remediation_status(api: client.ApiClient) -> None:
    c = client.CustomObjectsApi(api)
    # read through list (the verb the reconciler holds), then replace the status (records.py write_status)
    obj = next(o for o in c.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
               if o["metadata"]["name"] == "rbac-existing")
    obj["status"] = {"phase": "Detected"}
    c.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, "rbac-existing", obj)


def _update_node(api: client.ApiClient) -> None:
    # kube.update_node reads with get and writes back with update; the body is the admin's read, so this
    # call needs `update` alone (a stale resourceVersion answers 409: authorized all the same).
    client.CoreV1Api(api).replace_node(NODE, _admin_node)


_admin_node: object = None  # the node as last read by the admin (so an update needs only `update`)
_admin_lease: object = None


def _update_lease(api: client.ApiClient) -> None:
    client.CoordinationV1Api(api).replace_namespaced_lease("rbac-existing", NS, _admin_lease)


CALLS = [
    Call("", "nodes", "get", False, lambda a: client.CoreV1Api(a).read_node(NODE)),
    Call("", "nodes", "list", False, lambda a: client.CoreV1Api(a).list_node(limit=1)),
    Call("", "nodes", "watch", False, lambda a: _watch_once(client.CoreV1Api(a).list_node)),
    Call("", "nodes", "patch", False,
         lambda a: client.CoreV1Api(a).patch_node(NODE, {"metadata": {"annotations": {"gpufleet.io/rbac": "x"}}})),
    Call("", "nodes", "update", False, _update_node),
    Call("", "pods", "list", False, lambda a: client.CoreV1Api(a).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={NODE}")),
    Call("", "pods", "watch", False, lambda a: _watch_once(client.CoreV1Api(a).list_pod_for_all_namespaces)),
    Call("", "pods/eviction", "create", False, lambda a: client.CoreV1Api(a).create_namespaced_pod_eviction(
        "no-such-pod", "default", {"metadata": {"name": "no-such-pod", "namespace": "default"}})),  # 404: allowed
    Call("", "events", "create", False, lambda a: client.CoreV1Api(a).create_namespaced_event("default", {
        "metadata": {"generateName": "rbac-"}, "involvedObject": {"kind": "Node", "name": NODE},
        "reason": "RbacTest", "message": "m", "type": "Normal"})),
    Call(GROUP, PLURAL, "list", False, lambda a: client.CustomObjectsApi(a).list_cluster_custom_object(
        GROUP, VERSION, PLURAL)),
    Call(GROUP, PLURAL, "watch", False, lambda a: _watch_once(
        client.CustomObjectsApi(a).list_cluster_custom_object, GROUP, VERSION, PLURAL)),
    Call(GROUP, PLURAL, "create", False, lambda a: client.CustomObjectsApi(a).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, _remediation("rbac-existing"))),  # 409 after the first: allowed
    Call(GROUP, f"{PLURAL}/status", "update", False, _write_remediation_status),
    Call(GROUP, PLURAL, "delete", False, lambda a: client.CustomObjectsApi(a).delete_cluster_custom_object(
        GROUP, VERSION, PLURAL, "no-such-remediation")),  # 404: allowed (retention, records.py)
    Call("coordination.k8s.io", "leases", "get", True,
         lambda a: client.CoordinationV1Api(a).read_namespaced_lease("rbac-existing", NS)),
    Call("coordination.k8s.io", "leases", "create", True, lambda a: client.CoordinationV1Api(a).create_namespaced_lease(
        NS, {"metadata": {"name": "rbac-existing"}, "spec": {"holderIdentity": "x"}})),  # 409: allowed
    Call("coordination.k8s.io", "leases", "update", True, _update_lease),
    # kubernetes-spares refills: placeholder pods in the reconciler's namespace (reconciler/adapters/providers.py)
    Call("", "pods", "create", True, lambda a: client.CoreV1Api(a).create_namespaced_pod(NS, {
        "metadata": {"name": "rbac-capacity-request"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})),  # 409 after the first
    # ... deleted again; a NodeSet pod a stale busy-pod PDB keeps at the drain timeout (healing), and any
    # borrower still there after the reclaim grace (lending) (cluster-wide: that covers the placeholders too)
    Call("", "pods", "delete", False, lambda a: client.CoreV1Api(a).delete_namespaced_pod(
        "no-such-pod", "default")),  # 404: allowed
    # the lending ledger (reconciler/adapters/kube.py read_ledger, write_ledger)
    Call("", "configmaps", "get", True, lambda a: client.CoreV1Api(a).read_namespaced_config_map(
        labels.LENDING_LEDGER, NS)),  # 404: allowed
    Call("", "configmaps", "patch", True, lambda a: client.CoreV1Api(a).patch_namespaced_config_map(
        labels.LENDING_LEDGER, NS, {"data": {"rbac": "x"}})),  # 404: allowed
]


def granted(spec) -> set[tuple[str, str, str, bool]]:
    out = set()
    for rules, namespaced in ((cluster_rules(spec), False), (namespace_rules(spec), True)):
        for r in rules:
            out |= {(g, res, v, namespaced) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    return out


def without(rules: list[dict], group: str, resource: str, verb: str) -> list[dict]:
    out = []
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"]:
            verbs = [v for v in r["verbs"] if v != verb]
            if verbs:
                out.append({**r, "verbs": verbs})
        else:
            out.append(r)
    return out


@pytest.fixture(scope="module")
def spec():
    return load_stack_file(ROOT / "Pulumi.local.yaml").fleet


@pytest.fixture(scope="module")
def cluster(kube_cluster, spec):
    """The Remediation CRD, a node, a namespace with a Lease and a Remediation to act on (as admin)."""
    global _admin_node, _admin_lease
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(remediation_crd.manifest())
    except ApiException as e:
        if e.status != 409:
            raise
    wait_for("remediation CRD served", lambda: _served(api), timeout=30)
    for create in (lambda: core.create_namespace({"metadata": {"name": NS}}),
                   lambda: core.create_node({"metadata": {"name": NODE}}),
                   lambda: client.CoordinationV1Api(api).create_namespaced_lease(
                       NS, {"metadata": {"name": "rbac-existing"}, "spec": {"holderIdentity": "x"}}),
                   lambda: client.CustomObjectsApi(api).create_cluster_custom_object(
                       GROUP, VERSION, PLURAL, _remediation("rbac-existing"))):
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise
    _admin_node = core.read_node(NODE)
    _admin_lease = client.CoordinationV1Api(api).read_namespaced_lease("rbac-existing", NS)
    return kube_cluster


def _served(api) -> bool:
    try:
        client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return True
    except ApiException:
        return False


def token_for(kube, name: str, cluster_rules_: list[dict], ns_rules: list[dict]) -> client.ApiClient:
    """A ServiceAccount bound to these rules, and an API client with a token minted for it (TokenRequest)."""
    api = kube.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
    ref = lambda kind: {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}  # noqa: E731
    for create in (lambda: core.create_namespaced_service_account(NS, {"metadata": {"name": name}}),
                   lambda: rbac.create_cluster_role({"metadata": {"name": name}, "rules": cluster_rules_}),
                   lambda: rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": ref("ClusterRole"),
                                                             "subjects": subject}),
                   lambda: rbac.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": ns_rules}),
                   lambda: rbac.create_namespaced_role_binding(NS, {"metadata": {"name": name}, "roleRef": ref("Role"),
                                                                    "subjects": subject})):
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise
    token = core.create_namespaced_service_account_token(
        name, NS, {"spec": {"expirationSeconds": 600}}).status.token
    cfg = client.Configuration()
    cfg.host = kube.server_url
    cfg.ssl_ca_cert = str(kube.pki.ca_cert)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def status_of(call: Call, api: client.ApiClient) -> int:
    try:
        call.run(api)
        return 200
    except ApiException as e:
        return e.status


def test_the_rules_are_exactly_the_calls(spec):
    assert granted(spec) == {(c.group, c.resource, c.verb, c.namespaced) for c in CALLS}


def test_every_call_is_allowed_with_the_reconcilers_token(cluster, spec):
    api = token_for(cluster, "reconciler", cluster_rules(spec), namespace_rules(spec))
    refused = {(c.resource, c.verb): s for c in CALLS if (s := status_of(c, api)) == 403}
    assert refused == {}


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.resource}-{c.verb}")
def test_one_verb_fewer_is_refused(cluster, spec, call):
    name = f"minus-{call.resource.replace('/', '-').replace('.', '-')}-{call.verb}"[:60]
    cr, nr = cluster_rules(spec), namespace_rules(spec)
    if call.namespaced:
        nr = without(nr, call.group, call.resource, call.verb)
    else:
        cr = without(cr, call.group, call.resource, call.verb)
    api = token_for(cluster, name, cr, nr)
    assert status_of(call, api) == 403
