"""The world around the real reconciler for bench/repair_month.py: a fleet's month of interruptions (every row
of Llama 3's table, bench/_interruptions.py), its training jobs (bench/_jobs.py), refills and the person who
acts where gpufleet does not. The reconciler itself (runtime and core) runs unchanged through the unit tests'
fakes (tests/unit/fakes.py `World`): nothing here decides what it decides; every parameter below is declared
and printed with the result. `run(..., loop=True)` is the fleet with the reconciler; bench/_pager.py is the
same month with a person's pager instead.
"""
from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, field
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, reason_for
from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.oncall import MARK_HEALTHY, RETIRE, PersonRequest
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import UNDER_WAY, RepairPhase
from tests.unit.fakes import FakeNodes, Provider, World, pool_node

import _interruptions as table
import _jobs as jobs
from _interruptions import Cost, Interruption

HOUR = 3600.0


@dataclass(frozen=True)
class Params:
    days: float = 30.0
    seed: int = 1
    fault_scale: float = 1.0  # times Llama 3's rate of unexpected interruptions (planned ones: as Llama 3's)
    reset_fixes: float = 0.70  # of reset-gpu faults: the reset fixes it
    reboot_fixes_after_reset: float = 0.20  # of reset-gpu faults: only a reboot fixes it (the rest: nothing)
    reboot_fixes: float = 0.85  # of reboot faults: the reboot fixes it (the rest: nothing)
    reboot_minutes: float = 10.0
    check_minutes: float = 15.0
    refill_success: float = 0.30  # a refill is granted (H100 capacity is scarce); else the pool runs short
    refill_minutes: float = 20.0
    person_hours: float = 24.0  # a person repairs (or retires) a broken node this long after its fault
    job_nodes: int = 16  # a job spans this many nodes: one interruption stops them all
    checkpoint_minutes: float = 60.0  # a job checkpoints every this many minutes of running
    restart_minutes: float = 10.0  # a job's restart: launch, rendezvous, load the checkpoint
    respond_minutes: float = 30.0  # a person's pager: paged to at the keyboard
    manual_minutes: float = 30.0  # a person drains the node in Slurm, swaps in a spare, requeues the job
    decide_minutes: float = 15.0  # a fault the loop has not taken by then goes to a person
    in_place: bool = False  # every pool repairs in place when no spare is free; False: as the stack says
    # (pools[].repair.in_place, on by default: the stack may turn it off)
    heal_step: float = 5.0  # the clock's step while a heal is under way (the reconciler's RECHECK)
    repair_step: float = 60.0  # while only repairs are under way (reboot and check take minutes)
    wait_step: float = 600.0  # while jobs only wait for a spare (the core's refill deadlines and pages still run)


@dataclass
class Result:
    mode: str
    faults: int = 0  # interruptions the reconciler acted on (a remediation)
    spares_min: int = 0
    spares_mean: float = 0.0
    jobs_waited: int = 0
    wait_max_h: float = 0.0
    gpu_h_waited: float = 0.0  # the stopped job's GPUs, while it waited for a spare
    gpu_h_out: float = 0.0  # broken nodes' GPUs until back among the spares (or retired)
    returned: int = 0
    retired: int = 0
    failed_loops: int = 0  # repairs stopped for a person, heals escalated
    human_tasks: int = 0
    steps: int = 0
    by_action: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)  # each failed loop's record (explain())
    waits: list = field(default_factory=list)  # each wait for a spare: its pool's spares and what took them
    pool_spares_min: dict = field(default_factory=dict)  # pool -> fewest spares it had
    heals: list = field(default_factory=list)  # every remediation: (pool, node, hours from the start, phase at the end)
    # effective training time (bench/_jobs.py)
    interruptions: int = 0  # that stopped a running job
    struck_down: int = 0  # that struck a job already stopped (nothing more to lose)
    by_row: dict = field(default_factory=dict)  # component -> interruptions that stopped a job
    by_need: dict = field(default_factory=dict)  # what each stopping interruption needed (the catalogue's, or the cost)
    app_faults: int = 0  # application Xids: the job restarted, the node stayed in service
    app_faults_retired: int = 0  # of them, nodes the reconciler took out anyway (must be 0)
    to_person: int = 0  # interruptions a person handled (not gpufleet's, or the loop gave up)
    job_gpu_h: float = 0.0
    lost_gpu_h: dict = field(default_factory=dict)  # bench/_jobs.py KINDS -> GPU-hours
    effective: float = 0.0


