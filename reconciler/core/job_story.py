"""A Slurm job's story as gpufleet knows it (`gpufleet why JOBID`): when it ran and where, the faults on its
nodes while it ran, each remediation that touched it with its phases, its requeues, the time from the fault
to running again, and a one-line verdict. Pure: the command gathers the records and this assembles them.

Where a fact comes from: the job's fields from slurmctld (slurmrestd GET job; slurmctld forgets an ended
job after MinJobAge, and without accounting nothing older is known), the remediations from their objects,
the faults from the node conditions and Events (an application XID, e.g. 13, points at the job itself), the
reclaims from the lending ledger's loans (kept a week) and the lending pass's Events (kept an hour or so).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime

from gpufleet.fleetspec.faults import FaultAction, Kind, default_action, describe
from gpufleet.fleetspec.faults.catalogue import CONTAINED_HARDWARE, When
from gpufleet.fleetspec.faults.condition import parse_header
from gpufleet.fleetspec.ledger import PoolLedger

from gpufleet.reconciler.core.job_notes import stamp
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase

HEALED, HEALING, HELD, FAILED, OWN_ERROR, NOTHING = "healed", "healing", "held", "heal-failed", "own-error", "nothing"
APP_RESTART = "gpu-error-contained"  # a hardware error the GPU contained: only the application had to restart
AT_BOUNDARY = "drained-at-boundary"  # NVIDIA's DRAIN_AND_RESET: the job ran to its end, its node reset after
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "OUT_OF_MEMORY",
         "DEADLINE")


@dataclass(frozen=True)
class JobFacts:
    """The job as slurmctld remembers it, or, once slurmctld forgot it (MinJobAge), as accounting recorded it
    (`source` "accounting": its latest run)."""

    job_id: int
    name: str = ""
    state: str = ""
    user: str = ""
    account: str = ""
    nodes: tuple[str, ...] = ()  # Slurm nodes of its latest run
    submitted: datetime | None = None
    started: datetime | None = None  # its latest start
    ended: datetime | None = None
    restarts: int = 0
    reason: str = ""  # why it waits
    exit_code: str = ""
    admin_comment: str = ""
    source: str = "slurmctld"  # or "accounting"


@dataclass(frozen=True)
class NodeFault:
    """A fault seen on a Kubernetes node: its GPU condition or an Event naming an XID."""

    node: str
    at: datetime
    xid: int | None
    message: str = ""


AGENT_COMPONENT = "gpufleet-agent"  # the source the node agent's Events carry (reconciler/adapters/kube.py node_event)


def agent_event(node: str, component: str | None, host: str | None) -> bool:
    """Whether an Event on `node` is one the node agent wrote about it, the only Events a node's story counts as
    its faults: source `gpufleet-agent` from that node's host. Anyone who may create Events in `default` can
    write an Xid into one (a kubelet may, about its own node only: the kubelet-events admission policy); what
    the agent writes, admission keeps to its own node (components/admission.py agent_events_policy)."""
    return component == AGENT_COMPONENT and host == node


@dataclass(frozen=True)
class LendingEvent:
    """An Event the lending pass posted on a node (reconciler/runtime/executor.py): Reclaiming when it began
    taking the node back (the message says why), ReclaimForced when borrowers outlasted the grace, Reclaimed
    when the loan ended."""

    node: str
    at: datetime
    reason: str
    message: str = ""


@dataclass(frozen=True)
class NodeReclaim:
    """A node lent to inference (preemptible) borrowers and taken back: from `began` (borrowers evicted) to
    `ended` (the loan over, the node back to Slurm); `ended` None: under way."""

    node: str
    pool: str
    began: datetime | None  # None: not known (an old ledger, its Event expired)
    ended: datetime | None
    why: str = ""
    grace_seconds: int | None = None  # known when the borrowers outlasted it

    @property
    def took_seconds(self) -> float | None:
        return (self.ended - self.began).total_seconds() if self.began and self.ended else None


@dataclass(frozen=True)
class Entry:
    at: datetime | None
    text: str


@dataclass(frozen=True)
class Story:
    job_id: int
    known_to_slurm: bool
    verdict: str  # HEALED | HEALING | HELD | FAILED | OWN_ERROR | APP_RESTART | NOTHING
    summary: str  # the verdict in one line
    job: JobFacts | None = None
    kube_nodes: tuple[str, ...] = ()  # the Kubernetes nodes of its Slurm nodes (as far as known)
    remediations: tuple[str, ...] = ()
    entries: tuple[Entry, ...] = field(default_factory=tuple)
    fault_to_running_seconds: float | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        for e in d["entries"]:
            e["at"] = stamp(e["at"]) if e["at"] else None
        if d["job"]:
            for k in ("submitted", "started", "ended"):
                d["job"][k] = stamp(d["job"][k]) if d["job"][k] else None
        return d


CLOCK_SLACK_SECONDS = 5.0  # the reconciler's clock and slurmctld's may differ by this much


def touched(r: Remediation, job_id: int, job: "JobFacts | None" = None, pools: Iterable[str] = ()) -> bool:
    """Whether remediation `r` is about this job, not another job that had the same id: Slurm reuses ids
    (a new slurmctld state starts again at FirstJobId), so the id alone is not enough. A fault on a pool
    outside the job's partitions never reached it, and a job never requeued was submitted after no record
    about it was made (slurmctld sets the submit time anew only at a requeue)."""
    if job_id not in r.jobs:
        return False
    pools = set(pools)
    if pools and r.pool and r.pool not in pools:
        return False
    if job is not None and job.submitted is not None and job.restarts == 0:
        return (job.submitted - r.created).total_seconds() <= CLOCK_SLACK_SECONDS
    return True


def _phases(r: Remediation) -> list[Entry]:
    out = []
    for phase, at in r.phase_times:
        if phase == Phase.DETECTED.value:
            continue
        text = f"remediation {r.name}: {phase}"
        if phase == Phase.CHECKPOINTING.value and r.grace_deadline is not None:
            text += f" (SIGTERM, {max(0, round((r.grace_deadline - at).total_seconds()))} s to checkpoint)"
        elif phase == Phase.REQUEUED.value:
            text += " (the job went back to Slurm's queue)"
        elif phase == Phase.HELD.value:
            text += f" ({r.held_message or 'admission held the replacement'})"
        elif phase == Phase.RESUMING.value and r.replacement:
            text += f" (replacement {r.replacement})"
        elif phase in (Phase.FAILED.value, Phase.ESCALATED.value) and r.reason:
            text += f": {r.reason}"
        out.append(Entry(at, text))
    if r.reclaim_started is not None:
        out.append(Entry(r.reclaim_started, f"remediation {r.name}: its spare {r.replacement or ''} was lent; "
                                            "the borrowers were evicted first (this delayed the heal)"))
    return out


def _ran_while(job: JobFacts | None, f: NodeFault, now: datetime) -> bool:
    if job is None or job.started is None:
        return False
    return job.started <= f.at <= (job.ended or now)


GRACE = re.compile(r"the (\d+)s reclaim grace")
WHY = re.compile(r"^taking \S+ back: (.*)$", re.DOTALL)


def reclaims(ledgers: Mapping[str, PoolLedger], events: Iterable[LendingEvent],
             reclaiming: Mapping[str, tuple[str, datetime]]) -> list[NodeReclaim]:
    """Every reclaim the records show. The ledger's loans are the record (each pool's, kept a week): a loan
    marked `reclaimed` was taken back; an unmarked one that ended counts only where a Reclaiming Event says
    so (a loan ended by a fault is no reclaim). The Events add why and the grace; without a ledger entry
    for the node, a Reclaiming Event and the Reclaimed one after it are the reclaim. `reclaiming`: node ->
    (its pool, when its reclaim began), from the nodes' annotations: those under way now."""
    by_node: dict[str, list[LendingEvent]] = {}
    for e in sorted(events, key=lambda e: e.at):
        by_node.setdefault(e.node, []).append(e)

    def within(node: str, reason: str, since: datetime | None, until: datetime | None) -> list[LendingEvent]:
        return [e for e in by_node.get(node, ()) if e.reason == reason and (since is None or e.at >= since)
                and (until is None or e.at <= until)]

    def told(node: str, pool: str, began: datetime | None, since: datetime, ended: datetime | None) -> NodeReclaim:
        asked = within(node, "Reclaiming", since, ended)
        began = began or (asked[-1].at if asked else None)
        why = next((m.group(1) for e in reversed(asked) if (m := WHY.match(e.message))), "")
        grace = next((int(m.group(1)) for e in within(node, "ReclaimForced", began or since, ended)
                      if (m := GRACE.search(e.message))), None)
        return NodeReclaim(node, pool, began, ended, why, grace)

    out: list[NodeReclaim] = []
    in_ledger: set[str] = set()
    for pool, led in sorted(ledgers.items()):
        for loan in led.loans:
            in_ledger.add(loan.node)
            if loan.open:
                if loan.node in reclaiming:
                    out.append(told(loan.node, pool, loan.reclaimed or reclaiming[loan.node][1], loan.start, None))
                continue
            # The ledger closes a loan on the pass after the one that ended it; its Reclaimed Event is on time.
            back = within(loan.node, "Reclaimed", loan.reclaimed or loan.start, loan.end)
            r = told(loan.node, pool, loan.reclaimed, loan.start, back[0].at if back else loan.end)
            if r.began is not None:
                out.append(r)
    for node, evs in sorted(by_node.items()):
        if node in in_ledger:
            continue
        pool = reclaiming.get(node, ("", None))[0]
        start = None
        for e in evs:
            if e.reason == "Reclaiming":
                start = start or e.at
            elif e.reason == "Reclaimed" and start is not None:
                out.append(told(node, pool, start, start, e.at))
                start = None
        if start is not None and node in reclaiming:
            out.append(told(node, pool, start, start, None))
    for node, (pool, began) in sorted(reclaiming.items()):
        if node not in in_ledger and node not in by_node:
            out.append(NodeReclaim(node, pool, began, None))
    return out


