"""The cluster autoscaler's stand-in decides as cluster-autoscaler 1.32's scale-up does: only unschedulable
pods, only a group whose template node the pod would fit, never past the group's maximum size."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufleet.fleetspec import labels, load_stack_file
from localenv import fake_nodes
from localenv.autoscaler_standin import (
    NodeGroup, choose, misfit, node_groups, sanitized, template_node, unschedulable,
)
from gpufleet.reconciler.adapters.providers import placeholder_pod

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def request(pool: str, existing=()) -> dict:
    """The reconciler's capacity request for one node of the pool, as the scheduler left it."""
    return {**placeholder_pod(SPEC.pool(pool), "k-1/refill", "refill", "gpufleet-system", existing),
            "status": UNSCHEDULABLE}


@pytest.mark.parametrize("pod,want", [
    ({"spec": {}, "status": UNSCHEDULABLE}, True),
    ({"spec": {"nodeName": "n"}, "status": UNSCHEDULABLE}, False),                      # bound
    ({"metadata": {"deletionTimestamp": "x"}, "spec": {}, "status": UNSCHEDULABLE}, False),  # going
    ({"spec": {}, "status": {}}, False),                                                 # not tried yet
    ({"spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                             "reason": "SchedulingGated"}]}}, False),
])
def test_only_pods_the_scheduler_found_no_node_for(pod, want):
    assert unschedulable(pod) is want


def test_a_capacity_request_fits_its_own_pool_only():
    groups = node_groups(SPEC)
    group, why = choose(request("l40s"), groups)
    assert group is not None and group.name == "l40s"
    assert why["h100"] == "node(s) didn't match Pod's node affinity/selector"  # each pool's node group has a label of its own
    assert choose(request("h100"), groups)[0].name == "h100"


def test_the_joining_node_is_the_pools_with_no_role_yet():
    group = NodeGroup.of_pool(SPEC.pool("h100"))
    node = group.node("kwok-h100-spare-2")
    meta = node["metadata"]
    assert meta["name"] == "kwok-h100-spare-2" and meta["labels"]["kubernetes.io/hostname"] == "kwok-h100-spare-2"
    assert meta["labels"]["node-restriction.kubernetes.io/node-group"] == "h100" and labels.ROLE not in meta["labels"]
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu"]  # no spare taint: membership adds it
    assert group.reserve == tuple(fake_nodes.reserve_names(SPEC.pool("h100")))
    assert group.max_size == SPEC.pool("h100").nodes + SPEC.pool("h100").spares + fake_nodes.RESERVE
    # the environment's first nodes are of the same group (membership knows them by its label)
    first = fake_nodes.pool_node(SPEC.pool("h100"), "kwok-h100-0", labels.ROLE_ACTIVE)
    assert first["metadata"]["labels"]["node-restriction.kubernetes.io/node-group"] == "h100"


def test_a_pod_that_would_not_fit_says_why():
    template = NodeGroup.of_pool(SPEC.pool("l40s")).node("t")
    pod = request("l40s")
    assert misfit(pod, template) is None
    greedy = {**pod, "spec": {**pod["spec"], "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "5"}}}]}}
    assert misfit(greedy, template) == "Insufficient nvidia.com/gpu"  # the pool's nodes have 4
    intolerant = {**pod, "spec": {**pod["spec"], "tolerations": []}}
    assert "untolerated taint {nvidia.com/gpu" in misfit(intolerant, template)
    for_a_spare = {**pod, "spec": {**pod["spec"], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": labels.ROLE, "operator": "In", "values": ["spare"]}]}]}}}}}
    assert misfit(for_a_spare, template) == "node(s) didn't match Pod's node affinity/selector"


# --- the template a real autoscaler makes: from an existing node of the group -------------------------

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def ready(node: dict, since: datetime = NOW - timedelta(minutes=5)) -> dict:
    """A node as the API server lists it once kwok has made it Ready."""
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": since.isoformat()}]
    return node


def lent(node: dict, pool: str) -> dict:
    """A spare on loan: the lending taint instead of the spare taint (reconciler/core/lending.py)."""
    node["spec"]["taints"] = [t for t in node["spec"]["taints"] if t["key"] != labels.SPARE_TAINT] + [
        {"key": labels.LENDING_TAINT, "value": pool, "effect": "NoSchedule"}]
    node["metadata"]["labels"][labels.LENT] = labels.LENT_SPARE
    return node


def pool_nodes(pool: str) -> list[dict]:
    p = SPEC.pool(pool)
    actives = [ready(fake_nodes.pool_node(p, f"kwok-{n}", labels.ROLE_ACTIVE)) for n in p.node_names()]
    spares = [ready(fake_nodes.pool_node(p, f"kwok-{n}", labels.ROLE_SPARE)) for n in p.spare_names()]
    return actives + spares + [lent(ready(fake_nodes.pool_node(p, f"kwok-{pool}-spare-9", labels.ROLE_SPARE)), pool)]


def test_the_template_is_made_from_the_first_good_node_of_the_group_as_upstream_does():
    group = NodeGroup.of_pool(SPEC.pool("h100"))
    nodes = pool_nodes("h100")
    cordoned = {**nodes[0], "spec": {**nodes[0]["spec"], "unschedulable": True}}
    young = ready(json.loads(json.dumps(nodes[1])), since=NOW - timedelta(seconds=30))  # not stable yet
    template = template_node(group, [cordoned, young] + nodes[2:], NOW)
    meta = template["metadata"]
    assert meta["name"] == meta["labels"]["kubernetes.io/hostname"] == "template-node-for-h100"
    assert labels.ROLE in meta["labels"]  # the third node's labels, kept
    assert {k: v for k, v in meta["labels"].items() if k != "kubernetes.io/hostname"} == {
        k: v for k, v in nodes[2]["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
    # no good node: the group's own template (the node as it joins, no role)
    assert labels.ROLE not in template_node(group, [cordoned, young], NOW)["metadata"]["labels"]
    assert labels.ROLE not in template_node(group, nodes, NOW - timedelta(days=1))["metadata"]["labels"]


def test_a_template_leaves_out_the_taints_upstream_leaves_out_and_keeps_the_others():
    node = ready(fake_nodes.pool_node(SPEC.pool("h100"), "kwok-h100-0", labels.ROLE_SPARE))
    node["spec"]["taints"] += [{"key": k, "effect": "NoSchedule"} for k in (
        "ToBeDeletedByClusterAutoscaler", "node.kubernetes.io/unreachable",
        "startup-taint.cluster-autoscaler.kubernetes.io/x", "status-taint.cluster-autoscaler.kubernetes.io/y")]
    assert sorted(t["key"] for t in sanitized(node, "t")["spec"]["taints"]) == sorted(
        ["nvidia.com/gpu", labels.SPARE_TAINT])


@pytest.mark.parametrize("pool", ["h100", "l40s"])
def test_a_capacity_request_fits_a_template_made_from_any_node_of_its_pool_and_lands_on_none_of_them(pool):
    """Whichever node upstream makes its template from (an active node, a spare, a lent spare), the request
    fits it, so a real autoscaler scales the group up; and it fits no node that exists, so it never takes a
    spare's or a worker's place (with its GPUs free, as a promoted spare's are before its pod lands)."""
    nodes = pool_nodes(pool)
    pod = request(pool, existing=[n["metadata"]["name"] for n in nodes])
    group = NodeGroup.of_pool(SPEC.pool(pool))
    for n in nodes:
        assert misfit(pod, sanitized(n, f"template-node-for-{pool}")) is None, n["metadata"]["name"]
        assert misfit(pod, n) == "node(s) didn't match Pod's node affinity/selector", n["metadata"]["name"]
    assert misfit(pod, group.node("kwok-h100-spare-7")) is None  # a node that joins later
    chosen, _ = choose(pod, node_groups(SPEC), [n for p in ("h100", "l40s") for n in pool_nodes(p)], NOW)
    assert chosen is not None and chosen.name == pool


def test_the_not_trigger_scale_up_message_is_upstreams_counted_reasons_and_the_reconciler_reads_it():
    """cluster-autoscaler 1.32.0 eventing_scale_up_processor.go: "pod didn't trigger scale-up: " and each
    reason with the count of node groups that gave it; gpufleet's reader takes it as the request's refusal."""
    from localenv.autoscaler_standin import MAX_SIZE_REACHED, NODE_AFFINITY, not_triggered
    from gpufleet.reconciler.core.refills import pool_refusals, request_name

    assert not_triggered([MAX_SIZE_REACHED]) == "pod didn't trigger scale-up: 1 max node group size reached"
    assert not_triggered([NODE_AFFINITY, NODE_AFFINITY, MAX_SIZE_REACHED]) == (
        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector, 1 max node group size reached")
    name = request_name("h100", "k")
    event = {"reason": "NotTriggerScaleUp", "involvedObject": {"kind": "Pod", "name": name},
             "message": not_triggered([MAX_SIZE_REACHED])}
    assert pool_refusals([event], [name]) == {name: "pod didn't trigger scale-up: 1 max node group size reached"}
