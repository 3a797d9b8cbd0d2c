"""Typed data at the reconciler's boundaries: what it observes, what it records, what a step needs.

All frozen: the core takes these and returns new ones; only the runtime does I/O. The actions the
core returns are in `actions.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind, default_action
from gpufleet.fleetspec.faults.catalogue import When
from gpufleet.fleetspec.node_repair import HealthCheckRecord, RepairRequest, RepairResult
from gpufleet.fleetspec.oncall import PersonRequest

from gpufleet.reconciler.core import slurm_states
from gpufleet.reconciler.core.phases import Phase, check_transition, last_entered
from gpufleet.reconciler.core.diagnosis_stages import Diagnosis
from gpufleet.reconciler.core.repair_phases import Repair


@dataclass(frozen=True)
class Fault:
    """A GPU fault signalled by a node condition: which code on which GPU, and what it needs."""

    xid: int  # the code (an SXid's for kind sxid; 0 for gpu-lost)
    message: str
    since: datetime  # the condition's lastTransitionTime: one signal, however often it is re-read
    kind: Kind = Kind.XID
    action: FaultAction | None = None  # as the condition says; None: the catalogue's for the code
    pci: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    source: str = ""  # the condition type it was read from
    reporter: str = ""  # who wrote that condition: its field manager in the node's managedFields ("" unknown)
    when: When = When.CHECKPOINT  # JOB_BOUNDARY: NVIDIA's DRAIN_AND_RESET, healed at its job's end (core/job_boundary.py)

    @property
    def needs(self) -> FaultAction:
        return self.action or default_action(self.kind, self.xid)


@dataclass(frozen=True)
class NodeView:
    """One Kubernetes node as the core needs to see it."""

    name: str
    pool: str | None
    role: str  # labels.ROLE_*
    ready: bool = True
    unschedulable: bool = False
    fault: Fault | None = None
    not_ready_since: datetime | None = None  # the Ready condition's lastTransitionTime while it is not True
    ready_status: str = ""  # the Ready condition's status (True, False, Unknown)
    ready_message: str = ""  # and its message (the node controller's "Kubelet stopped posting node status.")
    health_check_passed: bool = False  # condition True with reason HealthCheckPassed
    remediation: str | None = None  # the remediation in progress, from the node annotation
    taints: tuple[str, ...] = ()  # taint keys
    signals: tuple[datetime, ...] = ()  # earlier fault signals, persisted on the node (for `occurrences`)
    labels: tuple[tuple[str, str], ...] = ()  # all of them, for pool membership
    provider_id: str = ""
    gpus: int = 0  # nvidia.com/gpu capacity
    created: str = ""  # metadata.creationTimestamp, as sent: which capacity request a joined spare answers
    fulfils: str | None = None  # the capacity request this node answered (annotation labels.FULFILS)
    lent: str = ""  # the lent label's value (spare | idle): open to borrowers
    lent_since: datetime | None = None
    reclaiming: datetime | None = None  # borrowers are being evicted since then
    carried_drain: str = ""  # a person's Slurm drain carried to this machine (annotation labels.CARRIED_DRAIN)
    person_holds: str = ""  # people's drains of its Slurm nodes, kept (annotation labels.PERSON_HOLDS)
    slurm_drain_paged: str = ""  # the Slurm drain its slurm-drain-again page was sent for (labels.SLURM_DRAIN_PAGED)
    topology: str = ""  # annotation labels.SLINKY_TOPOLOGY_SPEC
    boot_id: str = ""  # status.nodeInfo.bootID: a reboot changes it
    check: HealthCheckRecord | None = None  # its last health check (issue 25)
    repair_request: RepairRequest | None = None  # the reset or reboot asked of it
    repair_result: RepairResult | None = None  # how the last one went, as whoever acted on the node said

    @property
    def proven(self) -> bool:
        """Passed a health check on its current boot."""
        return self.check is not None and self.check.proves(self.boot_id)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

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
    deleting: bool = False  # has a deletionTimestamp: on its way out (never undone for this uid)
    deletion_grace: int | None = None  # its deletion's grace (metadata.deletionGracePeriodSeconds); 0: forced
    uid: str = ""
    unschedulable: str = ""  # the scheduler found no node for it (PodScheduled=False, Unschedulable): its message

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class Setter:
    """Who set a Slurm node's reason, as Slurm records it (reconciler/core/slurm_reasons.py), and whether that
    user is gpufleet's own or one Slurm's daemons run as (the SlurmUser, root): drains.SlurmUsers.setter."""

    user: str
    gpufleet: bool = False
    slurm: bool = False


@dataclass(frozen=True)
class SlurmNodeView:
    """A Slurm node's state as the core needs it (names are Slurm's, never assumed Kubernetes').
    What the state words mean is `slurm_states`'."""

    name: str
    states: frozenset[str] = frozenset()
    reason: str = ""
    comment_node: str | None = None  # the Kubernetes node in the operator's JSON comment, if any
    partitions: tuple[str, ...] = ()
    last_busy: datetime | None = None  # when it last ran a job (Slurm's LastBusyTime)
    set_by: Setter | None = None  # who set `reason` (Slurm's record); None when Slurm did not name one
    reason_at: datetime | None = None  # when `reason` was set (Slurm's reason_time); None when Slurm did not say

    @property
    def busy(self) -> bool:
        return slurm_states.busy(self.states)

    @property
    def idle(self) -> bool:
        return slurm_states.idle(self.states)

    @property
    def drained(self) -> bool:
        return slurm_states.drained(self.states)

    @property
    def down(self) -> bool:
        return slurm_states.down(self.states)

    @property
    def takes_jobs(self) -> bool:
        return slurm_states.takes_jobs(self.states)


