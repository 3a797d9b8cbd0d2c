"""Pool membership from the node providers' facts: which labels and taints a node gets (pure), and that a
node's own labels (which its kubelet may set) prove nothing."""
from __future__ import annotations

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core.actions import ApplyMembership, NodeShape, Report
from gpufleet.reconciler.core.membership import MembershipFacts, instance_id, membership_actions, merge_facts, plan

NODE_GROUP = "node-restriction.kubernetes.io/node-group"  # the platform's label (Cluster API syncs it from Machines)
SPARE = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}

SPEC = parse_fleet({
    "environment": "t", "cluster": {"kind": "kubeconfig"},
    "pools": [
        {"name": "h100", "node_type": "p5", "gpu_model": "H100", "nodes": 2, "spares": 1, "provider": "aws-asg",
         "aws": {"asg_name": "asg-h100", "node_labels": {"eks.amazonaws.com/nodegroup": "ng-h100"}},
         "taints": [{"key": "nvidia.com/gpu"}], "topology_block": "block-a"},
        {"name": "l40s", "node_type": "g6e", "gpu_model": "L40S", "nodes": 1, "spares": 1,
         "member_selector": {NODE_GROUP: "ng-l40s"}},
    ],
    "slurm": {"partitions": [{"name": "p", "pools": ["h100", "l40s"]}]},
    "healing": {"reconciler": {"iam_role_arn": "arn:aws:iam::123456789012:role/r"}},
})


