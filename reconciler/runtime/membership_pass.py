"""The pool-membership pass (a timed runnable): label and taint the pools' members as their providers
know them, settle the capacity requests joined nodes answered, report GPU nodes of no pool. The core
plans it (`core/membership.py`); the executor makes every change, fenced like any other action."""
from __future__ import annotations

import logging

from fleetspec.models import FleetSpec

from reconciler.adapters.providers import NodeProvider
from reconciler.core.actions import Report
from reconciler.core.membership import membership_actions, merge_facts, plan
from reconciler.core.observe import membership_dict
from reconciler.runtime.caches import Caches
from reconciler.runtime.executor import Executor
from reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
EVERY = 30.0  # seconds between passes (a node that joins pokes one sooner)


class MembershipPass:
    def __init__(self, spec: FleetSpec, caches: Caches, providers: dict[str, NodeProvider], executor: Executor,
                 metrics: Metrics):
        self.spec, self.caches, self.providers, self.executor, self.metrics = spec, caches, providers, executor, metrics
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
        return EVERY