@dataclass(frozen=True)
class ReplacementFailure:
    """A spare promoted (or chosen) for a remediation that broke before the remediation succeeded."""

    node: str
    at: datetime
    why: str


class RefillState:
    REQUESTED = "Requested"  # the provider was asked for one more node of the pool
    ANSWERED = "Answered"  # a node joined for it (kubernetes-spares: a node settled the request)
    FAILED = "Failed"  # the provider could not, or nobody answered within healing.refill_timeout_seconds


@dataclass(frozen=True)
class Refill:
    """The node a remediation asked its pool's provider for, to replace the spare it used (or had none of)."""

    key: str  # the capacity request's idempotency key (this attempt's: each ask has its own)
    state: str  # RefillState
    at: datetime  # when it entered that state
    message: str = ""
    attempt: int = 1  # how many times it was asked (a failed refill is asked again, `refills.py`)
    retry_at: datetime | None = None  # Failed: when it is asked again, if the pool still lacks a node then


@dataclass(frozen=True)
class Stock:
    """A pool's spares against its declaration, as one remediation weighs whether to ask for a node
    (`refills.stock`)."""

    declared: int  # the pool's declared spares
    spares: int  # spares it has (not faulted, not another remediation's chosen replacement)
    requested: int  # nodes asked for and not yet settled (other remediations')
    waiting: int  # remediations waiting for a spare (other than the one weighing)

    def lacks(self, waiting_self: bool = False) -> int:
        return self.declared + self.waiting + int(waiting_self) - self.spares - self.requested

    def says(self) -> str:
        return (f"{self.spares} spare(s) of {self.declared} declared, {self.requested} node(s) asked for, "
                f"{self.waiting} remediation(s) waiting for a spare")


