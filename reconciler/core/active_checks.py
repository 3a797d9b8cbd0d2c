"""Active checks of idle capacity: the health check run again, at the pool's period, on what waits. Pure.

A pool that declares `active_checks` (fleetspec/active_checks.py) has its nodes checked again once their last
passed check is older than the period: the same Job, image and floors as validation before service
(`core/validation.py`, `adapters/health_checks.py`), never while a job runs, never more than `max_at_once` of the
pool at a time, and never a node a waiting job could have (a check never delays a job).

An active node is taken from Slurm the way Slurm's own maintenance is done: a reservation of that node with
`Flags=MAINT`, made now. slurmctld makes it only if no job runs there: without `IGNORE_JOBS` a reservation
of nodes that run jobs is refused ("IGNORE_JOBS: Ignore currently running jobs when creating the reservation";
Slurm 26.05's scontrol man page, "RESERVATIONS - SPECIFICATIONS FOR CREATE, UPDATE, AND DELETE COMMANDS",
https://slurm.schedmd.com/scontrol.html#OPT_IGNORE_JOBS; the reservations guide,
https://slurm.schedmd.com/reservations.html), and while it stands no new job starts there. Its duration is the
check's deadline and some, so Slurm ends it by itself if the reconciler never comes back. The node's NodeSet pods,
which hold its GPUs, leave under the check taint (as they leave a lent node); the check's Job takes the GPUs.

The reservation is the record of a check under way: its name carries the node and when it was made, and the Job's
name follows from it, so a reconciler killed at any point finds it and goes on (the Job made, or its verdict read)
or gives the node back. Given back: the taint off and the reservation deleted, at once. A node that fails goes to
the repair loop with what the check said it needs (a remediation named after the check), and is given back to
Slurm only once that remediation holds it. A spare is checked through validation before service: its record set
running makes it unproven until it passes again (`core/validation.py` reads the verdict from there).

    idle, due, a slot ─► reserve (Slurm refuses if a job runs) ─► taint, NodeSet pods leave ─► Job
       ─► passed: record it; give back        ─► failed: record it; remediation; give back once it holds the node
       ─► a job waits and no other idle node is free for it, a job runs there, no verdict in time, someone
          else's now: give back (abandoned)
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.active_checks import ActiveChecks
from gpufleet.fleetspec.faults import FaultAction
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.node_repair import PASSED, RUNNING, HealthCheckRecord

from gpufleet.reconciler.core import slurm_states, validation
from gpufleet.reconciler.core.actions import Action, EvictPods
from gpufleet.reconciler.core.lending import PoolFacts, demand_nodes
from gpufleet.reconciler.core.model import NodeView, Remediation, SlurmNodeView
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_actions import NodeEvent, RecordCheck, StartHealthCheck

PREFIX = "gpufleet-check-"  # every reservation gpufleet makes for a check, and only those
RESERVE_SLACK = timedelta(minutes=10)  # past the Job's deadline: the eviction, the pod's start
RECHECK = 5.0  # seconds between passes while a check is under way
IDLE_RECHECK = 60.0  # nothing under way: when to look for due nodes again
# Slurm's state words of a node already reserved by someone (scontrol's RESERVED and MAINTENANCE flags)
RESERVED_STATES = frozenset({"RESERVED", "MAINTENANCE", "MAINT"})

PASSED_RESULT, FAILED_RESULT, ABANDONED, INCONCLUSIVE = "passed", "failed", "abandoned", "inconclusive"


@dataclass(frozen=True)
class Reservation:
    """One of gpufleet's check reservations, as Slurm lists it."""

    name: str
    nodes: tuple[str, ...] = ()  # Slurm's node names

    @property
    def node(self) -> str:
        """The Kubernetes node it was made for."""
        return self.name[len(PREFIX):].rpartition("-")[0]

    @property
    def made(self) -> datetime:
        return datetime.fromtimestamp(int(self.name.rpartition("-")[2]), tz=timezone.utc)


def reservation_name(node: str, now: datetime) -> str:
    return f"{PREFIX}{node}-{int(now.timestamp())}"


def is_ours(name: str) -> bool:
    head, _, stamp = name[len(PREFIX):].rpartition("-")
    return name.startswith(PREFIX) and bool(head) and stamp.isdigit()


