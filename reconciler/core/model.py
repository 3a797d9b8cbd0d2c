"""Typed data at the reconciler's boundaries: what it observes, what it records, what it does.

All frozen: the core takes these and returns new ones; only the runtime does I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from fleetspec import labels

from reconciler.core.phases import Phase, check_transition


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
    taints: tuple[str, ...] = ()  # taint keys
    signals: tuple[datetime, ...] = ()  # earlier fault signals, persisted on the node (for `occurrences`)
    labels: tuple[tuple[str, str], ...] = ()  # all of them, for pool membership
    provider_id: str = ""
    gpus: int = 0  # nvidia.com/gpu capacity
    created: str = ""  # metadata.creationTimestamp, as sent: which capacity request a joined spare answers
    fulfils: str | None = None  # the capacity request this node answered (annotation membership.FULFILS)
    lent: str = ""  # the lent label's value (spare | idle): open to borrowers
    lent_since: datetime | None = None
    reclaiming: datetime | None = None  # borrowers are being evicted since then
    carried_drain: str = ""  # a person's Slurm drain carried to this machine (annotation labels.CARRIED_DRAIN)
    topology: str = ""  # annotation labels.SLINKY_TOPOLOGY_SPEC

    @property
    def on_loan(self) -> bool:
        """Lent, or being taken back: borrowers may still run there."""
        return bool(self.lent) or self.reclaiming is not None or labels.LENDING_TAINT in self.taints

    @property
    def is_spare(self) -> bool:
        return self.role == labels.ROLE_SPARE

    @property
    def is_active(self) -> bool:
        return self.role == labels.ROLE_ACTIVE


@dataclass(frozen=True)
class PodView:
    """One pod as the core needs to see it: where it runs, what it is, the labels that matter."""

    namespace: str
    name: str
    node: str | None
    phase: str = "Running"
    labels: tuple[tuple[str, str], ...] = ()
    owner_kinds: tuple[str, ...] = ()
    mirror: bool = False
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class SlurmNodeView:
    """A Slurm node's state as the core needs it (names are Slurm's, never assumed Kubernetes')."""

    name: str
    states: frozenset[str] = frozenset()
    reason: str = ""
    comment_node: str | None = None  # the Kubernetes node in the operator's JSON comment, if any
    partitions: tuple[str, ...] = ()
    last_busy: datetime | None = None  # when it last ran a job (Slurm's LastBusyTime)

    @property
    def busy(self) -> bool:
        """Runs (or is finishing) a job."""
        return bool(self.states & {"ALLOCATED", "MIXED", "COMPLETING", "DRAINING"})

    @property
    def idle(self) -> bool:
        return "IDLE" in self.states and not self.busy

    @property
    def drained(self) -> bool:
        return bool(self.states & {"DRAIN", "DRAINING", "DRAINED"})

    @property
    def down(self) -> bool:
        return bool(self.states & {"DOWN", "FAIL", "NOT_RESPONDING"})

    @property
    def takes_jobs(self) -> bool:
        return not (self.drained or self.down)


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
    intents: tuple[str, ...] = ()  # keys of the once-only actions begun (a crash never repeats them)
    was_spare: bool = False
    retries: int = 0
    slurm_nodes: tuple[str, ...] = ()  # the faulted node's Slurm nodes, seen when containment began
    kept_drains: tuple[str, ...] = ()  # of those, the ones a person had drained: never touched
    held: str = ""  # why admission holds it (the gate's message)
    held_reason: str = ""  # the gate's reason (TooManyUnhealthy | MaxConcurrent), for metrics and pages
    reclaim_started: datetime | None = None  # the chosen spare was lent: its borrowers are evicted since then
    failing_since: datetime | None = None  # first temporary failure of the current step
    next_attempt: datetime | None = None  # backoff: not before this time
    last_error: str = ""
    revision: int = 0  # writes by the reconciler: a cache never takes an older copy over a newer one

    def moved(self, phase: Phase, now: datetime, **changes) -> "Record":
        """This record in a new phase. Rejects moves the phase table does not allow."""
        check_transition(self.phase, phase)
        changes = {"retries": 0, "failing_since": None, "next_attempt": None, "last_error": "", **changes}
        return replace(self, phase=phase, phase_times=self.phase_times + ((phase.value, now),), **changes)

    def entered(self, phase: Phase) -> datetime | None:
        for name, at in reversed(self.phase_times):
            if name == phase.value:
                return at
        return None

    @property
    def active(self) -> bool:
        return not self.phase.terminal

    @property
    def notified(self) -> tuple[str, ...]:
        """The notification events sent (intents of Notify actions)."""
        return tuple(k.split(":", 1)[1] for k in self.intents if k.startswith("notify:"))


def record_name(node: str, fault: Fault) -> str:
    """Deterministic: the same node and signal give the same name, so a repeated signal or
    a restart creates nothing new (the API server answers AlreadyExists)."""
    return f"{node}-xid{fault.xid}-{int(fault.since.timestamp())}"


@dataclass(frozen=True)
class JobView:
    job_id: int
    state: str


@dataclass(frozen=True)
class PendingJob:
    """A job waiting in Slurm's queue, as lending weighs it: could nodes of a pool let it start?"""

    job_id: int
    partitions: tuple[str, ...]
    nodes: int = 1  # nodes it asks for
    reason: str = ""  # Slurm's pending reason (Resources, Priority, Dependency, ...)
    held: bool = False


