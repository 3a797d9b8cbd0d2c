"""A month of the faults the kernel never reports, with gpufleet's detections and without them.

The same faults (bench/_interruptions.py `silent_trace`) cost the fleet's jobs (bench/_jobs.py `Ledger`) in two
modes; what differs is only what detects them:

- silent data corruption: without, the job's loss curve shows it `sdc_found_hours` later (ASSUMPTION): the job
  throws away the work since its last checkpoint before the fault, and a person swaps the node. With active
  checks, one that begins on idle capacity (a spare, an idle node) is found by the node's next check before a job
  takes the node, with the probability that the check comes first (`caught_idle`) times the check's recall
  (`check_recall`, ASSUMPTION: DCGM's diagnostic and the all-reduce do not see every corruption); one that begins
  under a job costs the same in both modes (a node that runs a job is never checked).
- a degrading GPU: it slows its job by `slowdown` (a straggler) for `lead_hours` before it crashes it (both
  ASSUMPTIONS; the crash then costs what any GPU crash costs: the work since the checkpoint, the swap to a spare,
  the restart). With the telemetry's thresholds it is seen `detect_minutes` after it starts and the job is moved at
  its next checkpoint: no work lost, the straggling only until then.
- a hang: without, NCCL's watchdog fires `watchdog_minutes` after the collective stopped (ASSUMPTION: large runs
  raise PyTorch's 10-minute default); with, the hang is declared after the pool's `hang_minutes` with no GPU
  activity and the job is requeued from its checkpoint.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import _interruptions as table
import _jobs as jobs


@dataclass(frozen=True)
class SilentParams:
    days: float = 30.0
    seed: int = 1
    scale: float = 1.0
    job_nodes: int = 16
    checkpoint_minutes: float = 30.0
    restart_minutes: float = 10.0
    swap_minutes: float = 5.0  # a crash's move to a spare (the loop's; the same in both modes)
    person_minutes: float = 45.0  # a person's response and swap for a corrupting node (both modes)
    sdc_found_hours: float = 6.0
    idle_share: float = 0.10
    idle_hours: float = 2.0  # an idle spell's mean length (exponential)
    period_minutes: float = 60.0  # the active checks' period
    check_recall: float = 0.8
    slowdown: float = 0.10
    lead_hours: float = 6.0
    detect_minutes: float = 5.0
    watchdog_minutes: float = 30.0
    hang_minutes: float = 10.0

    @property
    def caught_idle(self) -> float:
        """The chance a node's check comes before a job takes it: the check falls uniformly in the period, the
        idle spell ends exponentially (mean `idle_hours`): (m/P)(1 - e^(-P/m))."""
        m, p = self.idle_hours * 60, self.period_minutes
        return (m / p) * (1 - math.exp(-p / m)) if p > 0 else 1.0


@dataclass
class SilentResult:
    mode: str
    faults: dict[str, int] = field(default_factory=dict)
    caught_idle: int = 0
    moved_at_checkpoint: int = 0
    hangs_found: int = 0
    job_gpu_h: float = 0.0
    lost_gpu_h: dict[str, float] = field(default_factory=dict)
    effective: float = 1.0


def run(pools: dict[str, tuple[int, int]], p: SilentParams, detect: bool) -> SilentResult:
    ledger = jobs.Ledger(pools, p.job_nodes, p.checkpoint_minutes * 60, p.restart_minutes * 60)
    trace = table.silent_trace(pools, p.days, p.scale, p.seed, p.idle_share)
    r = SilentResult("with active checks and telemetry" if detect else "without them")
    luck = random.Random(p.seed + 7)  # the same draws in both modes: whether a check would come first, and see it
    end = p.days * 86400
    pending: list[tuple[float, str, jobs.Job, dict]] = []  # (when the down job restarts, ...)

    def settle(until: float) -> None:
        for item in sorted(pending, key=lambda x: x[0]):
            if item[0] <= until:
                pending.remove(item)
                when, _, job, split = item
                ledger.resume(job, when, split)

    for f in trace:
        settle(f.t)
        kind = f.row.kind
        r.faults[kind.name] = r.faults.get(kind.name, 0) + 1
        first, seen = luck.random() < p.caught_idle, luck.random() < p.check_recall
        if kind is table.Silent.SDC:
            if f.idle and detect and first and seen:
                r.caught_idle += 1  # found by its check before any job ran on it: the repair loop takes it
                continue
            job = ledger.interrupt(f.host, f.t)  # found later; the work since this point is thrown away too
            if job is None:
                continue
            found = p.sdc_found_hours * 3600
            pending.append((f.t + found + p.person_minutes * 60, job.name, job,
                            {jobs.CORRUPTED: found, jobs.PERSON: p.person_minutes * 60}))
        elif kind is table.Silent.DEGRADING:
            job = ledger.of_host[f.host]
            if not job.running:
                continue
            crash = f.t + p.lead_hours * 3600
            moved = ledger.next_checkpoint(job, f.t + p.detect_minutes * 60) if detect else math.inf
            at = min(moved, crash, end)
            ledger.slow(job, at - f.t, p.slowdown)
            if at >= end:
                continue
            if moved <= crash:
                r.moved_at_checkpoint += 1
            ledger.interrupt(f.host, at, at_checkpoint=moved <= crash)
            pending.append((at + p.swap_minutes * 60, job.name, job, {jobs.SWAP: p.swap_minutes * 60}))
        else:  # a hang
            job = ledger.interrupt(f.host, f.t)
            if job is None:
                continue
            found = (p.hang_minutes if detect else p.watchdog_minutes) * 60
            r.hangs_found += 1
            pending.append((f.t + found, job.name, job, {jobs.HUNG: found}))
    settle(end)
    for when, _, job, split in pending:  # still down at the end: the time until then
        ledger.account(job, end, {k: v * (end - job.since) / max(sum(split.values()), 1e-9) for k, v in split.items()})
    ledger.close(end)
    r.job_gpu_h = ledger.gpu_hours(end)
    r.lost_gpu_h = ledger.lost_gpu_hours()
    r.effective = ledger.effective(end)
    return r
