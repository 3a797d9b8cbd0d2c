"""Effective training time over a month of the prod stack's fleet: the share of its jobs' GPU-hours that made
progress, with the repair loop (the reconciler: replace from a spare at once, repair after) and with a person's
pager instead, at Llama 3's rate of interruptions and at ten times it.

The decisions are the real reconciler's: its runtime and pure core (`gpufleet.reconciler.runtime.manager.Manager`:
detect, heal, promote a spare, quarantine, refill, then `gpufleet.reconciler.core.repair`'s ladder and the
validation before service), run through the unit tests' fakes of the API server, Slurm, the provider, the
node agent and the health-check Jobs (tests/unit/fakes.py `World`), on a fake clock. What a driver line needs
is the node agent's own parser and classifier (fleetspec/faults). What is modelled is the world around them,
declared as parameters and printed under the tables:

- interruptions (bench/_interruptions.py): every row of Meta's Llama 3 table (The Llama 3 Herd of Models,
  arXiv:2407.21783, table 5: 419 unexpected interruptions in 54 days on 16,384 H100s; 47 planned), each at
  its rate per GPU-hour on the GPUs in service, Poisson. A row gpufleet sees shows a kernel line (an
  ASSUMPTION: the paper names components, not Xids): faulty GPU half Xid 79, half Xid 74; HBM3 Xid 48; SRAM
  Xid 95; GSP Xid 119; thermal Xid 54; a software bug Xid 13 or 31 (restart-app: the job restarts, the node
  stays). The network, the host, silent data corruption, NCCL timeouts and dependencies are not gpufleet's:
  they cost the job alike with the loop and without.
- jobs (bench/_jobs.py): every node in service runs a job of `--job-nodes` nodes, checkpointing every
  `--checkpoint-minutes`; an interruption stops the whole job; it restarts in `--restart-minutes`.
- a person (bench/_pager.py, and with the loop for what is not gpufleet's): paged to at the keyboard in
  `--respond-minutes`, `--manual-minutes` to drain and swap; repairs or retires a broken node `--person-hours`
  after its fault.
- what truly fixes a node (ASSUMPTIONS): a reset-gpu fault is fixed by the reset 70 % of the time, by a
  reboot 20 %, by nothing 10 %; a reboot fault by the reboot 85 %, by nothing 15 %; a replace fault never.
  A reboot 10 min (a p5), the health check 15 min; a refill is granted 30 % of the time, in 20 min.

Run: `python bench/repair_month.py` (30 days at 1x, 7 days at 10x, both modes; about 3 CPU-minutes), `--json`
for the machine form.
"""
from __future__ import annotations

import argparse
import sys

from _repo import REPO  # noqa: E402
from _output import add_json_option, exit_on_sigterm, Output, say, Table  # noqa: E402

from gpufleet.fleetspec.load import load_stack_file  # noqa: E402

import _interruptions as table  # noqa: E402
import _jobs as jobs  # noqa: E402
import _pager as pager  # noqa: E402
import _repair_world as world  # noqa: E402
import _silent_world as silent  # noqa: E402
from gpufleet.fleetspec.faults.policy import FaultPolicy  # noqa: E402


def mapping_table(spec) -> Table:
    """Table 5's rows, and what each is to gpufleet (the classifier's answer for the row's lines)."""
    policy = FaultPolicy.from_spec(spec.healing)
    rows = []
    for r in table.ROWS:
        if r.lines:
            seen = {}
            for line in r.lines:
                code = line.split("): ", 1)[1].split(",", 1)[0]
                seen.setdefault(table.needs(line, policy).value, []).append(f"Xid {code}")
            what = "; ".join(f"{', '.join(c)}: {need}" for need, c in seen.items())
        else:
            what = f"not gpufleet's: {r.cost.value}"
        rows.append([r.component, r.category, r.count, what, r.why or "-"])
    notes = ["Counts: Meta, The Llama 3 Herd of Models (arXiv:2407.21783), table 5 (419 unexpected interruptions in "
             "54 days on 16,384 H100s) and section 3.3.4 (47 planned). The Xid a row shows as is this bench's "
             "reading (the paper names components); what it needs is the node agent's classifier's answer for "
             "that line (NVIDIA's catalogue, its rules, the spec's overrides), asked at run time."]
    return Table("Llama 3's interruptions, and what each is to gpufleet", ["component", "Meta's category",
                                                                         "interruptions", "gpufleet", "reading"],
                 rows, notes)


