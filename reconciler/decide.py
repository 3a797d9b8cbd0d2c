"""The pure core: from observations, records, policy and the time to actions. No I/O.

Two questions, asked on every pass (level-based, so a missed event heals itself):
- `detect`: which faulted nodes start a remediation now, and which are held by a gate
  (healing off, too many unhealthy in a pool, too many remediations at once, too many
  attempts on one node)?
- `plan_step`: for one live remediation, what is the next step?
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Iterable, Sequence

from fleetspec import FleetSpec, labels, xids

from .model import (
    Action, Cordon, DownSlurm, DrainSlurm, EvictPods, Gate, NewRemediation, NodeView, Notify, PromoteSpare,
    Quarantine, Record, RecordFacts, ReleaseJobs, RequestCapacity, RequeueJobs, ReturnToSpares, SignalJobs, Step,
    record_name,
)
from .phases import Phase

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})
RESUME_TIMEOUT = timedelta(minutes=10)
STORM_MIN_NODES = 2  # the brake needs at least this many unhealthy nodes in a pool


@dataclass(frozen=True)
class Detection:
    started: tuple[NewRemediation, ...] = ()
    gates: tuple[Gate, ...] = ()
    actions: tuple[Action, ...] = ()  # not tied to a record: return healed nodes to the spares


def slurm_reason(record: Record) -> str:
    return f"{labels.SLURM_REASON_PREFIX} {xids.describe(record.xid)} [{record.name}]"


def detect(
    nodes: Sequence[NodeView],
    records: Sequence[Record],
    spec: FleetSpec,
    now: datetime,
    signals: dict[str, tuple[datetime, ...]] | None = None,
) -> Detection:
    """Start remediations for critical faults that pass the gates.

    `signals` holds, per node, when its fault was signalled before (for `occurrences`);
    without it each signal counts once.
    """
    policy = spec.healing
    critical = set(policy.critical_xids)
    known = {r.name for r in records}
    live = {r.node: r for r in records if r.active}
    pools = {p.name: p for p in spec.pools}

    candidates: list[NodeView] = []
    for n in nodes:
        f = n.fault
        if f is None or f.xid not in critical or n.pool not in pools:
            continue
        if n.role not in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) or n.name in live:
            continue
        if record_name(n.name, f) in known:
            continue  # this very signal was handled already (a stale condition)
        seen = [t for t in (signals or {}).get(n.name, ()) if now - t <= timedelta(seconds=policy.occurrence_window_seconds)]
        if len(seen) + (0 if f.since in seen else 1) < policy.occurrences:
            continue
        candidates.append(n)
    candidates.sort(key=lambda n: (n.fault.since, n.name))  # type: ignore[union-attr]

    actions: list[Action] = [
        ReturnToSpares(n.name)
        for n in nodes
        if n.role == labels.ROLE_QUARANTINED and n.health_check_passed and n.name not in live and n.fault is None
    ]
    if not candidates:
        return Detection(actions=tuple(actions))
    if not policy.enabled:
        return Detection(
            gates=(Gate("HealingDisabled", None, "healing is disabled in the spec", tuple(n.name for n in candidates)),),
            actions=tuple(actions),
        )

    started: list[NewRemediation] = []
    gates: list[Gate] = []

    # Attempts cap: a node that keeps failing is not remediated in a loop.
    window = timedelta(seconds=policy.attempts_window_seconds)
    remaining: list[NodeView] = []
    for n in candidates:
        attempts = [r for r in records if r.node == n.name and now - r.created <= window and r.phase is not Phase.ESCALATED]
        if len(attempts) >= policy.max_attempts_per_node:
            reason = (
                f"{len(attempts)} remediations of {n.name} within {policy.attempts_window_seconds}s "
                f"(max {policy.max_attempts_per_node}): quarantined for a human"
            )
            started.append(NewRemediation(
                _new_record(n, now, Phase.ESCALATED, reason=reason),
                (Cordon(n.name, reason), Quarantine(n.name, n.fault.xid),  # type: ignore[union-attr]
                 Notify("escalated", "critical", reason)),
            ))
        else:
            remaining.append(n)

    # Storm brake: per pool, when too much of it is unhealthy at once, replace nothing there.
    storm_window = timedelta(seconds=policy.unhealthy_window_seconds)
    braked: set[str] = set()
    for pool in sorted({n.pool for n in remaining if n.pool}):
        size = pools[pool].nodes
        unhealthy = {
            n.name for n in nodes
            if n.pool == pool and n.is_active and n.fault and n.fault.xid in critical and now - n.fault.since <= storm_window
        } | {r.node for r in records if r.pool == pool and r.active and not r.was_spare and now - r.created <= storm_window}
        # One failure is never a storm: without this, a small pool could never heal at all.
        if size and len(unhealthy) >= STORM_MIN_NODES and len(unhealthy) / size > policy.max_unhealthy_fraction:
            braked.add(pool)
            held = tuple(sorted(n.name for n in remaining if n.pool == pool))
            gates.append(Gate(
                "TooManyUnhealthy", pool,
                f"{len(unhealthy)} of {size} nodes in pool {pool} unhealthy within {policy.unhealthy_window_seconds}s "
                f"(> {policy.max_unhealthy_fraction:.0%}): replacing nothing, paging a human",
                held,
            ))
    remaining = [n for n in remaining if n.pool not in braked]

    # Concurrency: at most max_concurrent remediations move at once. Faulted spares are cheap
    # (quarantine and refill) and never wait.
    in_flight = sum(1 for r in records if r.phase.holds_capacity and not r.was_spare)
    room = max(0, policy.max_concurrent - in_flight)
    held: list[str] = []
    for n in remaining:
        if n.is_spare:
            started.append(NewRemediation(_new_record(n, now, Phase.DETECTED)))
        elif room > 0:
            started.append(NewRemediation(_new_record(n, now, Phase.DETECTED)))
            room -= 1
        else:
            held.append(n.name)
    if held:
        gates.append(Gate(
            "MaxConcurrent", None,
            f"{in_flight + len(started)} remediations in progress (max {policy.max_concurrent}); {len(held)} waiting",
            tuple(held),
        ))
    return Detection(started=tuple(started), gates=tuple(gates), actions=tuple(actions))


def _new_record(n: NodeView, now: datetime, phase: Phase, reason: str = "") -> Record:
    f = n.fault
    assert f is not None and n.pool is not None
    return Record(
        name=record_name(n.name, f), node=n.name, pool=n.pool, xid=f.xid, message=f.message, phase=phase,
        created=now, phase_times=((phase.value, now),), reason=reason or f"{xids.describe(f.xid)}: {f.message}",
        was_spare=n.is_spare,
    )


def _notify(record: Record, event: str, severity: str, text: str) -> tuple[tuple[Action, ...], tuple[str, ...]]:
    """A notification sent once per record and event, however often the step is retried."""
    if event in record.notified:
        return (), record.notified
    return (Notify(event, severity, text),), record.notified + (event,)


def plan_step(record: Record, facts: RecordFacts, spec: FleetSpec, now: datetime) -> Step:
    """The next step of one live remediation. Pure: the runtime runs the actions, then
    persists the returned record; if it dies in between, the same step is planned again,
    so every action is idempotent."""
    policy = spec.healing
    node, phase = record.node, record.phase

    if phase is Phase.DETECTED:
        if record.was_spare:
            note, notified = _notify(record, "spare-quarantined", "warning",
                                     f"spare {node} reported {xids.describe(record.xid)}: quarantined, refill requested")
            return Step(
                note + (Cordon(node, slurm_reason(record)), Quarantine(node, record.xid),
                        RequestCapacity(record.pool, f"spare {node} quarantined")),
                record.moved(Phase.REPLACING, now, notified=notified),
            )
        note, notified = _notify(record, "detected", "warning",
                                 f"{node} ({record.pool}): {xids.describe(record.xid)} - {record.message}. "
                                 "gpufleet is draining and replacing it; no action needed.")
        return Step(note + (Cordon(node, slurm_reason(record)),), record.moved(Phase.SLURM_DRAINING, now, notified=notified))

    if phase is Phase.SLURM_DRAINING:
        jobs = tuple(sorted(j.job_id for j in facts.jobs_on_node if j.state in RUNNING_STATES))
        actions: tuple[Action, ...] = (DrainSlurm(node, slurm_reason(record)),)
        if jobs and policy.grace_period_seconds > 0:
            actions += (SignalJobs(jobs, "TERM"),)
        deadline = now + timedelta(seconds=policy.grace_period_seconds)
        return Step(actions, record.moved(Phase.CHECKPOINTING, now, jobs=jobs, grace_deadline=deadline))

    if phase is Phase.CHECKPOINTING:
        still = [j for j in facts.jobs_on_node if j.state in RUNNING_STATES]
        deadline = record.grace_deadline or now
        if still and now < deadline:
            return Step(recheck_after=min(2.0, (deadline - now).total_seconds()))
        jobs = tuple(sorted(set(record.jobs) | {j.job_id for j in still}))
        actions = ((RequeueJobs(jobs),) if jobs else ()) + (DownSlurm(node, slurm_reason(record)),)
        return Step(actions, record.moved(Phase.REQUEUED, now, jobs=jobs))

    if phase is Phase.REQUEUED:
        if facts.opted_out_pods:
            why = (f"pods {list(facts.opted_out_pods)} carry the opt-out label {policy.opt_out_label}: "
                   f"{node} stays cordoned and down in Slurm; nothing is replaced")
            note, notified = _notify(record, "opted-out", "warning", f"{node}: {why}. A person decides what happens next.")
            return Step(note, record.moved(Phase.OPTED_OUT, now, reason=why, notified=notified))
        drain_deadline = now + timedelta(seconds=policy.drain_timeout_seconds)
        return Step((EvictPods(node),), record.moved(Phase.EVICTING, now, drain_deadline=drain_deadline))

    if phase is Phase.EVICTING:
        if facts.pods_left and now < (record.drain_deadline or now):
            return Step((EvictPods(node),), recheck_after=2.0)
        reason = record.reason
        if facts.pods_left:
            reason += f"; drain timed out after {policy.drain_timeout_seconds}s with pods left: {list(facts.pods_left)}"
        return Step((), record.moved(Phase.REPLACING, now, reason=reason))

    if phase is Phase.REPLACING:
        if record.was_spare:
            return Step((), record.moved(Phase.SUCCEEDED, now))
        if record.replacement:
            return Step(
                (PromoteSpare(record.replacement, node), Quarantine(node, record.xid),
                 RequestCapacity(record.pool, f"refill the spare used for {node}")),
                record.moved(Phase.RESUMING, now),
            )
        if facts.spares:
            # Write the choice down before acting on it, so a restart promotes the same spare.
            return Step((), replace(record, replacement=facts.spares[0]), recheck_after=0)
        note, notified = _notify(record, "no-spare", "critical",
                                 f"no spare left in pool {record.pool} for {node}: it stays drained; capacity requested")
        return Step(note + (RequestCapacity(record.pool, f"no spare for {node}"),),
                    record.moved(Phase.WAITING_FOR_SPARE, now, notified=notified))

    if phase is Phase.WAITING_FOR_SPARE:
        if facts.spares:
            return Step((), record.moved(Phase.REPLACING, now))
        return Step(recheck_after=10.0)

    if phase is Phase.RESUMING:
        if facts.replacement_ready:
            took = (now - record.created).total_seconds()
            note, notified = _notify(record, "succeeded", "info",
                                     f"{node} replaced by {record.replacement} in {took:.0f}s; requeued jobs {list(record.jobs)} released")
            return Step(((ReleaseJobs(record.jobs),) if record.jobs else ()) + note,
                        record.moved(Phase.SUCCEEDED, now, notified=notified))
        if now - (record.entered(Phase.RESUMING) or now) > RESUME_TIMEOUT:
            return fail(record, f"replacement {record.replacement} not Ready within {RESUME_TIMEOUT}", now)
        return Step(recheck_after=1.0)

    return Step()  # OptedOut and terminal phases: nothing to do


def fail(record: Record, reason: str, now: datetime) -> Step:
    """End a remediation that cannot finish, and tell the user why."""
    note, notified = _notify(record, "failed", "critical", f"remediation {record.name} of {record.node} failed: {reason}")
    return Step(note, record.moved(Phase.FAILED, now, reason=reason, notified=notified))


def active_records(records: Iterable[Record]) -> list[Record]:
    return sorted((r for r in records if r.active), key=lambda r: (r.created, r.name))
