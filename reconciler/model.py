"""Typed data at the reconciler's boundaries: what it observes, what it records, what it does.

All frozen: the core takes these and returns new ones; only the runtime does I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from fleetspec import labels

from .phases import Phase, check_transition


@dataclass(frozen=True)
class Fault:
    """A GPU fault signalled by a node condition."""

    xid: int
    message: str
    since: datetime  # the condition's lastTransitionTime: one signal, however often it is re-read


@dataclass(frozen=True)
class NodeView:
    """One Kubernetes node as the core needs to see it."""

    name: str
    pool: str | None
    role: str  # labels.ROLE_*
    ready: bool = True
    unschedulable: bool = False
    fault: Fault | None = None
    health_check_passed: bool = False  # condition True with reason HealthCheckPassed
    remediation: str | None = None  # the record in progress, from the node annotation

    @property
    def is_spare(self) -> bool:
        return self.role == labels.ROLE_SPARE

    @property
    def is_active(self) -> bool:
        return self.role == labels.ROLE_ACTIVE


@dataclass(frozen=True)
class Record:
    """A Remediation, persisted as a `remediations.gpufleet.io` object."""

    name: str
    node: str
    pool: str
    xid: int
    message: str
    phase: Phase
    created: datetime
    phase_times: tuple[tuple[str, datetime], ...] = ()
    reason: str = ""
    replacement: str | None = None
    jobs: tuple[int, ...] = ()
    grace_deadline: datetime | None = None
    drain_deadline: datetime | None = None
    notified: tuple[str, ...] = ()
    was_spare: bool = False
    retries: int = 0

    def moved(self, phase: Phase, now: datetime, **changes) -> "Record":
        """This record in a new phase. Rejects moves the phase table does not allow."""
        check_transition(self.phase, phase)
        return replace(self, phase=phase, phase_times=self.phase_times + ((phase.value, now),), retries=0, **changes)

    def entered(self, phase: Phase) -> datetime | None:
        for name, at in reversed(self.phase_times):
            if name == phase.value:
                return at
        return None

    @property
    def active(self) -> bool:
        return not self.phase.terminal


def record_name(node: str, fault: Fault) -> str:
    """Deterministic: the same node and signal give the same name, so a repeated signal or
    a restart creates nothing new (the API server answers AlreadyExists)."""
    return f"{node}-xid{fault.xid}-{int(fault.since.timestamp())}"


@dataclass(frozen=True)
class JobView:
    job_id: int
    state: str


@dataclass(frozen=True)
class RecordFacts:
    """What the runtime observed for one live record on this pass."""

    jobs_on_node: tuple[JobView, ...] = ()
    opted_out_pods: tuple[str, ...] = ()
    pods_left: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()  # Ready spares of the record's pool, sorted
    replacement_ready: bool = False
    replacement_in_slurm: bool = False


# --- actions: what the runtime should do, in order ------------------------------------------

@dataclass(frozen=True)
class Action:
    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Notify(Action):
    event: str  # key recorded in Record.notified so each is sent once
    severity: str  # info | warning | critical
    text: str


@dataclass(frozen=True)
class Cordon(Action):
    node: str
    reason: str


@dataclass(frozen=True)
class DrainSlurm(Action):
    node: str
    reason: str


@dataclass(frozen=True)
class SignalJobs(Action):
    job_ids: tuple[int, ...]
    signal: str = "TERM"


@dataclass(frozen=True)
class RequeueJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class DownSlurm(Action):
    node: str
    reason: str


@dataclass(frozen=True)
class EvictPods(Action):
    node: str


@dataclass(frozen=True)
class PromoteSpare(Action):
    spare: str
    replaces: str


@dataclass(frozen=True)
class Quarantine(Action):
    node: str
    xid: int


@dataclass(frozen=True)
class RequestCapacity(Action):
    pool: str
    reason: str


@dataclass(frozen=True)
class ResumeSlurm(Action):
    node: str


@dataclass(frozen=True)
class ReleaseJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReturnToSpares(Action):
    node: str


@dataclass(frozen=True)
class Step:
    """The core's answer for one record: run these actions, then persist `record`.
    `record` is None when there is nothing to do yet (wait and look again)."""

    actions: tuple[Action, ...] = ()
    record: Record | None = None
    recheck_after: float | None = None  # seconds; None = on the next event


@dataclass(frozen=True)
class NewRemediation:
    record: Record
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Gate:
    """Why the core started nothing (or not everything) this pass. Surfaced as a metric,
    an Event and a log line; a page is sent once per storm."""

    reason: str  # TooManyUnhealthy | MaxConcurrent | HealingDisabled
    pool: str | None
    message: str
    held_nodes: tuple[str, ...] = field(default_factory=tuple)