def silent_table(spec, a) -> tuple[list[Table], list[dict]]:
    """The faults the kernel never reports, at each rate: effective training time with gpufleet's active checks and
    telemetry (hangs detected in the declared time, degrading GPUs moved at a checkpoint) and without them."""
    pools = {p.name: (p.nodes, p.gpus_per_node) for p in spec.pools}
    rows, raw = [], []
    for scale in (float(x) for x in a.scales.split(",")):
        p = silent.SilentParams(days=a.days, seed=a.seed, scale=scale, job_nodes=a.job_nodes,
                                checkpoint_minutes=a.checkpoint_minutes, restart_minutes=a.restart_minutes,
                                sdc_found_hours=a.sdc_found_hours, idle_share=a.idle_share, idle_hours=a.idle_hours,
                                period_minutes=a.period_minutes, check_recall=a.check_recall, slowdown=a.slowdown,
                                lead_hours=a.lead_hours, detect_minutes=a.detect_minutes,
                                watchdog_minutes=a.watchdog_minutes, hang_minutes=a.hang_minutes)
        for detect in (False, True):
            r = silent.run(pools, p, detect)
            lost = r.lost_gpu_h
            rows.append([f"{scale:g}x", f"{p.days:g}", r.mode, r.faults.get("SDC", 0), r.faults.get("DEGRADING", 0),
                         r.faults.get("HANG", 0), r.caught_idle, r.moved_at_checkpoint,
                         round(lost.get(jobs.CORRUPTED, 0.0)), round(lost.get(jobs.STRAGGLING, 0.0)),
                         round(lost.get(jobs.HUNG, 0.0)), round(lost[jobs.LOST_WORK]),
                         round(lost[jobs.RESTART] + lost[jobs.SWAP] + lost[jobs.PERSON]), f"{r.effective:.2%}"])
            raw.append({"params": p.__dict__, **r.__dict__})
    p = silent.SilentParams()
    notes = [
        "Rates: Meta, The Llama 3 Herd of Models (arXiv:2407.21783), table 5: Silent Data Corruption (6 in 54 days on "
        "16,384 H100s), NCCL Watchdog Timeouts (7); the crashes of GPU HBM3 Memory (72) and of Faulty GPU's NVLink half "
        "(74) of which 30 % warn first (row remapping pending; NVLink CRC and replay errors), and GPU Thermal Interface "
        "+ Sensor (6), all warning first (heat throttling): the warned shares are ASSUMPTIONS. Hangs and stragglers as "
        "Llama 3's section 3.3.4 and ByteDance's MegaScale (NSDI 2024: its fault tolerance and troubleshooting) describe them; neither gives a "
        "straggler rate: a straggler here is a degrading GPU's job.",
        f"ASSUMPTIONS (flags): corruption found by the job {a.sdc_found_hours:g} h after it began; {a.idle_share:.0%} "
        f"of faults begin on idle capacity, idle spells of {a.idle_hours:g} h, checks every {a.period_minutes:g} min "
        f"(the check comes first {silent.SilentParams(idle_hours=a.idle_hours, period_minutes=a.period_minutes).caught_idle:.0%} "
        f"of the time) and find {a.check_recall:.0%}; a degrading GPU slows its job {a.slowdown:.0%} for "
        f"{a.lead_hours:g} h before it fails, seen {a.detect_minutes:g} min after it starts; a hang found by NCCL's "
        f"watchdog in {a.watchdog_minutes:g} min, by the declared hang time in {a.hang_minutes:g} min. Jobs of "
        f"{a.job_nodes} nodes checkpoint every {a.checkpoint_minutes:g} min and restart in {a.restart_minutes:g} min; "
        f"a crash's swap to a spare {p.swap_minutes:g} min and a person's swap of a corrupting node "
        f"{p.person_minutes:g} min, the same in both modes.",
        "Lost: ran on a corrupting GPU (work thrown away), straggling (the job at its slow GPU's pace), hung, the "
        "work since the checkpoint, and the restarts, swaps and the person. Effective training time = 1 - lost / "
        "job GPU-h, over these faults alone (the table above has the reported ones)."]
    cols = ["rate", "days", "mode", "silent corruptions", "degrading GPUs", "hangs", "caught idle by a check",
            "moved at a checkpoint", "lost: corrupted", "lost: straggling", "lost: hung", "lost: since checkpoint",
            "lost: restart, swap, person", "effective training time"]
    return [Table("Faults the kernel never reports: effective training time with the detections and without",
                  cols, rows, notes)], raw


