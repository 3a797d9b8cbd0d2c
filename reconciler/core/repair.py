"""The repair loop of one node (issue 25): replace first, repair after. Pure: from a remediation whose
heal is over, what the node is seen doing, the spec and the time, to the next step.

The job's path does not change: it is contained, requeued and resumed on a spare. Then the node that
broke climbs a ladder driven by what its fault needs (its action: reset-gpu, reboot, replace), each rung
as the pool allows and no longer than the pool's timeout for it:

    reset its GPU(s) ──► health check ──► back among the spares
           │ failed, timed out     │ failed
           ▼                       ▼
    reboot the machine ──► health check ──► back among the spares
           │ failed, timed out     │ failed
           ▼                       ▼
                      retired (quarantined for the vendor, paged; the provider replaces it)

A fault that needs the vendor (`replace`) retires at once; so does a lemon: a node whose faults within
`retire_window_seconds` reach `retire_after_faults`. A node that faults again within `min_healthy_seconds`
of serving again after a repair relapsed: that repair did not hold, and this one starts a rung higher.
A person's drain in Slurm or the opt-out label (on the node or on a pod there) stops the loop; it goes on
when they are lifted. The phases and their moves are in `repair_phases.py`; a person's commands in
`oncall.py`.

Once per request: a reset or a reboot is asked for under an id written on the remediation first, and
whoever acts on the node acts once per id. With no sign of it after half its timeout (the request was
noted, then the reconciler died before it went out), it is asked again, once, under a new id.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from fleetspec import labels
from fleetspec.faults import describe
from fleetspec.models import FleetSpec
from fleetspec.node_repair import RepairRequest
from fleetspec.repair import REBOOT, REPLACE, RESET_GPU, RUNGS

from reconciler.core.actions import Action, Notify, ReturnToSpares
from reconciler.core.drains import drained_by_person, set_by
from reconciler.core.model import NodeView, PodView, Remediation, SlurmNodeView, Step
from reconciler.core.observe import opted_out_views
from reconciler.core.phases import Phase
from reconciler.core.repair_actions import (
    MarkHealthy, NodeEvent, RecordCheck, RequestRepair, Retire, StartHealthCheck,
)
from reconciler.core.repair_phases import Repair, RepairEvent, RepairPhase, begin
from reconciler.core.slurm_names import slurm_nodes_on
from reconciler.core.validation import MISSING, PASSED, SLACK, Verdict, job_name, passed_record

RECHECK = 5.0  # seconds between looks while a step is under way (the node's and its pods' changes wake it sooner)
RECHECK_STOPPED = 30.0
RESEND_AFTER = 0.5  # of a step's timeout: with no sign of the request by then, it is asked again (once)
RUNG_EVENTS = {RESET_GPU: "GpuResetRequested", REBOOT: "RebootRequested"}


# --- what a step reads ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RepairNeeds:
    pods: bool = True  # the node's pods: the pool's NodeSet pods gone? the opt-out label?
    slurm: tuple[str, ...] = ()  # Slurm nodes to ask about (where Slurm says they run; a person's drain)
    verdict: str = ""  # the health-check Job whose verdict is read


@dataclass(frozen=True)
class RepairFacts:
    node: NodeView | None
    pods: tuple[PodView, ...] = ()
    slurm: tuple[SlurmNodeView, ...] = ()
    verdict: Verdict | None = None
    history: tuple[Remediation, ...] = ()  # every remediation of the node (this one included), any phase
    promotions: tuple[datetime, ...] = ()  # when the node was promoted as a spare (other remediations chose it)


def repair_needs(r: Remediation) -> RepairNeeds:
    rep = r.repair
    verdict = rep.job if rep is not None and rep.phase is RepairPhase.VALIDATING else ""
    return RepairNeeds(slurm=r.slurm_nodes, verdict=verdict)


# --- the fault, as the repair reads it ------------------------------------------------------------------

def first_step(action: str | None) -> str:
    """The repair's first rung for a fault's action (the fault catalogue's: none, restart-app, reset-gpu,
    reboot, replace): reset-gpu, reboot or replace as given; anything else, or none known, a reboot (the
    catalogue's most common answer for a node taken out of service)."""
    return action if action in (RESET_GPU, REBOOT, REPLACE) else REBOOT


def fault_needs(r: Remediation) -> str:
    """What the remediation's fault needs: the action its record keeps (spec.fault.action; a record from
    before faults carried one has none, and first_step(None) is a reboot)."""
    return first_step(r.action.value if r.action is not None else None)


def fault_gpus(r: Remediation) -> tuple[str, ...]:
    """The GPU the fault names (its PCI address), if it names one: a reset resets only that GPU."""
    return (r.pci,) if r.pci else ()


# --- which remediation the loop looks at ----------------------------------------------------------------

def loop_on(r: Remediation, spec: FleetSpec) -> bool:
    pools = {p.name: p for p in spec.pools}
    return spec.healing.repair.enabled and r.pool in pools and pools[r.pool].repair.enabled


def repairs_in_place(r: Remediation, spec: FleetSpec) -> bool:
    """A remediation that waits for a spare, whose node the pool repairs in place meanwhile."""
    if r.phase is not Phase.WAITING_FOR_SPARE or not loop_on(r, spec):
        return False
    pool = spec.pool(r.pool)
    need = fault_needs(r)
    return pool.repair.in_place and need != REPLACE and any(
        pool.repair.allows(x) for x in RUNGS[RUNGS.index(need):])


def wants(r: Remediation, node: NodeView | None, spec: FleetSpec) -> bool:
    """Whether the repair loop has something to do with `r`, the node's newest remediation, now."""
    if r.repair is not None:
        return r.repair.active
    if not loop_on(r, spec) or node is None:
        return False
    if r.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.ESCALATED):
        return node.role == labels.ROLE_QUARANTINED
    return repairs_in_place(r, spec)


