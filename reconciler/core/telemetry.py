"""What the GPUs' telemetry says about nodes and jobs. Pure: samples, jobs, the spec and the time in, verdicts and
actions out.

- `crossed`: a node past a threshold of fleetspec/faults/telemetry.py is degraded (each row cites NVIDIA's guidance);
- `stragglers`: one node of a running job whose GPUs' SM clock lags the job's other nodes (the pool's
  `straggler_clock_ratio`, for `straggler_after_seconds`) is degraded too: a synchronous job runs at the pace of
  its slowest GPU;
- `hangs`: a running job whose GPUs all show no activity (DCGM_FI_PROF_SM_ACTIVE, else DCGM_FI_DEV_GPU_UTIL, at 0)
  for the pool's `hang_after_seconds` is hung;
- `plan`: what each verdict asks. A degraded node that runs no job, or whose row says its job moves at a
  checkpoint, gets gpufleet's GPU condition (`MarkDegraded`): the heal every fault takes follows (drain in
  Slurm, SIGTERM and the grace period to checkpoint, requeue, a spare, the repair loop). A row that waits for
  the job's boundary drains the node's Slurm nodes instead (DRAIN lets the running job finish and no new job
  lands); once they run no job, the condition is written. A hang is paged, and requeued where every pool of its
  nodes consents. Every verdict names its evidence (the field, the GPU, the value, the threshold).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, reason_for
from gpufleet.fleetspec.faults.telemetry import (
    FIELDS, SLOWDOWN_BITS, THRESHOLDS, Check, Threshold, When, slowdown_reasons,
)

from gpufleet.reconciler.core import job_boundary, job_notes
from gpufleet.reconciler.core.actions import Action, MarkDegraded, NoteJob, Notify, RequeueJobs
from gpufleet.reconciler.core.drains import drained_by_gpufleet
from gpufleet.reconciler.core.model import NodeView, SlurmNodeView

SM_CLOCK, THROTTLE = "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
SM_ACTIVE, GPU_UTIL = "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"
HUNG = "hung"  # a hang's event word in the job's admin comment
_HUNG_LINE = re.compile(rf"^{job_notes.PREFIX} ([0-9T:Z-]{{20}}): {HUNG}(?::|$)")


@dataclass(frozen=True)
class Sample:
    """One metric of one GPU, as dcgm-exporter serves it (Hostname: the Kubernetes node)."""

    node: str
    gpu: str
    field: str
    value: float
    at: datetime
    pci: str = ""


Key = tuple[str, str, str]  # (node, gpu, field)
History = Mapping[Key, tuple[tuple[datetime, float], ...]]


def remember(history: History, samples: Iterable[Sample], now: datetime, keep_seconds: float) -> dict[Key, tuple]:
    """The history with `samples` added and what is older than `keep_seconds` dropped (bounded memory)."""
    out: dict[Key, list] = {k: [p for p in v if (now - p[0]).total_seconds() <= keep_seconds] for k, v in history.items()}
    for s in samples:
        series = out.setdefault((s.node, s.gpu, s.field), [])
        if not series or series[-1][0] < s.at:
            series.append((s.at, s.value))
    return {k: tuple(v) for k, v in out.items() if v}


def forget(history: History, nodes: Iterable[str]) -> dict[Key, tuple]:
    """The history without these nodes' samples: a node under a heal or a repair starts afresh when it returns, so
    a counter's rise before its repair (a reset clears what it counted) never takes it out again."""
    gone = set(nodes)
    return {k: v for k, v in history.items() if k[0] not in gone}


def keep_seconds(spec: FleetSpec) -> float:
    """How much history the rules read: the longest window, hang or straggler time, and a pass more."""
    spans = [t.window_seconds for t in THRESHOLDS] + [p.telemetry.hang_after_seconds for p in spec.pools] + \
        [p.telemetry.straggler_after_seconds for p in spec.pools]
    return max(spans) + 2 * spec.healing.telemetry.every_seconds


