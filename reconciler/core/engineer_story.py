"""A job's story in the words of the ML engineer who owns it (`gpufleet why JOBID` on the login node): one
short paragraph first (what happened to which GPU on which of the job's nodes, what gpufleet did, whether
the job checkpointed within its grace or was stopped at its end, how long it was not running, what to do),
then the details. Read from Slurm alone: the job's fields and the records gpufleet keeps in its admin
comment (`job_record.py`), so it needs only the engineer's own Slurm identity.

Machines are named once, by the Slurm node the engineer knows: "the machine behind h100-a-w17 was
replaced; h100-a-w17 now runs on a healthy one". Never a false "all is well": a job that waits is told what
it waits for (a spare, a new machine whose order failed or is pending, a repair in place, a person) and
since when. Every Slurm-supplied string is printed escaped (`shown`). Pure: stdlib and the spec only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.catalogue import CONTAINED_HARDWARE, XIDS

from gpufleet.reconciler.core import job_record as jr
from gpufleet.reconciler.core.job_story import ENDED, JobFacts, shown
from gpufleet.reconciler.core.slurm_reasons import BY_CODE

NOTHING_TO_DO = "nothing: the job resumes from its last checkpoint, as it does after any requeue"


def clock(at: datetime | None) -> str:
    return at.astimezone(timezone.utc).strftime("%H:%M:%S UTC") if at else "?"


def dated(at: datetime | None) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "?"


def span(seconds: float) -> str:
    """`42 s`, `5 min 29 s`, `2 h 03 min`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def plain_fault(kind: str, code: int) -> str:
    """NVIDIA's own words for the fault (the Xid catalogue's description), then its code."""
    k = Kind(kind) if kind in {x.value for x in Kind} else Kind.XID
    if k is Kind.SXID:
        return f"an NVSwitch error (NVIDIA SXid {code})"
    if k is Kind.GPU_LOST:
        return "the GPU was lost (NVIDIA: the GPU has fallen off the bus, at start-up)"
    if k is Kind.NODE_LOST:
        return "the machine stopped answering (its node stopped reporting to Kubernetes)"
    if k is Kind.SLURM_DRAIN:
        return f"Slurm drained the node itself: {slurm_words(code)}"
    e = XIDS.get(code)
    if code == 0:
        return "a GPU fault"
    if e is None or e.description == "Unused":
        return f"a GPU error (NVIDIA Xid {code})"
    return f"{e.description} (NVIDIA Xid {code})"


def slurm_words(code: int) -> str:
    """Slurm's own reason a `slurm-drain` record names (core/slurm_reasons.py): `Kill task failed (what it means)`."""
    row = BY_CODE.get(code)
    return f"{row.prefix} ({row.means})" if row else f"a reason of its own ({code})"


def gpu_words(rec: jr.JobRecord) -> str:
    """`GPU 3 (NVIDIA H100 80GB HBM3)`, `the GPU at PCI 0000:3b:00 (H100)`, `a GPU`."""
    model = f" ({shown(rec.model, 60)})" if rec.model else ""
    if rec.gpu is not None:
        return f"GPU {rec.gpu}{model}"
    if rec.pci:
        return f"the GPU at PCI {shown(rec.pci, 20)}{model}"
    return f"a GPU{model}"


@dataclass(frozen=True)
class Checkpoint:
    """How the job met its SIGTERM: exited within `exited_within_s` of it (inside its grace: `in_time`), or
    was still running when the grace ran out and was stopped (`in_time` False)."""

    signalled_at: datetime
    grace_s: int
    exited_within_s: float | None
    in_time: bool


@dataclass(frozen=True)
class EngineerStory:
    job_id: int
    paragraph: str
    what_to_do: str
    state: str  # gpufleet's word for where the job stands: running-again | waiting | nothing | ...
    waiting_for: str = ""  # job_record state while it waits
    not_running_s: float | None = None
    checkpoint: Checkpoint | None = None
    details: tuple[tuple[datetime | None, str], ...] = ()
    records: tuple[jr.JobRecord, ...] = field(default_factory=tuple)
    job: JobFacts | None = None

    def to_json(self) -> dict:
        cp = self.checkpoint
        j = self.job
        return {
            "job_id": self.job_id, "paragraph": self.paragraph, "what_to_do": self.what_to_do,
            "state": self.state, "waiting_for": self.waiting_for, "not_running_seconds": self.not_running_s,
            "checkpoint": None if cp is None else {
                "signalled_at": jr.iso(cp.signalled_at), "grace_seconds": cp.grace_s,
                "exited_within_seconds": cp.exited_within_s, "in_time": cp.in_time},
            "details": [{"at": jr.iso(at) if at else None, "text": text} for at, text in self.details],
            "records": [r.to_json() for r in self.records],
            "job": None if j is None else {
                "name": shown(j.name), "state": shown(j.state), "user": shown(j.user), "account": shown(j.account),
                "nodes": [shown(n) for n in j.nodes], "reason": shown(j.reason), "exit_code": shown(j.exit_code),
                "restarts": j.restarts, "submitted": jr.iso(j.submitted) if j.submitted else None,
                "started": jr.iso(j.started) if j.started else None,
                "ended": jr.iso(j.ended) if j.ended else None},
        }