def will_repair(r: Remediation, spec: FleetSpec) -> bool:
    """Whether a node quarantined by this remediation's heal is then repaired (a provider keeps such an
    instance instead of letting it go at once)."""
    return loop_on(r, spec) and fault_needs(r) != REPLACE and any(
        spec.pool(r.pool).repair.allows(x) for x in RUNGS[RUNGS.index(fault_needs(r)):])


# --- the lemon rule and relapses ----------------------------------------------------------------------

def faults_in_window(r: Remediation, history: tuple[Remediation, ...], spec: FleetSpec,
                     now: datetime) -> list[Remediation]:
    window = timedelta(seconds=spec.healing.repair.retire_window_seconds)
    seen = {x.name: x for x in history if now - x.created <= window}
    seen[r.name] = r
    return sorted(seen.values(), key=lambda x: x.created)


def relapse(r: Remediation, facts: RepairFacts, spec: FleetSpec) -> tuple[str, str] | None:
    """(the rung that fixed it last time, why) when the node faulted within `min_healthy_seconds` of serving
    again after its last repair; None otherwise."""
    earlier = [x for x in facts.history if x.name != r.name and x.created < r.created and x.repair is not None
               and x.repair.phase is RepairPhase.RETURNED and x.repair.ended is not None]
    if not earlier:
        return None
    prev = max(earlier, key=lambda x: x.repair.ended)
    back = prev.repair.ended
    serving = max([back] + [p for p in facts.promotions if back <= p <= r.created])
    lasted = (r.created - serving).total_seconds()
    if lasted >= spec.healing.repair.min_healthy_seconds:
        return None
    rung = prev.repair.rungs[-1] if prev.repair.rungs else ""
    return rung, (f"relapsed: {prev.name}'s repair ({rung or 'a health check'}) held {lasted:.0f}s after the node "
                  f"served again (min_healthy_seconds {spec.healing.repair.min_healthy_seconds}): it counts "
                  "against the node")


# --- what stops the loop --------------------------------------------------------------------------------

