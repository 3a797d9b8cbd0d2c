"""What gpufleet writes into a Slurm job's admin comment when it signals, requeues or holds the job, when the
job waits for a spare or a new machine, and when the job runs again: one short dated line per event (each
under LINE_MAX characters, the fault told once), appended to what is there, then each remediation's compact
record (`job_record.py`: what `gpufleet why` reads on the login node) and last where the whole story is
(`whole story: gpufleet why JOBID`). So `scontrol show job` (and `sacct --format=JobID,AdminComment` where
accounting runs) says why the job was touched, to everyone Slurm shows the job to.

Pure. Every line is built from the remediation's recorded phases and times (and, for the resume, from the
job's own start time), so the same event always gives the same line: writing is append-if-absent, and a
pass that repeats after a crash or a failed write adds nothing twice (at least once, never twice).

The admin comment is Slurm's field for administrators (slurmctld lets only a super user set it:
slurm-26-05-3-1 src/slurmctld/job_mgr.c, the admin_comment checks in `_update_job`); the user's own
`comment` is never touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from gpufleet.fleetspec.faults import FaultAction, Kind, describe
from gpufleet.fleetspec.models import WebhookTarget

from gpufleet.reconciler.core import job_boundary, slurm_drains
from gpufleet.reconciler.core.job_record import HEAD, gpu_index
from gpufleet.reconciler.core.model import Fault, RefillState, Remediation
from gpufleet.reconciler.core.phases import Phase

RUNNING = "RUNNING"

PREFIX = "gpufleet"
SEPARATOR = " | "  # between lines: one admin comment reads on one line in scontrol and sacct
LINE_MAX = 160  # each line well under 200 characters: `scontrol show job` shows it without wrapping it into noise
RESUME_WINDOW = timedelta(hours=24)  # after a remediation ends, how long its jobs are watched for their restart
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                      "DEADLINE", "OUT_OF_MEMORY"})
SIGNALLED, REQUEUED, HELD, RESUMED = "SIGTERM to checkpoint", "requeued", "on hold", "running again"
WAITING, NO_REFILL = "waiting for a spare", "no spare"
# A fault that leaves its node in service still concerns the job on that GPU: NVIDIA's RESTART_APP (94 among
# them, a contained ECC error: the hardware caught it, only the application must restart) and the diagnostics
# a repeated 13/31 asks for (RUN_DCGMEUD). The job gets a line, and its owner is told.
APP_RESTART, DIAGNOSTICS, AT_BOUNDARY = "restart-app", "diagnose", "drained at its end"
NOTICES = {FaultAction.RESTART_APP: (APP_RESTART, "the app on it must restart; node stays in service"),
           FaultAction.DIAGNOSE: (DIAGNOSTICS, "repeated: diagnostics asked while the job runs on")}


@dataclass(frozen=True)
class JobSeen:
    """A Slurm job as the notes need it (from slurmrestd's GET job)."""

    job_id: int
    state: str
    nodes: tuple[str, ...] = ()
    start_time: datetime | None = None
    admin_comment: str = ""
    user: str = ""
    account: str = ""


def stamp(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def note_line(at: datetime, what: str, text: str = "") -> str:
    """The one line for one event: `gpufleet <time>: <event>[: <text>]`, cut to LINE_MAX characters."""
    line = f"{PREFIX} {stamp(at)}: {what}" + (f": {text}" if text else "")
    return line if len(line) <= LINE_MAX else line[:LINE_MAX - 3] + "..."


def trailer(job_id: int) -> str:
    """The last segment: where the whole story is."""
    return f"whole story: gpufleet why {int(job_id)}"


def fault_summary(r: Remediation) -> str:
    """The fault in a few words, GPU first: `GPU 3 on h100-a-w17: GPU has fallen off the bus (Xid 79)`."""
    node = ",".join(r.slurm_nodes) or r.node
    if r.kind is Kind.SLURM_DRAIN:  # not a GPU's report: Slurm's own reason (core/slurm_drains.py)
        return slurm_drains.headline(r.message) or f"Slurm drained {node} itself"
    if r.kind is Kind.NODE_LOST:  # no GPU reported anything: the whole machine went silent (core/node_lost.py)
        return f"the machine behind {node} stopped answering"
    return f"{_gpu(r.message, r.pci)} on {node}: {_plain(r.xid, r.kind)}"


def _gpu(message: str, pci: str) -> str:
    index = gpu_index(message)
    return f"GPU {index}" if index is not None else (f"GPU {pci}" if pci else "a GPU")


def _plain(code: int, kind) -> str:
    """NVIDIA's words first, the code after: `GPU has fallen off the bus (Xid 79)`."""
    text = describe(code, kind)
    if text.startswith("XID ") and " (" in text:
        num, _, words = text[4:].partition(" (")
        return f"{words.rstrip(')')} (Xid {num})"
    return text


def grace_of(r: Remediation) -> int | None:
    start = r.entered(Phase.CHECKPOINTING)
    if start is None or r.grace_deadline is None:
        return None
    return max(0, round((r.grace_deadline - start).total_seconds()))


def lines_for(r: Remediation, job: JobSeen, peers: Sequence[Remediation] = ()) -> tuple[str, ...]:
    """Every line the remediation owes this job, oldest first (whether written or not): one per event, the
    fault told once (with the SIGTERM, or with the requeue when there was none). `peers`: the other
    remediations that touched the job (two nodes of one job faulting together): one requeue, one hold and one
    restart of the job are told once, by the earliest remediation that saw them, not once per remediation."""
    if job.job_id not in r.jobs:
        return ()
    node = ",".join(r.slurm_nodes) or r.node
    out = []
    others = [p for p in peers if p.name != r.name and job.job_id in p.jobs]
    checkpointing = r.entered(Phase.CHECKPOINTING)
    told = False
    if checkpointing is not None and "signal:TERM" in r.intents:
        grace = grace_of(r)
        out.append(note_line(checkpointing, SIGNALLED, fault_summary(r) + (f"; {grace} s grace" if grace else "")))
        told = True
    requeued = r.entered(Phase.REQUEUED)
    if requeued is not None and not _told_by_peer(r, others, Phase.REQUEUED, job):
        out.append(note_line(requeued, REQUEUED, f"the machine behind {node} is replaced" if told
                             else fault_summary(r)))
    held = r.entered(Phase.HELD)
    if held is not None and not _told_by_peer(r, others, Phase.HELD, job):
        out.append(note_line(held, HELD, f"replacing {node}'s machine waits for the on-call"))
    waiting = r.entered(Phase.WAITING_FOR_SPARE)
    if waiting is not None:
        out.append(note_line(waiting, WAITING, f"the pool has none free for {node}"))
    if r.refill is not None and r.refill.state == RefillState.FAILED and r.refill.attempt == 1:
        again = f"; asked again at {stamp(r.refill.retry_at)}" if r.refill.retry_at else ""
        out.append(note_line(r.refill.at, NO_REFILL, f"ordering a new machine failed{again}"))
    after = back_after(r, job)
    if after is not None and job.start_time is not None and not any(
            back_after(p, job) is not None and (p.created, p.name) < (r.created, r.name) for p in others):
        replaced = f"{node} runs on a healthy machine; " if r.entered(Phase.RESUMING) is not None else ""
        out.append(note_line(job.start_time, RESUMED, f"on {','.join(job.nodes) or '?'}; {replaced}"
                                                      f"{after:.0f} s after the fault"))
    return tuple(out)


def _told_by_peer(r: Remediation, others: Sequence[Remediation], phase: Phase, job: JobSeen) -> bool:
    """Whether an earlier remediation of the same job already tells this event: it entered the phase first
    and the job did not start again in between (then it is the same requeue or hold of the job)."""
    mine = r.entered(phase)
    assert mine is not None
    for p in others:
        theirs = p.entered(phase)
        if theirs is None or (theirs, p.name) >= (mine, r.name):
            continue
        if job.start_time is None or not theirs < job.start_time <= mine:
            return True
    return False


def back_after(r: Remediation, job: JobSeen) -> float | None:
    """Seconds from the fault to the job running again after the remediation requeued it; None until then."""
    requeued = r.entered(Phase.REQUEUED)
    if requeued is None or job.state != RUNNING or job.start_time is None or job.start_time < requeued:
        return None
    return (job.start_time - r.created).total_seconds()


def writable(job: JobSeen) -> bool:
    """slurmctld takes no update of a finished job (ESLURM_JOB_FINISHED: slurm-26-05-3-1
    src/slurmctld/job_mgr.c `_update_job`)."""
    return job.state not in FINISHED


def settled(r: Remediation, job: JobSeen | None, now: datetime) -> bool:
    """Nothing more will be owed to this job: it is gone or finished (once requeued: a job that ends on its
    SIGTERM is requeued after), it ran again, or its remediation ended long ago."""
    if job is None:
        return True
    if not writable(job):
        return r.phase.terminal or r.entered(Phase.REQUEUED) is not None
    if not r.phase.terminal:
        return False
    if back_after(r, job) is not None:
        return True
    ended = r.phase_times[-1][1] if r.phase_times else r.created
    return now - ended > RESUME_WINDOW


def ours(segment: str) -> bool:
    """A segment gpufleet wrote: a dated line, a record, or the trailer."""
    return segment.startswith(f"{PREFIX} 20") or segment.startswith(HEAD) or segment.startswith("whole story: gpufleet why ")


def appended(existing: str, job_id: int, lines: Sequence[str], records: Sequence[str] = ()) -> str | None:
    """The admin comment with the lines it lacks, each remediation's record as it is now, and the trailer
    last; None when nothing changes. What others wrote (a person's text) stays first, as it was; gpufleet's
    earlier lines stay in their order. The same inputs give the same text: a pass repeated after a crash or
    a failed write changes nothing."""
    segments = [x for x in existing.split(SEPARATOR)] if existing else []
    theirs = [x for x in segments if not ours(x)]
    mine = [x for x in segments if ours(x) and not x.startswith(HEAD) and not x.startswith("whole story: ")]
    mine += [line for line in lines if line not in mine]
    new = {record_key(x): x for x in records}
    kept = [x for x in segments if x.startswith(HEAD) and record_key(x) not in new]
    out = SEPARATOR.join(theirs + mine + kept + list(new.values()) + [trailer(job_id)])
    return None if out == existing else out


def record_key(segment: str) -> str:
    """The remediation a record segment is about (its `r=`)."""
    return next((t[2:] for t in segment.split(" ") if t.startswith("r=")), segment)


def noticed(fault: Fault) -> bool:
    """A fault that leaves its node in service while its job runs: restart-app, diagnose, and one NVIDIA resolves
    with DRAIN_AND_RESET (core/job_boundary.py: the node drained, the job left to run to its end)."""
    return fault.needs in NOTICES or job_boundary.asks(fault)


def notice_line(node: str, fault: Fault, job: JobSeen) -> str | None:
    """The line a job running on `node` gets for a fault there that leaves the node in service; None when the
    fault is not such a one, or the job does not run or started after it (it is not that job's)."""
    if not noticed(fault) or job.state != RUNNING:
        return None
    if job.start_time is not None and job.start_time > fault.since:
        return None
    if fault.needs not in NOTICES:
        return note_line(fault.since, AT_BOUNDARY, f"{_gpu(fault.message, fault.pci)} on {node}: "
                                                   f"{_plain(fault.xid, fault.kind)}; NVIDIA: drain, reset after the job")
    event, said = NOTICES[fault.needs]
    if fault.kind is Kind.SLURM_DRAIN:
        return note_line(fault.since, event, f"{slurm_drains.headline(fault.message) or node}; health check asked "
                                             "once the job ends")
    return note_line(fault.since, event, f"{_gpu(fault.message, fault.pci)} on {node}: "
                                         f"{_plain(fault.xid, fault.kind)}; {said}")


# --- telling the job's owner (webhook targets with `job_owners`) ----------------------------------

def event_of(line: str) -> str:
    """The event a line tells: signalled | requeued | held | waiting | no-refill | running-again | restart-app |
    diagnose | drained-at-boundary."""
    what = line.split(": ", 2)[1] if line.count(": ") >= 1 else ""
    names = {SIGNALLED: "signalled", REQUEUED: "requeued", HELD: "held", WAITING: "waiting", NO_REFILL: "no-refill",
             RESUMED: "running-again", APP_RESTART: APP_RESTART, DIAGNOSTICS: DIAGNOSTICS,
             AT_BOUNDARY: "drained-at-boundary"}
    for event, name in names.items():
        if what.startswith(event):
            return name
    return "noted"


def owner_routes(targets: Sequence[WebhookTarget], job: JobSeen) -> tuple[str, ...]:
    """The owner routes that tell this job's user or account."""
    out = []
    for t in targets:
        o = t.job_owners
        if o is None:
            continue
        if "*" in o.users or "*" in o.accounts or (job.user and job.user in o.users) or (
                job.account and job.account in o.accounts):
            out.append(t.name)
    return tuple(out)


def may_tell(sent: Sequence[datetime], now: datetime, per_hour: int) -> bool:
    """Rate limit per job: fewer than `per_hour` messages about it within the last hour."""
    return sum(1 for t in sent if now - t < timedelta(hours=1)) < per_hour
