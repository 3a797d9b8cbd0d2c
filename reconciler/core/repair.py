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

A machine that does not answer (not Ready for `healing.node_lost_after_seconds`: core/node_lost.py) gets only
the rungs something can still carry out there: a reboot where its provider power-cycles it (aws-asg, through EC2),
never a GPU reset nor a reboot asked of its node agent (kubernetes-spares), which nothing would act on; with none
left it is retired at once. A power cycle that does not bring it back Ready within the rung's timeout climbs to
retirement as any reboot that gives no sign.

A check that gives no verdict (its Job outlived its deadline, or its pod ended without a report) is
inconclusive, not failed: it runs once more on a fresh pod, and a second one without a verdict is a failed
check. A check that could not prove the node (a required tool not in its image) stops the repair for a person.

A fault that asks for a person (`contact-support`: NVIDIA's CONTACT_SUPPORT, its unused codes,
CHECK_MECHANICALS, UPDATE_SWFW, and the escalation rules of fleetspec/faults/escalation.py) is neither
repaired nor retired: the node stays quarantined (the provider keeps the machine, whatever `on_fault`
says) and a vendor-case page carries what the vendor asks for; a person's `gpufleet return` or `retire`
goes on from there. A fault a spec says needs `replace` retires at once; so does a lemon: a node whose
faults within `retire_window_seconds` reach `retire_after_faults` (application faults never count: a
crashing job is not a failing machine). A node that faults again within `min_healthy_seconds`
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

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind, describe
from gpufleet.fleetspec.faults.catalogue import application
from gpufleet.fleetspec.faults.escalation import RULES, Escalation, RepeatRule, Seen, escalate
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.node_repair import RepairRequest
from gpufleet.fleetspec.repair import REBOOT, REPLACE, RESET_GPU, RUNGS

from gpufleet.reconciler.core import node_lost, pages
from gpufleet.reconciler.core.actions import Action, Notify, ReturnToSpares
from gpufleet.reconciler.core import refills
from gpufleet.reconciler.core.diagnosis_stages import Stage
from gpufleet.reconciler.core.drains import drained_by_person, set_by
from gpufleet.reconciler.core.model import NodeView, PodView, Refill, RefillState, Remediation, SlurmNodeView, Step
from gpufleet.reconciler.core.observe import opted_out_views
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_actions import (
    ForgetNode, MarkHealthy, NodeEvent, RecordCheck, RequestRepair, Retire, StartHealthCheck,
)
from gpufleet.reconciler.core.repair_phases import UNDER_WAY, Repair, RepairEvent, RepairPhase, begin
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.core.validation import (
    INCONCLUSIVE, MISSING, PASSED, SLACK, UNPROVEN, UNPROVEN_HELP, Verdict, job_name, passed_record,
)

RECHECK = 5.0  # seconds between looks while a step is under way (the node's and its pods' changes wake it sooner)
RECHECK_STOPPED = 30.0
RECHECK_WAITING = 30.0  # seconds between looks while over the cap on concurrent repairs (an ending repair frees one)
RESEND_AFTER = 0.5  # of a step's timeout: with no sign of the request by then, it is asked again (once)
RUNG_EVENTS = {RESET_GPU: "GpuResetRequested", REBOOT: "RebootRequested"}


# --- what a step reads ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RepairNeeds:
    pods: bool = True  # the node's pods: the pool's NodeSet pods gone? the opt-out label?
    slurm: tuple[str, ...] = ()  # Slurm nodes to ask about (where Slurm says they run; a person's drain)
    verdict: str = ""  # the health-check Job whose verdict is read
    slots: bool = False  # the fleet's repairs under way and waiting (the caps on concurrent repairs)


@dataclass(frozen=True)
class RepairSlot:
    """A repair that holds one of the caps' slots (Repairing, Validating) or waits for one (Waiting)."""

    pool: str
    name: str  # its remediation's
    phase: RepairPhase
    since: datetime  # when the repair began (a waiting one: when it began to wait)


