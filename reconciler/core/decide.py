"""The pure core: from observations, records, policy and the time to actions. No I/O.

Per node, as the work queue hands it over (level-based: the same answer for the same facts, so a
missed event or a restart heals itself):
- `detect`: does this node's fault start a remediation now (or return a healed node to the spares)?
- `plan_step`: for its live remediation, what is the one next step? Containment (cordon, drain in
  Slurm, checkpoint, requeue) is never gated; admission (attempt cap, storm brake, max_concurrent)
  decides only whether the node is replaced.
- `retry`: a step failed for a reason that may pass: when to try again, or give up (a time budget).

Which steps carry (are written together with the next one, see `Step.carry`): a step whose loss,
replayed from any earlier write or from no record at all, runs only idempotent actions again and ends
in the same place. The cordon, a drain in Slurm with no job on the node, admission to eviction, the
end of an eviction, a promotion and a wait for a spare carry. These do not: a drain that finds jobs
(once requeued they are off the node, and only the record remembers them), the end of containment
(Requeued: what admission counts across nodes), the choice of a spare (a restart must promote the same
one), a fault on a spare (its quarantine hides the node from `detect`), a reclaim's start, every hold,
escalation and end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Iterable, Sequence

from fleetspec import FleetSpec, labels, xids
from fleetspec.models import LendingSpec, NodePool

from reconciler.core.model import (
    Action, Admission, CarryDrain, Cordon, DeletePods, DrainSlurm, EndLoan, EvictBorrowers, EvictPods, Gate, NodeView,
    Notify, PromoteSpare,
    Quarantine, Record, RecordFacts, ReleaseJobs, RequestCapacity, RequeueJobs, ResumeSlurm, ReturnToSpares, SignalJobs,
    SlurmNodeView, StartReclaim, Step, record_name,
)
from reconciler.core.phases import Phase

# Jobs that hold the node (the grace period waits for them; a requeue kills what is left) ...
ON_NODE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING"})
# ... and of those, the ones a signal can still reach (a completing job is already ending).
SIGNALLABLE_STATES = ON_NODE_STATES - {"COMPLETING"}
RESUME_TIMEOUT = timedelta(minutes=10)
STORM_MIN_NODES = 2  # the brake needs at least this many unhealthy nodes in a pool
HELD_RECHECK = 5.0  # seconds between admission checks of a held remediation (capacity frees wake it sooner)
MAX_BACKOFF = 30.0


# --- Slurm reasons: who owns a drain ------------------------------------------------------------

def slurm_reason(record: Record) -> str:
    return f"{labels.SLURM_REASON_PREFIX} {xids.describe(record.xid)} [{record.name}]"


def drained_by_gpufleet(n: SlurmNodeView) -> bool:
    return (n.drained or n.down) and n.reason.startswith(labels.SLURM_REASON_PREFIX)


def drained_by_operator(n: SlurmNodeView) -> bool:
    return (n.drained or n.down) and n.reason.startswith(labels.SLINKY_REASON_PREFIX)


def drained_for_lending(n: SlurmNodeView) -> bool:
    """An idle node gpufleet drained to lend it (reconciler/core/lending.py)."""
    return (n.drained or n.down) and n.reason.startswith(labels.SLURM_LENDING_PREFIX)


def drained_by_person(n: SlurmNodeView) -> bool:
    """A drain that is neither gpufleet's nor Slinky's: a person's. It survives everything gpufleet does."""
    return n.drained and not (drained_by_gpufleet(n) or drained_by_operator(n) or drained_for_lending(n))


# --- detection ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Detection:
    record: Record | None = None  # a new remediation to create
    gate: Gate | None = None  # why nothing starts (healing disabled)
    actions: tuple[Action, ...] = ()  # not tied to a record: return a healed node to the spares