def stop_reason(r: Remediation, facts: RepairFacts, spec: FleetSpec) -> str:
    """Why a person holds this node ('' when no one does): the opt-out label on it or on a pod there, or a
    Slurm node on it that a person drained."""
    key = spec.healing.opt_out_label
    node = facts.node
    if node is not None and (v := node.label(key)) is not None and v.lower() != "false":
        return f"the node carries {key}={v}"
    opted = opted_out_views(facts.pods, key)
    if opted:
        return f"pods {list(opted)} on the node carry {key}"
    if node is not None and node.carried_drain:  # slurm-operator 1.2.1 cleared it on the Slurm node (decide.py)
        return f"a person's Slurm drain was carried to it ({labels.CARRIED_DRAIN}: {node.carried_drain})"
    held = [s for s in facts.slurm if s.comment_node == r.node and drained_by_person(s)]
    if held:
        return f"Slurm node {held[0].name} on it was drained by a person ({held[0].reason!r}{set_by(held[0])})"
    return ""


def pool_leftovers(r: Remediation, facts: RepairFacts) -> str:
    """What of the pool still runs on the node, or what Slurm still says runs there ('' when nothing): a node
    goes back to the spares only when nothing of the pool runs on it and Slurm agrees (issue 23, item 6)."""
    here = slurm_nodes_on(r.node, facts.pods).names
    if here:
        return f"NodeSet pod(s) of Slurm node(s) {list(here)} still run on {r.node}"
    stale = [s.name for s in facts.slurm if s.comment_node == r.node and not s.down]
    if stale:
        return f"Slurm still has {stale} on {r.node} (not down)"
    return ""


# --- one step -------------------------------------------------------------------------------------------

def plan_repair(r: Remediation, facts: RepairFacts, spec: FleetSpec, now: datetime) -> Step:
    """The next step of `r`'s repair (a person's requests are `oncall.py`'s, planned before this)."""
    node, rep = facts.node, r.repair
    if node is None:
        return Step()  # the node is gone (deleted, terminated): nothing left to repair
    stop = stop_reason(r, facts, spec)
    if rep is None:
        return _start(r, facts, spec, now, stop)
    if rep.phase is RepairPhase.STOPPED:
        if rep.error:
            return Step()  # an error a person must fix: their `gpufleet return` (or retire) goes on from here
        return Step(recheck_after=RECHECK_STOPPED) if stop else _resume(r, facts, spec, now)
    if stop:
        new = rep.moved(RepairPhase.STOPPED, now, stopped_from=rep.phase.value, reason=f"stopped: {stop}")
        return Step((NodeEvent(r.node, "RepairStopped", f"repair of {r.node} stopped: {stop}"),),
                    replace(r, repair=new.noted(RepairEvent("stop", "stopped", now, stop))))
    if rep.phase is RepairPhase.REPAIRING:
        return _repairing(r, rep, node, facts, spec, now)
    if rep.phase is RepairPhase.VALIDATING:
        return _validating(r, rep, node, facts, spec, now)
    return Step()


def _start(r: Remediation, facts: RepairFacts, spec: FleetSpec, now: datetime, stop: str) -> Step:
    node = facts.node
    assert node is not None
    faults = faults_in_window(r, facts.history, spec, now)
    limit = spec.healing.repair.retire_after_faults
    if len(faults) >= limit:
        return retire(r, None, now, lemon_reason(r, faults, spec))
    if r.phase is Phase.ESCALATED:
        return Step()  # the attempt cap holds it for a person (gpufleet release | return | retire | mark-healthy)
    need = fault_needs(r)
    if need == REPLACE:
        return retire(r, None, now, f"{describe(r.xid, r.kind)} needs the vendor (action {REPLACE}): nothing to repair")
    if r.phase is not Phase.WAITING_FOR_SPARE and pool_leftovers(r, facts):
        return Step(recheck_after=RECHECK)  # its NodeSet pod is still leaving (the heal's eviction)
    floor, why = need, f"{describe(r.xid, r.kind)} needs {need}"
    back = relapse(r, facts, spec)
    if back is not None:
        rung, why = back
        floor = _above(rung) if rung in RUNGS else floor
    step = _first_step(r, node, spec, now, floor, why, stop)
    if back is None or step.remediation is None or step.remediation.repair is None:
        return step
    rep = step.remediation.repair  # the relapse heads the new repair's history (and counts in the metrics)
    rep = replace(rep, history=(RepairEvent("relapse", "relapsed", now, why),) + rep.history)
    return replace(step, remediation=replace(step.remediation, repair=rep))


