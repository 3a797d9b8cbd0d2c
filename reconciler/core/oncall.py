"""A person's decisions about what gpufleet holds (issue 23 item 7), carried out whole. Pure.

The on-call commands (`gpufleet release | return | retire | mark-healthy`) write a `PersonRequest` on
the node's remediation (fleetspec/oncall.py). This module plans what it means for that remediation as it
stands; the runtime carries it out with the same executor and Lease as everything else, and the
request's id is noted on the remediation as done, with what was done (or why it was refused).

- release: Held, OptedOut or Escalated move on to Evicting: the node is replaced (a spare takes its
  Slurm node), then repaired. Nothing held: refused, saying so.
- return: a node out of service with nothing of the pool on it is health-checked (repair ->
  Validating); it serves again once the check passes. Its NodeSet pod still there: refused (release it,
  or mark-healthy it).
- retire: retired now (the provider's retire, no page: the person knows).
- mark-healthy: no check. Its Slurm node still runs there (held, opted out, escalated): back in service
  where it is (uncordoned, active, gpufleet's own drains lifted, the requeued jobs released), the heal
  ended Succeeded. Else among the spares. Either way the fault condition is cleared and the record ends.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.oncall import MARK_HEALTHY, RELEASE, RETIRE, PersonRequest

from gpufleet.reconciler.core.actions import Action, ReleaseJobs, ResumeSlurm, ReturnToSpares
from gpufleet.reconciler.core.admission import evict
from gpufleet.reconciler.core.drains import drained_by_gpufleet
from gpufleet.reconciler.core.model import NodeView, Remediation, SlurmNodeView, Step, StepFacts
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import RepairFacts, back_to_spares, pool_leftovers, retire
from gpufleet.reconciler.core.repair_actions import BackInService, MarkHealthy, NodeEvent, StartHealthCheck
from gpufleet.reconciler.core.repair_phases import RepairEvent, RepairPhase, begin
from gpufleet.reconciler.core.validation import SLACK, job_name

CONTAINED_NOT_REPLACED = frozenset({Phase.HELD, Phase.OPTED_OUT, Phase.ESCALATED})


def pending(r: Remediation) -> PersonRequest | None:
    """The person's request not carried out yet."""
    return r.request if r.request is not None and r.request.id not in r.requests_done else None


def _done(r: Remediation, req: PersonRequest, what: str) -> Remediation:
    note = f"{req.action} by {req.by}" + (f" ({req.reason})" if req.reason else "") + f": {what}"
    return replace(r, requests_done=r.requests_done + (req.id,), reason=f"{r.reason}; {note}" if r.reason else note)


def _refused(r: Remediation, req: PersonRequest, why: str) -> Step:
    return Step((NodeEvent(r.node, "RequestRefused", f"{req.action} by {req.by} refused: {why}", "Warning"),),
                _done(r, req, f"refused: {why}"))