def detect(node: NodeView, records: Sequence[Record], spec: FleetSpec, now: datetime,
           signals: Sequence[datetime] = ()) -> Detection:
    """Whether `node` starts a remediation now. `records` are the node's own (any phase);
    `signals` are when its fault was signalled before (for `occurrences`)."""
    policy = spec.healing
    live = [r for r in records if r.active]
    if (node.role == labels.ROLE_QUARANTINED and node.health_check_passed and not live and node.fault is None
            and node.pool in {p.name for p in spec.pools} and not node.carried_drain):
        return Detection(actions=(ReturnToSpares(node.name),))
    f = node.fault
    if f is None or f.xid not in set(policy.critical_xids) or node.pool not in {p.name for p in spec.pools}:
        return Detection()
    if node.role not in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) or live:
        return Detection()
    if record_name(node.name, f) in {r.name for r in records}:
        return Detection()  # this very signal was handled already (a stale condition)
    window = timedelta(seconds=policy.occurrence_window_seconds)
    seen = [t for t in signals if now - t <= window]
    if len(seen) + (0 if f.since in seen else 1) < policy.occurrences:
        return Detection()
    if not policy.enabled:
        return Detection(gate=Gate("HealingDisabled", node.pool, f"{node.name}: healing is disabled in the spec"))
    return Detection(record=Record(
        name=record_name(node.name, f), node=node.name, pool=node.pool or "", xid=f.xid, message=f.message,
        phase=Phase.DETECTED, created=now, phase_times=((Phase.DETECTED.value, now),),
        reason=f"{xids.describe(f.xid)}: {f.message}", was_spare=node.is_spare,
    ))


def admission_facts(record: Record, pool_nodes: Iterable[NodeView], records: Iterable[Record],
                    spec: FleetSpec, now: datetime) -> Admission:
    """Count what admission weighs. Unhealthy: the pool's nodes remediated within the window (any
    outcome: a finished remediation still counts until the window passes; a node a person holds by
    opting out does not) and its active nodes faulted within it that have no record yet."""
    policy = spec.healing
    records = list(records)
    storm = timedelta(seconds=policy.unhealthy_window_seconds)
    critical = set(policy.critical_xids)
    unhealthy = {r.node for r in records if r.pool == record.pool and not r.was_spare
                 and r.phase is not Phase.OPTED_OUT and now - r.created <= storm}
    opted_out = {r.node for r in records if r.phase is Phase.OPTED_OUT}
    unhealthy |= {n.name for n in pool_nodes if n.is_active and n.fault and n.fault.xid in critical
                  and now - n.fault.since <= storm and n.name not in opted_out}
    attempts = timedelta(seconds=policy.attempts_window_seconds)
    return Admission(
        pool_size=spec.pool(record.pool).nodes,
        unhealthy=frozenset(unhealthy),
        in_flight=sum(1 for r in records if r.phase.holds_capacity and not r.was_spare and r.name != record.name),
        attempts=sum(1 for r in records if r.node == record.node and r.name != record.name
                     and now - r.created <= attempts and r.phase is not Phase.ESCALATED),
    )


def _gate(record: Record, a: Admission, spec: FleetSpec) -> Gate | None:
    policy = spec.healing
    n, size = len(a.unhealthy), a.pool_size
    # One failure is never a storm: without this, a small pool could never heal at all.
    if size and n >= STORM_MIN_NODES and n / size > policy.max_unhealthy_fraction:
        return Gate("TooManyUnhealthy", record.pool,
                    f"{n} of {size} nodes in pool {record.pool} unhealthy within {policy.unhealthy_window_seconds}s "
                    f"(> {policy.max_unhealthy_fraction:.0%}): faulted nodes are contained (cordoned, drained in "
                    "Slurm), none is replaced until a human looks")
    if a.in_flight >= policy.max_concurrent:
        return Gate("MaxConcurrent", None,
                    f"{a.in_flight} replacements in progress (max {policy.max_concurrent}): {record.node} is "
                    "contained and waits its turn")
    return None


# --- one step of one remediation -----------------------------------------------------------------

def _once(record: Record, *actions: Action) -> tuple[Action, ...]:
    """Drop once-only actions the record has begun already (a retried step never repeats them)."""
    return tuple(a for a in actions if a.once is None or a.once not in record.intents)


def _slurm(facts: RecordFacts) -> dict[str, SlurmNodeView]:
    return {n.name: n for n in facts.slurm}


