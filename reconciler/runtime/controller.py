"""The runtime: informers feed a work queue keyed by node; N workers reconcile one node at a time.

    informers (nodes, pods, remediations) ──► WorkQueue[node name] ──► N workers ──► reconcile(node):
        observe (caches, Slurm) ─► core (detect | plan_step | retry) ─► fence ─► act ─┐
            ▲── the step carries (Step.carry) and the next follows at once ◄──────────┤
        persist once, with the once-only actions noted ─► run those ─► requeue at the time the core asks for

One reconcile takes the steps of one node's remediation that follow from each other now and ends
with one write (a remediation of 8 phases takes about 5), so a slow or hanging call (Slurm, the API
server, a webhook) delays only its own node. Nothing is decided before every cache has finished its
first list. Admission (the brake, max_concurrent) and the choice of a spare are taken under one lock,
with the steps being applied counted, so no slot and no spare is given twice. Every action is fenced:
a replica that no longer holds the Lease does nothing.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable

from fleetspec import labels
from fleetspec.models import FleetSpec

from reconciler.core import decide as core
from reconciler.core import ledger, lending
from reconciler.errors import PermanentError, TemporaryError
from reconciler.core.identity import comment_node, slurm_nodes_on
from reconciler.runtime.informers import Informer
from reconciler.adapters.kube import Kube
from reconciler.runtime.metrics import Metrics
from reconciler.core.model import (
    Action, CarryDrain, Cordon, DeletePods, DrainSlurm, EndLoan, EvictBorrowers, EvictPods, Gate, JobView, Lend, NodeView, Notify,
    PendingJob, PodView, PromoteSpare, Quarantine, Record, RecordFacts, ReleaseJobs, RequestCapacity, RequeueJobs,
    ResumeSlurm, ReturnToSpares, SignalJobs, SlurmNodeView, StartReclaim, Step,
)
from reconciler.adapters.notify import Message, Notifier
from reconciler.core.observe import (
    borrower_views, evictable_views, membership_dict, node_view, opted_out_views, pod_view,
)
from reconciler.core.phases import Phase
from reconciler.core.retention import expired_records
from reconciler.adapters.providers import NodeProvider, reconcile_membership, slurm_call
from reconciler.adapters.records import RecordStore, Unreadable
from reconciler.adapters.slurm import SlurmClient, SlurmError
from reconciler.runtime.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)
RESYNC_SECONDS = 300.0  # every node with a fault or a live record is looked at again (level-based safety net)
MEMBERSHIP = "membership:"  # the queue key of the pool-membership pass (not a node name: it has a colon)
MEMBERSHIP_EVERY = 30.0
LENDING = "lending:"  # the queue key of the lending pass over every pool
LENDING_IDLE = 10.0  # no pool lends: look again this often (a spec that starts lending is a new deployment)
LENDING_HOLD = 2.0  # a node a lending pass just changed is not chosen as a spare for this long (cache lag)
RETENTION = "retention:"  # the queue key of the pass that deletes expired records (core/retention.py)
RETENTION_EVERY, RETENTION_BATCH = 3600.0, 50
UNSYNCED_RECHECK = 0.5
# Phases whose observation asks Slurm (`Runtime._observe`).
ASKS_SLURM = frozenset({Phase.SLURM_DRAINING, Phase.CHECKPOINTING, Phase.REPLACING, Phase.WAITING_FOR_SPARE,
                        Phase.RESUMING})
MAX_CARRIED = 12  # steps one reconcile takes at most before it writes (a bound, not a rule: no path is this long)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class NotLeader(Exception):
    """This replica does not hold the Lease (any more): act on nothing."""


def needs_placing(old: NodeView | None, new: NodeView | None) -> bool:
    """Whether a node change asks for a membership pass soon: a node joined, lost its pool or role,
    or became a spare (capacity requests settle on spares). gpufleet's own relabels of members
    (promote, quarantine) do not: each pass reads every node, which at 10,000 nodes costs more CPU
    than the rest of a remediation."""
    if new is None or old is not None and old.labels == new.labels:
        return False
    return old is None or not new.pool or not new.role or (new.is_spare and not old.is_spare)


class Runtime:
    def __init__(self, spec: FleetSpec, kube: Kube, store: RecordStore, slurm: SlurmClient | None,
                 providers: dict[str, NodeProvider], notifier: Notifier, metrics: Metrics | None = None,
                 clock: Callable[[], datetime] = utcnow, dry_run: bool = False,
                 fence: Callable[[], bool] = lambda: True, queue: WorkQueue | None = None):
        self.spec, self.kube, self.store = spec, kube, store
        self.slurm, self.providers, self.notifier = slurm, providers, notifier
        self.metrics = metrics or Metrics()
        self.clock, self.dry_run, self.fence = clock, dry_run or spec.healing.dry_run, fence
        self.queue = queue if queue is not None else WorkQueue()
        self.workers = spec.healing.reconciler.workers
        conditions = list(spec.healing.condition_types)
        opt_out = spec.healing.opt_out_label
        self.nodes: Informer[NodeView] = Informer(
            "nodes", lambda c: kube.list_page("nodes", 500, c), lambda rv: kube.watch("nodes", rv),
            lambda o: node_view(o, conditions), indexers={"pool": lambda v: [v.pool] if v.pool else []},
            on_change=self._node_changed)
        self.pods: Informer[PodView] = Informer(
            "pods", lambda c: kube.list_page("pods", 500, c), lambda rv: kube.watch("pods", rv),
            lambda o: pod_view(o, opt_out), key=lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}",
            indexers={"node": lambda p: [p.node] if p.node else [],
                      "slurm": lambda p: [h] if (h := p.label(labels.SLINKY_POD_HOSTNAME)) else []},
            on_change=self._pod_changed)
        self.records: Informer[Record | Unreadable] = Informer(
            "remediations", lambda c: kube.list_page("remediations", 500, c), lambda rv: kube.watch("remediations", rv),
            store.observe,
            indexers={"node": lambda r: [r.node] if r.node else [],
                      "replacement": lambda r: [r.replacement] if isinstance(r, Record) and r.replacement else [],
                      "phase": lambda r: [r.phase] if isinstance(r, Record) else []},
            on_change=self._record_changed,
            accept=lambda old, new: not (isinstance(old, Record) and isinstance(new, Record)
                                         and new.revision < old.revision))
        self.informers = (self.nodes, self.pods, self.records)
        self._admission = threading.Lock()
        self._applying: dict[str, Record] = {}  # steps being applied, counted by admission before they persist
        self._lending_now: dict[str, float] = {}  # nodes a lending pass is changing -> until (monotonic)
        self._ledgers: dict[str, ledger.PoolLedger] | None = None  # as last read or written; None: read it first
        self._ledger_retry = 0.0  # monotonic: when to look for a missing ledger ConfigMap again
        self._paged: set[str] = set()
        self._reported: set[str] = set()

    # --- events into the queue ----------------------------------------------------------------------

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def _node_changed(self, name, old: NodeView | None, new: NodeView | None) -> None:
        # A new fault goes to the front of the queue: containment before anyone's later steps.
        self.queue.add(name, front=new is not None and new.fault is not None and (old is None or old.fault != new.fault))
        if needs_placing(old, new):
            self.queue.add_after(MEMBERSHIP, 1.0)  # place it soon (else the periodic pass looks)
        for r in self.records.by_index("replacement", name):
            self.queue.add(r.node)
        if new is not None and new.is_spare and new.ready and new.pool:
            self._wake(Phase.WAITING_FOR_SPARE, new.pool)

    def _pod_changed(self, key, old: PodView | None, new: PodView | None) -> None:
        for p in (old, new):
            if p is not None and p.node:
                self.queue.add(p.node)
                for r in self.records.by_index("replacement", p.node):
                    self.queue.add(r.node)

    def _record_changed(self, name, old, new) -> None:
        for r in (old, new):
            if r is not None and r.node:
                self.queue.add(r.node)
        was = isinstance(old, Record) and old.phase.holds_capacity
        if was and not (isinstance(new, Record) and new.phase.holds_capacity):
            self._wake(Phase.HELD)  # a slot came free

    def _wake(self, phase: Phase, pool: str | None = None) -> None:
        for r in self.records.by_index("phase", phase):
            if pool is None or r.pool == pool:
                self.queue.add(r.node)

    def resync(self) -> None:
        """Queue every node that has a fault or a live record, and the membership, lending and retention passes."""
        self.queue.add(MEMBERSHIP)
        self.queue.add(LENDING)
        self.queue.add(RETENTION)
        for n in self.nodes.values():
            if n.fault is not None or n.role == labels.ROLE_QUARANTINED:
                self.queue.add(n.name)
        for r in self.records.values():
            if r.node and (isinstance(r, Unreadable) or r.active):
                self.queue.add(r.node)

    # --- one node -----------------------------------------------------------------------------------

    def reconcile(self, node: str) -> float | None:
        """One step for one node. Returns seconds until it wants another look (None: on an event)."""
        if not self.synced():
            return UNSYNCED_RECHECK  # a decision on a half-filled cache sees no spares and no records
        if node == MEMBERSHIP:
            return self._membership()
        if node == LENDING:
            return self._lending()
        if node == RETENTION:
            return self._retention()
        mine = self.records.by_index("node", node)
        bad = [r for r in mine if isinstance(r, Unreadable)]
        if bad:
            self._report_unreadable(node, bad)
            return None
        pools = {p.name for p in self.spec.pools}
        records = [r for r in mine if isinstance(r, Record) and r.pool in pools]  # others are not this fleet's
        live = sorted((r for r in records if r.active), key=lambda r: (r.created, r.name))
        if not live:
            return self._detect(node, records)
        record = live[0]
        now = self.clock()
        if record.next_attempt and now < record.next_attempt:
            return (record.next_attempt - now).total_seconds()
        return self._advance(record)

    def _detect(self, node: str, records: list[Record]) -> float | None:
        view = self.nodes.get(node)
        if view is None:
            return None
        now = self.clock()
        signals = view.signals
        if self.spec.healing.occurrences > 1 and view.fault is not None and view.fault.since not in signals:
            # Remember the signal on the node itself, so a restart keeps counting.
            signals = signals[-9:] + (view.fault.since,)
            self._fenced()
            self.kube.patch_node(node, {"metadata": {"annotations": {labels.SIGNALS: json.dumps(
                [t.isoformat() for t in signals])}}})
        d = core.detect(view, records, self.spec, now, signals)
        for a in d.actions:
            self._run(a, None)
        if d.gate is not None:
            self._gate(d.gate)
        if d.record is None:
            return None
        delay = self._advance(d.record, stored=False)  # contain at once: the cordon is the first step
        if delay == 0.0:
            self.queue.add(node, soon=True)  # its next step (admission, or containment's rest) after new faults
        return delay

    def _advance(self, record: Record, stored: bool = True) -> float | None:
        """The steps of one remediation that follow from each other now, ended by one write (a new
        record's containment by two: its create, before the first Slurm call, and the end of containment).

        A step the core lets carry is written with the next; one that does not ends the reconcile with
        its write. Its actions run only on top of a written record: when something carried is not
        written yet, that is written first and the step is planned again (level-based, so from what is
        then seen). A new record is also written before its first Slurm call, and goes on. Once-only
        actions run after the write that notes them as begun, so a crash repeats idempotent actions at
        most, never a page or a SIGTERM."""
        current, once, dirty = record, [], not stored
        step: Step | None = None
        doing = "observe"
        try:
            for _ in range(MAX_CARRIED):
                if not stored and current.phase in ASKS_SLURM:
                    # A new record is written (and its page sent) before its first Slurm call, so a Slurm
                    # that hangs delays neither; its containment then goes on in this reconcile.
                    written = self._flush(current, False, once)
                    if written is None:
                        self._forget_applying(record.name)
                        return 0.0  # made already (another replica, or before a restart): the informer brings it
                    current, stored, dirty, once = written, True, False, []
                doing = "observe"
                step = self._plan(current)
                if step.gate is not None:
                    self._gate(step.gate)
                if dirty and step.record is not None and not step.carry and step.actions:
                    with self._admission:
                        self._applying[current.name] = current  # not the step it will not apply now
                    step = Step(recheck_after=0.0)  # write what was carried; this step next time
                    break
                doing = step.actions[0].kind if step.actions else "persist"
                for a in step.actions:
                    if a.once is None:
                        self._run(a, current)
                    elif a.once not in current.intents and all(a.once != b.once for b in once):
                        once.append(a)
                if step.record is None:
                    break
                new = replace(step.record, revision=current.revision,
                              intents=tuple(dict.fromkeys(current.intents + step.record.intents)))
                if new.phase is not current.phase:
                    self._observe_move(current, new)
                current, dirty = new, True
                with self._admission:
                    self._applying[current.name] = current
                if not step.carry or current.phase.terminal or current.next_attempt is not None:
                    break
            else:
                step = Step(recheck_after=0.0)
        except NotLeader:
            self._forget_applying(record.name)
            raise
        except (TemporaryError, PermanentError) as e:
            kind = "temporary" if isinstance(e, TemporaryError) else "permanent"
            self.metrics.action_errors.labels(doing, kind).inc()
            log.warning("%s failure (%s): %s", kind, doing, e, extra=self._ctx(current))
            step = (core.retry(current, f"{doing}: {e}", self.spec, self.clock()) if isinstance(e, TemporaryError)
                    else core.fail(current, f"{doing}: {e}", self.clock()))
            once += [a for a in step.actions if a.once and a.once not in current.intents]
            if step.record is not None:
                old, current, dirty = current, replace(step.record, revision=current.revision), True
                if current.phase is not old.phase:
                    self._observe_move(old, current)
        try:
            if dirty or once:
                written = self._flush(current, stored, once)
                if written is None:
                    return 0.0  # made already (another replica, or before a restart): the informer brings it
                current = written
        finally:
            self._forget_applying(record.name)
        if current.phase.terminal or current.phase is Phase.OPTED_OUT:
            return None
        if current.next_attempt is not None:
            return max(0.0, (current.next_attempt - self.clock()).total_seconds())
        if step is not None and step.record is None:
            return step.recheck_after  # the last step waits: that is when to look again
        return 0.0 if current.phase is not record.phase else (step.recheck_after if step else None)

    def _plan(self, record: Record) -> Step:
        """Observe, then ask the core; admission and the choice of a spare under the admission lock,
        with the steps being applied counted (so no slot and no spare is given twice)."""
        observed = self._observe(record)
        if record.phase in (Phase.REQUEUED, Phase.HELD, Phase.REPLACING, Phase.WAITING_FOR_SPARE):
            with self._admission:
                facts = self._shared(record, observed)
                step = core.plan_step(record, facts, self.spec, self.clock())
                if step.record is not None:
                    self._applying[record.name] = step.record
                return step
        return core.plan_step(record, observed, self.spec, self.clock())

    def _forget_applying(self, name: str) -> None:
        with self._admission:
            self._applying.pop(name, None)

    def _flush(self, record: Record, stored: bool, once: list[Action]) -> Record | None:
        """Write the record with the once-only actions noted as begun, then run those (one that fails
        is logged, not repeated: it may have got through). The record as written; None when a create
        finds it made already."""
        record = replace(record, intents=tuple(dict.fromkeys(record.intents + tuple(a.once for a in once))))
        written = self._write(record, stored)
        if written is None:
            return None
        for a in once:
            try:
                self._run(a, written)
            except (TemporaryError, PermanentError) as e:
                self.metrics.action_errors.labels(a.kind, "once-only").inc()
                log.error("%s failed and is not repeated: %s", a.kind, e, extra=self._ctx(written))
        return written

    def _write(self, record: Record, stored: bool) -> Record | None:
        """Create or update the record (fenced); the record as written, None when a create finds it
        made already."""
        self._fenced()
        if not stored:
            if not self.store.create(record):
                return None
            log.info("remediation started", extra=self._ctx(record))
            self.metrics.started.labels(record.pool, str(record.xid)).inc()
        else:
            record = replace(record, revision=record.revision + 1)
            self.store.update(record)
        self.records.put(record.name, record)
        return record

    def _fenced(self) -> None:
        if not self.fence():
            raise NotLeader()

    def _membership(self) -> float:
        """Label and taint the pools' members as their providers know them; report GPU nodes of no pool."""
        self._fenced()
        if self.dry_run:
            return MEMBERSHIP_EVERY
        result = reconcile_membership(self.kube, self.spec, self.providers,
                                      [membership_dict(v) for v in self.nodes.values()])
        self.metrics.unlabelled.set(len(result.unlabelled_gpu_nodes))
        for name in result.unlabelled_gpu_nodes:
            if f"unlabelled:{name}" not in self._reported:
                self._reported.add(f"unlabelled:{name}")
                self.kube.event({"kind": "Node", "name": name, "apiVersion": "v1"}, "NodeInNoPool",
                                "a GPU node no pool claims: gpufleet does not heal it", "Warning")
        return MEMBERSHIP_EVERY

    def _retention(self) -> float:
        """Delete finished records no rule reads any more, a batch per pass (each delete fenced)."""
        self._fenced()
        if self.dry_run:
            return RETENTION_EVERY
        expired = expired_records([r for r in self.records.values() if isinstance(r, Record)], self.nodes.values(),
                                  self.spec.healing, {p.name for p in self.spec.pools}, self.clock())
        for r in expired[:RETENTION_BATCH]:
            self._fenced()
            self.store.delete(r)
            self.records.put(r.name, None)
        if expired:
            log.info("retention: deleted %d finished remediation records", min(len(expired), RETENTION_BATCH))
        return 1.0 if len(expired) > RETENTION_BATCH else RETENTION_EVERY

    # --- observation ------------------------------------------------------------------------------------

    def _pods_on(self, node: str) -> list[PodView]:
        return self.pods.by_index("node", node)

    def _slurm_view(self, name: str) -> SlurmNodeView | None:
        if self.slurm is None:
            return SlurmNodeView(name)
        try:
            n = self.slurm.node(name)
        except SlurmError as e:
            if e.temporary:
                raise TemporaryError(f"Slurm: {e}") from None
            return None  # unknown to Slurm (a dynamic node not registered yet, or gone)
        return SlurmNodeView(n.name, frozenset(n.states), n.reason, comment_node(getattr(n, "comment", "") or ""))

    def _slurm_views(self, names) -> tuple[SlurmNodeView, ...]:
        return tuple(v for v in (self._slurm_view(n) for n in sorted(set(names))) if v is not None)

    def _jobs(self, names) -> tuple[JobView, ...]:
        if self.slurm is None:
            return ()
        jobs: dict[int, JobView] = {}
        for name in names:
            for j in slurm_call(self.slurm.jobs_on_node, name):
                jobs[j.job_id] = JobView(j.job_id, j.state)
        return tuple(jobs.values())

    def _observe(self, r: Record) -> RecordFacts:
        """What this step needs to see, gathered outside the admission lock (it may call Slurm)."""
        phase = r.phase
        if phase is Phase.DETECTED:  # nothing from Slurm: containment must not wait for it
            names = slurm_nodes_on(r.node, self._pods_on(r.node))
            return RecordFacts(slurm_names=names.names, can_refill=self._can_refill(r) if r.was_spare else True)
        if phase in (Phase.SLURM_DRAINING, Phase.CHECKPOINTING):
            return RecordFacts(slurm=self._slurm_views(r.slurm_nodes), jobs_on_node=self._jobs(r.slurm_nodes))
        if phase in (Phase.REQUEUED, Phase.HELD):
            return RecordFacts(opted_out_pods=opted_out_views(self._pods_on(r.node), self.spec.healing.opt_out_label))
        if phase is Phase.EVICTING:
            left = evictable_views(self._pods_on(r.node))
            nodeset = tuple(sorted(p.key for p in left if p.label(labels.SLINKY_POD_HOSTNAME) is not None))
            # Jobs only once the drain timeout passed with NodeSet pods left (decide.end_eviction).
            late = bool(nodeset) and r.drain_deadline is not None and self.clock() >= r.drain_deadline
            return RecordFacts(pods_left=tuple(sorted(p.key for p in left)), nodeset_pods_left=nodeset,
                               jobs_on_node=self._jobs(r.slurm_nodes) if late else ())
        if phase in (Phase.REPLACING, Phase.WAITING_FOR_SPARE):
            spares = self._ready_spares(r.pool)
            on_spare = tuple((s, self._slurm_views(slurm_nodes_on(s, self._pods_on(s)).names)) for s in spares)
            lent = tuple(s for s in spares if (v := self.nodes.get(s)) is not None and v.on_loan)
            if r.replacement and r.replacement not in spares and (v := self.nodes.get(r.replacement)) and v.on_loan:
                lent += (r.replacement,)
            borrowers = tuple(p.key for p in borrower_views(self._pods_on(r.replacement))) if r.replacement else ()
            return RecordFacts(spares=spares, spare_slurm=on_spare, can_refill=self._can_refill(r), lent_spares=lent,
                               replacement_borrowers=borrowers)
        if phase is Phase.RESUMING and r.replacement:
            on_replacement = slurm_nodes_on(r.replacement, self._pods_on(r.replacement)).names
            moved = tuple(n for n in r.slurm_nodes
                          if any(p.node and p.node != r.node for p in self.pods.by_index("slurm", n)))
            return RecordFacts(replacement=self.nodes.get(r.replacement), replacement_slurm=on_replacement,
                               slurm_moved=moved, slurm=self._slurm_views(set(on_replacement) | set(moved)))
        return RecordFacts()

    def _shared(self, r: Record, observed: RecordFacts) -> RecordFacts:
        """Facts counted across nodes, under the admission lock, with the steps being applied."""
        pools = {p.name for p in self.spec.pools}
        records = {x.name: x for x in self.records.values() if isinstance(x, Record) and x.pool in pools}
        records.update(self._applying)
        if r.phase in (Phase.REQUEUED, Phase.HELD):
            a = core.admission_facts(r, self.nodes.by_index("pool", r.pool), records.values(), self.spec, self.clock())
            return replace(observed, admission=a)
        taken = {x.replacement for x in records.values() if x.replacement and x.active and x.name != r.name}
        now = time.monotonic()
        taken |= {n for n, until in self._lending_now.items() if until > now}  # a lending pass is changing them
        return replace(observed, spares=tuple(s for s in observed.spares if s not in taken))

    def _ready_spares(self, pool: str) -> tuple[str, ...]:
        return tuple(sorted(n.name for n in self.nodes.by_index("pool", pool)
                            if n.is_spare and n.ready and n.fault is None and not n.unschedulable))

    def _can_refill(self, r: Record) -> bool:
        check = getattr(self.providers[r.pool], "can_refill", None)
        return True if check is None else bool(check(r.pool))

    # --- actions ----------------------------------------------------------------------------------------

    def _run(self, a: Action, r: Record | None) -> None:
        if self.dry_run and not isinstance(a, Notify):
            log.info("dry run: would %s", a, extra=self._ctx(r))
            return
        self._fenced()
        self.execute(a, r)

    def execute(self, a: Action, r: Record | None) -> None:
        pool = r.pool if r else None
        match a:
            case Notify():
                self.notifier.send(Message(a.event, a.severity, a.text, r))
            case Cordon():
                self.kube.cordon(a.node, a.reason, remediation=r.name if r else None)
                log.info("cordoned", extra={**self._ctx(r), "node": a.node})
            case DrainSlurm():
                self._slurm(lambda s: s.drain(a.node, a.reason))
            case SignalJobs():
                self._slurm(lambda s: s.signal_jobs(a.job_ids, a.signal))
            case RequeueJobs():
                self._slurm(lambda s: s.requeue(a.job_ids))
            case ResumeSlurm():
                self._slurm(lambda s: s.resume(a.node))
            case ReleaseJobs():
                self._slurm(lambda s: s.release(a.job_ids))
            case EvictPods():
                for p in evictable_views(self._pods_on(a.node)):
                    self.kube.evict({"metadata": {"name": p.name, "namespace": p.namespace}})
            case PromoteSpare():
                self.providers[pool].promote(a.spare, a.replaces)
            case Quarantine():
                self.providers[pool].quarantine(a.node, a.xid)
            case RequestCapacity():
                self.providers[a.pool].request_capacity(a.pool, a.reason, a.key)
            case Lend():
                self.kube.lend(a.node, a.pool, a.loan, self.clock().isoformat())
                self._lending_event(a.node, "Lent", f"{a.node} lent to preemptible work ({a.loan})", "lent")
            case StartReclaim():
                self.kube.start_reclaim(a.node, self.clock().isoformat())
                self._lending_event(a.node, "Reclaiming", f"taking {a.node} back: {a.why}", "reclaim")
            case EvictBorrowers():
                for p in borrower_views(self._pods_on(a.node)):
                    if a.force:
                        self.kube.delete_pod(p.namespace, p.name)
                    elif not p.deleting:
                        self.kube.evict({"metadata": {"name": p.name, "namespace": p.namespace}}, a.grace_seconds)
                if a.force:
                    self._lending_event(a.node, "ReclaimForced", f"borrowers on {a.node} outlasted the {a.grace_seconds}s "
                                        "reclaim grace (a PodDisruptionBudget, or a slow exit): deleted", "forced",
                                        "Warning")
            case EndLoan():
                self._end_loan(a)
            case DeletePods():
                for key in a.pods:
                    namespace, _, name = key.partition("/")
                    self.kube.delete_pod(namespace, name, grace_seconds=30)
                log.info("deleted pods a stale PodDisruptionBudget protected", extra={**self._ctx(r), "pods": a.pods})
            case CarryDrain():
                self.kube.carry_drain(a.node, dict(a.drains))
                log.info("a person's Slurm drain carried to the faulted machine",
                         extra={**self._ctx(r), "node": a.node, "drains": dict(a.drains)})
            case ReturnToSpares():
                view = self.nodes.get(a.node)
                self.providers[view.pool].return_to_spares(a.node)  # type: ignore[union-attr]
            case _:
                raise PermanentError(f"unknown action {a!r}")

    def _end_loan(self, a: EndLoan) -> None:
        view = self.nodes.get(a.node)
        self.kube.end_loan(a.node, a.back_to_spare)
        if view is None or not view.on_loan:
            return
        now = self.clock()
        lent_for = (now - view.lent_since).total_seconds() if view.lent_since else 0.0
        if view.pool:
            self.metrics.gpu_seconds_lent.labels(view.pool).inc(max(0.0, lent_for) * view.gpus)
            if view.reclaiming is not None:
                self.metrics.reclaim_seconds.labels(view.pool).observe(max(0.0, (now - view.reclaiming).total_seconds()))
        self._lending_event(a.node, "Reclaimed", f"{a.node} is back from its loan after {lent_for:.0f}s"
                            + (" (to the spares)" if a.back_to_spare else ""), None)

    def _lending_event(self, node: str, reason: str, message: str, counted: str | None, type_: str = "Normal") -> None:
        view = self.nodes.get(node)
        if counted and view is not None and view.pool:
            self.metrics.lending_events.labels(view.pool, counted).inc()
        log.info("%s: %s", reason, message)
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, reason, message, type_)

    # --- lending ----------------------------------------------------------------------------------------

    def _lending(self) -> float:
        """One lending pass over the pools that lend (or still have nodes on loan): decide under the
        admission lock (so no spare is both lent and promoted), then act, fenced."""
        pools = [p for p in self.spec.pools
                 if p.lending is not None or any(n.on_loan for n in self.nodes.by_index("pool", p.name))]
        if not pools:
            return LENDING_IDLE
        self._fenced()
        slurm: dict[str, SlurmNodeView] = {}
        pending = []
        if self.slurm is not None:
            try:
                for n in slurm_call(self.slurm.nodes):
                    slurm[n.name] = SlurmNodeView(
                        n.name, frozenset(n.states), n.reason, comment_node(getattr(n, "comment", "") or ""),
                        partitions=tuple(n.partitions),
                        last_busy=datetime.fromtimestamp(n.last_busy, timezone.utc) if n.last_busy else None)
                pending = slurm_call(self.slurm.pending_jobs)
            except TemporaryError as e:
                # Without Slurm no idle node is lent or taken back (nothing is known of them); spares still
                # follow the floor, which needs only Kubernetes.
                log.warning("lending: Slurm unreachable (%s): idle nodes wait, spares go on", e)
                slurm, pending = {}, []
        recheck = LENDING_IDLE
        for pool in pools:
            recheck = min(recheck, self._lend_pool(pool, slurm, pending))
        return recheck

    def _lend_pool(self, pool, slurm: dict[str, SlurmNodeView], pending) -> float:
        nodes = tuple(sorted(self.nodes.by_index("pool", pool.name), key=lambda n: n.name))
        partitions = {p.name for p in self.spec.slurm.partitions if pool.name in p.pools}
        slurm_on, borrowers = [], []
        for n in nodes:
            pods = self._pods_on(n.name)
            names = slurm_nodes_on(n.name, pods).names
            slurm_on.append((n.name, tuple(slurm[x] for x in names if x in slurm)))
            if b := tuple(p.key for p in borrower_views(pods)):
                borrowers.append((n.name, b))
        waiting = tuple(PendingJob(j.job_id, tuple(j.partitions), j.node_count, j.reason, j.hold)
                        for j in pending if set(j.partitions) & partitions)
        with self._admission:
            records = {x.name: x for x in self.records.values() if isinstance(x, Record) and x.pool == pool.name}
            records.update({k: v for k, v in self._applying.items() if v.pool == pool.name})
            live = [r for r in records.values() if r.active]
            facts = lending.PoolFacts(
                pool.name, nodes, tuple(slurm_on), tuple(borrowers), waiting,
                remediated=frozenset(r.node for r in live),
                claimed=frozenset(r.replacement for r in live if r.replacement),
                waiting_for_spare=sum(1 for r in live if r.phase is Phase.WAITING_FOR_SPARE))
            plan = lending.plan_lending(facts, self.spec, self.clock())
            hold = time.monotonic() + 60.0
            touched = {getattr(a, "node", "") for a in plan.actions} - {""}
            for n in touched:
                self._lending_now[n] = hold
        try:
            for a in plan.actions:
                try:
                    self._run(a, None)
                except TemporaryError as e:  # one node's trouble: the others go on, the next pass retries
                    log.warning("lending %s on %s: %s", a.kind, getattr(a, "node", "?"), e)
                    self.metrics.action_errors.labels(a.kind, "temporary").inc()
        finally:
            with self._admission:
                until = time.monotonic() + LENDING_HOLD
                for n in touched:
                    self._lending_now[n] = until
                self._lending_now = {k: v for k, v in self._lending_now.items() if v > time.monotonic()}
        c = plan.capacity
        for state, value in (("active_busy", c.active_busy), ("active_idle", c.active_idle),
                             ("active_lent", c.active_lent), ("spares_lent", c.spares_lent),
                             ("spares_unlent", c.spares_unlent), ("quarantined", c.quarantined)):
            self.metrics.lending_nodes.labels(pool.name, state).set(value)
        self.metrics.gpus_lent.labels(pool.name).set(c.gpus_lent)
        self._write_ledger(pool.name, nodes, c)
        return plan.recheck_after

    def _write_ledger(self, pool: str, nodes: tuple[NodeView, ...], capacity: ledger.Capacity) -> None:
        """The pool's loans and capacity for `gpufleet capacity` (the lending ledger ConfigMap), written when
        they change. Level-based: loans open and close as the nodes show them, so a crash loses nothing."""
        if self.dry_run:
            return
        ns = self.notifier.namespace
        if self._ledgers is None:
            if time.monotonic() < self._ledger_retry:
                return
            try:
                data = self.kube.read_ledger(ns)
                self._ledgers = ledger.parse_data(data) if data is not None else None
            except ledger.LedgerError as e:
                log.error("%s: starting it again", e)
                self._ledgers = {}
            except TemporaryError as e:
                log.warning("lending ledger: %s", e)
                return
            if self._ledgers is None:
                log.warning("no ConfigMap %s/%s: loans are not recorded for `gpufleet capacity`",
                            ns, labels.LENDING_LEDGER)
                self._ledger_retry = time.monotonic() + 60
                return
        now = self.clock()
        old = self._ledgers.get(pool) or ledger.empty(now)
        new = old
        on_loan = {n.name: n for n in nodes if n.on_loan}
        for n in on_loan.values():
            kind = labels.LENT_SPARE if n.is_spare or n.lent == labels.LENT_SPARE else labels.LENT_IDLE
            new = ledger.open_loan(new, n.name, kind, n.gpus, n.lent_since or now)
        for name in new.lent_nodes():
            if name not in on_loan:
                new = ledger.close_loan(new, name, now)
        new = ledger.prune(new, now)
        if pool in self._ledgers and ledger.dump(ledger.record_capacity(new, capacity, old.at)) == ledger.dump(old):
            return
        new = ledger.record_capacity(new, capacity, now)
        self._fenced()
        try:
            self.kube.write_ledger(ns, pool, ledger.dump(new))
        except (TemporaryError, PermanentError) as e:
            log.warning("lending ledger of %s not written (the next pass tries again): %s", pool, e)
            return
        self._ledgers[pool] = new

    def _slurm(self, call) -> None:
        if self.slurm is not None:
            slurm_call(call, self.slurm)

    # --- telling people -----------------------------------------------------------------------------------

    def _observe_move(self, old: Record, new: Record) -> None:
        now = self.clock()
        entered = old.entered(old.phase) or old.created
        self.metrics.phase_seconds.labels(old.phase.value).observe((now - entered).total_seconds())
        log.info("phase %s -> %s", old.phase.value, new.phase.value, extra=self._ctx(new))
        if old.phase is Phase.REPLACING and new.reclaim_started is not None:
            self.metrics.heal_reclaim_wait.observe((now - new.reclaim_started).total_seconds())
        if new.phase.terminal:
            self.metrics.remediations.labels(str(new.xid), new.phase.value.lower()).inc()
            if new.phase is Phase.SUCCEEDED:
                self.metrics.time_to_healthy.observe((now - new.created).total_seconds())

    def _gate(self, g: Gate) -> None:
        """One page and one Event per gate and pool while it holds; the metric counts held nodes."""
        key = f"{g.reason}:{g.pool}"
        with self._admission:
            first = key not in self._paged
            self._paged.add(key)
        if first:
            log.warning("gate %s: %s", g.reason, g.message)
            if g.reason == "TooManyUnhealthy":
                self.notifier.send(Message("storm", "critical", g.message))
                self.kube.event({"kind": "ConfigMap", "name": f"gpufleet-pool-{g.pool}", "apiVersion": "v1",
                                 "namespace": self.notifier.namespace}, g.reason, g.message, "Warning",
                                self.notifier.namespace)

    def refresh_gauges(self) -> None:
        """Gauges from the caches; a gate that holds nothing any more may page again next time."""
        records = [r for r in self.records.values() if isinstance(r, Record)]
        self.metrics.nodes.set(len(self.nodes))
        self.metrics.in_progress.set(sum(1 for r in records if r.active and r.phase is not Phase.OPTED_OUT))
        held: dict[str, int] = {}
        for r in records:
            if r.phase is Phase.HELD:
                reason = r.held_reason or "MaxConcurrent"
                held[reason] = held.get(reason, 0) + 1
        for reason in ("TooManyUnhealthy", "MaxConcurrent", "HealingDisabled"):
            self.metrics.held.labels(reason).set(held.get(reason, 0))
        with self._admission:
            # with the steps being applied: a gate pages before its first Held record is persisted
            now = [r for r in self.records.values() if isinstance(r, Record)] + list(self._applying.values())
            pools = {r.pool for r in now if r.phase is Phase.HELD and r.held_reason == "TooManyUnhealthy"}
            self._paged = {k for k in self._paged if not k.startswith("TooManyUnhealthy:") or k.split(":", 1)[1] in pools}

    def _report_unreadable(self, node: str, bad: list[Unreadable]) -> None:
        for b in bad:
            if b.name in self._reported:
                continue
            self._reported.add(b.name)
            log.error("%s: node %s is left alone until the record is fixed or deleted", b.error, node)
            self.metrics.action_errors.labels("read-record", "permanent").inc()
            self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "RemediationUnreadable", b.error,
                            "Warning")

    @staticmethod
    def _ctx(r: Record | None) -> dict:
        return {"remediation": r.name, "node": r.node, "phase": r.phase.value} if r else {}

    # --- workers --------------------------------------------------------------------------------------------

    def process(self, key: str) -> None:
        """Reconcile one key taken from the queue, and requeue it as it asks."""
        try:
            delay = self.reconcile(key)
        except NotLeader:
            self.queue.add_after(key, 1.0)
        except (TemporaryError, PermanentError) as e:
            log.warning("reconcile %s: %s (backing off)", key, e)
            self.queue.add_failed(key)
        except Exception:  # noqa: BLE001 - one node's surprise must not stop the others
            log.exception("reconcile %s failed (backing off)", key)
            self.queue.add_failed(key)
        else:
            self.queue.forget(key)
            if delay is not None:
                self.queue.add_after(key, delay)
        finally:
            self.queue.done(key)

    def drain(self, max_items: int = 10_000) -> int:
        """Process the keys that are due now in this thread (tests and `--once`); returns how many."""
        n = 0
        while n < max_items:
            key = self.queue.get(timeout=0)
            if key is None:
                return n
            self.process(key)
            n += 1
        return n

    def _work(self, stop: threading.Event, leading: threading.Event | None) -> None:
        while not stop.is_set():
            if leading is not None and not leading.is_set():
                stop.wait(0.2)
                continue
            try:
                key = self.queue.get(timeout=0.5)
            except ShutDown:
                return
            if key is not None:
                self.process(key)

    def run(self, stop: threading.Event, leading: threading.Event | None = None) -> None:
        """Informers, N workers, and a resync; until `stop`."""
        for i in self.informers:
            i.start(stop)
        while not stop.is_set() and not self.synced():
            stop.wait(0.1)
        self.resync()
        threads = [threading.Thread(target=self._work, args=(stop, leading), name=f"worker-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        was_leading = leading is None or leading.is_set()
        last_resync = time.monotonic()
        while not stop.wait(1.0):
            self.refresh_gauges()
            self.metrics.last_pass = time.monotonic()
            now_leading = leading is None or leading.is_set()
            if (now_leading and not was_leading) or time.monotonic() - last_resync > RESYNC_SECONDS:
                self.resync()  # a new leader looks at everything once
                last_resync = time.monotonic()
            was_leading = now_leading
        self.queue.shut_down()
        for t in threads:
            t.join(timeout=5)
