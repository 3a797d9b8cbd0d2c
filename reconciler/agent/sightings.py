"""What the node agent has seen, what it still has to report, and whether to report it. Pure.

A sighting is a GPU event the agent must report: a fault that takes the node out (the GPU condition,
in fleetspec/faults/condition.py's format; a `diagnose` one too, which the reconciler checks while the node
stays in service) or a `restart-app` one (an Event on the node, which stays in service). The agent remembers one fact on its node, the annotation `gpufleet.io/kmsg-reported`
= "<boot id>:<seq>": the kernel-log sequence number up to which every such event has been
reported (or found already reported). It reads /dev/kmsg from the oldest record at every start
and reports only what lies past that cursor, so a restarted agent reports nothing twice, nothing
from before the last repair (a repair comes after the report, and the report moved the cursor),
and whatever the kernel logged while the agent was down. The record numbers restart at a reboot;
the boot id tells the runs apart.

While the API server cannot be reached, sightings wait in `Pending`: one per (code, GPU, action),
oldest first, bounded, so a flood of the same line during an outage is one report when it is back.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from gpufleet.fleetspec.faults import FaultAction
from gpufleet.fleetspec.faults.classify import Classification
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, parse_condition, reason_for
from gpufleet.fleetspec.faults.driver import GpuEvent


LATE_AFTER_SECONDS = 5  # a report this much later than the sighting says when it was seen


@dataclass(frozen=True)
class Cursor:
    """Reported up to record `seq` of boot `boot` (-1: nothing of this boot yet)."""

    boot: str
    seq: int

    def __str__(self) -> str:
        return f"{self.boot}:{self.seq}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """The annotation's value, or None when absent or not of the form "<boot>:<seq>"."""
        boot, _, seq = (text or "").rpartition(":")
        try:
            return cls(boot, int(seq)) if boot else None
        except ValueError:
            return None


def resume_from(saved: Cursor | None, boot: str, log_end: int, condition_set: bool) -> Cursor:
    """Where this run's reporting starts, from the cursor on the node and the log as found at start
    (`log_end`: the newest record's number then, -1 for an empty log or a file read from its end).

    A cursor of this boot: right after it. A cursor of an earlier boot, or a node whose condition was
    never set: the whole log, all of it is news. No cursor but a condition (a node reported on before
    the cursor existed): the end of the log, which may hold faults reported and repaired since.
    """
    if saved is not None and saved.boot == boot:
        return saved
    if saved is not None or not condition_set:
        return Cursor(boot, -1)
    return Cursor(boot, log_end)


@dataclass(frozen=True)
class Sighting:
    """A GPU event to report: the kernel-log records it was seen in (`first_seq`..`last_seq`, None
    for lines without a record number, as in a drill file: always news), how many, and what it needs."""

    event: GpuEvent
    first_seq: int | None
    last_seq: int | None
    seen_at: datetime
    count: int = 1
    verdict: Classification = Classification(FaultAction.REPLACE, "")

    @property
    def key(self) -> tuple:
        e = self.event
        return (e.kind, e.code, e.pci, e.gpu_instance, e.compute_instance, self.verdict.action, self.verdict.when)

    @property
    def reason(self) -> str:
        return reason_for(self.event.kind, self.event.code)

    @property
    def notice(self) -> bool:
        """Reported as an Event on the node (the job's problem), not as the node's condition. A `diagnose` one is
        the condition (with `action=diagnose`: the reconciler checks the node while it stays in service)."""
        return not self.verdict.remediates and self.verdict.action is not FaultAction.DIAGNOSE

    @property
    def signal(self) -> FaultSignal:
        e = self.event
        return FaultSignal(e.kind, e.code, self.verdict.action, e.pci, e.gpu_instance, e.compute_instance,
                           when=self.verdict.when)


