"""The reconciler's RBAC is exactly what it uses, enforced by a real API server.

Each call the reconciler makes (reconciler/adapters/kube.py, records.py, leader.py, providers.py,
runtime/executor.py) is made here with a ServiceAccount token minted for a ServiceAccount bound to the stack's
rules (components/reconciler.py: cluster-wide, in its own namespace, in the Slurm namespace), for a stack that
lends (Pulumi.local.yaml) and one that does not (Pulumi.staging.yaml): every call is allowed, and for each
granted verb a ServiceAccount bound to the rules minus that one verb is refused (403) a call that needs it.
A verb the reconciler stopped using, or a call that needs a verb not granted, fails here before a pod finds out.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpufleet.components.reconciler import cluster_rules, namespace_rules, slurm_namespace_rules
from gpufleet.fleetspec import labels, load_stack_file, remediation_crd
from tests.fixtures.kube_cluster import create_or_keep

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = "gpufleet-rbac"              # the reconciler's namespace
SLURM_NS = "gpufleet-rbac-slurm"  # the Slurm namespace (its NodeSet pods)
CLUSTER = "*"                     # a grant's scope: cluster-wide (a ClusterRole)
SPECS = {"lends": load_stack_file(ROOT / "Pulumi.local.yaml").fleet,
         "plain": load_stack_file(ROOT / "Pulumi.staging.yaml").fleet}
NODE = "rbac-target"
GROUP, VERSION, PLURAL = labels.GROUP, remediation_crd.manifest()["spec"]["versions"][0]["name"], remediation_crd.PLURAL


@dataclass(frozen=True)
class Call:
    group: str
    resource: str
    verb: str
    namespace: str  # where the call acts: CLUSTER for cluster-scoped objects and lists over all namespaces
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
    Call("", "nodes", "get", CLUSTER, lambda a: client.CoreV1Api(a).read_node(NODE)),
    Call("", "nodes", "list", CLUSTER, lambda a: client.CoreV1Api(a).list_node(limit=1)),
    Call("", "nodes", "watch", CLUSTER, lambda a: _watch_once(client.CoreV1Api(a).list_node)),
    Call("", "nodes", "patch", CLUSTER,
         lambda a: client.CoreV1Api(a).patch_node(NODE, {"metadata": {"annotations": {"gpufleet.io/rbac": "x"}}})),
    Call("", "nodes", "update", CLUSTER, _update_node),
    # a repaired node's GPU condition back to healthy (kube.set_condition, issue 25)
    Call("", "nodes/status", "patch", CLUSTER, lambda a: client.CoreV1Api(a).patch_node_status(NODE, {"status": {
        "conditions": [{"type": "GpuHealthy", "status": "True", "reason": "HealthCheckPassed", "message": "m"}]}})),
    Call("", "pods", "list", CLUSTER, lambda a: client.CoreV1Api(a).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={NODE}")),
    Call("", "pods", "watch", CLUSTER, lambda a: _watch_once(client.CoreV1Api(a).list_pod_for_all_namespaces)),
    Call("", "pods/eviction", "create", "default", lambda a: client.CoreV1Api(a).create_namespaced_pod_eviction(
        "no-such-pod", "default", {"metadata": {"name": "no-such-pod", "namespace": "default"}})),  # 404: allowed
    Call("", "events", "create", "default", lambda a: client.CoreV1Api(a).create_namespaced_event("default", {
        "metadata": {"generateName": "rbac-"}, "involvedObject": {"kind": "Node", "name": NODE},
        "reason": "RbacTest", "message": "m", "type": "Normal"})),
    Call(GROUP, PLURAL, "list", CLUSTER, lambda a: client.CustomObjectsApi(a).list_cluster_custom_object(
        GROUP, VERSION, PLURAL)),
    Call(GROUP, PLURAL, "watch", CLUSTER, lambda a: _watch_once(
        client.CustomObjectsApi(a).list_cluster_custom_object, GROUP, VERSION, PLURAL)),
    Call(GROUP, PLURAL, "create", CLUSTER, lambda a: client.CustomObjectsApi(a).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, _remediation("rbac-existing"))),  # 409 after the first: allowed
    Call(GROUP, f"{PLURAL}/status", "update", CLUSTER, _write_remediation_status),
    Call(GROUP, PLURAL, "delete", CLUSTER, lambda a: client.CustomObjectsApi(a).delete_cluster_custom_object(
        GROUP, VERSION, PLURAL, "no-such-remediation")),  # 404: allowed (retention, records.py)
    Call("coordination.k8s.io", "leases", "get", NS,
         lambda a: client.CoordinationV1Api(a).read_namespaced_lease("rbac-existing", NS)),
    Call("coordination.k8s.io", "leases", "create", NS, lambda a: client.CoordinationV1Api(a).create_namespaced_lease(
        NS, {"metadata": {"name": "rbac-existing"}, "spec": {"holderIdentity": "x"}})),  # 409: allowed
    Call("coordination.k8s.io", "leases", "update", NS, _update_lease),
    # kubernetes-spares refills: placeholder pods in the reconciler's namespace (reconciler/adapters/providers.py)
    Call("", "pods", "create", NS, lambda a: client.CoreV1Api(a).create_namespaced_pod(NS, {
        "metadata": {"name": "rbac-capacity-request"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})),  # 409 after the first
    # ... the cluster autoscaler's answer to them, its NotTriggerScaleUp Events (providers.py capacity_refusals)
    Call("", "events", "list", NS, lambda a: client.CoreV1Api(a).list_namespaced_event(
        NS, field_selector="reason=NotTriggerScaleUp")),
    # ... deleted again (providers.py)
    Call("", "pods", "delete", NS, lambda a: client.CoreV1Api(a).delete_namespaced_pod(
        "no-such-pod", NS)),  # 404: allowed
    # a NodeSet pod a stale busy-pod PodDisruptionBudget keeps at the drain timeout (decide.end_eviction)
    Call("", "pods", "delete", SLURM_NS, lambda a: client.CoreV1Api(a).delete_namespaced_pod(
        "no-such-pod", SLURM_NS)),  # 404: allowed
    # the health-check Jobs (reconciler/adapters/health_checks.py start, verdict; issue 25)
    Call("batch", "jobs", "create", NS, lambda a: client.BatchV1Api(a).create_namespaced_job(NS, {
        "metadata": {"name": "rbac-health-check"}, "spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}})),
    Call("batch", "jobs", "get", NS, lambda a: client.BatchV1Api(a).read_namespaced_job(
        "no-such-job", NS)),  # 404: allowed
]
# When a pool lends (reconciler/runtime/executor.py _evict_borrowers, reconciler/adapters/kube.py read_ledger,
# write_ledger): a borrower still there after the reclaim grace, in whatever namespace it runs; the ledger.
LENDING_CALLS = [
    Call("", "pods", "delete", "default", lambda a: client.CoreV1Api(a).delete_namespaced_pod(
        "no-such-pod", "default")),  # 404: allowed
    # the lending ledger (reconciler/adapters/kube.py read_ledger, write_ledger)
    Call("", "configmaps", "get", NS, lambda a: client.CoreV1Api(a).read_namespaced_config_map(
        labels.LENDING_LEDGER, NS)),  # 404: allowed
    Call("", "configmaps", "patch", NS, lambda a: client.CoreV1Api(a).patch_namespaced_config_map(
        labels.LENDING_LEDGER, NS, {"data": {"rbac": "x"}})),  # 404: allowed
]


def calls(spec) -> list[Call]:
    return CALLS + (LENDING_CALLS if spec.lending_pools() else [])


def rules(spec) -> dict[str, list[dict]]:
    """The stack's rules by where they are granted."""
    return {CLUSTER: cluster_rules(spec), NS: namespace_rules(spec), SLURM_NS: slurm_namespace_rules(spec)}


