"""Diagnostics a repeated application fault asks for, while its node stays in service. Pure.

NVIDIA's catalogue answers a repeat of Xid 13 or 31 on one GPU (for 13, the same GPC/TPC) with RUN_DCGMEUD, its
"Investigatory Action": run the diagnostics (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the
WORKFLOW_XID_13/_31 rows); NVSentinel's health-events analyzer asks for them when the same GPU repeats within
24 h (fleetspec/faults/classify.py). Nothing says the machine is broken, so nothing is taken from the job:

- Draining: its Slurm nodes are drained with gpufleet's reason (core/drains.py), so no new job lands there; the
  job running there runs on to its end (no SIGTERM, no requeue). If it runs longer than
  `healing.faults.repeats.diagnose_wait_seconds`, a person is paged once and the node stays drained: a GPU that
  may be faulty takes no new job, and undraining it would never let the check run on a busy cluster.
- Clearing: once Slurm says idle (no job on any of its Slurm nodes), the node is cordoned and its pods leave (the
  NodeSet pod holds every GPU of the node: components/slinky.py), so the check's Job can have them.
- Checking: the health-check Job the repair loop uses (core/validation.py, adapters/health_checks.py).
- Passed: the fault condition cleared, the node uncordoned; Slurm nodes gpufleet drained are resumed once their
  pods are back, and it serves again. Nothing retired, nothing terminated, no lemon count.
- Failed (or no verdict twice in a row: a hung or lost check is run again once): the remediation becomes a heal
  (Detected: contained, a spare, then the repair loop climbing from what the check says the node needs).
- Unproven (the check could not run what it must: a tool missing from its image): nothing shows the GPU sound, so
  it stays out, cordoned and drained, with one page; a person's `gpufleet mark-healthy` puts it back.

A person's Slurm drain or the opt-out label (on the node or a pod there) holds it where it is until lifted; a
fault that takes the node out, arriving meanwhile, hands it to the heal at once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind, describe
from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.core import slurm_drains
from gpufleet.reconciler.core.actions import Action, Cordon, DeletePods, DrainSlurm, Notify, ResumeSlurm
from gpufleet.reconciler.core.admission import evict
from gpufleet.reconciler.core.diagnosis_stages import Diagnosis, Stage, begin
from gpufleet.reconciler.core.drains import drained_by_gpufleet, drained_by_operator, drained_by_person, set_by, slurm_reason
from gpufleet.reconciler.core.model import JobView, NodeView, PodView, Remediation, SlurmNodeView, Step, StepFacts
from gpufleet.reconciler.core.observe import evictable_views, opted_out_views
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_actions import BackInService, MarkHealthy, NodeEvent, RecordCheck, StartHealthCheck
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.core.slurm_states import ON_NODE_JOB_STATES
from gpufleet.reconciler.core.validation import (
    FAILED, INCONCLUSIVE, MISSING, PASSED, RERUN, SLACK, UNPROVEN, UNPROVEN_HELP, Verdict, job_name, passed_record,
)

RECHECK = 5.0  # seconds between looks while the node clears, is checked or returns
RECHECK_DRAINING = 30.0  # while its job runs on (Slurm is asked, not watched)
RECHECK_HELD = 30.0
RETURN_TIMEOUT = timedelta(minutes=10)  # passed: how long its Slurm nodes' pods are waited for before they are resumed
NO_VERDICT_NEEDS = FaultAction.REBOOT.value  # no verdict at all: the catalogue's most common answer for a node taken out


def what(r: Remediation) -> str:
    """What asked for the diagnosis, for a person: Slurm's own drain (core/slurm_drains.py), else the repeated Xid."""
    if r.kind is Kind.SLURM_DRAIN:
        return slurm_drains.headline(r.message) or describe(r.xid, r.kind)
    return f"{describe(r.xid, r.kind)} repeated on GPU {r.pci or '?'}"