class Pending:
    """Sightings not reported yet: one per (XID, GPU), oldest first, at most `limit` of them.
    A repeat of a queued sighting is merged into it; a new one beyond the limit is refused (and
    counted in `refused`): the oldest fault is the one that explains the node."""

    def __init__(self, limit: int = 32):
        self.limit = limit
        self.refused = 0
        self._items: dict[tuple[int, str], Sighting] = {}

    def add(self, s: Sighting) -> bool:
        """Queue `s`; False when it was refused because the queue is full."""
        old = self._items.get(s.key)
        if old is not None:
            self._items[s.key] = replace(old, last_seq=newest(old.last_seq, s.last_seq), count=old.count + s.count)
            return True
        if len(self._items) >= self.limit:
            self.refused += 1
            return False
        self._items[s.key] = s
        return True

    def oldest(self) -> Sighting | None:
        return next(iter(self._items.values()), None)

    def done(self, s: Sighting) -> None:
        """Remove `s` once handled. A repeat merged in meanwhile stays queued, still first: it came
        after what was reported, and the cursor must pass it too."""
        cur = self._items.pop(s.key, None)
        if cur is not None and cur != s:
            first = None if s.last_seq is None else s.last_seq + 1  # the repeats came after what was handled
            rest = replace(cur, first_seq=first, count=cur.count - s.count)
            self._items = {s.key: rest, **self._items}

    def floor(self) -> int | None:
        """The oldest record number still queued: the cursor must stay below it."""
        return min((s.first_seq for s in self._items.values() if s.first_seq is not None), default=None)

    def __len__(self) -> int:
        return len(self._items)


def newest(a: int | None, b: int | None) -> int | None:
    """The larger of two record numbers, either of which may be unknown."""
    return a if b is None else b if a is None else max(a, b)


class Verdict(str, Enum):
    REPORT = "report"
    REPORTED_BEFORE = "reported before"  # at or behind the cursor: an earlier run handled it
    ALREADY_SET = "already set"          # the condition already says this fault
    OUTRANKED = "outranked"              # a diagnose one while the condition says a fault that takes the node out


def verdict(s: Sighting, upto: Cursor, condition: dict | None) -> Verdict:
    """Whether to write the condition for `s`, given the cursor and the node's current condition."""
    if s.last_seq is not None and s.last_seq <= upto.seq:
        return Verdict.REPORTED_BEFORE
    if (not s.notice and condition is not None and condition.get("status") == "False"
            and condition.get("reason") == s.reason):
        return Verdict.ALREADY_SET
    if s.verdict.action is FaultAction.DIAGNOSE and condition is not None and condition.get("status") == "False":
        # Never written over a fault that takes the node out (reported as an Event instead); a diagnosis asked
        # already covers the node.
        sig = parse_condition(str(condition.get("reason") or ""), str(condition.get("message") or ""))
        return Verdict.ALREADY_SET if sig is not None and sig.action is FaultAction.DIAGNOSE else Verdict.OUTRANKED
    return Verdict.REPORT


def advance(upto: Cursor, handled: int | None, floor: int | None) -> Cursor:
    """The cursor once every record up to `handled` is handled, but never past a sighting still
    queued (`floor`, from Pending.floor): a restart must still see that one."""
    if handled is None:
        return upto
    seq = handled if floor is None else min(handled, floor - 1)
    return upto if seq <= upto.seq else replace(upto, seq=seq)


def pci_key(address: str) -> str:
    """A PCI address as the kernel log (`0000:9b:00`) and nvidia-smi's pci.bus_id (`00000000:9B:00.0`) both
    reduce to: domain's last 4 hex digits, bus, device, lower case, no function."""
    parts = address.strip().lower().split(":")
    if len(parts) != 3:
        return address.strip().lower()
    return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2].split('.')[0]}"


def gpu_indexes(csv: str) -> dict[str, int]:
    """PCI address (pci_key) -> the GPU's index, from `nvidia-smi --query-gpu=index,pci.bus_id
    --format=csv,noheader` (NVIDIA's nvidia-smi(1): `index` is the GPU's zero-based index, in the order
    nvidia-smi lists GPUs, that is by PCI bus id; it may change at a reboot, which is why it is read at start).
    Lines that do not parse are skipped."""
    out = {}
    for line in csv.splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit() and bus.strip():
            out[pci_key(bus)] = int(index)
    return out


def condition_message(s: Sighting, now: datetime, gpus: Mapping[str, int] | None = None) -> str:
    """The condition's (or the Event's) message: what the fault needs and where, the driver's words,
    and when it was seen if the report is late (an API outage), so the record does not claim the fault
    is newer than it is."""
    msg = s.event.message
    if s.count > 1:
        msg += f" (seen {s.count} times)"
    if (now - s.seen_at).total_seconds() >= LATE_AFTER_SECONDS:
        msg += f" (seen at {s.seen_at.strftime('%Y-%m-%dT%H:%M:%SZ')}, reported late)"
    signal = s.signal
    if gpus and signal.pci and pci_key(signal.pci) in gpus:
        signal = replace(signal, gpu=gpus[pci_key(signal.pci)])
    return format_message(signal, f"{msg} [NVIDIA: {s.verdict.nvidia}]" if s.verdict.nvidia else msg)