def job_of(r: Reservation) -> str:
    return validation.job_name(r.node, r.name)


# --- actions (the runtime carries them out: adapters/slurm, adapters/kube) --------------------------------------

@dataclass(frozen=True)
class ReserveForCheck(Action):
    """A MAINT reservation of the node's Slurm nodes, starting now: Slurm refuses it while a job runs there."""

    node: str
    reservation: str
    slurm_nodes: tuple[str, ...]
    minutes: int


@dataclass(frozen=True)
class TakeForCheck(Action):
    """The check taint on the node: its NodeSet pods leave (EvictPods follows) and do not come back meanwhile."""

    node: str


@dataclass(frozen=True)
class GiveBackFromCheck(Action):
    """The check taint off (the NodeSet pods come back) and the reservation deleted ('' none): Slurm has it again."""

    node: str
    reservation: str
    why: str


@dataclass(frozen=True)
class ChecksPlan:
    actions: tuple[Action, ...] = ()
    failed: tuple[Remediation, ...] = ()  # nodes that failed: their remediations, to be created
    results: tuple[tuple[str, str], ...] = ()  # (node, passed | failed | abandoned | inconclusive), for the metrics
    under_way: int = 0  # checks running after this plan
    recheck_after: float = IDLE_RECHECK


# --- decisions -------------------------------------------------------------------------------------------------

def last_checked(n: NodeView) -> datetime | None:
    """When the node last passed a check on its current boot (None: never, or not since its reboot)."""
    c = n.check
    return c.at if c is not None and c.state == PASSED and c.boot == n.boot_id else None


def due(n: NodeView, checks: ActiveChecks, now: datetime) -> bool:
    last = last_checked(n)
    return last is None or now - last >= timedelta(seconds=checks.period_seconds)


def slurm_idle(slurm: tuple[SlurmNodeView, ...]) -> bool:
    """Every Slurm node on it is idle in Slurm's own words: no job, no drain, not down, no reservation."""
    return bool(slurm) and all(slurm_states.idle(s.states) and slurm_states.takes_jobs(s.states)
                               and not (s.states & RESERVED_STATES) for s in slurm)


def in_service(n: NodeView, facts: PoolFacts) -> bool:
    return (n.ready and not n.unschedulable and n.fault is None and n.remediation is None and not n.on_loan
            and n.name not in facts.remediated and n.name not in facts.claimed)


def under_way(nodes: Iterable[NodeView], reservations: Iterable[Reservation]) -> set[str]:
    """Nodes a check holds now: an active node reserved or tainted for one, a spare whose check runs."""
    held = {r.node for r in reservations}
    for n in nodes:
        if labels.CHECK_TAINT in n.taints:
            held.add(n.name)
        elif n.is_spare and n.check is not None and n.check.state == RUNNING and n.check.boot == n.boot_id:
            held.add(n.name)
    return held


def lacking(facts: PoolFacts, held: set[str]) -> int:
    """Nodes the jobs waiting for the pool want beyond the idle ones no check holds: the checks to give back now
    (negative: idle nodes to spare, that a check may take)."""
    slurm_on = dict(facts.slurm_on)
    free = sum(1 for n in facts.nodes if n.is_active and n.name not in held and in_service(n, facts)
               and slurm_idle(slurm_on.get(n.name, ())))
    return demand_nodes(facts.pending, max(len(facts.nodes), 1)) - free


def to_start(facts: PoolFacts, checks: ActiveChecks, busy: set[str], spares_too: bool, now: datetime) \
        -> list[NodeView]:
    """The nodes whose check starts now: due, waiting (an idle active node, a serving spare), the longest unchecked
    first, as many as the pool's free slots; idle nodes only beyond those the jobs waiting for the pool want."""
    slots = checks.max_at_once - len(busy)
    if slots <= 0:
        return []
    room = -lacking(facts, busy)  # idle nodes no waiting job needs
    slurm_on = dict(facts.slurm_on)
    candidates = []
    for n in facts.nodes:
        if n.name in busy or not in_service(n, facts) or not due(n, checks, now):
            continue
        if n.is_active and checks.idle_nodes and slurm_idle(slurm_on.get(n.name, ())):
            candidates.append(n)
        elif n.is_spare and checks.spares and spares_too and n.proven:
            candidates.append(n)
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    candidates.sort(key=lambda n: (last_checked(n) or epoch, n.name))
    chosen = []
    for n in candidates:
        if len(chosen) == slots:
            break
        if n.is_active:
            if room <= 0:
                continue
            room -= 1
        chosen.append(n)
    return chosen


