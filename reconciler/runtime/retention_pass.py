"""The retention pass (a timed runnable): delete finished remediations no rule reads any more
(`core/retention.py` says which), a batch per pass, each delete fenced."""
from __future__ import annotations

import logging
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.core.actions import DeleteRemediation
from gpufleet.reconciler.core.retention import expired_records
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor

log = logging.getLogger(__name__)
EVERY, BATCH = 3600.0, 50


class RetentionPass:
    def __init__(self, spec: FleetSpec, caches: Caches, executor: Executor, clock: Callable):
        self.spec, self.caches, self.executor, self.clock = spec, caches, executor, clock

    def __call__(self) -> float:
        self.executor.fenced()
        pools = {p.name for p in self.spec.pools}
        expired = expired_records(self.caches.remediations_in(pools), self.caches.nodes.values(), self.spec.healing,
                                  pools, self.clock())
        for r in expired[:BATCH]:
            self.executor.run(DeleteRemediation(r.name), r)
        if expired:
            log.info("retention: %d finished remediations deleted", min(len(expired), BATCH))
        return 1.0 if len(expired) > BATCH else EVERY