def checkpoint_of(rec: jr.JobRecord) -> Checkpoint | None:
    """From the record: the SIGTERM's time and grace, and when gpufleet requeued the job (it requeues as soon
    as the job has left its node, or at the end of the grace: reconciler/core/decide.py, Checkpointing)."""
    if rec.signalled_at is None or rec.grace_s is None or rec.requeued_at is None:
        return None
    took = (rec.requeued_at - rec.signalled_at).total_seconds()
    in_time = took < rec.grace_s
    return Checkpoint(rec.signalled_at, rec.grace_s, took if in_time else None, in_time)


def _waiting_words(rec: jr.JobRecord, node: str) -> str:
    since = f" since {clock(rec.since)}" if rec.since else ""
    if rec.state == jr.CHECKPOINTING:
        by = f", at the latest when its grace ends at {clock(rec.next_at)}" if rec.next_at else ""
        asked = f"was asked to checkpoint (SIGTERM at {clock(rec.signalled_at)})" if rec.signalled_at else \
            "is about to be asked to checkpoint (SIGTERM)"
        return f"The job {asked}; gpufleet requeues it once it exits{by}, and it runs again on healthy machines."
    if rec.state == jr.SPARE:
        return (f"It waits in Slurm's queue for a healthy machine: the pool has no spare free{since}; it starts "
                "as soon as one is.")
    if rec.state == jr.REFILL_FAILED:
        again = f"; it is asked again at {clock(rec.next_at)}" if rec.next_at else ""
        return (f"It waits for hardware: the pool has no spare, and the order for a new machine failed at "
                f"{clock(rec.since)}{again}. It starts once a machine joins.")
    if rec.state == jr.REFILL_PENDING:
        return (f"It waits for hardware: the pool has no spare, and a new machine was ordered at "
                f"{clock(rec.since)}; it has not joined yet. The job starts once it has.")
    if rec.state == jr.REPAIR:
        return (f"It waits while the machine behind {node} is repaired in place{since}; it starts when that "
                "machine passes its checks, or a spare frees up first.")
    if rec.state == jr.HELD:
        return (f"Replacing the machine behind {node} is on hold{since} (a safety brake: too many machines "
                "being replaced at once); it waits in Slurm's queue until the brake clears or the on-call "
                "releases it.")
    if rec.state == jr.PERSON:
        return (f"gpufleet could not replace the machine behind {node} by itself{since}; the on-call was paged "
                "and decides. The job waits in Slurm's queue.")
    return f"The machine behind {node} is being replaced{since}; the job waits in Slurm's queue."


def _app_fault(rec: jr.JobRecord) -> bool:
    """A fault that left the job running: the application's, a diagnosis, or a drain at the job's boundary."""
    return rec.action in (FaultAction.RESTART_APP.value, FaultAction.DIAGNOSE.value) or rec.state == jr.AT_BOUNDARY


