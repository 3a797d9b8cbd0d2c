"""kubernetes-spares: a refill is a declared capacity request (a pending placeholder pod) that a
cluster autoscaler acts on; the node that joins becomes a spare. Real API server and scheduler."""
from __future__ import annotations

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.waiting import wait_for
from gpufleet.reconciler.core import membership
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.providers import KubernetesSpares

pytestmark = pytest.mark.integration
NODEGROUP = "node-restriction.kubernetes.io/node-group"  # the platform sets it (no kubelet can)

SPEC = parse_fleet({
    "environment": "itest", "cluster": {"kind": "local"},
    "pools": [{"name": "ks", "node_type": "g6e", "gpu_model": "L40S", "gpus_per_node": 4, "nodes": 1, "spares": 1,
               "member_selector": {NODEGROUP: "ng-ks"}, "taints": [{"key": "nvidia.com/gpu"}]}],
    "slurm": {"partitions": [{"name": "p", "pools": ["ks"]}]},
    "healing": {"reconciler": {"namespace": "gpufleet-ks"}},
})


def test_a_refill_is_a_capacity_request_and_the_joining_node_becomes_a_spare(kube_cluster):
    api = kube_cluster.api_client()
    core, kube = client.CoreV1Api(api), Kube(api)
    core.create_namespace({"metadata": {"name": "gpufleet-ks"}})
    for sa in ("default",):  # the ServiceAccount controller may not have made it yet
        wait_for("default ServiceAccount", lambda: core.list_namespaced_service_account(
            "gpufleet-ks", field_selector=f"metadata.name={sa}").items, timeout=30)
    gpu = {"nvidia.com/gpu": "4"}
    busy = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "0"}  # its GPUs run Slurm jobs
    kube_cluster.create_fake_node("ks-a", labels={NODEGROUP: "ng-ks"}, capacity=gpu, allocatable=busy)
    provider = KubernetesSpares(kube, SPEC)

    def label_members():
        nodes = [n for n in kube.list_nodes()[0] if n["metadata"]["name"].startswith("ks-")]
        plan = membership.plan(nodes, SPEC, provider.membership_facts())
        for c in plan.changes:
            kube.apply_membership(c.node, dict(c.labels), list(c.add_taints))
        return plan

    label_members()
    assert core.read_node("ks-a").metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE

    # The spare was used: ask for one node, twice (a replay), and there is one request, pending.
    for _ in range(2):
        provider.request_capacity("ks", "refill the spare used for ks-x", "ks-x-xid79-1")
    (pod,) = core.list_namespaced_pod("gpufleet-ks", label_selector=labels.CAPACITY_REQUEST).items
    assert pod.spec.node_selector == {NODEGROUP: "ng-ks"}
    assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "4"
    wait_for("the scheduler to find no room", lambda: any(
        c.reason == "Unschedulable" for c in core.read_namespaced_pod(pod.metadata.name, "gpufleet-ks").status.conditions
        or []), timeout=30)
    assert provider.settle_capacity_requests() == []  # nothing joined yet: the request stands

    # What the autoscaler does for a pending pod: a node of the group joins; the scheduler binds the
    # request to it; membership makes it the pool's spare.
    kube_cluster.create_fake_node("ks-b", labels={NODEGROUP: "ng-ks"}, capacity=gpu)
    wait_for("the request bound to the new node", lambda: core.read_namespaced_pod(
        pod.metadata.name, "gpufleet-ks").spec.node_name == "ks-b", timeout=30)
    plan = label_members()
    assert [(c.node, c.labels.get(labels.ROLE)) for c in plan.changes] == [("ks-b", labels.ROLE_SPARE)]
    node = core.read_node("ks-b")
    assert node.metadata.labels[labels.NODE_POOL] == "ks"
    assert {labels.SPARE_TAINT, "nvidia.com/gpu"} <= {t.key for t in node.spec.taints}

    # The answered request is settled: the placeholder does not keep the spare's GPUs, and a replay
    # of the same request after a restart is settled again at once, without another node.
    assert provider.settle_capacity_requests() == [pod.metadata.name]
    wait_for("the placeholder gone", lambda: not core.list_namespaced_pod(
        "gpufleet-ks", label_selector=labels.CAPACITY_REQUEST).items, timeout=30)
    provider.request_capacity("ks", "refill the spare used for ks-x", "ks-x-xid79-1")
    assert KubernetesSpares(kube, SPEC).settle_capacity_requests() == [pod.metadata.name]
    assert label_members().changes == ()

    # Settling runs every membership pass: with no request pending it reads no node; with one, the nodes
    # the runtime's cache passes in (no list either).
    wait_for("the replayed placeholder gone", lambda: not core.list_namespaced_pod(
        "gpufleet-ks", label_selector=labels.CAPACITY_REQUEST).items, timeout=30)
    selectors: list = []
    list_node = kube.core.list_node
    kube.core.list_node = lambda *a, **kw: selectors.append(kw.get("label_selector")) or list_node(*a, **kw)
    assert provider.settle_capacity_requests() == [] and selectors == []
    provider.request_capacity("ks", "refill the spare used for ks-y", "ks-y-xid79-2")
    cached = kube.list_nodes()[0]  # what the runtime's informer holds
    selectors.clear()
    assert provider.settle_capacity_requests(cached) == []  # ks-b answered the first request already
    assert selectors == []
    core.delete_collection_namespaced_pod("gpufleet-ks", label_selector=labels.CAPACITY_REQUEST, grace_period_seconds=0)