@dataclass(frozen=True)
class Admission:
    """What admission needs to know, counted by the runtime under one lock."""

    pool_size: int
    unhealthy: frozenset[str]  # nodes of the pool faulted or remediated within the window
    in_flight: int  # admitted remediations, all pools (Evicting, Replacing, Resuming)
    attempts: int  # earlier remediations of this node within the attempts window


@dataclass(frozen=True)
class RecordFacts:
    """What the runtime observed for one live record on this step."""

    jobs_on_node: tuple[JobView, ...] = ()
    slurm_names: tuple[str, ...] = ()  # Slurm nodes whose NodeSet pods run on the faulted node (from the pods)
    slurm: tuple[SlurmNodeView, ...] = ()  # the record's Slurm nodes, and the replacement's
    opted_out_pods: tuple[str, ...] = ()
    pods_left: tuple[str, ...] = ()
    nodeset_pods_left: tuple[str, ...] = ()  # of those, Slinky NodeSet pods (a busy one's PDB refuses eviction)
    spares: tuple[str, ...] = ()  # eligible spares of the record's pool (Ready, unclaimed), sorted
    spare_slurm: tuple[tuple[str, tuple[SlurmNodeView, ...]], ...] = ()  # Slurm nodes on each spare
    admission: Admission | None = None
    replacement: NodeView | None = None
    replacement_slurm: tuple[str, ...] = ()  # Slurm nodes whose pods run on the replacement now
    slurm_moved: tuple[str, ...] = ()  # the record's Slurm nodes whose pods now run off the faulted node
    can_refill: bool = True  # the provider has room for one more node (e.g. below the group's MaxSize)
    lent_spares: tuple[str, ...] = ()  # of `spares`, those on loan (chosen last)
    replacement_borrowers: tuple[str, ...] = ()  # borrower pods still on the chosen spare


# --- actions: what the runtime should do, in order ------------------------------------------

@dataclass(frozen=True)
class Action:
    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def once(self) -> str | None:
        """For actions that must not run twice (a page, a signal, a capacity request): the key under
        which the record notes that it was begun. None: idempotent, safe to repeat."""
        return None


@dataclass(frozen=True)
class Notify(Action):
    event: str  # each event is sent once per record
    severity: str  # info | warning | critical
    text: str

    @property
    def once(self) -> str:
        return f"notify:{self.event}"


@dataclass(frozen=True)
class Cordon(Action):
    node: str
    reason: str


@dataclass(frozen=True)
class DrainSlurm(Action):
    node: str  # a Slurm node name
    reason: str


@dataclass(frozen=True)
class SignalJobs(Action):
    job_ids: tuple[int, ...]
    signal: str = "TERM"

    @property
    def once(self) -> str:
        return f"signal:{self.signal}"


@dataclass(frozen=True)
class RequeueJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class EvictPods(Action):
    node: str


@dataclass(frozen=True)
class DeletePods(Action):
    """Delete pods whatever their PodDisruptionBudget says: NodeSet pods whose Slurm nodes run no job, still
    refused eviction when the drain timeout passed (the operator relabels a pod that stopped being busy
    on its next NodeSet sync; a stale label must not keep the Slurm node on the faulted machine)."""
    pods: tuple[str, ...]  # namespace/name


@dataclass(frozen=True)
class CarryDrain(Action):
    """Note on the faulted machine the drains people had set on its Slurm nodes (idempotent: an entry
    already there is kept)."""
    node: str
    drains: tuple[tuple[str, str], ...]  # (Slurm node, the person's reason)


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
    key: str  # idempotency key for the provider: one request per remediation and purpose

    @property
    def once(self) -> str:
        return f"capacity:{self.key}"


@dataclass(frozen=True)
class ResumeSlurm(Action):
    node: str  # a Slurm node name


@dataclass(frozen=True)
class ReleaseJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReturnToSpares(Action):
    node: str


# --- lending actions (reconciler/core/lending.py decides them) --------------------------------

@dataclass(frozen=True)
class Lend(Action):
    """Open a node to borrowers: the lending taint (for a spare, instead of the spare taint), the lent
    label, when. An idle node's NodeSet pods are evicted after (they do not tolerate the taint)."""

    node: str
    pool: str
    loan: str  # labels.LENT_SPARE | labels.LENT_IDLE


@dataclass(frozen=True)
class StartReclaim(Action):
    """No new borrower lands (the lent label goes); eviction of those there begins."""

    node: str
    why: str


@dataclass(frozen=True)
class EvictBorrowers(Action):
    node: str
    grace_seconds: int
    force: bool = False  # the reclaim grace has passed: delete what a PDB still keeps


@dataclass(frozen=True)
class EndLoan(Action):
    """The borrowers are gone: the lending taint off (a spare gets its spare taint back)."""

    node: str
    back_to_spare: bool


@dataclass(frozen=True)
class Step:
    """The core's answer for one record: run these actions, then persist `record`.
    `record` is None when there is nothing to do yet (look again after `recheck_after`).
    `carry`: the record may be written together with the next step's instead of before it, because
    losing it (a crash before that write) only replays idempotent actions to the same place."""

    actions: tuple[Action, ...] = ()
    record: Record | None = None
    recheck_after: float | None = None  # seconds; None = on the next event
    gate: "Gate | None" = None  # admission held it: surfaced as a metric, an Event and one page per pool
    carry: bool = False


@dataclass(frozen=True)
class Gate:
    """Why admission holds a remediation (containment is never held)."""

    reason: str  # TooManyUnhealthy | MaxConcurrent | HealingDisabled
    pool: str | None
    message: str
