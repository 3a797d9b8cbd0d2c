"""Lending idle GPUs (issue 13): what it gains, what it costs training and healing.

A discrete-event simulation of one pool over a day of a synthetic trace (Slurm jobs arriving,
faults at a declared rate, inference that takes every GPU it is lent), run twice on the same trace:
without lending and with it. The decisions are the real core's (`gpufleet.reconciler.core.lending.plan_lending`
each simulated second, `decide.plan_step` for the faults); the world around it is modelled
(bench/_lending_sim.py). Reported per mode: GPU-hours idle, lent, training; the jobs' wait to start;
reclaims; the spare floor. The delays of a reclaim (pending job -> running on a reclaimed node) and
of a lent spare (fault -> healthy) are model parameters in the simulation (--reclaim-seconds,
--pod-start-seconds); `--real` measures both on the real local pieces instead.

The pool: the prod stack's largest (Pulumi.prod.yaml), with its `lending` section, or a default one
when the stack declares none; or --nodes/--spares/--gpus.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from _repo import REPO  # noqa: E402
from _output import add_json_option, exit_on_sigterm, load, machine, Output, pct, say, Table  # noqa: E402

from gpufleet.fleetspec import parse_fleet  # noqa: E402
from gpufleet.fleetspec.load import load_stack_file  # noqa: E402
from gpufleet.fleetspec.models import FleetSpec  # noqa: E402

import _lending_sim as sim  # noqa: E402

DEFAULT_LENDING = {"spares": True, "idle_nodes": True, "idle_after_seconds": 600, "spare_floor": 1,
                   "reclaim_grace_seconds": 30, "max_lent_fraction": 0.5,
                   "borrowers": {"selector": {"app.kubernetes.io/name": "inference"}}}


def pool_spec(a: argparse.Namespace) -> tuple[FleetSpec, str, str]:
    """The fleet to simulate, the pool's name, and where it came from."""
    lend = dict(DEFAULT_LENDING)
    overrides = {"idle_after_seconds": a.idle_after, "spare_floor": a.floor, "reclaim_grace_seconds": a.reclaim_grace,
                 "max_lent_fraction": a.max_lent}
    if a.nodes is not None or a.spares is not None or a.gpus is not None:
        pool = {"name": "pool", "node_type": "sim", "gpu_model": "H100-SXM5-80GB", "gpus_per_node": a.gpus or 8,
                "nodes": a.nodes if a.nodes is not None else 128, "spares": a.spares if a.spares is not None else 8}
        source = f"--nodes {pool['nodes']} --spares {pool['spares']} --gpus {pool['gpus_per_node']}"
    else:
        stack = load_stack_file(a.stack)
        best = max(stack.fleet.pools, key=lambda p: (p.nodes * p.gpus_per_node, p.spares))
        pool = best.model_dump(mode="json", exclude_none=True)
        if best.lending is not None:
            lend = best.lending.model_dump(mode="json")
            source = f"{Path(a.stack).name}: pool {best.name} and its lending section"
        else:
            source = f"{Path(a.stack).name}: pool {best.name} (it declares no lending: the default section is used)"
        for k in ("aws", "provider", "member_selector"):
            pool.pop(k, None)
    lend.update({k: v for k, v in overrides.items() if v is not None})
    if a.no_idle_nodes:
        lend["idle_nodes"] = False
    if a.no_spares:
        lend["spares"] = False
    pool["lending"] = lend
    doc = {"environment": "bench", "cluster": {"kind": "local"}, "pools": [pool],
           "slurm": {"partitions": [{"name": "train", "pools": [pool["name"]], "default": True}]}}
    return parse_fleet(doc, source="bench/lending.py"), pool["name"], source


