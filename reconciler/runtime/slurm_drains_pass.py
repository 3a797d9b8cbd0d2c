"""The Slurm-drains pass (a timed runnable): read Slurm's nodes, let the core say which ones Slurm drained itself
with a reason that asks for a reboot or a check (core/slurm_drains.py), and write gpufleet's GPU condition on their
Kubernetes nodes. The node queue then heals or diagnoses them like any fault (core/decide.py detect).

Level-based and idempotent: a condition written is on the node (its fault read, the next pass leaves it); a node
whose remediation lives is left alone; a restart or a new leader reads the same drains again. Nothing is read
when Slurm does not answer (its nodes are not known: nothing is marked on a guess). A drain a passed check did
not mend is paged once (the core's PageOnce: noted on its node before the page, so a restart reads that it was;
a note that cannot be written sends no page this round).
"""
from __future__ import annotations

import logging

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.records import Unreadable
from gpufleet.reconciler.core import slurm_drains
from gpufleet.reconciler.core.actions import PageOnce
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.errors import TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.facts import Facts

log = logging.getLogger(__name__)
EVERY = 30.0  # seconds: Slurm's own timeouts (UnkillableStepTimeout, 60 s by default) came before; a look is cheap
OFF = 600.0  # `healing.slurm_drains: ignore`, or no Slurm: the spec is fixed for the process's life


class SlurmDrainsPass:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, executor: Executor, clock):
        self.spec, self.caches, self.facts, self.executor, self.clock = spec, caches, facts, executor, clock
        self.last: tuple = ()  # the pass's latest actions (tests)

    def __call__(self) -> float:
        if self.spec.healing.slurm_drains == slurm_drains.IGNORE or self.facts.slurm is None:
            return OFF
        self.executor.fenced()
        try:
            slurm = self.facts.slurm_nodes()
        except TemporaryError as e:
            log.warning("slurm drains: Slurm unreachable (%s): nothing marked", e)
            return EVERY
        pools = {p.name for p in self.spec.pools}
        records = [r for r in self.caches.remediations.values() if isinstance(r, Remediation)]
        unreadable = {r.node for r in self.caches.remediations.values() if isinstance(r, Unreadable) and r.node}
        nodes = {}
        for p in pools:
            for v in self.caches.nodes.by_index("pool", p):
                names = slurm_nodes_on(v.name, self.caches.pods_on(v.name)).names
                nodes[v.name] = slurm_drains.Drained(v, tuple(slurm[n] for n in names if n in slurm))
        self.last = slurm_drains.plan(nodes, records, self.spec, self.clock(), unreadable)
        for a in self.last:
            if isinstance(a, PageOnce):
                log.warning("%s", a.page.text)
            else:
                log.warning("Slurm drained a node itself: %s", a.message, extra={"node": a.node})
            self.executor.run_or_defer(a, "slurm drains")
        return EVERY
