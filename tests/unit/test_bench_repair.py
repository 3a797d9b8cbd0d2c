"""bench/repair_month.py's world, small and seeded: a pool with no spare makes its jobs wait while the other
pool heals (the failed loops of the week at 10.5x were the world's, not the core's), and `explain` tells each
wait's pool, its spares over time and what took them."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import _repair_world as world  # noqa: E402
finally:
    sys.path.remove(str(BENCH))

from reconciler.core.phases import Phase  # noqa: E402
from tests.unit.fakes import fleet  # noqa: E402


def two_pools(in_place=False):
    """h100 with a spare, l40s with none; refills never come; l40s repairs the waiting job's node in place
    only when `in_place` (the spec's default; off here, so its jobs wait for a spare that never comes)."""
    spec = fleet(nodes=12, spares=1, pools=("h100", "l40s"), grace_period_seconds=0)
    l40s = spec.pools[1]
    return spec.model_copy(update={"pools": [spec.pools[0], l40s.model_copy(update={
        "spares": 0, "repair": l40s.repair.model_copy(update={"in_place": in_place})})]})


def test_jobs_wait_only_in_the_pool_with_no_spare_and_the_other_pool_heals_meanwhile():
    res = world.run(two_pools(), world.Params(days=1, fault_scale=100, refill_success=0, seed=1), loop=True)
    assert res.faults >= 4 and res.failed_loops == 0 and res.failed == []
    assert [w["pool"] for w in res.waits] == ["l40s", "l40s"]
    first = min(w["from_h"] for w in res.waits)
    for w in res.waits:
        assert w["pool_spares"] == [(0.0, 0)] and w["ended"] == "still waiting at 24 h"
        assert w["record"]["phase"] == Phase.WAITING_FOR_SPARE.value
    assert all(x["replacement"] is None for w in res.waits for x in w["pool_before"])  # l40s never had a spare
    assert res.pool_spares_min == {"h100": 0, "l40s": 0}
    lines = world.explain_lines(res)
    assert lines[0].startswith("with the loop: 0 failed loops, 2 waits for a spare")
    assert any(line.startswith("  wait l40s-") for line in lines)
    h100 = [(at, phase) for pool, _, at, phase in res.heals if pool == "h100"]
    assert h100 and all(phase == Phase.SUCCEEDED.value for _, phase in h100), res.heals  # every h100 fault healed,
    assert any(at > first for at, _ in h100), res.heals  # some of them while an l40s job waited for a spare


def test_explain_names_each_failed_loops_record():
    rems_failed = world.Result("with the loop", failed=[{
        "name": "h100-3-xid48-1", "pool": "h100", "xid": 48, "created_h": 1.5, "phase": "Failed",
        "reason": "replacement h100-spare-0 not taking jobs within 0:10:00", "replacement": "h100-spare-0",
        "repair": {"phase": "Returned", "rungs": ["reset-gpu"], "reason": "passed"}}])
    (head, line) = world.explain_lines(rems_failed)
    assert "1 failed loops" in head
    assert "h100-3-xid48-1 (h100, XID 48, at 1.5 h): Failed: replacement h100-spare-0 not taking jobs" in line
    assert "repair Returned ['reset-gpu']: passed" in line


def test_with_the_default_in_place_repair_a_job_with_no_spare_gets_its_own_node_back():
    """The same world with the spec's default: the l40s jobs' own nodes are repaired while they wait, and the
    jobs run again on them (no wait lasts the day)."""
    res = world.run(two_pools(in_place=True), world.Params(days=1, fault_scale=100, refill_success=0, seed=1),
                    loop=True)
    waits = [w for w in res.waits if w["pool"] == "l40s"]
    assert waits and all(w["ended"] != "still waiting at 24 h" for w in waits), waits