def pools_in_service(spec: FleetSpec) -> dict[str, tuple[int, int]]:
    return {x.name: (x.nodes, x.gpus_per_node) for x in spec.pools}


def truth(action: FaultAction, u: float, p: Params) -> str:
    """What truly fixes a node whose fault needs `action` (the ASSUMED outcome shares in Params), from draw `u`."""
    if action is FaultAction.RESET_GPU:
        return FakeNodes.RESET_FIXES if u < p.reset_fixes else \
            FakeNodes.REBOOT_FIXES if u < p.reset_fixes + p.reboot_fixes_after_reset else FakeNodes.BROKEN
    if action is FaultAction.REBOOT:
        return FakeNodes.REBOOT_FIXES if u < p.reboot_fixes else FakeNodes.BROKEN
    return FakeNodes.BROKEN


def ledger(spec: FleetSpec, p: Params) -> jobs.Ledger:
    return jobs.Ledger(pools_in_service(spec), p.job_nodes, p.checkpoint_minutes * 60, p.restart_minutes * 60)


def finish(res: Result, book: jobs.Ledger, end: float) -> None:
    """The effective training time's figures from the ledger, at the end of the run."""
    book.close(end)
    res.job_gpu_h = round(book.gpu_hours(end), 1)
    res.lost_gpu_h = {k: round(v, 1) for k, v in book.lost_gpu_hours().items()}
    res.effective = book.effective(end)


class RefillingProvider(Provider):
    """The fakes' provider, whose refills are granted `refill_success` of the time, `refill_minutes` later."""

    def __init__(self, kube, sim: "Sim"):
        super().__init__(kube)
        self.sim = sim

    def request_capacity(self, pool, reason, key):
        super().request_capacity(pool, reason, key)
        if self.sim.rng_refill.random() < self.sim.p.refill_success:
            self.sim.schedule(self.sim.p.refill_minutes * 60, "refill", pool)