@dataclass(frozen=True)
class RepairFacts:
    node: NodeView | None
    pods: tuple[PodView, ...] = ()
    slurm: tuple[SlurmNodeView, ...] = ()
    verdict: Verdict | None = None
    history: tuple[Remediation, ...] = ()  # every remediation of the node (this one included), any phase
    promotions: tuple[datetime, ...] = ()  # when the node was promoted as a spare (other remediations chose it)
    repairs: tuple[RepairSlot, ...] = ()  # the fleet's repairs under way or waiting (RepairNeeds.slots)


def repair_needs(r: Remediation) -> RepairNeeds:
    rep = r.repair
    verdict = rep.job if rep is not None and rep.phase is RepairPhase.VALIDATING else ""
    return RepairNeeds(slurm=r.slurm_nodes, verdict=verdict, slots=rep is None or rep.phase is RepairPhase.WAITING)


def repair_slot(r: Remediation) -> RepairSlot | None:
    """What `r`'s repair counts for the caps (None: nothing: not begun, held by a person, or over)."""
    rep = r.repair
    if rep is None or (rep.phase not in UNDER_WAY and rep.phase is not RepairPhase.WAITING):
        return None
    return RepairSlot(r.pool, r.name, rep.phase, rep.started)


# --- the fault, as the repair reads it ------------------------------------------------------------------

def first_step(action: str | None) -> str:
    """The repair's first rung for a fault's action (the fault catalogue's: none, restart-app, reset-gpu,
    reboot, replace): reset-gpu, reboot or replace as given; anything else, or none known, a reboot (the
    catalogue's most common answer for a node taken out of service)."""
    return action if action in (RESET_GPU, REBOOT, REPLACE) else REBOOT


def fault_action(r: Remediation) -> FaultAction | None:
    """The action the record's fault needs now: a diagnosis that failed says what the check (or the fault that came
    during it) found the node needs (core/diagnosis.py); otherwise the record's own (spec.fault.action)."""
    if r.diagnosis is not None and r.diagnosis.needs:
        try:
            return FaultAction(r.diagnosis.needs)
        except ValueError:
            return None
    return r.action