def granted(spec) -> set[tuple[str, str, str, str]]:
    return {(scope, g, res, v) for scope, rs in rules(spec).items()
            for r in rs for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}


def covers(grant: tuple[str, str, str, str], call: Call) -> bool:
    scope, group, resource, verb = grant
    return (group, resource, verb) == (call.group, call.resource, call.verb) and scope in (CLUSTER, call.namespace)


GRANTS = [(name, g) for name, spec in SPECS.items() for g in sorted(granted(spec))]


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
def cluster(kube_cluster, api):
    """The Remediation CRD (served: `api`), a node, the two namespaces, a Lease and a Remediation to act on
    (as admin)."""
    global _admin_node, _admin_lease
    core = client.CoreV1Api(api)
    create_or_keep(core.create_namespace, {"metadata": {"name": NS}})
    create_or_keep(core.create_namespace, {"metadata": {"name": SLURM_NS}})
    create_or_keep(core.create_node, {"metadata": {"name": NODE}})
    create_or_keep(client.CoordinationV1Api(api).create_namespaced_lease,
                   NS, {"metadata": {"name": "rbac-existing"}, "spec": {"holderIdentity": "x"}})
    create_or_keep(client.CustomObjectsApi(api).create_cluster_custom_object,
                   GROUP, VERSION, PLURAL, _remediation("rbac-existing"))
    _admin_node = core.read_node(NODE)
    _admin_lease = client.CoordinationV1Api(api).read_namespaced_lease("rbac-existing", NS)
    return kube_cluster