class Sim:
    def __init__(self, spec: FleetSpec, p: Params, loop: bool):
        self.p, self.loop = p, loop
        self.spec = _bench_spec(spec, loop, p.in_place)
        self.w = World(self.spec, operator=True)
        self.rng_refill = random.Random(p.seed * 7 + 1)
        self.w.provider = RefillingProvider(self.w.kube, self)
        self.w.hardware.reboot_seconds = p.reboot_minutes * 60
        self.w.checks.seconds = p.check_minutes * 60
        self.w.restart()
        self.t0 = self.w.clock.now
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.refills = 0
        self.truth: dict[str, str] = {}  # remediated node -> what fixes it
        self.policy = FaultPolicy.from_spec(self.spec.healing)
        self.book = ledger(self.spec, p)
        self.heals: dict[str, tuple[jobs.Job, float]] = {}  # node -> its stopped job, since

    def now(self) -> float:
        return (self.w.clock.now - self.t0).total_seconds()

    def schedule(self, after: float, kind: str, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now() + after, self.seq, kind, data))

    # --- the world's events -------------------------------------------------------------------------

    def interrupt(self, ev: Interruption, res: Result) -> None:
        """Interruption `ev` of the trace strikes its Slurm node's job. A row gpufleet sees shows its kernel line:
        the node agent's classifier says what it needs; a fault that takes the node out is written as the agent
        writes it (gpufleet's condition) and the reconciler takes it from there; an application fault is an Event
        the reconciler never sees (the job restarts, the node stays). The rest costs the job as its row says."""
        p, book, now = self.p, self.book, self.now()
        need = table.needs(ev.line, self.policy) if ev.line else None
        pod = self.w.kube.pods.get(f"slurm/slurm-worker-{ev.host}")
        node = pod["spec"].get("nodeName") if pod and pod not in self.w.kube.evicted else None
        gpufleets = need is not None and need.remediates
        if gpufleets and (node is None or self.w.kube.nodes[node]["metadata"]["labels"].get(labels.ROLE)
                          != labels.ROLE_ACTIVE):
            node = None  # its Slurm node runs nowhere: its job is stopped already
        job = book.interrupt(ev.host, now, waiting=jobs.SWAP if gpufleets else jobs.PERSON,
                             at_checkpoint=ev.row.cost is Cost.PLANNED) if node or not gpufleets else None
        if job is None:
            res.struck_down += 1
            return
        res.interruptions += 1
        res.by_row[ev.row.component] = res.by_row.get(ev.row.component, 0) + 1
        label = need.value if need is not None else ev.row.cost.name.lower()
        res.by_need[label] = res.by_need.get(label, 0) + 1
        if need is FaultAction.RESTART_APP:
            res.app_faults += 1
        if gpufleets:
            state = truth(need, ev.u, p)
            self.w.hardware.state[node] = state
            self.truth[node] = state
            self._condition(node, ev, need)
            self.heals[node] = (job, now)
            res.faults += 1
            res.by_action[need.value] = res.by_action.get(need.value, 0) + 1
            if not self.loop:
                self.schedule(p.person_hours * HOUR, "person", node)
        elif ev.row.cost is Cost.PERSON:
            res.to_person += 1
            self.schedule((p.respond_minutes + p.manual_minutes) * 60, "resume", job)
        else:
            book.resume(job, now)  # restart-app, the network, a dependency, planned: it restarts where it was

    def _condition(self, node: str, ev: Interruption, need: FaultAction) -> None:
        """The node agent's condition for the line (fleetspec/faults/condition.py), over any earlier one."""
        (gev,) = table.DriverMessages().message(ev.line)
        conds = [c for c in self.w.kube.nodes[node]["status"]["conditions"] if c["type"] != labels.GPU_CONDITION]
        conds.append({"type": labels.GPU_CONDITION, "status": "False", "reason": reason_for(Kind.XID, gev.code),
                      "message": format_message(FaultSignal(Kind.XID, gev.code, need, gev.pci), gev.text),
                      "lastTransitionTime": self.w.clock.now.isoformat()})
        self.w.kube.nodes[node]["status"]["conditions"] = conds

    def follow_heals(self, res: Result) -> None:
        """Each stopped job whose node the reconciler is replacing: back when its remediation Succeeded (its
        Slurm node resumed on the replacement), split into the swap and the time WaitingForSpare; to a person
        when it ends Escalated or Failed, or when none was made within `decide_minutes`."""
        p, now = self.p, self.now()
        rems = self.w.store.list()
        for node, (job, t) in list(self.heals.items()):
            mine = [r for r in rems if r.node == node and self._s(r.created) >= t - 1]
            r = max(mine, key=lambda x: x.created) if mine else None
            if r is not None and r.phase is Phase.SUCCEEDED:
                at = self._s(r.entered(Phase.SUCCEEDED))
                spare = _time_in(r, Phase.WAITING_FOR_SPARE, self._s, at)
                self.book.resume(job, at, {jobs.SWAP: at - t - spare, jobs.SPARE: spare})
            elif (r is not None and r.phase.terminal) or (r is None and now - t >= p.decide_minutes * 60):
                at = self._s(r.entered(r.phase)) if r is not None else now
                spare = _time_in(r, Phase.WAITING_FOR_SPARE, self._s, at) if r is not None else 0.0
                person = (p.respond_minutes + p.manual_minutes) * 60
                res.to_person += 1
                self.schedule(at + person - now, "resume", (job, {jobs.SWAP: at - t - spare, jobs.SPARE: spare,
                                                                  jobs.PERSON: person}))
            else:
                continue
            del self.heals[node]

    def _s(self, when) -> float:
        return (when - self.t0).total_seconds()

    def refill(self, pool: str) -> None:
        self.refills += 1
        name = f"{pool}-refill-{self.refills}"
        self.w.kube.nodes[name] = pool_node(self.spec.pool(pool), name, labels.ROLE_SPARE)

    def person(self, node: str) -> None:
        """Today's way: a person looks at the quarantined node, fixes it (a reboot, a reseat) and says
        `gpufleet mark-healthy`, or `gpufleet retire` when nothing fixes it."""
        rems = [r for r in self.w.store.list() if r.node == node]
        if not rems:
            return
        r = max(rems, key=lambda x: x.created)
        broken = self.w.hardware.state.get(node) == FakeNodes.BROKEN
        if not broken:
            self.w.hardware.state[node] = FakeNodes.HEALTHY
        obj = json.loads(self.w.store.objects[r.name])
        req = PersonRequest(RETIRE if broken else MARK_HEALTHY, "oncall", self.w.clock.now)
        obj["metadata"].setdefault("annotations", {})[labels.ONCALL_REQUEST] = req.dumps()
        self.w.store.objects[r.name] = json.dumps(obj)

    # --- the reconciler's turn ----------------------------------------------------------------------

    def settle(self) -> None:
        w = self.w
        for _ in range(50):
            w.hardware.tick()
            w.slinky()
            w.sync()
            if not w.manager.process_due():
                break