def plan_step(record: Record, facts: RecordFacts, spec: FleetSpec, now: datetime) -> Step:
    """The next step of one live remediation. Pure: the runtime runs the idempotent actions, persists
    the returned record with the once-only actions noted as begun, then runs those; if it dies in
    between, the same step is planned again: idempotent actions repeat harmlessly, once-only ones are
    skipped. A step marked `carry` may be written with the next one (the module's docstring says which)."""
    policy = spec.healing
    node, phase = record.node, record.phase
    slurm = _slurm(facts)

    if phase is Phase.DETECTED:
        # Containment needs nothing from Slurm: the cordon goes first, whatever Slurm's state.
        names = record.slurm_nodes or facts.slurm_names
        if record.was_spare:
            refill = (RequestCapacity(record.pool, f"spare {node} quarantined", f"{record.name}/refill")
                      if facts.can_refill else
                      Notify("refill-blocked", "warning", f"pool {record.pool} has no room for a new spare (provider limit)"))
            return Step(
                _once(record, Notify("spare-quarantined", "warning",
                                     f"spare {node} reported {xids.describe(record.xid)}: quarantined, refill requested"))
                + (Cordon(node, slurm_reason(record)), EvictPods(node), Quarantine(node, record.xid))
                + _once(record, refill),
                record.moved(Phase.REPLACING, now, slurm_nodes=names),
            )
        return Step(
            _once(record, Notify("detected", "warning",
                                 f"{node} ({record.pool}): {xids.describe(record.xid)} - {record.message}. "
                                 "gpufleet is draining and replacing it; no action needed."))
            + (Cordon(node, slurm_reason(record)),),
            record.moved(Phase.SLURM_DRAINING, now, slurm_nodes=names), carry=True,
        )

    if phase is Phase.SLURM_DRAINING:
        # A node a person drained stays as the person left it (drained, their reason), for good.
        kept = tuple(n for n in record.slurm_nodes if n in slurm and drained_by_person(slurm[n]))
        drains = tuple(
            DrainSlurm(n, slurm_reason(record)) for n in record.slurm_nodes
            if n not in kept and not (n in slurm and (drained_by_gpufleet(slurm[n]) or drained_by_operator(slurm[n])))
        )
        jobs = tuple(sorted(j.job_id for j in facts.jobs_on_node if j.state in ON_NODE_STATES))
        signal = tuple(sorted(j.job_id for j in facts.jobs_on_node if j.state in SIGNALLABLE_STATES))
        actions: tuple[Action, ...] = drains
        if signal and policy.grace_period_seconds > 0:
            actions += _once(record, SignalJobs(signal, "TERM"))
        actions += carry_person_drains(record, kept, slurm)
        deadline = now + timedelta(seconds=policy.grace_period_seconds)
        # With jobs, the record is what remembers them once they are requeued off the node: written first.
        return Step(actions, record.moved(Phase.CHECKPOINTING, now, jobs=jobs, grace_deadline=deadline,
                                          kept_drains=kept), carry=not jobs)

    if phase is Phase.CHECKPOINTING:
        still = [j for j in facts.jobs_on_node if j.state in ON_NODE_STATES]
        deadline = record.grace_deadline or now
        if still and now < deadline:
            return Step(recheck_after=min(1.0, (deadline - now).total_seconds()))
        jobs = tuple(sorted(set(record.jobs) | {j.job_id for j in still}))
        return Step((RequeueJobs(jobs),) if jobs else (), record.moved(Phase.REQUEUED, now, jobs=jobs))

    if phase in (Phase.REQUEUED, Phase.HELD):
        return _admit(record, facts, spec, now)

    if phase is Phase.EVICTING:
        if facts.pods_left and now < (record.drain_deadline or now):
            return Step((EvictPods(node),), recheck_after=2.0)
        return end_eviction(record, facts, spec, now)

    if phase is Phase.REPLACING:
        if record.was_spare:
            return Step((), record.moved(Phase.SUCCEEDED, now))
        lent = record.replacement in facts.lent_spares
        if record.replacement and ((lent and record.reclaim_started is None) or facts.replacement_borrowers):
            return _reclaim_replacement(record, facts, spec, now)
        if record.replacement:
            refill = (RequestCapacity(record.pool, f"refill the spare used for {node}", f"{record.name}/refill")
                      if facts.can_refill else
                      Notify("refill-blocked", "warning",
                             f"pool {record.pool}: {record.replacement} replaces {node}, but the provider has no room "
                             "for a new spare"))
            reason = record.reason
            if record.reclaim_started:
                took = (now - record.reclaim_started).total_seconds()
                reason += f"; waited {took:.0f}s for the borrowers on {record.replacement} to leave"
            end_loan = (EndLoan(record.replacement, back_to_spare=False),) if lent or record.reclaim_started else ()
            return Step(
                end_loan + (PromoteSpare(record.replacement, node), Quarantine(node, record.xid)) + _once(record, refill),
                record.moved(Phase.RESUMING, now, reason=reason), carry=True,
            )
        eligible = eligible_spares(facts)
        if eligible:
            # Write the choice down before acting on it, so a restart promotes the same spare.
            return Step((), replace(record, replacement=eligible[0]), recheck_after=0)
        ask = (RequestCapacity(record.pool, f"no spare for {node}", f"{record.name}/no-spare"),) if facts.can_refill else ()
        return Step(
            _once(record, Notify("no-spare", "critical",
                                 f"no spare left in pool {record.pool} for {node}: it stays contained; capacity requested"),
                  *ask),
            record.moved(Phase.WAITING_FOR_SPARE, now), carry=True,
        )

    if phase is Phase.WAITING_FOR_SPARE:
        if eligible_spares(facts):
            return Step((), record.moved(Phase.REPLACING, now), carry=True)
        return Step(recheck_after=10.0)

    if phase is Phase.RESUMING:
        if facts.replacement is not None and facts.replacement.on_loan:
            # Lent between its choice and its promotion (a race with a lending pass): end that loan first.
            return Step((EndLoan(facts.replacement.name, back_to_spare=False),), recheck_after=0.5)
        resumes = tuple(ResumeSlurm(n) for n in resume_candidates(record, facts))
        if resumes:
            return Step(resumes, recheck_after=0.5)
        if replacement_ready(record, facts):
            took = (now - record.created).total_seconds()
            return Step(
                ((ReleaseJobs(record.jobs),) if record.jobs else ())
                + _once(record, Notify("succeeded", "info",
                                       f"{node} replaced by {record.replacement} in {took:.0f}s; requeued jobs "
                                       f"{list(record.jobs)} released")),
                record.moved(Phase.SUCCEEDED, now),
            )
        if now - (record.entered(Phase.RESUMING) or now) > RESUME_TIMEOUT:
            return fail(record, f"replacement {record.replacement} not taking jobs within {RESUME_TIMEOUT}", now)
        return Step(recheck_after=1.0)

    return Step()  # OptedOut and terminal phases: nothing to do