def token_for(kube, name: str, rules_: dict[str, list[dict]]) -> client.ApiClient:
    """A ServiceAccount bound to these rules (by scope: a ClusterRole, a Role per namespace), and an API client
    with a token minted for it (TokenRequest)."""
    api = kube.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
    ref = lambda kind: {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}  # noqa: E731
    creates = [lambda: core.create_namespaced_service_account(NS, {"metadata": {"name": name}})]
    for scope, rs in rules_.items():
        if scope == CLUSTER:
            creates += [lambda rs=rs: rbac.create_cluster_role({"metadata": {"name": name}, "rules": rs}),
                        lambda: rbac.create_cluster_role_binding({"metadata": {"name": name},
                                                                  "roleRef": ref("ClusterRole"), "subjects": subject})]
        elif rs:
            creates += [lambda ns=scope, rs=rs: rbac.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": rs}),
                        lambda ns=scope: rbac.create_namespaced_role_binding(
                            ns, {"metadata": {"name": name}, "roleRef": ref("Role"), "subjects": subject})]
    for create in creates:
        create_or_keep(create)
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


@pytest.mark.parametrize("name", SPECS)
def test_the_rules_are_exactly_the_calls(name):
    """Each call has a grant that covers it, and each grant covers a call."""
    spec = SPECS[name]
    assert [c for c in calls(spec) if not any(covers(g, c) for g in granted(spec))] == []
    assert [g for g in granted(spec) if not any(covers(g, c) for c in calls(spec))] == []


def test_a_pod_is_deleted_cluster_wide_only_when_a_pool_lends():
    """Without lending, pod delete is granted in the reconciler's namespace and the Slurm namespace only
    (issue 24: lending's "delete any pod in any namespace" is no grant healing needs)."""
    assert ("*", "", "pods", "delete") in granted(SPECS["lends"])
    plain = {g for g in granted(SPECS["plain"]) if g[1:] == ("", "pods", "delete")}
    assert plain == {(NS, "", "pods", "delete"), (SLURM_NS, "", "pods", "delete")}


@pytest.mark.parametrize("name", SPECS)
def test_every_call_is_allowed_with_the_reconcilers_token(cluster, name):
    api = token_for(cluster, f"reconciler-{name}", rules(SPECS[name]))
    refused = {(c.resource, c.verb, c.namespace): s for c in calls(SPECS[name]) if (s := status_of(c, api)) == 403}
    assert refused == {}


def test_without_lending_a_pod_elsewhere_is_not_deleted(cluster):
    api = token_for(cluster, "reconciler-plain", rules(SPECS["plain"]))
    (borrower_delete,) = [c for c in LENDING_CALLS if c.resource == "pods"]
    assert status_of(borrower_delete, api) == 403


@pytest.mark.parametrize("name,grant", GRANTS, ids=lambda v: v if isinstance(v, str) else
                         "-".join(x.replace("*", "cluster") for x in v if x))
def test_one_verb_fewer_is_refused(cluster, name, grant):
    """The rules minus this one grant: a call it covered is refused."""
    spec = SPECS[name]
    scope, group, resource, verb = grant
    fewer = {s: (without(rs, group, resource, verb) if s == scope else rs) for s, rs in rules(spec).items()}
    short = "cl" if scope == CLUSTER else "slurm" if scope == SLURM_NS else "ns"
    api = token_for(cluster, f"{name}-minus-{short}-{resource.replace('/', '-').replace('.', '-')}-{verb}"[:60], fewer)
    statuses = {c.namespace: status_of(c, api) for c in calls(spec) if covers(grant, c)}
    assert 403 in statuses.values(), statuses
