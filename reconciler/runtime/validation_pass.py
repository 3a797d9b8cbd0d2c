"""The validation pass (a timed runnable, issue 25): every unproven spare is health-checked before it
serves (a node that joined a pool, a refill, a spare rebooted); a spare that fails becomes a remediation of
its own (quarantined, refilled, then repaired). The core decides (`core/validation.py`); the executor acts,
fenced like everything else; a Job's verdict is read only for the checks under way.
"""
from __future__ import annotations

import logging
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.node_repair import RUNNING

from gpufleet.reconciler.core import validation
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.repair_actions import NodeEvent
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import Claims
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.metrics import Metrics
from gpufleet.reconciler.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)
EVERY = 30.0  # seconds between passes with nothing under way (a spare that joins, or a check's pod, pokes it)


class ValidationPass:
    def __init__(self, spec: FleetSpec, caches: Caches, claims: Claims, executor: Executor, metrics: Metrics,
                 queue: WorkQueue, clock: Callable, checks=None):
        self.spec, self.caches, self.claims, self.executor = spec, caches, claims, executor
        self.metrics, self.queue, self.clock, self.checks = metrics, queue, clock, checks

    def __call__(self) -> float:
        self.executor.fenced()
        if not validation.required(self.spec) or self.checks is None:
            return EVERY * 10
        now = self.clock()
        live = [r for r in self.caches.remediations.values() if isinstance(r, Remediation) and r.active]
        claimed = frozenset(r.replacement for r in live if r.replacement) | self.claims.lending_nodes()
        busy = False
        for pool in self.spec.pools:
            nodes = self.caches.nodes.by_index("pool", pool.name)
            under_way = {n.check.job for n in nodes if n.check is not None and n.check.state == RUNNING
                         and n.check.boot == n.boot_id and validation.to_check(n, claimed)}
            verdicts = {job: self.checks.verdict(job) for job in sorted(under_way)}
            plan = validation.plan_spare_checks(nodes, verdicts, claimed, self.spec, now)
            for a in plan.actions:
                self.executor.run(a)
                if isinstance(a, NodeEvent) and a.reason in ("HealthCheckPassed", "HealthCheckFailed"):
                    self.metrics.health_checks.labels(pool.name, a.reason[len("HealthCheck"):].lower()).inc()
            for r in plan.failed:
                # A spare that failed: its remediation takes it from here (quarantine, refill, repair).
                if self.executor.create(r):
                    self.executor.write_status(r)
                    log.warning("spare %s failed its health check: %s", r.node, r.reason)
                self.queue.add(r.node, front=True)
            busy = busy or bool(plan.running)
        return validation.RECHECK if busy else EVERY