def tell(job_id: int, job: JobFacts | None, records: list[jr.JobRecord], now: datetime) -> EngineerStory:
    """The engineer's story of one job. `job` None: Slurm does not show it to this user (or forgot it): then
    nothing of gpufleet's is told either (its records live in the job)."""
    if job is None:
        return EngineerStory(job_id, f"Slurm shows you no job {job_id}: it is not yours to see (PrivateData), or "
                                     "it ended long ago (slurmctld forgets ended jobs after MinJobAge).",
                             "check the job id (squeue --me, sacct)", "unknown")
    name = f" ({shown(job.name, 60)})" if job.name else ""
    heals = [r for r in records if not _app_fault(r)]
    apps = [r for r in records if _app_fault(r)]
    details: list[tuple[datetime | None, str]] = []
    if job.submitted:
        details.append((job.submitted, "back in Slurm's queue (submit time, set anew by a requeue)"
                        if job.restarts else "submitted"))
    if not records:
        state = f"Slurm: {shown(job.state)}" + (f", {shown(job.exit_code)}" if job.exit_code else "")
        para = (f"Job {job_id}{name}: gpufleet saw no GPU fault touch it ({state}). If it failed, the cause is "
                "most likely in its own output.")
        if job.started:
            details.append((job.started, f"started on {', '.join(shown(n) for n in job.nodes) or '?'}"))
        return EngineerStory(job_id, para, "look at the job's own stderr (scontrol show job: StdErr)", "nothing",
                             details=tuple(sorted(details, key=_order)), job=job)
    sentences: list[str] = []
    checkpoint, not_running, state, waiting, todo = None, None, "nothing", "", NOTHING_TO_DO
    for rec in apps:
        node = shown(rec.slurm_node, 80)
        if rec.state == jr.AT_BOUNDARY:
            sentences.append(f"At {clock(rec.fault_at)}, {gpu_words(rec)} on {node} reported "
                             f"{plain_fault(rec.kind, rec.code)}; NVIDIA's resolution is to drain and reset at the "
                             f"job's boundary, so gpufleet drained {node} in Slurm and left the job running to its "
                             "end: no new job lands there, and the GPU is reset after.")
        elif rec.kind == Kind.SLURM_DRAIN.value and rec.action == FaultAction.DIAGNOSE.value:
            sentences.append(f"At {clock(rec.fault_at)}, Slurm drained {node} itself: {slurm_words(rec.code)}; "
                             "gpufleet asked for a health check and left the job running: no new job lands there.")
        elif rec.action == FaultAction.DIAGNOSE.value:
            sentences.append(f"At {clock(rec.fault_at)}, {gpu_words(rec)} on {node} repeated {plain_fault(rec.kind, rec.code)}; "
                             "gpufleet asked for diagnostics and left the job running: no new job lands there.")
        elif rec.code in CONTAINED_HARDWARE:
            sentences.append(f"At {clock(rec.fault_at)}, {gpu_words(rec)} on {node} had {plain_fault(rec.kind, rec.code)}: "
                             "a memory error the GPU contained; only the application on it had to restart.")
        else:
            sentences.append(f"At {clock(rec.fault_at)}, {gpu_words(rec)} on {node} reported {plain_fault(rec.kind, rec.code)}, "
                             "most often the application's own error; gpufleet left the node in service.")
            todo = f"look at the job's stderr around {clock(rec.fault_at)} for {gpu_words(rec)} on {node}"
        details.append((rec.fault_at, f"{plain_fault(rec.kind, rec.code)} on {gpu_words(rec)}, {node}"))
    for i, rec in enumerate(heals):
        node = shown(rec.slurm_node, 80)
        of = f", one of its {len(job.nodes)} nodes," if len(job.nodes) > 1 else ""
        if rec.kind == Kind.SLURM_DRAIN.value:  # Slurm's own drain, not a GPU's report (core/slurm_drains.py)
            sentences.append(f"At {clock(rec.fault_at)}, Slurm drained {node}{of} itself: {slurm_words(rec.code)}.")
            details.append((rec.fault_at, f"fault: Slurm drained {node} itself: {slurm_words(rec.code)} "
                                          f"(record {shown(rec.remediation, 40)})"))
        elif rec.kind == Kind.NODE_LOST.value:  # the whole machine, not a GPU (core/node_lost.py)
            sentences.append(f"At {clock(rec.fault_at)}, the machine behind {node}{of} stopped answering (its node "
                             "stopped reporting to Kubernetes); the job could not checkpoint there.")
            details.append((rec.fault_at, f"fault: {plain_fault(rec.kind, rec.code)}, {node} "
                                          f"(record {shown(rec.remediation, 40)})"))
        else:
            sentences.append(f"At {clock(rec.fault_at)}, {gpu_words(rec)} on {node}{of} failed: "
                             f"{plain_fault(rec.kind, rec.code)}.")
            details.append((rec.fault_at, f"fault: {plain_fault(rec.kind, rec.code)} on {gpu_words(rec)}, {node} "
                                          f"(record {shown(rec.remediation, 40)})"))
        cp = checkpoint_of(rec)
        if cp is not None:
            checkpoint = checkpoint or cp
            if cp.in_time:
                sentences.append(f"gpufleet asked the job to checkpoint (SIGTERM at {clock(cp.signalled_at)}); it "
                                 f"exited within {span(cp.exited_within_s or 0)}, inside its {cp.grace_s} s grace, "
                                 "and was requeued.")
            else:
                sentences.append(f"gpufleet asked the job to checkpoint (SIGTERM at {clock(cp.signalled_at)}); it "
                                 f"was still running when its {cp.grace_s} s grace ran out and was stopped and "
                                 "requeued: the work since its last checkpoint is lost.")
                todo = ("nothing to restart (it was requeued), but the steps since its last checkpoint were lost: "
                        f"make it checkpoint within {cp.grace_s} s of SIGTERM (or checkpoint more often)")
            details.append((cp.signalled_at, f"SIGTERM to checkpoint, {cp.grace_s} s grace"))
        elif rec.requeued_at is not None:
            sentences.append("gpufleet requeued the job (it was not running on that node then).")
        if rec.requeued_at is not None:
            details.append((rec.requeued_at, "requeued"))
        if rec.state == jr.DONE and rec.replaced_at is not None:
            sentences.append(f"The machine behind {node} was replaced; {node} now runs on a healthy one.")
            details.append((rec.replaced_at, f"{node} runs on a healthy machine"))
        elif i == len(heals) - 1 and not _running_again(job, rec):
            sentences.append(_waiting_words(rec, node))
            state, waiting = "waiting", rec.state
            if rec.since:
                details.append((rec.since, f"waiting: {rec.state}"))
            if rec.state == jr.CHECKPOINTING:
                state = "checkpointing"
            if rec.state in (jr.HELD, jr.PERSON):
                todo = "nothing you can do: the on-call decides; ask them if it is urgent"
            elif todo == NOTHING_TO_DO and rec.state != jr.CHECKPOINTING:
                todo = "nothing: the job starts by itself once it has healthy machines"
    if heals:
        last = heals[-1]
        stopped = (checkpoint.signalled_at if checkpoint else None) or last.requeued_at or last.fault_at
        if _running_again(job, last):
            not_running = (job.started - stopped).total_seconds()
            state = "running-again"
            where = ", ".join(shown(n) for n in job.nodes) or "?"
            sentences.append(f"It runs again since {clock(job.started)} on {where}; it was not running for "
                             f"{span(not_running)}.")
            details.append((job.started, f"running again on {where}"))
        elif _ran_again(job, last):
            not_running = (job.started - stopped).total_seconds()
            state = "ended"
            where = ", ".join(shown(n) for n in job.nodes) or "?"
            exit_code = f", {shown(job.exit_code)}" if job.exit_code else ""
            sentences.append(f"It ran again from {clock(job.started)} on {where} (it was not running for "
                             f"{span(not_running)}) and ended {shown(job.state)}{exit_code}.")
            details.append((job.started, f"running again on {where}"))
            if job.state != "COMPLETED":
                todo = f"look at the job's own output for why it ended {shown(job.state)}"
        elif job.state in ENDED:
            state = "ended"
            ended = job.ended or now
            not_running = (ended - stopped).total_seconds()
            sentences.append(f"It did not run again: Slurm ended it ({shown(job.state)}"
                             + (f", {shown(job.exit_code)}" if job.exit_code else "") + ").")
            todo = "resubmit it if you still need it"
        elif last.requeued_at is not None:
            not_running = (now - stopped).total_seconds()
            sentences.append(f"It has not been running for {span(not_running)} so far.")
    elif job.started:
        details.append((job.started, f"started on {', '.join(shown(n) for n in job.nodes) or '?'}"))
        state = "app-fault"
    if job.ended and job.state in ENDED:
        details.append((job.ended, f"ended {shown(job.state)}" + (f" ({shown(job.exit_code)})" if job.exit_code else "")))
    para = f"Job {job_id}{name}: " + " ".join(sentences) + f" What to do: {todo}."
    return EngineerStory(job_id, para, todo, state, waiting, not_running, checkpoint,
                         tuple(sorted(details, key=_order)), tuple(records), job)


