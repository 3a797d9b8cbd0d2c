"""The node agent: follow the kernel log, and report what each GPU fault needs.

Runs as a DaemonSet reading /dev/kmsg; drills use a file, or `gpufleet inject-fault`, which sets
the same condition directly. Each event the driver logs (reconciler/agent/kmsg.py) is classified with
the effective catalogue of the policy the agent is given (fleetspec/faults/classify.py): a fault that
takes the node out sets the GPU condition False (fleetspec/faults/condition.py's format: which GPU,
which code, what it needs); a `diagnose` one sets it too, with `action=diagnose` (the reconciler checks
the node while it stays in service: reconciler/core/diagnosis.py), but never over a fault that takes the
node out (then it is an Event); a `restart-app` one is an Event on the node, which stays in service (the
application must restart); the rest are counted and logged. Lines it cannot read, and the driver's words where the kernel did not put
them, are counted and logged, never raised.

Two threads, so the API server never stalls the reading of the log: the reader (`read`) parses
lines and queues sightings; the reporter (`connect`, then `report_pending`) writes them,
retrying with backoff for as long as the API server is away or the node is not registered yet.
Only what retrying cannot fix (a forbidden or invalid call) stops the agent, with AgentFailed.

Where reading starts: /dev/kmsg always at its oldest record, a file at its end (or its start,
with from_start). The cursor on the node says what was reported before (reconciler/agent/sightings.py),
so reading the log again reports nothing twice and catches what was logged while the agent was down.
The decisions (parsing, queueing, report or not, the cursor) are pure; this module does the I/O.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, describe
from gpufleet.fleetspec.faults.classify import Classifier
from gpufleet.fleetspec.faults.driver import GpuEvent, Unreadable, Untrusted
from gpufleet.fleetspec.faults.policy import FaultPolicy

from gpufleet.reconciler.errors import NotFound, PermanentError, TemporaryError
from gpufleet.reconciler.agent.kmsg import MAX_LINE, KernelLogParser, record_seq
from gpufleet.reconciler.agent.sightings import Cursor, Pending, Sighting, Verdict, advance, condition_message, newest, resume_from, verdict

log = logging.getLogger(__name__)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class AgentFailed(RuntimeError):
    """The API server refused a call in a way retrying cannot fix (forbidden, invalid)."""


class NodeAPI(Protocol):
    """What the agent needs of gpufleet.reconciler.adapters.kube.Kube."""

    def get_node(self, name: str) -> dict: ...
    def patch_node(self, name: str, body: dict) -> dict: ...
    def set_condition(self, name: str, ctype: str, status: str, reason: str, message: str) -> None: ...
    def node_event(self, name: str, reason: str, message: str) -> None: ...


class KernelLog:
    """/dev/kmsg or a file, read without blocking: `lines()` returns what arrived since the last call.
    `boot` names this run of the log: the kernel's boot id for /dev/kmsg (record numbers restart at a
    reboot), the file's identity for a file. A line longer than MAX_PARTIAL (a file can hold anything)
    is cut to its head as soon as it is that long: memory stays bounded."""

    MAX_PARTIAL = 64 * 1024

    def __init__(self, path: Path, from_start: bool = False):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(self.fd)
        self.is_kmsg = stat.S_ISCHR(st.st_mode)
        self.replays = self.is_kmsg or from_start  # a restart reads what this run read
        if self.is_kmsg:
            self.boot = BOOT_ID.read_text().strip()
        else:
            self.boot = f"file-{st.st_dev}-{st.st_ino}"
            if not from_start:
                os.lseek(self.fd, 0, os.SEEK_END)
        self.overruns = 0
        self.overlong = 0  # lines longer than MAX_PARTIAL bytes: their head is read, the rest dropped
        self._partial = b""
        self._skipping = False

    def lines(self, limit: int = 1000) -> list[str]:
        out: list[str] = []
        while len(out) < limit:
            try:
                chunk = os.read(self.fd, 8192)  # /dev/kmsg: one record per read
            except BlockingIOError:
                break
            except BrokenPipeError:  # /dev/kmsg only: the ring buffer wrapped past unread records
                self.overruns += 1
                log.warning("kernel log %s: records were overwritten before they were read", self.path)
                continue
            if not chunk:
                break
            *complete, partial = (self._partial + chunk).split(b"\n")
            if complete and self._skipping:
                complete[0], self._skipping = b"", False  # the rest of an overlong line
            out += [c.decode(errors="replace") for c in complete if c]
            if self._skipping:
                partial = b""
            elif len(partial) > self.MAX_PARTIAL:
                out.append(partial[:MAX_LINE].decode(errors="replace"))  # its head is all that is read
                self.overlong += 1
                partial, self._skipping = b"", True
            self._partial = partial
        return out

    def close(self) -> None:
        os.close(self.fd)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Agent:
    def __init__(self, kube: NodeAPI, node: str, kernel_log: KernelLog, *, condition: str = labels.GPU_CONDITION,
                 policy: FaultPolicy | None = None, pending_limit: int = 32, max_backoff: float = 30.0,
                 stop: threading.Event | None = None, sleep: Callable[[float], Any] | None = None,
                 clock: Callable[[], datetime] = _utcnow, gpus: Mapping[str, int] | None = None):
        self.kube, self.node, self.kernel_log, self.condition = kube, node, kernel_log, condition
        self.gpus = dict(gpus or {})  # PCI address -> GPU index (sightings.gpu_indexes): the condition says `gpu=N`
        self.parser = KernelLogParser()
        self.classifier = Classifier(policy)
        self.pending = Pending(pending_limit)
        # faults: take the node out; notices: restart-app, diagnose (an Event); ignored: need nothing;
        # unreadable: the driver's lines that do not parse; untrusted: its words where the kernel did not put them
        self.counts = {"faults": 0, "notices": 0, "ignored": 0, "unreadable": 0, "untrusted": 0, "written": 0,
                       "events": 0}
        self.stopping = stop or threading.Event()
        self.log_end = -1                 # the newest record number in the log when reading started
        self.upto: Cursor | None = None   # reported up to; known once connected
        self._handled: int | None = None  # the newest record number handled
        self._clock = clock
        self._lock = threading.Lock()     # the reader and the reporter share `pending`
        self._wake = threading.Event()
        self._retrying = Retrying(
            retry=retry_if_exception_type((TemporaryError, NotFound)),
            wait=wait_exponential_jitter(multiplier=0.5, max=max_backoff, jitter=0.5),
            stop=lambda _: self.stopping.is_set(),
            sleep=sleep or self.stopping.wait,  # a stop ends the wait at once
            before_sleep=self._log_retry, reraise=True)

    # --- the reader ------------------------------------------------------------------------------

    def read(self) -> int:
        """Read what the kernel log holds now and queue what must be reported; returns how many lines."""
        lines = self.kernel_log.lines()
        self._queue(lines)
        return len(lines)

    def read_backlog(self) -> None:
        """Read what the log holds at start, and remember its newest record (see resume_from)."""
        while lines := self.kernel_log.lines():
            self.log_end = max([self.log_end] + [s for s in map(record_seq, lines) if s is not None])
            self._queue(lines)

    def _queue(self, lines: list[str]) -> None:
        for line in lines:
            for item in self.parser.feed(line):
                if isinstance(item, GpuEvent):
                    self._sighted(item)
                elif isinstance(item, Unreadable):
                    self._count("unreadable", logging.WARNING, "unreadable GPU line ignored (%s): %r", item.why,
                                item.line)
                elif isinstance(item, Untrusted):
                    self._count("untrusted", logging.INFO, "not believed (%s): %r", item.why, item.line)

    def _sighted(self, ev: GpuEvent) -> None:
        c = self.classifier.classify(ev, now=time.monotonic())
        what = f"{describe(ev.code, ev.kind)} needs {c.action.value} [NVIDIA: {c.nvidia}; {c.why}]: {ev.message}"
        if c.action is FaultAction.NONE:
            self._count("ignored", logging.WARNING if c.why == "unknown code" else logging.INFO, "%s", what)
            return
        self.counts["faults" if c.remediates else "notices"] += 1
        log.log(logging.ERROR if c.remediates else logging.WARNING, "%s", what)
        with self._lock:
            queued = self.pending.add(Sighting(ev, ev.seq, ev.seq, self._clock(), verdict=c))
        if not queued:
            log.error("%d sightings wait for the API server already: %s not queued", self.pending.limit, ev.message)
        self._wake.set()

    def _count(self, what: str, level: int, fmt: str, *args: Any) -> None:
        """Count, and log the first ten of each kind, then every hundredth: a flood of bad lines
        must not flood the agent's own log."""
        n = self.counts[what] = self.counts[what] + 1
        if n <= 10 or n % 100 == 0:
            log.log(level, fmt + (f" ({n} so far)" if n > 10 else ""), *args)

    # --- the reporter ----------------------------------------------------------------------------

    def connect(self) -> Cursor:
        """Wait for the API server and the node, then decide where reporting resumes."""
        node = self._call(self.kube.get_node, self.node)
        text = (node["metadata"].get("annotations") or {}).get(labels.KMSG_REPORTED)
        saved = Cursor.parse(text)
        if text and saved is None:
            log.warning("node %s: annotation %s=%r is not <boot id>:<record>; treated as absent",
                        self.node, labels.KMSG_REPORTED, text)
        self.upto = resume_from(saved, self.kernel_log.boot, self.log_end, self._condition_of(node) is not None)
        log.info("agent for node %s: reporting GPU faults to %s after kernel-log record %d of %s "
                 "(cursor on the node: %s)", self.node, self.condition, self.upto.seq, self.upto.boot, saved)
        if self.upto != saved:
            self._save_cursor()
        return self.upto

    def report_pending(self) -> int:
        """Report every queued sighting, retrying until the API server answers; returns how many
        conditions were written. Raises PermanentError for what retrying cannot fix."""
        assert self.upto is not None, "connect() first"
        written = 0
        while not self.stopping.is_set() and len(self.pending):
            node = self._call(self.kube.get_node, self.node)
            with self._lock:  # taken now, with the repeats that arrived while the API was away
                s = self.pending.oldest()
            if s is None:
                break
            v = verdict(s, self.upto, self._condition_of(node))
            if (v is Verdict.REPORT and s.notice) or v is Verdict.OUTRANKED:
                # The job's problem: the node stays in service, the job's owner finds it on the node.
                self._call(self.kube.node_event, self.node, s.reason, condition_message(s, self._clock(), self.gpus))
                self.counts["events"] += 1
                log.warning("node %s: Event %s (%s), the node stays in service", self.node, s.reason, s.event.message)
            elif v is Verdict.REPORT:
                self._call(self.kube.set_condition, self.node, self.condition, "False", s.reason,
                           condition_message(s, self._clock(), self.gpus))
                written += 1
                self.counts["written"] += 1
                log.warning("node %s: %s=False reason %s needs %s (%s)", self.node, self.condition, s.reason,
                            s.verdict.action.value, s.event.message)
            else:
                log.info("node %s: %s not written: %s", self.node, s.event.message, v.value)
            with self._lock:
                self.pending.done(s)
                self._handled = newest(self._handled, s.last_seq)
                upto = advance(self.upto, self._handled, self.pending.floor())
            if upto != self.upto:
                self.upto = upto
                self._save_cursor()
        return written

    def _save_cursor(self) -> None:
        self._call(self.kube.patch_node, self.node,
                   {"metadata": {"annotations": {labels.KMSG_REPORTED: str(self.upto)}}})

    def _condition_of(self, node: dict) -> dict | None:
        conds = (node.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c.get("type") == self.condition), None)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._retrying(fn, *args)

    def _log_retry(self, state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0
        if isinstance(err, NotFound):
            log.warning("node %s not found (is --node right? the DaemonSet passes spec.nodeName); "
                        "asking again in %.0fs: %s", self.node, wait, err)
        else:
            log.warning("API server not answering (attempt %d; %d sightings waiting); retrying in %.1fs: %s",
                        state.attempt_number, len(self.pending), wait, err)

    # --- both ------------------------------------------------------------------------------------

    def run(self, poll: float = 0.2) -> None:
        """Read and report until `stop` is set. Raises AgentFailed for what retrying cannot fix."""
        self.read_backlog()
        failure: list[BaseException] = []
        reporter = threading.Thread(target=self._report_loop, args=(failure,), name="agent-reporter", daemon=True)
        reporter.start()
        while not self.stopping.is_set():
            self.read()
            self.stopping.wait(poll)
        self._wake.set()
        reporter.join(timeout=30)
        if len(self.pending):
            log.warning("stopping with %d sightings not reported%s", len(self.pending),
                        "; the next start reads them again" if self.kernel_log.replays else "")
        if failure:
            raise AgentFailed(f"node {self.node}: {failure[0]}") from failure[0]

    def _report_loop(self, failure: list[BaseException]) -> None:
        try:
            self.connect()
            while not self.stopping.is_set():
                self._wake.clear()
                self.report_pending()
                self._wake.wait(1.0)
        except (TemporaryError, NotFound):
            pass  # retried until a stop was asked for
        except PermanentError as e:
            log.error("the API server refused, and retrying will not help: %s", e)
            failure.append(e)
        except Exception as e:  # noqa: BLE001 - a bug: stop the agent with it rather than go deaf
            log.exception("the reporter failed")
            failure.append(e)
        finally:
            self.stopping.set()
