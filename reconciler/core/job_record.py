"""gpufleet's side of a job's story, kept where the job's owner can read it with their own Slurm identity: in
the job's admin comment, next to the short dated lines (`job_notes.py`), as one compact record per
remediation that touched the job. `gpufleet why` on the login node reads it back through Slurm alone (no
Kubernetes credentials), so an engineer sees the stories of exactly the jobs Slurm shows them.

Why the admin comment: slurmctld lets only a super user (an Administrator, the reconciler's own Slurm user) set
it (slurm-26-05-3-1 src/slurmctld/job_mgr.c, the admin_comment checks in `_update_job`), so a job's owner
cannot forge it, and it is sent with the job to everyone who may see the job (job_mgr.c `pack_job` packs
`admin_comment` for every job it packs; which jobs a user sees is slurm.conf's `PrivateData=jobs`, man
slurm.conf(5)). The user's own `comment` is never written.

The record: `gpufleet-record v1 key=value ...`, one space between pairs, values percent-encoded
(urllib.parse.quote, so no space, `|` or `=` appears in one), the remediation by a short id (`record_id`),
so a record stays well under 200 characters, unknown keys ignored (a newer writer), a
record that does not parse ignored (never a wrong story). Pure: stdlib and the spec only.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from urllib.parse import quote, unquote

from gpufleet.fleetspec.faults import Kind
from gpufleet.fleetspec.faults.catalogue import When
from gpufleet.fleetspec.faults.condition import parse_header

from gpufleet.reconciler.core.model import Fault, Remediation, RefillState
from gpufleet.reconciler.core.phases import Phase

HEAD = "gpufleet-record v1"

# What the job waits on while its remediation is not over (`waiting_for`), and how it ended.
REPLACING, SPARE, REFILL_PENDING, REFILL_FAILED = "replacing", "spare", "refill-pending", "refill-failed"
HELD, PERSON, REPAIR, DONE, NOTHING = "held", "person", "repair-in-place", "replaced", "nothing"
AT_BOUNDARY = "at-boundary"  # NVIDIA's DRAIN_AND_RESET: its node drained, the job left to run to its end
CHECKPOINTING = "checkpointing"  # contained, the job asked to checkpoint: not requeued yet


@dataclass(frozen=True)
class JobRecord:
    """One remediation as the job's owner needs it. Times are UTC; None where not (yet) known."""

    remediation: str  # the remediation's short id (`record_id`), the key that keeps one record per remediation
    slurm_node: str  # the faulted machine's Slurm node(s), comma-separated (what the engineer knows)
    fault_at: datetime
    kind: str = Kind.XID.value
    code: int = 0
    action: str = ""  # FaultAction value
    gpu: int | None = None  # the GPU's index on its node (nvidia-smi's `index`), where the detector said it
    pci: str = ""  # its PCI address, where the detector said it
    model: str = ""  # the pool's GPU model (spec: pools[].gpu_model)
    signalled_at: datetime | None = None  # SIGTERM sent to checkpoint
    grace_s: int | None = None  # seconds the job was given after the SIGTERM
    requeued_at: datetime | None = None
    state: str = REPLACING  # REPLACING | SPARE | REFILL_* | HELD | PERSON | REPAIR | DONE | NOTHING
    since: datetime | None = None  # when `state` began
    next_at: datetime | None = None  # when the next try is due (a failed refill asked again)
    replaced_at: datetime | None = None  # the Slurm node runs on a healthy machine since

    def to_json(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, datetime):
                d[k] = iso(v)
        return d


def iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_KEYS = {"r": "remediation", "n": "slurm_node", "t": "fault_at", "k": "kind", "c": "code", "a": "action",
         "g": "gpu", "p": "pci", "m": "model", "s": "signalled_at", "gr": "grace_s", "q": "requeued_at",
         "w": "state", "ws": "since", "nx": "next_at", "x": "replaced_at"}
_TIMES = {"fault_at", "signalled_at", "requeued_at", "since", "next_at", "replaced_at"}
_INTS = {"code", "gpu", "grace_s"}


def encode(rec: JobRecord) -> str:
    """The record as one admin-comment segment (each value percent-encoded, times as epoch seconds)."""
    parts = [HEAD]
    for short, name in _KEYS.items():
        v = getattr(rec, name)
        if v is None or v == "":
            continue
        text = str(int(v.timestamp())) if isinstance(v, datetime) else str(v)
        parts.append(f"{short}={quote(text, safe=':')}")
    return " ".join(parts)


