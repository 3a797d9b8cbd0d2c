"""A GPU node pool: its placement (labels, taints, selector, tolerations) and its declared capacity.

The nodes themselves belong to a node provider (a cloud node group, or the local
environment's fake nodes). The program declares the pool's size and spares in a
ConfigMap that the reconciler and the provider read; it never declares Node objects,
so a later `pulumi up` does not fight the reconciler after it swapped a node.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleetspec import labels
from fleetspec.models import NodePool

from .meta import metadata


def pool_node_labels(pool: NodePool, role: str) -> dict[str, str]:
    """Labels a node of this pool carries (the provider applies them when it joins)."""
    out = {
        **pool.labels,
        labels.POOL: pool.name,
        labels.ROLE: role,
        labels.GPU_MODEL: pool.gpu_model,
        labels.GPU_COUNT: str(pool.gpus_per_node),
    }
    if pool.topology_block:
        out[labels.TOPOLOGY_BLOCK] = pool.topology_block
    return out


def pool_node_taints(pool: NodePool, role: str) -> list[dict[str, str]]:
    taints = [t.model_dump() for t in pool.taints]
    if role == labels.ROLE_SPARE:
        taints.append({"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"})
    return taints


def pool_tolerations(pool: NodePool) -> list[dict[str, str]]:
    """What a pool's workers tolerate: the pool's own taints, never the spare or quarantine taints."""
    return [
        {"key": t.key, "operator": "Equal" if t.value else "Exists", **({"value": t.value} if t.value else {}),
         "effect": t.effect}
        for t in pool.taints
    ]


def pool_selector(pool: NodePool) -> dict[str, str]:
    return {labels.POOL: pool.name}


def capacity_document(pool: NodePool) -> dict[str, Any]:
    return {
        "pool": pool.name,
        "provider": pool.provider,
        "nodes": pool.nodes,
        "spares": pool.spares,
        "nodeType": pool.node_type,
        "gpuModel": pool.gpu_model,
        "gpusPerNode": pool.gpus_per_node,
        "activeLabels": pool_node_labels(pool, labels.ROLE_ACTIVE),
        "spareLabels": pool_node_labels(pool, labels.ROLE_SPARE),
        "activeTaints": pool_node_taints(pool, labels.ROLE_ACTIVE),
        "spareTaints": pool_node_taints(pool, labels.ROLE_SPARE),
        **({"aws": pool.aws.model_dump()} if pool.aws else {}),
    }


@dataclass
class GpuNodePoolArgs:
    pool: NodePool
    namespace: pulumi.Input[str]
    environment: str


class GpuNodePool(pulumi.ComponentResource):
    name: pulumi.Output[str]
    selector: dict[str, str]
    tolerations: list[dict[str, str]]
    capacity: k8s.core.v1.ConfigMap

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:pool:GpuNodePool", name, None, opts)
        pool = args.pool
        self.selector = pool_selector(pool)
        self.tolerations = pool_tolerations(pool)
        self.capacity = k8s.core.v1.ConfigMap(
            f"{name}-capacity",
            metadata=metadata(f"gpufleet-pool-{pool.name}", "node-pool", args.environment, args.namespace,
                              {labels.POOL: pool.name}),
            data={"capacity.json": json.dumps(capacity_document(pool), indent=2, sort_keys=True)},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = pulumi.Output.from_input(pool.name)
        self.register_outputs({
            "name": self.name,
            "nodes": pool.nodes,
            "spares": pool.spares,
            "gpus": (pool.nodes + pool.spares) * pool.gpus_per_node,
            "selector": self.selector,
        })