def _first_step(r: Remediation, node: NodeView, spec: FleetSpec, now: datetime, floor: str | None, why: str,
                stop: str) -> Step:
    if floor is None:
        return retire(r, None, now, why + "; a reboot did not hold either")
    in_place = r.phase is Phase.WAITING_FOR_SPARE
    if stop:
        first = begin(RepairPhase.STOPPED, now, reason=f"stopped before it began: {stop}", in_place=in_place)
        return Step((NodeEvent(r.node, "RepairStopped", f"repair of {r.node} held: {stop}"),), replace(r, repair=first))
    rung = _first_allowed(spec, r.pool, floor)
    if rung is None:
        return retire(r, None, now, f"{why}; pool {r.pool} allows {spec.pool(r.pool).repair.actions or 'no rung'}")
    return _begin_rung(r, None, rung, node, spec, now, why, in_place=in_place)


def _above(rung: str) -> str | None:
    i = RUNGS.index(rung) + 1
    return RUNGS[i] if i < len(RUNGS) else None


def _first_allowed(spec: FleetSpec, pool: str, floor: str) -> str | None:
    """The mildest rung the pool allows, no milder than `floor`."""
    if floor not in RUNGS:
        return None
    return next((x for x in RUNGS[RUNGS.index(floor):] if spec.pool(pool).repair.allows(x)), None)


def _begin_rung(r: Remediation, rep: Repair | None, rung: str, node: NodeView, spec: FleetSpec, now: datetime,
                why: str, in_place: bool = False, again: bool = False, resumed: bool = False) -> Step:
    """Ask for a reset or a reboot: the request's id is written on the remediation, then it is sent. `again`:
    the same rung once more (no sign of the first request); `resumed`: after a person's hold, the rung that was
    under way (asked again, not a new rung)."""
    attempt = (rep.attempt if rep else 0) + 1
    request = RepairRequest(f"{r.name}/{attempt}-{rung}", rung, now, fault_gpus(r) if rung == RESET_GPU else ())
    timeout = spec.pool(r.pool).repair.timeout(rung)
    fields = dict(step=rung, attempt=attempt, request=request.id, requested_at=now, boot=node.boot_id,
                  deadline=now + timedelta(seconds=timeout), job="", reason=why, gpus=request.gpus, resent=again)
    event = RepairEvent(rung, "asked again" if again or resumed else "asked", now, why)
    if rep is None:
        new = begin(RepairPhase.REPAIRING, now, in_place=in_place, rungs=(rung,), **fields)
    elif again:
        new = replace(rep, **{k: v for k, v in fields.items() if k not in ("deadline",)})
    else:
        new = rep.moved(RepairPhase.REPAIRING, now, rungs=rep.rungs if resumed else rep.rungs + (rung,), **fields)
    what = "reset of its GPU(s)" if rung == RESET_GPU else "reboot"
    gpus = f" {list(request.gpus)}" if request.gpus else ""
    return Step((NodeEvent(r.node, RUNG_EVENTS[rung], f"{what}{gpus} asked for ({request.id}): {why}"),
                 RequestRepair(r.node, r.pool, request)),
                replace(r, repair=new.noted(event)), recheck_after=RECHECK)


