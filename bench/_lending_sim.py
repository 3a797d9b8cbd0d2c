"""A discrete-event simulation of one pool that lends, driven by the real core.

Each simulated second the pool's state is shown to the core as the runtime would show it
(`lending.PoolFacts`, `StepFacts`), and the actions it returns are applied to simulated nodes:
`plan_lending` decides every lend and reclaim, `decide.plan_step` (from `Replacing` on) chooses the
spare for a fault, takes a lent one back and promotes it. Nothing here decides what the core decides;
what is modelled is the world around it: a greedy Slurm scheduler, borrowers that fill every lent
node, how long pods take to leave and to start, faults, refills.

Without lending the same trace runs with the pool's `lending` section removed.
"""
from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.node_repair import PASSED, HealthCheckRecord
from gpufleet.reconciler.core import decide, lending
from gpufleet.reconciler.core.actions import (
    Cordon, DrainSlurm, EndLoan, EvictBorrowers, EvictPods, Lend, Notify, PromoteSpare, Quarantine, ReleaseJobs,
    RequestCapacity, ResumeSlurm, ReturnToSpares, StartReclaim,
)
from gpufleet.reconciler.core.drains import slurm_reason
from gpufleet.reconciler.core.model import Fault, NodeView, PendingJob, PodView, Remediation, SlurmNodeView, StepFacts
from gpufleet.reconciler.core.phases import Phase

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
PROVEN_HERE = HealthCheckRecord("bench", "", PASSED, T0)
XID = 79


@dataclass(frozen=True)
class Params:
    """The world around the core: the trace and how long things take (seconds unless named)."""

    hours: float = 24.0  # measured
    warmup_hours: float = 6.0  # simulated first, not counted: the day starts with a loaded cluster
    job_rate: float = 5.0  # jobs per hour (Poisson)
    max_job_nodes: int = 16  # sizes 1..N nodes, log-uniform
    duration_median_hours: float = 2.0  # lognormal
    duration_sigma: float = 1.0
    faults_per_day: float = 4.0  # on in-service nodes of the pool, uniformly
    refill_minutes: float = 20.0  # a quarantined node's replacement spare joins after this
    reclaim_seconds: float = 30.0  # StartReclaim -> borrowers gone (SIGTERM to exit; forced at the grace)
    pod_start_seconds: float = 5.0  # a NodeSet pod back on a node (a loan ended, a spare promoted)
    borrower_start_seconds: float = 30.0  # Lend -> borrowers serving
    contain_seconds: float = 5.0  # fault -> Replacing (cordon, drain, SIGTERM, checkpoint, requeue, evict)
    pass_seconds: float = 1.0  # between lending passes (the runtime's RECHECK)
    every_pass: bool = False  # run every pass even when nothing changed (slow; the skip must not change results)
    seed: int = 1


@dataclass
class Job:
    id: int
    nodes: int
    duration: float
    submit: float
    remaining: float = 0.0
    start: float | None = None  # first start
    started: float | None = None  # current run
    end: float | None = None
    hosts: tuple[str, ...] = ()  # Slurm nodes
    held: bool = False  # requeued by a remediation, until it releases it
    requeues: int = 0
    on_reclaimed: bool = False  # started on a node that had been lent
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each run


@dataclass
class SNode:
    """A Kubernetes node."""

    name: str
    role: str
    gpus: int
    taints: set[str] = field(default_factory=set)
    lent: str = ""
    lent_since: datetime | None = None
    reclaiming: datetime | None = None
    fault: Fault | None = None
    unschedulable: bool = False
    borrowers_from: float | None = None  # borrowers serve from then (None: none there or coming)
    borrowers_leave: float | None = None  # being evicted: gone then
    reclaimed_at: float | None = None  # when its last loan ended


@dataclass
class SSlurm:
    """A Slurm node; its NodeSet pod runs on `host` (None: away, e.g. while its node is lent)."""

    name: str
    host: str | None
    job: int | None = None
    reason: str = ""  # drained with this reason ("" = not drained)
    last_busy: float | None = None
    arrive: float | None = None  # its pod starts on `moving_to` then
    moving_to: str | None = None
    left: str | None = None  # the node its pod left for a loan (it comes back there when the loan ends)


@dataclass
class Heal:
    record: Remediation
    fault_at: float
    replacement_lent: bool = False
    done: float | None = None
    ready_at: float | None = None  # containment over: the core's Replacing begins