def decode(segment: str) -> JobRecord | None:
    """A segment written by `encode`; None when it is none or does not parse (ignored, never guessed)."""
    if not segment.startswith(HEAD + " "):
        return None
    values: dict = {}
    try:
        for token in segment[len(HEAD) + 1:].split(" "):
            short, eq, raw = token.partition("=")
            name = _KEYS.get(short)
            if not eq or name is None:
                continue
            text = unquote(raw)
            if name in _TIMES:
                values[name] = datetime.fromtimestamp(int(text), timezone.utc)
            elif name in _INTS:
                values[name] = int(text)
            else:
                values[name] = text
        return JobRecord(**values)
    except (TypeError, ValueError, OverflowError):
        return None


def record_id(name: str) -> str:
    """A remediation's name (a Kubernetes node's name and more: up to 253 characters) as a short, stable key."""
    return hashlib.sha256(name.encode()).hexdigest()[:10]


def gpu_index(message: str) -> int | None:
    """The GPU's index on its node, where the condition's header says it (`gpu=N`: nvidia-smi's `index`,
    fleetspec/faults/condition.py format_message)."""
    raw = parse_header(message).get("gpu", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 2 else None


def waiting_for(r: Remediation) -> tuple[str, datetime | None, datetime | None]:
    """What the job's remediation waits on now: (state, since when, when the next try is due)."""
    last = r.phase_times[-1][1] if r.phase_times else r.created
    if r.phase is Phase.SUCCEEDED:
        return DONE if r.entered(Phase.RESUMING) is not None else NOTHING, last, None
    if r.phase in (Phase.FAILED, Phase.ESCALATED, Phase.OPTED_OUT):
        return PERSON, last, None
    if r.phase in (Phase.DETECTED, Phase.SLURM_DRAINING, Phase.CHECKPOINTING):
        return CHECKPOINTING, last, r.grace_deadline
    if r.phase is Phase.HELD:
        return HELD, last, None
    if r.phase is Phase.WAITING_FOR_SPARE:
        if r.repair is not None and r.refill is None:  # its machine repaired in place: it may come back first
            return REPAIR, last, None
        if r.refill is not None and r.refill.state == RefillState.FAILED:
            return REFILL_FAILED, r.refill.at, r.refill.retry_at
        if r.refill is not None and r.refill.state == RefillState.REQUESTED:
            return REFILL_PENDING, r.refill.at, None
        return SPARE, last, None
    return REPLACING, last, None


def record_of(r: Remediation, model: str = "") -> JobRecord:
    """The record of one remediation, from its recorded phases and times only (the same remediation always
    gives the same record: writing it again changes nothing)."""
    state, since, next_at = waiting_for(r)
    signalled = r.entered(Phase.CHECKPOINTING) if "signal:TERM" in r.intents else None
    grace = None
    if signalled is not None and r.grace_deadline is not None:
        grace = max(0, round((r.grace_deadline - signalled).total_seconds()))
    replaced = r.entered(Phase.SUCCEEDED) if state == DONE else None
    return JobRecord(remediation=record_id(r.name), slurm_node=",".join(r.slurm_nodes) or r.node, fault_at=r.created,
                     kind=r.kind.value, code=r.xid, action=(r.action.value if r.action else ""),
                     gpu=gpu_index(r.message), pci=r.pci, model=model, signalled_at=signalled, grace_s=grace,
                     requeued_at=r.entered(Phase.REQUEUED), state=state, since=since, next_at=next_at,
                     replaced_at=replaced)


def notice_record(node: str, slurm_nodes, fault: Fault, model: str = "") -> JobRecord:
    """The record of a fault that left its node in service (restart-app, diagnose): nothing was done to the job;
    keyed as a remediation of that node and signal would be (model.remediation_name)."""
    what = {Kind.XID: f"xid{fault.xid}", Kind.SXID: f"sxid{fault.xid}", Kind.GPU_LOST: "gpulost",
            Kind.DCGM: f"dcgm{fault.xid}", Kind.NODE_LOST: "nodelost",
            Kind.SLURM_DRAIN: f"slurmdrain{fault.xid}"}[fault.kind]
    return JobRecord(remediation=record_id(f"{node}-{what}-{int(fault.since.timestamp())}"),
                     slurm_node=",".join(sorted(slurm_nodes)) or node, fault_at=fault.since, kind=fault.kind.value,
                     code=fault.xid, action=fault.needs.value, gpu=gpu_index(fault.message), pci=fault.pci,
                     model=model, state=AT_BOUNDARY if fault.when is When.JOB_BOUNDARY else NOTHING, since=fault.since)


def records_in(admin_comment: str, separator: str) -> list[JobRecord]:
    """Every record in an admin comment, the last of each remediation (oldest fault first)."""
    found: dict[str, JobRecord] = {}
    for segment in admin_comment.split(separator):
        rec = decode(segment.strip())
        if rec is not None:
            found[rec.remediation] = rec
    return sorted(found.values(), key=lambda x: (x.fault_at, x.remediation))