def asked(node: NodeView, spec: FleetSpec) -> bool:
    """Whether a node's fault starts a diagnosis: a `diagnose` fault on an active node of a pool whose health check
    can run (the repair loop's, on). Elsewhere it stays what the node agent said: a notice on the job."""
    f = node.fault
    if f is None or f.needs is not FaultAction.DIAGNOSE or node.role != labels.ROLE_ACTIVE:
        return False
    pools = {p.name: p for p in spec.pools}
    return node.pool in pools and spec.healing.repair.enabled and pools[node.pool].repair.enabled


# --- what a step reads ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DiagnosisNeeds:
    slurm: tuple[str, ...] = ()  # Slurm nodes to ask about, and the jobs on them
    verdict: str = ""  # the health-check Job whose verdict is read


@dataclass(frozen=True)
class DiagnosisFacts:
    node: NodeView | None
    pods: tuple[PodView, ...] = ()  # on the node
    slurm: tuple[SlurmNodeView, ...] = ()
    jobs: tuple[JobView, ...] = ()  # on those Slurm nodes
    slurm_pods: tuple[PodView, ...] = ()  # the pods of the record's Slurm nodes, wherever they are
    verdict: Verdict | None = None


def needs(r: Remediation) -> DiagnosisNeeds:
    d = r.diagnosis
    verdict = d.job if d is not None and d.stage is Stage.CHECKING else ""
    return DiagnosisNeeds(slurm=r.slurm_nodes, verdict=verdict)


# --- one step -------------------------------------------------------------------------------------------

def plan(r: Remediation, facts: DiagnosisFacts, spec: FleetSpec, now: datetime) -> Step:
    """The next step of `r`'s diagnosis (its phase is Diagnosing)."""
    node, d = facts.node, r.diagnosis
    if node is None:
        return Step((), r.moved(Phase.FAILED, now, reason=f"{r.reason}; the node is gone before its diagnosis ended"))
    if d is None:
        names = r.slurm_nodes or slurm_nodes_on(r.node, facts.pods).names
        why = f"{what(r)}: " + ("health check asked (core/slurm_drains.py)" if r.kind is Kind.SLURM_DRAIN
                                 else "diagnostics asked (NVIDIA: RUN_DCGMEUD)")
        return Step((NodeEvent(r.node, "DiagnosticsAsked", f"{why}; {r.node} stays in service: drained in Slurm, "
                               "health-checked once its job ends"),),
                    replace(r, slurm_nodes=names, diagnosis=begin(now, message=why)), recheck_after=0.0)
    if d.stage.over:
        return Step()
    f = node.fault
    if d.stage is not Stage.RETURNING:
        if f is not None and f.needs.remediates:
            return to_heal(r, d, now, f.needs.value, f"{describe(f.xid, f.kind)} came during the diagnosis and needs "
                           f"{f.needs.value}")
        if f is None and not _passed_here(d, node):
            return _cleared(r, d, facts, now)
    slurm = {s.name: s for s in facts.slurm}
    if d.stage is Stage.DRAINING:
        return _draining(r, d, facts, slurm, spec, now)
    if d.stage is Stage.CLEARING:
        return _clearing(r, d, facts, spec, now)
    if d.stage is Stage.CHECKING:
        return _checking(r, d, node, facts, spec, now)
    return _returning(r, d, facts, slurm, now)


def held_by(r: Remediation, facts: DiagnosisFacts, slurm: dict[str, SlurmNodeView], spec: FleetSpec) -> str:
    """Why a person holds the node ('' when no one does): the opt-out label on it or a pod there, or a person's
    drain on one of its Slurm nodes (decided by who set the reason, core/drains.py)."""
    key, node = spec.healing.opt_out_label, facts.node
    if node is not None and (v := node.label(key)) is not None and v.lower() != "false":
        return f"the node carries {key}={v}"
    opted = opted_out_views(facts.pods, key)
    if opted:
        return f"pods {list(opted)} on the node carry {key}"
    held = [slurm[n] for n in r.slurm_nodes if n in slurm and drained_by_person(slurm[n])]
    if held:
        return f"Slurm node {held[0].name} was drained by a person ({held[0].reason!r}{set_by(held[0])})"
    return ""