@dataclass
class Result:
    mode: str
    gpu_hours: dict[str, float]
    jobs: list[Job]
    heals: list[Heal]
    lends: int = 0
    reclaims: int = 0
    reclaim_reasons: dict[str, int] = field(default_factory=dict)
    lend_below_floor: list[tuple[float, str, int]] = field(default_factory=list)  # (t, node, unlent spares left)
    seconds_below_floor: float = 0.0  # unlent spares < floor for any reason (faults use spares)
    overlap: list[tuple[float, str]] = field(default_factory=list)  # a job and borrowers on one node
    short_loans: int = 0  # loans taken back within 5 minutes of the lend
    passes: int = 0
    reclaim_to_run: list[float] = field(default_factory=list)  # StartReclaim (for a job) -> the job runs there
    joined: list[float] = field(default_factory=list)  # when refilled spares joined
    max_lent: int = 0  # the most nodes lent at once (reclaims in progress not counted), after a pass
    wasted_reclaims: int = 0  # taken back for a pending job, lent again before any job ran there


def trace(p: Params) -> tuple[list[Job], list[tuple[float, float]]]:
    """Jobs and faults for the whole run (warm-up included), the same for both modes."""
    rng = random.Random(p.seed)
    end = (p.warmup_hours + p.hours) * 3600
    jobs, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(p.job_rate / 3600)
        if t >= end:
            break
        size = max(1, min(p.max_job_nodes, int(round(2 ** rng.uniform(0, math.log2(max(1, p.max_job_nodes)))))))
        dur = rng.lognormvariate(math.log(p.duration_median_hours * 3600), p.duration_sigma)
        i += 1
        jobs.append(Job(i, size, dur, t, remaining=dur))
    faults, t = [], 0.0
    frng = random.Random(p.seed * 7919 + 1)
    while p.faults_per_day > 0:
        t += frng.expovariate(p.faults_per_day / 86400)
        if t >= end:
            break
        faults.append((t, frng.random()))
    return jobs, faults