def _admit(record: Record, facts: RecordFacts, spec: FleetSpec, now: datetime) -> Step:
    """Admission: the node is contained; is it replaced now, held, escalated, or left to a person?"""
    policy = spec.healing
    node = record.node
    if facts.opted_out_pods:
        why = (f"pods {list(facts.opted_out_pods)} carry the opt-out label {policy.opt_out_label}: "
               f"{node} stays cordoned and drained in Slurm; nothing is replaced")
        return Step(_once(record, Notify("opted-out", "warning", f"{node}: {why}. A person decides what happens next.")),
                    record.moved(Phase.OPTED_OUT, now, reason=why, held="", held_reason=""))
    a = facts.admission
    assert a is not None, "admission facts are gathered for Requeued and Held"
    hold_until = record.created + timedelta(seconds=policy.admission_hold_seconds)
    if record.phase is Phase.REQUEUED and now < hold_until:
        # A burst arrives over seconds: weighed one fault at a time, its first faults would pass the brake
        # before the rest were seen. Nothing is written: the wait is the record's age, so a restart keeps it.
        return Step(recheck_after=(hold_until - now).total_seconds())
    if a.attempts >= policy.max_attempts_per_node:
        why = (f"{a.attempts + 1} remediations of {node} within {policy.attempts_window_seconds}s "
               f"(max {policy.max_attempts_per_node}): contained and quarantined for a human")
        return Step((Quarantine(node, record.xid),) + _once(record, Notify("escalated", "critical", why)),
                    record.moved(Phase.ESCALATED, now, reason=why, held="", held_reason=""))
    gate = _gate(record, a, spec)
    if gate is not None:
        if record.phase is Phase.HELD:
            if record.held == gate.message:
                return Step(recheck_after=HELD_RECHECK, gate=gate)
            return Step((), replace(record, held=gate.message, held_reason=gate.reason), recheck_after=HELD_RECHECK,
                        gate=gate)
        return Step((), record.moved(Phase.HELD, now, held=gate.message, held_reason=gate.reason),
                    recheck_after=HELD_RECHECK, gate=gate)
    deadline = now + timedelta(seconds=policy.drain_timeout_seconds)
    return Step((EvictPods(node),), record.moved(Phase.EVICTING, now, drain_deadline=deadline, held="", held_reason=""),
                carry=True)