def _repairing(r: Remediation, rep: Repair, node: NodeView, facts: RepairFacts, spec: FleetSpec,
               now: datetime) -> Step:
    result = node.repair_result if node.repair_result and node.repair_result.id == rep.request else None
    if rep.step == RESET_GPU and result is not None:
        if result.ok:
            return _begin_check(r, rep, node, spec, now, f"GPU reset done: {result.message}".rstrip(": "))
        return _climb(r, rep, node, spec, now, f"GPU reset failed: {result.message}")
    rebooted = rep.step == REBOOT and node.boot_id != rep.boot and node.ready
    if rebooted:
        return _begin_check(r, rep, node, spec, now, f"rebooted (boot id {rep.boot[:8] or '?'} -> {node.boot_id[:8]})")
    if rep.step == REBOOT and result is not None and not result.ok:
        return _climb(r, rep, node, spec, now, f"reboot failed: {result.message}")
    if rep.deadline is not None and now >= rep.deadline:
        timeout = spec.pool(r.pool).repair.timeout(rep.step)
        return _climb(r, rep, node, spec, now, f"{rep.step} gave no sign of success within {timeout}s")
    started = rep.requested_at or now
    if not rep.resent and result is None and (now - started).total_seconds() >= \
            RESEND_AFTER * spec.pool(r.pool).repair.timeout(rep.step) and node.ready and node.boot_id == rep.boot:
        return _begin_rung(r, rep, rep.step, node, spec, now, f"no sign of {rep.request} after "
                           f"{(now - started).total_seconds():.0f}s: asked again", again=True)
    wait = RECHECK if rep.deadline is None else min(RECHECK, max(0.0, (rep.deadline - now).total_seconds()))
    return Step(recheck_after=wait)


def _begin_check(r: Remediation, rep: Repair, node: NodeView, spec: FleetSpec, now: datetime, why: str) -> Step:
    """The node is health-checked: a Job on it, named per attempt (made again, it is found made)."""
    attempt = rep.attempt + 1
    job = job_name(r.node, f"{r.name}/{attempt}")
    timeout = spec.healing.repair.health_check.timeout_seconds
    new = rep.moved(RepairPhase.VALIDATING, now, step="validate", attempt=attempt, job=job, request="",
                    deadline=now + timedelta(seconds=timeout) + SLACK, reason=why, resent=False)
    done = RepairEvent(rep.step, "ok", now, why) if rep.phase is RepairPhase.REPAIRING else \
        RepairEvent("validate", "asked", now, why)
    return Step((NodeEvent(r.node, "HealthCheckStarted", f"{why}; health check {job} on {r.node}"),
                 StartHealthCheck(r.node, r.pool, job)),
                replace(r, repair=new.noted(done)), recheck_after=RECHECK)


def _validating(r: Remediation, rep: Repair, node: NodeView, facts: RepairFacts, spec: FleetSpec,
                now: datetime) -> Step:
    v = facts.verdict or Verdict(MISSING)
    if v.state == PASSED:
        left = pool_leftovers(r, facts)
        if left:
            return Step(recheck_after=RECHECK)  # passed; nothing of the pool may run there when it returns
        return back_to_spares(r, rep, node, now, f"passed its health check ({rep.job}): {v.message}".rstrip(": "))
    if v.state == "failed":
        return _climb(r, rep, node, spec, now, f"failed its health check ({rep.job}): {v.message}", v.action)
    if rep.deadline is not None and now >= rep.deadline:
        return _climb(r, rep, node, spec, now, f"health check {rep.job} gave no verdict within "
                      f"{spec.healing.repair.health_check.timeout_seconds}s")
    if v.state == MISSING:
        return Step((StartHealthCheck(r.node, r.pool, rep.job),), recheck_after=RECHECK)  # noted, not made (a crash)
    return Step(recheck_after=RECHECK)


def _climb(r: Remediation, rep: Repair, node: NodeView, spec: FleetSpec, now: datetime, why: str,
           check_says: str = "") -> Step:
    """The step failed: the next rung the pool allows, at least what the health check says the node needs;
    none left: retired."""
    failed = replace(rep, history=rep.history + (RepairEvent(rep.step, "failed", now, why),))
    if check_says == REPLACE:
        return retire(r, failed, now, why + "; the check says it needs the vendor")
    tried = rep.rungs[-1] if rep.rungs else None
    floor = _above(tried) if tried else RUNGS[0]
    if check_says in RUNGS and floor is not None and RUNGS.index(check_says) > RUNGS.index(floor):
        floor = check_says
    rung = _first_allowed(spec, r.pool, floor) if floor else None
    if rung is None:
        return retire(r, failed, now, f"{why}; nothing left to try ({' -> '.join(rep.rungs) or 'no rung'} tried)")
    return _begin_rung(r, failed, rung, node, spec, now, why)