def summary(r: sim.Result, p: sim.Params) -> dict:
    start = p.warmup_hours * 3600
    jobs = [j for j in r.jobs if j.submit >= start]
    waits = [(j.start - j.submit) / 60 for j in jobs if j.start is not None]
    heals = [h for h in r.heals if h.fault_at >= start and h.done is not None]
    gh = r.gpu_hours
    total = gh["training"] + gh["lent"] + gh["idle"]
    return {
        "mode": r.mode, "gpu_h_total": total, "gpu_h_training": gh["training"], "gpu_h_lent": gh["lent"],
        "gpu_h_idle": gh["idle"], "gpu_h_idle_spares": gh["idle_spares"], "gpu_h_out_of_service": gh["out_of_service"],
        "jobs_submitted": len(jobs), "jobs_started": len(waits), "wait_mean_min": sum(waits) / len(waits) if waits else None,
        "wait_p95_min": pct(waits, 95), "wait_max_min": max(waits) if waits else None,
        "jobs_on_reclaimed": sum(1 for j in jobs if j.on_reclaimed),
        "lends": r.lends, "reclaims": r.reclaims, "wasted_reclaims": r.wasted_reclaims,
        "reclaim_reasons": r.reclaim_reasons, "short_loans": r.short_loans, "max_lent": r.max_lent,
        "lends_below_floor": len(r.lend_below_floor), "lends_below_floor_at": r.lend_below_floor[:10],
        "seconds_below_floor": r.seconds_below_floor, "overlaps": len(r.overlap), "overlaps_at": r.overlap[:10],
        "faults": len(heals),
        "heal_s": [h.done - h.fault_at for h in heals],
        "heal_lent_s": [h.done - h.fault_at for h in heals if h.replacement_lent],
        "heal_unlent_s": [h.done - h.fault_at for h in heals if not h.replacement_lent],
        "reclaim_to_run_s": r.reclaim_to_run, "passes": r.passes,
    }


def paired_delay(results: dict[str, sim.Result], p: sim.Params) -> dict:
    """Job by job (the same trace): how much later each started with lending than without."""
    start = p.warmup_hours * 3600
    off = {j.id: j.start for j in results["without lending"].jobs if j.submit >= start}
    d = [j.start - off[j.id] for j in results["with lending"].jobs
         if j.id in off and j.start is not None and off[j.id] is not None]
    later = [x for x in d if x > 0.5]
    return {"jobs": len(d), "later": len(later), "earlier": sum(1 for x in d if x < -0.5),
            "later_mean_s": sum(later) / len(later) if later else 0.0, "later_max_s": max(later) if later else 0.0}