@dataclass(frozen=True)
class Evidence:
    field: str
    gpu: str
    value: float
    threshold: str
    pci: str = ""
    detail: str = ""

    def text(self) -> str:
        where = f"GPU {self.gpu}" + (f" ({self.pci})" if self.pci else "")
        return f"{self.field}={self.value:g} on {where}, threshold {self.threshold}" + \
            (f"; {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Degradation:
    node: str
    code: int  # the DCGM field id
    action: FaultAction
    when: When
    meaning: str
    evidence: Evidence
    source: str  # the guidance the threshold follows

    def message(self) -> str:
        return f"{self.meaning}: {self.evidence.text()} (follows {self.source})"


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    nodes: tuple[str, ...]  # the Kubernetes nodes its Slurm nodes run on
    pools: tuple[str, ...]
    started: datetime | None = None
    admin_comment: str | None = None  # None: not read (never written over)


@dataclass(frozen=True)
class Hang:
    job_id: int
    nodes: tuple[str, ...]
    since: datetime  # since when every GPU of the job has been quiet (as far back as the history reaches)
    field: str
    gpus: int
    requeue: bool  # every pool of its nodes consents
    started: datetime | None = None  # the job's (latest) start: one hang per run of the job
    admin_comment: str | None = None  # the job's, as read (None: not read)

    def line(self) -> str:
        """The job's admin-comment line (what `gpufleet why` shows), dated by when its GPUs went quiet in this run
        (never before the run started: the date tells this run's hang from an earlier run's, `paged_before`)."""
        what = "requeued from its checkpoint" if self.requeue else "paged"
        at = max(self.since, self.started) if self.started is not None else self.since
        return job_notes.note_line(at, HUNG, f"{self.field}=0 on all {self.gpus} GPUs of "
                                   f"{', '.join(self.nodes)}; {what}")

    @property
    def key(self) -> str:
        """One page per run of the job: a requeued job that hangs again is a new episode."""
        return f"{self.job_id}:{int(self.started.timestamp()) if self.started else 0}"

    def text(self) -> str:
        return (f"job {self.job_id} hung: {self.field}=0 on all {self.gpus} GPUs of {', '.join(self.nodes)} since "
                f"{self.since.isoformat(timespec='seconds')}" +
                (": requeued from its checkpoint (the pool consents)" if self.requeue
                 else ": paged only (the pool does not consent to a requeue: telemetry.requeue_hung_jobs)"))


# --- thresholds --------------------------------------------------------------------------------

def _window(series: Sequence[tuple[datetime, float]], now: datetime, seconds: float) -> list[tuple[datetime, float]]:
    return [p for p in series if (now - p[0]).total_seconds() <= seconds]


def _covers(series: Sequence[tuple[datetime, float]], now: datetime, seconds: float) -> bool:
    """The series reaches back over the whole span (a rule over a span needs it read from its start)."""
    return bool(series) and (now - series[0][0]).total_seconds() >= seconds


def increase(points: Sequence[tuple[datetime, float]]) -> float:
    """A counter's rise over the points; a drop is a reset (the exporter or the driver restarted), counted from 0."""
    total = 0.0
    for (_, a), (_, b) in zip(points, points[1:]):
        total += b - a if b >= a else b
    return total


def _crosses(t: Threshold, series: Sequence[tuple[datetime, float]], now: datetime) -> float | None:
    """The value that crosses `t`, or None."""
    if t.test is Check.AT_LEAST:
        return series[-1][1] if series[-1][1] >= t.limit else None
    if t.test is Check.INCREASE:
        rise = increase(_window(series, now, t.window_seconds))
        return rise if rise >= t.limit else None
    if not _covers(series, now, t.window_seconds):
        return None
    held = _window(series, now, t.window_seconds)
    ok = held and all(int(v) & SLOWDOWN_BITS for _, v in held)
    return held[-1][1] if ok else None


def crossed(history: History, now: datetime, pci: Mapping[tuple[str, str], str] | None = None) -> list[Degradation]:
    """Every node past a threshold, its worst crossing first (the mildest row never hides a graver one)."""
    pci = pci or {}
    found: dict[str, Degradation] = {}
    for t in THRESHOLDS:
        for (node, gpu, name), series in sorted(history.items()):
            if name != t.field or not series:
                continue
            value = _crosses(t, series, now)
            if value is None:
                continue
            detail = slowdown_reasons(value) if t.test is Check.BITS_HELD else ""
            d = Degradation(node, t.code, t.action, t.when, t.meaning,
                            Evidence(t.field, gpu, value, t.describe(), pci.get((node, gpu), ""), detail), t.source)
            if node not in found or _graver(d, found[node]):
                found[node] = d
    return [found[n] for n in sorted(found)]


def _graver(a: Degradation, b: Degradation) -> bool:
    return (a.action.rank, a.when is When.CHECKPOINT) > (b.action.rank, b.when is When.CHECKPOINT)


# --- jobs: hangs and stragglers ------------------------------------------------------------------

def _gpus(history: History, node: str, name: str) -> dict[str, tuple]:
    return {g: s for (n, g, f), s in history.items() if n == node and f == name}


def hangs(jobs: Sequence[RunningJob], history: History, spec: FleetSpec, now: datetime) -> list[Hang]:
    pools = {p.name: p.telemetry for p in spec.pools}
    out = []
    for j in jobs:
        known = [pools[p] for p in j.pools if p in pools]
        if not known or not j.nodes:
            continue
        after = min(t.hang_after_seconds for t in known)
        if j.started is not None and (now - j.started).total_seconds() < after:
            continue  # not running that long (a requeued job starts its count again)
        quiet, since, name = _quiet(j.nodes, history, now, after)
        if quiet:
            out.append(Hang(j.job_id, j.nodes, since, name, quiet, all(t.requeue_hung_jobs for t in known), j.started,
                            j.admin_comment))
    return out


def _quiet(nodes: Sequence[str], history: History, now: datetime, after: float) -> tuple[int, datetime, str]:
    """(GPUs all at 0 for at least `after` seconds, since when, the field read); (0, now, "") when any GPU was
    active within that span, or when a GPU's quiet was not read over all of it (from a sample at 0 that old)."""
    total, starts, used = 0, [], ""
    for node in nodes:
        series = _gpus(history, node, SM_ACTIVE)
        name = SM_ACTIVE
        if not series:
            series, name = _gpus(history, node, GPU_UTIL), GPU_UTIL
        if not series:
            return 0, now, ""
        for s in series.values():
            run = len(s)
            while run > 0 and s[run - 1][1] <= 0:
                run -= 1
            if run == len(s) or (now - s[run][0]).total_seconds() < after:
                return 0, now, ""
            starts.append(s[run][0])
        total += len(series)
        used = name if used in ("", SM_ACTIVE) else used  # GPU_UTIL once any node is read by it
    return total, max(starts, default=now), used  # all quiet since the last of them went quiet


def stragglers(jobs: Sequence[RunningJob], history: History, spec: FleetSpec, now: datetime,
               pci: Mapping[tuple[str, str], str] | None = None) -> list[Degradation]:
    """A node of a multi-node job whose slowest GPU's best SM clock over the span is below the pool's ratio of the
    job's median node; its throttle reasons, when set, go with the evidence."""
    pools = {p.name: p.telemetry for p in spec.pools}
    out: dict[str, Degradation] = {}
    for j in jobs:
        known = [pools[p] for p in j.pools if p in pools]
        if len(j.nodes) < 2 or not known:
            continue
        ratio = min(t.straggler_clock_ratio for t in known)
        after = max(t.straggler_after_seconds for t in known)
        pace: dict[str, tuple[float, str]] = {}
        for node in j.nodes:
            clocks = _gpus(history, node, SM_CLOCK)
            if not clocks or not all(_covers(s, now, after) for s in clocks.values()):
                break  # a node not read over the whole span: no verdict for the job yet
            best = {g: max(v for _, v in _window(s, now, after)) for g, s in clocks.items()}
            slowest = min(best, key=lambda g: (best[g], g))
            pace[node] = (best[slowest], slowest)
        else:
            median = statistics.median(v for v, _ in pace.values())
            for node, (mhz, gpu) in sorted(pace.items()):
                if median > 0 and mhz < ratio * median and node not in out:
                    throttle = _gpus(history, node, THROTTLE).get(gpu)
                    why = slowdown_reasons(throttle[-1][1]) if throttle else ""
                    action = FaultAction.CONTACT_SUPPORT if why else FaultAction.RESET_GPU
                    out[node] = Degradation(
                        node, FIELDS[SM_CLOCK].id, action, When.CHECKPOINT,
                        f"a straggler in job {j.job_id}: its GPUs hold the job's other nodes to their pace",
                        Evidence(SM_CLOCK, gpu, mhz, f"< {ratio:g} x the job's median node ({median:g} MHz) for "
                                 f"{after}s", (pci or {}).get((node, gpu), ""), detail=f"clock event reasons {why}" if why else ""),
                        "the pool's telemetry.straggler_clock_ratio; a synchronous job runs at its slowest GPU's pace")
    return [out[n] for n in sorted(out)]


# --- what each verdict asks ------------------------------------------------------------------------

def boundary_reason(d: Degradation) -> str:
    """A job-boundary drain's Slurm reason: gpufleet's (so its heal owns it), naming the field that asked
    (core/job_boundary.py, which kernel-reported faults that wait for their job's end use too)."""
    return job_boundary.reason(f"{FIELDS_BY_ID.get(d.code, str(d.code))} degraded", Kind.DCGM, d.code, d.node)


FIELDS_BY_ID = {f.id: f.name for f in FIELDS.values()}


def mark(d: Degradation) -> MarkDegraded:
    """gpufleet's GPU condition for a degradation: the header carries the action and the GPU, the text the evidence."""
    signal = FaultSignal(Kind.DCGM, d.code, d.action, d.evidence.pci[:16] if len(d.evidence.pci) <= 16 else "")
    return MarkDegraded(d.node, reason_for(Kind.DCGM, d.code), format_message(signal, d.message()))


@dataclass(frozen=True)
class NodeJobs:
    """A node as `plan` needs it: its view, its Slurm nodes and the jobs running on them."""

    view: NodeView
    slurm: tuple[SlurmNodeView, ...] = ()
    jobs: tuple[int, ...] = ()


def plan(degraded: Sequence[Degradation], nodes: Mapping[str, NodeJobs], spec: FleetSpec,
         now: datetime | None = None) -> tuple[Action, ...]:
    """The actions for the degraded nodes, and for nodes a job-boundary drain waits on whose job has ended. A
    job-boundary drain whose job still runs `healing.job_boundary_max_seconds` after it was set (Slurm's time of the
    reason; `now` None: never) moves the job at a checkpoint, as any fault's (core/job_boundary.py)."""
    pools = {p.name for p in spec.pools}
    actions: list[Action] = []
    by_node = {d.node: d for d in degraded}
    for name in sorted(set(by_node) | {n for n, nj in nodes.items() if _waiting(nj)}):
        nj = nodes.get(name)
        if nj is None or not _eligible(nj.view, pools):
            continue
        d = by_node.get(name)
        waited = job_boundary.overdue(nj.slurm, spec, now) if now is not None and nj.jobs else None
        if d is None:  # its drain waits for the job's end, and the threshold no longer holds: it asked, it is done
            asked = next(((s.reason, code) for s in nj.slurm if (code := _field_asked(s))), ("", 0))
            code = asked[1]
            if nj.jobs and waited is None:
                continue
            d = Degradation(name, code, _row_action(code), When.JOB_BOUNDARY, "drained at its job's end",
                            Evidence(FIELDS_BY_ID.get(code, str(code)), "?", 0, "crossed earlier",
                                     detail=asked[0]), "")
        if waited is not None:
            d = replace(d, meaning=f"{d.meaning}; drained at its job's boundary {waited:.0f}s ago and job(s) "
                        f"{', '.join(map(str, nj.jobs))} still ran (healing.job_boundary_max_seconds, "
                        f"{spec.healing.job_boundary_max_seconds}s): moved at a checkpoint")
        if d.when is When.CHECKPOINT or not nj.jobs or waited is not None or spec.healing.job_boundary_max_seconds == 0:
            actions.append(mark(d))
        else:
            actions += job_boundary.drains(nj.slurm, boundary_reason(d))
    return tuple(actions)


def _row_action(code: int) -> FaultAction:
    return next((t.action for t in THRESHOLDS if t.code == code), FaultAction.RESET_GPU)


def _field_asked(s: SlurmNodeView) -> int:
    """The DCGM field a job-boundary drain of `s` names (core/job_boundary.py's tag `dcgm<id>`); 0: none."""
    asked = job_boundary.asked_by(s.reason)
    return asked[1] if asked and asked[0] == "dcgm" else 0


def _waiting(nj: NodeJobs) -> bool:
    return any(_field_asked(s) and drained_by_gpufleet(s) for s in nj.slurm)


def _eligible(v: NodeView, pools: set[str]) -> bool:
    """A node of a managed pool, in service or a spare, with no fault read and no heal of its own under way."""
    return (v.pool in pools and v.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE) and v.fault is None
            and v.remediation is None)