def _reclaim_text(r: NodeReclaim) -> str:
    took = r.took_seconds
    text = f"{r.node} was lent to inference and taken back for it"
    if took is not None:
        text += f": the reclaim took {took:.0f} s"
    if r.grace_seconds is not None:
        text += f" (reclaim grace {r.grace_seconds} s, outlasted: its borrowers were deleted)"
    return text + (f"; why: {r.why}" if r.why else "")


def delays(job: JobFacts | None, job_nodes: Iterable[str], pools: Iterable[str],
           found: Iterable[NodeReclaim]) -> list[Entry]:
    """The reclaims that delayed the job's start: each on a node it runs (ran) on that ended between its
    submit time and its start; for a pending job, each under way on a node of a pool its partitions use."""
    if job is None or job.submitted is None:
        return []
    nodes, pools = set(job_nodes), set(pools)
    out = []
    for r in found:
        if r.ended is None:
            if job.started is None and job.state == "PENDING" and r.pool in pools:
                since = f" since {stamp(r.began)}" if r.began else ""
                out.append(Entry(r.began, f"{r.node} (pool {r.pool}, of the job's partition) is being taken back "
                                          f"from inference{since}: the job may start once it is back"
                                          + (f"; why: {r.why}" if r.why else "")))
        elif r.node in nodes and job.started is not None and job.submitted <= r.ended <= job.started:
            out.append(Entry(r.ended, _reclaim_text(r)))
    return out