def plan_live(r: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step | None:
    """A request on a remediation whose heal is under way (facts: its pods and its Slurm nodes)."""
    req = pending(r)
    if req is None:
        return None
    if r.phase not in CONTAINED_NOT_REPLACED:
        return _refused(r, req, f"its heal is under way ({r.phase.value}); ask again once it is over")
    if req.action == RELEASE:
        return _release(r, req, facts, spec, now)
    if req.action == MARK_HEALTHY:
        return _in_service(r, req, facts.slurm, now)
    if req.action == RETIRE:
        return _refused(r, req, f"{r.node} still runs its Slurm node; release it first (a spare takes its place)")
    return _refused(r, req, f"{r.node} still runs its Slurm node; release it, or mark-healthy it")


def plan_ended(r: Remediation, facts: RepairFacts, spec: FleetSpec, now: datetime) -> Step | None:
    """A request on a remediation whose heal is over (facts: as the repair loop sees the node)."""
    req = pending(r)
    if req is None:
        return None
    node, rep = facts.node, r.repair
    if node is None:
        return _refused(r, req, f"node {r.node} is gone")
    left = pool_leftovers(r, facts)
    if req.action == RELEASE:
        if r.phase is Phase.ESCALATED:
            heal = StepFacts(pods=facts.pods)
            return _release(r, req, heal, spec, now)
        return _refused(r, req, f"nothing holds it: its heal ended {r.phase.value}")
    if req.action == MARK_HEALTHY:
        if left and r.phase is Phase.ESCALATED:
            return _in_service(r, req, facts.slurm, now)
        if left:
            return _refused(r, req, left)
        if rep is not None and rep.phase is RepairPhase.RETURNED:
            return Step((), _done(r, req, "among the spares already"))
        step = back_to_spares(r, rep, node, now, f"marked healthy by {req.by} (no check)", by=req.by)
        return replace(step, remediation=_done(step.remediation, req, "back among the spares, unchecked"))
    if req.action == RETIRE:
        if rep is not None and rep.phase is RepairPhase.RETIRED:
            return Step((), _done(r, req, "retired already"))
        step = retire(r, rep, now, f"retired by {req.by}" + (f": {req.reason}" if req.reason else ""), by=req.by)
        return replace(step, remediation=_done(step.remediation, req, "retired"))
    # return
    if left:
        return _refused(r, req, f"{left}; release it (a spare takes its place) or mark-healthy it")
    if rep is not None and rep.phase is RepairPhase.RETURNED:
        return Step((), _done(r, req, "among the spares already"))
    if rep is not None and rep.phase is RepairPhase.VALIDATING:
        return Step((), _done(r, req, f"its health check {rep.job} runs already"))
    attempt = (rep.attempt if rep else 0) + 1
    job = job_name(r.node, f"{r.name}/{attempt}")
    why = f"returned by {req.by}: checked before it serves"
    fields = dict(step="validate", attempt=attempt, job=job, request="", reason=why, error="",
                  deadline=now + timedelta(seconds=spec.healing.repair.health_check.timeout_seconds) + SLACK)
    new = rep.moved(RepairPhase.VALIDATING, now, **fields) if rep else begin(RepairPhase.VALIDATING, now, **fields)
    new = new.noted(RepairEvent("return", "asked", now, why))
    return Step((NodeEvent(r.node, "HealthCheckStarted", f"{why}; health check {job}"),
                 StartHealthCheck(r.node, r.pool, job)),
                _done(replace(r, repair=new), req, f"health check {job} started"))


def _release(r: Remediation, req: PersonRequest, facts: StepFacts, spec: FleetSpec, now: datetime) -> Step:
    """Past the gate: evicted, then replaced (and, once replaced, repaired)."""
    deadline = now + timedelta(seconds=spec.healing.drain_timeout_seconds)
    moved = r.moved(Phase.EVICTING, now, drain_deadline=deadline, held_message="", held_reason="")
    was = r.phase.value
    return Step((evict(r.node, facts),
                 NodeEvent(r.node, "Released", f"{r.node} released by {req.by} ({was}): it is replaced, then repaired")),
                _done(moved, req, f"released from {was}: replaced, then repaired"))


def _in_service(r: Remediation, req: PersonRequest, slurm: tuple[SlurmNodeView, ...], now: datetime) -> Step:
    """Its Slurm node still runs there: back to work where it is, gpufleet's drains lifted, jobs released."""
    ours = tuple(ResumeSlurm(s.name) for s in slurm if drained_by_gpufleet(s) and s.name not in r.kept_drains)
    actions: tuple[Action, ...] = (BackInService(r.node, r.pool),
                                   MarkHealthy(r.node, f"gpufleet: marked healthy by {req.by}")) + ours
    if r.jobs:
        actions += (ReleaseJobs(r.jobs),)
    actions += (NodeEvent(r.node, "BackInService", f"{r.node} marked healthy by {req.by}: back in service where it "
                          f"is; Slurm node(s) {[a.node for a in ours]} resumed"),)
    moved = r.moved(Phase.SUCCEEDED, now, held_message="", held_reason="")
    if r.repair is not None and r.repair.active:
        moved = replace(moved, repair=r.repair.moved(RepairPhase.RETURNED, now, reason=f"marked healthy by {req.by}")
                        .noted(RepairEvent(MARK_HEALTHY, "ok", now, f"by {req.by}")))
    return Step(actions, _done(moved, req, "back in service where it is (no check)"))


def orphan_marked_healthy(node: NodeView, leftovers: str) -> tuple[Action, ...]:
    """A quarantined node with no remediation left that a person marked healthy (the condition alone, as
    `gpufleet mark-healthy` wrote it before issue 23): among the spares, once nothing of the pool runs there."""
    if leftovers or node.pool is None:
        return ()
    return (ReturnToSpares(node.name, node.pool),
            NodeEvent(node.name, "NodeReturned", f"{node.name} marked healthy by a person: back among the spares"))