def eligible_spares(facts: RecordFacts) -> tuple[str, ...]:
    """Spares that may replace a node, unlent ones first (a lent spare heals only when nothing else is
    free: its borrowers must leave first); never one whose Slurm node a person drained."""
    on_spare = dict(facts.spare_slurm)
    lent = set(facts.lent_spares)
    ok = [s for s in facts.spares if not any(drained_by_person(n) for n in on_spare.get(s, ()))]
    return tuple(sorted(ok, key=lambda s: (s in lent, s)))


def evict_borrowers(node: str, since: datetime, pool: NodePool, now: datetime) -> EvictBorrowers:
    """The borrowers of a node being taken back since `since`: evicted with the pool's reclaim grace (the
    spec's default when the pool lends no more), deleted once it has passed. Healing and lending alike."""
    lending = pool.lending
    grace = lending.reclaim_grace_seconds if lending else LendingSpec.model_fields["reclaim_grace_seconds"].default
    return EvictBorrowers(node, grace, force=now >= since + timedelta(seconds=grace))


def _reclaim_replacement(record: Record, facts: RecordFacts, spec: FleetSpec, now: datetime) -> Step:
    """The chosen spare is on loan: take it back (within the pool's reclaim grace, then by force) before it
    is promoted. The record notes when this began, so the delay shows in it and survives a restart."""
    spare = record.replacement or ""
    if record.reclaim_started is None:
        return Step((StartReclaim(spare, f"a fault on {record.node} needs it"),),
                    replace(record, reclaim_started=now), recheck_after=0)
    evict = evict_borrowers(spare, record.reclaim_started, spec.pool(record.pool), now)
    step = Step((evict,), recheck_after=0.5)
    note = f"; the borrowers on {spare} outlasted the {evict.grace_seconds}s reclaim grace and were deleted"
    if evict.force and note not in record.reason:
        return replace(step, record=replace(record, reason=record.reason + note))
    return step


def resume_candidates(record: Record, facts: RecordFacts) -> tuple[str, ...]:
    """Slurm nodes gpufleet drained that now run on healthy hardware: the replacement's, and the
    record's own once their pods have moved off the faulted node. A person's drain is never undone;
    the operator's drains are the operator's to undo."""
    slurm = _slurm(facts)
    names = set(facts.replacement_slurm) | set(facts.slurm_moved)
    out = []
    for name in sorted(names):
        n = slurm.get(name)
        if n is not None and drained_by_gpufleet(n) and name not in record.kept_drains:
            out.append(name)
    return tuple(out)


def replacement_ready(record: Record, facts: RecordFacts) -> bool:
    """The replacement is a schedulable, Ready node without the spare taint; and when the faulted node
    ran Slurm, a Slurm node now runs on the replacement and takes jobs."""
    r = facts.replacement
    if r is None or not r.ready or r.unschedulable or labels.SPARE_TAINT in r.taints or labels.LENDING_TAINT in r.taints:
        return False
    if not record.slurm_nodes:
        return True
    slurm = _slurm(facts)
    # A person's drain went with the faulted machine (`carry_person_drains`): every Slurm node that moved takes jobs.
    return bool(facts.replacement_slurm) and all(n in slurm and slurm[n].takes_jobs for n in facts.replacement_slurm)