def fault_needs(r: Remediation) -> str:
    """What the remediation's fault needs: the action its record keeps (spec.fault.action; a record from
    before faults carried one has none, and first_step(None) is a reboot)."""
    action = fault_action(r)
    return first_step(action.value if action is not None else None)


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
    return pool.repair.in_place and need != REPLACE and not held_for_a_person(r) and any(
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


def held_for_a_person(r: Remediation) -> bool:
    """The fault asks for a person, not a repair: NVIDIA's CONTACT_SUPPORT and the buckets like it."""
    return fault_action(r) is FaultAction.CONTACT_SUPPORT


HISTORY_RULES = tuple(x for x in RULES if isinstance(x, RepeatRule))  # what the records can tell (no registers)


def escalated_by_history(r: Remediation, history: tuple[Remediation, ...]) -> Escalation | None:
    """The escalation rules that count (fleetspec/faults/escalation.py: a repeated Xid 48, five fatal Xids on one
    GPU within 24 h) applied to the node's records of the same GPU: they outlive the reboot that empties the
    kernel log the agent judged. Only an escalation to a person counts here."""
    if not r.pci or r.kind is not Kind.XID or r.action is None:
        return None
    before = [Seen(x.xid, x.created.timestamp(), x.action or FaultAction.NONE) for x in history
              if x.name != r.name and x.pci == r.pci and x.kind is Kind.XID and x.created <= r.created]
    esc = escalate(Seen(r.xid, r.created.timestamp(), r.action), before, HISTORY_RULES)
    return esc if esc is not None and esc.action is FaultAction.CONTACT_SUPPORT else None


def will_repair(r: Remediation, spec: FleetSpec) -> bool:
    """Whether a node quarantined by this remediation's heal is kept (a provider keeps such an instance
    instead of letting it go at once): it is repaired next, or held for a person, whose vendor wants the
    machine as it failed (never terminated, whatever the pool's `on_fault` says)."""
    if held_for_a_person(r):
        return True
    return loop_on(r, spec) and fault_needs(r) != REPLACE and any(
        spec.pool(r.pool).repair.allows(x) for x in RUNGS[RUNGS.index(fault_needs(r)):])


# --- the lemon rule and relapses ----------------------------------------------------------------------

def counts_as_fault(x: Remediation) -> bool:
    """Whether a remediation counts toward the lemon rule: not an application fault (NVIDIA's catalogue puts
    13, 31, 43, 45, 94, ... on the application; a record from before this rule may say `replace` for a
    repeated 13), nor a diagnostic asked, unless the check failed."""
    if x.diagnosis is not None:
        return x.diagnosis.stage is Stage.FAILED  # the check found the hardware at fault (or another fault came)
    return not application(x.kind, x.xid) and x.action not in (FaultAction.RESTART_APP, FaultAction.DIAGNOSE)


def faults_in_window(r: Remediation, history: tuple[Remediation, ...], spec: FleetSpec,
                     now: datetime) -> list[Remediation]:
    window = timedelta(seconds=spec.healing.repair.retire_window_seconds)
    seen = {x.name: x for x in history if now - x.created <= window and counts_as_fault(x)}
    if counts_as_fault(r):
        seen[r.name] = r
    return sorted(seen.values(), key=lambda x: x.created)


def relapse(r: Remediation, facts: RepairFacts, spec: FleetSpec) -> tuple[str, str] | None:
    """(the rung that fixed it last time, why: the event's message, which `relapsed` heads) when the node faulted within `min_healthy_seconds` of serving
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
    return rung, (f"{prev.name}'s repair ({rung or 'a health check'}) held {lasted:.0f}s after the node "
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
        # The node is gone (deleted, its instance terminated): nothing left to repair, but a live repair ends
        # with a record and a page, and the provider settles what it kept for it.
        return node_gone(r, now) if rep is not None and rep.active else Step()
    stop = stop_reason(r, facts, spec)
    if rep is None or rep.phase is RepairPhase.WAITING:
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
    if r.phase is Phase.ESCALATED:
        # The attempt cap held it for a person, and paged them (gpufleet release | return | retire |
        # mark-healthy): one decision, one page. A lemon or a vendor case is never escalated
        # (admission.repair_decides).
        return Step()
    esc = escalated_by_history(r, facts.history)
    if held_for_a_person(r) or esc is not None:
        return vendor_case(r, node, now, esc)  # before the lemon rule: the vendor wants the machine, not a retirement
    faults = faults_in_window(r, facts.history, spec, now)
    limit = spec.healing.repair.retire_after_faults
    if len(faults) >= limit:
        return retire(r, None, now, lemon_reason(r, faults, spec))
    need = fault_needs(r)
    if need == REPLACE:
        return retire(r, None, now, f"{describe(r.xid, r.kind)} needs the vendor (action {REPLACE}): nothing to repair")
    if r.phase is not Phase.WAITING_FOR_SPARE and pool_leftovers(r, facts):
        return Step(recheck_after=RECHECK)  # its NodeSet pod is still leaving (the heal's eviction)
    floor, why = need, f"{describe(r.xid, r.kind)} needs {need}"
    back = relapse(r, facts, spec)
    if back is not None:
        rung, held = back
        why = f"relapsed: {held}"
        floor = _above(rung) if rung in RUNGS else floor
    step = _first_step(r, node, spec, now, floor, why, stop, facts)
    if back is None or step.remediation is None or step.remediation.repair is None:
        return step
    rep = step.remediation.repair  # the relapse heads the new repair's history (and counts in the metrics)
    if any(e.outcome == "relapsed" for e in rep.history):
        return step  # noted when it began to wait
    rep = replace(rep, history=(RepairEvent("relapse", "relapsed", now, back[1]),) + rep.history)
    return replace(step, remediation=replace(step.remediation, repair=rep))


def _first_step(r: Remediation, node: NodeView, spec: FleetSpec, now: datetime, floor: str | None, why: str,
                stop: str, facts: RepairFacts) -> Step:
    if floor is None:
        return retire(r, None, now, why + "; a reboot did not hold either")
    in_place = r.phase is Phase.WAITING_FOR_SPARE
    waiting = r.repair if r.repair is not None and r.repair.phase is RepairPhase.WAITING else None
    if stop:
        held = f"stopped before it began: {stop}"
        first = waiting.moved(RepairPhase.STOPPED, now, reason=held, stopped_from=waiting.phase.value) if waiting \
            else begin(RepairPhase.STOPPED, now, reason=held, in_place=in_place)
        return Step((NodeEvent(r.node, "RepairStopped", f"repair of {r.node} held: {stop}"),), replace(r, repair=first))
    rung = _first_allowed(spec, r.pool, floor)
    if rung is None:
        return retire(r, None, now, f"{why}; pool {r.pool} allows {spec.pool(r.pool).repair.actions or 'no rung'}")
    rung, cannot = _reachable(r, rung, node, spec, now)
    if rung is None:
        return retire(r, waiting, now, f"{why}; {cannot}: no repair reaches it")
    if cannot:
        why = f"{why}; {cannot}: a {rung} instead"
    full = over_cap(r, facts.repairs, spec, now)
    if full:
        return _wait(r, waiting, now, f"waits its turn: {full}", in_place)
    return _begin_rung(r, waiting, rung, node, spec, now, why, in_place=in_place)


def over_cap(r: Remediation, repairs: tuple[RepairSlot, ...], spec: FleetSpec, now: datetime) -> str:
    """Why `r`'s repair may not begin now ('' when it may): the pool's cap on concurrent repairs is taken by
    repairs under way and the pool's repairs that waited longer (first come, first repaired), or the fleet's
    by repairs under way."""
    mine = r.repair.started if r.repair is not None and r.repair.phase is RepairPhase.WAITING else now
    others = [x for x in repairs if x.name != r.name]
    busy = [x for x in others if x.phase in UNDER_WAY]
    pool_cap, fleet_cap = spec.pool(r.pool).repair.max_concurrent, spec.healing.repair.max_concurrent
    in_pool = sum(1 for x in busy if x.pool == r.pool)
    ahead = sum(1 for x in others if x.pool == r.pool and x.phase is RepairPhase.WAITING
                and (x.since, x.name) < (mine, r.name))
    if in_pool + ahead >= pool_cap:
        return (f"{in_pool} repair(s) of pool {r.pool} under way and {ahead} waiting before it "
                f"(pool {r.pool}'s repair.max_concurrent {pool_cap})")
    if len(busy) >= fleet_cap:
        return f"{len(busy)} repairs under way in the fleet (healing.repair.max_concurrent {fleet_cap})"
    return ""


def _wait(r: Remediation, waiting: Repair | None, now: datetime, why: str, in_place: bool) -> Step:
    """Over a cap: the record says so (Waiting, and why), and the repair looks again; nothing is asked."""
    if waiting is not None:
        if waiting.reason == why:
            return Step(recheck_after=RECHECK_WAITING)
        return Step((), replace(r, repair=replace(waiting, reason=why)), recheck_after=RECHECK_WAITING)
    new = begin(RepairPhase.WAITING, now, reason=why, in_place=in_place).noted(RepairEvent("wait", "waiting", now, why))
    return Step((NodeEvent(r.node, "RepairWaiting", f"repair of {r.node} {why}"),), replace(r, repair=new),
                recheck_after=RECHECK_WAITING)


def _reachable(r: Remediation, rung: str, node: NodeView, spec: FleetSpec, now: datetime) -> tuple[str | None, str]:
    """The rung to ask of `node`: `rung`, or on a machine that does not answer the next one the pool allows that
    can still be carried out there (node_lost.cannot_reach: a reboot through a provider that power-cycles it);
    None when none can, and then the machine is retired at once rather than waited on for a rung's timeout (Cluster
    API's MachineHealthCheck remediates a Machine whose node's Ready condition stays Unknown or False past its
    timeout by replacing it; a reboot first only where an external remediation can power-cycle it, as Metal3's
    reboot remediation does through the BMC: cluster-api.sigs.k8s.io, "Configure a MachineHealthCheck").
    The second value says why it is not `rung` ('' when it is)."""
    pool = spec.pool(r.pool)
    why = node_lost.cannot_reach(rung, node, pool, spec, now)
    if not why:
        return rung, ""
    later = (x for x in RUNGS[RUNGS.index(rung) + 1:] if pool.repair.allows(x))
    return next((x for x in later if not node_lost.cannot_reach(x, node, pool, spec, now)), None), why


def _above(rung: str) -> str | None:
    i = RUNGS.index(rung) + 1
    return RUNGS[i] if i < len(RUNGS) else None


def _first_allowed(spec: FleetSpec, pool: str, floor: str) -> str | None:
    """The mildest rung the pool allows, no milder than `floor`."""
    if floor not in RUNGS:
        return None
    return next((x for x in RUNGS[RUNGS.index(floor):] if spec.pool(pool).repair.allows(x)), None)


def _begin_rung(r: Remediation, rep: Repair | None, rung: str, node: NodeView, spec: FleetSpec, now: datetime,
                why: str, in_place: bool = False, again: bool = False) -> Step:
    """Ask for a reset or a reboot: the request's id is written on the remediation, then it is sent."""
    attempt = (rep.attempt if rep else 0) + 1
    request = RepairRequest(f"{r.name}/{attempt}-{rung}", rung, now, fault_gpus(r) if rung == RESET_GPU else ())
    timeout = spec.pool(r.pool).repair.timeout(rung, node.label(labels.INSTANCE_TYPE))
    fields = dict(step=rung, attempt=attempt, request=request.id, requested_at=now, boot=node.boot_id,
                  deadline=now + timedelta(seconds=timeout), job="", reason=why, gpus=request.gpus, resent=again)
    event = RepairEvent(rung, "asked again" if again else "asked", now, why)
    if rep is None:
        new = begin(RepairPhase.REPAIRING, now, in_place=in_place, rungs=(rung,), **fields)
    elif again:
        new = replace(rep, **{k: v for k, v in fields.items() if k not in ("deadline",)})
    else:
        new = rep.moved(RepairPhase.REPAIRING, now, rungs=rep.rungs + (rung,), **fields)
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
        was = f"boot id {rep.boot[:8]} -> {node.boot_id[:8]}" if rep.boot else \
            f"boot id now {node.boot_id[:8]}; the node reported none before the reboot"
        return _begin_check(r, rep, node, spec, now, f"rebooted ({was})")
    if rep.step == REBOOT and result is not None and not result.ok:
        return _climb(r, rep, node, spec, now, f"reboot failed: {result.message}")
    timeout = spec.pool(r.pool).repair.timeout(rep.step, node.label(labels.INSTANCE_TYPE))  # the node's type's
    if rep.deadline is not None and now >= rep.deadline:
        return _climb(r, rep, node, spec, now, f"{rep.step} gave no sign of success within {timeout}s")
    started = rep.requested_at or now
    if not rep.resent and result is None and (now - started).total_seconds() >= \
            RESEND_AFTER * timeout and node.ready and node.boot_id == rep.boot:
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
    if v.state == UNPROVEN:
        return stopped_by_error(r, now, f"health check {rep.job} could not prove {r.node} healthy: {v.message}. "
                                f"{UNPROVEN_HELP}")
    if v.state == INCONCLUSIVE or (rep.deadline is not None and now >= rep.deadline):
        why = v.message if v.state == INCONCLUSIVE else \
            f"no verdict within {spec.healing.repair.health_check.timeout_seconds}s"
        return _inconclusive(r, rep, node, spec, now, f"health check {rep.job} gave no verdict ({why})")
    if v.state == MISSING:
        return Step((StartHealthCheck(r.node, r.pool, rep.job),), recheck_after=RECHECK)  # noted, not made (a crash)
    return Step(recheck_after=RECHECK)


