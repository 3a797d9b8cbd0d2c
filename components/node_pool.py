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

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec, NodePool
from gpufleet.fleetspec.placement import node_labels, node_taints, worker_selector, worker_tolerations

from .meta import metadata


def capacity_document(pool: NodePool) -> dict[str, Any]:
    return {
        "pool": pool.name,
        "provider": pool.provider,
        "nodes": pool.nodes,
        "spares": pool.spares,
        "nodeType": pool.node_type,
        "gpuModel": pool.gpu_model,
        "gpusPerNode": pool.gpus_per_node,
        "activeLabels": node_labels(pool, labels.ROLE_ACTIVE),
        "spareLabels": node_labels(pool, labels.ROLE_SPARE),
        "activeTaints": node_taints(pool, labels.ROLE_ACTIVE),
        "spareTaints": node_taints(pool, labels.ROLE_SPARE),
        "memberSelector": dict(pool.member_selector),
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
        self.selector = worker_selector(pool)
        self.tolerations = worker_tolerations(pool)
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
            "max_lent": pool.max_lent(),
            "borrower_priority_class": pool.lending.borrowers.priority_class if pool.lending else None,
        })


def borrower_priority_classes(name: str, spec: FleetSpec,
                              opts: pulumi.ResourceOptions) -> dict[str, k8s.scheduling.v1.PriorityClass]:
    """One PriorityClass per distinct `lending.borrowers.priority_class`: borrowers are preempted by anything
    and preempt nothing (`Never`), so a lent GPU is taken back by the scheduler too, never held against it.
    Declared once for the fleet (pools may share a class), so reordering pools never replaces one."""
    out = {}
    for cls, value in sorted(spec.borrower_classes().items()):
        pools = [p.name for p in spec.lending_pools() if p.lending.borrowers.priority_class == cls]
        out[cls] = k8s.scheduling.v1.PriorityClass(
            f"{name}-priorityclass-{cls}",
            metadata=metadata(cls, "borrower", spec.environment),
            value=value,
            preemption_policy="Never",
            global_default=False,
            description=f"gpufleet: borrowers of idle GPUs in pool(s) {', '.join(pools)}. Lowest priority, never "
                        f"preempts; gpufleet evicts them when training or a fault needs the node.",
            opts=opts,
        )
    return out
