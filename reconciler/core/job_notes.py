"""What gpufleet writes into a Slurm job's admin comment when it signals, requeues or holds the job, and
when the job runs again: one short dated line per event, appended to what is there, so `scontrol show job`
(and `sacct --format=JobID,AdminComment` where accounting runs) says why the job was touched.

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

from gpufleet.fleetspec.faults import FaultAction, describe
from gpufleet.fleetspec.models import WebhookTarget

from gpufleet.reconciler.core.model import Fault, Remediation
from gpufleet.reconciler.core.phases import Phase

RUNNING = "RUNNING"

PREFIX = "gpufleet"
SEPARATOR = " | "  # between lines: one admin comment reads on one line in scontrol and sacct
RESUME_WINDOW = timedelta(hours=24)  # after a remediation ends, how long its jobs are watched for their restart
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                      "DEADLINE", "OUT_OF_MEMORY"})
SIGNALLED, REQUEUED, HELD, RESUMED = "signalled", "requeued", "held", "running again"
# A fault that leaves its node in service still concerns the job on that GPU: NVIDIA's RESTART_APP (94 among
# them, a contained ECC error: the hardware caught it, only the application must restart) and the diagnostics
# a repeated 13/31 asks for (RUN_DCGMEUD). The job gets a line, and its owner is told.
APP_RESTART, DIAGNOSTICS = "restart-app", "diagnose"
NOTICES = {FaultAction.RESTART_APP: (APP_RESTART, "the application on that GPU must restart (NVIDIA: RESTART_APP); "
                                                  "the node stays in service"),
           FaultAction.DIAGNOSE: (DIAGNOSTICS, "the same error repeated on that GPU: diagnostics are asked (NVIDIA: "
                                               "RUN_DCGMEUD); the node stays in service and this job runs on: no "
                                               "new job lands there, and it is health-checked once idle, back if "
                                               "it passes")}


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


def note_line(at: datetime, what: str, fault: str, node: str, remediation: str, grace_seconds: int | None = None) -> str:
    """The one line for one event. `fault` is a short summary of the fault (today `fault_summary`; a richer
    fault record, e.g. an XID with its PCI address, gives its own)."""
    text = f"{PREFIX} {stamp(at)}: {what}: {fault} on {node}; remediation {remediation}"
    if grace_seconds:
        text += f"; checkpoint grace {grace_seconds} s"
    return text


def fault_summary(r: Remediation) -> str:
    """What the remediation knows of its fault: its name and the GPU it names (the condition's message is
    left to `why`)."""
    return describe(r.xid, r.kind) + (f" GPU {r.pci}" if r.pci else "")


def grace_of(r: Remediation) -> int | None:
    start = r.entered(Phase.CHECKPOINTING)
    if start is None or r.grace_deadline is None:
        return None
    return max(0, round((r.grace_deadline - start).total_seconds()))


def lines_for(r: Remediation, job: JobSeen, peers: Sequence[Remediation] = ()) -> tuple[str, ...]:
    """Every line the remediation owes this job, oldest first (whether written or not). `peers`: the other
    remediations that touched the job (two nodes of one job faulting together): one requeue, one hold and one
    restart of the job are told once, by the earliest remediation that saw them, not once per remediation."""
    if job.job_id not in r.jobs:
        return ()
    fault, out = fault_summary(r), []
    others = [p for p in peers if p.name != r.name and job.job_id in p.jobs]
    checkpointing = r.entered(Phase.CHECKPOINTING)
    if checkpointing is not None and "signal:TERM" in r.intents:
        out.append(note_line(checkpointing, f"{SIGNALLED} SIGTERM to checkpoint", fault, r.node, r.name, grace_of(r)))
    requeued = r.entered(Phase.REQUEUED)
    if requeued is not None and not _told_by_peer(r, others, Phase.REQUEUED, job):
        out.append(note_line(requeued, REQUEUED, fault, r.node, r.name))
    held = r.entered(Phase.HELD)
    if held is not None and not _told_by_peer(r, others, Phase.HELD, job):
        out.append(note_line(held, f"{HELD} (its replacement waits for admission)", fault, r.node, r.name))
    after = back_after(r, job)
    if after is not None and job.start_time is not None and not any(
            back_after(p, job) is not None and (p.created, p.name) < (r.created, r.name) for p in others):
        line = note_line(job.start_time, f"{RESUMED} on {','.join(job.nodes) or '?'}", fault, r.node, r.name)
        out.append(f"{line}; {after:.0f} s after the fault")
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


def appended(existing: str, lines: tuple[str, ...]) -> str | None:
    """The admin comment with the lines it lacks appended; None when it has them all. What was there (a
    person's text, earlier lines) is kept as it is."""
    missing = [line for line in lines if line not in existing]
    if not missing:
        return None
    return SEPARATOR.join(([existing] if existing else []) + missing)


def notice_line(node: str, fault: Fault, job: JobSeen) -> str | None:
    """The line a job running on `node` gets for a fault there that leaves the node in service; None when the
    fault is not such a one, or the job does not run or started after it (it is not that job's)."""
    if fault.needs not in NOTICES or job.state != RUNNING:
        return None
    if job.start_time is not None and job.start_time > fault.since:
        return None
    event, said = NOTICES[fault.needs]
    gpu = f" GPU {fault.pci}" if fault.pci else ""
    return f"{PREFIX} {stamp(fault.since)}: {event}: {describe(fault.xid, fault.kind)}{gpu} on {node}; {said}"


# --- telling the job's owner (webhook targets with `job_owners`) ----------------------------------

def event_of(line: str) -> str:
    """The event a line tells: signalled | requeued | held | running-again | restart-app | diagnose."""
    what = line.split(": ", 2)[1] if line.count(": ") >= 2 else ""
    for event in (SIGNALLED, REQUEUED, HELD, RESUMED, APP_RESTART, DIAGNOSTICS):
        if what.startswith(event):
            return event.replace(" ", "-")
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
