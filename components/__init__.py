"""Pulumi component resources that turn a fleet spec into infrastructure."""
from .cluster import ClusterAccess, ClusterAccessArgs
from .fleet import GpuFleet, GpuFleetArgs, pool_summaries
from .node_pool import GpuNodePool, GpuNodePoolArgs
from .reconciler import Reconciler, ReconcilerArgs
from .slinky import SlinkySlurm, SlinkySlurmArgs
from .storage import SharedStorage, SharedStorageArgs

__all__ = [
    "ClusterAccess", "ClusterAccessArgs", "GpuFleet", "GpuFleetArgs", "pool_summaries", "GpuNodePool",
    "GpuNodePoolArgs", "Reconciler", "ReconcilerArgs", "SlinkySlurm", "SlinkySlurmArgs", "SharedStorage",
    "SharedStorageArgs",
]