def sim_tables(out: dict[str, dict], p: sim.Params, source: str, spec: FleetSpec, pool: str,
               paired: dict | None = None) -> list[Table]:
    lend = spec.pool(pool).lending
    rows = [[s["mode"], s["gpu_h_total"], s["gpu_h_training"], s["gpu_h_lent"], s["gpu_h_idle"], s["gpu_h_idle_spares"],
             s["jobs_started"], s["wait_mean_min"], s["wait_p95_min"], s["reclaims"], s["wasted_reclaims"],
             s["lends_below_floor"], s["seconds_below_floor"]] for s in out.values()]
    base, lent = out["without lending"], out["with lending"]
    saved = base["gpu_h_idle"] - lent["gpu_h_idle"]
    pl = spec.pool(pool)
    notes = [
        f"pool: {source}; {pl.nodes} nodes + {pl.spares} spares x {pl.gpus_per_node} GPUs; lending: spares "
        f"{lend.spares}, idle nodes {lend.idle_nodes} after {lend.idle_after_seconds}s, floor {lend.spare_floor}, "
        f"at most {lend.max_lent_fraction:.0%} lent, reclaim grace {lend.reclaim_grace_seconds}s",
        f"trace: {p.hours:g} h measured after {p.warmup_hours:g} h warm-up, seed {p.seed}; {p.job_rate:g} jobs/h, "
        f"1..{p.max_job_nodes} nodes, lognormal durations (median {p.duration_median_hours:g} h, sigma "
        f"{p.duration_sigma:g}); {p.faults_per_day:g} faults/day, refill after {p.refill_minutes:g} min",
        f"model: borrowers leave {p.reclaim_seconds:g}s after a reclaim starts (forced at the grace), a NodeSet pod "
        f"starts in {p.pod_start_seconds:g}s, borrowers serve {p.borrower_start_seconds:g}s after a lend, containment "
        f"{p.contain_seconds:g}s",
        (f"job by job: {paired['later']} of {paired['jobs']} jobs started later with lending (by "
         f"{paired['later_mean_s']:.0f}s on average, {paired['later_max_s']:.0f}s at most), {paired['earlier']} earlier"
         if paired else ""),
        f"at most {lent['max_lent']} nodes lent at once (the cap: {pl.max_lent()})",
        "of them wasted: loans taken back for a pending job and lent again before any job ran there",
        f"lending turned {saved:.0f} idle GPU-hours ({saved / base['gpu_h_idle']:.0%} of them) into "
        f"{lent['gpu_h_lent']:.0f} GPU-hours of inference" if base["gpu_h_idle"] else "no idle GPU-hours",
    ]
    notes = [n for n in notes if n]
    t1 = Table("GPU-hours in a day of the trace, and the jobs' wait to start",
               ["mode", "GPU-h in service", "training", "lent", "idle", "idle (spares)", "jobs started",
                "wait mean min", "wait p95 min", "reclaims", "of them wasted", "lends below floor",
                "s below floor (faults)"], rows, notes)
    rr = lent["reclaim_to_run_s"]
    hl, hu = lent["heal_lent_s"], lent["heal_unlent_s"]
    rows2 = [
        ["reclaim (pending job) -> job running there", len(rr), pct(rr, 50), pct(rr, 95), max(rr) if rr else None],
        ["fault -> healthy, unlent spare", len(hu), pct(hu, 50), pct(hu, 95), max(hu) if hu else None],
        ["fault -> healthy, lent spare", len(hl), pct(hl, 50), pct(hl, 95), max(hl) if hl else None],
        ["fault -> healthy, without lending", len(base["heal_s"]), pct(base["heal_s"], 50), pct(base["heal_s"], 95),
         max(base["heal_s"]) if base["heal_s"] else None],
    ]
    t2 = Table("Delays with lending, simulated (seconds)", ["measure", "n", "median", "p95", "max"], rows2,
               ["In the simulation these follow from the model parameters (--reclaim-seconds, --pod-start-seconds, "
                "--contain-seconds, the 1 s pass); `--real` measures them on the real pieces."])
    return [t1, t2]


