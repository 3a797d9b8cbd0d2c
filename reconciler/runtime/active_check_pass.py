"""The active-check pass (a timed runnable): per pool that declares `active_checks`, the core decides
(`core/active_checks.py`) which idle nodes and spares are checked now and what the checks under way say; the
executor acts, fenced like everything else. Slurm's check reservations are read once a pass, so one a killed
reconciler made is found and finished or given back; a node that fails becomes a remediation (the repair loop).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec, NodePool

from gpufleet.reconciler.adapters.slurm import call
from gpufleet.reconciler.core import active_checks
from gpufleet.reconciler.core.active_checks import ReserveForCheck, Reservation
from gpufleet.reconciler.core.repair_actions import NodeEvent
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import LENDING_BUSY, LENDING_HOLD, Claims
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.metrics import Metrics
from gpufleet.reconciler.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)
OFF = 300.0  # no pool declares active checks: look again this often


class ActiveCheckPass:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, claims: Claims, executor: Executor,
                 metrics: Metrics, queue: WorkQueue, clock: Callable, slurm=None, checks=None):
        self.spec, self.caches, self.facts, self.claims, self.executor = spec, caches, facts, claims, executor
        self.metrics, self.queue, self.clock, self.slurm, self.checks = metrics, queue, clock, slurm, checks

    def __call__(self) -> float:
        pools = [p for p in self.spec.pools if p.active_checks is not None]
        if not pools or self.checks is None or self.slurm is None:
            return OFF
        self.executor.fenced()
        try:
            ours = [Reservation(r.name, r.nodes) for r in call(self.slurm.reservations)
                    if active_checks.is_ours(r.name)]
        except TemporaryError as e:  # nothing is known of what is reserved: nothing starts, nothing is given back
            log.warning("active checks: Slurm unreachable (%s): looking again", e)
            return active_checks.RECHECK
        slurm, pending = self.facts.slurm_everything()
        if not slurm:
            return active_checks.RECHECK
        names = {n.name: p.name for p in self.spec.pools for n in self.caches.nodes.by_index("pool", p.name)}
        after = [self._pool(p, [r for r in ours if names.get(r.node) == p.name], slurm, pending) for p in pools]
        for a in active_checks.plan_strays(ours, frozenset(names)):
            self._run(a)
        return min(after)

    def _pool(self, pool: NodePool, reservations: list[Reservation], slurm, pending) -> float:
        now = self.clock()
        seen = self.facts.pool(pool, slurm, pending)
        jobs = sorted({active_checks.job_of(r) for r in reservations})
        verdicts = {job: self.checks.verdict(job) for job in jobs}
        with self.claims.lock:  # no spare is both chosen by a remediation (or lent) and taken for a check
            facts = self.facts.pool_shared(seen)
            facts = replace(facts, claimed=facts.claimed | self.claims.lending_nodes())
            plan = active_checks.plan_active_checks(facts, reservations, verdicts, self.spec, now)
            touched = {getattr(a, "node", "") for a in plan.actions} - {""}
            self.claims.hold_for_lending(touched, LENDING_BUSY)
        try:
            refused: set[str] = set()
            for a in plan.actions:
                if getattr(a, "node", None) in refused:
                    continue
                if not self._run(a) and isinstance(a, ReserveForCheck):
                    refused.add(a.node)  # Slurm said no (a job landed): not checked, its event not sent
                if isinstance(a, NodeEvent) and a.reason == "ActiveCheckStarted":
                    log.info("%s", a.message)
            for r in plan.failed:
                if self.executor.create(r):
                    self.executor.write_status(r)
                    log.warning("%s failed its active check: %s", r.node, r.reason)
                self.queue.add(r.node, front=True)
        finally:
            with self.claims.lock:
                self.claims.hold_for_lending(touched, LENDING_HOLD)
        for _, result in plan.results:
            self.metrics.active_checks.labels(pool.name, result).inc()
        self.metrics.active_checks_running.labels(pool.name).set(plan.under_way)
        self.metrics.active_check_age.labels(pool.name).set(active_checks.oldest_check_age(facts.nodes, now))
        return plan.recheck_after

    def _run(self, a) -> bool:
        try:
            self.executor.run(a)
            return True
        except (TemporaryError, PermanentError) as e:  # one node's trouble: the others go on, the next pass looks again
            log.warning("active check: %s on %s: %s", a.kind, getattr(a, "node", "?") or getattr(a, "reservation", ""), e)
            self.metrics.action_errors.labels(a.kind, "temporary" if isinstance(e, TemporaryError) else "permanent").inc()
            return False
