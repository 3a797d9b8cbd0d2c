"""The local environment's fake GPU nodes (kwok): their manifests, the reserve that refills spares,
and the `local` node provider that joins them (registered with the reconciler's providers).

Each pool gets `nodes` active nodes and `spares` spares, named `kwok-<pool>-<i>` and
`kwok-<pool>-spare-<i>` in the local environment; a refill joins one of RESERVE more spare names.
"""
from __future__ import annotations

import logging
from typing import Any

from fleetspec import labels
from fleetspec.models import FleetSpec, NodePool
from fleetspec.placement import node_labels, node_taints

from reconciler.errors import TemporaryError
from reconciler.adapters.kube import Kube
from reconciler.adapters.providers import KubernetesSpares, register_provider

log = logging.getLogger(__name__)
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


def pool_node(pool: NodePool, name: str, role: str) -> dict[str, Any]:
    return fake_node(name, node_labels(pool, role), node_taints(pool, role), cpus=pool.cpus_per_node,
                     memory=pool.memory_per_node, gpus=pool.gpus_per_node)


def fleet_nodes(spec: FleetSpec, prefix: str = "") -> list[dict[str, Any]]:
    """Every fake node of the local fleet: a system node, then each pool's nodes and spares."""
    out = [fake_node(SYSTEM_NODE, {labels.ROLE: labels.ROLE_SYSTEM}, [], cpus=8, memory="32Gi")]
    for pool in spec.pools:
        out += [pool_node(pool, prefix + n, labels.ROLE_ACTIVE) for n in pool.node_names()]
        out += [pool_node(pool, prefix + n, labels.ROLE_SPARE) for n in pool.spare_names()]
    return out


REFILL_KEY = "gpufleet.io/refill-for"


def join_reserve_spare(kube: Kube, pool: NodePool, key: str = "", prefix: str = KWOK_PREFIX) -> str | None:
    """Join the next reserved fake node of the pool as a spare, once per `key`; None when the reserve
    is used up. The node carries the key, so a replayed request joins nothing more."""
    nodes = kube.core.list_node(label_selector=f"{labels.POOL}={pool.name}").items
    if key and any((n.metadata.annotations or {}).get(REFILL_KEY) == key for n in nodes):
        return None
    existing = {n.metadata.name for n in nodes}
    for i in range(pool.spares + RESERVE):
        name = f"{prefix}{pool.name}-spare-{i}"
        if name not in existing:
            node = pool_node(pool, name, labels.ROLE_SPARE)
            if key:
                node["metadata"]["annotations"][REFILL_KEY] = key
            try:
                kube.core.create_node(node)
            except Exception as e:  # noqa: BLE001 - surfaced as a retryable error
                raise TemporaryError(f"join {name}: {e}") from None
            return name
    return None


class LocalProvider(KubernetesSpares):
    """Spares as the `kubernetes-spares` provider keeps them; a refill joins the next reserved fake node."""

    def request_capacity(self, pool: str, reason: str, key: str = "") -> None:
        joined = join_reserve_spare(self.kube, self.spec.pool(pool), key)
        log.info("local refill for pool %s (%s): %s", pool, reason, joined or "reserve exhausted")


register_provider("local", LocalProvider)
