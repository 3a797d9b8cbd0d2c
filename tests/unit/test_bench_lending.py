"""bench/lending.py's simulation, small and seeded: its books balance, the floor holds, lending lowers
the idle GPU-hours, the decisions are the core's, and `--json` has the tables' columns as keys."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import _lending_sim as sim  # noqa: E402
    import lending as bench  # noqa: E402
finally:
    sys.path.remove(str(BENCH))

SMALL = ["--nodes", "12", "--spares", "3", "--gpus", "8", "--hours", "2", "--warmup-hours", "0.5",
         "--job-rate", "6", "--max-job-nodes", "4", "--duration-median-hours", "0.5", "--faults-per-day", "24",
         "--refill-minutes", "10", "--idle-after", "300", "--seed", "3"]


def run(*extra: str):
    a = bench.parser().parse_args([*SMALL, *extra])
    spec, pool, _ = bench.pool_spec(a)
    p = bench.params(a, spec, pool)
    return spec, pool, p, sim.simulate(spec, pool, p)


@pytest.fixture(scope="module")
def small():
    return run()


def in_service_gpu_hours(spec, pool, p, r: sim.Result) -> float:
    """Counted apart from the simulation's books: every node of the pool, minus each faulted node from
    its fault until a refilled spare joined in its place."""
    pl = spec.pool(pool)
    start, end = p.warmup_hours * 3600, (p.warmup_hours + p.hours) * 3600
    total = (pl.nodes + pl.spares) * (end - start)
    joins = sorted(r.joined) + [end] * len(r.heals)
    for h, joined in zip(sorted(r.heals, key=lambda h: h.fault_at), joins):
        total -= max(0.0, min(end, joined) - max(start, h.fault_at))
    return total * pl.gpus_per_node / 3600


def training_gpu_hours(spec, pool, p, r: sim.Result) -> float:
    """From the jobs' own runs, not from the nodes."""
    start, end = p.warmup_hours * 3600, (p.warmup_hours + p.hours) * 3600
    runs = [(j.nodes, a, b) for j in r.jobs for a, b in j.runs]
    runs += [(j.nodes, j.started, end) for j in r.jobs if j.started is not None]
    return sum(n * max(0.0, min(b, end) - max(a, start)) for n, a, b in runs) * spec.pool(pool).gpus_per_node / 3600


def test_the_books_balance_in_both_modes(small):
    spec, pool, p, results = small
    for r in results.values():
        gh = r.gpu_hours
        total = in_service_gpu_hours(spec, pool, p, r)
        # each faulted node is out of service from its fault until it is quarantined: counted apart
        assert gh["training"] + gh["lent"] + gh["idle"] + gh["out_of_service"] == pytest.approx(total, abs=0.5)
        assert gh["training"] == pytest.approx(training_gpu_hours(spec, pool, p, r), abs=0.5)
        assert gh["out_of_service"] < 1.0  # seconds of containment per fault
    assert results["without lending"].gpu_hours["lent"] == 0


def test_the_trace_is_the_same_in_both_modes_and_has_faults(small):
    _, _, _, results = small
    a, b = results["without lending"], results["with lending"]
    assert [(j.id, j.nodes, j.submit) for j in a.jobs] == [(j.id, j.nodes, j.submit) for j in b.jobs]
    assert len(a.heals) == len(b.heals) >= 2
    assert all(h.done is not None for h in b.heals[:-1])  # faults heal (the last may still be in progress)


def results_spec_cap(small) -> int:
    spec, pool, _, _ = small
    return spec.pool(pool).max_lent()


def test_lending_lowers_idle_and_never_goes_below_the_floor(small):
    _, _, _, results = small
    off, on = results["without lending"], results["with lending"]
    assert on.gpu_hours["idle"] < 0.6 * off.gpu_hours["idle"]
    assert on.gpu_hours["lent"] > 0 and on.lends > 0 and on.reclaims > 0
    assert on.lend_below_floor == [] and on.overlap == []
    assert 0 < on.max_lent <= results_spec_cap(small)
    done = [j for j in on.jobs if j.start is not None]
    assert len(done) == len([j for j in off.jobs if j.start is not None])  # no job starved by lending


def test_skipping_passes_where_nothing_changed_gives_the_same_answer():
    short = ["--hours", "1", "--warmup-hours", "0.25"]
    _, _, _, skip = run(*short)
    _, _, _, every = run(*short, "--every-pass")
    for mode in skip:
        a, b = skip[mode], every[mode]
        assert a.gpu_hours == pytest.approx(b.gpu_hours) and (a.lends, a.reclaims) == (b.lends, b.reclaims)
    assert every["with lending"].passes > skip["with lending"].passes


def test_the_decisions_are_the_cores(monkeypatch):
    """With a core that lends nothing, the simulation lends nothing: it decides nothing itself."""
    from gpufleet.reconciler.core import lending

    monkeypatch.setattr(lending, "plan_lending", lambda facts, spec, now: lending.LendingPlan())
    _, _, _, results = run("--hours", "0.5", "--warmup-hours", "0.25")
    assert results["with lending"].lends == 0 and results["with lending"].gpu_hours["lent"] == 0


def test_json_has_the_tables_columns_as_keys(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lending.py", "--json"])
    assert bench.main([*SMALL, "--hours", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "lending simulation" in captured.err  # progress on stderr
    assert doc["bench"] == "lending" and doc["mode"] == "simulation" and doc["argv"] == ["--json"]
    idle, delays = doc["tables"]
    assert all(set(r) == set(idle["columns"]) for r in idle["rows"])
    modes = {r["mode"]: r for r in idle["rows"]}
    assert set(modes) == {"without lending", "with lending"}
    assert isinstance(modes["with lending"]["idle"], float) and modes["with lending"]["lends below floor"] == 0
    assert [r["measure"] for r in delays["rows"]][0].startswith("reclaim")
    assert set(doc["raw"]["modes"]) == set(modes) and doc["raw"]["params"]["seed"] == 3


def test_help_exits_zero():
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
