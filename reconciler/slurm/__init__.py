"""Slurm behind one interface, so the reconciler does not care how it talks to Slurm.

The command-line backend (`SlurmCLI`, in `cli.py`) is the one that works with every
Slurm version here; a slurmrestd backend (what Slinky uses, v0.0.44 on Slurm 25.11)
can implement the same protocol later.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class SlurmError(RuntimeError):
    """A Slurm call failed. `temporary` says whether retrying may help (timeouts,
    slurmctld not answering) or not (unknown node, invalid request)."""

    def __init__(self, message: str, *, temporary: bool = False):
        super().__init__(message)
        self.temporary = temporary


@dataclass(frozen=True)
class SlurmNode:
    name: str
    # Base state and flags, upper-case, e.g. {"IDLE"}, {"MIXED", "DRAIN"}, {"DOWN", "NOT_RESPONDING"}.
    states: frozenset[str]
    reason: str = ""

    @property
    def drained_or_down(self) -> bool:
        return bool(self.states & {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL"})


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: tuple[str, ...] = field(default_factory=tuple)
    requeue: bool = True  # whether the job may be requeued
    reason: str = ""      # pending reason, e.g. BeginTime
    restarts: int = 0     # how often Slurm has requeued it (SLURM_RESTART_COUNT)


class SlurmClient(Protocol):
    """What the reconciler needs from Slurm. Every call raises SlurmError on failure."""

    def node(self, name: str) -> SlurmNode: ...

    def jobs_on_node(self, name: str) -> list[SlurmJob]: ...

    def job(self, job_id: int) -> SlurmJob | None: ...

    def drain(self, name: str, reason: str) -> None:
        """Nothing new is scheduled on the node; running jobs go on."""

    def signal_jobs(self, job_ids: Sequence[int], signal: str = "TERM") -> None:
        """Send a signal to the jobs (the batch script and its steps) so they can checkpoint."""

    def requeue(self, job_ids: Sequence[int]) -> None:
        """Put the jobs back in the queue (kills what still runs)."""

    def release(self, job_ids: Sequence[int]) -> None:
        """Make requeued jobs eligible now instead of after Slurm's requeue delay."""

    def down(self, name: str, reason: str) -> None: ...

    def resume(self, name: str) -> None: ...
