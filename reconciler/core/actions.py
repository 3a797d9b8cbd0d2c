"""What the core tells the runtime to do, in order. The runtime's executor is the only code that acts
on these (fenced by the Lease, nothing in a dry run).

An action whose `once` is set is not to run twice (a page, a signal, a capacity request): the
remediation notes that key as begun (an intent) before it runs. What a crash between that write and the
send does depends on the action (`at_least_once`): a page or a capacity request is at most once (the intent
alone means done: never repeated, lost if the crash fell in that instant); the SIGTERM is at least once (a
delivered mark is written after the send, and an intent without it is sent again: twice only when the crash
falls between the send and that mark). The others are idempotent: repeating one after a crash changes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet.fleetspec import labels


@dataclass(frozen=True)
class Action:
    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def once(self) -> str | None:
        """The key under which the remediation notes that this once-only action was begun; None: idempotent."""
        return None

    @property
    def at_least_once(self) -> bool:
        """A once-only action whose loss costs more than its repetition: marked delivered after its send, and
        sent again while its intent stands without that mark."""
        return False


# --- healing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Notify(Action):
    event: str  # each event is sent once per remediation (and `key`)
    severity: str  # info | warning | critical
    text: str
    key: str = ""  # an event a remediation may send more than once, once per key (a replacement that broke)

    @property
    def once(self) -> str:
        return f"notify:{self.event}" + (f":{self.key}" if self.key else "")


@dataclass(frozen=True)
class NotifyOwner(Action):
    """Tell a job's owner, through an owner route (a webhook target with `job_owners`), what gpufleet did to it."""

    route: str
    job_id: int
    user: str
    account: str
    event: str  # signalled | requeued | held | running-again
    text: str


@dataclass(frozen=True)
class NoteSignals(Action):
    """Remember when a node's faults were signalled, on the node itself (for `occurrences`), so a
    restart keeps counting."""

    node: str
    signals: tuple[datetime, ...]


@dataclass(frozen=True)
class Cordon(Action):
    node: str
    reason: str
    remediation: str | None = None  # the remediation in progress, noted on the node


@dataclass(frozen=True)
class MarkDegraded(Action):
    """gpufleet's GPU condition set False on a node its GPUs' telemetry says is degraded (core/telemetry.py): the
    heal every fault takes follows from it."""

    node: str
    reason: str  # Dcgm<field id>
    message: str  # the condition format's header, then the evidence


@dataclass(frozen=True)
class DrainSlurm(Action):
    node: str  # a Slurm node name
    reason: str


@dataclass(frozen=True)
class DownSlurm(Action):
    """Set a Slurm node DOWN: what the slurmd preStop of a lost machine's NodeSet pod would have done
    (core/node_lost.py `let_go`)."""

    node: str  # a Slurm node name
    reason: str


@dataclass(frozen=True)
class SignalJobs(Action):
    job_ids: tuple[int, ...]
    signal: str = "TERM"

    @property
    def once(self) -> str:
        return f"signal:{self.signal}"

    @property
    def at_least_once(self) -> bool:
        return True  # a lost SIGTERM costs the job its checkpoint; a second one in that instant is the lesser harm


@dataclass(frozen=True)
class RequeueJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class NoteJob(Action):
    """Set a job's admin comment to `text`: what was there with gpufleet's missing lines appended
    (core/job_notes.py), so repeating it changes nothing."""

    job_id: int
    text: str


@dataclass(frozen=True)
class EvictPods(Action):
    """Ask for the eviction of these pods (namespace/name) of the node; those already leaving are not named."""

    node: str
    pods: tuple[str, ...]


@dataclass(frozen=True)
class DeletePods(Action):
    """Delete these pods (namespace/name) of the node whatever their PodDisruptionBudget says: NodeSet pods
    whose Slurm nodes run no job, still refused eviction when the drain timeout passed (the operator
    relabels a pod that stopped being busy on its next NodeSet sync; a stale label must not keep the Slurm
    node on the faulted machine)."""

    node: str
    pods: tuple[str, ...]
    force: bool = False  # grace 0: a lost machine's NodeSet pods (core/node_lost.py); else the pod's own 30 s


@dataclass(frozen=True)
class CarryDrain(Action):
    """Note on the faulted machine the drains people had set on its Slurm nodes (idempotent: an entry
    already there is kept)."""

    node: str
    drains: tuple[tuple[str, str], ...]  # (Slurm node, the person's reason)