def _draining(r: Remediation, d: Diagnosis, facts: DiagnosisFacts, slurm: dict[str, SlurmNodeView],
              spec: FleetSpec, now: datetime) -> Step:
    held = held_by(r, facts, slurm, spec)
    if held:
        if held == d.held:
            return Step(recheck_after=RECHECK_HELD)
        return Step((NodeEvent(r.node, "DiagnosticsHeld", f"diagnostics of {r.node} wait: {held}"),),
                    replace(r, diagnosis=replace(d, held=held)), recheck_after=RECHECK_HELD)
    mine = tuple(n for n in r.slurm_nodes if n in slurm and not (drained_by_gpufleet(slurm[n])
                                                                  or drained_by_operator(slurm[n])))
    drains: tuple[Action, ...] = tuple(DrainSlurm(n, slurm_reason(r)) for n in mine)
    drained = tuple(dict.fromkeys(d.drained + mine + _drained_here(r, d, slurm)))
    running = sorted({j.job_id for j in facts.jobs if j.state in ON_NODE_JOB_STATES})
    busy = [n for n in r.slurm_nodes if n in slurm and slurm[n].busy]
    if drains or d.held or drained != d.drained:
        # Noted with the drain: a resume later undoes only what gpufleet drained for this diagnosis.
        return Step(drains, replace(r, diagnosis=replace(d, drained=drained, held="")), recheck_after=RECHECK)
    if running or busy:
        wait = spec.healing.faults.repeats.diagnose_wait_seconds
        waited = (now - d.started).total_seconds()
        if waited >= wait:
            page = Notify("diagnosis-waiting", "warning",
                          f"{r.node} ({r.pool}) is asked for diagnostics ({what(r)}) and has been drained in Slurm "
                          f"for {waited / 3600:.1f} h waiting for "
                          f"job(s) {running or busy} to end. It stays drained (no new job lands on a GPU that may be "
                          f"faulty) and is checked once idle. To check it now, requeue the job(s); to keep it in "
                          f"service unchecked, `gpufleet mark-healthy {r.node}` (the diagnosis ends, its drain undone).")
            if page.once not in r.intents:
                return Step((page,), replace(r, diagnosis=replace(d, message=f"waited {waited:.0f}s for {running or busy}")),
                            recheck_after=RECHECK_DRAINING)
        return Step(recheck_after=RECHECK_DRAINING)
    deadline = now + timedelta(seconds=spec.healing.drain_timeout_seconds)
    why = f"idle in Slurm ({list(r.slurm_nodes) or 'no Slurm node'}): cordoned, its pods leave for the check"
    return Step((Cordon(r.node, slurm_reason(r), r.name), evict(r.node, _as_step(facts))),
                replace(r, diagnosis=d.moved(Stage.CLEARING, now, deadline=deadline, message=why)), recheck_after=RECHECK)


def _as_step(facts: DiagnosisFacts) -> StepFacts:
    return StepFacts(pods=facts.pods)


def _clearing(r: Remediation, d: Diagnosis, facts: DiagnosisFacts, spec: FleetSpec, now: datetime) -> Step:
    left = evictable_views(facts.pods)
    if left and now < (d.deadline or now):
        eviction = evict(r.node, _as_step(facts))
        return Step((eviction,) if eviction.pods else (), recheck_after=RECHECK)
    actions: tuple[Action, ...] = ()
    nodeset = tuple(sorted(p.key for p in left if p.label(labels.SLINKY_POD_HOSTNAME) is not None
                           and p.namespace == spec.slurm.namespace))
    if nodeset:
        # Idle in Slurm, so slurm-operator's PodDisruptionBudget label is stale (decide.end_eviction says why).
        actions = (DeletePods(r.node, nodeset),)
    job = job_name(r.node, f"{r.name}/diagnose")
    timeout = spec.healing.repair.health_check.timeout_seconds
    return Step(actions + (NodeEvent(r.node, "HealthCheckStarted", f"diagnostics: health check {job} on {r.node}"),
                           StartHealthCheck(r.node, r.pool, job)),
                replace(r, diagnosis=d.moved(Stage.CHECKING, now, job=job, deadline=now + timedelta(seconds=timeout) + SLACK,
                                             message=f"health check {job} runs")),
                recheck_after=RECHECK)


