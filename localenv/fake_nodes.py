"""The local environment's fake GPU nodes (kwok): their manifests, and each pool's node group (the
template of a node that joins it, and the names it has room for).

Each pool gets `nodes` active nodes and `spares` spares, named `kwok-<pool>-<i>` and
`kwok-<pool>-spare-<i>` in the local environment. Its node group has room for RESERVE nodes more: the
cluster autoscaler's stand-in (:mod:`localenv.autoscaler_standin`) joins them, named
`kwok-<pool>-spare-<i>` after the spares, as a refill's capacity request asks.
"""
from __future__ import annotations

from typing import Any

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec, NodePool
from gpufleet.fleetspec.placement import node_labels, node_taints

RESERVE = 2
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SYSTEM_NODE = "local-system-0"
# The local environment's GPU nodes are named like a cloud's are not, but unlike their Slurm nodes
# (the NodeSet pods' hostnames, `h100-0`): a test that confuses the two fails here as it would there.
KWOK_PREFIX = "kwok-"


def fake_node(name: str, node_labels: dict[str, str], taints: list[dict], *, cpus: int, memory: str,
              gpus: int = 0) -> dict[str, Any]:
    capacity = {"cpu": str(cpus), "memory": memory, "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**node_labels, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok"},
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints or None},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def group_labels(pool: NodePool) -> dict[str, str]:
    """What a node of the pool's node group carries when it joins, before gpufleet's membership pass: the
    pool's own labels, its member selector (the node group's label; the pool label where it has none, as
    the capacity request's node selector asks) and the GPU labels the GPU feature discovery sets."""
    return {**pool.labels, **(dict(pool.member_selector) or {labels.NODE_POOL: pool.name}),
            labels.GPU_MODEL: pool.gpu_model, labels.GPU_COUNT: str(pool.gpus_per_node)}


def pool_node(pool: NodePool, name: str, role: str) -> dict[str, Any]:
    """A node of the pool already in a role (the environment's first nodes)."""
    return fake_node(name, {**group_labels(pool), **node_labels(pool, role)}, node_taints(pool, role),
                     cpus=pool.cpus_per_node, memory=pool.memory_per_node, gpus=pool.gpus_per_node)


def joining_node(pool: NodePool, name: str) -> dict[str, Any]:
    """A node of the pool's node group as it joins: the group's labels and the pool's taints, no role
    and no spare taint (membership gives it those)."""
    return fake_node(name, group_labels(pool), [t.model_dump() for t in pool.taints], cpus=pool.cpus_per_node,
                     memory=pool.memory_per_node, gpus=pool.gpus_per_node)


def reserve_names(pool: NodePool, prefix: str = KWOK_PREFIX) -> list[str]:
    """The names the pool's node group has room for beyond its active nodes: its spares, then RESERVE more."""
    return [f"{prefix}{pool.name}-spare-{i}" for i in range(pool.spares + RESERVE)]


def fleet_nodes(spec: FleetSpec, prefix: str = "") -> list[dict[str, Any]]:
    """Every fake node of the local fleet: a system node, then each pool's nodes and spares."""
    out = [fake_node(SYSTEM_NODE, {labels.ROLE: labels.ROLE_SYSTEM, labels.SYSTEM_NODE: "true"}, [], cpus=8,
                     memory="32Gi")]
    for pool in spec.pools:
        out += [pool_node(pool, prefix + n, labels.ROLE_ACTIVE) for n in pool.node_names()]
        out += [pool_node(pool, prefix + n, labels.ROLE_SPARE) for n in pool.spare_names()]
    return out


def kill_kubelet(core: Any, name: str) -> None:
    """The machine behind kwok node `name` dies: kwok stops acting as its kubelet (the annotation it manages
    nodes by is removed: no heartbeat, no pod on it is confirmed deleted or updated again), and its Ready
    condition becomes Unknown as kube-controller-manager's node lifecycle controller sets it once the node's
    lease is not renewed (kubernetes v1.34 pkg/controller/nodelifecycle/node_lifecycle_controller.go
    tryUpdateNodeHealth: reason NodeStatusUnknown, "Kubelet stopped posting node status."), at once instead of
    after node-monitor-grace-period."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_node(name, {"metadata": {"annotations": {KWOK_ANNOTATION: None}}})
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