def carry_person_drains(record: Record, kept: tuple[str, ...], slurm: dict[str, SlurmNodeView]) -> tuple[Action, ...]:
    """A person's drain on a faulted node's Slurm node goes with the faulted machine, and is reported.

    It cannot stay on the Slurm node: with slurm-operator 1.2.1 the NodeSet pod's preStop sets the node
    DOWN with its own reason (workerbuilder/worker_app.go), and when the pod comes up on the replacement
    the operator sets the node IDLE (nodeset/slurmcontrol UpdateNodeWithPodInfo), which clears DRAIN
    (Slurm 26.05 node_mgr.c update_node); Slurm schedules on that very update (proc_req.c
    _slurm_rpc_update_node -> queue_job_scheduler), so a drain set again after it would come too late for
    a waiting job. What a person drains a node for is the machine it ran on, the one that just faulted:
    the drain is noted on that machine (annotation labels.CARRIED_DRAIN), which stays quarantined until
    a person removes it (`detect` never returns it to the spares), and the person is told."""
    drains = tuple((n, slurm[n].reason) for n in kept if n in slurm)
    if not drains:
        return ()
    said = "; ".join(f"{n}: {reason!r}" for n, reason in drains)
    return (CarryDrain(record.node, drains),) + _once(record, Notify(
        "person-drain-carried", "warning",
        f"{record.node} faulted while a person had drained its Slurm node(s) ({said}). The drain is carried to "
        f"{record.node} (annotation {labels.CARRIED_DRAIN}), which stays quarantined until a person removes it; "
        "the Slurm node moves to a spare and takes jobs there."))


def end_eviction(record: Record, facts: RecordFacts, spec: FleetSpec, now: datetime) -> Step:
    """Eviction is over: nothing left, or the drain timeout passed. NodeSet pods still there then are the
    ones slurm-operator's PodDisruptionBudget protects (label nodeset.slinky.slurm.net/pod-protect while
    their Slurm node was busy: workerbuilder/worker_pdb.go, relabelled at its next NodeSet sync, at most
    30 s apart: nodeset_sync.go): when no job runs on the record's Slurm nodes (requeued), the label is
    stale and they are deleted, so the Slurm node still moves. The time it took is the Evicting phase's."""
    policy = spec.healing
    reason = record.reason
    actions: tuple[Action, ...] = ()
    stale = facts.nodeset_pods_left if not any(j.state in ON_NODE_STATES for j in facts.jobs_on_node) else ()
    if stale:
        actions = (DeletePods(tuple(stale)),)
        reason += (f"; NodeSet pod(s) {list(stale)} still refused eviction after {policy.drain_timeout_seconds}s "
                   "(slurm-operator's PodDisruptionBudget) with no job left on their Slurm nodes: deleted")
    rest = [p for p in facts.pods_left if p not in stale]
    if rest:
        reason += f"; drain timed out after {policy.drain_timeout_seconds}s with pods left: {rest}"
    return Step(actions, record.moved(Phase.REPLACING, now, reason=reason), carry=not actions)


# --- failures -------------------------------------------------------------------------------------

def retry(record: Record, error: str, spec: FleetSpec, now: datetime) -> Step:
    """A step failed for a reason that may pass (Slurm or the API server down, a timeout). Back off
    (persisted, so a restart or a wake does not skip it) until the time budget is spent, then fail."""
    since = record.failing_since or now
    spent = (now - since).total_seconds()
    if spent >= spec.healing.retry_budget_seconds:
        return fail(record, f"gave up after {record.retries + 1} attempts over {spent:.0f}s: {error}", now)
    delay = min(MAX_BACKOFF, 0.5 * 2 ** record.retries)
    return Step(record=replace(record, retries=record.retries + 1, failing_since=since,
                               next_attempt=now + timedelta(seconds=delay), last_error=error[:500]),
                recheck_after=delay)


def fail(record: Record, reason: str, now: datetime) -> Step:
    """End a remediation that cannot finish, and tell the user why. The node stays contained."""
    return Step(_once(record, Notify("failed", "critical", f"remediation {record.name} of {record.node} failed: {reason}")),
                record.moved(Phase.FAILED, now, reason=reason, held="", held_reason=""))
