"""Lending stays safe: a pool that lends idle GPUs keeps an unlent spare for the next fault, takes its
GPUs back within a short grace, and its borrowers yield to everything else on the node.

The pools' lending sections are read from the policy ConfigMap (`gpufleet-policy`, `data["fleet.json"]`,
the whole FleetSpec, see components/reconciler.py); the borrower PriorityClasses are the stack's
`scheduling.k8s.io/v1` PriorityClass resources (components/node_pool.py declares one per class).
The spec allows a floor of 0 and a grace of an hour; this rule, where it is mandatory (prod), does not.
"""
from __future__ import annotations

import json
from typing import Any

from .base import Rule
from .healing import is_policy
from .k8s import UNKNOWN, Resource, config, dig, report

NAME = "lending-safe"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"

SCHEMA: dict[str, dict] = {
    "minSpareFloor": {"type": "integer", "minimum": 0, "default": 1,
                      "description": "A pool whose spares lend keeps at least this many never lent (lending.spare_floor)."},
    "maxReclaimGraceSeconds": {"type": "integer", "minimum": 0, "default": 60,
                               "description": "A borrower gets at most this long to leave (lending.reclaim_grace_seconds)."},
    "maxBorrowerPriority": {"type": "integer", "default": -1,
                            "description": "Borrowers' PriorityClass value is at most this (below 0: below any pod "
                                           "without a class), and below every other PriorityClass of the stack."},
}


def _int(v: Any) -> int | None:
    """An integer, as the engine hands numbers over (floats: -1000.0)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        return None
    return int(v)


def check_stack(resources: list[Resource], cfg: dict[str, Any]) -> list[tuple[Resource | None, str]]:
    policies = [r for r in resources if is_policy(r)]
    doc = dig(policies[0].props, "data", "fleet.json") if policies else None
    if not isinstance(doc, str):
        return []  # no policy, or not known yet: reconciler-deployed / healing-enabled speak for it
    try:
        fleet = json.loads(doc)
    except ValueError:
        return []  # healing-enabled reports a malformed policy
    pools = [p for p in (fleet.get("pools") or []) if isinstance(p, dict)] if isinstance(fleet, dict) else []
    classes = {r.name: r for r in resources if r.resource_type == PRIORITY_CLASS}
    borrower_names = {dig(p, "lending", "borrowers", "priority_class") for p in pools if isinstance(p.get("lending"), dict)}
    others = {n: v for n, r in classes.items() if n not in borrower_names
              and (v := _int(dig(r.props, "value"))) is not None}
    policy = policies[0]
    floor_min, grace_max, prio_max = int(cfg["minSpareFloor"]), int(cfg["maxReclaimGraceSeconds"]), \
        int(cfg["maxBorrowerPriority"])
    out: list[tuple[Resource | None, str]] = []
    for i, pool in enumerate(pools):
        lending = pool.get("lending")
        if not isinstance(lending, dict):
            continue
        name, where = pool.get("name"), f"gpufleet:fleet.pools[{i}].lending"
        floor = lending.get("spare_floor")
        if lending.get("spares") is True and ((n := _int(floor)) is None or n < floor_min):
            out.append((policy, f"pool {name!r} lends its spares with {where}.spare_floor: {floor!r}; at least "
                                f"{floor_min} spare must stay unlent, or a fault waits for borrowers to leave before "
                                f"it is healed. Fix: set `spare_floor: {floor_min}` (and `spares` above it) in {where}."))
        grace = lending.get("reclaim_grace_seconds")
        if (n := _int(grace)) is None or n > grace_max:
            out.append((policy, f"pool {name!r}: {where}.reclaim_grace_seconds is {grace!r}, more than {grace_max} s; "
                                f"training that needs the node back (or a fault that needs the spare) waits that long. "
                                f"Fix: set `reclaim_grace_seconds` to at most {grace_max} in {where}."))
        cls = dig(lending, "borrowers", "priority_class")
        pc = classes.get(cls) if isinstance(cls, str) else None
        if pc is None:
            out.append((policy, f"pool {name!r}: the stack declares no PriorityClass {cls!r} for its borrowers "
                                f"({where}.borrowers.priority_class), so they would run at the default priority. "
                                f"Fix: declare the fleet with components.GpuFleet, which declares it."))
            continue
        value = dig(pc.props, "value")
        if value is UNKNOWN:
            continue
        if (n := _int(value)) is None or n > prio_max:
            out.append((pc, f"{pc.ref}: pool {name!r}'s borrowers run at priority {value if n is None else n!r}, above {prio_max}: they "
                            f"would not yield to pods without a PriorityClass (priority 0). Fix: set "
                            f"{where}.borrowers.priority to {prio_max} or lower."))
        elif higher := sorted(o for o, v in others.items() if v <= n):
            out.append((pc, f"{pc.ref}: pool {name!r}'s borrowers run at priority {n}, not below the stack's "
                            f"PriorityClass(es) {higher} ({', '.join(str(others[o]) for o in higher)}): a borrower "
                            f"could hold a GPU against them. Fix: set {where}.borrowers.priority below "
                            f"{min(others[o] for o in higher)}."))
        policy_ = dig(pc.props, "preemptionPolicy")
        if policy_ is not UNKNOWN and policy_ != "Never":
            out.append((pc, f"{pc.ref}: pool {name!r}'s borrowers have preemptionPolicy {policy_!r}: a borrower "
                            f"could preempt another pod to land on a GPU. Fix: preemptionPolicy: Never "
                            f"(components.GpuFleet declares it so); {where}.borrowers.priority_class names it."))
    return out


def validate(args: Any, report_violation) -> None:
    for res, msg in check_stack(Resource.all_of(args), config(args, SCHEMA)):
        report(report_violation, res, msg)


RULE = Rule(
    name=NAME,
    description="A pool that lends keeps an unlent spare, takes GPUs back within 60 s, and its borrowers have the "
                "lowest priority and never preempt.",
    validate=validate,
    scope="stack",
    config_schema=SCHEMA,
    remediation="Fix the pool's `lending` section in the stack's gpufleet:fleet.pools.",
)