def _order(d: tuple[datetime | None, str]) -> tuple[bool, datetime]:
    return (d[0] is None, d[0] or datetime.max.replace(tzinfo=timezone.utc))


def _running_again(job: JobFacts, rec: jr.JobRecord) -> bool:
    return (job.state == "RUNNING" and job.started is not None and rec.requeued_at is not None
            and job.started >= rec.requeued_at)


def _ran_again(job: JobFacts, rec: jr.JobRecord) -> bool:
    """It started again after the requeue and has ended since."""
    return (job.state in ENDED and job.started is not None and rec.requeued_at is not None
            and job.started >= rec.requeued_at)


def render(s: EngineerStory, admin_lines: list[str] | tuple[str, ...] = ()) -> str:
    """The paragraph, then the details (times, records), then gpufleet's lines as Slurm keeps them."""
    lines = [s.paragraph, "", "Details:"]
    j = s.job
    if j is not None:
        lines.append(f"  job {s.job_id}: {shown(j.state)}, user {shown(j.user) or '?'}"
                     + (f", account {shown(j.account)}" if j.account else "")
                     + (f", nodes {', '.join(shown(n) for n in j.nodes)}" if j.nodes else "")
                     + (f", waiting: {shown(j.reason)}" if j.reason and j.state == "PENDING" else ""))
    for at, text in s.details:
        lines.append(f"  {dated(at):23}  {text}")
    if s.not_running_s is not None:
        lines.append(f"  not running: {span(s.not_running_s)}")
    for line in admin_lines:
        lines.append(f"  slurm admin comment: {shown(line)}")
    return "\n".join(lines)
