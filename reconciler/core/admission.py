"""Admission: a contained node is replaced now, held (storm brake, max_concurrent), left to a person
(opt-out) or escalated (attempt cap). Pure. Containment never waits for it.

The storm page is one per pool and storm, kept in durable state: the held remediation that sends it
notes it among its intents, and no other of the pool's live remediations sends it again while that one
lives (`Admission.storm_paged`), so a restart pages no one a second time.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Iterable

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.remediation_crd import Reason

from gpufleet.reconciler.core import pages, repair
from gpufleet.reconciler.core.actions import EvictPods, Notify, Quarantine
from gpufleet.reconciler.core.diagnosis_stages import diagnosed_only
from gpufleet.reconciler.core.model import Admission, Gate, NodeView, Remediation, Step, StepFacts, remediation_name
from gpufleet.reconciler.core.observe import evictable_views, opted_out_views
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from gpufleet.reconciler.core.replacements import stand_ins, stood_in_for

STORM_MIN_NODES = 2  # the brake needs at least this many unhealthy nodes in a pool
HELD_RECHECK = 5.0  # seconds between admission checks of a held remediation (capacity frees wake it sooner)
STORM_PAGE = Notify("storm", "critical", "").once  # the intent of the storm page


def _heal(r: Remediation) -> bool:
    """Not a record that only diagnosed its node while it served (core/diagnosis.py)."""
    return r.phase is not Phase.DIAGNOSING and not diagnosed_only(r.diagnosis)


def admission_facts(remediation: Remediation, pool_nodes: Iterable[NodeView], remediations: Iterable[Remediation],
                    spec: FleetSpec, now: datetime) -> Admission:
    """Count what admission weighs. Unhealthy: the pool's nodes out for a fault now (`unhealthy_now`); a spare
    that broke standing in for a faulted node is that node's position again, counted once
    (`replacements.stand_ins`)."""
    policy = spec.healing
    remediations = list(remediations)
    pool_nodes = list(pool_nodes)
    storm = timedelta(seconds=policy.unhealthy_window_seconds)
    pool = remediation.pool
    unhealthy = unhealthy_now(pool, pool_nodes, remediations)
    unhealthy -= stand_ins([r for r in remediations if r.name != remediation.name], pool, storm, now)
    reporters = {n.name: n.fault.reporter for n in pool_nodes if n.name in unhealthy and n.fault}
    reporters |= {r.node: r.reporter for r in remediations if r.node in unhealthy and r.pool == pool and r.reporter}
    attempts = timedelta(seconds=policy.attempts_window_seconds)
    taken = {r.replacement for r in remediations if r.active and r.replacement}
    return Admission(
        pool_size=spec.pool(pool).nodes,
        unhealthy=frozenset(unhealthy),
        in_flight=sum(1 for r in remediations if r.phase.holds_capacity and not r.was_spare and not r.stands_in_for
                      and r.name != remediation.name),
        attempts=sum(1 for r in remediations if r.node == remediation.node and r.name != remediation.name
                     and now - r.created <= attempts and r.phase is not Phase.ESCALATED
                     and _heal(r)),
        storm_paged=any(r.pool == pool and r.active and STORM_PAGE in r.intents for r in remediations),
        stands_in_for=stood_in_for(remediation.node, [r for r in remediations if r.pool == pool], storm, now),
        free_spares=sum(1 for n in pool_nodes if n.is_spare and n.ready and n.fault is None and not n.unschedulable
                        and n.name not in taken),
        reporters=tuple(sorted(reporters.items())),
        repair_decides=repair_decides(remediation, remediations, spec, now),
    )


def unhealthy_now(pool: str, pool_nodes: Iterable[NodeView], remediations: Iterable[Remediation]) -> set[str]:
    """The pool's nodes out of service for a fault now, as Cluster API's MachineHealthCheck counts its targets
    for `maxUnhealthy` (internal/controllers/machinehealthcheck/machinehealthcheck_controller.go,
    `unhealthyMachineCount`: the machines presently unhealthy, not the faults of a past window).

    A node counts while the newest remediation of it is live (contained, replaced, waiting; not a person's
    opt-out, which holds it for a person), and after its heal while it is still out: quarantined or cordoned
    (its repair under way, or a person to look). A repair that returned it (Returned), a person who put it back
    in service, a node retired for the vendor (out of the pool: the provider replaces it) or gone: healthy
    again, or no longer the pool's. An active node whose fault takes it out and that has no remediation for that
    fault yet counts too. Only the pool's declared positions: a spare's own fault is not one of them, nor is a
    spare that broke standing in for a node (that node's position, counted once by the caller).

    NVIDIA NVSentinel's breaker (fault-quarantine/pkg/breaker/breaker.go) counts the distinct nodes it
    cordoned within a sliding window instead; gpufleet does not: a node healed, repaired and returned minutes
    ago is no part of a storm now."""
    views = {n.name: n for n in pool_nodes}
    newest: dict[str, Remediation] = {}
    for r in remediations:
        if r.pool == pool and (r.node not in newest or (r.created, r.name) > (newest[r.node].created, newest[r.node].name)):
            newest[r.node] = r
    out: set[str] = set()
    for node, r in newest.items():
        if r.was_spare or r.stands_in_for or r.phase is Phase.OPTED_OUT or not _heal(r):
            continue  # (a diagnosis leaves its node in service: no storm, unless its check failed)
        if r.active or not _healthy_again(r, views.get(node)):
            out.add(node)
    names = {r.name for r in remediations}
    for n in views.values():
        held = newest.get(n.name)
        if n.is_active and n.fault and n.fault.needs.remediates and remediation_name(n.name, n.fault) not in names \
                and not (held is not None and held.phase is Phase.OPTED_OUT):
            out.add(n.name)
    return out


def _healthy_again(r: Remediation, view: NodeView | None) -> bool:
    """After its heal, whether the node of a finished remediation is back in service (or left the pool)."""
    if view is None or (r.repair is not None and r.repair.phase is RepairPhase.RETURNED):
        return True
    if view.role == labels.ROLE_RETIRED:
        return True
    return view.role != labels.ROLE_QUARANTINED and not view.unschedulable


def repair_decides(remediation: Remediation, remediations: list[Remediation], spec: FleetSpec, now: datetime) -> str:
    """What the repair loop will decide for this node for good once its heal is over ('' when it decides nothing
    yet): a case for the vendor (held for a person), or a lemon (retired). One decision for the node, with its
    one page: the attempt cap does not also escalate it for a person to repair and return."""
    if not repair.loop_on(remediation, spec):
        return ""
    history = tuple(r for r in remediations if r.node == remediation.node)
    if repair.held_for_a_person(remediation) or repair.escalated_by_history(remediation, history) is not None:
        return "a case for the vendor: held for a person, with the vendor's page"
    faults = repair.faults_in_window(remediation, history, spec, now)
    if len(faults) < spec.healing.repair.retire_after_faults:
        return ""
    return f"{repair.lemon_reason(remediation, faults, spec)}: retired, with the vendor's page (RMA)"


def gate(remediation: Remediation, a: Admission, spec: FleetSpec) -> Gate | None:
    policy = spec.healing
    n, size = len(a.unhealthy), a.pool_size
    # One failure is never a storm: without this, a small pool could never heal at all.
    if size and n >= STORM_MIN_NODES and n / size > policy.max_unhealthy_fraction:
        return Gate(Reason.TOO_MANY_UNHEALTHY, remediation.pool,
                    f"{n} of {size} nodes in pool {remediation.pool} unhealthy now (> {policy.max_unhealthy_fraction:.0%}; "
                    f"unhealthy: out for a fault and not healthy again; {size}: the active nodes the pool declares, "
                    f"its spares not counted): faulted nodes are "
                    f"contained (cordoned, drained in Slurm), none is replaced until a human looks; {pages.sources(a)}")
    if a.in_flight >= policy.max_concurrent:
        return Gate(Reason.MAX_CONCURRENT, None,
                    f"{a.in_flight} replacements in progress (max {policy.max_concurrent}): {remediation.node} is "
                    "contained and waits its turn")
    return None


def admit(remediation: Remediation, facts: StepFacts, spec: FleetSpec, now: datetime, once) -> Step:
    """The node is contained; is it replaced now, held, escalated, or left to a person? `once` drops
    the once-only actions the remediation has begun already."""
    policy = spec.healing
    node = remediation.node
    opted = opted_out_views(facts.pods, policy.opt_out_label)
    if opted:
        why = (f"pods {list(opted)} carry the opt-out label {policy.opt_out_label}: "
               f"{node} stays cordoned and drained in Slurm; nothing is replaced")
        return Step(once(remediation, Notify("opted-out", "warning", f"{node}: {why}. Action needed: decide what becomes of {node} and those pods (remediation {remediation.name}).")),
                    remediation.moved(Phase.OPTED_OUT, now, reason=why, held_message="", held_reason=""))
    a = facts.admission
    assert a is not None, "admission facts are gathered for Requeued and Held"
    hold_until = remediation.created + timedelta(seconds=policy.admission_hold_seconds)
    if remediation.phase is Phase.REQUEUED and now < hold_until:
        # A burst arrives over seconds: weighed one fault at a time, its first faults would pass the brake
        # before the rest were seen. Nothing is written: the wait is the remediation's age, so a restart keeps it.
        return Step(recheck_after=(hold_until - now).total_seconds())
    capped = a.attempts >= policy.max_attempts_per_node
    if capped and not a.repair_decides:
        why = (f"{a.attempts + 1} remediations of {node} within {policy.attempts_window_seconds}s "
               f"(max {policy.max_attempts_per_node}): contained and quarantined for a human")
        return Step((Quarantine(node, remediation.xid, remediation.pool),)
                    + once(remediation, Notify("escalated", "critical", pages.escalated(remediation, a, spec))),
                    remediation.moved(Phase.ESCALATED, now, reason=why, held_message="", held_reason=""))
    if a.stands_in_for:
        # It stood in for another remediation's node, which takes another spare: it replaces nothing, takes no
        # slot and is no storm (the position is counted once); its pods go, and it is quarantined.
        return Step((evict(node, facts),), remediation.moved(
            Phase.EVICTING, now, drain_deadline=now + timedelta(seconds=policy.drain_timeout_seconds),
            stands_in_for=a.stands_in_for, held_message="", held_reason=""), carry=True)
    g = gate(remediation, a, spec)
    if g is not None:
        page = once(remediation, Notify("storm", "critical", pages.storm(g.message, remediation.pool))) \
            if g.reason == Reason.TOO_MANY_UNHEALTHY and not a.storm_paged else ()
        if remediation.phase is Phase.HELD:
            if remediation.held_message == g.message and not page:
                return Step(recheck_after=HELD_RECHECK, gate=g)
            return Step(page, replace(remediation, held_message=g.message, held_reason=g.reason),
                        recheck_after=HELD_RECHECK, gate=g)
        return Step(page, remediation.moved(Phase.HELD, now, held_message=g.message, held_reason=g.reason),
                    recheck_after=HELD_RECHECK, gate=g)
    deadline = now + timedelta(seconds=policy.drain_timeout_seconds)
    # At the attempt cap a node the repair loop decides for good (a lemon, a vendor case) is not escalated: that
    # decision, with its one page, is the node's; its job is healed on a spare meanwhile, as any fault's.
    why = (f"{a.attempts + 1} remediations of {node} within {policy.attempts_window_seconds}s (the attempt cap, "
           f"max {policy.max_attempts_per_node}), but {a.repair_decides}: replaced, not escalated"
           if capped else remediation.reason)
    return Step((evict(node, facts),),
                remediation.moved(Phase.EVICTING, now, drain_deadline=deadline, held_message="", held_reason="",
                                  reason=why),
                carry=True)


def evict(node: str, facts: StepFacts) -> EvictPods:
    """The node's pods a drain evicts that are not on their way out already."""
    return EvictPods(node, tuple(p.key for p in evictable_views(facts.pods) if not p.deleting))
