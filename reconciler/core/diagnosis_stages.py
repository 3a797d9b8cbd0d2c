"""The stages of a diagnosis: the health check a repeated application fault asks for while its node stays in
service (NVIDIA's RUN_DCGMEUD), kept on the Remediation in `status.diagnosis` while its phase is Diagnosing.

    Draining ──► Clearing ──► Checking ──► Returning ──► Passed   (the remediation Succeeded: the node serves on)
       │  (Slurm says idle) (the GPUs free)  │ failed, no verdict
       │                                     ▼
       │                                   Failed   (the remediation moves to Detected: the heal, then the repair)
       └──► (a person's drain or the opt-out label: `held`, waits where it is)
    Any stage before Returning ──► Cleared (the fault condition cleared by someone else) or Failed (a new fault
    that takes the node out: the heal takes over).

Each stage is written on the record before the step that depends on it, and every action is idempotent (the
Slurm drain and resume, the cordon, the eviction, a health-check Job named per remediation) except the pages,
noted as intents; a reconciler killed anywhere resumes from the stage it last wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from gpufleet.reconciler.core.phases import last_entered


class Stage(str, Enum):
    DRAINING = "Draining"  # drained in Slurm: no new job lands; the running one finishes (no SIGTERM)
    CLEARING = "Clearing"  # idle: cordoned, the NodeSet pod leaves, so the check's Job can have the GPUs
    CHECKING = "Checking"  # the health-check Job runs on the node
    RETURNING = "Returning"  # passed: uncordoned, the condition cleared; the Slurm node resumed once back
    PASSED = "Passed"
    FAILED = "Failed"  # the check failed (or gave no verdict), or a fault that takes the node out came
    CLEARED = "Cleared"  # the fault condition was cleared by someone else: nothing to check

    @property
    def over(self) -> bool:
        return self in (Stage.PASSED, Stage.FAILED, Stage.CLEARED)


_ALLOWED: dict[Stage, frozenset[Stage]] = {
    Stage.DRAINING: frozenset({Stage.CLEARING, Stage.FAILED, Stage.CLEARED}),
    Stage.CLEARING: frozenset({Stage.CHECKING, Stage.FAILED, Stage.CLEARED}),
    Stage.CHECKING: frozenset({Stage.RETURNING, Stage.FAILED, Stage.CLEARED}),
    Stage.RETURNING: frozenset({Stage.PASSED}),
}


class InvalidDiagnosisTransition(ValueError):
    pass


@dataclass(frozen=True)
class Diagnosis:
    stage: Stage
    started: datetime
    stage_times: tuple[tuple[str, datetime], ...] = ()
    drained: tuple[str, ...] = ()  # the Slurm nodes gpufleet drained for it (resumed when it passes)
    job: str = ""  # the health-check Job
    deadline: datetime | None = None  # Clearing: the pods' eviction; Checking: the check's verdict
    held: str = ""  # why a person holds it now ('' when no one does)
    needs: str = ""  # Failed: what the node needs now (the check's action, or the new fault's)
    message: str = ""  # what happened, for a person

    def moved(self, stage: Stage, now: datetime, **changes) -> "Diagnosis":
        if stage not in _ALLOWED.get(self.stage, frozenset()):
            raise InvalidDiagnosisTransition(f"diagnosis {self.stage.value} -> {stage.value} is not allowed")
        return replace(self, stage=stage, stage_times=self.stage_times + ((stage.value, now),), **changes)

    def entered(self, stage: Stage) -> datetime | None:
        return last_entered(self.stage_times, stage.value)


def begin(now: datetime, **fields) -> Diagnosis:
    return Diagnosis(Stage.DRAINING, now, ((Stage.DRAINING.value, now),), **fields)


def diagnosed_only(d: Diagnosis | None) -> bool:
    """A record that only diagnosed its node (under way, passed or cleared): no heal, so neither an unhealthy
    node for the storm brake nor an attempt for the cap. One whose check failed became a heal: it counts."""
    return d is not None and d.stage is not Stage.FAILED
