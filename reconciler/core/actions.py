"""What the core tells the runtime to do, in order. The runtime's executor is the only code that acts
on these (fenced by the Lease, nothing in a dry run).

An action whose `once` is set must not run twice (a page, a signal, a capacity request): the
remediation notes that key as begun before it runs, so a crash never repeats it. The others are
idempotent: repeating one after a crash changes nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Action:
    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def once(self) -> str | None:
        """The key under which the remediation notes that this once-only action was begun; None: idempotent."""
        return None


# --- healing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Notify(Action):
    event: str  # each event is sent once per remediation
    severity: str  # info | warning | critical
    text: str

    @property
    def once(self) -> str:
        return f"notify:{self.event}"


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
class PromoteSpare(Action):
    spare: str
    replaces: str
    pool: str


@dataclass(frozen=True)
class Quarantine(Action):
    node: str
    xid: int
    pool: str


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
    pool: str


@dataclass(frozen=True)
class DeleteRemediation(Action):
    """Retention: a finished remediation no rule reads any more."""

    name: str


# --- pool membership (reconciler/core/membership.py decides them) ---------------------------------

@dataclass(frozen=True)
class ApplyMembership(Action):
    """Set these labels and add these taints on a node (only what is missing; nothing is removed)."""

    node: str
    labels: Mapping[str, str]
    add_taints: tuple[Mapping[str, str], ...]
    why: str


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
    """The borrowers are gone: the lending taint off (a spare gets its spare taint back)."""

    node: str
    back_to_spare: bool


@dataclass(frozen=True)
class WriteLedger(Action):
    """One pool's entry of the lending ledger ConfigMap (fleetspec/ledger.py's JSON)."""

    pool: str
    text: str