def plan_active_checks(facts: PoolFacts, reservations: Iterable[Reservation], verdicts: Mapping[str, validation.Verdict],
                       spec: FleetSpec, now: datetime) -> ChecksPlan:
    """One pool's active checks now. `reservations`: gpufleet's check reservations on the pool's nodes (and any
    whose node is gone); `verdicts`: by Job name, for the checks under way."""
    pool = spec.pool(facts.pool)
    checks = pool.active_checks
    reservations = sorted(reservations, key=lambda r: r.name)
    nodes = {n.name: n for n in facts.nodes}
    slurm_on = dict(facts.slurm_on)
    pods = dict(facts.pods)
    timeout = timedelta(seconds=spec.healing.repair.health_check.timeout_seconds) + validation.SLACK
    # the jobs waiting for the pool want more than the idle nodes no check holds: give back that many, newest first
    want_back = max(0, lacking(facts, under_way(facts.nodes, reservations)))
    give_up = {r.node for r in sorted(reservations, key=lambda r: r.made, reverse=True)[:want_back]}
    actions: list[Action] = []
    failed: list[Remediation] = []
    results: list[tuple[str, str]] = []
    held: set[str] = set()

    def give_back(node: str, reservation: str, why: str, result: str | None) -> None:
        actions.append(GiveBackFromCheck(node, reservation, why))
        if node in nodes:
            actions.append(NodeEvent(node, "ActiveCheckEnded", f"{node} given back to Slurm: {why}",
                                     "Normal" if result in (PASSED_RESULT, None) else "Warning"))
        if result:
            results.append((node, result))

    seen: set[str] = set()
    for r in reservations:
        n = nodes.get(r.node)
        if n is None:  # its node left the pool (or the cluster): the reservation alone goes
            actions.append(GiveBackFromCheck("", r.name, f"node {r.node} is gone"))
            continue
        if r.node in seen:  # a second one for the same node (never made so, but never left behind either)
            give_back(n.name, r.name, "a second check reservation for the node", None)
            continue
        seen.add(r.node)
        job = job_of(r)
        v = verdicts.get(job, validation.Verdict(validation.MISSING))
        check = n.check
        failed_here = check is not None and check.job == job and check.state == "failed"
        if failed_here:  # noted failed: given back once its remediation holds the node
            held_off = all(slurm_states.drained_or_down(s.states) for s in slurm_on.get(n.name, ()))
            if (n.remediation is not None or n.name in facts.remediated or n.unschedulable) and held_off:
                give_back(n.name, r.name, f"its remediation holds it ({check.message})", None)
            else:
                failed.append(failed_node(n, check, r.nodes))
                held.add(n.name)
            continue
        if n.fault is not None or n.remediation is not None or n.name in facts.remediated or not n.ready \
                or n.on_loan or n.role not in (labels.ROLE_ACTIVE,):
            give_back(n.name, r.name, "no longer an idle node in service: the check is abandoned", ABANDONED)
            continue
        jobs_there = [s.name for s in slurm_on.get(n.name, ()) if s.busy]
        if jobs_there:
            give_back(n.name, r.name, f"a job runs on {', '.join(jobs_there)}: the check is abandoned", ABANDONED)
            continue
        if v.state == validation.PASSED:
            actions.append(RecordCheck(n.name, HealthCheckRecord(job, n.boot_id, PASSED, now, v.message)))
            give_back(n.name, r.name, f"passed its active check: {v.message}", PASSED_RESULT)
            continue
        if v.state == "failed":
            record = HealthCheckRecord(job, n.boot_id, "failed", now, v.message, v.action)
            actions += [RecordCheck(n.name, record),
                        NodeEvent(n.name, "ActiveCheckFailed", f"{n.name} failed its active check ({job}): "
                                  f"{v.message}: it goes to the repair loop", "Warning")]
            failed.append(failed_node(n, record, r.nodes))
            results.append((n.name, FAILED_RESULT))
            held.add(n.name)
            continue
        if n.name in give_up:
            give_back(n.name, r.name, "a job waits for the pool: the check is abandoned", ABANDONED)
            continue
        if v.state in (validation.INCONCLUSIVE, validation.UNPROVEN) or now > r.made + timeout:
            why = v.message or f"no verdict within {spec.healing.repair.health_check.timeout_seconds}s"
            give_back(n.name, r.name, f"the active check gave no verdict ({why})", INCONCLUSIVE)
            continue
        held.add(n.name)
        if v.state == validation.MISSING:  # just reserved (or a restart): the NodeSet pods leave, the Job starts
            slurmd = tuple(p.key for p in pods.get(n.name, ()) if p.label(labels.SLINKY_POD_HOSTNAME)
                           and not p.deleting)
            actions.append(TakeForCheck(n.name))
            if slurmd:
                actions.append(EvictPods(n.name, slurmd))
            actions.append(StartHealthCheck(n.name, pool.name, job))
    # A check taint with no reservation behind it (the reservation ended or was deleted by someone): given back.
    for n in facts.nodes:
        if labels.CHECK_TAINT in n.taints and n.name not in seen:
            give_back(n.name, "", "no check reservation holds it", None)

    started = []
    if checks is not None:
        busy = under_way(facts.nodes, reservations) - {n for n, res in results if res != FAILED_RESULT}
        for n in to_start(facts, checks, busy | held, validation.required(spec), now):
            started.append(n.name)
            if n.is_spare:  # validation before service takes it from here (its record running: unproven)
                job = validation.job_name(n.name, f"{n.boot_id}@{now.isoformat()}")
                actions += [RecordCheck(n.name, HealthCheckRecord(job, n.boot_id, RUNNING, now,
                                                                  f"active check: last passed {last_checked(n)}")),
                            StartHealthCheck(n.name, pool.name, job),
                            NodeEvent(n.name, "ActiveCheckStarted", f"spare {n.name} is checked again (active "
                                      f"check, every {checks.period_seconds}s): Job {job}")]
                continue
            r = reservation_name(n.name, now)
            minutes = -(-int((timeout + RESERVE_SLACK).total_seconds()) // 60)
            actions += [ReserveForCheck(n.name, r, tuple(s.name for s in slurm_on[n.name]), minutes),
                        NodeEvent(n.name, "ActiveCheckStarted", f"idle node {n.name} is checked (active check, every "
                                  f"{checks.period_seconds}s) under Slurm reservation {r}")]
    running = len(held) + len(started)
    return ChecksPlan(tuple(actions), tuple(failed), tuple(results), running,
                      RECHECK if running else IDLE_RECHECK)


def plan_strays(reservations: Iterable[Reservation], nodes: frozenset[str]) -> tuple[GiveBackFromCheck, ...]:
    """gpufleet's check reservations whose node is no pool's any more (gone, or moved out): deleted."""
    return tuple(GiveBackFromCheck("", r.name, f"node {r.node} is no pool's node any more")
                 for r in sorted(reservations, key=lambda r: r.name) if r.node not in nodes)


def failed_node(n: NodeView, check: HealthCheckRecord, slurm_nodes: tuple[str, ...] = ()) -> Remediation:
    """An active node that failed its active check, as a remediation: the heal takes it out of service (its Slurm
    nodes, those the check reserved, drained with gpufleet's reason: the NodeSet pods that would name them left for
    the check) and the repair begins at what the check says it needs. Named after the check, so making it again
    finds it made."""
    why = f"failed its active health check ({check.job}): {check.message}"
    needs = next((a for a in FaultAction if a.value == check.action and a.remediates), None)
    return Remediation(
        name=f"{n.name}-check-{int(check.at.timestamp())}", node=n.name, pool=n.pool or "", xid=0, message=why,
        phase=Phase.DETECTED, created=check.at, phase_times=((Phase.DETECTED.value, check.at),), reason=why,
        was_spare=False, action=needs, slurm_nodes=tuple(slurm_nodes),
    )


def oldest_check_age(nodes: Iterable[NodeView], now: datetime) -> float:
    """Seconds since the pool's least recently checked node in service passed a check (inf: one never did on its
    current boot)."""
    ages = [float("inf") if (last := last_checked(n)) is None else (now - last).total_seconds()
            for n in nodes if n.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE)]
    return max(ages, default=0.0)
