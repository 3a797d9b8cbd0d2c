"""The runtime: watch the nodes, feed the pure core, execute its actions, persist each phase.

    NodeCache (list + watch, wakes the loop when a node's view changes)
        │
        ▼
    Runtime.run_pass: observe ─► detect (gates) ─► per record: gather facts ─► plan_step ─► execute ─► persist

Level-based: every pass compares the wanted and the observed state, so a missed event or a
restart heals itself. Only the leader runs passes.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable

from fleetspec import labels
from fleetspec.models import FleetSpec

from . import decide as core
from .errors import PermanentError, TemporaryError
from .kube import Kube
from .metrics import Metrics
from .model import (
    Action, Cordon, DownSlurm, DrainSlurm, EvictPods, JobView, NodeView, Notify, PromoteSpare, Quarantine, Record,
    RecordFacts, ReleaseJobs, RequestCapacity, RequeueJobs, ResumeSlurm, ReturnToSpares, SignalJobs,
)
from .notify import Message, Notifier
from .observe import evictable, node_view, opted_out
from .phases import Phase
from .providers import NodeProvider, slurm_call
from .records import RecordStore
from .slurm import SlurmClient

log = logging.getLogger(__name__)
MAX_RETRIES = 6
CHAIN_LIMIT = 25  # immediate steps of one record in one pass
PASS_BUDGET = 1.0  # seconds of record steps in one pass; then a new pass detects faults that came meanwhile


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class NodeCache:
    """Every node's view, kept current by a watch. Heartbeats change nothing the core sees,
    so they wake nobody: the cost of one fault does not grow with the fleet."""

    def __init__(self, kube: Kube, condition_types: list[str], wake: threading.Event | None = None):
        self.kube, self.condition_types = kube, condition_types
        self.wake = wake or threading.Event()
        self.raw: dict[str, dict] = {}
        self.views: dict[str, NodeView] = {}
        self.version = ""
        self.changed_at: float | None = None
        self.lock = threading.Lock()

    def sync(self) -> None:
        items, self.version = self.kube.list_nodes()
        with self.lock:
            self.raw = {n["metadata"]["name"]: n for n in items}
            self.views = {name: node_view(n, self.condition_types) for name, n in self.raw.items()}
        self._wake()

    def apply(self, kind: str, node: dict) -> None:
        self.version = node["metadata"].get("resourceVersion", self.version)
        if kind == "BOOKMARK":
            return  # a bookmark carries only the resourceVersion (no name)
        name = node["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.raw.pop(name, None)
                changed = self.views.pop(name, None) is not None
            else:
                self.raw[name] = node
                view = node_view(node, self.condition_types)
                changed = self.views.get(name) != view
                self.views[name] = view
        if changed:
            self._wake()

    def _wake(self) -> None:
        if self.changed_at is None:
            self.changed_at = time.monotonic()
        self.wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if not self.version:
                    self.sync()
                for kind, node in self.kube.watch_nodes(self.version, timeout_seconds=60):
                    self.apply(kind, node)
                    if stop.is_set():
                        return
            except (TemporaryError, PermanentError) as e:
                log.warning("node watch interrupted (%s); listing again", e)
                self.version = ""
                stop.wait(1.0)
            except Exception:  # noqa: BLE001 - the watch must outlive any surprise; a relist heals it
                log.exception("node watch failed; listing again")
                self.version = ""
                stop.wait(1.0)

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="node-watch", daemon=True)
        t.start()
        return t

    def list_views(self) -> list[NodeView]:
        with self.lock:
            return list(self.views.values())

    def get(self, name: str) -> dict | None:
        with self.lock:
            return self.raw.get(name)


class Runtime:
    def __init__(self, spec: FleetSpec, kube: Kube, cache: NodeCache, store: RecordStore,
                 slurm: SlurmClient | None, providers: dict[str, NodeProvider], notifier: Notifier,
                 metrics: Metrics | None = None, clock: Callable[[], datetime] = utcnow, dry_run: bool = False):
        self.spec, self.kube, self.cache, self.store = spec, kube, cache, store
        self.slurm, self.providers, self.notifier = slurm, providers, notifier
        self.metrics = metrics or Metrics()
        self.clock, self.dry_run = clock, dry_run or spec.healing.dry_run
        self.max_retries, self.retry_base = MAX_RETRIES, 0.5  # backoff: retry_base * 2**n seconds, capped at 30
        self.signals: dict[str, tuple[datetime, ...]] = {}
        self.paged: set[str] = set()
        self.claimed: dict[str, str] = {}  # spare -> the live record that chose it (the cache may lag)
        self.ended = 0  # records that stopped holding capacity in this pass
        self.latest: dict[str, Record] = {}  # this pass's live records as last written

    # --- one pass --------------------------------------------------------------------------------

    def run_pass(self) -> float | None:
        """Observe, decide and act once. Returns seconds until a record wants another look."""
        seen_at, self.cache.changed_at = self.cache.changed_at, None
        nodes = self.cache.list_views()
        self.metrics.nodes.set(len(nodes))
        records = self.store.list()
        now = self.clock()
        for n in nodes:  # remember distinct signals, for the `occurrences` threshold
            if n.fault and n.fault.since not in self.signals.get(n.name, ()):
                self.signals[n.name] = self.signals.get(n.name, ())[-9:] + (n.fault.since,)

        detection = core.detect(nodes, records, self.spec, now, self.signals)
        self._gates(detection.gates)
        for new in detection.started:
            if self.store.create(new.record):
                log.info("remediation started", extra=self._ctx(new.record))
                self.metrics.started.labels(new.record.pool, str(new.record.xid)).inc()
                records.append(new.record)
                self._run_actions(new.actions, new.record)
        for action in detection.actions:
            self._run_actions((action,), None)
        if seen_at is not None and (detection.started or detection.gates):
            self.metrics.reaction.observe(time.monotonic() - seen_at)

        self.ended = 0
        waits = self.advance_all(core.active_records(records))
        if self.ended and any(g.reason == "MaxConcurrent" for g in detection.gates):
            waits.append(0.0)  # capacity freed after this pass's detection: start the held faults now, not when idle
        self.metrics.in_progress.set(sum(1 for r in self.latest.values() if r.phase.holds_capacity))
        waits = [w for w in waits if w is not None]
        return min(waits) if waits else None

    def advance_all(self, records: list[Record]) -> list[float | None]:
        """Move the live records (oldest first) as far as they can go now. New ones take their first
        step (the cordon) before any record goes further, so in a storm every faulted node is
        cordoned within seconds; after PASS_BUDGET seconds the pass ends and asks for another at once
        (0), so a fault that arrived meanwhile is detected without waiting for every replacement."""
        self.claimed = {r.replacement: r.name for r in records if r.replacement}
        self.latest = {r.name: r for r in records}
        waits: list[float | None] = []
        going: list[Record] = []
        for r in records:
            out = self._step(r) if r.phase is Phase.DETECTED else r
            (going if isinstance(out, Record) else waits).append(out)
        deadline = time.monotonic() + PASS_BUDGET
        for r in going:
            if time.monotonic() > deadline:
                return waits + [0.0]
            waits.append(self.advance(r))
        return waits

    def advance(self, record: Record) -> float | None:
        """Move one record as far as it can go now."""
        for _ in range(CHAIN_LIMIT):
            out = self._step(record)
            if not isinstance(out, Record):
                return out
            record = out
        return 0.5

    def _step(self, record: Record) -> Record | float | None:
        """One step of one record: the record when it can go on at once; else seconds until it
        wants another look (None: on the next event)."""
        doing = "observe"
        try:
            step = core.plan_step(record, self.facts(record), self.spec, self.clock())
            doing = step.actions[0].kind if step.actions else "step"
            self._run_actions(step.actions, record)
        except TemporaryError as e:
            return self._retry(record, e, doing)
        except PermanentError as e:
            self.metrics.action_errors.labels(doing, "permanent").inc()
            step = core.fail(record, str(e), self.clock())
            self._run_actions(step.actions, record, best_effort=True)
        if step.record is None:
            return step.recheck_after
        moved = step.record.phase is not record.phase
        self.store.update(step.record)
        self.latest[step.record.name] = step.record
        if moved:
            self._observe_move(record, step.record)
        record = step.record
        self._claim(record)
        if record.phase.terminal or record.phase is Phase.OPTED_OUT:
            self.ended += 1
            return None
        if not moved and step.recheck_after not in (None, 0):
            return step.recheck_after
        return record

    def _claim(self, record: Record) -> None:
        """Keep `claimed` current: a live record's chosen spare is nobody else's, even before the
        node cache shows it promoted (two records of one pass would otherwise pick the same spare)."""
        for spare in [s for s, owner in self.claimed.items() if owner == record.name]:
            del self.claimed[spare]
        if record.replacement and not record.phase.terminal:
            self.claimed[record.replacement] = record.name

    def _retry(self, record: Record, err: Exception, doing: str) -> float | None:
        """A temporary failure: count it on the record (so a restart keeps counting) and back
        off; past max_retries the remediation ends in Failed and the user is told."""
        self.metrics.action_errors.labels(doing, "temporary").inc()
        retries = record.retries + 1
        log.warning("temporary failure (%d/%d): %s", retries, self.max_retries, err, extra=self._ctx(record))
        if retries >= self.max_retries:
            fail = core.fail(record, f"gave up after {retries} attempts: {err}", self.clock())
            self._run_actions(fail.actions, record, best_effort=True)
            self.store.update(fail.record)
            self.latest[fail.record.name] = fail.record
            self._observe_move(record, fail.record)
            self.ended += 1
            return None
        self.store.update(replace(record, retries=retries))
        return min(30.0, self.retry_base * 2 ** retries)

    def _observe_move(self, old: Record, new: Record) -> None:
        now = self.clock()
        entered = old.entered(old.phase) or old.created
        self.metrics.phase_seconds.labels(old.phase.value).observe((now - entered).total_seconds())
        log.info("phase %s -> %s", old.phase.value, new.phase.value, extra=self._ctx(new))
        if new.phase.terminal:
            outcome = new.phase.value.lower()
            self.metrics.remediations.labels(str(new.xid), outcome).inc()
            if new.phase is Phase.SUCCEEDED:
                self.metrics.time_to_healthy.observe((now - new.created).total_seconds())

    def _gates(self, gates) -> None:
        held: dict[str, int] = {}
        active = set()
        for g in gates:
            held[g.reason] = held.get(g.reason, 0) + len(g.held_nodes)
            key = f"{g.reason}:{g.pool}"
            active.add(key)
            if key not in self.paged:  # once per gate, not once per pass
                self.paged.add(key)
                log.warning("gate %s: %s", g.reason, g.message)
                if g.reason == "TooManyUnhealthy":
                    self.notifier.send(Message("storm", "critical", g.message))
                    self.kube.event({"kind": "ConfigMap", "name": f"gpufleet-pool-{g.pool}", "apiVersion": "v1",
                                     "namespace": self.notifier.namespace}, g.reason, g.message, "Warning",
                                    self.notifier.namespace)
        self.paged &= active
        for reason in ("TooManyUnhealthy", "MaxConcurrent", "HealingDisabled"):
            self.metrics.held.labels(reason).set(held.get(reason, 0))

    # --- observation for one record ---------------------------------------------------------------

    def facts(self, r: Record) -> RecordFacts:
        if r.phase in (Phase.SLURM_DRAINING, Phase.CHECKPOINTING) and self.slurm is not None:
            jobs = slurm_call(self.slurm.jobs_on_node, r.node)
            return RecordFacts(jobs_on_node=tuple(JobView(j.job_id, j.state) for j in jobs))
        if r.phase in (Phase.REQUEUED, Phase.EVICTING):
            pods = self.kube.pods_on_node(r.node)
            left = tuple(sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in evictable(pods)))
            return RecordFacts(opted_out_pods=opted_out(pods, self.spec.healing.opt_out_label), pods_left=left)
        if r.phase in (Phase.REPLACING, Phase.WAITING_FOR_SPARE):
            taken = {s for s, owner in self.claimed.items() if owner != r.name}
            return RecordFacts(spares=tuple(s for s in self.spares(r.pool) if s not in taken))
        if r.phase is Phase.RESUMING and r.replacement:
            node = self.cache.get(r.replacement)
            ready = node is not None and self.providers[r.pool].replacement_ready(node)
            return RecordFacts(replacement_ready=ready)
        return RecordFacts()

    def spares(self, pool: str) -> tuple[str, ...]:
        return tuple(sorted(
            n.name for n in self.cache.list_views()
            if n.pool == pool and n.is_spare and n.ready and n.fault is None and not n.unschedulable
        ))

    # --- actions ----------------------------------------------------------------------------------

    def _run_actions(self, actions: tuple[Action, ...], record: Record | None, best_effort: bool = False) -> None:
        for a in actions:
            if self.dry_run and not isinstance(a, Notify):
                log.info("dry run: would %s", a, extra=self._ctx(record))
                continue
            try:
                self.execute(a, record)
            except (TemporaryError, PermanentError) as e:
                if not best_effort:
                    raise
                log.error("%s failed: %s", a.kind, e, extra=self._ctx(record))

    def execute(self, a: Action, r: Record | None) -> None:
        pool = r.pool if r else None
        match a:
            case Notify():
                self.notifier.send(Message(a.event, a.severity, a.text, r))
            case Cordon():
                self.kube.cordon(a.node, a.reason)
                if r is not None:
                    self.kube.patch_node(a.node, {"metadata": {"annotations": {labels.REMEDIATION: r.name}}})
            case DrainSlurm():
                self._slurm(lambda s: s.drain(a.node, a.reason))
            case SignalJobs():
                self._slurm(lambda s: s.signal_jobs(a.job_ids, a.signal))
            case RequeueJobs():
                self._slurm(lambda s: s.requeue(a.job_ids))
            case DownSlurm():
                self._slurm(lambda s: s.down(a.node, a.reason))
            case ResumeSlurm():
                self._slurm(lambda s: s.resume(a.node))
            case ReleaseJobs():
                self._slurm(lambda s: s.release(a.job_ids))
            case EvictPods():
                for p in evictable(self.kube.pods_on_node(a.node)):
                    self.kube.evict(p)
            case PromoteSpare():
                self.providers[pool].promote(a.spare, a.replaces)
            case Quarantine():
                self.providers[pool].quarantine(a.node, a.xid)
            case RequestCapacity():
                self.providers[a.pool].request_capacity(a.pool, a.reason)
            case ReturnToSpares():
                view = self.cache.views.get(a.node)
                self.providers[view.pool].return_to_spares(a.node)  # type: ignore[union-attr]
            case _:
                raise PermanentError(f"unknown action {a!r}")

    def _slurm(self, call) -> None:
        if self.slurm is not None:
            slurm_call(call, self.slurm)

    @staticmethod
    def _ctx(r: Record | None) -> dict:
        return {"remediation": r.name, "node": r.node, "phase": r.phase.value} if r else {}

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event, leading: threading.Event | None = None, idle: float = 30.0) -> None:
        """Pass after pass: on a node change, when a record asks for it, or every `idle` seconds."""
        wait = 0.0
        while not stop.is_set():
            self.cache.wake.wait(timeout=wait)
            self.cache.wake.clear()
            if stop.is_set():
                return
            if leading is not None and not leading.is_set():
                wait = 1.0
                continue
            try:
                nxt = self.run_pass()
            except (TemporaryError, PermanentError) as e:
                log.error("pass failed: %s", e)
                nxt = 2.0
            wait = idle if nxt is None else max(0.05, nxt)
            self.metrics.last_pass = time.monotonic()
