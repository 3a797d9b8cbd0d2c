"""Where a pool's nodes and workers go: node labels, taints and the tolerations of its workers.

Shared by the stack (NodeSets, capacity ConfigMaps) and the node providers (joining nodes).
"""
from __future__ import annotations

from typing import Iterable

from . import labels
from .models import NodePool


# The taint that keeps everything off a spare until it is promoted (or lent: reconciler/core/lending.py).
SPARE_TAINT = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}


def nodeset_names(pools: Iterable[NodePool]) -> frozenset[str]:
    """The NodeSets the stack declares: one per pool, named after it (components/slinky.py)."""
    return frozenset(p.name for p in pools)


def node_labels(pool: NodePool, role: str) -> dict[str, str]:
    """Labels a node of this pool carries in a role (active, spare, quarantined)."""
    out = {
        **pool.labels,
        labels.NODE_POOL: pool.name,
        labels.ROLE: role,
        labels.GPU_MODEL: pool.gpu_model,
        labels.GPU_COUNT: str(pool.gpus_per_node),
    }
    if pool.topology_block:
        out[labels.TOPOLOGY_BLOCK] = pool.topology_block
    return out


def node_taints(pool: NodePool, role: str) -> list[dict[str, str]]:
    """The pool's taints; a spare also carries the spare taint, so nothing lands on it until promoted."""
    taints = [t.model_dump() for t in pool.taints]
    if role == labels.ROLE_SPARE:
        taints.append(dict(SPARE_TAINT))
    return taints


def worker_tolerations(pool: NodePool) -> list[dict[str, str]]:
    """What a pool's workers tolerate: the pool's own taints, never the spare or quarantine taints."""
    return [
        {"key": t.key, "operator": "Equal" if t.value else "Exists", **({"value": t.value} if t.value else {}),
         "effect": t.effect}
        for t in pool.taints
    ]


def worker_selector(pool: NodePool) -> dict[str, str]:
    """Where a pool's workers may run: its proven members (a label no kubelet can set on itself)."""
    return {labels.NODE_POOL: pool.name}


def borrower_placement(pool: NodePool) -> dict:
    """The pod-spec fields a borrower of this pool needs: its PriorityClass, the lending taint (and the
    pool's own) tolerated, and a lent node of the pool required. Nothing else lets a pod on a lent node."""
    if pool.lending is None:
        raise ValueError(f"pool {pool.name} declares no lending")
    return {
        "priorityClassName": pool.lending.borrowers.priority_class,
        "tolerations": worker_tolerations(pool) + [
            {"key": labels.LENDING_TAINT, "operator": "Equal", "value": pool.name, "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": labels.NODE_POOL, "operator": "In", "values": [pool.name]},
                                  {"key": labels.LENT, "operator": "Exists"}]}]}}},
    }
