"""The benchmarks' fleets: a pool, a fleet spec, and the policy the reconciler reads (as the stack renders it)."""
from __future__ import annotations

from pathlib import Path

import _repo  # noqa: F401  (the checkout on the import path)

from gpufleet.fleetspec import parse_fleet
from gpufleet.fleetspec.models import FleetSpec


def pool_doc(name: str, nodes: int, spares: int, provider: str = "kubernetes-spares", cpus: int = 2) -> dict:
    return {"name": name, "node_type": "kwok-gpu", "gpu_model": "H100-SXM5-80GB", "gpus_per_node": 8,
            "cpus_per_node": cpus, "memory_per_node": "16Gi", "nodes": nodes, "spares": spares,
            "provider": provider, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}


def fleet_doc(pools: list[dict], healing: dict | None = None, storage: list[dict] | None = None,
              environment: str = "bench") -> dict:
    return {
        "environment": environment,
        "cluster": {"kind": "local"},
        "pools": pools,
        "storage": storage or [],
        "slurm": {"operator": {"mode": "crds-only"},
                  "partitions": [{"name": p["name"], "pools": [p["name"]], "default": i == 0}
                                 for i, p in enumerate(pools)]},
        "healing": healing or {},
    }


def make_spec(pools: list[dict], healing: dict | None = None, storage: list[dict] | None = None) -> FleetSpec:
    return parse_fleet(fleet_doc(pools, healing, storage), source="bench")


def write_policy(spec: FleetSpec, path: Path) -> Path:
    """The policy exactly as the stack renders it into the gpufleet-policy ConfigMap."""
    path.write_text(spec.model_dump_json(indent=2))
    return path