@dataclass(frozen=True)
class NoteHolds(Action):
    """Write the people's drains kept for the machine's Slurm nodes (annotation labels.PERSON_HOLDS; None
    removes it): core/person_holds.py."""

    node: str
    holds: str | None


@dataclass(frozen=True)
class PageOnce(Action):
    """Send `page` once per `key` across restarts: the key is noted on the node first (annotation
    labels.SLURM_DRAIN_PAGED), and a node that notes it is not paged again (core/slurm_drains.py `again`). At most
    once: a crash between the note and the send loses the page, as an intent does a remediation's."""

    node: str
    key: str
    page: Notify


@dataclass(frozen=True)
class PromoteSpare(Action):
    spare: str
    replaces: str
    pool: str


@dataclass(frozen=True)
class Quarantine(Action):
    node: str
    xid: int
    pool: str
    repair: bool = False  # the repair loop takes it next (issue 25): a provider keeps the machine for it


@dataclass(frozen=True)
class RequestCapacity(Action):
    pool: str
    reason: str
    key: str  # idempotency key for the provider: one request per remediation and purpose

    @property
    def once(self) -> str:
        return f"capacity:{self.key}"


@dataclass(frozen=True)
class SettleRefill(Action):
    """What became of a capacity request (`core/refills.py`): counted, and a failed one withdrawn (the
    placeholder deleted: nobody is waiting on it any more; the record, the page and its Events say so)."""

    pool: str
    key: str
    outcome: str  # RefillState.ANSWERED | RefillState.FAILED
    message: str = ""


@dataclass(frozen=True)
class GiveBack(Action):
    """A spare above its pool's declared count, given back through the provider (`core/surplus.py`):
    kubernetes-spares leaves it to the cluster autoscaler (role `surplus`, nothing may land there);
    aws-asg scales the group in by it. Idempotent: done again, it finds it done."""

    node: str
    pool: str
    why: str


@dataclass(frozen=True)
class ResumeSlurm(Action):
    node: str  # a Slurm node name


@dataclass(frozen=True)
class ReleaseJobs(Action):
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReturnToSpares(Action):
    node: str
    pool: str


@dataclass(frozen=True)
class DeleteRemediation(Action):
    """Retention: a finished remediation no rule reads any more."""

    name: str


# --- pool membership (reconciler/core/membership.py decides them) ---------------------------------

@dataclass(frozen=True)
class NodeShape:
    """What a membership plan read of a node to decide its changes: its role label and which of gpufleet's own
    taints (`gpufleet.io/`: spare, lending, quarantined) it carries. Other taints (the node lifecycle controller's `not-ready` on a node just registered)
    come and go and change no decision."""

    role: str
    taints: frozenset[str]

    @classmethod
    def of(cls, role: str, taint_keys: Iterable[str]) -> NodeShape:
        return cls(role, frozenset(k for k in taint_keys if k.startswith(f"{labels.GROUP}/")))

    def still(self, role: str, taint_keys: Iterable[str]) -> bool:
        return self == NodeShape.of(role, taint_keys)


@dataclass(frozen=True)
class ApplyMembership(Action):
    """Set these labels (and annotations) and add these taints on a node (only what is missing; nothing is
    removed), if the node still has the shape the plan saw: a spare promoted since is not tainted again."""

    node: str
    labels: Mapping[str, str]
    add_taints: tuple[Mapping[str, str], ...]
    why: str
    annotations: Mapping[str, str] = field(default_factory=dict)  # the Slinky topology spec
    seen: NodeShape | None = None  # None: whatever its shape now


@dataclass(frozen=True)
class SettleCapacityRequests(Action):
    """Let the providers settle the capacity requests joined nodes answered (`membership.settle`)."""


@dataclass(frozen=True)
class Report(Action):
    """A Warning Event about something a person should fix (a GPU node of no pool, an unreadable remediation)."""

    object_kind: str  # Node | Remediation
    name: str
    reason: str
    message: str


# --- lending (reconciler/core/lending.py decides them) --------------------------------------------

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
    """Evict these borrowers with the reclaim grace; `force` (the grace has passed): delete them."""

    node: str
    pods: tuple[str, ...]
    grace_seconds: int
    force: bool = False


@dataclass(frozen=True)
class EndLoan(Action):
    """The borrowers are gone (or, `lost`, the machine stopped answering and its heal took it): the lending
    taint off (a spare gets its spare taint back)."""

    node: str
    back_to_spare: bool
    lost: bool = False


@dataclass(frozen=True)
class WriteLedger(Action):
    """One pool's entry of the lending ledger ConfigMap (fleetspec/ledger.py's JSON)."""

    pool: str
    text: str
