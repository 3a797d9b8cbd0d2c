"""The repair loop (issue 25) over a month of the prod stack's fleet: what it saves in spares, waiting jobs,
GPU-hours and people's work, against today's way (every broken node waits for a person).

The decisions are the real reconciler's: its runtime and pure core (`reconciler.runtime.manager.Manager`:
detect, heal, promote a spare, quarantine, refill, then `reconciler.core.repair`'s ladder and the
validation before service), run through the unit tests' fakes of the API server, Slurm, the provider, the
node agent and the health-check Jobs (tests/unit/fakes.py `World`), on a fake clock. What is modelled is
the world around it, declared as parameters below (bench/_repair_world.py):

- faults: Meta's Llama 3 405B run (The Llama 3 Herd of Models, arXiv:2407.21783, table 5): 419 unexpected
  interruptions in 54 days on 16,384 H100s, 58.7 % of them GPU faults (faulty GPU incl. NVLink 30.1 %,
  HBM3 17.2 %, SRAM 4.5 %, GPU system processor 4.1 %, the rest thermal/sensor and silent data
  corruption). Only those GPU faults are modelled: the others (network, software, host) are not a node's
  GPU fault gpufleet detects. Rate per GPU-hour, on the GPUs in service, Poisson.
- which XID each category shows and so which action the fault catalogue gives it (an ASSUMPTION, the
  paper names categories, not XIDs): faulty GPU half XID 79 (reboot), half XID 74 NVLink (reset-gpu); HBM3
  XID 48 (reset-gpu); SRAM XID 95 (reset-gpu); GSP XID 119 (reset-gpu); thermal/SDC an XID the catalogue
  says replace.
- what truly fixes the node (ASSUMPTIONS): a reset-gpu fault is fixed by the reset 70 % of the time, by a
  reboot 20 %, by nothing 10 %; a reboot fault by the reboot 85 %, by nothing 15 %; a replace fault never.
- durations (ASSUMPTIONS): a reboot 10 min (a p5), a GPU reset at once, the health check 15 min (DCGM
  level 2 and an all-reduce); a refill is granted 30 % of the time (H100 capacity is scarce) and then
  joins in 20 min; without the loop a person acts 24 h after the fault (fixes it, or retires it when
  nothing fixes it).

Run: `python bench/repair_month.py` (about a minute on 2 cores), `--json` for the machine form;
`--days 7 --fault-scale 10.5` is a week at Meta's research-cluster rate (a failure every ~8 h per 1,024 GPUs,
every failure taken as a GPU fault: an upper bound), about 4 minutes.
"""
from __future__ import annotations

import argparse
import sys

from _repo import REPO  # noqa: E402
from _output import add_json_option, exit_on_sigterm, Output, say, Table  # noqa: E402

from fleetspec.load import load_stack_file  # noqa: E402

import _repair_world as world  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    d = world.Params()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=str(REPO / "Pulumi.prod.yaml"))
    ap.add_argument("--days", type=float, default=d.days)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--fault-scale", type=float, default=d.fault_scale,
                    help="multiply the Llama 3 GPU fault rate (2 = twice as many faults)")
    ap.add_argument("--refill-success", type=float, default=d.refill_success)
    ap.add_argument("--refill-minutes", type=float, default=d.refill_minutes)
    ap.add_argument("--person-hours", type=float, default=d.person_hours)
    ap.add_argument("--reboot-minutes", type=float, default=d.reboot_minutes)
    ap.add_argument("--check-minutes", type=float, default=d.check_minutes)
    ap.add_argument("--job-nodes", type=int, default=d.job_nodes,
                    help="nodes of the job a fault stops (it waits whole for a spare)")
    ap.add_argument("--in-place", action="store_true",
                    help="every pool repairs in place when no spare is free (pools[].repair.in_place, on by default: the stack may turn it off)")
    ap.add_argument("--explain", action="store_true",
                    help="print each failed loop's record and each wait for a spare (its pool's spares over time, "
                         "the remediations that took them); always in the JSON's raw")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output("repair_month", a.json)
    exit_on_sigterm()
    p = world.Params(days=a.days, seed=a.seed, fault_scale=a.fault_scale, refill_success=a.refill_success,
                     refill_minutes=a.refill_minutes, person_hours=a.person_hours, reboot_minutes=a.reboot_minutes,
                     check_minutes=a.check_minutes, job_nodes=a.job_nodes, in_place=a.in_place)
    spec = load_stack_file(a.stack).fleet
    results = []
    for loop in (False, True):
        say(f"{'with' if loop else 'without'} the repair loop: {p.days:g} days of {a.stack}")
        results.append(world.run(spec, p, loop=loop, progress=say))
    if a.explain:
        for r in results:
            for line in world.explain_lines(r):
                say(line)
    weeks = p.days / 7
    cols = ["mode", "faults", "spares free min", "spares free mean", "jobs waited for a spare", "wait max h",
            "GPU-h jobs waited", "GPU-h nodes out", "nodes returned", "nodes retired", "loops failed",
            "human tasks / week"]
    rows = [[r.mode, r.faults, r.spares_min, r.spares_mean, r.jobs_waited, r.wait_max_h, r.gpu_h_waited,
             r.gpu_h_out, r.returned, r.retired, r.failed_loops, r.human_tasks / weeks] for r in results]
    fleet = sum(x.nodes for x in spec.pools)
    spares = sum(x.spares for x in spec.pools)
    notes = [f"{a.stack.split('/')[-1]}: {fleet} nodes in service, {spares} spares in {len(spec.pools)} pools "
             f"(lending off: bench/lending.py measures it); {p.days:g} days, seed {p.seed}, the same faults in both modes.",
             f"Faults: {world.fault_rate_per_gpu_hour(p) * 24:.2e} per GPU-day (Llama 3's GPU faults x {p.fault_scale:g}); "
             f"refill granted {p.refill_success:.0%}, in {p.refill_minutes:g} min; reboot {p.reboot_minutes:g} min, "
             f"check {p.check_minutes:g} min; a person acts {p.person_hours:g} h after a fault (without the loop); "
             f"a stopped job spans {p.job_nodes} nodes; repair in place with no spare free: "
             f"{'on in every pool' if p.in_place else 'as the stack says'}.",
             "Human tasks: without the loop every fault (a person checks, fixes or retires the node); with it, "
             "the retired nodes (RMA) and the loops that stopped for a person."]
    t = Table("Repair loop over a month (real runtime and core, modelled world)", cols, rows, notes)
    out.emit([t], raw=[r.__dict__ for r in results], params=p.__dict__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
