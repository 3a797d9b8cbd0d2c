"""SlurmClient over Slurm's command-line tools (scontrol, squeue, scancel).

Works with any Slurm that has these tools; tested against Slurm 26.05 (the local root's,
through the wrappers LocalSlurm puts on PATH).
Each call runs one or a few commands with a timeout and never retries: the reconciler
retries around it, guided by `SlurmError.temporary`:

* temporary=True: the command timed out, or slurmctld could not be reached
  ("Unable to contact slurm controller", socket time-outs, "try again later").
* temporary=False: anything else (unknown node or job, invalid request, tool missing).

Error messages name the command and carry its output.

What the commands do (see tests/integration/test_slurm_contract.py):

* drain: ``scontrol update NodeName=N State=DRAIN Reason=R``; running jobs go on (the
  node shows MIXED/ALLOCATED+DRAIN, then IDLE+DRAIN).
* signal_jobs: ``scancel --signal=TERM --full ID...``: ``--full`` signals the batch
  script (and its children) as well as every step; without it only srun steps get it.
  Jobs that already ended or are pending are skipped (nothing runs to be signalled;
  scancel would retry a pending job for ~95 s before failing).
* requeue: ``scontrol requeue ID``: works on running jobs (killed, then PENDING) and
  on finished ones (COMPLETED/FAILED/CANCELLED, while slurmctld still has them);
  the requeued job is held by a begin time about 120 s ahead (Reason=BeginTime).
  Requeuing an already pending job is not an error.
* release: ``scontrol update JobId=ID StartTime=now`` (clears that begin time; the job
  starts at the next scheduling pass), plus ``scontrol release ID`` if the job is held
  (e.g. after ``scontrol requeuehold``). A job that already runs or ended is left alone.
* down: ``scontrol update NodeName=N State=DOWN Reason=R``: jobs still on the node are
  killed (requeued if they allow it). With ReturnToService=2 a node whose slurmd
  still answers comes back (IDLE) within seconds, so drain it first to keep it out.
* resume: ``scontrol update NodeName=N State=RESUME``; resuming a node that is neither
  drained nor down is not an error.
"""
from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime, timezone
from typing import Mapping, Sequence

from gpufleet.reconciler.adapters.slurm import SlurmError, SlurmJob, SlurmNode, SlurmReservation, signal_targets
from gpufleet.reconciler.core.slurm_states import PENDING, SIGNALLABLE_JOB_STATES

__all__ = ["SlurmCLI", "expand_hostlist"]

# Output fragments meaning "slurmctld did not answer / is busy": retrying may help.
_TEMPORARY = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "connection refused",
    "connection reset",
    "communication connection failure",
    "transport endpoint is not connected",
    "slurm backup controller in standby mode",
    "slurmctld is in the process of being configured",
    "try again later",
    "resource temporarily unavailable",
    "unexpected message received",  # scontrol requeue with no slurmctld on 22.05
    "timed out",
)

# squeue -O fields; "Name" last, as it is the only one that may contain the separator.
# ":|" = width 0 (no padding or truncation) with "|" as suffix.
_JOB_FIELDS = ("JobID", "State", "Requeue", "RestartCnt", "Reason", "Partition", "NumNodes", "Priority", "NodeList",
               "Name")
