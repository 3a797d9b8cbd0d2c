"""Spares: every GPU pool keeps pre-joined spare nodes to swap in for a failed one.

The pools are visible to the engine as their capacity ConfigMaps (`gpufleet-pool-<name>`,
`data["capacity.json"]`, see components/node_pool.py); the spec allows `spares: 0`, this
rule does not.
"""
from __future__ import annotations

import json
import math
from typing import Any

from gpufleet.fleetspec import labels

from .base import Rule
from .k8s import UNKNOWN, Resource, config, dig, report

NAME = "gpu-pool-spares"
POOL_CONFIGMAP_PREFIX = "gpufleet-pool-"

SCHEMA: dict[str, dict] = {
    "minSpares": {"type": "integer", "minimum": 0, "default": 1,
                  "description": "Every pool keeps at least this many spare nodes."},
    "minSpareRatio": {"type": "number", "minimum": 0, "maximum": 1, "default": 0,
                      "description": "...and at least this fraction of its active nodes (rounded up)."},
}


def is_pool_capacity(r: Resource) -> bool:
    return r.is_kind("ConfigMap") and r.group_version == "core/v1" and r.name.startswith(POOL_CONFIGMAP_PREFIX)


def check(r: Resource, cfg: dict[str, Any]) -> list[str]:
    doc = dig(r.props, "data", "capacity.json")
    if doc is UNKNOWN:
        return []
    try:
        cap = json.loads(doc) if isinstance(doc, str) else None
    except ValueError:
        cap = None
    if not isinstance(cap, dict) or not isinstance(cap.get("spares"), int) or not isinstance(cap.get("nodes"), int):
        return [f"{r.ref}: data[\"capacity.json\"] is missing or has no integer `nodes`/`spares`. Fix: declare "
                f"the pool through components.GpuNodePool, which writes this document."]
    pool, nodes, spares = cap.get("pool") or r.name[len(POOL_CONFIGMAP_PREFIX):], cap["nodes"], cap["spares"]
    ratio = float(cfg["minSpareRatio"])
    need = max(int(cfg["minSpares"]), math.ceil(round(ratio * nodes, 9)))
    if spares >= need:
        return []
    why = f"at least {int(cfg['minSpares'])}"
    if ratio:
        why += f" and {ratio:g} of its {nodes} nodes"
    return [f"{r.ref}: GPU pool {pool!r} keeps {spares} spare node(s), needs {need} ({why}). A failed node "
            f"then waits for a new one instead of being swapped at once. Fix: set `spares: {need}` (or more) "
            f"for pool {pool} in gpufleet:fleet.pools of the stack file."]


def validate(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not is_pool_capacity(r):
        return
    for msg in check(r, config(args, SCHEMA)):
        report(report_violation, None, msg)


RULE = Rule(
    name=NAME,
    description="Every GPU pool keeps spare nodes: at least the minimum, and the configured share of its size.",
    validate=validate,
    config_schema=SCHEMA,
    remediation="Raise `spares` for the pool in the stack's gpufleet:fleet.pools.",
)


MEMBERSHIP = "pool-membership-declared"
MEMBERSHIP_SCHEMA: dict[str, dict] = {
    "requireMemberSelector": {"type": "boolean", "default": True,
                              "description": "kubernetes-spares pools declare how their nodes are known."},
}


def check_membership(r: Resource, cfg: dict[str, Any]) -> list[str]:
    doc = dig(r.props, "data", "capacity.json")
    if doc is UNKNOWN or not cfg["requireMemberSelector"]:
        return []
    try:
        cap = json.loads(doc) if isinstance(doc, str) else {}
    except ValueError:
        return []  # gpu-pool-spares reports a malformed document
    pool = cap.get("pool") or r.name[len(POOL_CONFIGMAP_PREFIX):]
    selector = cap.get("memberSelector") or {}
    forgeable = labels.untrusted_keys(selector)
    if forgeable:
        return [f"{r.ref}: pool {pool!r} selects its members on {forgeable}, labels a kubelet may set on its own "
                f"node, so a compromised node could enrol itself. Fix: select on {labels.TRUSTED_PREFIX} labels "
                f"the platform sets."]
    if cap.get("provider") != "kubernetes-spares" or selector:
        return []
    return [f"{r.ref}: pool {pool!r} (kubernetes-spares) declares no member_selector, so no node joins it unless a "
            f"person labels it {POOL_LABEL}={pool}. Fix: set `member_selector` (a {labels.TRUSTED_PREFIX} label "
            f"the platform sets) for pool {pool} in gpufleet:fleet.pools."]


def validate_membership(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if is_pool_capacity(r):
        for msg in check_membership(r, config(args, MEMBERSHIP_SCHEMA)):
            report(report_violation, None, msg)


POOL_LABEL = labels.NODE_POOL
MEMBERSHIP_RULE = Rule(
    name=MEMBERSHIP,
    description="Every pool says how its nodes are known, by evidence no kubelet can forge: its Auto Scaling group, "
                "or a member selector on node-restriction.kubernetes.io/ labels.",
    validate=validate_membership,
    config_schema=MEMBERSHIP_SCHEMA,
    remediation="Set `member_selector` for each kubernetes-spares pool in the stack's gpufleet:fleet.pools.",
)