def _faulted(o: dict) -> bool:
    """A node showing a GPU fault (in its grace period, the heal not yet begun, or healed)."""
    return any(c["type"] == "GpuHealthy" and c["status"] == "False" for c in o["status"]["conditions"])


def _bench_spec(spec: FleetSpec, loop: bool, in_place: bool = False) -> FleetSpec:
    """The stack's fleet with lending off (bench/lending.py measures lending: here a spare is idle), the
    repair loop on or off, and (`in_place`) every pool repairing in place when it has no spare free."""
    pools = [p.model_copy(update={"lending": None, **({"repair": p.repair.model_copy(update={"in_place": True})}
                                                      if in_place else {})}) for p in spec.pools]
    repair = spec.healing.repair.model_copy(update={"enabled": loop})
    healing = spec.healing.model_copy(update={"repair": repair})
    return spec.model_copy(update={"pools": pools, "healing": healing})


def run(spec: FleetSpec, p: Params, loop: bool, progress: Callable[[str], None] = lambda s: None,
        trace: list[Interruption] | None = None) -> Result:
    """The month with the reconciler (`loop`: its repair loop on; off, a person repairs `person_hours` after
    the fault). `trace`: these interruptions instead of the seed's draw from Llama 3's table."""
    sim = Sim(spec, p, loop)
    w = sim.w
    res = Result("with the loop" if loop else "without (today)")
    end = p.days * 24 * HOUR
    gpus = {n.name: n.gpus_per_node for n in sim.spec.pools}
    for ev in trace if trace is not None else table.trace(pools_in_service(sim.spec), p.days, p.fault_scale, p.seed):
        heapq.heappush(sim.events, (ev.t, -ev.k - 1, "interrupt", ev))
    waiting: dict[str, float] = {}  # remediation -> seconds waited for a spare
    spares_area, spares_min, last_day = 0.0, None, -1
    pool_spares: dict[str, list[tuple[float, int]]] = {x: [] for x in gpus}  # pool -> (s, spares) at each change
    while True:
        sim.settle()
        sim.follow_heals(res)
        res.steps += 1
        rems = w.store.list()
        waits = [r for r in rems if r.phase is Phase.WAITING_FOR_SPARE]
        waiting_nodes = {r.node for r in waits}  # faulted, still active: they wait for a spare
        healing = any(not r.phase.terminal and r.phase is not Phase.WAITING_FOR_SPARE for r in rems) or any(
            _faulted(o) and o["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_ACTIVE and name not in waiting_nodes
            for name, o in w.kube.nodes.items())
        # a repair under way moves on its own; one held for a person (Stopped) or waiting its turn does not
        repairing = any(r.repair is not None and r.repair.phase in UNDER_WAY for r in rems)
        now = sim.now()
        nxt = sim.events[0][0] if sim.events else end
        # only waits: nothing frees a spare before the next event (a refill, a person), so the step is long
        step = p.heal_step if healing else p.repair_step if repairing else p.wait_step if waits else max(nxt - now, 0.0)
        step = min(step, max(nxt - now, 0.0), end - now) if nxt > now else 0.0
        # what holds over the step
        by_pool = dict.fromkeys(gpus, 0)
        for o in w.kube.nodes.values():
            if o["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_SPARE:
                by_pool[o["metadata"]["labels"][labels.NODE_POOL]] += 1
        for pool, n in by_pool.items():
            if not pool_spares[pool] or pool_spares[pool][-1][1] != n:
                pool_spares[pool].append((now, n))
        spares = sum(by_pool.values())
        spares_min = spares if spares_min is None else min(spares_min, spares)
        spares_area += spares * step
        for r in waits:
            waiting[r.name] = waiting.get(r.name, 0.0) + step
            res.gpu_h_waited += p.job_nodes * gpus[r.pool] * step / HOUR
        out = [o for o in w.kube.nodes.values() if o["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_QUARANTINED]
        res.gpu_h_out += sum(gpus[o["metadata"]["labels"][labels.NODE_POOL]] for o in out) * step / HOUR
        if now >= end:
            break
        if step > 0:
            w.clock.advance(step)
        while sim.events and sim.events[0][0] <= sim.now() + 1e-3:  # the clock counts microseconds
            at, _, kind, data = heapq.heappop(sim.events)
            if kind == "interrupt":
                sim.interrupt(data, res)
            elif kind == "resume":
                job, split = data if isinstance(data, tuple) else (data, None)
                sim.book.resume(job, at, split)
            elif kind == "refill":
                sim.refill(str(data))
            elif kind == "person":
                sim.person(str(data))
        day = int(sim.now() // (24 * HOUR))
        if day != last_day and day % 5 == 0:
            last_day = day
            progress(f"  day {day}: {res.faults} faults, {spares} spares free, {res.steps} reconciler turns")
    rems = w.store.list()
    for node, (job, t) in sim.heals.items():  # still being healed at the end: the swap so far, the wait for a spare
        mine = [r for r in rems if r.node == node and sim._s(r.created) >= t - 1]
        spare = _time_in(max(mine, key=lambda x: x.created), Phase.WAITING_FOR_SPARE, sim._s, end) if mine else 0.0
        sim.book.account(job, end, {jobs.SWAP: end - t - spare, jobs.SPARE: spare})
    finish(res, sim.book, end)
    res.app_faults_retired = sum(1 for r in rems if sim.policy.action(r.kind, r.xid) is FaultAction.RESTART_APP)
    res.spares_min = spares_min or 0
    res.spares_mean = spares_area / end
    res.jobs_waited = len(waiting)
    res.wait_max_h = max(waiting.values(), default=0.0) / HOUR
    res.returned = sum(1 for r in rems if r.repair is not None and r.repair.phase is RepairPhase.RETURNED)
    res.retired = sum(1 for o in w.kube.nodes.values() if o["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_RETIRED)
    res.failed_loops = sum(1 for r in rems if _loop_failed(r))
    res.human_tasks = res.to_person + res.retired + res.failed_loops
    res.failed, res.waits = explain(rems, waiting, pool_spares, sim.t0, end)
    res.pool_spares_min = {pool: min(n for _, n in tl) for pool, tl in pool_spares.items()}
    res.heals = [(r.pool, r.node, round((r.created - sim.t0).total_seconds() / HOUR, 2), r.phase.value)
                 for r in sorted(rems, key=lambda x: x.created)]
    res.gpu_h_waited, res.gpu_h_out, res.spares_mean = (round(x, 1) for x in (res.gpu_h_waited, res.gpu_h_out,
                                                                             res.spares_mean))
    return res


def _time_in(r, phase: Phase, s: Callable, until: float) -> float:
    """Seconds remediation `r` spent in `phase` up to `until` (its phase_times, in order)."""
    marks = [(ph, s(at)) for ph, at in r.phase_times] + [("", until)]
    return sum(max(b - a, 0.0) for (ph, a), (_, b) in zip(marks, marks[1:]) if ph == phase.value)


def _loop_failed(r) -> bool:
    return (r.repair is not None and r.repair.phase is RepairPhase.STOPPED) or r.phase in (Phase.ESCALATED, Phase.FAILED)


def explain(rems: list, waiting: dict[str, float], pool_spares: dict[str, list[tuple[float, int]]], t0,
            end: float) -> tuple[list[dict], list[dict]]:
    """Each failed loop's record, and each wait for a spare with its pool's spares over time and the pool's
    earlier remediations (which spare each took, how its node's repair ended, whether its refill came): what a
    person needs to tell the bench's world from the reconciler's decisions. Hours from the run's start."""
    def h(t) -> float | None:
        return None if t is None else round((t - t0).total_seconds() / HOUR, 2)

    def record(r) -> dict:
        rep = r.repair
        return {"name": r.name, "node": r.node, "pool": r.pool, "xid": r.xid, "created_h": h(r.created),
                "phase": r.phase.value, "reason": r.reason, "replacement": r.replacement,
                "phases": [(ph, h(at)) for ph, at in r.phase_times],
                "refill": None if r.refill is None else {"state": r.refill.state, "at_h": h(r.refill.at),
                                                         "message": r.refill.message},
                "repair": None if rep is None else {
                    "phase": rep.phase.value, "rungs": list(rep.rungs), "reason": rep.reason,
                    "ended_h": h(rep.ended), "history": [(e.step, e.outcome, h(e.at), e.message) for e in rep.history]}}

    failed = [record(r) for r in sorted(rems, key=lambda x: x.created) if _loop_failed(r)]
    waits = []
    by_name = {r.name: r for r in rems}
    for name, secs in sorted(waiting.items(), key=lambda kv: -kv[1]):
        r = by_name[name]
        start = r.entered(Phase.WAITING_FOR_SPARE)
        earlier = [x for x in sorted(rems, key=lambda x: x.created) if x.pool == r.pool and x.created <= r.created
                   and x.name != name]
        waits.append({
            "remediation": name, "pool": r.pool, "from_h": h(start), "waited_h": round(secs / HOUR, 2),
            "ended": r.phase.value if r.phase is not Phase.WAITING_FOR_SPARE else f"still waiting at {end / HOUR:g} h",
            "pool_spares": [(round(t / HOUR, 2), n) for t, n in pool_spares[r.pool]],
            "pool_before": [record(x) for x in earlier], "record": record(r)})
    return failed, waits


def explain_lines(res: Result) -> list[str]:
    """explain()'s findings as lines for a person (bench/repair_month.py --explain)."""
    out = [f"{res.mode}: {len(res.failed)} failed loops, {len(res.waits)} waits for a spare; "
           f"fewest spares per pool {res.pool_spares_min}"]
    for f in res.failed:
        rep = f["repair"]
        out.append(f"  failed {f['name']} ({f['pool']}, XID {f['xid']}, at {f['created_h']} h): {f['phase']}: "
                   f"{f['reason']}; replacement {f['replacement']}; repair "
                   + ("none" if rep is None else f"{rep['phase']} {rep['rungs']}: {rep['reason']}"))
    for wt in res.waits:
        out.append(f"  wait {wt['remediation']} ({wt['pool']}): from {wt['from_h']} h, {wt['waited_h']} h, "
                   f"{wt['ended']}; pool spares (h, n): {wt['pool_spares']}")
        for x in wt["pool_before"]:
            rep, refill = x["repair"], x["refill"]
            out.append(f"    before it: {x['node']} at {x['created_h']} h took {x['replacement'] or 'no spare'}; "
                       f"refill {refill['state'] + ' at ' + str(refill['at_h']) + ' h' if refill else 'none'}; repair "
                       + ("none" if rep is None else f"{rep['phase']} at {rep['ended_h']} h ({' -> '.join(rep['rungs']) or 'no rung'}): "
                                                     f"{rep['reason']}"))
    return out
