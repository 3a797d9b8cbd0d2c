"""The pure core: from observations, remediations, policy and the time to actions. No I/O.

Per node, as the work queue hands it over (level-based: the same answer for the same facts, so a
missed event or a restart heals itself):
- `detect`: does this node's fault start a remediation now? (What happens to the node once its heal is
  over is the repair loop's: `repair.py`, `oncall.py`.)
- `needs`: what must be seen for a live remediation's next step (the runtime gathers that, no more);
- `plan_step`: for its live remediation, what is the one next step? Containment (cordon, drain in
  Slurm, checkpoint, requeue) is never gated; admission (`admission.py`: attempt cap, storm brake,
  max_concurrent) decides only whether the node is replaced;
- `retry`: a step failed for a reason that may pass: when to try again, or give up (a time budget).

Which steps carry (are written together with the next one, see `Step.carry`): a step whose loss,
replayed from any earlier write or from no remediation at all, runs only idempotent actions again and
ends in the same place. The cordon, a drain in Slurm with no job on the node, admission to eviction, the
end of an eviction, a promotion and a wait for a spare carry. These do not: a drain that finds jobs
(once requeued they are off the node, and only the remediation remembers them), the end of containment
(Requeued: what admission counts across nodes), the choice of a spare (a restart must promote the same
one), a fault on a spare (its quarantine hides the node from `detect`), a reclaim's start, every hold,
escalation and end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Sequence

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import Kind, describe
from gpufleet.fleetspec.remediation_crd import Reason

from gpufleet.reconciler.core.actions import (
    Action, CarryDrain, Cordon, DeletePods, DrainSlurm, EndLoan, EvictPods, NoteSignals, Notify, PromoteSpare, Quarantine,
    ReleaseJobs, RequestCapacity, RequeueJobs, ResumeSlurm, SignalJobs, StartReclaim,
)
from gpufleet.reconciler.core import diagnosis, job_boundary, node_lost, pages, refills, replacements, resume, signals
from gpufleet.reconciler.core.admission import admit, evict
from gpufleet.reconciler.core.drains import drained_by_gpufleet, drained_by_operator, drained_by_person, set_by, slurm_reason
from gpufleet.reconciler.core.lending import evict_borrowers
from gpufleet.reconciler.core.model import Gate, Needs, NodeView, Remediation, SlurmNodeView, Step, StepFacts, remediation_name
from gpufleet.reconciler.core.observe import borrower_views, evictable_views
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.slurm_states import ON_NODE_JOB_STATES
from gpufleet.reconciler.core.repair import will_repair
from gpufleet.reconciler.core.spares import free_spares, replacement_view
from gpufleet.reconciler.core.validation import nodes_checking, required as proof_required

RESUME_TIMEOUT = timedelta(minutes=10)
NOTE_WAIT_AFTER = timedelta(seconds=30)  # a Resuming remediation says in its record why it waits after this long
MAX_BACKOFF = 30.0
KEEP_SIGNALS = 10  # a node remembers its last this many fault signals


# --- detection ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Detection:
    remediation: Remediation | None = None  # a new remediation to create
    gate: Gate | None = None  # why nothing starts (healing disabled)
    actions: tuple[Action, ...] = ()  # not tied to a remediation: remember a signal, return a healed node
    look_after: float | None = None  # a fault waiting for its job's boundary: when to look again (seconds)


def detect(node: NodeView, remediations: Sequence[Remediation], spec: FleetSpec, now: datetime,
           carries_nodeset_pod: bool = False, on_node: job_boundary.OnNode | None = None) -> Detection:
    """Whether `node` starts a remediation now. `remediations` are the node's own (any phase); the
    node's earlier fault signals (for `occurrences`) are on the node, and a new one is noted there.
    Only a fault whose action takes the node out starts one: `none` and `restart-app` (the job's
    problem, which the node agent records as an Event) leave the node in service. A `diagnose` fault starts
    one in the Diagnosing phase (core/diagnosis.py): the node is checked while it stays in service.
    A machine that stopped answering (`carries_nodeset_pod`: a NodeSet pod is on it) is a fault of its own
    (core/node_lost.py) once its Ready condition has not been True for the spec's time; its own timeout is
    its debounce, so `occurrences` does not count it.
    A fault NVIDIA resolves with DRAIN_AND_RESET (`when=job-boundary`) starts none while `on_node` (its Slurm nodes
    and their running jobs, which the runtime reads for such a fault: `boundary_facts_needed`) shows a job running
    and `healing.job_boundary_max_seconds` has not passed: its Slurm nodes are drained instead, nobody is signalled,
    and the node is looked at again (core/job_boundary.py). The record then says it waited, and why."""
    policy = spec.healing
    f = node.fault
    lost = node_lost.fault(node, spec, now, carries_nodeset_pod)
    if lost is not None and (f is None or not f.needs.remediates):
        f = lost
    signals, noted = node.signals, ()
    counted = f is not lost and f is not None and f.kind is not Kind.SLURM_DRAIN  # Slurm's drain: its own debounce
    if not counted:
        pass  # not a signal to count
    elif policy.occurrences > 1 and f is not None and f.since not in signals:
        signals = signals[-(KEEP_SIGNALS - 1):] + (f.since,)
        noted = (NoteSignals(node.name, signals),)
    live = [r for r in remediations if r.active]
    pools = {p.name for p in spec.pools}
    diagnose = diagnosis.asked(node, spec)  # a repeated application fault: checked while it stays in service
    if f is None or not (f.needs.remediates or diagnose) or node.pool not in pools:
        return Detection(actions=noted)
    if node.role not in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) or live:
        return Detection(actions=noted)
    name = remediation_name(node.name, f)
    if name in {r.name for r in remediations}:
        return Detection(actions=noted)  # this very signal was handled already (a stale condition)
    window = timedelta(seconds=policy.occurrence_window_seconds)
    seen = [t for t in signals if now - t <= window]
    if counted and len(seen) + (0 if f.since in seen else 1) < policy.occurrences:
        return Detection(actions=noted)
    if not policy.enabled:
        return Detection(gate=Gate(Reason.HEALING_DISABLED, node.pool, f"{node.name}: healing is disabled in the spec"),
                         actions=noted)
    boundary = ""
    if lost is None and not diagnose and on_node is not None and job_boundary.asks(f):  # a dead machine: no job ends
        wait = job_boundary.wait(node.name, f, on_node, spec, now)
        if wait is not None:
            return Detection(actions=noted + wait.actions, look_after=wait.look_after)
        boundary = job_boundary.note(f, on_node, spec, now)
    first = Phase.DIAGNOSING if diagnose else Phase.DETECTED
    return Detection(actions=noted, remediation=Remediation(
        name=name, node=node.name, pool=node.pool or "", xid=f.xid, message=f.message,
        phase=first, created=now, phase_times=((first.value, now),),
        reason=f"{describe(f.xid, f.kind)} needs {f.needs.value}: {f.message}{boundary}", was_spare=node.is_spare,
        kind=f.kind, action=f.needs, pci=f.pci, gpu_instance=f.gpu_instance, compute_instance=f.compute_instance,
        source=f.source, reporter=f.reporter,
    ))


def boundary_facts_needed(node: NodeView, remediations: Sequence[Remediation]) -> bool:
    """Whether `detect` weighs this node's job boundary: its fault waits for it and no record handled it yet (the
    runtime then reads its Slurm nodes and their jobs, and only then)."""
    f = node.fault
    return job_boundary.asks(f) and f is not None and remediation_name(node.name, f) not in {r.name for r in remediations}


# --- what a step must see -------------------------------------------------------------------------

def needs(r: Remediation, now: datetime) -> Needs:
    """What the next step of `r` reads. Containment's first step asks Slurm nothing, so the cordon never
    waits for it; an eviction asks for the jobs on its Slurm nodes only once the drain timeout passed
    (`end_eviction`)."""
    match r.phase:
        case Phase.DETECTED:
            return Needs(slurm_names=True, pods=r.was_spare, can_refill=r.was_spare)
        case Phase.SLURM_DRAINING:
            return Needs(slurm_nodes=r.slurm_nodes, jobs_on=r.slurm_nodes, checkpoints=True)
        case Phase.CHECKPOINTING:
            lost = node_lost.requeued_by_slurm_since(r)
            return Needs(slurm_nodes=r.slurm_nodes, jobs_on=r.slurm_nodes, failed_on=r.slurm_nodes if lost else (),
                         failed_since=lost)
        case Phase.REQUEUED | Phase.HELD:
            return Needs(pods=True, admission=True)
        case Phase.EVICTING:
            late = r.drain_deadline is not None and now >= r.drain_deadline
            return Needs(pods=True, jobs_on=r.slurm_nodes if late else ())
        case Phase.REPLACING:
            return Needs(spares=True, replacement=r.replacement is not None, can_refill=True, slurm_pods=True)
        case Phase.WAITING_FOR_SPARE:
            return Needs(spares=True, slurm_pods=True)
        case Phase.RESUMING:
            return Needs(replacement=True, replacement_slurm=True, slurm_pods=True)
    return Needs()


# --- one step of one remediation -----------------------------------------------------------------

def _once(r: Remediation, *actions: Action) -> tuple[Action, ...]:
    """Drop once-only actions the remediation has behind it (a retried step never repeats them): begun, or
    for an at-least-once one, delivered."""
    return tuple(a for a in actions if a.once is None or a.once not in (r.delivered if a.at_least_once else r.intents))


def _slurm(facts: StepFacts) -> dict[str, SlurmNodeView]:
    return {n.name: n for n in facts.slurm}


def plan_step(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """The next step of one live remediation. Pure: the runtime runs the idempotent actions, persists
    the returned remediation with the once-only actions noted as begun, then runs those; if it dies in
    between, the same step is planned again: idempotent actions repeat harmlessly, once-only ones are
    skipped. A step marked `carry` may be written with the next one (the module's docstring says which)."""
    policy = spec.healing
    node, phase = r.node, r.phase
    slurm = _slurm(facts)

    if phase is Phase.DIAGNOSING:
        return Step(recheck_after=0.0)  # not a heal (yet): core/diagnosis.py decides, runtime/diagnoses.py runs it

    if phase is Phase.DETECTED:
        # Containment needs nothing from Slurm: the cordon goes first, whatever Slurm's state.
        names = r.slurm_nodes or facts.slurm_names
        cordon = Cordon(node, slurm_reason(r), r.name)
        if r.was_spare:
            asked, noted = refills.ask(r, f"spare {node} quarantined", f"{r.name}/refill", facts.can_refill, now,
                                       facts.stock, facts.refusal)
            return Step(
                _once(r, Notify("spare-quarantined", "warning", pages.spare_quarantined(r, facts.can_refill)))
                + (cordon, evict(node, facts), Quarantine(node, r.xid, r.pool, will_repair(r, spec))) + _once(r, *asked),
                noted.moved(Phase.REPLACING, now, slurm_nodes=names),
            )
        return Step(
            _once(r, Notify("detected", "warning", pages.detected(r, spec))) + (cordon,),
            r.moved(Phase.SLURM_DRAINING, now, slurm_nodes=names), carry=True,
        )

    if phase is Phase.SLURM_DRAINING:
        # A node a person drained stays as the person left it (drained, their reason), for good.
        kept = tuple(n for n in r.slurm_nodes if n in slurm and drained_by_person(slurm[n]))
        drains = tuple(
            DrainSlurm(n, slurm_reason(r)) for n in r.slurm_nodes
            if n not in kept and not (n in slurm and (drained_by_gpufleet(slurm[n]) or drained_by_operator(slurm[n])))
        )
        jobs = signals.on_node(facts)
        # A job another remediation signalled already is not signalled again: this one waits on that checkpoint.
        # A lost machine's jobs get no SIGTERM and no grace: no slurmd is there to deliver it, nothing can
        # checkpoint; Slurm requeues a --requeue job itself once it marks the node DOWN (slurmctld's
        # SlurmdTimeout), and what still holds the node is requeued now.
        grace = 0 if r.kind is Kind.NODE_LOST else policy.grace_period_seconds
        signal, deadline = signals.checkpoint(facts, grace, now)
        actions: tuple[Action, ...] = drains + (_once(r, SignalJobs(signal, "TERM")) if signal else ())
        actions += carry_person_drains(r, kept, slurm)
        # With jobs, the remediation is what remembers them once they are requeued off the node: written first.
        job_nodes = tuple(sorted({n for j in facts.jobs_on_node if j.job_id in jobs for n in j.nodes}))
        return Step(actions, r.moved(Phase.CHECKPOINTING, now, jobs=jobs, grace_deadline=deadline, kept_drains=kept,
                                     signalled=signal, job_nodes=job_nodes), carry=not jobs)

    if phase is Phase.CHECKPOINTING:
        still = [j for j in facts.jobs_on_node if j.state in ON_NODE_JOB_STATES]
        deadline = r.grace_deadline or now
        if still and now < deadline:
            again = signals.undelivered(r, facts, now)  # noted, never marked sent (a crash): sent again
            return Step((again,) if again else (), recheck_after=min(1.0, (deadline - now).total_seconds()))
        jobs = tuple(sorted(set(r.jobs) | {j.job_id for j in still}))
        # A lost machine's jobs that slurmctld requeued itself before the loss was read are the record's too (so
        # their admin comment and `gpufleet why` tell it), never requeued again: one may run elsewhere already.
        gone = node_lost.requeued_by_slurm(r, facts.failed_jobs, jobs)
        return Step((RequeueJobs(jobs),) if jobs else (),
                    r.moved(Phase.REQUEUED, now, jobs=tuple(sorted(set(jobs) | {j.job_id for j in gone})),
                            job_nodes=tuple(sorted(set(r.job_nodes) | {n for j in gone for n in j.nodes}))))

    if phase in (Phase.REQUEUED, Phase.HELD):
        return admit(r, facts, spec, now, _once)

    if phase is Phase.EVICTING:
        if force := node_lost.force_delete(facts.node, facts.pods, spec, now):
            return _force_out(r, force, facts, now)
        left = tuple(sorted(p.key for p in evictable_views(facts.pods)))
        if left and now < (r.drain_deadline or now):
            eviction = evict(node, facts)  # those already leaving are waited for, not asked again
            return Step((eviction,) if eviction.pods else (), recheck_after=2.0)
        return end_eviction(r, facts, spec, now)

    if phase is Phase.REPLACING:
        return _replace(r, facts, spec, now)

    if phase is Phase.WAITING_FOR_SPARE:
        if free_spares(facts, proof_required(spec)) or _landed(r, facts):
            return Step((), r.moved(Phase.REPLACING, now), carry=True)
        return Step(recheck_after=10.0)

    if phase is Phase.RESUMING:
        broke = replacements.broken(facts.replacement, r.replacement or "", spec, now)
        if broke:
            return replacements.give_up(r, broke, now)
        if others := resume.taken_by_others(r, facts):
            return _yield_replacement(r, others, facts, now)
        if facts.replacement is not None and facts.replacement.on_loan:
            # Lent between its choice and its promotion (a race with a lending pass): end that loan first.
            return Step((EndLoan(facts.replacement.name, back_to_spare=False),), recheck_after=0.5)
        if stuck := node_lost.stuck_on(facts.node, facts.slurm_pods, spec, now):
            # The faulted machine died after its pods were asked to leave: they never will (node_lost.py).
            said = "force-deleted" in r.reason
            why = (f"{r.reason}; {node} stopped answering mid-heal: NodeSet pod(s) {list(stuck)} force-deleted "
                   "(grace 0: a dead kubelet never ends a deletion), their Slurm nodes set DOWN first")
            return Step(node_lost.let_go(r, stuck, facts.slurm_pods), None if said else replace(r, reason=why),
                        recheck_after=1.0)
        resumes = tuple(ResumeSlurm(n) for n in resume_candidates(r, facts))
        if resumes:
            return Step(resumes, recheck_after=0.5)
        if replacement_ready(r, facts):
            took = (now - r.created).total_seconds()
            return Step(
                ((ReleaseJobs(r.jobs),) if r.jobs else ())
                + _once(r, Notify("succeeded", "info",
                                  f"{node} replaced by {r.replacement} in {took:.0f}s; requeued jobs "
                                  f"{list(r.jobs)} released")),
                r.moved(Phase.SUCCEEDED, now, waiting=""),
            )
        waiting = resume.waiting(r, facts) or f"{r.replacement} is not a schedulable, Ready node yet"
        waited = now - (r.entered(Phase.RESUMING) or now)
        if waited > RESUME_TIMEOUT:
            return fail(r, f"replacement {r.replacement} not taking jobs within {RESUME_TIMEOUT}: {waiting}", now)
        if waiting != r.waiting and (waited > NOTE_WAIT_AFTER or resume.unplaceable(r, facts)):
            # Said in the record when it is news to a person: a pod nothing can take, or a wait past the usual.
            return Step((), replace(r, waiting=waiting), recheck_after=1.0)
        return Step(recheck_after=1.0)

    return Step()  # OptedOut and terminal phases: nothing to do


def _replace(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """Replacing: choose a spare (written before it is acted on), take it back if it is lent, promote it.
    A chosen spare that broke before its promotion is given up, and another chosen."""
    node = r.node
    if r.was_spare:
        return Step((), r.moved(Phase.SUCCEEDED, now))
    if r.stands_in_for:
        return _stood_in(r, facts, spec, now)
    chosen = replacement_view(r.replacement, facts)
    if r.replacement and (broke := replacements.broken(chosen, r.replacement, spec, now)):
        return replacements.give_up(r, broke, now)
    lent = chosen is not None and chosen.on_loan
    borrowers = borrower_views(facts.replacement_pods)
    if r.replacement and ((lent and r.reclaim_started is None) or borrowers):
        return _reclaim_replacement(r, facts, spec, now)
    if r.replacement == node:
        # Repaired in place while it waited (repair.py): the node takes its own job back; nothing to refill.
        return Step((PromoteSpare(node, node, r.pool),), r.moved(Phase.RESUMING, now), carry=True)
    if r.replacement:
        # One node asked per remediation: a request that stands (for the spare it had none of) refills this one.
        asked, noted = ((), r) if r.refill is not None else refills.ask(
            r, f"refill the spare used for {node}", f"{r.name}/refill", facts.can_refill, now, facts.stock,
            facts.refusal)
        reason = r.reason
        if r.reclaim_started:
            took = (now - r.reclaim_started).total_seconds()
            reason += f"; waited {took:.0f}s for the borrowers on {r.replacement} to leave"
        end_loan = (EndLoan(r.replacement, back_to_spare=False),) if lent or r.reclaim_started else ()
        return Step(
            end_loan + (PromoteSpare(r.replacement, node, r.pool), Quarantine(node, r.xid, r.pool, will_repair(r, spec)))
            + _once(r, *asked),
            noted.moved(Phase.RESUMING, now, reason=reason), carry=True,
        )
    if host := _landed(r, facts):
        return _adopt(r, host, facts, spec, now)
    spares = free_spares(facts, proof_required(spec))
    if spares:
        # Write the choice down before acting on it, so a restart promotes the same spare.
        return Step((), replace(r, replacement=spares[0]), recheck_after=0)
    if proof_required(spec) and nodes_checking(n for n in facts.pool_nodes if n.name not in facts.claimed):
        return Step(recheck_after=2.0)  # a spare is being health-checked (validation.py): it serves once it passes
    asked, noted = ((), r) if r.refill is not None else refills.ask(
        r, f"no spare for {node}", f"{r.name}/no-spare", facts.can_refill, now, facts.stock, facts.refusal,
        waits=True)
    return Step(
        _once(r, Notify("no-spare", "critical", pages.no_spare(
            r, facts.can_refill, any(isinstance(a, RequestCapacity) for a in asked),
            spec.pool(r.pool).repair.in_place and will_repair(r, spec))), *asked),
        noted.moved(Phase.WAITING_FOR_SPARE, now), carry=True,
    )


# Two heals, one spare. slurm-operator v1.2.1 makes every pod of a NodeSet from the same template
# (internal/controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod: the template's nodeSelector, affinity and
# tolerations, one anti-affinity term keeping NodeSet pods apart, spec.nodeName left empty "otherwise the Pod
# scheduler will be avoided"; the only pin, PinToNode, pins an ordinal to the node it ran on before, the faulted
# one) and kube-scheduler places them: nothing lets a promoted spare take one NodeSet pod and refuse another, and
# a pod's affinity cannot be changed once it is made. When two nodes fault together and one spare is free, the
# scheduler may put the other remediation's Slurm node on the spare promoted for the first. The capacity came back
# under the other name, so the remediation whose Slurm nodes it runs counts it (`_adopt`), and the one it was
# promoted for gives it up and takes another spare (`_yield_replacement`), or waits for one with its own node
# repaired in place meanwhile (repair.repairs_in_place). Neither heal waits on the other, so both end, and both
# nodes are repaired.

def _landed(r: Remediation, facts: StepFacts) -> str | None:
    """The healthy node of the pool all the remediation's Slurm nodes run on now, before it promoted a spare of
    its own (None: not back, or not on one such node)."""
    if r.was_spare or r.stands_in_for or r.replacement is not None:
        return None
    host = resume.landed(r, facts)
    view = next((n for n in facts.pool_nodes if n.name == host), None)
    if view is None or not view.is_active or not view.ready or view.unschedulable or view.fault is not None:
        return None
    return host


def _adopt(r: Remediation, host: str, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """The remediation's Slurm nodes came back on `host` (a spare promoted for another fault): `host` is its
    replacement; its own node is quarantined (and repaired), as after a promotion. No spare is promoted and
    none asked for: the remediation `host` was promoted for asked for its refill."""
    names = ", ".join(r.slurm_nodes)
    why = (f"Slurm node(s) {names} came back on {host}, which the scheduler gave them (a NodeSet's pods are "
           f"interchangeable to it): {host} is {r.node}'s replacement; no spare promoted for it")
    return Step((Quarantine(r.node, r.xid, r.pool, will_repair(r, spec)),),
                r.moved(Phase.RESUMING, now, replacement=host, reason=f"{r.reason}; {why}", waiting=""), carry=True)


def _yield_replacement(r: Remediation, others: tuple[str, ...], facts: StepFacts, now: datetime) -> Step:
    """The spare promoted for this remediation runs other Slurm nodes while its own can be placed nowhere: that
    spare counts for the remediation of those Slurm nodes; this one takes another (back to Replacing), with its
    refill asked already. Written before anything follows: a restart must not wait on that spare again."""
    spare = r.replacement
    why = (f"{spare} took Slurm node(s) {', '.join(others)} instead of {', '.join(r.slurm_nodes)} (the scheduler "
           f"places a NodeSet's pods interchangeably): {spare} counts for them; {r.node} takes another spare")
    return Step((), replace(r.moved(Phase.REPLACING, now), replacement=None, waiting="", reason=f"{r.reason}; {why}"))


def _stood_in(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """A node that stood in for another's and broke: quarantined and refilled; the remediation it stood in
    for takes another spare, so this one replaces nothing."""
    asked, noted = refills.ask(r, f"{r.node} broke standing in for {r.stands_in_for}", f"{r.name}/refill",
                               facts.can_refill, now, facts.stock, facts.refusal)
    why = (f"{r.node} stood in for {r.stands_in_for} and broke before it succeeded: quarantined, not replaced "
           f"({r.stands_in_for} takes another spare)")
    return Step((Quarantine(r.node, r.xid, r.pool, will_repair(r, spec)),) + _once(r, *asked),
                noted.moved(Phase.SUCCEEDED, now, reason=f"{r.reason}; {why}"))


def _reclaim_replacement(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """The chosen spare is on loan: take it back (within the pool's reclaim grace, then by force) before it
    is promoted. The remediation notes when this began, so the delay shows in it and survives a restart."""
    spare = r.replacement or ""
    if r.reclaim_started is None:
        return Step((StartReclaim(spare, f"a fault on {r.node} needs it"),), replace(r, reclaim_started=now),
                    recheck_after=0)
    eviction = evict_borrowers(spare, borrower_views(facts.replacement_pods), r.reclaim_started, spec.pool(r.pool), now)
    step = Step((eviction,) if eviction.pods else (), recheck_after=0.5)
    note = f"; the borrowers on {spare} outlasted the {eviction.grace_seconds}s reclaim grace and were deleted"
    if eviction.force and note not in r.reason:
        return replace(step, remediation=replace(r, reason=r.reason + note))
    return step


def resume_candidates(r: Remediation, facts: StepFacts) -> tuple[str, ...]:
    """Slurm nodes gpufleet drained that now run on healthy hardware: the replacement's, and the
    remediation's own once their pods have moved to a healthy node (not the faulted one, nor a replacement
    that broke: that one's own remediation contains it). A person's drain is never undone; the operator's
    drains are the operator's to undo."""
    slurm = _slurm(facts)
    names = set(facts.replacement_slurm) | set(resume.moved(r, facts))
    out = []
    for name in sorted(names):
        n = slurm.get(name)
        if n is not None and drained_by_gpufleet(n) and name not in r.kept_drains:
            out.append(name)
    return tuple(out)


def replacement_ready(r: Remediation, facts: StepFacts) -> bool:
    """The replacement is a schedulable, Ready node without the spare taint; and when the faulted node
    ran Slurm, each Slurm node the remediation moved runs off the faulted node and takes jobs (not merely
    some Slurm node on the replacement: another's pod may have landed there while this one's has nowhere
    to go). A person's drain went with the faulted machine (`carry_person_drains`)."""
    rep = facts.replacement
    if rep is None or not rep.ready or rep.unschedulable or labels.SPARE_TAINT in rep.taints \
            or labels.LENDING_TAINT in rep.taints:
        return False
    return not resume.not_back(r, facts)


def carry_person_drains(r: Remediation, kept: tuple[str, ...], slurm: dict[str, SlurmNodeView]) -> tuple[Action, ...]:
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
    said = "; ".join(f"{n}: {reason!r}{set_by(slurm[n])}" for n, reason in drains)
    return (CarryDrain(r.node, drains),) + _once(r, Notify(
        "person-drain-carried", "warning",
        f"{r.node} faulted while a person had drained its Slurm node(s) ({said}). The drain is carried to "
        f"{r.node} (annotation {labels.CARRIED_DRAIN}), which stays quarantined until a person removes it; "
        "the Slurm node moves to a spare and takes jobs there."))


def _force_out(r: Remediation, force: tuple[str, ...], facts: StepFacts, now: datetime) -> Step:
    """A machine not Ready for `healing.node_lost_after_seconds` (lost, or a faulted one that died mid-heal): its
    NodeSet pods are deleted with grace 0 at once, their Slurm nodes set DOWN first as their preStop would have
    (their eviction would never complete on a dead kubelet: node_lost.force_delete, node_lost.let_go), the other
    pods' eviction is asked (their controllers make them again elsewhere), and the heal goes on to the spare
    without waiting for them."""
    others = tuple(p.key for p in evictable_views(facts.pods) if not p.deleting and p.key not in force)
    reason = (f"{r.reason}; the machine still not Ready: NodeSet pod(s) {list(force)} force-deleted (grace 0: a "
              "dead kubelet never ends an eviction nor runs the slurmd preStop), their Slurm nodes set DOWN first")
    return Step(node_lost.let_go(r, force, facts.pods) + ((EvictPods(r.node, others),) if others else ()),
                r.moved(Phase.REPLACING, now, reason=reason))


def end_eviction(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """Eviction is over: nothing left, or the drain timeout passed. NodeSet pods still there then are the
    ones slurm-operator's PodDisruptionBudget protects (label nodeset.slinky.slurm.net/pod-protect while
    their Slurm node was busy: workerbuilder/worker_pdb.go, relabelled at its next NodeSet sync, at most
    30 s apart: nodeset_sync.go): when no job runs on the remediation's Slurm nodes (requeued), the label
    is stale and they are deleted, so the Slurm node still moves. The time it took is the Evicting phase's.
    The jobs are read only once the drain timeout passed (`needs`). Only the Slurm namespace's NodeSet pods:
    the one namespace where the reconciler may delete pods (components/reconciler.py slurm_namespace_rules)."""
    policy = spec.healing
    left = evictable_views(facts.pods)
    reason = r.reason
    actions: tuple[Action, ...] = ()
    nodeset = tuple(sorted(p.key for p in left if p.label(labels.SLINKY_POD_HOSTNAME) is not None
                           and p.namespace == spec.slurm.namespace))
    stale = nodeset if not any(j.state in ON_NODE_JOB_STATES for j in facts.jobs_on_node) else ()
    if stale:
        actions = (DeletePods(r.node, stale),)
        reason += (f"; NodeSet pod(s) {list(stale)} still refused eviction after {policy.drain_timeout_seconds}s "
                   "(slurm-operator's PodDisruptionBudget) with no job left on their Slurm nodes: deleted")
    rest = sorted(p.key for p in left if p.key not in stale)
    if rest:
        reason += f"; drain timed out after {policy.drain_timeout_seconds}s with pods left: {rest}"
    return Step(actions, r.moved(Phase.REPLACING, now, reason=reason), carry=not actions)


# --- failures -------------------------------------------------------------------------------------

def retry(r: Remediation, error: str, spec: FleetSpec, now: datetime) -> Step:
    """A step failed for a reason that may pass (Slurm or the API server down, a timeout). Back off
    (persisted, so a restart or a wake does not skip it) until the time budget is spent, then fail."""
    since = r.failing_since or now
    spent = (now - since).total_seconds()
    if spent >= spec.healing.retry_budget_seconds:
        return fail(r, f"gave up after {r.retries + 1} attempts over {spent:.0f}s: {error}", now)
    delay = min(MAX_BACKOFF, 0.5 * 2 ** r.retries)
    return Step(remediation=replace(r, retries=r.retries + 1, failing_since=since,
                                    next_attempt=now + timedelta(seconds=delay), last_error=error[:500]),
                recheck_after=delay)


def fail(r: Remediation, reason: str, now: datetime) -> Step:
    """End a remediation that cannot finish, and tell the user why. The node stays contained."""
    return Step(_once(r, Notify("failed", "critical", pages.failed(r, reason))),
                r.moved(Phase.FAILED, now, reason=reason, held_message="", held_reason=""))


# --- when to look again ---------------------------------------------------------------------------

def next_look(r: Remediation | None, step: Step | None, moved: bool, now: datetime) -> float | None:
    """Seconds until a remediation is looked at again (None: on the next event, or the resync). `step`:
    the last one planned; `moved`: the remediation changed phase in this reconcile (its next step follows)."""
    if r is None or r.phase.terminal or r.phase is Phase.OPTED_OUT:
        return None
    if r.next_attempt is not None:
        return max(0.0, (r.next_attempt - now).total_seconds())
    if step is not None and step.remediation is None:
        return step.recheck_after  # the last step waits: that is when to look again
    if moved:
        return 0.0
    return step.recheck_after if step else None
