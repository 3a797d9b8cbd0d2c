"""The person-holds pass (a timed runnable): people's Slurm drains that Slinky's operator overwrote to update a
NodeSet pod are put back, and the record of them kept on each machine (`core/person_holds.py` decides)."""
from __future__ import annotations

import logging

from gpufleet.reconciler.core.actions import DrainSlurm
from gpufleet.reconciler.core.person_holds import plan_holds
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.facts import Facts

log = logging.getLogger(__name__)
EVERY = 3.0  # seconds: a drain put back should beat the new pod's slurmd registering (its image pulled, started)


class HoldsPass:
    def __init__(self, caches: Caches, facts: Facts, executor: Executor):
        self.caches, self.facts, self.executor = caches, facts, executor

    def __call__(self) -> float:
        self.executor.fenced()
        slurm, _ = self.facts.slurm_everything()
        for a in plan_holds(self.caches.nodes.values(), self.caches.pods.values(), slurm):
            if isinstance(a, DrainSlurm):
                log.info("a person's Slurm drain put back on %s after Slinky's operator replaced it: %r", a.node,
                         a.reason)
            self.executor.run_or_defer(a, "person holds")
        return EVERY
