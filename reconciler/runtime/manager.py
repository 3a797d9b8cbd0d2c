"""The reconciler process: caches, the node queue and its workers, the timed passes, the Lease, the
metrics server; one of each, wired here.

    informers ─► triggers ─► WorkQueue[node name] ─► N workers ─► healing.reconcile(node)
    timers: membership, lending, retention, validation, job notes, telemetry, holds, Slurm's own drains (each its
            own loop) ─► their passes
    every action of either ─► executor (fenced by the Lease; nothing in a dry run)

The resync (at start, every RESYNC_SECONDS, and when this replica starts leading) queues every node with
a fault or a live remediation and pokes every pass: level-based, so a missed event heals itself.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.notify import Notifier
from gpufleet.reconciler.adapters.providers import NodeProvider
from gpufleet.reconciler.adapters.records import RemediationStore, Unreadable
from gpufleet.reconciler.adapters.slurm import SlurmClient
from gpufleet.reconciler.core import refills
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.alerts import Alerts
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import Claims
from gpufleet.reconciler.runtime.executor import Executor, NotLeader
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.healing import UNSYNCED_RECHECK, Healing
from gpufleet.reconciler.runtime.leader import LeaseElector
from gpufleet.reconciler.runtime.holds_pass import HoldsPass
from gpufleet.reconciler.runtime.job_notes_pass import JobNotesPass
from gpufleet.reconciler.runtime.lending_pass import LendingPass
from gpufleet.reconciler.runtime.membership_pass import MembershipPass
from gpufleet.reconciler.runtime.metrics import Metrics, serve
from gpufleet.reconciler.runtime.diagnoses import Diagnoses
from gpufleet.reconciler.runtime.repairs import Repairs
from gpufleet.reconciler.runtime.retention_pass import RetentionPass
from gpufleet.reconciler.runtime.slurm_drains_pass import SlurmDrainsPass
from gpufleet.reconciler.runtime.validation_pass import ValidationPass
from gpufleet.reconciler.runtime.active_check_pass import ActiveCheckPass
from gpufleet.reconciler.runtime.telemetry_pass import TelemetryPass
from gpufleet.reconciler.runtime.timers import Timer
from gpufleet.reconciler.runtime.triggers import Triggers
from gpufleet.reconciler.runtime.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)
RESYNC_SECONDS = 300.0  # every node with a fault or a live remediation is looked at again (level-based safety net)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Manager:
    def __init__(self, spec: FleetSpec, kube: Kube, store: RemediationStore, slurm: SlurmClient | None,
                 providers: dict[str, NodeProvider], notifier: Notifier, metrics: Metrics | None = None, *,
                 clock: Callable[[], datetime] = utcnow, monotonic: Callable[[], float] = time.monotonic,
                 dry_run: bool = False, fence: Callable[[], bool] = lambda: True,
                 elector: LeaseElector | None = None, checks=None):
        self.spec, self.kube, self.store, self.slurm = spec, kube, store, slurm
        self.providers, self.notifier, self.elector = providers, notifier, elector
        self.metrics = metrics or Metrics()
        self.dry_run = dry_run or spec.healing.dry_run
        self.stop = threading.Event()
        self.workers = spec.healing.reconciler.workers
        self.queue = WorkQueue(clock=monotonic)
        self.triggers = Triggers(self.queue, place=lambda after: self.timers["membership"].poke(after),
                                 check=lambda after: self.timers["validation"].poke(after))
        self.caches = Caches(spec, kube, store, self.triggers.node_changed, self.triggers.pod_changed,
                             self.triggers.remediation_changed)
        self.triggers.caches = self.caches
        self.claims = Claims(monotonic)
        self.facts = Facts(spec, self.caches, slurm, providers, self.claims, clock)
        self.executor = Executor(spec, kube, store, slurm, providers, notifier, self.caches, self.metrics, clock,
                                 fence, self.dry_run, monotonic, checks=checks)
        self.alerts = Alerts(self.metrics, self.caches, clock)
        self.repairs = Repairs(spec, self.caches, self.facts, self.executor, self.alerts, self.metrics, clock, checks,
                               self.claims)
        self.healing = Healing(spec, self.caches, self.facts, self.claims, self.executor, self.alerts, self.metrics,
                               self.queue, clock, repairs=self.repairs,
                               diagnoses=Diagnoses(spec, self.caches, self.facts, self.executor, self.alerts,
                                                   self.metrics, clock, checks))
        self.passes: dict[str, Callable[[], float]] = {
            "membership": MembershipPass(spec, self.caches, providers, self.executor, self.metrics, self.claims),
            "lending": LendingPass(spec, self.caches, self.facts, self.claims, self.executor, kube, self.metrics,
                                   notifier.namespace, clock, monotonic),
            "retention": RetentionPass(spec, self.caches, self.executor, clock),
            "validation": ValidationPass(spec, self.caches, self.claims, self.executor, self.metrics, self.queue, clock,
                                         checks),
            "active-checks": ActiveCheckPass(spec, self.caches, self.facts, self.claims, self.executor, self.metrics,
                                             self.queue, clock, slurm, checks),
            "job-notes": JobNotesPass(spec, self.caches, slurm, self.executor, self.metrics, clock),
            "telemetry": TelemetryPass(spec, self.caches, self.facts, slurm, self.executor, clock),
            "holds": HoldsPass(self.caches, self.facts, self.executor),
            "slurm-drains": SlurmDrainsPass(spec, self.caches, self.facts, self.executor, clock),
        }
        self.timers = {name: Timer(name, self._pass(name), monotonic) for name in self.passes}

    def _pass(self, name: str) -> Callable[[], float]:
        return lambda: self.passes[name]() if self.caches.synced() else UNSYNCED_RECHECK

    # --- what needs a look ----------------------------------------------------------------------------

    def sync(self) -> None:
        """List every cache now and queue what needs a look (tests, `--once`)."""
        self.caches.relist()
        self.resync()

    def resync(self) -> None:
        """Queue every node that has a fault, a live remediation or an outstanding refill, and poke every pass."""
        for t in self.timers.values():
            t.poke()
        for n in self.caches.nodes.values():
            if n.fault is not None or n.role == labels.ROLE_QUARANTINED or n.not_ready_since is not None:
                self.queue.add(n.name)  # a node not Ready: lost once that lasts (core/node_lost.py)
        for r in self.caches.remediations.values():
            if r.node and (isinstance(r, Unreadable) or r.active
                           or (r.repair is not None and r.repair.active)  # a repair runs after its heal ended
                           or refills.due(r, self.spec) is not None):  # a refill outstanding is settled there
                self.queue.add(r.node)

    # --- workers ----------------------------------------------------------------------------------------

    def process(self, node: str) -> None:
        """Reconcile one node taken from the queue, and requeue it as it asks."""
        try:
            delay = self.healing.reconcile(node)
        except NotLeader:
            self.queue.add_after(node, 1.0)
        except (TemporaryError, PermanentError) as e:
            log.warning("reconcile %s: %s (backing off)", node, e)
            self.queue.add_failed(node)
        except Exception:  # noqa: BLE001 - one node's surprise must not stop the others
            log.exception("reconcile %s failed (backing off)", node)
            self.queue.add_failed(node)
        else:
            self.queue.forget(node)
            if delay is not None:
                self.queue.add_after(node, delay)
        finally:
            self.queue.done(node)

    def process_due(self, max_items: int = 10_000) -> int:
        """Run, in this thread, the passes that are due and the nodes due now (tests and `--once`); how many."""
        n = 0
        for t in self.timers.values():
            if t.due():
                t.fire()
                n += 1
        while n < max_items:
            node = self.queue.get(timeout=0)
            if node is None:
                return n
            self.process(node)
            n += 1
        return n

    def work(self, stop: threading.Event, leading: threading.Event | None) -> None:
        while not stop.is_set():
            if leading is not None and not leading.is_set():
                stop.wait(0.2)
                continue
            try:
                node = self.queue.get(timeout=0.5)
            except ShutDown:
                return
            if node is not None:
                self.process(node)

    def run(self, stop: threading.Event | None = None, leading: threading.Event | None = None) -> None:
        """Caches, N workers, the timed passes and the resync; until `stop`."""
        stop = stop or self.stop
        for i in self.caches.all:
            i.start(stop)
        while not stop.is_set() and not self.caches.synced():
            stop.wait(0.1)
        self.resync()
        threads = [threading.Thread(target=self.work, args=(stop, leading), name=f"worker-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        threads += [t.start(stop, leading) for t in self.timers.values()]
        was_leading = leading is None or leading.is_set()
        last_resync = time.monotonic()
        while not stop.wait(1.0):
            self.alerts.refresh_gauges()
            self.metrics.last_pass = time.monotonic()
            now_leading = leading is None or leading.is_set()
            if (now_leading and not was_leading) or time.monotonic() - last_resync > RESYNC_SECONDS:
                self.resync()  # a new leader looks at everything once
                last_resync = time.monotonic()
            was_leading = now_leading
        self.queue.shut_down()
        for t in self.timers.values():
            t.wake()
        for t in threads:
            t.join(timeout=5)

    def serve(self, metrics_port: int | None = None, health_port: int | None = None) -> None:
        """The process: the Lease (if elected), /metrics and /healthz (and /healthz alone on `health_port`, the
        probes'), then `run` until `stop`; on the way out the Events still queued are sent and the Lease is
        released, so the next leader starts at once."""
        server = serve(self.metrics, metrics_port, healthy=self.caches.synced, health_port=health_port) \
            if metrics_port else None
        leading = None
        if self.elector is not None:
            self.elector.start()
            leading = self.elector.leading
        try:
            self.run(self.stop, leading)
        finally:
            self.kube.flush_events(10.0)
            if self.elector:
                self.elector.stop()
            if server:
                server.shutdown()