class Sim:
    def __init__(self, spec: FleetSpec, pool: str, p: Params, mode: str,
                 progress: Callable[[str], None] = lambda m: None):
        self.spec, self.p, self.mode, self.progress = spec, p, mode, progress
        self.pool = spec.pool(pool)
        self.lending = self.pool.lending
        self.floor = self.lending.spare_floor if self.lending and self.lending.spares else 0
        self.partitions = tuple(x.name for x in spec.slurm.partitions if pool in x.pools) or ("train",)
        g = self.pool.gpus_per_node
        self.nodes: dict[str, SNode] = {}
        self.slurm: dict[str, SSlurm] = {}
        for i in range(self.pool.nodes):
            n = f"{pool}-{i}"
            self.nodes[n] = SNode(n, labels.ROLE_ACTIVE, g)
            self.slurm[n] = SSlurm(n, n, last_busy=-1e9)
        self.spare_seq = 0
        for _ in range(self.pool.spares):
            self._new_spare()
        self.jobs, faults = trace(p)
        self.arrivals = list(self.jobs)
        self.arrivals.reverse()
        self.faults = list(reversed(faults))
        self.pending: list[Job] = []
        self.running: dict[int, Job] = {}
        self.heals: list[Heal] = []
        self.refills: list[float] = []  # heap of join times
        self.t = 0.0
        self.measure_from = p.warmup_hours * 3600
        self.end = (p.warmup_hours + p.hours) * 3600
        self.gh = {"training": 0.0, "lent": 0.0, "idle": 0.0, "idle_spares": 0.0, "out_of_service": 0.0}
        self.res = Result(mode, self.gh, self.jobs, self.heals)
        self.version = 0
        self.dirty = True
        self.last_pass = -1e9
        self.reclaim_for_job: dict[str, float] = {}  # node -> when a pending job's reclaim began

    # --- the world -----------------------------------------------------------------------------

    def _new_spare(self) -> None:
        n = f"{self.pool.name}-spare-{self.spare_seq:03d}"
        self.spare_seq += 1
        self.nodes[n] = SNode(n, labels.ROLE_SPARE, self.pool.gpus_per_node, {labels.SPARE_TAINT})

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def _dt(self, s: float | None) -> datetime | None:
        return None if s is None else T0 + timedelta(seconds=s)

    def view(self, n: SNode) -> NodeView:
        # Spares here have passed their health check (validation before service is bench/repair_month.py's).
        return NodeView(n.name, self.pool.name, n.role, ready=True, unschedulable=n.unschedulable, fault=n.fault,
                        taints=tuple(sorted(n.taints)), gpus=n.gpus, lent=n.lent, lent_since=n.lent_since,
                        reclaiming=n.reclaiming, check=PROVEN_HERE)

    def sview(self, s: SSlurm) -> SlurmNodeView:
        states = {"ALLOCATED"} if s.job is not None else {"IDLE"}
        if s.reason:
            states.add("DRAIN")
        if s.host is None:
            states.add("DOWN")
        return SlurmNodeView(s.name, frozenset(states), s.reason, partitions=self.partitions,
                             last_busy=self._dt(s.last_busy if s.job is None else self.t))

    @staticmethod
    def on_loan(n: SNode) -> bool:
        """NodeView.on_loan, without building the view."""
        return bool(n.lent) or n.reclaiming is not None or labels.LENDING_TAINT in n.taints

    @staticmethod
    def borrower(node: str) -> PodView:
        """The borrowers on a lent node, as one pod."""
        return PodView("inference", f"borrower-{node}", node)

    def borrowers_on(self, n: SNode) -> bool:
        return n.borrowers_from is not None and n.borrowers_from <= self.t

    def in_service(self, n: SNode) -> bool:
        return n.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) and n.fault is None

    def live_records(self) -> list[Heal]:
        return [h for h in self.heals if h.done is None]

    def pool_facts(self) -> lending.PoolFacts:
        on: dict[str, list[SlurmNodeView]] = {}
        for s in self.slurm.values():
            if s.host is not None:
                on.setdefault(s.host, []).append(self.sview(s))
        names = sorted(self.nodes)
        live = [h.record for h in self.live_records()]
        return lending.PoolFacts(
            self.pool.name, tuple(self.view(self.nodes[n]) for n in names),
            tuple((n, tuple(on[n])) for n in names if n in on),
            tuple((n, (self.borrower(n),)) for n in names if self.nodes[n].borrowers_from is not None),
            tuple(PendingJob(j.id, self.partitions, j.nodes, "BeginTime" if j.held else "Resources", False)
                  for j in self.pending),
            remediated=frozenset(r.node for r in live),
            claimed=frozenset(r.replacement for r in live if r.replacement),
            waiting_for_spare=sum(1 for r in live if r.phase is Phase.WAITING_FOR_SPARE))

    def schedule(self) -> None:
        """Slurm, greedy in submit order: a job starts when enough Slurm nodes are idle and take jobs."""
        if not self.pending:
            return
        free = sorted(s.name for s in self.slurm.values() if s.job is None and not s.reason and s.host is not None
                      and self.in_service(self.nodes[s.host]) and not self.nodes[s.host].unschedulable)
        if not free or not self.pending:
            return
        still = []
        for j in self.pending:
            if not j.held and j.nodes <= len(free):
                hosts, free = tuple(free[:j.nodes]), free[j.nodes:]
                self._start(j, hosts)
            else:
                still.append(j)
        self.pending = still

    def _start(self, j: Job, hosts: tuple[str, ...]) -> None:
        j.hosts, j.started = hosts, self.t
        if j.start is None:
            j.start = self.t
        for h in hosts:
            s = self.slurm[h]
            s.job = j.id
            node = self.nodes[s.host]
            if node.borrowers_from is not None:
                self.res.overlap.append((self.t, node.name))
            if node.name in self.reclaim_for_job:
                self.res.reclaim_to_run.append(self.t - self.reclaim_for_job.pop(node.name))
                j.on_reclaimed = True
        self.running[j.id] = j
        self.dirty = True

    def _stop(self, j: Job, requeue: bool) -> None:
        for h in j.hosts:
            s = self.slurm[h]
            s.job, s.last_busy = None, self.t
        self.running.pop(j.id, None)
        j.remaining -= self.t - (j.started or self.t)
        j.runs.append((j.started if j.started is not None else self.t, self.t))
        j.hosts, j.started = (), None
        if requeue:
            j.requeues += 1
            j.held = True
            bisect.insort(self.pending, j, key=lambda x: x.submit)
        else:
            j.end = self.t
        self.dirty = True

    def fault(self, u: float) -> None:
        cands = sorted(n.name for n in self.nodes.values() if self.in_service(n) and n.name not in
                       {h.record.node for h in self.live_records()} | {h.record.replacement for h in self.live_records()})
        if not cands:
            return
        n = self.nodes[cands[min(len(cands) - 1, int(u * len(cands)))]]
        f = Fault(XID, "Xid 79: GPU has fallen off the bus", self.now())
        n.fault = f
        rec = decide.detect(self.view(n), [], self.spec, self.now()).remediation
        assert rec is not None, f"detect gave no record for {n.name}"
        mine = tuple(s.name for s in self.slurm.values() if n.name in (s.host, s.left, s.moving_to))
        self.heals.append(Heal(replace(rec, slurm_nodes=mine), self.t, ready_at=self.t + self.p.contain_seconds))
        self.dirty = True

    # --- applying the core's actions -----------------------------------------------------------

    def apply(self, a, heal: Heal | None = None) -> None:
        self.dirty = True
        match a:
            case Lend():
                n = self.nodes[a.node]
                n.taints.discard(labels.SPARE_TAINT)
                n.taints.add(labels.LENDING_TAINT)
                n.lent, n.lent_since, n.reclaiming = a.loan, n.lent_since or self.now(), None
                if n.borrowers_from is None:
                    n.borrowers_from = self.t + self.p.borrower_start_seconds
                self.res.lends += 1
                if self.reclaim_for_job.pop(a.node, None) is not None:
                    self.res.wasted_reclaims += 1
                if n.role == labels.ROLE_SPARE:
                    claimed = {h.record.replacement for h in self.live_records()}
                    unlent = sum(1 for x in self.nodes.values() if x.role == labels.ROLE_SPARE and self.in_service(x)
                                 and not x.lent and x.reclaiming is None and labels.LENDING_TAINT not in x.taints
                                 and x.name not in claimed)
                    if unlent < self.floor:
                        self.res.lend_below_floor.append((self.t, a.node, unlent))
            case StartReclaim():
                n = self.nodes[a.node]
                n.lent, n.reclaiming = "", self.now()
                if n.borrowers_from is not None and n.borrowers_from > self.t:
                    n.borrowers_from = None  # not started yet: nothing to evict
                elif n.borrowers_from is not None:
                    n.borrowers_leave = self.t + self.p.reclaim_seconds
                self.res.reclaims += 1
                key = a.why.split(":")[0] if heal is None else "a fault needs the spare"
                key = "pending Slurm jobs" if "pending Slurm jobs" in a.why else key
                self.res.reclaim_reasons[key] = self.res.reclaim_reasons.get(key, 0) + 1
                if n.lent_since is not None and self.t - (n.lent_since - T0).total_seconds() < 300:
                    self.res.short_loans += 1
                if "pending Slurm jobs" in a.why:
                    self.reclaim_for_job[a.node] = self.t
            case EvictBorrowers():
                n = self.nodes[a.node]
                if a.force:
                    n.borrowers_from = n.borrowers_leave = None
            case EndLoan():
                n = self.nodes[a.node]
                n.taints.discard(labels.LENDING_TAINT)
                if a.back_to_spare:
                    n.taints.add(labels.SPARE_TAINT)
                n.lent, n.lent_since, n.reclaiming = "", None, None
                n.borrowers_from = n.borrowers_leave = None
                n.reclaimed_at = self.t
                if self.in_service(n) and not n.unschedulable:
                    for s in self.slurm.values():  # an idle node's NodeSet pod comes back
                        if s.host is None and s.moving_to is None and s.left == a.node:
                            s.moving_to, s.arrive, s.left = a.node, self.t + self.p.pod_start_seconds, None
            case DrainSlurm():
                self.slurm[a.node].reason = a.reason
            case ResumeSlurm():
                self.slurm[a.node].reason = ""
            case EvictPods():
                n = self.nodes[a.node]
                if n.fault is not None:
                    n.borrowers_from = n.borrowers_leave = None
                for s in self.slurm.values():  # NodeSet pods leave (a node lent, a faulted node drained)
                    if s.host == a.node and s.job is None:
                        s.host, s.left = None, a.node
            case Cordon():
                self.nodes[a.node].unschedulable = True
            case PromoteSpare():
                sp = self.nodes[a.spare]
                sp.role = labels.ROLE_ACTIVE
                sp.taints.discard(labels.SPARE_TAINT)
                for name in heal.record.slurm_nodes if heal else ():
                    s = self.slurm[name]
                    s.host, s.left, s.moving_to, s.arrive = None, None, a.spare, self.t + self.p.pod_start_seconds
            case Quarantine():
                n = self.nodes[a.node]
                n.role = labels.ROLE_QUARANTINED
                n.borrowers_from = n.borrowers_leave = None
            case RequestCapacity() if a.key.endswith("/refill"):  # the provider replaces the node used
                heapq.heappush(self.refills, self.t + self.p.refill_minutes * 60)
            case ReleaseJobs():
                for j in self.pending:
                    if j.id in a.job_ids:
                        j.held = False
            case Notify() | ReturnToSpares() | RequestCapacity():
                pass
            case _:
                raise RuntimeError(f"the simulation does not apply {a!r}")

    # --- healing: containment modelled, the rest the core's ------------------------------------

    def heal_step(self, h: Heal) -> None:
        r = h.record
        node = self.nodes[r.node]
        if r.phase is Phase.DETECTED and r.was_spare:
            st = decide.plan_step(r, StepFacts(can_refill=True), self.spec, self.now())
            self._run_step(h, st)
            return
        if r.phase is Phase.DETECTED:
            # containment: cordon, drain in Slurm, SIGTERM; the job checkpoints and is requeued (held
            # with a begin time until the remediation releases it), the node's pods evicted
            self.apply(Cordon(r.node, slurm_reason(r), r.name))
            for name in r.slurm_nodes:
                self.slurm[name].reason = slurm_reason(r)
            if node.borrowers_from is not None:
                node.borrowers_from = node.borrowers_leave = None
            if self.t < (h.ready_at or 0):
                return
            jobs = tuple(sorted({self.slurm[n].job for n in r.slurm_nodes if self.slurm[n].job is not None}))
            for jid in jobs:
                self._stop(self.running[jid], requeue=True)
            for name in r.slurm_nodes:
                s = self.slurm[name]
                if s.host == r.node:
                    s.host = None
            t = self.now()
            h.record = replace(r, phase=Phase.REPLACING, jobs=jobs,
                               phase_times=r.phase_times + ((Phase.REPLACING.value, t),))
            self.dirty = True
            r = h.record
        if r.phase in (Phase.REPLACING, Phase.WAITING_FOR_SPARE):
            taken = {x.record.replacement for x in self.live_records() if x is not h and x.record.replacement}
            rep = self.nodes.get(r.replacement) if r.replacement else None
            borrowers = (self.borrower(rep.name),) if rep is not None and rep.borrowers_from is not None else ()
            if rep is not None and self.on_loan(rep):
                h.replacement_lent = True
            facts = StepFacts(pool_nodes=tuple(self.view(n) for n in self.nodes.values() if self.in_service(n)),
                              claimed=frozenset(taken), can_refill=True,
                              replacement=self.view(rep) if rep is not None else None, replacement_pods=borrowers)
        elif r.phase is Phase.RESUMING:
            on_rep = tuple(s.name for s in self.slurm.values() if s.host == r.replacement)
            moved = tuple(n for n in r.slurm_nodes if self.slurm[n].host not in (None, r.node))
            pods = tuple(PodView("slurm", f"slurm-worker-{n}", self.slurm[n].host,
                                 labels=((labels.SLINKY_POD_HOSTNAME, n),)) for n in r.slurm_nodes)
            facts = StepFacts(replacement=self.view(self.nodes[r.replacement]), replacement_slurm=on_rep,
                              slurm_pods=pods, slurm=tuple(self.sview(self.slurm[n]) for n in set(on_rep) | set(moved)))
        else:
            return
        self._run_step(h, decide.plan_step(r, facts, self.spec, self.now()))

    def _run_step(self, h: Heal, st) -> None:
        for a in st.actions:
            self.apply(a, h)
        if st.remediation is not None:
            h.record = st.remediation
            self.dirty = True
            if st.remediation.phase.terminal:
                h.done = self.t

    # --- the loop ----------------------------------------------------------------------------------

    def lending_pass(self) -> None:
        plan = lending.plan_lending(self.pool_facts(), self.spec, self.now())
        self.res.passes += 1
        for a in plan.actions:
            self.apply(a)
        self.last_pass = self.t
        lent = sum(1 for n in self.nodes.values() if n.lent and n.reclaiming is None)
        self.res.max_lent = max(self.res.max_lent, lent)

    def next_timer(self) -> float:
        """The next time a pass could answer differently with nothing else changed: a node's idle time
        reaching `idle_after_seconds`, a reclaim grace running out."""
        if self.lending is None:
            return math.inf
        out = math.inf
        after = self.lending.idle_after_seconds
        for s in self.slurm.values():
            if s.job is None and s.last_busy is not None and s.last_busy + after > self.t:
                out = min(out, s.last_busy + after)
        grace = self.lending.reclaim_grace_seconds
        for n in self.nodes.values():
            if n.reclaiming is not None:
                out = min(out, (n.reclaiming - T0).total_seconds() + grace)
        return out

    def tick(self) -> None:
        t = self.t
        while self.arrivals and self.arrivals[-1].submit <= t:
            j = self.arrivals.pop()
            self.pending.append(j)
            self.dirty = True
        while self.faults and self.faults[-1][0] <= t:
            self.fault(self.faults.pop()[1])
        for j in [j for j in self.running.values() if (j.started or 0) + j.remaining <= t]:
            self._stop(j, requeue=False)
        while self.refills and self.refills[0] <= t:
            heapq.heappop(self.refills)
            self._new_spare()
            self.res.joined.append(t)
            self.dirty = True
        for n in self.nodes.values():
            if n.borrowers_leave is not None and n.borrowers_leave <= t:
                n.borrowers_from = n.borrowers_leave = None
                self.dirty = True
        for s in self.slurm.values():
            if s.moving_to is not None and s.arrive is not None and s.arrive <= t:
                s.host, s.moving_to, s.arrive = s.moving_to, None, None
                self.dirty = True
        for h in self.live_records():
            self.heal_step(h)
        self.schedule()
        if self.lending is not None or (self.res.lends and any(self.on_loan(n) for n in self.nodes.values())):
            due = t - self.last_pass >= self.p.pass_seconds
            if due and (self.p.every_pass or self.dirty or self.next_timer() <= t):
                self.dirty = False
                self.lending_pass()
                self.schedule()
        self.account()

    @property
    def dirty(self) -> bool:
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        if value:
            self.version += 1  # the books are counted again (account)
        self._dirty = value

    version = 0
    _dirty = True
    _counted: tuple[int, float] = (-1, 0.0)  # (version, valid until) of the rates below
    _rates: dict[str, float] = {}
    _below = False

    def account(self) -> None:
        """Add this second to the books. The per-second rates are counted again only when something
        changed (or borrowers began serving), which gives the same sums as counting every second."""
        if self.t < self.measure_from:
            return
        version, until = self._counted
        if version != self.version or self.t >= until:
            self._count()
        for k, v in self._rates.items():
            self.gh[k] += v
        if self._below:
            self.res.seconds_below_floor += 1

    def _count(self) -> None:
        dt = 1 / 3600
        rates = dict.fromkeys(self.gh, 0.0)
        busy_hosts = {s.host for s in self.slurm.values() if s.job is not None and s.host is not None}
        claimed = {h.record.replacement for h in self.live_records()}
        unlent_spares = 0
        for n in self.nodes.values():
            g = n.gpus * dt
            if not self.in_service(n):
                if n.role != labels.ROLE_QUARANTINED:  # faulted, being contained (quarantined: out of the pool)
                    rates["out_of_service"] += g
                continue
            if n.name in busy_hosts:
                rates["training"] += g
            elif self.borrowers_on(n):
                rates["lent"] += g
            else:
                rates["idle"] += g
                if n.role == labels.ROLE_SPARE:
                    rates["idle_spares"] += g
            if n.role == labels.ROLE_SPARE and not self.on_loan(n) and n.name not in claimed:
                unlent_spares += 1
        starts = [n.borrowers_from for n in self.nodes.values() if n.borrowers_from is not None and n.borrowers_from > self.t]
        self._rates, self._below = rates, unlent_spares < self.floor
        self._counted = (self.version, min(starts, default=math.inf))

    def run(self) -> Result:
        steps = int(self.end)
        report = max(1, steps // 10)
        while self.t < self.end:
            self.tick()
            self.t += 1.0
            if int(self.t) % report == 0:
                self.progress(f"  {self.mode}: simulated {self.t / 3600:.1f} h of {self.end / 3600:.1f} h "
                              f"({len(self.running)} jobs running, {len(self.pending)} pending, {self.res.passes} passes)")
        return self.res


def without_lending(spec: FleetSpec, pool: str) -> FleetSpec:
    pools = [p.model_copy(update={"lending": None}) if p.name == pool else p for p in spec.pools]
    return spec.model_copy(update={"pools": pools})


def simulate(spec: FleetSpec, pool: str, p: Params, progress: Callable[[str], None] = lambda m: None
             ) -> dict[str, Result]:
    """The same trace without lending and with it."""
    return {"without lending": Sim(without_lending(spec, pool), pool, p, "without lending", progress).run(),
            "with lending": Sim(spec, pool, p, "with lending", progress).run()}
