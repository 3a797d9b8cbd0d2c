"""The cluster autoscaler's stand-in decides as cluster-autoscaler 1.32's scale-up does: only unschedulable
pods, only a group whose template node the pod would fit, never past the group's maximum size."""
from __future__ import annotations

from pathlib import Path

import pytest

from fleetspec import labels, load_stack_file
from localenv import fake_nodes
from localenv.autoscaler_standin import NodeGroup, choose, misfit, node_groups, unschedulable
from reconciler.adapters.providers import placeholder_pod

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def request(pool: str) -> dict:
    """The reconciler's capacity request for one node of the pool, as the scheduler left it."""
    return {**placeholder_pod(SPEC.pool(pool), "k-1/refill", "refill", "gpufleet-system"), "status": UNSCHEDULABLE}


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
    assert "node selector" in why["h100"]  # each pool's node group has a label of its own
    assert choose(request("h100"), groups)[0].name == "h100"


def test_the_joining_node_is_the_pools_with_no_role_yet():
    group = NodeGroup.of_pool(SPEC.pool("h100"))
    node = group.node("kwok-h100-spare-2")
    meta = node["metadata"]
    assert meta["name"] == "kwok-h100-spare-2" and meta["labels"]["kubernetes.io/hostname"] == "kwok-h100-spare-2"
    assert meta["labels"]["gpufleet.local/node-group"] == "h100" and labels.ROLE not in meta["labels"]
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu"]  # no spare taint: membership adds it
    assert group.reserve == tuple(fake_nodes.reserve_names(SPEC.pool("h100")))
    assert group.max_size == SPEC.pool("h100").nodes + SPEC.pool("h100").spares + fake_nodes.RESERVE
    # the environment's first nodes are of the same group (membership knows them by its label)
    first = fake_nodes.pool_node(SPEC.pool("h100"), "kwok-h100-0", labels.ROLE_ACTIVE)
    assert first["metadata"]["labels"]["gpufleet.local/node-group"] == "h100"


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
    assert misfit(for_a_spare, template) == "node(s) didn't match Pod's node affinity"
