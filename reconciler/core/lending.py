"""Lending idle GPUs to preemptible work, and taking them back. Pure: per pool, from what the
runtime observed, what to do now. Level-based like healing: the same facts give the same answer,
so a missed event or a restart heals itself.

A node's loan, as its labels and taints show it:

    free ──► (idle node: drained in Slurm for lending, until no job runs) ──► lent ──► reclaiming ──► free
                      │ a job or a pending job shows up: undrain, not lent                 (borrowers evicted,
                      ▼                                                                     forced after the grace)
                    free

- Spares lend beyond the declared floor; a spare that a remediation chose is the remediation's to
  take back (`decide.plan_step`), not this module's.
- An idle node lends when each of its Slurm nodes has run no job for `idle_after_seconds`, none is
  drained by anyone else, and no job waits for the pool. Its NodeSet pods leave (they do not
  tolerate the lending taint), so the borrowers get the GPUs.
- Taking back: a pending job that the pool could run reclaims idle loans (as many nodes as it
  lacks); the floor reclaims spares; a spec that lends less reclaims the rest. A node that faults or
  is quarantined ends its loan at once (its borrowers are evicted with everything else).
- A lent machine that stops answering (its node not Ready) is neither reclaimed nor evicted: nothing there
  would carry an eviction out, and a take-back would wait on it for ever. Its loan stands until the node is
  Ready again (a blip: the loan goes on) or the loss is read (core/node_lost.py watches a node on loan): its
  heal then takes it, and the loan ends as lost (counted so) while the heal replaces it and the repair loop
  takes the machine. With healing off, a lost loan ends all the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec, LendingSpec, NodePool

from gpufleet.fleetspec.ledger import Capacity

from gpufleet.reconciler.core.actions import (
    Action, DrainSlurm, EndLoan, EvictBorrowers, EvictPods, Lend, ResumeSlurm, StartReclaim,
)
from gpufleet.reconciler.core import node_lost
from gpufleet.reconciler.core.drains import drained_by_gpufleet, drained_by_person, drained_for_lending, lending_reason
from gpufleet.reconciler.core.model import NodeView, PendingJob, PodView, SlurmNodeView
from gpufleet.reconciler.core.observe import borrower_views, evictable_views
from gpufleet.reconciler.core.validation import serves

RECHECK = 1.0  # seconds between lending passes (each asks Slurm for its nodes and its queue)
RECLAIM_RECHECK = 0.5  # while borrowers are being evicted
# Pending reasons that say the job waits for something other than nodes: taking nodes back would not start it.
NOT_FOR_NODES = frozenset({
    "Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin", "PartitionDown",
    "PartitionInactive", "PartitionTimeLimit", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "Reservation",
    "JobArrayTaskLimit", "FrontEndDown", "BadConstraints",
})


@dataclass(frozen=True)
class PoolFacts:
    """What one lending pass of one pool sees."""

    pool: str
    nodes: tuple[NodeView, ...]  # the pool's Kubernetes nodes
    slurm_on: tuple[tuple[str, tuple[SlurmNodeView, ...]], ...] = ()  # per node: Slurm nodes of the NodeSet pods there
    pods: tuple[tuple[str, tuple[PodView, ...]], ...] = ()  # per node: the pods a drain would evict there
    pending: tuple[PendingJob, ...] = ()  # jobs waiting in a partition this pool serves
    remediated: frozenset[str] = frozenset()  # nodes with a live remediation
    claimed: frozenset[str] = frozenset()  # spares a live remediation chose
    waiting_for_spare: int = 0  # remediations of this pool waiting for a spare


@dataclass(frozen=True)
class LendingPlan:
    actions: tuple[Action, ...] = ()
    recheck_after: float = RECHECK
    capacity: Capacity = Capacity()


def demand_nodes(pending: tuple[PendingJob, ...], size: int) -> int:
    """Nodes the pool's pending jobs ask for (jobs that wait for nodes, and that the pool could hold)."""
    return sum(j.nodes for j in pending
               if not j.held and j.reason not in NOT_FOR_NODES and "Limit" not in j.reason and 0 < j.nodes <= size)


