"""Which remediation records may be deleted: records are the reconciler's memory, so one goes only
when no rule reads it any more.

A record may go when all of these hold:

* it is finished (Succeeded, Escalated, Failed): a live one is a remediation in progress;
* it ended (its last phase change, its repair's included) longer ago than ``healing.record_retention_days``,
  and longer ago than the attempts, unhealthy and retirement windows, so the attempt cap, the storm brake
  and the lemon rule still count it;
* it is not the newest record of a node that is quarantined, retired, or whose newest record is
  Escalated: that one says why a human must look; and its node's repair is over (issue 25);
* its signal is not still on its node: the record's name is the node and signal, and it is what
  stops a stale condition from starting the same remediation again.

Remediations of pools outside the spec are another fleet's and are never touched; unreadable ones are
reported (runtime/healing.py), never deleted.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import HealingSpec

from gpufleet.reconciler.core.model import NodeView, Remediation, remediation_name
from gpufleet.reconciler.core.phases import Phase


def keep_for(policy: HealingSpec) -> timedelta:
    """How long a finished record is kept at least: the retention, or a window that counts it if longer."""
    return max(timedelta(days=policy.record_retention_days),
               timedelta(seconds=policy.attempts_window_seconds),
               timedelta(seconds=policy.unhealthy_window_seconds),
               timedelta(seconds=policy.repair.retire_window_seconds))


def ended(record: Remediation) -> datetime:
    """When it last changed phase, or its repair did (its creation if no phase time was kept)."""
    repaired = record.repair.phase_times if record.repair else ()
    return max([record.created, *(at for _, at in record.phase_times), *(at for _, at in repaired)])


def expired_records(records: Iterable[Remediation], nodes: Iterable[NodeView], policy: HealingSpec,
                    pools: Collection[str], now: datetime) -> tuple[Remediation, ...]:
    """The records that may be deleted now, oldest first (see the module docstring)."""
    records = [r for r in records if r.pool in pools]
    by_node: dict[str, list[Remediation]] = {}
    for r in records:
        by_node.setdefault(r.node, []).append(r)
    kept: set[str] = set()
    views = {n.name: n for n in nodes}
    for node, mine in by_node.items():
        newest = max(mine, key=lambda r: (r.created, r.name))
        view = views.get(node)
        if newest.phase is Phase.ESCALATED or (view is not None and view.role in (labels.ROLE_QUARANTINED,
                                                                                 labels.ROLE_RETIRED)):
            kept.add(newest.name)
        if view is not None and view.fault is not None:
            kept.add(remediation_name(node, view.fault))
    horizon = now - keep_for(policy)
    out = [r for r in records if r.phase.terminal and not (r.repair and r.repair.active) and ended(r) < horizon
           and r.name not in kept]
    return tuple(sorted(out, key=lambda r: (ended(r), r.name)))
