"""A replacement that breaks before its remediation succeeds. Pure.

A spare chosen for a remediation (Replacing) or promoted for it (Resuming) that faults or is quarantined
before the remediation succeeds is given up at once: the remediation notes it in its
history (`Remediation.failed_replacements`, with why), pages, and takes another spare (back to Replacing).
After `MAX_REPLACEMENTS` broken ones it fails: something other than the spares is wrong.

The broken spare's own remediation (a spare's fault: quarantine and refill; a promoted one's: containment
first, then) stands in for the pool position it was filling (`Remediation.stands_in_for`): it replaces
nothing itself (the remediation it stood in for does), takes no admission slot, and the storm brake counts
the position once. The brake measures how much of a pool's declared nodes is unhealthy; a spare that
breaks while standing in for a faulted node is that same position breaking again, not a second one
(`stand_ins`), so a small pool is not held for a human while healthy spares are free.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Iterable

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import describe

from gpufleet.reconciler.core import node_lost
from gpufleet.reconciler.core.actions import Notify
from gpufleet.reconciler.core.model import NodeView, Remediation, ReplacementFailure, Step
from gpufleet.reconciler.core.phases import Phase

MAX_REPLACEMENTS = 3  # broken replacements one remediation gives up before it fails


def broken(view: NodeView | None, name: str, spec: FleetSpec, now: datetime | None = None) -> str | None:
    """Why the chosen replacement can no longer replace anything (None: it still can, or it is not seen:
    a replacement that left the cluster is not waited on past the resume timeout). A machine that stopped
    answering (core/node_lost.py) is one: a lent spare's borrowers would never leave it, nor a pod start there."""
    if view is None:
        return None
    if now is not None and node_lost.lost(view, spec, now):
        down = (now - view.not_ready_since).total_seconds() if view.not_ready_since else 0.0
        return f"{name} stopped answering (not Ready for {down:.0f}s)"
    if view.fault is not None and view.fault.needs.remediates:
        return f"{name} reported {describe(view.fault.xid, view.fault.kind)}"
    if view.role == labels.ROLE_QUARANTINED:
        return f"{name} was quarantined"
    return None


def give_up(r: Remediation, why: str, now: datetime) -> Step:
    """Note the broken replacement, page, and take another spare (Replacing), or fail after too many."""
    failure = ReplacementFailure(r.replacement or "", now, why)
    history = r.failed_replacements + (failure,)
    reason = f"{r.reason}; replacement {why} before {r.node}'s Slurm nodes were back"
    if len(history) >= MAX_REPLACEMENTS:
        reason += f"; {len(history)} replacements broke: not taking another"
        return Step(_page(r, failure, final=True),
                    r.moved(Phase.FAILED, now, reason=reason, failed_replacements=history, replacement=None,
                            waiting="", held_message="", held_reason=""))
    moved = r.moved(Phase.REPLACING, now) if r.phase is Phase.RESUMING else r
    return Step(_page(r, failure, final=False),
                replace(moved, reason=reason, failed_replacements=history, replacement=None, waiting=""), carry=True)


def _page(r: Remediation, f: ReplacementFailure, final: bool) -> tuple[Notify, ...]:
    if final:
        text = (f"{f.node}, standing in for {r.node} ({r.pool}), broke: {f.why}. It is the "
                f"{len(r.failed_replacements) + 1}th replacement of {r.node} to break, so gpufleet takes no other: "
                f"{r.node} stays contained and the pool runs {len(r.slurm_nodes)} Slurm node(s) short. "
                f"Action needed: look for what breaks the spares of pool {r.pool} (remediation {r.name}).")
        return (Notify("failed", "critical", text),)
    text = (f"{f.node}, the spare promoted for {r.node} ({r.pool}), broke before {r.node}'s Slurm nodes were back "
            f"({f.why}). gpufleet takes another spare now; {f.node} is quarantined by its own remediation. "
            "No action needed.")
    return (Notify("replacement-failed", "warning", text, key=f.node),)


def stand_ins(remediations: Iterable[Remediation], pool: str, window: timedelta, now: datetime) -> frozenset[str]:
    """Nodes of the pool that stand (or stood, and broke) in for a faulted node: the replacements of live
    remediations not yet succeeded, and those given up within the window."""
    out: set[str] = set()
    for r in remediations:
        if r.pool != pool:
            continue
        if r.active and r.replacement and r.phase in (Phase.REPLACING, Phase.RESUMING):
            out.add(r.replacement)
        out |= {f.node for f in r.failed_replacements if now - f.at <= window}
    return frozenset(out)


def stood_in_for(node: str, remediations: Iterable[Remediation], window: timedelta, now: datetime) -> str:
    """The remediation (name) whose replacement `node` was when it broke; "" when none."""
    for r in remediations:
        if r.node == node:
            continue
        if r.active and r.replacement == node and r.phase in (Phase.REPLACING, Phase.RESUMING):
            return r.name
        if any(f.node == node and now - f.at <= window for f in r.failed_replacements):
            return r.name
    return ""