def _resume(r: Remediation, facts: RepairFacts, spec: FleetSpec, now: datetime) -> Step:
    """The person's drain or the opt-out label is gone: the repair goes on where it stopped, and asks for
    nothing already done.
    - Stopped before it began: its first rung is asked for.
    - Stopped while a reset or a reboot was asked for (the request stays on the node, and the node's agent may
      carry it out meanwhile): the node rebooted (a new boot id) or the reset was answered done -> the health
      check; answered failed -> the next rung; the reboot answered but not seen yet -> waited for again, with a
      fresh timeout; no sign of it -> asked again under a new id (the agent acts on the newest id, once).
    - Stopped while the health check ran: checked again by a new Job (the node may have changed while held)."""
    rep, node = r.repair, facts.node
    assert rep is not None and node is not None
    rep = rep.noted(RepairEvent("stop", "lifted", now, "a person's hold is gone"))
    lifted = "the hold is lifted"
    if rep.stopped_from == RepairPhase.VALIDATING.value:
        return _begin_check(r, rep, node, spec, now, f"{lifted}: health-checked again (a new check: the node may "
                            "have changed while it was held)")
    if rep.stopped_from == RepairPhase.REPAIRING.value and rep.request:
        return _resume_rung(r, rep, node, spec, now, lifted)
    rung = rep.rungs[-1] if rep.rungs else _first_allowed(spec, r.pool, fault_needs(r))
    if rung is None:
        return retire(r, rep, now, f"pool {r.pool} allows no rung for {fault_needs(r)}")
    return _begin_rung(r, rep, rung, node, spec, now, f"{lifted}: the repair begins ({fault_needs(r)} needed)")


def _resume_rung(r: Remediation, rep: Repair, node: NodeView, spec: FleetSpec, now: datetime, lifted: str) -> Step:
    """A hold lifted on a reset or a reboot asked for before it: what became of that request decides."""
    what = "GPU reset" if rep.step == RESET_GPU else "reboot"
    result = node.repair_result if node.repair_result and node.repair_result.id == rep.request else None
    if node.ready and node.boot_id != rep.boot:
        why = (f"{lifted}; the node rebooted while it was held (boot id {rep.boot[:8] or '?'} -> "
               f"{node.boot_id[:8]}): no second {what}, the health check is next")
        return _begin_check(r, rep.noted(RepairEvent(rep.step, "ok", now, why)), node, spec, now, why)
    if result is not None and not result.ok:
        return _climb(r, rep, node, spec, now, f"{what} failed while the node was held: {result.message}")
    if result is not None and rep.step == RESET_GPU:
        why = f"{lifted}; the GPU reset asked before it was done ({result.message}): the health check is next"
        return _begin_check(r, rep.noted(RepairEvent(rep.step, "ok", now, why)), node, spec, now, why)
    if result is not None:  # the agent answered "rebooting"; the new boot is not seen yet
        timeout = spec.pool(r.pool).repair.timeout(rep.step)
        why = f"{lifted}; the reboot asked before it ({rep.request}) was answered, not seen yet: waiting for it {timeout}s"
        new = rep.moved(RepairPhase.REPAIRING, now, deadline=now + timedelta(seconds=timeout), reason=why)
        return Step((NodeEvent(r.node, "RepairResumed", f"repair of {r.node} resumed: {why}"),),
                    replace(r, repair=new.noted(RepairEvent(rep.step, "waiting", now, why))), recheck_after=RECHECK)
    return _begin_rung(r, rep, rep.step, node, spec, now, f"{lifted}; the {what} asked before it ({rep.request}) "
                       "shows no sign of being done: asked again", resumed=True)