def story(job_id: int, job: JobFacts | None, remediations: list[Remediation], faults: list[NodeFault],
          kube_nodes: dict[str, str], now: datetime, reclaimed: Iterable[NodeReclaim] = (),
          pools: Iterable[str] = ()) -> Story | None:
    """The story of one job; None when neither Slurm nor any remediation knows it. `kube_nodes` maps
    Slurm node names to Kubernetes node names (from the operator's comment on each Slurm node);
    `reclaimed`: the reclaims the records show (`reclaims`); `pools`: those its partitions use."""
    pools = set(pools)
    mine = sorted((r for r in remediations if touched(r, job_id, job, pools)), key=lambda r: (r.created, r.name))
    if job is None and not mine:
        return None
    entries: list[Entry] = []
    if job is not None and job.submitted:
        # slurmctld sets the submit time anew at each requeue (accounting keeps the first)
        entries.append(Entry(job.submitted, "back in Slurm's queue (its submit time, set anew by the requeue)"
                             if job.restarts else f"submitted by {owner(job)}"))
    for r in mine:
        slurm = ",".join(r.slurm_nodes) or "?"
        entries.append(Entry(r.created, f"fault: {describe(r.xid, r.kind)} on {r.node} (Slurm {slurm}), "
                                        f"the node the job ran on: {r.message}"))
        entries.extend(_phases(r))
    seen = {(r.node, r.xid) for r in mine}
    # its nodes now, the faulted ones, and every node its jobs ran on when a remediation signalled them (a
    # requeued job waiting in the queue has no nodes in Slurm: the record remembers them)
    slurm_nodes = set(job.nodes if job else ()) | {n for r in mine for n in r.job_nodes}
    job_nodes = {kube_nodes.get(n, n) for n in slurm_nodes} | {r.node for r in mine}
    own = []
    for f in sorted(faults, key=lambda f: f.at):
        if f.node not in job_nodes or (f.node, f.xid) in seen or not _ran_while(job, f, now):
            continue
        if _application(f.xid):
            own.append(f)
            entries.append(Entry(f.at, f"{describe(f.xid)} on its node {f.node}: {app_fault_meaning(f.xid, f.message)}"))
        elif at_boundary(f):
            own.append(f)
            entries.append(Entry(f.at, f"{describe(f.xid) if f.xid else 'fault'} on its node {f.node}: "
                                       f"{BOUNDARY_MEANING}; {f.message}"))
        else:
            entries.append(Entry(f.at, f"{describe(f.xid) if f.xid else 'fault'} on its node {f.node}: "
                                       f"{f.message}"))
    back = None
    if job is not None and job.started is not None:
        where = ",".join(job.nodes) or "?"
        if mine and job.started >= mine[-1].created:
            back = (job.started - mine[-1].created).total_seconds()
            entries.append(Entry(job.started, f"running again on {where} ({job.restarts} requeue(s)), "
                                              f"{back:.0f} s after the fault"))
        else:
            entries.append(Entry(job.started, f"started on {where}"))
    if job is not None and job.state in ENDED and job.ended is not None:
        entries.append(Entry(job.ended, f"ended {job.state}" + (f" ({job.exit_code})" if job.exit_code else "")))
    waited = delays(job, job_nodes, pools, reclaimed)
    entries.extend(waited)
    verdict, summary = _verdict(job, mine, own, back)
    if waited and verdict == NOTHING:
        summary += f"; its start waited for {len(waited)} node(s) taken back from inference"
    entries.sort(key=lambda e: (e.at is None, e.at or now))
    return Story(job_id=job_id, known_to_slurm=job is not None, verdict=verdict, summary=summary, job=job,
                 kube_nodes=tuple(sorted(job_nodes)), remediations=tuple(r.name for r in mine),
                 entries=tuple(entries), fault_to_running_seconds=back)


