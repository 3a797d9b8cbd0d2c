"""Nodes Slurm drained itself: what each asks, as gpufleet's GPU condition. Pure: the nodes and their Slurm nodes in,
`MarkDegraded` actions out.

slurmctld and slurmd drain a node themselves when something on it failed (core/slurm_reasons.py: who set the
reason, and which texts are theirs). Left alone, such a node sits drained until a person looks. An on-call
engineer's answer, per reason (its row's `needs`, with the why in the row):
- reboot: "Kill task failed" (a process SIGKILL did not end, stuck in the kernel: slurm.conf(5)
  UnkillableStepTimeout) and "gres/gpu count reported lower than configured" (a GPU missing). The condition
  starts the heal every fault takes (containment, its job to a spare) and the repair loop then reboots the
  machine, health-checks it and returns it (core/repair.py);
- diagnose: a Prolog or Epilog error, a job environment that could not be set up, a registration that does not
  match the configuration. The condition starts a diagnosis (core/diagnosis.py): the node stays drained, is
  cordoned once idle, health-checked, and either returns to service with the drain lifted (verify before
  undrain, as CoreWeave's SUNK does) or is healed as the check says;
- gone ("Not responding", a reboot or resume that timed out): nothing here. Kubernetes' Ready condition says
  whether the machine is lost (core/node_lost.py).

Only an active node of a managed pool with no fault read and no live remediation of its own is marked; a spare
carries no NodeSet pod (and `spares.py` never promotes one Slurm drained); a person's drain is never Slurm's,
whatever its text (`drains.owner`). A diagnosis needs the health check of the repair loop: where the pool's is
off, such a node is left drained for a person, as before. `healing.slurm_drains: ignore` turns all of it off.

A storm: when a shared file system hangs, slurmd drains every node whose job touched it ("Kill task failed" on
each). Each node is marked (containment needs no gate: Slurm has drained them already), and the storm brake
(core/admission.py: `max_unhealthy_fraction` of a pool out at once) holds their replacements, reboots included,
with one page: the heals wait for a person instead of rebooting a pool at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Collection, Mapping

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message

from gpufleet.reconciler.core.actions import MarkDegraded
from gpufleet.reconciler.core.drains import drained_by_slurm
from gpufleet.reconciler.core.model import NodeView, SlurmNodeView
from gpufleet.reconciler.core.slurm_reasons import BY_CODE, CHECK, SlurmReason

ACT, IGNORE = "act", "ignore"  # healing.slurm_drains


@dataclass(frozen=True)
class Drained:
    """A Kubernetes node as `plan` needs it: its view and the Slurm nodes of its NodeSet pods."""

    view: NodeView
    slurm: tuple[SlurmNodeView, ...] = ()


def asked(s: SlurmNodeView) -> SlurmReason | None:
    """The row of Slurm's own drain of `s` that asks gpufleet to act (CHECK, with an action), or None."""
    row = drained_by_slurm(s)
    return row if row is not None and row.action == CHECK and row.needs is not None else None


def text(s: SlurmNodeView, row: SlurmReason) -> str:
    """The condition's text: `Slurm drained <node> itself: <its reason> [<user> at <time>]; ...`."""
    when = f" at {s.reason_at.isoformat(timespec='seconds')}" if s.reason_at else ""
    by = f" [{s.set_by.user if s.set_by else '?'}{when}]"
    assert row.needs is not None
    return (f"Slurm drained {s.name} itself: {s.reason}{by}; {row.means}; {row.needs.value}: {row.why} "
            f"(Slurm: {row.source})")


def headline(message: str) -> str:
    """`Slurm drained <node> itself: <its reason>`, from a condition's message `text` wrote ('' if not one)."""
    body = message.split("] ", 1)[1] if message.startswith("[") and "] " in message else message
    _, sep, rest = body.partition("Slurm drained ")
    return f"Slurm drained {rest.split(' [', 1)[0]}" if sep else ""


def mark(s: SlurmNodeView, row: SlurmReason, node: str) -> MarkDegraded:
    """gpufleet's GPU condition for Slurm's drain of `s` on Kubernetes node `node`: its header carries the row's
    action, its reason the row (`SlurmDrain<code>`), its text Slurm's reason, who set it and when."""
    return MarkDegraded(node, row.reason, format_message(FaultSignal(Kind.SLURM_DRAIN, row.code, row.needs),
                                                         text(s, row)))


def _checkable(v: NodeView, spec: FleetSpec) -> bool:
    """The node's pool runs the repair loop's health check, which a diagnosis needs (diagnosis.asked)."""
    return spec.healing.repair.enabled and spec.pool(v.pool or "").repair.enabled


def plan(nodes: Mapping[str, Drained], live: Collection[str], spec: FleetSpec, now: datetime) -> tuple[MarkDegraded, ...]:
    """The conditions to write: one per active node of a managed pool, with no fault and no live remediation
    (`live`: the nodes that have one), one of whose Slurm nodes Slurm drained itself with a reason that asks for
    an action (the gravest, if several). `now` is not read: a drain is acted on when it is seen (Slurm's own
    timeouts, UnkillableStepTimeout, SlurmdTimeout, are its debounce)."""
    del now
    if spec.healing.slurm_drains == IGNORE:
        return ()
    pools = {p.name for p in spec.pools}
    out = []
    for name in sorted(nodes):
        d = nodes[name]
        v = d.view
        if v.pool not in pools or v.role != labels.ROLE_ACTIVE or v.fault is not None or name in live:
            continue
        rows = [(s, row) for s in sorted(d.slurm, key=lambda s: s.name) if (row := asked(s)) is not None]
        rows = [(s, row) for s, row in rows if row.needs is not FaultAction.DIAGNOSE or _checkable(v, spec)]
        if not rows:
            continue
        s, row = max(rows, key=lambda p: p[1].needs.rank if p[1].needs else -1)
        out.append(mark(s, row, name))
    return tuple(out)


def row_of(code: int) -> SlurmReason | None:
    """The row a `SlurmDrain<code>` condition names."""
    return BY_CODE.get(code)