def stopped_by_error(r: Remediation, now: datetime, error: str) -> Step:
    """A step failed in a way retrying cannot fix (a refused call, a node the provider does not know): the
    loop stops there and pages, instead of timing out up the ladder to a retirement the node did not earn."""
    rep = r.repair
    why = f"stopped by an error: {error}"
    if rep is not None and rep.phase is RepairPhase.STOPPED:
        new = replace(rep, reason=why, error=error[:500])
    elif rep is not None and rep.active:
        new = rep.moved(RepairPhase.STOPPED, now, stopped_from=rep.phase.value, reason=why, error=error[:500])
    else:
        new = begin(RepairPhase.STOPPED, now, reason=why, error=error[:500])
    return Step((NodeEvent(r.node, "RepairStopped", f"repair of {r.node} {why}", "Warning"),
                 Notify("repair-stopped", "critical", f"the repair of {r.node} ({r.pool}) {why}. Fix it, then "
                        f"`gpufleet return {r.node}` (or `gpufleet retire {r.node}`).")),
                replace(r, repair=new.noted(RepairEvent(rep.step if rep else "start", "error", now, error))))


# --- the ends -------------------------------------------------------------------------------------------

def back_to_spares(r: Remediation, rep: Repair | None, node: NodeView, now: datetime, why: str,
                   by: str = "") -> Step:
    """Proven (or a person said so): the check is noted on the node for its boot, the fault condition
    cleared, the node a spare again. Repaired in place, its remediation waiting for a spare takes it."""
    job = (rep.job if rep and rep.job else "") or f"a person ({by})"
    moved = rep.moved(RepairPhase.RETURNED, now, reason=why, step="") if rep else \
        begin(RepairPhase.RETURNED, now, reason=why)
    took = (now - r.created).total_seconds()
    return Step((RecordCheck(r.node, passed_record(node, job, now, why)),
                 MarkHealthy(r.node, f"gpufleet: {why}"),
                 ReturnToSpares(r.node, r.pool),
                 NodeEvent(r.node, "NodeReturned", f"{r.node} is back among the spares of {r.pool} {took:.0f}s after "
                           f"its fault: {why}")),
                replace(r, repair=moved.noted(RepairEvent("return", "ok", now, why))))


def retire(r: Remediation, rep: Repair | None, now: datetime, why: str, by: str = "") -> Step:
    """Out for good: the provider retires it (and asks for a node when nothing replaced it yet), a page."""
    refilled = any(i.startswith("capacity:") for i in r.intents)
    moved = rep.moved(RepairPhase.RETIRED, now, reason=why, step="") if rep else \
        begin(RepairPhase.RETIRED, now, reason=why)
    moved = moved.noted(RepairEvent("retire", "ok", now, why))
    history = "; ".join(f"{e.step} {e.outcome}" for e in moved.history if e.step != "retire")
    actions: tuple[Action, ...] = (
        Retire(r.node, r.pool, why, None if refilled else f"{r.name}/retire"),
        NodeEvent(r.node, "NodeRetired", f"{r.node} retired: {why}", "Warning"),
    )
    if not by:
        actions += (Notify("retired", "critical",
                           f"{r.node} ({r.pool}) is retired: {why}. Repair history: {history or 'none'}. Send it to the "
                           "vendor (RMA); gpufleet will not return it (`gpufleet return` once it is repaired)."),)
    return Step(actions, replace(r, repair=moved))


def lemon_reason(r: Remediation, faults: list[Remediation], spec: FleetSpec) -> str:
    rs = spec.healing.repair
    days = rs.retire_window_seconds / 86400
    what = ", ".join(f"{x.created:%Y-%m-%d %H:%M} {describe(x.xid, x.kind)}" + (f" on {fault_gpus(x)[0]}" if fault_gpus(x) else "")
                     for x in faults)
    gpus: dict[str, int] = {}
    for x in faults:
        for g in fault_gpus(x):
            gpus[g] = gpus.get(g, 0) + 1
    worst = max(gpus.items(), key=lambda kv: kv[1]) if gpus else None
    blame = f"; GPU {worst[0]} faulted {worst[1]} of those times" if worst and worst[1] > 1 else ""
    return (f"a lemon: {len(faults)} faults within {days:g} days (retire_after_faults {rs.retire_after_faults}): "
            f"{what}{blame}")