def _unproven(r: Remediation, d: Diagnosis, v: Verdict) -> Step:
    """The check ran but could not prove the node (a tool it must run is not in its image): nothing shows the GPU is
    sound, so it stays out (cordoned, drained in Slurm) and a person is paged once; `gpufleet mark-healthy` puts it
    back unproven (the condition cleared ends the diagnosis, `_cleared`)."""
    page = Notify("diagnosis-unproven", "critical",
                  f"{r.node} ({r.pool}) was asked for diagnostics ({what(r)}), but its health check could not prove "
                  f"it ({v.message}). It stays out of service "
                  f"(cordoned, drained in Slurm) until a person decides: `gpufleet mark-healthy {r.node}` puts it back "
                  f"unproven. {UNPROVEN_HELP}")
    if page.once in r.intents:
        return Step(recheck_after=RECHECK_HELD)
    return Step((page,), replace(r, diagnosis=replace(d, message=f"could not be proven: {v.message}")),
                recheck_after=RECHECK_HELD)


def _checking(r: Remediation, d: Diagnosis, node: NodeView, facts: DiagnosisFacts, spec: FleetSpec,
              now: datetime) -> Step:
    v = facts.verdict or Verdict(MISSING)
    if v.state == PASSED:
        why = f"passed its health check ({d.job}): {v.message}".rstrip(": ")
        return Step((RecordCheck(r.node, passed_record(node, d.job, now, why)),
                     MarkHealthy(r.node, f"gpufleet: diagnostics {why}"),
                     BackInService(r.node, r.pool),
                     NodeEvent(r.node, "DiagnosticsPassed", f"{r.node} {why}: back in service")),
                    replace(r, diagnosis=d.moved(Stage.RETURNING, now, deadline=None, message=why)), recheck_after=RECHECK)
    if v.state == FAILED:
        return to_heal(r, d, now, v.action or NO_VERDICT_NEEDS, f"failed its health check ({d.job}): {v.message}")
    if v.state == UNPROVEN:
        return _unproven(r, d, v)
    if v.state == INCONCLUSIVE or (d.deadline is not None and now >= d.deadline):
        why = v.message if v.state == INCONCLUSIVE else "no verdict in time"
        again = job_name(r.node, f"{r.name}/diagnose-again")
        if d.job == again:
            return to_heal(r, d, now, NO_VERDICT_NEEDS, f"the second health check in a row without a verdict ({why})")
        # A hung or lost check proves nothing either way: run again once, then decide (as validation.py does).
        timeout = spec.healing.repair.health_check.timeout_seconds
        return Step((NodeEvent(r.node, "HealthCheckInconclusive", f"diagnostics: health check {d.job} gave no verdict "
                               f"({why}): checked again once, by {again}", "Warning"),
                     StartHealthCheck(r.node, r.pool, again)),
                    replace(r, diagnosis=replace(d, job=again, deadline=now + timedelta(seconds=timeout) + SLACK,
                                                 message=f"{RERUN}{d.job}: {why}")), recheck_after=RECHECK)
    if v.state == MISSING:
        return Step((StartHealthCheck(r.node, r.pool, d.job),), recheck_after=RECHECK)  # noted, not made (a crash)
    return Step(recheck_after=RECHECK)