RACE = parse_fleet({
    "environment": "itest", "cluster": {"kind": "local"},
    "pools": [{"name": "kr", "node_type": "g6e", "gpu_model": "L40S", "gpus_per_node": 4, "nodes": 1, "spares": 1,
               "member_selector": {NODEGROUP: "ng-kr"}}],
    "slurm": {"partitions": [{"name": "p", "pools": ["kr"]}]},
    "healing": {"reconciler": {"namespace": "gpufleet-kr"}},
})


def test_a_plan_made_before_a_promotion_does_not_taint_the_promoted_spare(kube_cluster):
    """The membership pass plans from a cache a moment old. A spare taken back from its loan for a fault
    has no spare taint for that moment; a plan made then gives it one, and if that plan is written after
    the remediation promoted the spare, the promoted node is tainted again: Slurm's pod never lands on it
    and the remediation waits forever (the lending e2e test's failure of 2026-12-02). The write carries
    the shape it was planned from, and the API server's node decides."""
    api = kube_cluster.api_client()
    core, kube = client.CoreV1Api(api), Kube(api)
    gpu = {"nvidia.com/gpu": "4"}
    member = {NODEGROUP: "ng-kr", labels.NODE_POOL: "kr"}
    kube_cluster.create_fake_node("kr-a", labels={**member, labels.ROLE: labels.ROLE_ACTIVE}, capacity=gpu)
    kube_cluster.create_fake_node("kr-s", labels={**member, labels.ROLE: labels.ROLE_SPARE}, capacity=gpu)
    provider = KubernetesSpares(kube, RACE)

    def plan():
        nodes = [n for n in kube.list_nodes()[0] if n["metadata"]["name"].startswith("kr-")]
        return membership.plan(nodes, RACE, provider.membership_facts())

    stale = plan()
    (change,) = [c for c in stale.changes if c.node == "kr-s"]
    assert labels.SPARE_TAINT in {t["key"] for t in change.add_taints}  # a spare without its taint: planned
    provider.promote("kr-s", "kr-a")  # the remediation's write lands first
    (write,) = [a for a in membership.membership_actions(stale) if getattr(a, "node", None) == "kr-s"]
    assert kube.apply_membership(write.node, dict(write.labels), [dict(t) for t in write.add_taints],
                                 dict(write.annotations), write.seen) is False
    node = core.read_node("kr-s")
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE
    assert labels.SPARE_TAINT not in {t.key for t in node.spec.taints or []}
    # Planned again from the node as it is: an active node gets no spare taint.
    assert all(labels.SPARE_TAINT not in {t["key"] for t in c.add_taints} for c in plan().changes if c.node == "kr-s")
    # A plan that still matches the node is written, whatever taints others put on it meanwhile (the node
    # lifecycle controller's not-ready on a node just registered).
    kube_cluster.create_fake_node("kr-n", labels={NODEGROUP: "ng-kr"}, capacity=gpu)
    (fresh,) = [a for a in membership.membership_actions(plan()) if getattr(a, "node", None) == "kr-n"]
    core.patch_node("kr-n", {"spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}})
    assert kube.apply_membership(fresh.node, dict(fresh.labels), [dict(t) for t in fresh.add_taints],
                                 dict(fresh.annotations), fresh.seen) is True
    assert core.read_node("kr-n").metadata.labels[labels.NODE_POOL] == "kr"
