"""The same month without gpufleet: a person's pager is the loop (bench/repair_month.py's "pager" rows).

No reconciler runs. A job stopped by a node fault waits for a person: paged, at the keyboard after
`respond_minutes`, then `manual_minutes` to drain the node in Slurm, take one of the pool's spares and requeue
the job (with no spare free, the job waits until one comes back, then the person's manual part again). The
broken node is the person's work for later: `person_hours` after the fault it is repaired (a reset or reboot
fixes what the trace says they fix) and joins the spares, or it is retired and a replacement asked for (granted
`refill_success` of the time, `refill_minutes` later). What the catalogue says a line needs is what a person
would read too (the same classifier); an application fault, the network, a dependency and planned work cost the
job what they cost it with the loop, and so do the rows a person handles in both modes (bench/_interruptions.py).
"""
from __future__ import annotations

import heapq
import random
from collections import deque

from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.models import FleetSpec
from tests.unit.fakes import FakeNodes

import _interruptions as table
import _jobs as jobs
from _interruptions import Cost
from _repair_world import Params, Result, finish, ledger, pools_in_service, truth

HOUR = 3600.0


def run(spec: FleetSpec, p: Params, trace: list[table.Interruption] | None = None) -> Result:
    """`trace`: these interruptions instead of the seed's draw from Llama 3's table."""
    res = Result("a person's pager")
    end = p.days * 24 * HOUR
    book = ledger(spec, p)
    policy = FaultPolicy.from_spec(spec.healing)
    spares = {x.name: x.spares for x in spec.pools}
    queue: dict[str, deque] = {x.name: deque() for x in spec.pools}  # jobs waiting for a spare, first come first
    rng_refill = random.Random(p.seed * 7 + 1)
    respond, manual = p.respond_minutes * 60, p.manual_minutes * 60
    events: list = []
    seq = 0

    def at(t: float, kind: str, data) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    for ev in trace if trace is not None else table.trace(pools_in_service(spec), p.days, p.fault_scale, p.seed):
        at(ev.t, "interrupt", ev)
    pool_min = dict(spares)
    while events and events[0][0] < end:
        t, _, kind, data = heapq.heappop(events)
        if kind == "interrupt":
            ev = data
            need = table.needs(ev.line, policy) if ev.line else None
            node_fault = need is not None and need.remediates
            job = book.interrupt(ev.host, t, waiting=jobs.PERSON, at_checkpoint=ev.row.cost is Cost.PLANNED)
            if job is None:
                res.struck_down += 1
                continue
            res.interruptions += 1
            res.by_row[ev.row.component] = res.by_row.get(ev.row.component, 0) + 1
            label = need.value if need is not None else ev.row.cost.name.lower()
            res.by_need[label] = res.by_need.get(label, 0) + 1
            if need is not None and not node_fault:
                res.app_faults += need.value == "restart-app"
                book.resume(job, t)
            elif node_fault:
                res.faults += 1
                res.to_person += 1
                res.by_action[need.value] = res.by_action.get(need.value, 0) + 1
                at(t + respond, "swap", job)
                at(t + p.person_hours * HOUR, "repair", (job.pool, truth(need, ev.u, p)))
            elif ev.row.cost is Cost.PERSON:
                res.to_person += 1
                at(t + respond + manual, "resume", job)
            else:
                book.resume(job, t)
        elif kind == "swap":  # the person is there: a spare, or the job waits for one
            job = data
            if spares[job.pool] > 0:
                spares[job.pool] -= 1
                pool_min[job.pool] = min(pool_min[job.pool], spares[job.pool])
                at(t + manual, "resume", job)
            else:
                book.wait_for(job, t, jobs.SPARE)
                queue[job.pool].append(job)
                res.jobs_waited += 1
        elif kind == "repair":
            pool, state = data
            if state == FakeNodes.BROKEN:
                res.retired += 1
                if rng_refill.random() < p.refill_success:
                    at(t + p.refill_minutes * 60, "spare", pool)
            else:
                res.returned += 1
                at(t, "spare", pool)
        elif kind == "spare":
            if queue[data]:
                job = queue[data].popleft()
                book.wait_for(job, t, jobs.PERSON)
                at(t + manual, "resume", job)
            else:
                spares[data] += 1
        elif kind == "resume":
            book.resume(data, t)
    finish(res, book, end)
    res.human_tasks = res.to_person + res.returned + res.retired  # each swap, and each broken node's repair or RMA
    res.pool_spares_min = pool_min
    res.spares_min = sum(pool_min.values())
    return res