def _inconclusive(r: Remediation, rep: Repair, node: NodeView, spec: FleetSpec, now: datetime, why: str) -> Step:
    """A check that gave no verdict (it outlived its deadline, or its pod ended without writing one) says
    nothing about the node: the check may have hung, not the GPU. It runs once more, on a fresh pod (a Job of
    a new name); a second check in a row without a verdict is a failed check, and the ladder goes on."""
    last = rep.history[-1] if rep.history else None
    if last is not None and (last.step, last.outcome) == ("validate", INCONCLUSIVE):
        return _climb(r, rep, node, spec, now, f"{why}, the second check in a row without one (the first: "
                      f"{last.message})")
    attempt = rep.attempt + 1
    job = job_name(r.node, f"{r.name}/{attempt}")
    timeout = spec.healing.repair.health_check.timeout_seconds
    new = replace(rep, attempt=attempt, job=job, deadline=now + timedelta(seconds=timeout) + SLACK,
                  reason=f"{why}: checked again")
    return Step((NodeEvent(r.node, "HealthCheckInconclusive", f"{why}: checked again once, by {job}", "Warning"),
                 StartHealthCheck(r.node, r.pool, job)),
                replace(r, repair=new.noted(RepairEvent("validate", INCONCLUSIVE, now, why))), recheck_after=RECHECK)


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
    rung, cannot = _reachable(r, rung, node, spec, now)
    if rung is None:
        return retire(r, failed, now, f"{why}; {cannot}: no repair reaches it")
    return _begin_rung(r, failed, rung, node, spec, now, f"{why}; {cannot}: a {rung} instead" if cannot else why)