BOUNDARY_MEANING = ("NVIDIA's resolution is DRAIN_AND_RESET: the node was drained in Slurm at this job's boundary "
                    "(the job runs on to its end, no new job lands there) and is reset after it")


def at_boundary(f: NodeFault) -> bool:
    """A fault whose condition says NVIDIA's DRAIN_AND_RESET (`when=job-boundary`): the job was left to finish."""
    return parse_header(f.message).get("when") == When.JOB_BOUNDARY.value


def _application(xid: int | None) -> bool:
    """An XID whose action (NVIDIA's catalogue: RESTART_APP) is the application's to take: it must restart,
    and the node stays in service."""
    return xid is not None and default_action(Kind.XID, xid) is FaultAction.RESTART_APP


def app_fault_meaning(xid: int | None, message: str = "") -> str:
    """What a RESTART_APP fault means for the job, in plain words: a hardware error the GPU contained (Xid 94),
    or, for the others, most often the application's own error; repeated on one GPU (the node agent's condition
    says `action=diagnose`), the diagnostics asked while the node stays in service (core/diagnosis.py)."""
    if parse_header(message).get("action") == FaultAction.DIAGNOSE.value:
        return ("repeated on that GPU: diagnostics are asked (NVIDIA: RUN_DCGMEUD); the node stays in service and "
                "the job runs on: no new job lands there, and it is health-checked once idle, back if it passes")
    if xid in CONTAINED_HARDWARE:
        return ("a GPU memory error the GPU contained (hardware): only the application on that GPU had to "
                "restart; the node stays in service")
    return ("the application on that GPU had to restart (NVIDIA: RESTART_APP); most often the job's own error: "
            "look at the job's stderr at that time")