_JOB_FORMAT = ",".join(f"{f}:|" for f in _JOB_FIELDS)


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist ("gpu-a-[0-2,5],cpu-1") into names, keeping zero padding."""
    expr = expr.strip()
    if not expr or expr in ("(null)", "None"):
        return []
    # Split on commas outside brackets.
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out: list[str] = []
    for part in parts:
        out.extend(_expand_one(part))
    return out


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if not m:
        return [part] if part else []
    prefix, suffix = part[: m.start()], part[m.end():]
    names: list[str] = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi) + 1):
                names.append(f"{i:0{width}d}")
        else:
            names.append(rng)
    out: list[str] = []
    for n in names:
        out.extend(_expand_one(prefix + n + suffix))
    return out


def _node_states(state: str) -> frozenset[str]:
    """"IDLE+DRAIN" -> {"IDLE", "DRAIN"}; "DOWN*" -> {"DOWN", "NOT_RESPONDING"}."""
    states: set[str] = set()
    for tok in state.upper().split("+"):
        tok = tok.strip()
        if not tok:
            continue
        if tok.endswith("*"):
            states.add("NOT_RESPONDING")
            tok = tok.rstrip("*")
        states.add(tok)
    return frozenset(states)


def _parse_oneliner(line: str) -> dict[str, str]:
    """Parse `scontrol -o show ...` output into a dict. Values may contain spaces
    (OS=Linux 6.1 #1 SMP ...): a value runs until the next " Key=" token. `Reason` (free
    text, ending in its "[user@time]" stamp) is taken whole; only what follows its stamp
    (Comment=... on 26.05) is parsed as more fields."""
    line = line.strip()
    fields: dict[str, str] = {}
    reason = None
    idx = line.find(" Reason=")
    if idx >= 0:
        reason = line[idx + len(" Reason="):]
        line = line[:idx]
        stamp = None
        for stamp in re.finditer(r"\s?\[[^\[\]]*@[^\[\]]*\](?=\s|$)", reason):
            pass
        if stamp is not None:
            line += " " + reason[stamp.end():]
            reason = reason[:stamp.end()]
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    if reason is not None:
        fields["Reason"] = reason.strip()
    return fields


def _node(f: Mapping[str, str]) -> SlurmNode:
    comment = f.get("Comment", "")
    parts = f.get("Partitions", "")
    reason, by, at = _reason_stamp(f.get("Reason", ""))
    return SlurmNode(name=f["NodeName"], states=_node_states(f.get("State", "")),
                     reason=reason, reason_set_by=by, reason_changed_at=at,
                     comment="" if comment in ("(null)", "None") else comment,
                     partitions=tuple(p for p in parts.split(",") if p and parts not in ("(null)", "None")),
                     last_busy=_epoch(f.get("LastBusyTime", "")))


def _epoch(value: str) -> float | None:
    """scontrol's local-time stamp (2026-12-01T12:00:00) as epoch seconds; None for Unknown/None."""
    from datetime import datetime
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


_STAMP = re.compile(r"\s*\[([^\[\]@]*)@([^\[\]]*)\]$")


def _reason_stamp(reason: str) -> tuple[str, str | None, float | None]:
    """"gpufleet: down [gpufleet@2024-01-01T00:00:00]" -> ("gpufleet: down", "gpufleet", epoch): the reason,
    who set it and when, as scontrol prints them (src/api/node_info.c: `Reason=%s [%s@%s]`, the user a name or
    the uid in digits); (reason, None, None) without a stamp."""
    reason = reason.strip()
    if reason in ("(null)", "None", ""):
        return "", None, None
    m = _STAMP.search(reason)
    if m is None:
        return reason, None, None
    return reason[:m.start()], m.group(1), _epoch(m.group(2))