def params(a: argparse.Namespace, spec: FleetSpec, pool: str) -> sim.Params:
    lend = spec.pool(pool).lending
    return sim.Params(
        hours=a.hours, warmup_hours=a.warmup_hours, job_rate=a.job_rate, max_job_nodes=a.max_job_nodes,
        duration_median_hours=a.duration_median_hours, duration_sigma=a.duration_sigma,
        faults_per_day=a.faults_per_day, refill_minutes=a.refill_minutes,
        reclaim_seconds=a.reclaim_seconds if a.reclaim_seconds is not None else float(lend.reclaim_grace_seconds),
        pod_start_seconds=a.pod_start_seconds, borrower_start_seconds=a.borrower_start_seconds,
        contain_seconds=a.contain_seconds, every_pass=a.every_pass, seed=a.seed)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("the pool")
    g.add_argument("--stack", default=str(REPO / "Pulumi.prod.yaml"), help="stack file whose largest pool is simulated")
    g.add_argument("--nodes", type=int, help="instead of the stack: active nodes")
    g.add_argument("--spares", type=int, help="instead of the stack: spares")
    g.add_argument("--gpus", type=int, help="instead of the stack: GPUs per node")
    g.add_argument("--idle-after", type=int, help="lending.idle_after_seconds (default: the stack's, else 600)")
    g.add_argument("--floor", type=int, help="lending.spare_floor")
    g.add_argument("--reclaim-grace", type=int, help="lending.reclaim_grace_seconds")
    g.add_argument("--max-lent", type=float, help="lending.max_lent_fraction")
    g.add_argument("--no-idle-nodes", action="store_true", help="lend spares only")
    g.add_argument("--no-spares", action="store_true", help="lend idle nodes only")
    g = ap.add_argument_group("the trace")
    g.add_argument("--hours", type=float, default=24.0, help="hours measured (default 24)")
    g.add_argument("--warmup-hours", type=float, default=6.0, help="simulated first, not counted (default 6)")
    g.add_argument("--job-rate", type=float, default=5.0, help="Slurm jobs per hour, Poisson (default 5)")
    g.add_argument("--max-job-nodes", type=int, default=16, help="job sizes 1..N nodes, log-uniform (default 16)")
    g.add_argument("--duration-median-hours", type=float, default=2.0, help="lognormal job duration's median (2)")
    g.add_argument("--duration-sigma", type=float, default=1.0, help="lognormal job duration's sigma (1.0)")
    g.add_argument("--faults-per-day", type=float, default=4.0, help="faults on the pool's nodes per day (default 4)")
    g.add_argument("--refill-minutes", type=float, default=20.0, help="a used spare is refilled after (default 20)")
    g.add_argument("--seed", type=int, default=1)
    g = ap.add_argument_group("the model (seconds)")
    g.add_argument("--reclaim-seconds", type=float,
                   help="a reclaim starts -> its borrowers are gone (default: the reclaim grace; forced at the grace)")
    g.add_argument("--pod-start-seconds", type=float, default=5.0, help="a NodeSet pod starts on a node (default 5)")
    g.add_argument("--borrower-start-seconds", type=float, default=30.0, help="a lend -> borrowers serve (default 30)")
    g.add_argument("--contain-seconds", type=float, default=5.0,
                   help="fault -> contained and requeued, the core's Replacing begins (default 5)")
    g.add_argument("--every-pass", action="store_true",
                   help="run the lending pass every simulated second even when nothing changed (slower, same result)")
    g = ap.add_argument_group("measured on the real pieces")
    g.add_argument("--real", action="store_true",
                   help="measure pending job -> running on a reclaimed node, and fault -> healthy with a lent spare, on "
                        "a real API server with kwok nodes, real Slurm, the Slinky stand-in and the reconciler's Runtime")
    g.add_argument("--repeat", type=int, default=20, help="--real: measurements of each (default 20)")
    g.add_argument("--standin-interval", type=float, default=1.0,
                   help="--real: seconds between the Slinky stand-in's passes (default 1, as the local environment)")
    g.add_argument("--root", type=Path, help="--real: work folder (default: a new one under /tmp)")
    g.add_argument("--keep", action="store_true", help="--real: leave the work folder in place")
    add_json_option(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    out = Output("lending", a.json)
    exit_on_sigterm()
    if a.real:
        import _lending_real

        tables, raw = _lending_real.run(a)
        out.emit(tables, raw=raw, mode="real")
        return 0
    spec, pool, source = pool_spec(a)
    p = params(a, spec, pool)
    say(f"lending simulation: {source}; {machine()}")
    results = sim.simulate(spec, pool, p, progress=say)
    out_rows = {k: summary(r, p) for k, r in results.items()}
    for s in out_rows.values():
        say(f"{s['mode']}: idle {s['gpu_h_idle']:.0f} GPU-h, lent {s['gpu_h_lent']:.0f}, training "
            f"{s['gpu_h_training']:.0f}; {s['jobs_started']} jobs started, wait mean {s['wait_mean_min'] or 0:.1f} min; "
            f"{s['passes']} lending passes")
    paired = paired_delay(results, p)
    out.emit(sim_tables(out_rows, p, source, spec, pool, paired),
             raw={"params": asdict(p), "modes": out_rows, "paired": paired},
             mode="simulation", pool=pool, source=source, load_at_end=load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