@dataclass(frozen=True)
class Remediation:
    """One remediation of one node, persisted as a `remediations.gpufleet.io` object."""

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
    job_nodes: tuple[str, ...] = ()  # every Slurm node the jobs ran on when they were signalled (for `why`)
    kept_drains: tuple[str, ...] = ()  # of those, the ones a person had drained: never touched
    held_message: str = ""  # why admission holds it (the gate's message)
    held_reason: str = ""  # the gate's reason (TooManyUnhealthy | MaxConcurrent)
    delivered: tuple[str, ...] = ()  # of the intents, the at-least-once actions whose send was confirmed
    signalled: tuple[int, ...] = ()  # the jobs this remediation sent SIGTERM (others' checkpoints are waited on)
    failed_replacements: tuple[ReplacementFailure, ...] = ()  # spares that broke standing in for the node
    stands_in_for: str = ""  # this node was another remediation's replacement and broke before it succeeded
    refill: Refill | None = None  # the node asked for to refill the pool's spares, and what became of it
    waiting: str = ""  # why the current phase waits (a Slurm node's pod no node can take, ...)
    reclaim_started: datetime | None = None  # the chosen spare was lent: its borrowers are evicted since then
    failing_since: datetime | None = None  # first temporary failure of the current step
    next_attempt: datetime | None = None  # backoff: not before this time
    last_error: str = ""
    revision: int = 0  # writes by the reconciler: a cache never takes an older copy over a newer one
    # The fault, as the node said it (issue 21): what it needs and where. For now every action that
    # remediates is contained and replaced alike; repairing in place will read `action`.
    kind: Kind = Kind.XID
    action: FaultAction | None = None  # None: a remediation from before the fault carried its action
    pci: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    source: str = ""
    reporter: str = ""  # who reported the fault (Fault.reporter)
    repair: Repair | None = None  # the node's repair once its heal is over (issue 25)
    diagnosis: Diagnosis | None = None  # the check a `diagnose` fault asks for (phase Diagnosing; core/diagnosis.py)
    request: PersonRequest | None = None  # a person's decision (an annotation, not the status)
    requests_done: tuple[str, ...] = ()  # the ids of the person's requests carried out

    def moved(self, phase: Phase, now: datetime, **changes) -> "Remediation":
        """This remediation in a new phase. Rejects moves the phase table does not allow."""
        check_transition(self.phase, phase)
        changes = {"retries": 0, "failing_since": None, "next_attempt": None, "last_error": "", **changes}
        return replace(self, phase=phase, phase_times=self.phase_times + ((phase.value, now),), **changes)

    def entered(self, phase: Phase) -> datetime | None:
        return last_entered(self.phase_times, phase.value)

    @property
    def active(self) -> bool:
        return not self.phase.terminal


def remediation_name(node: str, fault: Fault) -> str:
    """Deterministic: the same node and signal give the same name, so a repeated signal or
    a restart creates nothing new (the API server answers AlreadyExists)."""
    what = {Kind.XID: f"xid{fault.xid}", Kind.SXID: f"sxid{fault.xid}", Kind.GPU_LOST: "gpulost",
            Kind.DCGM: f"dcgm{fault.xid}", Kind.NODE_LOST: "nodelost",
            Kind.SLURM_DRAIN: f"slurmdrain{fault.xid}"}[fault.kind]
    return f"{node}-{what}-{int(fault.since.timestamp())}"


@dataclass(frozen=True)
class JobView:
    job_id: int
    state: str
    nodes: tuple[str, ...] = ()  # every Slurm node of its allocation (the faulted one and the others)


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
    """What admission weighs, counted across the fleet (`decide.admission_facts`)."""

    pool_size: int
    unhealthy: frozenset[str]  # nodes of the pool out for a fault now (admission.unhealthy_now)
    in_flight: int  # admitted remediations, all pools (Evicting, Replacing, Resuming)
    attempts: int  # earlier remediations of this node within the attempts window
    storm_paged: bool = False  # a live remediation of the pool has sent the storm page already
    stands_in_for: str = ""  # the remediation whose replacement this node was, and broke before it succeeded
    free_spares: int = 0  # the pool's spares free now (what an escalated node leaves unused)
    reporters: tuple[tuple[str, str], ...] = ()  # (node, who reported its fault) for the unhealthy nodes
    repair_decides: str = ""  # what the repair loop decides for this node after its heal, for good ('' nothing yet)


