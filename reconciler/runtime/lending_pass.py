"""The lending pass (a timed runnable) over the pools that lend, or still have nodes on loan: per pool,
the core plans (`core/lending.py`) under the claims lock, so no spare is both lent and promoted; the
executor acts; the pool's gauges and its entry in the lending ledger follow (`core/ledger.py`)."""
from __future__ import annotations

import logging
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.ledger import LedgerError, PoolLedger, parse, parse_data
from gpufleet.fleetspec.models import FleetSpec, NodePool

from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core import ledger, lending
from gpufleet.reconciler.core.model import SlurmNodeView
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import LENDING_BUSY, LENDING_HOLD, Claims
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
IDLE = 10.0  # no pool lends: look again this often (a spec that starts lending is a new deployment)
LEDGER_RETRY = 60.0  # seconds before looking for a missing ledger ConfigMap again


class LendingPass:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, claims: Claims, executor: Executor,
                 kube: Kube, metrics: Metrics, namespace: str, clock: Callable, monotonic: Callable[[], float]):
        self.spec, self.caches, self.facts, self.claims, self.executor = spec, caches, facts, claims, executor
        self.kube, self.metrics, self.namespace, self.clock, self.monotonic = kube, metrics, namespace, clock, monotonic
        self._ledgers: dict[str, PoolLedger] | None = None  # as last read or written; None: read it first
        self._ledger_retry = 0.0

    def __call__(self) -> float:
        pools = [p for p in self.spec.pools
                 if p.lending is not None or any(n.on_loan for n in self.caches.nodes.by_index("pool", p.name))]
        if not pools:
            return IDLE
        self.executor.fenced()
        slurm, pending = self.facts.slurm_everything()
        return min(self._pool(p, slurm, pending) for p in pools)

    def _pool(self, pool: NodePool, slurm: dict[str, SlurmNodeView], pending) -> float:
        seen = self.facts.pool(pool, slurm, pending)
        with self.claims.lock:
            facts = self.facts.pool_shared(seen)
            plan = lending.plan_lending(facts, self.spec, self.clock())
            touched = {getattr(a, "node", "") for a in plan.actions} - {""}
            self.claims.hold_for_lending(touched, LENDING_BUSY)
        try:
            for a in plan.actions:
                self.executor.run_or_defer(a, "lending")  # one node's trouble: the others go on
        finally:
            with self.claims.lock:
                self.claims.hold_for_lending(touched, LENDING_HOLD)
        c = plan.capacity
        for state, value in (("active_busy", c.active_busy), ("active_idle", c.active_idle),
                             ("active_lent", c.active_lent), ("spares_lent", c.spares_lent),
                             ("spares_unlent", c.spares_unlent), ("quarantined", c.quarantined)):
            self.metrics.lending_nodes.labels(pool.name, state).set(value)
        self.metrics.gpus_lent.labels(pool.name).set(c.gpus_lent)
        self._ledger(pool.name, facts, c)
        return plan.recheck_after

    def _ledger(self, pool: str, facts: lending.PoolFacts, capacity) -> None:
        """The pool's loans and capacity for `gpufleet capacity`, written when they change."""
        ledgers = self._read()
        if ledgers is None:
            return
        write = ledger.book(ledgers.get(pool), pool, facts.nodes, capacity, self.clock())
        if write is None:
            return
        try:
            self.executor.run(write)
        except (TemporaryError, PermanentError) as e:
            log.warning("lending ledger of %s not written (the next pass tries again): %s", pool, e)
            return
        if not self.executor.dry_run:
            ledgers[pool] = parse(write.text, pool)

    def _read(self) -> dict[str, PoolLedger] | None:
        if self._ledgers is not None:
            return self._ledgers
        if self.monotonic() < self._ledger_retry:
            return None
        try:
            data = self.kube.read_ledger(self.namespace)
        except TemporaryError as e:
            log.warning("lending ledger: %s", e)
            return None
        if data is None:
            log.warning("no ConfigMap %s/%s: loans are not recorded for `gpufleet capacity`",
                        self.namespace, labels.LENDING_LEDGER)
            self._ledger_retry = self.monotonic() + LEDGER_RETRY
            return None
        try:
            self._ledgers = parse_data(data)
        except LedgerError as e:
            log.error("%s: starting it again", e)
            self._ledgers = {}
        return self._ledgers