def plan_lending(facts: PoolFacts, spec: FleetSpec, now: datetime) -> LendingPlan:
    pool = spec.pool(facts.pool)
    lending = pool.lending
    slurm_on = dict(facts.slurm_on)
    pods = dict(facts.pods)
    borrowers = {n: borrower_views(p) for n, p in pods.items()}
    actions: list[Action] = []
    recheck = RECHECK

    def out_of_service(n: NodeView) -> bool:
        return (n.fault is not None or n.name in facts.remediated or n.role not in (labels.ROLE_ACTIVE, labels.ROLE_SPARE)
                or not n.ready or n.unschedulable or labels.CHECK_TAINT in n.taints)  # taken for an active check

    def unanswered(n: NodeView) -> bool:
        """A loan whose machine does not answer, that no heal has taken yet: it waits for the loss to be read."""
        return (n.on_loan and not n.ready and n.not_ready_since is not None and n.fault is None
                and n.name not in facts.remediated
                and n.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE)
                and (spec.healing.enabled or not node_lost.lost(n, spec, now)))

    # 1. A loan on a node that faulted or left service ends now; its borrowers go with everything else. One
    # whose machine stopped answering waits for its heal (core/node_lost.py), which ends it as lost.
    for n in facts.nodes:
        if n.on_loan and n.name not in facts.claimed and out_of_service(n) and not unanswered(n):
            actions.append(EndLoan(n.name, back_to_spare=n.is_spare, lost=node_lost.lost(n, spec, now)))
    live = [n for n in facts.nodes if not out_of_service(n) and n.name not in facts.claimed]

    spares = [n for n in live if n.is_spare and serves(n, spec)]  # an unproven spare is checked first, never lent
    active = [n for n in live if n.is_active]
    lent_spares = [n for n in spares if n.on_loan and n.reclaiming is None]
    back_spares = [n for n in spares if n.reclaiming is not None]
    free_spares = [n for n in spares if not n.on_loan]
    lent_idle = [n for n in active if n.on_loan and n.reclaiming is None]
    back_idle = [n for n in active if n.reclaiming is not None]

    # Slurm nodes of the active, unlent nodes: which take jobs now, which are being drained for lending.
    free_active = [n for n in active if not n.on_loan]
    # Slurm capacity a waiting job can count on: every Slurm node on a free active node that runs no job and
    # that no person (or a fault) drained: idle ones, and those on their way back from a loan (still drained
    # for lending, undone below while a job waits; DOWN by the operator's preStop; IDLE+NOT_RESPONDING while
    # slurmd registers; or no NodeSet pod back yet). Without these, a job would take back a second loan while
    # the first one returns.
    available = sum(1 for n in free_active for s in slurm_on.get(n.name, ())
                    if not s.busy and not drained_by_person(s) and not drained_by_gpufleet(s)) \
        + sum(1 for n in free_active if not slurm_on.get(n.name))
    size = sum(len(slurm_on.get(n.name, ())) for n in active) + len(lent_idle) + len(back_idle)
    want = demand_nodes(facts.pending, max(size, pool.nodes))
    lacking = max(0, want - available)
    draining = [n for n in free_active if any(drained_for_lending(s) for s in slurm_on.get(n.name, ()))]

    cap = pool.max_lent()
    on_loan = len(lent_spares) + len(lent_idle) + len(draining)

    # 2. Take back: what the spec no longer lends, what the floor or pending jobs need, what is over the cap.
    lend_spares = bool(lending and lending.spares)
    lend_idle = bool(lending and lending.idle_nodes)
    floor = lending.spare_floor if lending else 0

    def take_back(loans: list[NodeView], lends: bool, off: str, need: int, why_need: str) -> None:
        nonlocal on_loan
        for n in sorted(loans, key=lambda n: n.name):
            if not lends:
                why = off
            elif need > 0:
                why, need = why_need, need - 1
            elif on_loan > cap:
                why = f"more than the pool's {cap} nodes lent at once"
            else:
                continue
            actions.append(StartReclaim(n.name, why))
            on_loan -= 1

    take_back(lent_spares, lend_spares, "the spec no longer lends spares",
              floor - len(free_spares) - len(back_spares) + facts.waiting_for_spare,
              f"pool {pool.name} is below its floor of {floor} unlent spares")
    take_back(lent_idle, lend_idle, "the spec no longer lends idle nodes", lacking - len(back_idle),
              f"{want} node(s) asked for by pending Slurm jobs, {available} idle")

    # 3. Reclaims in progress: evict within the grace, then force; when nobody is left, end the loan.
    for n in back_spares + back_idle:
        if not borrowers.get(n.name):
            actions.append(EndLoan(n.name, back_to_spare=n.is_spare))
            continue
        actions.append(evict_borrowers(n.name, borrowers[n.name], n.reclaiming, pool, now))
        recheck = RECLAIM_RECHECK

    # 4. Lend. Spares beyond the floor, within the pool's declared count; none while a remediation waits for one.
    # A spare above the declared count (a repaired node back while the refill that replaced it is here) is surplus
    # the membership pass gives back (core/surplus.py), and only a free one can be: lending it would leave the other
    # free spare, the one just repaired, to be given back, and the floor would take the loan back at once.
    if lend_spares and not facts.waiting_for_spare:
        extra = min(len(free_spares), pool.spares - len(lent_spares) - len(back_spares)) - floor
        for n in sorted(free_spares, key=lambda n: n.name, reverse=True):  # the first by name stays free longest
            if extra <= 0 or on_loan >= cap:
                break
            actions.append(Lend(n.name, pool.name, labels.LENT_SPARE))
            extra -= 1
            on_loan += 1

    # Idle nodes: drain in Slurm for lending, then lend once no job runs; undo when that stops being right
    # (a job started, one is waiting, a person drained it, or the spec lends no more). This also undrains a
    # Slurm node whose NodeSet pod came back from a loan.
    idle_after = timedelta(seconds=lending.idle_after_seconds if lending else 0)
    for n in sorted(free_active, key=lambda n: n.name):
        mine = slurm_on.get(n.name, ())
        if not mine:
            continue
        ours = [s for s in mine if drained_for_lending(s)]
        quiet = all(s.last_busy is None or now - s.last_busy >= idle_after for s in mine)
        others = any((s.drained or s.down) and not drained_for_lending(s) for s in mine)
        eligible = lend_idle and not want and quiet and not others and not any(s.busy for s in mine)
        if ours:
            if not eligible:
                actions.extend(ResumeSlurm(s.name) for s in ours)  # a job came (or a person drained): undo
            elif len(ours) == len(mine):
                leaving = tuple(p.key for p in evictable_views(pods.get(n.name, ())) if not p.deleting)
                actions.extend((Lend(n.name, pool.name, labels.LENT_IDLE), EvictPods(n.name, leaving)))
            else:
                actions.extend(DrainSlurm(s.name, lending_reason(n.name)) for s in mine if s not in ours)
            continue
        if eligible and on_loan < cap and all(s.idle and s.takes_jobs for s in mine):
            actions.extend(DrainSlurm(s.name, lending_reason(n.name)) for s in mine)
            on_loan += 1
            recheck = min(recheck, RECLAIM_RECHECK)
        elif lend_idle and not want and not quiet:
            wait = min((s.last_busy + idle_after - now).total_seconds() for s in mine if s.last_busy)
            recheck = min(recheck, max(RECLAIM_RECHECK, wait))

    return LendingPlan(tuple(actions), recheck, capacity(facts, slurm_on))


