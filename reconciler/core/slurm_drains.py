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
from datetime import datetime, timedelta
from typing import Collection, Mapping, Sequence

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message

from gpufleet.reconciler.core.actions import Action, MarkDegraded, Notify, PageOnce
from gpufleet.reconciler.core.diagnosis_stages import Stage
from gpufleet.reconciler.core.drains import drained_by_slurm
from gpufleet.reconciler.core.model import NodeView, Remediation, SlurmNodeView
from gpufleet.reconciler.core.slurm_reasons import CHECK, SlurmReason

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


def plan(nodes: Mapping[str, Drained], records: Sequence[Remediation], spec: FleetSpec, now: datetime,
         unreadable: Collection[str] = ()) -> tuple[Action, ...]:
    """The conditions to write: one per active node of a managed pool, with no fault and no live remediation
    (`records`: every remediation; `unreadable`: nodes whose record cannot be read, left alone), one of whose Slurm
    nodes Slurm drained itself with a reason that asks for an action (the gravest, if several). A drain is acted on
    when it is seen: Slurm's own timeouts (UnkillableStepTimeout, SlurmdTimeout) are its debounce.

    A drain that asks for a check and comes back after a check of the same node passed (`returned`) is not
    checked again: a health check does not mend it (a configuration that does not match the machine, a Prolog that
    fails every job). It stays drained and one page asks a person, once per drain: the drain is noted on the node
    before the page (`again`), so a restart or a new leader does not page it again. A reboot that comes back is the
    attempt cap's (core/admission.py: `max_attempts_per_node`)."""
    if spec.healing.slurm_drains == IGNORE:
        return ()
    pools = {p.name for p in spec.pools}
    live = {r.node for r in records if r.active or (r.repair is not None and r.repair.active)} | set(unreadable)
    out: list[Action] = []
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
        passed = returned(name, s, row, records, spec, now)
        if passed is None:
            out.append(mark(s, row, name))
        elif (page := again(v, s, row, passed)) is not None:
            out.append(page)
    return tuple(out)


def returned(node: str, s: SlurmNodeView, row: SlurmReason, records: Sequence[Remediation], spec: FleetSpec,
             now: datetime) -> Remediation | None:
    """The diagnosis of `node` for the same reason that passed within `healing.attempts_window_seconds`, before
    Slurm set this drain (or Slurm did not say when), if any."""
    if row.needs is not FaultAction.DIAGNOSE:
        return None
    window = timedelta(seconds=spec.healing.attempts_window_seconds)
    for r in sorted(records, key=lambda r: r.created, reverse=True):
        d = r.diagnosis
        ended = d.entered(Stage.PASSED) if d is not None else None
        if (r.node == node and r.kind is Kind.SLURM_DRAIN and r.xid == row.code and ended is not None
                and now - ended <= window and (s.reason_at is None or s.reason_at >= ended)):
            return r
    return None


def again(v: NodeView, s: SlurmNodeView, row: SlurmReason, passed: Remediation) -> PageOnce | None:
    """The page for a drain that came back after its check passed (the node stays drained for a person), once per
    drain; None when the node notes that drain paged already."""
    key = f"{s.name}:{row.code}:{int(s.reason_at.timestamp()) if s.reason_at else 0}"
    if v.slurm_drain_paged == key:
        return None
    d = passed.diagnosis
    ended = d.entered(Stage.PASSED) if d is not None else None
    when = ended.isoformat(timespec="seconds") if ended else "?"
    text = (f"{v.name} ({v.pool}): Slurm drained {s.name} itself again: {s.reason!r}, after its health check passed "
            f"({passed.name}, {when}). A check does not mend it ({row.means}): it stays drained for a person. Fix the "
            f"cause, then `scontrol update NodeName={s.name} State=RESUME`.")
    return PageOnce(v.name, key, Notify("slurm-drain-again", "warning", text))