def paged_before(h: Hang) -> bool:
    """Whether the job's admin comment already has this run's hang line: it is written before the page, so a hang
    whose line is there was paged (by this leader, or by one before a restart or a failover): one hang, one page.
    A line dated before the run's start is an earlier run's (a requeued job that hangs again is paged again)."""
    start = int(h.started.timestamp()) if h.started is not None else None
    for segment in (h.admin_comment or "").split(job_notes.SEPARATOR):
        m = _HUNG_LINE.match(segment)
        if m is None:
            continue
        try:
            at = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        if start is None or int(at.timestamp()) >= start:
            return True
    return False


def page_hang(h: Hang) -> tuple[Action, ...]:
    """A hang's line in the job's admin comment (what was there kept), then its page, then its requeue where the
    pool consents. The line goes first: it is what remembers the page across a restart (`paged_before`), so a crash
    between the two loses the page rather than sending it twice. A hang paged before asks only its requeue again
    (a crash may have cut it off; a requeued job runs anew, and is no longer this run's hang)."""
    requeue: tuple[Action, ...] = (RequeueJobs((h.job_id,)),) if h.requeue else ()
    if paged_before(h):
        return requeue
    page: tuple[Action, ...] = (Notify("job-hung", "critical", h.text(), key=h.key),)
    text = job_notes.appended(h.admin_comment, h.job_id, (h.line(),)) if h.admin_comment is not None else None
    note = (NoteJob(h.job_id, text),) if text is not None else ()
    return note + page + requeue