def main(argv: list[str] | None = None) -> int:
    d = world.Params()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=str(REPO / "Pulumi.prod.yaml"))
    ap.add_argument("--days", type=float, default=d.days)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--scales", default="1,10",
                    help="Llama 3's rate of unexpected interruptions times each of these (comma-separated)")
    ap.add_argument("--days-at-scale", default="10:7", metavar="SCALE:DAYS,...",
                    help="a shorter run at a high rate (the loop's clock steps per fault); '' for --days at every rate")
    ap.add_argument("--checkpoint-minutes", type=float, default=d.checkpoint_minutes)
    ap.add_argument("--restart-minutes", type=float, default=d.restart_minutes)
    ap.add_argument("--respond-minutes", type=float, default=d.respond_minutes,
                    help="a person's pager: paged to at the keyboard")
    ap.add_argument("--manual-minutes", type=float, default=d.manual_minutes,
                    help="a person's drain, swap and requeue")
    ap.add_argument("--refill-success", type=float, default=d.refill_success)
    ap.add_argument("--refill-minutes", type=float, default=d.refill_minutes)
    ap.add_argument("--person-hours", type=float, default=d.person_hours)
    ap.add_argument("--reboot-minutes", type=float, default=d.reboot_minutes)
    ap.add_argument("--check-minutes", type=float, default=d.check_minutes)
    ap.add_argument("--job-nodes", type=int, default=d.job_nodes,
                    help="nodes per job: one interruption stops them all")
    ap.add_argument("--in-place", action="store_true",
                    help="every pool repairs in place when no spare is free (pools[].repair.in_place, on by default: "
                         "the stack may turn it off)")
    ap.add_argument("--modes", default="pager,loop", help="pager, loop (the reconciler) or both")
    ap.add_argument("--explain", action="store_true",
                    help="print each failed loop's record and each wait for a spare (its pool's spares over time, "
                         "the remediations that took them); always in the JSON's raw")
    s = silent.SilentParams()
    g = ap.add_argument_group("faults the kernel never reports (bench/_silent_world.py; ASSUMPTIONS where noted)")
    g.add_argument("--silent-only", action="store_true", help="only the table of silent faults and hangs (seconds)")
    g.add_argument("--sdc-found-hours", type=float, default=s.sdc_found_hours,
                   help="silent corruption: found by the job's loss curve this long after it began")
    g.add_argument("--idle-share", type=float, default=s.idle_share, help="the share of faults that begin on idle "
                   "capacity (spares, idle nodes): what active checks can see")
    g.add_argument("--idle-hours", type=float, default=s.idle_hours, help="an idle spell's mean length")
    g.add_argument("--period-minutes", type=float, default=s.period_minutes, help="the active checks' period")
    g.add_argument("--check-recall", type=float, default=s.check_recall,
                   help="the share of silent corruptions the health check finds")
    g.add_argument("--slowdown", type=float, default=s.slowdown, help="a degrading GPU slows its job by this much")
    g.add_argument("--lead-hours", type=float, default=s.lead_hours, help="a degrading GPU warns this long before it fails")
    g.add_argument("--detect-minutes", type=float, default=s.detect_minutes,
                   help="the telemetry's thresholds see a degrading GPU this long after it starts")
    g.add_argument("--watchdog-minutes", type=float, default=s.watchdog_minutes,
                   help="without hang detection: NCCL's watchdog fires this long after the collective stopped")
    g.add_argument("--hang-minutes", type=float, default=s.hang_minutes, help="the pool's declared hang time")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output("repair_month", a.json)
    exit_on_sigterm()
    spec = load_stack_file(a.stack).fleet
    silent_tables, silent_raw = silent_table(spec, a)
    if a.silent_only:
        out.emit(silent_tables, raw={"silent": silent_raw})
        return 0
    short = {float(k): float(v) for k, v in (x.split(":") for x in a.days_at_scale.split(",") if x)}
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    results = []
    for scale in (float(x) for x in a.scales.split(",")):
        p = world.Params(days=short.get(scale, a.days), seed=a.seed, fault_scale=scale,
                         refill_success=a.refill_success, refill_minutes=a.refill_minutes,
                         person_hours=a.person_hours, reboot_minutes=a.reboot_minutes, check_minutes=a.check_minutes,
                         job_nodes=a.job_nodes, checkpoint_minutes=a.checkpoint_minutes,
                         restart_minutes=a.restart_minutes, respond_minutes=a.respond_minutes,
                         manual_minutes=a.manual_minutes, in_place=a.in_place)
        for mode in modes:
            say(f"{mode}: {p.days:g} days at {scale:g}x Llama 3's rate, {a.stack}")
            r = pager.run(spec, p) if mode == "pager" else world.run(spec, p, loop=True, progress=say)
            results.append((p, r))
    if a.explain:
        for _, r in results:
            for line in world.explain_lines(r):
                say(line)
    p0 = results[0][0]
    fleet = sum(x.nodes for x in spec.pools)
    gpus = sum(x.nodes * x.gpus_per_node for x in spec.pools)
    spares = sum(x.spares for x in spec.pools)
    kinds = list(jobs.KINDS)
    cols = ["rate", "days", "mode", "interruptions", "node faults (gpufleet's)", "application faults",
            "to a person", "job GPU-h"] + [f"lost: {k}" for k in kinds] + ["effective training time"]
    rows = [[f"{p.fault_scale:g}x", f"{p.days:g}", r.mode, r.interruptions, r.faults, r.app_faults, r.to_person,
             round(r.job_gpu_h)] + [round(r.lost_gpu_h[k]) for k in kinds] + [f"{r.effective:.2%}"]
            for p, r in results]
    notes = [f"{a.stack.split('/')[-1]}: {fleet} nodes ({gpus} GPUs) in service, {spares} spares in "
             f"{len(spec.pools)} pools, lending off; every node in service runs a job of {p0.job_nodes} nodes; seed "
             f"{p0.seed}, the same interruptions in both modes (one that strikes a job already stopped costs nothing "
             "more and is not counted).",
             f"A job checkpoints every {p0.checkpoint_minutes:g} min and restarts in {p0.restart_minutes:g} min. "
             f"A person: paged to at the keyboard {p0.respond_minutes:g} min, drain and swap "
             f"{p0.manual_minutes:g} min; "
             f"repairs or retires a broken node {p0.person_hours:g} h after its fault (the pager's; the loop's own "
             f"repair: reboot {p0.reboot_minutes:g} min, check {p0.check_minutes:g} min). Refills granted "
             f"{p0.refill_success:.0%}, in {p0.refill_minutes:g} min.",
             "Lost: the work since the job's last checkpoint; its restart; the swap (the loop: fault to the job's "
             "Slurm node resumed on a spare); waiting for a spare (none free in the pool); waiting for a person "
             "(paged, then the manual drain and swap). Effective training time = 1 - lost / job GPU-h."]
    eff = Table("Effective training time: the share of the jobs' GPU-hours that made progress", cols, rows, notes)
    ncols = ["rate", "mode", "faults", "spares free min", "spares free mean", "jobs waited for a spare", "wait max h",
             "GPU-h jobs waited", "GPU-h nodes out", "nodes returned", "nodes retired", "loops failed",
             "application faults retired", "human tasks / week"]
    nrows = [[f"{p.fault_scale:g}x", r.mode, r.faults, r.spares_min, r.spares_mean, r.jobs_waited, r.wait_max_h,
              r.gpu_h_waited, r.gpu_h_out, r.returned, r.retired, r.failed_loops, r.app_faults_retired,
              r.human_tasks / (p.days / 7)] for p, r in results if r.mode == "with the loop"]
    nodes = Table("The loop's nodes (real runtime and core, modelled world)", ncols, nrows,
                  ["Human tasks with the loop: the interruptions a person handled, the retired nodes (RMA) and the "
                   "loops that stopped for a person."])
    out.emit([mapping_table(spec), eff, nodes] + silent_tables,
             raw={"runs": [{"params": p.__dict__, **r.__dict__} for p, r in results], "silent": silent_raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