def node(name, labels_=None, taints=(), iid=None, gpus=8):
    n = {"metadata": {"name": name, "labels": dict(labels_ or {})}, "spec": {"taints": list(taints) or None},
         "status": {"capacity": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}
    if iid:
        n["spec"]["providerID"] = f"aws:///us-east-1a/{iid}"
    return n


def member(name, pool, role, taints=()):
    return node(name, {labels.NODE_POOL: pool, labels.ROLE: role}, taints)


def apply(nodes, p):
    """Apply the plan's changes the way the Kube adapter does: set labels, add missing taints."""
    by = {n["metadata"]["name"]: n for n in nodes}
    for c in p.changes:
        n = by[c.node]
        n["metadata"]["labels"].update(c.labels)
        n["metadata"].setdefault("annotations", {}).update(c.annotations)
        n["spec"]["taints"] = (n["spec"]["taints"] or []) + [dict(t) for t in c.add_taints]
    return nodes


def test_a_pools_nodes_carry_its_slurm_topology_block_for_the_operator():
    """slurm-operator 1.2.1 gives the Slurm node of each NodeSet pod the topology in its Kubernetes node's
    topology.slinky.slurm.net/spec annotation (nodeset_sync.go syncSlurmTopology): a pool with a
    topology_block gets `blocks:<block>`, the block the stack's topology.yaml declares; others none."""
    nodes = [node("a", iid="i-1"), node("l", {NODE_GROUP: "ng-l40s"})]
    p = plan(nodes, SPEC, eks(nodes))
    by = {c.node: c for c in p.changes}
    assert by["a"].annotations == {labels.SLINKY_TOPOLOGY_SPEC: "blocks:block-a"}
    assert by["l"].annotations == {}
    assert plan(apply(nodes, p), SPEC, eks(nodes)).changes == ()


H100_GROUPS = {"i-1": "asg-h100", "i-2": "asg-h100", "i-3": "asg-h100", "i-9": "asg-other"}
H100_FACTS = MembershipFacts(H100_GROUPS)  # the groups alone: no instance's name known


def eks(nodes, groups=H100_GROUPS) -> MembershipFacts:
    """The facts of honest EKS nodes: each instance's private DNS name is the name of the node naming it
    (its kubelet may register no other)."""
    names = {instance_id(n): n["metadata"]["name"] for n in nodes if instance_id(n) in groups}
    return MembershipFacts(dict(groups), names)


@pytest.mark.parametrize("case,nodes,facts,want", [
    ("ASG instances join: active up to `nodes`, then spares",
     [node("a", iid="i-1"), node("b", iid="i-2"), node("c", iid="i-3")], H100_FACTS,
     {"a": labels.ROLE_ACTIVE, "b": labels.ROLE_ACTIVE, "c": labels.ROLE_SPARE}),
    ("a new instance after a fault refills the spares",
     [member("a", "h100", labels.ROLE_ACTIVE, [GPU_TAINT]), member("b", "h100", labels.ROLE_ACTIVE, [GPU_TAINT]),
      member("bad", "h100", labels.ROLE_QUARANTINED, [GPU_TAINT]), node("new", iid="i-3")], H100_FACTS,
     {"new": labels.ROLE_SPARE}),
    ("the launch template's kubelet labels prove nothing",
     [node("k", {"eks.amazonaws.com/nodegroup": "ng-h100"})], MembershipFacts(), {}),
    ("kubernetes-spares: the member selector",
     [member("l0", "l40s", labels.ROLE_ACTIVE), node("l1", {NODE_GROUP: "ng-l40s"}, gpus=4)],
     MembershipFacts(), {"l1": labels.ROLE_SPARE}),
    ("an instance of another group is not ours", [node("x", iid="i-9")], H100_FACTS, {}),
])
def test_members_get_pool_and_role(case, nodes, facts, want):
    facts = eks(nodes, facts.instance_groups)
    p = plan(nodes, SPEC, facts)
    got = {c.node: c.labels.get(labels.ROLE) for c in p.changes if labels.ROLE in c.labels}
    assert got == want, case
    for c in p.changes:
        assert c.labels.get(labels.NODE_POOL, c.pool) == c.pool
        if c.labels.get(labels.ROLE) == labels.ROLE_SPARE:
            assert SPARE in c.add_taints, case
        if c.labels.get(labels.ROLE) == labels.ROLE_ACTIVE:
            assert SPARE not in c.add_taints, case
    assert plan(apply(nodes, p), SPEC, facts).changes == (), f"{case}: not idempotent"


def test_pool_labels_and_taints_are_added_not_removed():
    n = node("a", {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_SPARE, "keep": "me"},
             [{"key": "other", "effect": "NoExecute"}])
    (c,) = plan([n], SPEC).changes
    assert c.labels == {labels.TOPOLOGY_BLOCK: "block-a"}
    assert {t["key"] for t in c.add_taints} == {"nvidia.com/gpu", labels.SPARE_TAINT}
    apply([n], plan([n], SPEC))
    assert n["metadata"]["labels"]["keep"] == "me" and "other" in {t["key"] for t in n["spec"]["taints"]}
    assert plan([n], SPEC).changes == ()


def test_each_write_carries_the_shape_it_was_planned_from():
    """The adapter writes a change only while the node still has this shape (a promotion since wins);
    tests/integration/test_kubernetes_spares.py holds the API server's node to it."""
    n = node("a", {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_SPARE}, [{"key": "other", "effect": "NoExecute"}])
    (a,) = [x for x in membership_actions(plan([n], SPEC)) if isinstance(x, ApplyMembership)]
    assert a.seen == NodeShape(labels.ROLE_SPARE, frozenset())  # "other" is no taint of gpufleet's
    assert a.seen.still(labels.ROLE_SPARE, ["other", "node.kubernetes.io/not-ready"])  # they come and go
    assert not a.seen.still(labels.ROLE_ACTIVE, ["other"])  # promoted meanwhile
    assert not a.seen.still(labels.ROLE_SPARE, ["other", labels.LENDING_TAINT])  # lent meanwhile
    newcomer = node("b", {NODE_GROUP: "ng-l40s"})
    (b,) = [x for x in membership_actions(plan([newcomer], SPEC)) if isinstance(x, ApplyMembership)]
    assert b.seen == NodeShape("", frozenset()) and b.labels[labels.ROLE] == labels.ROLE_ACTIVE


def test_unlabelled_gpu_nodes_are_reported_not_ignored():
    nodes = [node("stray-gpu"), node("cpu-only", gpus=0),
             node("system", {labels.SYSTEM_NODE: "true"}), node("gfd", {labels.GPU_COUNT: "8"}, gpus=0)]
    p = plan(nodes, SPEC)
    assert p.unlabelled_gpu_nodes == ("gfd", "stray-gpu") and p.changes == () and p.unproven == ()


@pytest.mark.parametrize("own_labels", [
    {labels.POOL: "h100", labels.ROLE: labels.ROLE_SPARE},   # what a kubelet's --node-labels could say
    {labels.ROLE: labels.ROLE_ACTIVE},
    {labels.ROLE: labels.ROLE_SYSTEM},
    {labels.POOL: "l40s", "nvidia.com/gpu.present": "true"},
])
def test_a_nodes_own_claims_enrol_nothing_and_are_reported_once(own_labels):
    """Labels a kubelet may set on itself are no membership: the node gets no pool label, role or taint
    change, and one NodeMembershipUnproven Event names it (not repeated once reported)."""
    n = node("forger", own_labels)
    p = plan([n], SPEC, eks([n]))
    assert p.changes == () and p.unproven == ("forger",) and p.unlabelled_gpu_nodes == ()
    reports = [a for a in membership_actions(p) if isinstance(a, Report)]
    assert [(r.name, r.reason) for r in reports] == [("forger", "NodeMembershipUnproven")]
    assert not [a for a in membership_actions(p, frozenset({"forger"})) if isinstance(a, Report)]


def test_provider_evidence_enrols_a_node_whatever_its_own_labels_claim():
    """An instance of the pool's group joins the pool the group names, not the one its own labels say."""
    n = node("a", {labels.POOL: "l40s", labels.ROLE: labels.ROLE_SPARE}, iid="i-1")
    (c,) = plan([n], SPEC, eks([n])).changes
    assert c.pool == "h100" and c.labels[labels.NODE_POOL] == "h100"



def test_a_role_a_node_joins_with_takes_no_active_place_its_pool_lacks():
    """`gpufleet.io/role=active` on a node not yet a proven member may be its kubelet's own (--node-labels): it
    counts only while the pool lacks active nodes, as no role would; past that the node joins as a spare, with
    the spare taint, and the honest newcomer is not pushed aside."""
    full = [member("a", "l40s", labels.ROLE_ACTIVE)]  # l40s declares 1 active node
    forger = node("m-forger", {NODE_GROUP: "ng-l40s", labels.ROLE: labels.ROLE_ACTIVE}, gpus=4)
    nodes = full + [forger]
    p = plan(nodes, SPEC)
    (c,) = p.changes
    assert c.node == "m-forger" and c.labels[labels.ROLE] == labels.ROLE_SPARE and SPARE in c.add_taints
    assert plan(apply(nodes, p), SPEC).changes == ()
    # with room in the pool it is active, as a node without a role would be (the legacy of labelled members)
    alone = node("m-new", {NODE_GROUP: "ng-l40s", labels.ROLE: labels.ROLE_ACTIVE}, gpus=4)
    (c,) = plan([alone], SPEC).changes
    assert labels.ROLE not in c.labels and SPARE not in c.add_taints
    # two ASG instances both saying active, one place left: the first by name keeps it
    h = [member("a", "h100", labels.ROLE_ACTIVE, [GPU_TAINT]),
         node("b", {labels.ROLE: labels.ROLE_ACTIVE}, iid="i-2"), node("c", {labels.ROLE: labels.ROLE_ACTIVE}, iid="i-3")]
    roles = {c.node: c.labels.get(labels.ROLE) for c in plan(h, SPEC, eks(h)).changes if c.node != "a"}
    assert roles == {"b": None, "c": labels.ROLE_SPARE}

def test_pools_and_system_nodes_select_only_on_labels_no_kubelet_can_set():
    from gpufleet.fleetspec.load import SpecError

    raw = SPEC.model_dump(mode="json")
    raw["pools"][1]["member_selector"] = {"eks.amazonaws.com/nodegroup": "ng-l40s"}
    with pytest.raises(SpecError, match=r"pools\[1\]\.member_selector.*eks.amazonaws.com/nodegroup"):
        parse_fleet(raw)
    raw = SPEC.model_dump(mode="json")
    raw["system_pool"] = {"node_selector": {labels.ROLE: labels.ROLE_SYSTEM}}
    with pytest.raises(SpecError, match=r"system_pool\.node_selector.*gpufleet.io/role"):
        parse_fleet(raw)
    assert SPEC.system_pool.node_selector == {labels.SYSTEM_NODE: "true"}


@pytest.mark.parametrize("n,facts,message", [
    (node("a", {labels.NODE_POOL: "gone"}), MembershipFacts(), "does not declare"),
    (node("a", {labels.NODE_POOL: "l40s"}, iid="i-1"), H100_FACTS, "left as it is"),
    (node("a", {NODE_GROUP: "ng-l40s"}, iid="i-1"), H100_FACTS, "claimed by pools"),
])
def test_conflicts_are_reported_and_left_alone(n, facts, message):
    p = plan([n], SPEC, eks([n], facts.instance_groups))
    assert p.changes == () and p.conflicts[0][0] == "a" and message in p.conflicts[0][1]
    reports = [a for a in membership_actions(p) if isinstance(a, Report)]
    assert [(r.name, r.reason) for r in reports] == [("a", "NodeMembershipConflict")] and message in reports[0].message
    assert not [a for a in membership_actions(p, frozenset({"a"})) if isinstance(a, Report)]  # reported once


def test_a_node_naming_an_instance_under_another_name_enrols_in_nothing():
    """A kubelet writes its own providerID, so a compromised node may name any instance of the group, a fresh
    one included; its name it cannot choose (EKS: the instance's private DNS name). A node whose name is not
    its instance's is reported and enrols in nothing; the instance's own node joins, whoever came first."""
    real, forger = node("ip-10-0-0-1.ec2.internal", iid="i-1"), node("aaa-forger", iid="i-1")
    facts = MembershipFacts(H100_GROUPS, {"i-1": "ip-10-0-0-1.ec2.internal"})
    p = plan([forger, real], SPEC, facts)
    assert {c.node for c in p.changes} == {"ip-10-0-0-1.ec2.internal"}
    ((who, why),) = p.conflicts
    assert who == "aaa-forger" and why.startswith("names instance i-1 of group asg-h100")
    assert "ip-10-0-0-1.ec2.internal" in why
    # an instance with no name known (EC2 did not say) enrols no node
    p = plan([node("x", iid="i-2")], SPEC, H100_FACTS)
    assert p.changes == () and "no private DNS name" in p.conflicts[0][1]
    # a member the platform labelled keeps its place whatever its name
    labelled = member("old-name", "h100", labels.ROLE_ACTIVE)
    labelled["spec"]["providerID"] = "aws:///us-east-1a/i-3"
    assert plan([labelled], SPEC, facts).conflicts == ()


def test_facts_merge_across_providers():
    merged = merge_facts([MembershipFacts({"i-1": "a"}, {"i-1": "n1"}), MembershipFacts(),
                          MembershipFacts({"i-2": "b"}, {"i-2": "n2"})])
    assert dict(merged.instance_groups) == {"i-1": "a", "i-2": "b"}
    assert dict(merged.instance_names) == {"i-1": "n1", "i-2": "n2"}


def test_spares_fill_only_after_the_active_count():
    nodes = [node(f"n{i}", iid=f"i-{i}") for i in range(5)]
    facts = eks(nodes, {f"i-{i}": "asg-h100" for i in range(5)})
    roles = [c.labels[labels.ROLE] for c in plan(nodes, SPEC, facts).changes]
    assert roles == ["active", "active", "spare", "spare", "spare"]  # a surplus node waits as a spare


# --- capacity requests answered by joining nodes ---------------------------------------------------

from gpufleet.reconciler.core.membership import Settlement, settle  # noqa: E402

FULFILS = labels.FULFILS

REQ_LABEL = "gpufleet.io/capacity-request"


def req(name, at, pool="l40s", bound=None):
    return {"metadata": {"name": name, "creationTimestamp": at, "labels": {REQ_LABEL: pool}},
            "spec": {"nodeName": bound} if bound else {}}


def joined(name, at, role=labels.ROLE_SPARE, pool="l40s", fulfils=None):
    n = member(name, pool, role)
    n["metadata"]["creationTimestamp"] = at
    if fulfils:
        n["metadata"]["annotations"] = {FULFILS: fulfils}
    return n


@pytest.mark.parametrize("case,requests,nodes,want", [
    ("bound by the scheduler", [req("r1", "t1", bound="n1")], [joined("n1", "t2")], [("r1", "n1")]),
    ("a spare that joined after the request", [req("r1", "t2")], [joined("old", "t1"), joined("new", "t3")],
     [("r1", "new")]),
    ("one node answers one request", [req("r1", "t1"), req("r2", "t2")], [joined("n1", "t3")], [("r1", "n1")]),
    ("a node that answered already is not reused", [req("r2", "t2")], [joined("n1", "t3", fulfils="r1")], []),
    ("a replayed request finds its answer", [req("r1", "t5")], [joined("n1", "t3", fulfils="r1")], [("r1", "n1")]),
    ("an active node is no answer", [req("r1", "t1")], [joined("n1", "t2", role=labels.ROLE_ACTIVE)], []),
    ("another pool's spare is no answer", [req("r1", "t1")], [joined("n1", "t2", pool="h100")], []),
    # gpufleet.io/fulfils is an annotation: a node of another pool that says it answered a request (its kubelet
    # may write its own annotations) settles nothing, and the request's own pool's spare still answers it
    ("another pool's node claiming the answer", [req("r1", "t1")],
     [joined("n1", "t2", pool="h100", fulfils="r1"), joined("n2", "t3")], [("r1", "n2")]),
])
def test_capacity_requests_settle_once(case, requests, nodes, want):
    assert settle(requests, nodes, REQ_LABEL) == tuple(Settlement(r, n) for r, n in want), case