def _verdict(job: JobFacts | None, mine: list[Remediation], own: list[NodeFault],
             back: float | None) -> tuple[str, str]:
    if mine:
        last = mine[-1]
        fault = f"{describe(last.xid, last.kind)} on {last.node}"
        if last.phase in (Phase.FAILED, Phase.ESCALATED):
            return FAILED, f"hardware fault ({fault}); its remediation {last.phase.value.lower()}: {last.reason}"
        if last.phase is Phase.HELD:
            return HELD, (f"hardware fault ({fault}): the job was requeued, but its replacement is held "
                          f"({last.held_message or 'admission held it'}); nothing more happens until that clears "
                          "or a person acts; the job waits in Slurm's queue")
        if last.active:
            return HEALING, (f"hardware fault ({fault}): gpufleet is healing it ({last.phase.value}); "
                             "the job waits in Slurm's queue")
        if back is not None:
            return HEALED, f"hardware fault healed ({fault}): the job ran again {back:.0f} s after the fault"
        waits = f" (Slurm: {job.reason})" if job is not None and job.reason else ""
        return HEALED, f"hardware fault healed ({fault}); the job waits in Slurm's queue{waits}"
    if own:
        f = own[-1]
        if at_boundary(f):
            return AT_BOUNDARY, (f"{describe(f.xid)} on {f.node} at {stamp(f.at)}, a GPU fault the job was left to "
                                 f"finish on: {BOUNDARY_MEANING}; gpufleet neither signalled nor requeued the job")
        if f.xid in CONTAINED_HARDWARE:
            return APP_RESTART, f"{describe(f.xid)} on {f.node} at {stamp(f.at)}: {app_fault_meaning(f.xid, f.message)}"
        return OWN_ERROR, (f"most likely the job's own error: {describe(f.xid)} on {f.node} at {stamp(f.at)}; "
                           f"{app_fault_meaning(f.xid, f.message)}")
    state = f" (Slurm: {job.state}{', ' + job.exit_code if job and job.exit_code else ''})" if job else ""
    return NOTHING, f"nothing gpufleet saw: no GPU fault on its nodes while it ran{state}"


def shown(text: str, most: int = 200) -> str:
    """A Slurm-supplied string as printed: control characters (newlines, escapes) and other unprintable ones
    written as `\\xNN`/`\\uNNNN`, cut at `most` characters."""
    out = []
    for c in text[:most]:
        if c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}")
    return "".join(out) + ("..." if len(text) > most else "")


def owner(j: JobFacts) -> str:
    return shown(j.user or "?") + (f"/{shown(j.account)}" if j.account else "")


def render(s: Story) -> str:
    """The story as text for a person."""
    j = s.job
    head = f"job {s.job_id}"
    if j is not None:
        head += f" ({shown(j.name) or '?'}, {owner(j)}): {shown(j.state)}"
        if j.nodes:
            head += f" on {','.join(shown(n) for n in j.nodes)}"
        if j.source == "accounting":
            head += " (from accounting: slurmctld no longer remembers it)"
    else:
        head += ": neither slurmctld nor accounting remembers it; from gpufleet's records"
    lines = [head]
    if s.kube_nodes:
        lines.append(f"  Kubernetes nodes: {', '.join(s.kube_nodes)}")
    for e in s.entries:
        lines.append(f"  {stamp(e.at) if e.at else '?':20}  {shown(e.text, 2000)}")
    if j is not None and j.admin_comment:
        lines.append(f"  Slurm admin comment: {shown(j.admin_comment, 4000)}")
    lines.append(f"verdict: {s.summary}")
    return "\n".join(lines)
