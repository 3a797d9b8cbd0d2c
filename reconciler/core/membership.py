"""Which pool a node belongs to, and the labels and taints that say so. Pure: no I/O.

A node is known to a pool by evidence its kubelet cannot forge, never by its name or by a label the
kubelet set on itself:
- `aws-asg`: its instance (the node's `providerID`) is in the pool's Auto Scaling group, as the
  group itself says, and the node bears the one name that instance's kubelet may register. A kubelet
  writes its own providerID, so that alone proves nothing; but on EKS a node's credentials map to the
  user `system:node:{{EC2PrivateDNSName}}`, the instance's private DNS name as EC2 says
  (aws-iam-authenticator pkg/server/server.go renderTemplate, pkg/ec2provider GetPrivateDNSName), and
  NodeRestriction lets that user write only the Node of that name. A node named otherwise that claims
  the instance is reported, never enrolled;
- `kubernetes-spares`: it matches the pool's `member_selector`, whose keys are all under
  `node-restriction.kubernetes.io/` (the spec refuses others), which a kubelet may not set;
- any provider: it carries `node-restriction.kubernetes.io/gpufleet-pool` (labels.NODE_POOL), which
  only this pass or the platform sets.

A member without a role becomes `active` while the pool has fewer active nodes than it declares,
else a `spare` (with the spare taint), so a node that joins after a fault refills the spares; one that
joins already saying `active` (a label its kubelet may have set) keeps it only on the same terms. The
pool's own labels and taints are added where missing. Nothing is removed, a node already labelled
for another pool is reported, never relabelled; a GPU node that belongs to no pool is reported, and
one that claims a pool or a role by its own labels (`gpufleet.io/pool`, `gpufleet.io/role`) without
the evidence is reported as unproven and enrols in nothing. Planning again after the changes are
applied plans nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec, NodePool
from gpufleet.fleetspec.placement import node_taints

from gpufleet.reconciler.core.actions import Action, ApplyMembership, NodeShape, Report, SettleCapacityRequests

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class MembershipFacts:
    """What node providers know about nodes: EC2 instance id -> Auto Scaling group name, and instance id ->
    its private DNS name (the only Node name its kubelet can register)."""

    instance_groups: Mapping[str, str] = field(default_factory=dict)
    instance_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeChange:
    """Labels to set and taints to add on one node (both only what is missing)."""

    node: str
    pool: str
    labels: Mapping[str, str]
    add_taints: tuple[Mapping[str, str], ...]
    why: str
    annotations: Mapping[str, str] = field(default_factory=dict)  # the Slinky topology spec
    seen: NodeShape | None = None  # the node as the plan read it; written only while it still is


@dataclass(frozen=True)
class MembershipPlan:
    changes: tuple[NodeChange, ...] = ()
    unlabelled_gpu_nodes: tuple[str, ...] = ()  # GPU nodes no pool claims: report them
    unproven: tuple[str, ...] = ()              # nodes whose own labels claim a pool or role no evidence backs
    conflicts: tuple[tuple[str, str], ...] = ()  # (node, why): two pools claim it, it is labelled for another
    #                                              pool, or it names an instance under another name


def merge_facts(facts: Iterable[MembershipFacts]) -> MembershipFacts:
    groups: dict[str, str] = {}
    names: dict[str, str] = {}
    for f in facts:
        groups.update(f.instance_groups)
        names.update(f.instance_names)
    return MembershipFacts(groups, names)


def instance_id(node: Mapping) -> str | None:
    """`aws:///us-east-1a/i-0abc` -> `i-0abc`; None for nodes of other clouds."""
    pid = (node.get("spec") or {}).get("providerID") or ""
    return pid.rsplit("/", 1)[-1] if pid.startswith("aws://") else None


def _labels(node: Mapping) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _matches(node_labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return bool(selector) and all(node_labels.get(k) == v for k, v in selector.items())


def claims(pool: NodePool, node: Mapping, facts: MembershipFacts) -> bool:
    """Whether the pool's provider says the node is one of the pool's."""
    node_labels = _labels(node)
    if pool.provider == "aws-asg" and pool.aws is not None:
        iid = instance_id(node)
        return iid is not None and facts.instance_groups.get(iid) == pool.aws.asg_name and \
            facts.instance_names.get(iid) == node["metadata"]["name"]
    if pool.provider == "kubernetes-spares":
        return _matches(node_labels, pool.member_selector)
    return False


def self_claimed(node_labels: Mapping[str, str]) -> bool:
    """Whether a node's own labels claim a place in the fleet: the labels a kubelet may set on itself
    (`--node-labels`, or a patch of its own Node) and that once meant membership."""
    return labels.POOL in node_labels or node_labels.get(labels.ROLE) in (labels.ROLE_ACTIVE, labels.ROLE_SPARE,
                                                                           labels.ROLE_SYSTEM)


def is_gpu_node(node: Mapping) -> bool:
    status = node.get("status") or {}
    for where in ("capacity", "allocatable"):
        try:
            if int(str((status.get(where) or {}).get(GPU_RESOURCE, "0"))) > 0:
                return True
        except ValueError:
            continue
    node_labels = _labels(node)
    return node_labels.get("nvidia.com/gpu.present") == "true" or labels.GPU_COUNT in node_labels


def pool_labels(pool: NodePool) -> dict[str, str]:
    """The labels that make a node the pool's (not the role; not the GPU labels, which the GPU
    feature discovery owns)."""
    out = {**pool.labels, labels.NODE_POOL: pool.name}
    if pool.topology_block:
        out[labels.TOPOLOGY_BLOCK] = pool.topology_block
    return out


def topology_annotation(pool: NodePool, node: Mapping) -> dict[str, str]:
    """The Slurm topology of a pool's node for slurm-operator 1.2.1 (it copies a node's
    topology.slinky.slurm.net/spec to the Slurm node of each NodeSet pod there: nodeset_sync.go
    syncSlurmTopology): the pool's block in the stack's topology.yaml. Empty when set already or no block."""
    if not pool.topology_block:
        return {}
    want = f"{labels.SLURM_TOPOLOGY}:{pool.topology_block}"
    have = (node["metadata"].get("annotations") or {}).get(labels.SLINKY_TOPOLOGY_SPEC)
    return {} if have == want else {labels.SLINKY_TOPOLOGY_SPEC: want}


def plan(nodes: Iterable[Mapping], spec: FleetSpec, facts: MembershipFacts = MembershipFacts()) -> MembershipPlan:
    nodes = sorted(nodes, key=lambda n: n["metadata"]["name"])
    pools = {p.name: p for p in spec.pools}
    members: list[tuple[Mapping, NodePool]] = []
    unlabelled, conflicts, unproven = [], [], []
    for node in nodes:
        name, have = node["metadata"]["name"], _labels(node)
        claimed = [p.name for p in spec.pools if claims(p, node, facts)]
        labelled = have.get(labels.NODE_POOL)
        iid = instance_id(node)
        if not labelled and iid in facts.instance_groups and facts.instance_names.get(iid) != name:
            conflicts.append((name, f"names instance {iid} of group {facts.instance_groups[iid]}, whose kubelet "
                             f"registers as {facts.instance_names.get(iid) or '(no private DNS name)'}; a providerID "
                             f"is what a kubelet wrote: not enrolled"))
            continue
        if labelled is not None and labelled not in pools:
            conflicts.append((name, f"labelled {labels.NODE_POOL}={labelled}, a pool the spec does not declare"))
            continue
        if len(claimed) > 1:
            conflicts.append((name, f"claimed by pools {claimed}; make their selectors disjoint"))
            continue
        if labelled and claimed and claimed[0] != labelled:
            conflicts.append((name, f"labelled {labels.NODE_POOL}={labelled} but its provider places it in pool "
                                    f"{claimed[0]}; left as it is"))
            continue
        pool_name = labelled or (claimed[0] if claimed else None)
        if pool_name is None:
            if have.get(labels.SYSTEM_NODE) == "true":
                continue  # the platform's system node
            if self_claimed(have):
                unproven.append(name)
            elif is_gpu_node(node):
                unlabelled.append(name)
            continue
        members.append((node, pools[pool_name]))

    roles: dict[str, dict[str, int]] = {p: {} for p in pools}
    self_active: list[tuple[Mapping, NodePool]] = []
    for node, pool in members:
        have = _labels(node)
        role = have.get(labels.ROLE)
        if role == labels.ROLE_ACTIVE and labels.NODE_POOL not in have:
            self_active.append((node, pool))  # `active` before it was a proven member: its kubelet may have said so
        elif role:
            roles[pool.name][role] = roles[pool.name].get(role, 0) + 1
    # A node joining with `active` on it (set by whoever registered it, its kubelet included) keeps it only while
    # its pool has fewer active nodes than it declares, as a node without a role would get; past that it joins as
    # a spare (spare taint, checked before it serves), so a kubelet's own label never takes a place in service.
    demoted = set()
    for node, pool in self_active:
        count = roles[pool.name]
        if count.get(labels.ROLE_ACTIVE, 0) < pool.nodes:
            count[labels.ROLE_ACTIVE] = count.get(labels.ROLE_ACTIVE, 0) + 1
        else:
            demoted.add(node["metadata"]["name"])

    changes = []
    for node, pool in members:
        name, have = node["metadata"]["name"], _labels(node)
        want = pool_labels(pool)
        role, why = have.get(labels.ROLE), []
        if name in demoted:
            count = roles[pool.name]
            role = want[labels.ROLE] = labels.ROLE_SPARE
            count[role] = count.get(role, 0) + 1
            why.append(f"joined pool {pool.name} as {role}: its own label said {labels.ROLE_ACTIVE}, and the pool "
                       f"has its {pool.nodes} active nodes")
        elif not role:
            count = roles[pool.name]
            role = labels.ROLE_ACTIVE if count.get(labels.ROLE_ACTIVE, 0) < pool.nodes else labels.ROLE_SPARE
            count[role] = count.get(role, 0) + 1
            want[labels.ROLE] = role
            why.append(f"joined pool {pool.name} as {role}")
        set_labels = {k: v for k, v in want.items() if have.get(k) != v}
        taint_keys = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
        wanted_taints = node_taints(pool, role) if role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) else \
            node_taints(pool, labels.ROLE_ACTIVE)
        if labels.LENDING_TAINT in taint_keys:  # on loan: the lending taint stands in for the spare taint
            wanted_taints = [t for t in wanted_taints if t["key"] != labels.SPARE_TAINT]
        add = tuple(t for t in wanted_taints if t["key"] not in taint_keys)
        if set_labels and not why:
            why.append(f"labels of pool {pool.name}: {sorted(set_labels)}")
        if add:
            why.append(f"taints {[t['key'] for t in add]}")
        topo = topology_annotation(pool, node)
        if topo:
            why.append(f"Slurm topology {topo[labels.SLINKY_TOPOLOGY_SPEC]}")
        if set_labels or add or topo:
            seen = NodeShape.of(have.get(labels.ROLE, ""), taint_keys)
            changes.append(NodeChange(name, pool.name, set_labels, add, "; ".join(why), topo, seen))
    return MembershipPlan(tuple(changes), tuple(unlabelled), unproven=tuple(unproven), conflicts=tuple(conflicts))


def membership_actions(result: MembershipPlan, reported: frozenset[str] = frozenset()) -> tuple[Action, ...]:
    """The plan as actions: its label and taint changes, the settling of answered capacity requests, and
    one Warning Event per node not `reported` yet that is a GPU node of no pool, claims membership by its own
    labels, or is in conflict (a forged providerID among them)."""
    changes = tuple(ApplyMembership(c.node, dict(c.labels), tuple(c.add_taints), c.why,
                                    dict(c.annotations), c.seen) for c in result.changes)
    reports = tuple(Report("Node", n, "NodeInNoPool", "a GPU node no pool claims: gpufleet does not heal it")
                    for n in result.unlabelled_gpu_nodes if n not in reported)
    conflicts = tuple(Report("Node", n, "NodeMembershipConflict", f"gpufleet left this node's membership as it is: "
                                                                   f"{why}")
                      for n, why in result.conflicts if n not in reported)
    unproven = tuple(Report("Node", n, "NodeMembershipUnproven",
                            f"the node's own labels claim a pool or role ({labels.POOL}, {labels.ROLE}) that no "
                            f"provider evidence backs: it enrols in nothing until its provider proves it a member "
                            f"({labels.NODE_POOL} or the pool's member_selector)")
                     for n in result.unproven if n not in reported)
    return changes + (SettleCapacityRequests(),) + reports + unproven + conflicts


# --- kubernetes-spares capacity requests ---------------------------------------------------------

@dataclass(frozen=True)
class Settlement:
    request: str  # placeholder pod name
    node: str     # the node that answered it


def settle(requests: Iterable[Mapping], nodes: Iterable[Mapping], pool_label: str) -> tuple[Settlement, ...]:
    """Which capacity requests (placeholder pods, oldest first) a joined node answered: the node the
    scheduler bound it to, else a spare of its pool that joined after it and answered nothing yet.
    `pool_label` is the label on the requests naming their pool."""
    nodes = list(nodes)
    fulfils = lambda n: (n["metadata"].get("annotations") or {}).get(labels.FULFILS)  # noqa: E731
    used: set[str] = {n["metadata"]["name"] for n in nodes if fulfils(n)}
    out = []
    for req in sorted(requests, key=lambda r: (r["metadata"].get("creationTimestamp") or "", r["metadata"]["name"])):
        name = req["metadata"]["name"]
        pool = ((req["metadata"].get("labels") or {}).get(pool_label))
        # a node's record that it answered this request counts only on a node of the request's pool (the proven
        # pool, which no kubelet sets): an annotation is no proof of who wrote it
        answered = [n for n in nodes if fulfils(n) == name and _labels(n).get(labels.NODE_POOL) == pool]
        if answered:
            out.append(Settlement(name, answered[0]["metadata"]["name"]))
            continue
        bound = (req.get("spec") or {}).get("nodeName")
        if bound and bound not in used:
            used.add(bound)
            out.append(Settlement(name, bound))
            continue
        since = req["metadata"].get("creationTimestamp") or ""
        fresh = sorted(
            (n for n in nodes if _labels(n).get(labels.NODE_POOL) == pool and _labels(n).get(labels.ROLE) == labels.ROLE_SPARE
             and n["metadata"]["name"] not in used and (n["metadata"].get("creationTimestamp") or "") >= since),
            key=lambda n: (n["metadata"].get("creationTimestamp") or "", n["metadata"]["name"]))
        if fresh:
            used.add(fresh[0]["metadata"]["name"])
            out.append(Settlement(name, fresh[0]["metadata"]["name"]))
    return tuple(out)