def _resume(r: Remediation, facts: RepairFacts, spec: FleetSpec, now: datetime) -> Step:
    """The person's drain or the opt-out label is gone: the repair goes on where it stopped, and asks for
    nothing already done.
    - Stopped before it began: its first rung is asked for.
    - Stopped while a reset or a reboot was asked for (the request stays on the node, and the node's agent may
      carry it out meanwhile): the node rebooted (a new boot id) or the reset was answered done -> the health
      check; answered failed -> the next rung; not answered, or the reboot answered but not seen yet -> waited
      for under the same request, with its whole timeout from now (asked again once, as any request with no sign
      of it by half its timeout, under a new id: the agent acts on the newest id, once).
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
    why = f"{lifted}: the repair begins ({fault_needs(r)} needed)"
    rung, cannot = _reachable(r, rung, node, spec, now)
    if rung is None:
        return retire(r, rep, now, f"{why}; {cannot}: no repair reaches it")
    return _begin_rung(r, rep, rung, node, spec, now, f"{why}; {cannot}: a {rung} instead" if cannot else why)


def _resume_rung(r: Remediation, rep: Repair, node: NodeView, spec: FleetSpec, now: datetime, lifted: str) -> Step:
    """A hold lifted on a reset or a reboot asked for before it: what became of that request decides."""
    what = "GPU reset" if rep.step == RESET_GPU else "reboot"
    result = node.repair_result if node.repair_result and node.repair_result.id == rep.request else None
    if node.ready and node.boot_id != rep.boot:
        was = f"boot id {rep.boot[:8]} -> {node.boot_id[:8]}" if rep.boot else f"boot id now {node.boot_id[:8]}"
        why = f"{lifted}; the node rebooted while it was held ({was}): no second {what}, the health check is next"
        return _begin_check(r, rep.noted(RepairEvent(rep.step, "ok", now, why)), node, spec, now, why)
    if result is not None and not result.ok:
        return _climb(r, rep, node, spec, now, f"{what} failed while the node was held: {result.message}")
    if result is not None and rep.step == RESET_GPU:
        why = f"{lifted}; the GPU reset asked before it was done ({result.message}): the health check is next"
        return _begin_check(r, rep.noted(RepairEvent(rep.step, "ok", now, why)), node, spec, now, why)
    # Not done, not failed: the request is still on the node (and the agent acts on it whenever it gets to it), or
    # its answer came and the reboot is not seen yet. The step goes on under the same request, with its whole
    # timeout from now; no sign of it by half that since it was asked, and it is asked again once (_repairing).
    timeout = spec.pool(r.pool).repair.timeout(rep.step, node.label(labels.INSTANCE_TYPE))
    seen = "answered, not seen done yet" if result is not None else "not answered yet"
    why = (f"{lifted}; the {what} asked before it ({rep.request}) is {seen}: waited for, up to {timeout}s, and "
           "asked again only if nothing shows it was done")
    new = rep.moved(RepairPhase.REPAIRING, now, deadline=now + timedelta(seconds=timeout), reason=why)
    return Step((NodeEvent(r.node, "RepairResumed", f"repair of {r.node} resumed: {why}"),),
                replace(r, repair=new.noted(RepairEvent(rep.step, "waiting", now, why))), recheck_after=RECHECK)


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
    """Out for good: the provider retires it (and asks for a node when nothing replaced it yet: no refill was
    asked, or the one asked failed), a page. The request is the record's refill from then on, so it is
    settled, read and asked again like any other (`refills.py`)."""
    key = f"{r.name}/retire"
    ask = refills.needs_refill_on_retire(r) and not (r.refill is not None and r.refill.key == key)
    moved = rep.moved(RepairPhase.RETIRED, now, reason=why, step="") if rep else \
        begin(RepairPhase.RETIRED, now, reason=why)
    moved = moved.noted(RepairEvent("retire", "ok", now, why))
    history = "; ".join(f"{e.step} {e.outcome}" for e in moved.history if e.step != "retire")
    if ask:
        attempt = r.refill.attempt + 1 if r.refill is not None else 1
        r = replace(r, refill=Refill(key, RefillState.REQUESTED, now, f"{r.node} retired", attempt))
    actions: tuple[Action, ...] = (
        Retire(r.node, r.pool, why, key if ask else None),
        NodeEvent(r.node, "NodeRetired", f"{r.node} retired: {why}", "Warning"),
    )
    if not by:
        actions += (Notify("retired", "critical",
                           f"{r.node} ({r.pool}) is retired: {why}. Repair history: {history or 'none'}. Send it to the "
                           "vendor (RMA); gpufleet will not return it (`gpufleet return` once it is repaired)."),)
    return Step(actions, replace(r, repair=moved))


def node_gone(r: Remediation, now: datetime) -> Step:
    """The node's Node object disappeared while it was repaired (someone deleted it, or its instance was
    terminated): the repair ends Gone, its provider settles its bookkeeping (and asks for a node when nothing
    replaced it yet), and a person is told once."""
    rep = r.repair
    assert rep is not None and rep.active
    was = rep.step or rep.phase.value
    why = f"its Node object disappeared during the repair ({rep.phase.value}, {was})"
    refilled = any(i.startswith("capacity:") for i in r.intents)
    moved = rep.moved(RepairPhase.GONE, now, reason=why, step="").noted(RepairEvent("gone", "ended", now, why))
    return Step((ForgetNode(r.node, r.pool, why, None if refilled else f"{r.name}/gone"),
                 Notify("node-gone", "warning",
                        f"{r.node} ({r.pool}) {why}: the repair is over, nothing was returned. gpufleet settled its "
                        "provider's bookkeeping (an instance held out of its group for the repair is terminated or "
                        "kept for the vendor, as the pool's on_fault says) and asked for a node if none replaced it. "
                        f"Action needed only if it was not deleted on purpose: find out what removed it "
                        f"(`kubectl describe remediation {r.name}`).")),
                replace(r, repair=moved))


def vendor_case(r: Remediation, node: NodeView, now: datetime, esc: Escalation | None = None) -> Step:
    """Held for a person: quarantined (the provider keeps the machine), a vendor-case page with what the
    vendor asks for, the repair stopped where only a person's command goes on (`gpufleet return` once the
    vendor is done, `gpufleet retire` to let it go). Nothing retired, nothing terminated. `esc`: the
    escalation rule over the node's records that made it a case."""
    rule = esc.nvidia if esc is not None else pages.nvidia_bucket(r)
    why = f"{describe(r.xid, r.kind)} needs a person ({rule}): held, not repaired"
    rep = begin(RepairPhase.STOPPED, now, reason=why, error=f"vendor case: {why}")
    rep = rep.noted(RepairEvent("vendor-case", "held", now, why))
    return Step((NodeEvent(r.node, "VendorCase", f"{r.node} held for a person: {why}", "Warning"),
                 Notify("vendor-case", "critical", pages.vendor_case(r, node, rule))),
                replace(r, repair=rep))


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
