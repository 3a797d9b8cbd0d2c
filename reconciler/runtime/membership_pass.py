"""The pool-membership pass (a timed runnable): label and taint the pools' members as their providers
know them, settle the capacity requests joined nodes answered, report GPU nodes of no pool, and keep each
pool at its declared spares (the surplus given back). The core plans it (`core/membership.py`,
`core/surplus.py`, the latter under the claims lock, so no spare is both given back and promoted); the
executor makes every change, fenced like any other action."""
from __future__ import annotations

import logging

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.providers import NodeProvider
from gpufleet.reconciler.core.actions import Report
from gpufleet.reconciler.core import surplus
from gpufleet.reconciler.core.membership import membership_actions, merge_facts, plan
from gpufleet.reconciler.core.observe import membership_dict
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import LENDING_BUSY, LENDING_HOLD, Claims
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
EVERY = 30.0  # seconds between passes (a node that joins pokes one sooner)


class MembershipPass:
    def __init__(self, spec: FleetSpec, caches: Caches, providers: dict[str, NodeProvider], executor: Executor,
                 metrics: Metrics, claims: Claims | None = None):
        self.spec, self.caches, self.providers, self.executor, self.metrics = spec, caches, providers, executor, metrics
        self.claims = claims
        self._reported: set[str] = set()  # GPU nodes of no pool already reported (one Event each)

    def __call__(self) -> float:
        self.executor.fenced()
        once = list({type(p): p for p in self.providers.values()}.values())  # one of each kind covers its pools
        result = plan([membership_dict(v) for v in self.caches.nodes.values()], self.spec,
                      merge_facts(p.membership_facts() for p in once))
        self.metrics.unlabelled.set(len(result.unlabelled_gpu_nodes))
        for name in result.unlabelled_gpu_nodes:
            log.warning("GPU node %s belongs to no pool: have its provider prove it a member (the pool's "
                        "member_selector or Auto Scaling group)", name)
        for name in result.unproven:
            log.warning("node %s claims a pool or role by labels it may have set itself, with no provider "
                        "evidence: it enrols in nothing", name)
        for name, why in result.conflicts:
            log.warning("membership conflict: %s: %s", name, why)
        for a in membership_actions(result, frozenset(self._reported)):
            self.executor.run(a)
            if isinstance(a, Report) and not self.executor.dry_run:
                self._reported.add(a.name)
        if self.claims is not None:
            self._keep_spares(self.claims)
        return EVERY

    def _keep_spares(self, claims: Claims) -> None:
        """Each pool at its declared spares: planned under the claims lock with the remediations being applied,
        the nodes it changes held from the heals while it acts (as a lending pass holds its own)."""
        for pool in self.spec.pools:
            with claims.lock:
                records = {x.name: x for x in self.caches.remediations_in({pool.name})}
                records.update({x.name: x for x in claims.applying() if x.pool == pool.name})
                actions = surplus.plan(pool, self.caches.nodes.by_index("pool", pool.name), records.values(),
                                       claims.lending_nodes())
                touched = [a.node for a in actions]
                claims.hold_for_lending(touched, LENDING_BUSY)
            try:
                for a in actions:
                    try:
                        self.executor.run(a)
                    except (TemporaryError, PermanentError) as e:  # the next pass plans it again
                        log.warning("spares of pool %s: %s of %s failed: %s", pool.name, a.kind, a.node, e)
            finally:
                with claims.lock:
                    claims.hold_for_lending(touched, LENDING_HOLD)