class SlurmCLI:
    """SlurmClient implemented with the Slurm command-line tools.

    Args:
        env: environment for the tools (e.g. ``LocalSlurm.env()``: SLURM_CONF...);
            default: this process's environment.
        timeout: seconds allowed for each command.
        scontrol, squeue, scancel: the tools to run (names or paths).
    """

    @property
    def acts_as(self) -> str:
        """The user Slurm records for this client's updates: scontrol authenticates as this process's uid."""
        import pwd

        try:
            return pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            return str(os.geteuid())

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30,
                 scontrol: str = "scontrol", squeue: str = "squeue",
                 scancel: str = "scancel", sacct: str = "sacct"):
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self.scontrol = scontrol
        self.squeue = squeue
        self.scancel = scancel
        self.sacct = sacct

    # ------------------------------------------------------------------ running

    def _exec(self, argv: list[str]) -> tuple[int, str, str]:
        env = self.env if self.env is not None else dict(os.environ)
        try:
            r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            out = _text(e.stdout) + _text(e.stderr)
            raise SlurmError(f"`{_cmd(argv)}` timed out after {self.timeout:g}s"
                             + (f": {out.strip()}" if out.strip() else ""),
                             temporary=True) from None
        except FileNotFoundError as e:
            raise SlurmError(f"`{_cmd(argv)}`: {e}", temporary=False) from None
        except OSError as e:
            raise SlurmError(f"`{_cmd(argv)}`: {e}", temporary=True) from None
        return r.returncode, r.stdout, r.stderr

    def _run(self, argv: list[str]) -> str:
        """Run, returning stdout; raise a classified SlurmError on failure."""
        rc, out, err = self._exec(argv)
        if rc != 0:
            raise self._error(argv, rc, out, err)
        return out

    @staticmethod
    def _error(argv: list[str], rc: int, out: str, err: str) -> SlurmError:
        text = "\n".join(s.strip() for s in (err, out) if s.strip())
        temporary = any(t in text.lower() for t in _TEMPORARY)
        return SlurmError(f"`{_cmd(argv)}` failed (exit {rc}): {text or '(no output)'}",
                          temporary=temporary)

    # ------------------------------------------------------------------ queries

    def node(self, name: str) -> SlurmNode:
        argv = [self.scontrol, "-o", "show", "node", name]
        out = self._run(argv)
        for line in out.splitlines():
            f = _parse_oneliner(line)
            if f.get("NodeName") == name:
                return _node(f)
        raise SlurmError(f"`{_cmd(argv)}`: node {name} not in output: {out.strip()!r}",
                         temporary=False)

    def nodes(self) -> list[SlurmNode]:
        argv = [self.scontrol, "-o", "show", "nodes"]
        rc, out, err = self._exec(argv)
        if rc != 0:
            if "no nodes" in (out + err).lower():
                return []
            raise self._error(argv, rc, out, err)
        found = [_node(f) for f in map(_parse_oneliner, out.splitlines()) if f.get("NodeName")]
        return sorted(found, key=lambda n: n.name)

    def _squeue(self, *args: str) -> list[SlurmJob]:
        argv = [self.squeue, "-h", "-O", _JOB_FORMAT, *args]
        out = self._run(argv)
        jobs = []
        n = len(_JOB_FIELDS)
        for line in out.splitlines():
            if not line.strip():
                continue
            parts = line.split("|", n - 1)
            if len(parts) < n:
                raise SlurmError(f"`{_cmd(argv)}`: cannot parse {line!r}", temporary=False)
            jid, state, requeue, restarts, reason, partition, num_nodes, priority, nodelist, name = parts
            if name.endswith("|"):
                name = name[:-1]
            reason = reason.strip()
            jobs.append(SlurmJob(
                job_id=int(jid.strip()),
                name=name,
                state=state.strip().split()[0] if state.strip() else "",
                nodes=tuple(expand_hostlist(nodelist)),
                requeue=requeue.strip() not in ("0", "no", "NO"),
                reason="" if reason in ("None", "(null)") else reason,
                restarts=int(restarts.strip() or 0),
                partitions=tuple(p for p in partition.strip().split(",") if p),
                node_count=int(num_nodes.strip() or 1) if num_nodes.strip().isdigit() else 1,
                hold=priority.strip() == "0",
            ))
        return jobs

    def jobs_on_node(self, name: str) -> list[SlurmJob]:
        """Jobs running (or completing, suspended...) on the node; not pending ones. A node Slurm does not
        know runs none (as slurmrestd answers)."""
        try:
            return self._squeue("-w", name)
        except SlurmError as e:
            if e.temporary:
                raise
            try:
                self.node(name)
            except SlurmError as unknown:
                if unknown.temporary:
                    raise
                return []  # Slurm does not know the node: no job runs there
            raise

    def pending_jobs(self) -> list[SlurmJob]:
        return sorted(self._squeue("-t", PENDING), key=lambda j: j.job_id)

    def running_jobs(self) -> list[SlurmJob]:
        return sorted(self._squeue("-t", "RUNNING"), key=lambda j: j.job_id)

    def job(self, job_id: int) -> SlurmJob | None:
        """The job in any state slurmctld still knows (finished jobs are kept for
        MinJobAge seconds); None when unknown or purged."""
        argv_tail = ["-t", "all", "-j", str(int(job_id))]
        try:
            jobs = self._squeue(*argv_tail)
        except SlurmError as e:
            if not e.temporary and "invalid job id" in str(e).lower():
                return None
            raise
        for j in jobs:
            if j.job_id == int(job_id):
                return j
        return None

    def jobs_failed_on(self, names: Sequence[str], since: float) -> list[SlurmJob]:
        """`sacct -X -D -N <nodes> -s NODE_FAIL -S <since>`: each run of a requeued job is its own record (-D), the
        allocation only (-X); man sacct(1). Their nodes are the failed run's. A SlurmError where no accounting
        runs."""
        if not names:
            return []
        start = datetime.fromtimestamp(int(since), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        out = self._run([self.sacct, "-X", "-D", "-n", "-P", "-N", ",".join(sorted(set(names))), "-s", "NODE_FAIL",
                         "-S", start, "-o", "JobID,JobName,State,NodeList"])
        wanted, jobs = set(names), {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) < 4 or not parts[0].strip().isdigit():
                continue
            nodes = tuple(expand_hostlist(parts[3].strip())) if parts[3].strip() not in ("", "None assigned") else ()
            state = parts[2].strip().split()[0] if parts[2].strip() else ""
            if state == "NODE_FAIL" and wanted & set(nodes):
                jid = int(parts[0])
                jobs[jid] = SlurmJob(jid, parts[1], state, nodes)
        return sorted(jobs.values(), key=lambda j: j.job_id)

    # ------------------------------------------------------------------ reservations (active checks)

    def reservations(self) -> list[SlurmReservation]:
        """``scontrol -o show reservation``: one line each (``ReservationName=... Nodes=gpu-a-[0-1] ...
        Flags=MAINT,SPEC_NODES``); "No reservations in the system" when none."""
        out = self._run([self.scontrol, "-o", "show", "reservation"])
        found = []
        for line in out.splitlines():
            f = _parse_oneliner(line)
            if f.get("ReservationName"):
                nodes = f.get("Nodes", "")
                found.append(SlurmReservation(f["ReservationName"],
                                              tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else (),
                                              frozenset(x for x in f.get("Flags", "").split(",") if x)))
        return sorted(found, key=lambda r: r.name)

    def reserve_for_maintenance(self, name: str, nodes: Sequence[str], minutes: int) -> None:
        """``scontrol create reservation ReservationName=R Nodes=a,b StartTime=now Duration=M Users=U
        Flags=MAINT`` (scontrol(1), "RESERVATIONS"): without IGNORE_JOBS slurmctld refuses nodes that run a job."""
        self._run([self.scontrol, "create", "reservation", f"ReservationName={name}", f"Nodes={','.join(nodes)}",
                   "StartTime=now", f"Duration={int(minutes)}", f"Users={self.acts_as}", "Flags=MAINT"])

    def delete_reservation(self, name: str) -> None:
        """``scontrol delete ReservationName=R``; one not there is already what was asked."""
        try:
            self._run([self.scontrol, "delete", f"ReservationName={name}"])
        except SlurmError as e:
            if not e.temporary and name not in {r.name for r in self.reservations()}:
                return
            raise

    # ------------------------------------------------------------------ nodes

    def drain(self, name: str, reason: str) -> None:
        self._run([self.scontrol, "update", f"NodeName={name}", "State=DRAIN",
                   f"Reason={reason or 'gpufleet'}"])

    def down(self, name: str, reason: str) -> None:
        self._run([self.scontrol, "update", f"NodeName={name}", "State=DOWN",
                   f"Reason={reason or 'gpufleet'}"])

    def resume(self, name: str) -> None:
        argv = [self.scontrol, "update", f"NodeName={name}", "State=RESUME"]
        rc, out, err = self._exec(argv)
        if rc == 0:
            return
        error = self._error(argv, rc, out, err)
        if any(m in (out + err).lower() for m in ("invalid node state specified", "invalid node state transition")):
            # Slurm refuses RESUME for a node that is neither drained nor down (22.05: "specified",
            # 26.05: "transition"): fine.
            if not self.node(name).drained_or_down:
                return
        raise error

    # ------------------------------------------------------------------ jobs

    def _ids(self, job_ids: Sequence[int]) -> list[int]:
        return [int(j) for j in dict.fromkeys(job_ids)]

    def signal_jobs(self, job_ids: Sequence[int], signal: str = "TERM") -> None:
        """Signal the batch script (and its children) and all steps of each job.

        Only jobs that run are signalled: pending or ended ones are skipped (scancel
        would retry a pending one for ~95 s, "Job can not be altered now"). An unknown
        job id is an error (temporary=False), raised after the others were signalled."""
        ids = self._ids(job_ids)
        if not ids:
            return
        sig = str(signal).upper()
        if sig.startswith("SIG"):
            sig = sig[3:]
        targets, unknown = signal_targets(ids, self.job)
        if targets:
            argv = [self.scancel, f"--signal={sig}", "--full", *map(str, targets)]
            rc, out, err = self._exec(argv)
            if rc != 0:
                error = self._error(argv, rc, out, err)
                # Messages do not tell "ended meanwhile" from "unknown" ("Invalid job id
                # specified" for both): look at the jobs again.
                failed = [int(m) for m in re.findall(r"job id (\d+)", out + err)] or targets
                for jid in failed:
                    job = self.job(jid)
                    if job is None:
                        unknown.append(jid)
                    elif job.state in SIGNALLABLE_JOB_STATES:
                        raise error
        if unknown:
            raise SlurmError(f"signal {sig}: unknown job(s) {', '.join(map(str, unknown))}",
                             temporary=False)

    def requeue(self, job_ids: Sequence[int]) -> None:
        """Requeue each job (running ones are killed first). Already pending: no-op."""
        for jid in self._ids(job_ids):
            argv = [self.scontrol, "requeue", str(jid)]
            rc, out, err = self._exec(argv)
            if rc == 0:
                continue
            error = self._error(argv, rc, out, err)
            text = (out + err).lower()
            if "pending execution" in text:
                continue
            if error.temporary:
                raise error
            job = self.job(jid)
            if job is not None and job.state == PENDING:
                continue
            raise error

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """`scontrol update JobId=N AdminComment=...` (a super user's field, as over REST). This backend does
        not read admin comments back (SlurmJob.admin_comment is None), so the job notes pass skips it."""
        self._run([self.scontrol, "update", f"JobId={int(job_id)}", f"AdminComment={text}"])

    def release(self, job_ids: Sequence[int]) -> None:
        """Make pending jobs eligible now: clear the begin time a requeue sets, and
        release a hold. Jobs that already run or ended are left alone."""
        for jid in self._ids(job_ids):
            job = self.job(jid)
            if job is None or job.state != PENDING:
                continue  # unknown, running or ended: nothing to release
            argv = [self.scontrol, "update", f"JobId={jid}", "StartTime=now"]
            rc, out, err = self._exec(argv)
            if rc != 0:
                error = self._error(argv, rc, out, err)
                text = (out + err).lower()
                if "no longer pending" in text or "already finished" in text:
                    continue
                raise error
            job = self.job(jid)
            if job is not None and job.state == PENDING and "held" in job.reason.lower():
                self._run([self.scontrol, "release", str(jid)])


def _cmd(argv: Sequence[str]) -> str:
    return " ".join(a if a and " " not in a else repr(a) for a in argv)


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b
