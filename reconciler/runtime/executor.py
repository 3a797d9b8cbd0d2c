"""The only code that acts: every write to Kubernetes, Slurm, a node provider or a notification channel
goes through `Executor`. Each is fenced (a replica that no longer holds the Lease does nothing) and
checked against dry-run (then it is logged, never done). What was done is written through to the caches,
so the next step sees it.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from datetime import datetime
from typing import Callable

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.notify import Message, Notifier
from gpufleet.reconciler.adapters.providers import NodeProvider
from gpufleet.reconciler.adapters.records import RemediationStore
from gpufleet.reconciler.adapters.slurm import SlurmClient, call
from gpufleet.reconciler.core.actions import (
    Action, ApplyMembership, CarryDrain, Cordon, DeletePods, DeleteRemediation, DownSlurm, DrainSlurm, EndLoan,
    EvictBorrowers, EvictPods, Lend, MarkDegraded, NoteHolds, NoteJob, NoteSignals, Notify, NotifyOwner, PageOnce,
    PromoteSpare, Quarantine, ReleaseJobs, Report, RequestCapacity, RequeueJobs,
    GiveBack, ResumeSlurm, ReturnToSpares, SettleCapacityRequests, SettleRefill, SignalJobs, StartReclaim, WriteLedger,
)
from gpufleet.reconciler.core.model import RefillState, Remediation, Step
from gpufleet.reconciler.core.repair_actions import (
    BackInService, ForgetNode, MarkHealthy, NodeEvent, RecordCheck, RequestRepair, Retire, StartHealthCheck,
)
from gpufleet.reconciler.core.observe import membership_dict
from gpufleet.reconciler.core.active_checks import GiveBackFromCheck, ReserveForCheck, TakeForCheck
from gpufleet.reconciler.errors import NotFound, PermanentError, TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
DRY_RUN_REPEAT = 60.0  # seconds: a dry run logs the same intended action at most this often


class NotLeader(Exception):
    """This replica does not hold the Lease (any more): act on nothing."""


def context(r: Remediation | None) -> dict:
    return {"remediation": r.name, "node": r.node, "phase": r.phase.value} if r else {}


class Executor:
    def __init__(self, spec: FleetSpec, kube: Kube, store: RemediationStore, slurm: SlurmClient | None,
                 providers: dict[str, NodeProvider], notifier: Notifier, caches: Caches, metrics: Metrics,
                 clock: Callable[[], datetime], fence: Callable[[], bool] = lambda: True, dry_run: bool = False,
                 monotonic: Callable[[], float] = time.monotonic, checks=None):
        self.spec, self.kube, self.store, self.slurm = spec, kube, store, slurm
        self.checks = checks  # adapters/health_checks.HealthChecks: the health-check Jobs
        self.providers, self.notifier, self.caches, self.metrics = providers, notifier, caches, metrics
        self.clock, self.fence, self.dry_run, self.monotonic = clock, fence, dry_run, monotonic
        self._said: dict[str, float] = {}  # dry run: what was logged, when

    def fenced(self) -> None:
        if not self.fence():
            raise NotLeader()

    def _would(self, what: str, r: Remediation | None) -> None:
        now = self.monotonic()
        key = f"{r.name if r else ''}|{what}"
        if now - self._said.get(key, -DRY_RUN_REPEAT) >= DRY_RUN_REPEAT:
            self._said[key] = now
            log.info("dry run: would %s", what, extra=context(r))

    # --- remediations --------------------------------------------------------------------------------

    def create(self, r: Remediation) -> bool:
        """Create the remediation's object; False when it exists already (another replica, or before a restart)."""
        if self.dry_run:
            self._would(f"create remediation {r.name} of {r.node}", r)
            return True
        self.fenced()
        if not self.store.create(r):
            return False
        log.info("remediation started", extra=context(r))
        self.metrics.started.labels(r.pool, str(r.xid)).inc()
        return True

    def write_status(self, r: Remediation) -> Remediation:
        """Write the remediation's status; the remediation as written (its revision counted)."""
        written = replace(r, revision=r.revision + 1)
        if self.dry_run:
            self._would(f"write remediation {r.name}: {r.phase.value}", r)
            return written
        self.fenced()
        self.store.write_status(written)
        self.caches.remediation_written(written)
        return written

    # --- actions -------------------------------------------------------------------------------------

    def run(self, a: Action, r: Remediation | None = None) -> None:
        if self.dry_run:
            self._would(repr(a), r)
            return
        self.fenced()
        self._do(a, r)

    def run_or_defer(self, a: Action, what: str) -> bool:
        """Run a pass's action; a temporary error is one node's trouble, logged and counted, and the pass's next
        round tries again (the passes are level-based). False when it was deferred."""
        try:
            self.run(a)
            return True
        except TemporaryError as e:
            log.warning("%s: %s on %s: %s", what, a.kind, getattr(a, "node", "?"), e)
            self.metrics.action_errors.labels(a.kind, "temporary").inc()
            return False

    def _do(self, a: Action, r: Remediation | None) -> None:
        match a:
            case Notify():
                self.notifier.send(Message(a.event, a.severity, a.text, r))
            case NotifyOwner():
                self.notifier.send_to(a.route, Message(a.event, "info", a.text, r, job={
                    "job_id": a.job_id, "user": a.user, "account": a.account}))
            case NoteSignals():
                self.caches.node_written(self.kube.patch_node(a.node, {"metadata": {"annotations": {
                    labels.SIGNALS: json.dumps([t.isoformat() for t in a.signals])}}}))
            case Cordon():
                self.caches.node_written(self.kube.cordon(a.node, a.reason, remediation=a.remediation))
                log.info("cordoned", extra={**context(r), "node": a.node})
            case MarkDegraded():
                self.kube.set_condition(a.node, self.spec.healing.condition_types[0], "False", a.reason, a.message)
                log.warning("degraded: %s", a.message, extra={"node": a.node})
            case DrainSlurm():
                self._slurm(lambda s: s.drain(a.node, a.reason))
            case DownSlurm():
                self._slurm(lambda s: s.down(a.node, a.reason))
            case SignalJobs():
                self._slurm(lambda s: s.signal_jobs(a.job_ids, a.signal))
            case RequeueJobs():
                self._slurm(lambda s: s.requeue(a.job_ids))
            case NoteJob():
                self._slurm(lambda s: s.set_admin_comment(a.job_id, a.text))
            case ResumeSlurm():
                self._slurm(lambda s: s.resume(a.node))
            case ReleaseJobs():
                self._slurm(lambda s: s.release(a.job_ids))
            case EvictPods():
                for key in a.pods:
                    self._evict(key)
            case DeletePods():
                for key in a.pods:
                    namespace, name = key.split("/", 1)
                    # grace 0 (force): a lost machine's NodeSet pod, which its dead kubelet would never let go
                    # (kubernetes.io/docs/tasks/run-application/force-delete-stateful-set-pod/)
                    self.kube.delete_pod(namespace, name, grace_seconds=0 if a.force else 30)
                    self.caches.pod_leaving(key, 0 if a.force else 30)
                log.info("force-deleted the NodeSet pods of a machine that stopped answering" if a.force
                         else "deleted pods a stale PodDisruptionBudget protected", extra={**context(r), "pods": a.pods})
            case PageOnce():
                self.caches.node_written(self.kube.patch_node(a.node, {"metadata": {"annotations": {
                    labels.SLURM_DRAIN_PAGED: a.key}}}))
                self._do(a.page, r)
            case NoteHolds():
                self.caches.node_written(self.kube.patch_node(a.node, {"metadata": {"annotations": {
                    labels.PERSON_HOLDS: a.holds}}}))
                log.info("people's Slurm drains kept for the machine's Slurm nodes", extra={**context(r), "node": a.node,
                                                                                         "holds": a.holds})
            case CarryDrain():
                self.caches.node_written(self.kube.carry_drain(a.node, dict(a.drains)))
                log.info("a person's Slurm drain carried to the faulted machine",
                         extra={**context(r), "node": a.node, "drains": dict(a.drains)})
            case PromoteSpare():
                self.providers[a.pool].promote(a.spare, a.replaces)
            case Quarantine():
                self.providers[a.pool].quarantine(a.node, a.xid, repair=a.repair)
            case RequestCapacity():
                self.providers[a.pool].request_capacity(a.pool, a.reason, a.key)
                self.metrics.refills.labels(a.pool, "requested").inc()
            case SettleRefill():
                self._settle_refill(a, r)
            case ReturnToSpares():
                self.providers[a.pool].return_to_spares(a.node)
            case GiveBack():
                self.providers[a.pool].give_back(a.node, a.why)
                self.kube.event({"kind": "Node", "name": a.node, "apiVersion": "v1"}, "SpareGivenBack",
                                f"{a.node} given back: {a.why}", "Normal")
                log.info("spare %s given back: %s", a.node, a.why)
            case DeleteRemediation():
                if r is not None:
                    self.store.delete(r)
                self.caches.remediation_deleted(a.name)
            case ApplyMembership():
                if self.kube.apply_membership(a.node, dict(a.labels), [dict(t) for t in a.add_taints],
                                              dict(a.annotations), a.seen):
                    log.info("membership: %s: %s", a.node, a.why)
                else:
                    log.info("membership: %s changed since the plan (%s): planned again next pass", a.node, a.why)
            case SettleCapacityRequests():
                nodes = [membership_dict(v) for v in self.caches.nodes.values()]
                for p in {type(p): p for p in self.providers.values()}.values():  # one of each kind covers its pools
                    p.settle_capacity_requests(nodes)
            case Report():
                api = labels.API_VERSION if a.object_kind == remediation_crd.KIND else "v1"
                self.kube.event({"kind": a.object_kind, "name": a.name, "apiVersion": api}, a.reason, a.message,
                                "Warning")
            case Lend():
                self.kube.lend(a.node, a.pool, a.loan, self.clock().isoformat())
                self._lending_event(a.node, "Lent", f"{a.node} lent to preemptible work ({a.loan})", "lent")
            case StartReclaim():
                self.kube.start_reclaim(a.node, self.clock().isoformat())
                self._lending_event(a.node, "Reclaiming", f"taking {a.node} back: {a.why}", "reclaim")
            case EvictBorrowers():
                self._evict_borrowers(a)
            case EndLoan():
                self._end_loan(a)
            case WriteLedger():
                self.kube.write_ledger(self.notifier.namespace, a.pool, a.text)
            # --- the repair loop and validation before service (issue 25) ---
            case RequestRepair():
                self.providers[a.pool].request_repair(a.node, a.request)
                log.info("%s asked of %s (%s)", a.request.action, a.node, a.request.id, extra=context(r))
            case StartHealthCheck():
                if self.checks is None:
                    raise PermanentError("no health-check adapter: cannot check a node")
                self.checks.start(a.node, a.pool, a.job)
            case RecordCheck():
                self.caches.node_written(self.kube.patch_node(a.node, {"metadata": {"annotations": {
                    labels.HEALTH_CHECK: a.record.dumps()}}}))
            case MarkHealthy():
                self.kube.set_condition(a.node, self.spec.healing.condition_types[0], "True", "HealthCheckPassed",
                                        a.message)
            case BackInService():
                self.providers[a.pool].back_in_service(a.node)
            case Retire():
                self.providers[a.pool].retire(a.node, a.reason, a.refill)
            case ForgetNode():
                self.providers[a.pool].forget(a.node, a.pool, a.reason, a.refill)
            case NodeEvent():
                self.kube.event({"kind": "Node", "name": a.node, "apiVersion": "v1"}, a.reason, a.message, a.type)
            # --- active checks of idle capacity ---
            case ReserveForCheck():
                self._slurm(lambda s: s.reserve_for_maintenance(a.reservation, a.slurm_nodes, a.minutes))
            case TakeForCheck():
                self.caches.node_written(self.kube.take_for_check(a.node))
            case GiveBackFromCheck():
                self._give_back_from_check(a)
            case _:
                raise PermanentError(f"unknown action {a!r}")

    def _settle_refill(self, a: SettleRefill, r: Remediation | None) -> None:
        """Count what became of a refill; withdraw a failed one (nobody waits on it: the record and the page
        say it failed)."""
        self.metrics.refills.labels(a.pool, a.outcome.lower()).inc()
        if a.outcome == RefillState.FAILED:
            withdraw = getattr(self.providers[a.pool], "withdraw_capacity_request", None)
            if withdraw is not None:
                withdraw(a.pool, a.key)
            log.warning("refill failed: %s", a.message, extra=context(r))
        else:
            log.info("refill %s: %s", a.outcome.lower(), a.message, extra=context(r))

    def _give_back_from_check(self, a: GiveBackFromCheck) -> None:
        """The taint off first, then the reservation: a crash between leaves a reservation the next pass finds."""
        if a.node:
            try:
                self.caches.node_written(self.kube.give_back_from_check(a.node))
            except NotFound:
                pass  # the node is gone: only its reservation is left
        if a.reservation:
            self._slurm(lambda s: s.delete_reservation(a.reservation))
        log.info("active check: %s given back (%s)", a.node or a.reservation, a.why)

    def _slurm(self, fn) -> None:
        if self.slurm is not None:
            call(fn, self.slurm)

    def _evict(self, key: str, grace: int | None = None) -> None:
        namespace, name = key.split("/", 1)
        body = {"metadata": {"name": name, "namespace": namespace}}
        if self.kube.evict(body) if grace is None else self.kube.evict(body, grace):
            self.caches.pod_leaving(key)  # a PodDisruptionBudget's refusal leaves it as it is

    def _evict_borrowers(self, a: EvictBorrowers) -> None:
        for key in a.pods:
            if a.force:
                namespace, name = key.split("/", 1)
                self.kube.delete_pod(namespace, name)
                self.caches.pod_leaving(key)
            else:
                self._evict(key, a.grace_seconds)
        if a.force and a.pods:
            self._lending_event(a.node, "ReclaimForced", f"borrowers on {a.node} outlasted the {a.grace_seconds}s "
                                "reclaim grace (a PodDisruptionBudget, or a slow exit): deleted", "forced", "Warning")

    def _end_loan(self, a: EndLoan) -> None:
        view = self.caches.nodes.get(a.node)
        self.kube.end_loan(a.node, a.back_to_spare)
        if view is None or not view.on_loan:
            return
        now = self.clock()
        lent_for = (now - view.lent_since).total_seconds() if view.lent_since else 0.0
        if view.pool:
            self.metrics.gpu_seconds_lent.labels(view.pool).inc(max(0.0, lent_for) * view.gpus)
            if view.reclaiming is not None:
                self.metrics.reclaim_seconds.labels(view.pool).observe(max(0.0, (now - view.reclaiming).total_seconds()))
        if a.lost:
            self._lending_event(a.node, "LoanLost", f"{a.node} stopped answering {lent_for:.0f}s into its loan: the "
                                "loan ends with its borrowers left to their controllers, the machine to its heal",
                                "lost", "Warning")
            return
        self._lending_event(a.node, "Reclaimed", f"{a.node} is back from its loan after {lent_for:.0f}s"
                            + (" (to the spares)" if a.back_to_spare else ""), None)

    def _lending_event(self, node: str, reason: str, message: str, counted: str | None, type_: str = "Normal") -> None:
        view = self.caches.nodes.get(node)
        if counted and view is not None and view.pool:
            self.metrics.lending_events.labels(view.pool, counted).inc()
        log.info("%s: %s", reason, message)
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, reason, message, type_)


def apply_step(executor: Executor, metrics, r: Remediation, step: Step,
               moved: Callable[[Remediation, Remediation], None]) -> Remediation | None:
    """A repair's or a diagnosis's step: its idempotent actions, then the write with its once-only actions noted,
    then those (a crash in between never repeats one). `moved(old, new)` is told before the write. The written
    remediation, or None when the step writes none."""
    once = []
    for a in step.actions:
        if a.once is None:
            executor.run(a, r)
        elif a.once not in r.intents:
            once.append(a)
    if step.remediation is None:
        return None
    new = replace(step.remediation, revision=r.revision,
                  intents=tuple(dict.fromkeys(r.intents + tuple(a.once for a in once))))
    moved(r, new)
    written = executor.write_status(new)
    for a in once:
        try:
            executor.run(a, written)
        except (TemporaryError, PermanentError) as e:
            metrics.action_errors.labels(a.kind, "once-only").inc()
            log.error("%s failed and is not repeated: %s", a.kind, e, extra=context(written))
    return written