def _returning(r: Remediation, d: Diagnosis, facts: DiagnosisFacts, slurm: dict[str, SlurmNodeView],
               now: datetime) -> Step:
    """Passed: the Slurm nodes gpufleet drained are resumed once their pods run again (on a node, placed); then
    the remediation is over."""
    placed = {p.label(labels.SLINKY_POD_HOSTNAME) for p in facts.slurm_pods if p.node and p.phase == "Running"
              and not p.deleting}
    waiting = [n for n in d.drained if n in slurm and n not in placed and slurm_pod_known(n, facts)]
    if waiting and now - (d.entered(Stage.RETURNING) or now) < RETURN_TIMEOUT:
        return Step(recheck_after=RECHECK)  # past the timeout: resumed wherever it is (its hardware is not this GPU)
    resumes = tuple(ResumeSlurm(n) for n in _drained_here(r, d, slurm))
    took = (now - r.created).total_seconds()
    return Step(resumes + (Notify("diagnosis-passed", "info",
                                  f"{r.node} ({r.pool}) was diagnosed ({what(r)}): {d.message}; back in service "
                                  f"after {took:.0f}s"),),
                r.moved(Phase.SUCCEEDED, now, reason=f"{r.reason}; diagnosed: {d.message}",
                        diagnosis=d.moved(Stage.PASSED, now)))


def _drained_here(r: Remediation, d: Diagnosis, slurm: dict[str, SlurmNodeView]) -> tuple[str, ...]:
    """The record's Slurm nodes drained by gpufleet for this diagnosis: noted, or drained with this record's name
    in the reason (drained, then the reconciler died before it noted it)."""
    return tuple(n for n in r.slurm_nodes if n in slurm and drained_by_gpufleet(slurm[n])
                 and (n in d.drained or f"[{r.name}]" in slurm[n].reason))


def _passed_here(d: Diagnosis, node: NodeView) -> bool:
    """The check passed and its record is on the node: the condition was cleared by this diagnosis's own step (the
    write after it was lost to a crash), not by someone else."""
    c = node.check
    return d.stage is Stage.CHECKING and c is not None and c.job == d.job and c.state == PASSED


def slurm_pod_known(name: str, facts: DiagnosisFacts) -> bool:
    return any(p.label(labels.SLINKY_POD_HOSTNAME) == name for p in facts.slurm_pods)


def _cleared(r: Remediation, d: Diagnosis, facts: DiagnosisFacts, now: datetime) -> Step:
    """Someone cleared the fault condition (a person's mark-healthy, a new agent): nothing to check. What this
    diagnosis did is undone (the cordon, gpufleet's drains); the node serves on."""
    slurm = {s.name: s for s in facts.slurm}
    undo: tuple[Action, ...] = tuple(ResumeSlurm(n) for n in _drained_here(r, d, slurm))
    if d.stage is not Stage.DRAINING:
        undo += (BackInService(r.node, r.pool),)
    why = "the fault condition was cleared before the check ended: nothing to check"
    return Step(undo + (NodeEvent(r.node, "DiagnosticsCleared", f"{r.node}: {why}"),),
                r.moved(Phase.SUCCEEDED, now, reason=f"{r.reason}; {why}", diagnosis=d.moved(Stage.CLEARED, now, message=why)))


def to_heal(r: Remediation, d: Diagnosis, now: datetime, needs: str, why: str) -> Step:
    """The node is not fit to serve: the remediation becomes a heal (Detected), and the repair after it climbs from
    what `needs` says (core/repair.py fault_needs reads the diagnosis)."""
    return Step((NodeEvent(r.node, "DiagnosticsFailed", f"{r.node} {why}: taken out of service ({needs} needed)",
                           "Warning"),),
                r.moved(Phase.DETECTED, now, reason=f"{r.reason}; diagnosed: {why}; it needs {needs}",
                        diagnosis=d.moved(Stage.FAILED, now, needs=needs, message=why)),
                recheck_after=0.0)
