"""bench/repair_month.py's world, small and seeded: a pool with no spare makes its jobs wait while the other
pool heals, `explain` tells each wait's pool, its spares over time and what took them; and the effective
training time's model: Llama 3's table mapped through the real classifier, the jobs' ledger, the loop (the real
reconciler) against a person's pager on the same interruptions."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import _interruptions as table  # noqa: E402
    import _jobs as jobs  # noqa: E402
    import _pager as pager  # noqa: E402
    import _repair_world as world  # noqa: E402
finally:
    sys.path.remove(str(BENCH))

from gpufleet.fleetspec.faults import FaultAction  # noqa: E402
from gpufleet.fleetspec.faults.policy import FaultPolicy  # noqa: E402
from gpufleet.reconciler.core.phases import Phase  # noqa: E402
from tests.unit.fakes import fleet  # noqa: E402


def two_pools(in_place=False):
    """h100 with a spare, l40s with none; refills never come; l40s repairs the waiting job's node in place
    only when `in_place` (the spec's default; off here, so its jobs wait for a spare that never comes)."""
    spec = fleet(nodes=12, spares=1, pools=("h100", "l40s"), grace_period_seconds=0)
    l40s = spec.pools[1]
    return spec.model_copy(update={"pools": [spec.pools[0], l40s.model_copy(update={
        "spares": 0, "repair": l40s.repair.model_copy(update={"in_place": in_place})})]})


def row(component: str) -> table.Row:
    (r,) = [r for r in table.ROWS if r.component == component]
    return r


def interruptions(component: str, hosts: list[str], every: float = 3600.0, line: int = 0) -> list[table.Interruption]:
    """One interruption of `component` on each host in turn, `every` seconds apart; `u` 0: a reset or reboot
    fixes the node."""
    r = row(component)
    return [table.Interruption(every * (i + 1), i, r, h, r.lines[line] if r.lines else None, 0.0)
            for i, h in enumerate(hosts)]


def test_jobs_wait_only_in_the_pool_with_no_spare_and_the_other_pool_heals_meanwhile():
    spec = two_pools()
    trace = interruptions("GPU HBM3 Memory", ["l40s-w0", "h100-w0", "l40s-w5", "h100-w5", "h100-w9"], every=1800)
    res = world.run(spec, world.Params(days=0.5, refill_success=0, job_nodes=4), loop=True, trace=trace)
    assert res.faults == 5 and res.failed_loops == 0 and res.failed == []
    assert {w["pool"] for w in res.waits} == {"l40s"} and len(res.waits) == 2  # both l40s faults, nothing else
    first = min(w["from_h"] for w in res.waits)
    for w in res.waits:
        assert w["pool_spares"] == [(0.0, 0)] and w["ended"] == "still waiting at 12 h"
        assert w["record"]["phase"] == Phase.WAITING_FOR_SPARE.value
    assert all(x["replacement"] is None for w in res.waits for x in w["pool_before"])  # l40s never had a spare
    lines = world.explain_lines(res)
    assert lines[0].startswith("with the loop: 0 failed loops, 2 waits for a spare")
    assert any(line.startswith("  wait l40s-") for line in lines)
    h100 = [(at, phase) for pool, _, at, phase in res.heals if pool == "h100"]
    assert len(h100) == 3 and all(phase == Phase.SUCCEEDED.value for _, phase in h100), res.heals
    assert any(at > first for at, _ in h100), res.heals  # some of them while an l40s job waited for a spare
    # the two stopped l40s jobs' time went to waiting for a spare, the h100 jobs' to a swap of seconds
    assert res.lost_gpu_h[jobs.SPARE] > 0 and res.lost_gpu_h[jobs.PERSON] == 0


def test_with_the_default_in_place_repair_a_job_with_no_spare_gets_its_own_node_back():
    """The same world with the spec's default: the l40s jobs' own nodes are repaired while they wait, and the
    jobs run again on them (no wait lasts the run)."""
    trace = interruptions("GPU HBM3 Memory", ["l40s-w0", "h100-w0", "l40s-w5"], every=1800)
    res = world.run(two_pools(in_place=True), world.Params(days=0.5, refill_success=0, job_nodes=4), loop=True,
                    trace=trace)
    waits = [w for w in res.waits if w["pool"] == "l40s"]
    assert waits and all(w["ended"] != "still waiting at 12 h" for w in waits), waits
    assert res.effective > world.run(two_pools(), world.Params(days=0.5, refill_success=0, job_nodes=4), loop=True,
                                     trace=trace).effective


def test_explain_names_each_failed_loops_record():
    rems_failed = world.Result("with the loop", failed=[{
        "name": "h100-3-xid48-1", "pool": "h100", "xid": 48, "created_h": 1.5, "phase": "Failed",
        "reason": "replacement h100-spare-0 not taking jobs within 0:10:00", "replacement": "h100-spare-0",
        "repair": {"phase": "Returned", "rungs": ["reset-gpu"], "reason": "passed"}}])
    (head, line) = world.explain_lines(rems_failed)
    assert "1 failed loops" in head
    assert "h100-3-xid48-1 (h100, XID 48, at 1.5 h): Failed: replacement h100-spare-0 not taking jobs" in line
    assert "repair Returned ['reset-gpu']: passed" in line


# --- Llama 3's table --------------------------------------------------------------------------------

def test_every_row_of_llama3s_table_is_modelled_and_each_line_gets_the_classifiers_answer():
    assert sum(r.count for r in table.ROWS if r is not table.PLANNED) == table.LLAMA3_UNEXPECTED
    assert table.PLANNED.count == table.LLAMA3_PLANNED
    policy = FaultPolicy()
    needs = {r.component: {table.needs(line, policy) for line in r.lines} for r in table.ROWS}
    assert needs["Software Bug"] == {FaultAction.RESTART_APP}  # the job's bug: the node stays
    for r in table.ROWS:  # every GPU line takes the node out or restarts the app: none is ignored
        assert all(n is not FaultAction.NONE for n in needs[r.component]), r
        assert r.gpufleet == bool(r.lines) and (r.cost is table.Cost.GPUFLEET) == r.gpufleet
    # the table's GPU rows that show a line are gpufleet's; the host's and the network's are not
    assert all(r.gpufleet for r in table.ROWS if r.category == "GPU" and r.component != "Silent Data Corruption")
    assert not any(r.gpufleet for r in table.ROWS if r.category in ("Host", "Network"))


def test_a_trace_is_the_same_for_the_same_seed_and_ten_times_the_rate_gives_more_unexpected_interruptions():
    pools = {"h100": (128, 8)}
    one = table.trace(pools, 30, 1, seed=3)
    assert one == table.trace(pools, 30, 1, seed=3)
    ten = table.trace(pools, 30, 10, seed=3)
    unexpected = lambda tr: sum(1 for ev in tr if ev.row is not table.PLANNED)  # noqa: E731
    assert unexpected(ten) > 5 * unexpected(one)
    assert all(ev.host.startswith("h100-w") and int(ev.host[6:]) < 128 for ev in ten)


# --- the jobs' ledger ---------------------------------------------------------------------------------

def test_the_work_since_the_last_checkpoint_is_lost_and_the_rest_of_a_run_is_progress():
    book = jobs.Ledger({"p": (4, 8)}, job_nodes=4, checkpoint=600, restart=60)
    (job,) = book.jobs
    assert job.gpus == 32 and book.of_host["p-w3"] is job
    assert book.interrupt("p-w1", 1500) is job  # 1,500 s of work: checkpoints at 600 and 1,200, 300 s lost
    assert book.interrupt("p-w2", 1600) is None  # stopped already: nothing more to lose
    book.resume(job, 1900, {jobs.SWAP: 100, jobs.PERSON: 300})
    book.close(2000)  # 60 s of restart, then 40 s of work: progress, not lost
    s = job.seconds
    assert (s[jobs.LOST_WORK], s[jobs.RESTART], s[jobs.SWAP], s[jobs.PERSON]) == (300, 60, 100, 300)
    assert abs(book.effective(2000) - (1 - 760 / 2000)) < 1e-9


def test_more_checkpoints_lose_less_work():
    spec = two_pools()
    lost = {}
    for minutes in (15, 60, 240):
        res = pager.run(spec, world.Params(days=10, fault_scale=40, checkpoint_minutes=minutes, seed=2))
        assert res.interruptions > 10
        lost[minutes] = res.lost_gpu_h[jobs.LOST_WORK]
    assert lost[15] < lost[60] < lost[240], lost


# --- the loop against a person's pager ----------------------------------------------------------------

def test_an_application_fault_restarts_the_job_and_never_takes_a_node_out():
    spec = fleet(nodes=8, spares=2, grace_period_seconds=0)
    hosts = ["h100-w1", "h100-w1", "h100-w6", "h100-w1"]  # the same GPU again and again, too
    trace = interruptions("Software Bug", hosts, every=900) + \
        [table.Interruption(3600 + 900 * i, 10 + i, row("Software Bug"), "h100-w1", row("Software Bug").lines[1], 0.0)
         for i in range(3)]
    res = world.run(spec, world.Params(days=0.25, job_nodes=4), loop=True, trace=trace)
    assert res.app_faults == res.interruptions == len(trace)
    assert res.faults == 0 and res.app_faults_retired == 0 and res.heals == [] and res.retired == 0
    assert res.lost_gpu_h[jobs.SWAP] == res.lost_gpu_h[jobs.SPARE] == res.lost_gpu_h[jobs.PERSON] == 0
    assert res.lost_gpu_h[jobs.RESTART] > 0  # it costs the job its restart, nothing else


def test_the_loop_beats_the_pager_on_the_same_interruptions():
    spec = two_pools()
    p = world.Params(days=2, fault_scale=60, seed=5, job_nodes=4)
    loop, paged = world.run(spec, p, loop=True), pager.run(spec, p)
    assert loop.faults > 0 and paged.faults > 0  # node faults gpufleet acts on were drawn
    assert loop.effective > paged.effective, (loop.lost_gpu_h, paged.lost_gpu_h)
    assert loop.lost_gpu_h[jobs.PERSON] < paged.lost_gpu_h[jobs.PERSON]
    assert loop.job_gpu_h == paged.job_gpu_h


def test_what_is_not_gpufleets_costs_the_same_with_the_loop_and_without():
    spec = fleet(nodes=8, spares=1, grace_period_seconds=0)
    trace = interruptions("Power Supply", ["h100-w0", "h100-w5"]) + interruptions("Network Switch/Cable",
                                                                                   ["h100-w2"], every=9000)
    p = world.Params(days=0.25, job_nodes=4)
    loop, paged = world.run(spec, p, loop=True, trace=trace), pager.run(spec, p, trace=trace)
    assert loop.faults == paged.faults == 0 and loop.to_person == paged.to_person == 2
    assert loop.lost_gpu_h == paged.lost_gpu_h and loop.effective == paged.effective < 1


def test_a_node_held_for_a_person_heals_its_job_and_does_not_hold_the_clock():
    """A contact-support fault: the job is healed on a spare, the node is held for a person (its repair Stopped);
    the clock then jumps to the next event instead of stepping a minute at a time for the rest of the run."""
    spec = fleet(nodes=8, spares=2, grace_period_seconds=0)
    trace = interruptions("GPU Thermal Interface + Sensor", ["h100-w1"])
    res = world.run(spec, world.Params(days=1, job_nodes=4), loop=True, trace=trace)
    assert res.by_action == {"contact-support": 1} and res.heals[0][3] == Phase.SUCCEEDED.value
    assert res.lost_gpu_h[jobs.PERSON] == 0  # the job did not wait for the person: the node did
    assert res.steps < 24 * 60 / 10, res.steps  # not a step a minute until the end of the day