@dataclass(frozen=True)
class Needs:
    """What the next step of a remediation reads (`decide.needs`): the runtime gathers this and no more."""

    slurm_names: bool = False  # the Slurm nodes of the NodeSet pods on the node (from the pods)
    slurm_nodes: tuple[str, ...] = ()  # ask Slurm for these nodes' state ...
    jobs_on: tuple[str, ...] = ()  # ... and for the jobs on these
    pods: bool = False  # the node's pods (opt-out, eviction)
    admission: bool = False  # counts across the fleet, under the admission lock
    spares: bool = False  # the pool's nodes, the Slurm nodes on its spares, the nodes claimed elsewhere
    replacement: bool = False  # the chosen spare as seen now, and the pods on it
    replacement_slurm: bool = False  # the Slurm nodes on the chosen spare and those that moved to a healthy node (reads slurm_pods too)
    can_refill: bool = False  # ask the node provider whether it has room for one more node
    checkpoints: bool = False  # the jobs other remediations have signalled and whose checkpoint is under way
    slurm_pods: bool = False  # where the pods of the remediation's Slurm nodes are (placed or not)
    failed_on: tuple[str, ...] = ()  # jobs whose run on these Slurm nodes ended NODE_FAIL (Slurm requeued them) ...
    failed_since: datetime | None = None  # ... since then (accounting's record)

    @property
    def asks_slurm(self) -> bool:
        return bool(self.slurm_nodes or self.jobs_on or self.spares or self.replacement_slurm or self.failed_on)

    @property
    def shared(self) -> bool:
        """Facts counted across nodes: gathered and decided under one lock, so no slot, spare or SIGTERM
        goes twice."""
        return self.admission or self.spares or self.checkpoints


@dataclass(frozen=True)
class StepFacts:
    """What the runtime observed for one step of one remediation (what `Needs` asked for)."""

    jobs_on_node: tuple[JobView, ...] = ()
    slurm_names: tuple[str, ...] = ()  # Slurm nodes whose NodeSet pods run on the faulted node (from the pods)
    slurm: tuple[SlurmNodeView, ...] = ()  # the remediation's Slurm nodes, and the replacement's
    pods: tuple[PodView, ...] = ()  # the pods on the faulted node
    admission: Admission | None = None
    pool_nodes: tuple[NodeView, ...] = ()  # the pool's nodes: the spares to choose from
    claimed: frozenset[str] = frozenset()  # nodes taken elsewhere (other remediations' spares, a lending pass)
    spare_slurm: tuple[tuple[str, tuple[SlurmNodeView, ...]], ...] = ()  # Slurm nodes on each spare
    replacement: NodeView | None = None
    replacement_pods: tuple[PodView, ...] = ()  # pods on the replacement now (borrowers to take back)
    replacement_slurm: tuple[str, ...] = ()  # Slurm nodes whose pods run on the replacement now
    can_refill: bool = True  # the provider has room for one more node (e.g. below the group's MaxSize)
    refusal: str = ""  # the provider's words when it has no room
    stock: Stock | None = None  # the pool's spares against its declaration (None: not weighed)
    checkpoints: tuple[tuple[int, datetime], ...] = ()  # jobs another remediation signalled, and its grace deadline
    slurm_pods: tuple[PodView, ...] = ()  # the pods of the remediation's Slurm nodes, wherever they are
    node: NodeView | None = None  # the faulted node as it is now (read with its pods)
    failed_jobs: tuple[JobView, ...] = ()  # jobs Slurm failed off the Slurm nodes (Needs.failed_on), their nodes the run's


@dataclass(frozen=True)
class Gate:
    """Why admission holds a remediation (containment is never held)."""

    reason: str  # gpufleet.fleetspec.remediation_crd.Reason: TooManyUnhealthy | MaxConcurrent | HealingDisabled
    pool: str | None
    message: str


@dataclass(frozen=True)
class Step:
    """The core's answer for one remediation: run these actions, then persist `remediation`.
    `remediation` is None when there is nothing to write yet (look again after `recheck_after`).
    `carry`: it may be written together with the next step's instead of before it, because losing it
    (a crash before that write) only replays idempotent actions to the same place."""

    actions: tuple = ()  # of actions.Action
    remediation: Remediation | None = None
    recheck_after: float | None = None  # seconds; None = on the next event
    gate: Gate | None = None  # admission held it (a HealingDisabled gate is only logged)
    carry: bool = False
