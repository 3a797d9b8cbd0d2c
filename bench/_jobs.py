"""The fleet's training jobs and where their GPU-hours go: effective training time.

Every node in service runs a job (the fleet is busy): a pool's Slurm nodes `<pool>-w<i>`, in order, make jobs
of `job_nodes` nodes each (the last one smaller). A job writes a checkpoint every `checkpoint` seconds of
running. An interruption stops the whole job (a synchronous training job: one GPU lost stops all): the work
since its last checkpoint is lost, it is down until it has its nodes again (its wait, split by what it waited
for), then it restarts (`restart` seconds: the job's launch and the checkpoint's load) and runs on.

Effective training time is the share of the jobs' GPU-hours that made progress: 1 - (work lost since the last
checkpoint + restarts + waits) / all the jobs' GPU-hours.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# What a job's lost GPU-hours went to (the table's columns, in order).
LOST_WORK, RESTART, SWAP, SPARE, PERSON = "work since checkpoint", "restart", "swap", "waiting for a spare", \
    "waiting for a person"
KINDS = (LOST_WORK, RESTART, SWAP, SPARE, PERSON)
# What the faults the kernel never reports cost a job besides (bench/_silent_world.py): a run on a corrupting GPU
# (its work thrown away), a hang (every GPU waits), a straggler (the job runs at its slowest GPU's pace).
CORRUPTED, HUNG, STRAGGLING = "ran on a corrupting GPU", "hung", "straggling"
SILENT_KINDS = (CORRUPTED, HUNG, STRAGGLING)
ALL_KINDS = KINDS + SILENT_KINDS
HOUR = 3600.0


@dataclass
class Job:
    name: str
    pool: str
    hosts: tuple[str, ...]  # its Slurm nodes
    gpus: int  # all its GPUs
    running: bool = True
    since: float = 0.0  # running: when its (re)start began; down: when it stopped
    waiting: str = SWAP  # down: what it waits for now (where the time goes if the run ends first)
    seconds: dict = field(default_factory=lambda: dict.fromkeys(ALL_KINDS, 0.0))  # lost, by kind (job seconds)
    interruptions: int = 0


class Ledger:
    def __init__(self, pools: dict[str, tuple[int, int]], job_nodes: int, checkpoint: float, restart: float):
        """`pools`: name -> (nodes in service, GPUs per node)."""
        self.checkpoint, self.restart = checkpoint, restart
        self.jobs: list[Job] = []
        self.of_host: dict[str, Job] = {}
        for pool, (nodes, gpus) in pools.items():
            for start in range(0, nodes, job_nodes):
                hosts = tuple(f"{pool}-w{i}" for i in range(start, min(start + job_nodes, nodes)))
                # running at 0: its start is before the run
                job = Job(f"{pool}-job{start // job_nodes}", pool, hosts, len(hosts) * gpus, since=-restart)
                self.jobs.append(job)
                self.of_host.update(dict.fromkeys(hosts, job))

    def _run_until(self, job: Job, t: float, lose: bool) -> None:
        """Account a running job's time from `since` to `t`: its restart, then work; `lose`: the work since its
        last checkpoint is lost."""
        begun = job.since + self.restart  # its restart's end: its checkpoints count from there
        job.seconds[RESTART] += max(min(t, begun) - max(job.since, 0.0), 0.0)  # a start before 0 is not the run's
        work = max(t - begun, 0.0)
        if lose and self.checkpoint > 0:
            job.seconds[LOST_WORK] += work % self.checkpoint

    def interrupt(self, host: str, t: float, waiting: str = SWAP, at_checkpoint: bool = False) -> Job | None:
        """The job on `host` stops at `t`; None if it was not running (already down: nothing more to lose)."""
        job = self.of_host[host]
        if not job.running:
            return None
        self._run_until(job, t, lose=not at_checkpoint)
        job.running, job.since, job.waiting = False, t, waiting
        job.interruptions += 1
        return job

    def wait_for(self, job: Job, t: float, kind: str) -> None:
        """From `t` the down job waits for `kind` (the time before goes to what it waited for until then)."""
        assert not job.running
        job.seconds[job.waiting] += t - job.since
        job.since, job.waiting = t, kind

    def resume(self, job: Job, t: float, split: dict[str, float] | None = None) -> None:
        """The job has its nodes again at `t` and restarts. `split`: its down time by kind (seconds; summing to
        the time since it stopped), else all of it to what it waits for now."""
        assert not job.running and t >= job.since - 1e-6, (job, t)
        down = t - job.since
        if split:
            assert abs(sum(split.values()) - down) < 1.0, (split, down)
            for kind, secs in split.items():
                job.seconds[kind] += secs
        else:
            job.seconds[job.waiting] += down
        job.running, job.since = True, t

    def account(self, job: Job, t: float, split: dict[str, float]) -> None:
        """A down job's time until `t`, by kind (summing to the time since it stopped); it stays down."""
        assert not job.running and abs(sum(split.values()) - (t - job.since)) < 1.0, (split, t - job.since)
        for kind, secs in split.items():
            job.seconds[kind] += secs
        job.since = t

    def close(self, end: float) -> None:
        """The run ends at `end`: a running job's work since its checkpoint is progress, not lost."""
        for job in self.jobs:
            if job.running:
                self._run_until(job, end, lose=False)
            else:
                job.seconds[job.waiting] += end - job.since
            job.since = end

    def slow(self, job: Job, seconds: float, fraction: float) -> None:
        """The running job ran `seconds` at `fraction` below its pace (a straggler among its GPUs)."""
        job.seconds[STRAGGLING] += max(seconds, 0.0) * fraction

    def next_checkpoint(self, job: Job, t: float) -> float:
        """When the running job writes its next checkpoint at or after `t`."""
        begun = job.since + self.restart
        if t <= begun or self.checkpoint <= 0:
            return max(t, begun)
        done = (t - begun) // self.checkpoint
        return begun + (done + (0 if (t - begun) % self.checkpoint == 0 else 1)) * self.checkpoint

    def lost_gpu_hours(self) -> dict[str, float]:
        return {k: sum(j.seconds[k] * j.gpus for j in self.jobs) / HOUR for k in ALL_KINDS
                if k in KINDS or any(j.seconds[k] for j in self.jobs)}

    def gpu_hours(self, seconds: float) -> float:
        return sum(j.gpus for j in self.jobs) * seconds / HOUR

    def effective(self, seconds: float) -> float:
        return 1.0 - sum(self.lost_gpu_hours().values()) / self.gpu_hours(seconds)
