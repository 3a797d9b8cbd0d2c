"""Active checks of idle capacity: how many checks a day each pool runs, and what share of its idle GPU-hours
they take.

A simulation of each pool of the prod stack (Pulumi.prod.yaml) over `--days`, a minute a step. The decisions are
the real core's (`gpufleet.reconciler.core.active_checks.plan_active_checks` each step, with the pool's
`active_checks`, or the defaults when the stack declares none: hourly, one node at a time): which nodes are due,
how many at once, when a check is given back. The world around it is modelled, declared as parameters and printed
under the table (ASSUMPTIONS, not measurements):

- each active node alternates between a job (`--busy-hours` on average, exponential) and idle spells
  (`--idle-hours` on average, exponential): a fleet busy about 90 % of the time;
- a check takes `--check-minutes` from its reservation to its verdict (the local check is seconds; a real one
  with DCGM's level-3 diagnostic and the all-reduce about 15, the figure bench/repair_month.py uses), and passes;
- a job that wants a node under check takes another idle node; with none free it waits (a pending job): the next
  pass gives the node back, and the job starts then: its delay is counted.

Run: `python bench/active_checks.py` (about a CPU-minute), `--json` for the machine form.
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from _repo import REPO  # noqa: E402
from _output import add_json_option, exit_on_sigterm, machine, Output, say, Table  # noqa: E402

from gpufleet.fleetspec import labels  # noqa: E402
from gpufleet.fleetspec.active_checks import ActiveChecks  # noqa: E402
from gpufleet.fleetspec.load import load_stack_file  # noqa: E402
from gpufleet.fleetspec.node_repair import PASSED, RUNNING, HealthCheckRecord  # noqa: E402
from gpufleet.reconciler.core import active_checks as ac  # noqa: E402
from gpufleet.reconciler.core.lending import PoolFacts  # noqa: E402
from gpufleet.reconciler.core.model import NodeView, PendingJob, SlurmNodeView  # noqa: E402
from gpufleet.reconciler.core.repair_actions import RecordCheck  # noqa: E402
from gpufleet.reconciler.core.validation import Verdict  # noqa: E402

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
BOOT = "b"


@dataclass
class Node:
    name: str
    spare: bool
    busy: bool = False
    spell_end: float = 0.0  # minutes
    last_passed: float = 0.0
    checking_since: float | None = None  # a spare's check (through validation)
    waiting_since: float | None = None  # a job wants it while it is under check


@dataclass
class PoolResult:
    checks_idle: int = 0
    checks_spares: int = 0
    check_gpu_min: float = 0.0
    idle_gpu_min: float = 0.0
    abandoned: int = 0
    delays: list[float] = field(default_factory=list)
    max_at_once_seen: int = 0


def simulate(spec, pool, checks: ActiveChecks, a: argparse.Namespace, seed: int) -> PoolResult:
    rng = random.Random(seed)
    spec = spec.model_copy(update={"pools": [p.model_copy(update={"active_checks": checks}) if p.name == pool.name
                                              else p for p in spec.pools]})
    step = 1.0
    nodes = [Node(n, False) for n in pool.node_names()] + [Node(n, True) for n in pool.spare_names()]
    for n in nodes:  # steady state: each checked some time within the last period, mid-spell
        n.last_passed = -rng.uniform(0, checks.period_seconds / 60)
        if not n.spare:
            n.busy = rng.random() < a.busy_hours / (a.busy_hours + a.idle_hours)
            n.spell_end = rng.expovariate(1 / ((a.busy_hours if n.busy else a.idle_hours) * 60))
    reservations: dict[str, ac.Reservation] = {}
    r = PoolResult()
    minutes = a.days * 24 * 60
    t = 0.0
    while t < minutes:
        now = T0 + timedelta(minutes=t)
        pending = []
        for n in nodes:
            if n.spare:
                continue
            if t >= n.spell_end and n.waiting_since is None:
                if n.busy:  # the job ended: idle
                    n.busy, n.spell_end = False, t + rng.expovariate(1 / (a.idle_hours * 60))
                elif n.name in reservations:  # a job wants it: Slurm gives it another idle node, or it waits
                    other = next((x for x in nodes if not x.spare and not x.busy and x.name not in reservations
                                  and x.waiting_since is None and x is not n), None)
                    if other is None:
                        n.waiting_since = t
                    else:  # that node runs the job; this one stays idle for a spell of its own
                        other.busy, other.spell_end = True, t + rng.expovariate(1 / (a.busy_hours * 60))
                        n.spell_end = t + rng.expovariate(1 / (a.idle_hours * 60))
                else:
                    n.busy, n.spell_end = True, t + rng.expovariate(1 / (a.busy_hours * 60))
            if n.waiting_since is not None:
                pending.append(PendingJob(len(pending) + 1, tuple(p.name for p in spec.slurm.partitions
                                                                  if pool.name in p.pools), 1, "Resources"))
        views, slurm_on = [], []
        for n in nodes:
            passed = HealthCheckRecord("j", BOOT, PASSED, T0 + timedelta(minutes=n.last_passed), "ok")
            if n.spare:
                check = HealthCheckRecord("j", BOOT, RUNNING, now) if n.checking_since is not None else passed
                views.append(NodeView(n.name, pool.name, labels.ROLE_SPARE, boot_id=BOOT, check=check,
                                      taints=(labels.SPARE_TAINT,), gpus=pool.gpus_per_node))
                continue
            views.append(NodeView(n.name, pool.name, labels.ROLE_ACTIVE, boot_id=BOOT, check=passed,
                                  taints=(labels.CHECK_TAINT,) if n.name in reservations else (),
                                  gpus=pool.gpus_per_node))
            slurm_on.append((n.name, (SlurmNodeView(n.name, frozenset({"ALLOCATED"} if n.busy else {"IDLE"})),)))
        verdicts = {ac.job_of(res): Verdict("passed", "ok") if t - (res.made - T0).total_seconds() / 60
                    >= a.check_minutes else Verdict("running") for res in reservations.values()}
        facts = PoolFacts(pool.name, tuple(views), tuple(slurm_on), (), tuple(pending))
        plan = ac.plan_active_checks(facts, reservations.values(), verdicts, spec, now)
        for act in plan.actions:
            if isinstance(act, ac.ReserveForCheck):
                reservations[act.node] = ac.Reservation(act.reservation, act.slurm_nodes)
                r.checks_idle += 1
            elif isinstance(act, ac.GiveBackFromCheck) and act.node in reservations:
                del reservations[act.node]
                n = next(x for x in nodes if x.name == act.node)
                waiter = n if n.waiting_since is not None else next(
                    (x for x in nodes if x.waiting_since is not None), None)
                if waiter is not None:  # a job that waited starts now, on the node given back
                    r.delays.append(t + step - waiter.waiting_since)
                    waiter.waiting_since = None
                    if waiter is not n:
                        waiter.spell_end = t + rng.expovariate(1 / (a.idle_hours * 60))
                    n.busy, n.spell_end = True, t + rng.expovariate(1 / (a.busy_hours * 60))
            elif isinstance(act, RecordCheck) and act.record.state == PASSED:
                next(x for x in nodes if x.name == act.node).last_passed = t
            elif isinstance(act, RecordCheck) and act.record.state == RUNNING:
                next(x for x in nodes if x.name == act.node).checking_since = t
                r.checks_spares += 1
        r.abandoned += sum(1 for _, res in plan.results if res == ac.ABANDONED)
        for n in nodes:  # a spare's check (validation reads its verdict): passed after its time
            if n.spare and n.checking_since is not None and t - n.checking_since >= a.check_minutes:
                n.checking_since, n.last_passed = None, t
        held = len(reservations) + sum(1 for n in nodes if n.spare and n.checking_since is not None)
        r.max_at_once_seen = max(r.max_at_once_seen, held)
        g = pool.gpus_per_node * step
        r.check_gpu_min += held * g
        r.idle_gpu_min += sum(1 for n in nodes if n.spare or not n.busy) * g
        t += step
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=str(REPO / "Pulumi.prod.yaml"))
    ap.add_argument("--days", type=float, default=2.0)
    ap.add_argument("--busy-hours", type=float, default=18.0, help="a job's mean length on a node (default 18)")
    ap.add_argument("--idle-hours", type=float, default=2.0, help="an idle spell's mean length (default 2)")
    ap.add_argument("--check-minutes", type=float, default=15.0, help="a check's length (default 15)")
    ap.add_argument("--period", type=int, default=None, help="seconds (default: the pool's, or 3600)")
    ap.add_argument("--max-at-once", type=int, default=None, help="default: the pool's, or 1")
    ap.add_argument("--seed", type=int, default=1)
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output("active_checks", a.json)
    exit_on_sigterm()
    spec = load_stack_file(a.stack).fleet
    say(f"active checks: {a.stack}, {a.days:g} days a pool; {machine()}")
    rows, raw = [], {}
    for i, pool in enumerate(spec.pools):
        base = pool.active_checks or ActiveChecks()
        checks = base.model_copy(update={k: v for k, v in (("period_seconds", a.period),
                                                           ("max_at_once", a.max_at_once)) if v is not None})
        res = simulate(spec, pool, checks, a, a.seed + i)
        per_day = lambda x: x / a.days  # noqa: E731
        share = res.check_gpu_min / res.idle_gpu_min if res.idle_gpu_min else 0.0
        say(f"{pool.name}: {res.checks_idle} idle-node checks, {res.checks_spares} spare checks, "
            f"{share:.1%} of idle GPU-hours")
        rows.append([pool.name, pool.nodes, pool.spares, checks.period_seconds, checks.max_at_once,
                     round(per_day(res.checks_idle), 1), round(per_day(res.checks_spares), 1),
                     round(per_day(res.checks_idle + res.checks_spares), 1),
                     f"{share:.1%}", round(per_day(res.abandoned), 1), len(res.delays),
                     round(max(res.delays, default=0.0), 1), res.max_at_once_seen])
        raw[pool.name] = {"checks_idle": res.checks_idle, "checks_spares": res.checks_spares,
                          "check_gpu_hours": res.check_gpu_min / 60, "idle_gpu_hours": res.idle_gpu_min / 60,
                          "abandoned": res.abandoned, "job_delays_min": res.delays,
                          "max_at_once_seen": res.max_at_once_seen}
    notes = [f"Model (ASSUMPTIONS): a job holds a node {a.busy_hours:g} h on average, an idle spell lasts "
             f"{a.idle_hours:g} h (both exponential: nodes busy about "
             f"{a.busy_hours / (a.busy_hours + a.idle_hours):.0%} of the time); a check takes {a.check_minutes:g} min "
             f"and passes; a job that wants a node under check takes another idle one, or, none free, waits until the "
             f"next pass gives it back (a minute "
             f"a step here; the reconciler's pass looks every {ac.RECHECK:g} s while a check runs). "
             f"{a.days:g} days, seed {a.seed}.",
             "Decisions: the real core's (gpufleet.reconciler.core.active_checks.plan_active_checks), each step. "
             "Share of idle GPU-hours: the GPU-hours under a check over the GPU-hours idle (spares included)."]
    out.emit([Table("Active checks per pool (the prod stack)",
                    ["pool", "nodes", "spares", "period s", "at once", "idle-node checks/day", "spare checks/day",
                     "checks/day", "share of idle GPU-h", "abandoned/day", "jobs delayed", "longest delay min",
                     "most at once"], rows, notes)],
             raw={"params": vars(a), "pools": raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