def capacity(facts: PoolFacts, slurm_on: dict[str, tuple[SlurmNodeView, ...]] | None = None) -> Capacity:
    """The pool as `gpufleet capacity` shows it."""
    slurm_on = slurm_on if slurm_on is not None else dict(facts.slurm_on)
    busy = idle = active_lent = spares_lent = spares_unlent = quarantined = gpus = 0
    for n in facts.nodes:
        if n.role == labels.ROLE_QUARANTINED:
            quarantined += 1
        elif n.on_loan and n.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE):
            gpus += n.gpus
            if n.is_spare:
                spares_lent += 1
            else:
                active_lent += 1
        elif n.is_spare:
            spares_unlent += 1
        elif n.is_active:
            if any(s.busy for s in slurm_on.get(n.name, ())):
                busy += 1
            else:
                idle += 1
    return Capacity(active_busy=busy, active_idle=idle, active_lent=active_lent, spares_lent=spares_lent,
                    spares_unlent=spares_unlent, quarantined=quarantined, gpus_lent=gpus)


def evict_borrowers(node: str, borrowers: list[PodView] | tuple[PodView, ...], since: datetime, pool: NodePool,
                    now: datetime) -> EvictBorrowers:
    """The borrowers of a node being taken back since `since`: evicted with the pool's reclaim grace (the
    spec's default when the pool lends no more), deleted once it has passed. Healing and lending alike.
    Those already leaving are not asked again, until the grace has passed."""
    lending = pool.lending
    grace = lending.reclaim_grace_seconds if lending else LendingSpec.model_fields["reclaim_grace_seconds"].default
    force = now >= since + timedelta(seconds=grace)
    names = tuple(sorted(p.key for p in borrowers if force or not p.deleting))
    return EvictBorrowers(node, names, grace, force=force)
