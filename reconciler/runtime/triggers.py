"""Which keys a change seen by an informer queues: the node queue's keys are node names, nothing else.

A new fault goes to the front of the queue (containment before anyone's later steps); a change of a
remediation, of a pod, or of a node chosen as a replacement queues the nodes whose remediations read it;
a spare that becomes ready wakes its pool's remediations waiting for one, and so does a Slurm node's pod
placed for the remediation waiting with that Slurm node; a freed admission slot wakes
the held ones; a node that answers a capacity request queues the node of the remediation that asked (its
record says the refill was answered). A node that joins or loses its pool or role pokes the membership pass.
"""
from __future__ import annotations

from typing import Callable

from gpufleet.fleetspec import labels

from gpufleet.reconciler.core.model import NodeView, PodView, Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.workqueue import WorkQueue

PLACE_SOON = 1.0  # seconds: a joining node is placed in its pool this soon (else the periodic pass)


def needs_placing(old: NodeView | None, new: NodeView | None) -> bool:
    """Whether a node change asks for a membership pass soon: a node joined, lost its pool or role,
    or became a spare (capacity requests settle on spares). gpufleet's own relabels of members
    (promote, quarantine) do not: each pass reads every node, which at 10,000 nodes costs more CPU
    than the rest of a remediation."""
    if new is None or old is not None and old.labels == new.labels:
        return False
    return old is None or not new.pool or not new.role or (new.is_spare and not old.is_spare)


class Triggers:
    def __init__(self, queue: WorkQueue, place: Callable[[float], None],
                 check: Callable[[float], None] = lambda after: None):
        self.queue, self.place, self.check = queue, place, check
        self.caches: Caches | None = None  # set once built: the callbacks read its indexes

    def _replaced_by(self, node: str) -> list:
        return self.caches.remediations.by_index("replacement", node) if self.caches else []

    def node_changed(self, name: str, old: NodeView | None, new: NodeView | None) -> None:
        self.queue.add(name, front=new is not None and new.fault is not None and (old is None or old.fault != new.fault))
        if needs_placing(old, new):
            self.place(PLACE_SOON)
        if new is not None and new.is_spare and not new.proven and (old is None or old.proven or not old.is_spare):
            self.check(PLACE_SOON)  # a spare to prove (it joined, came back, or rebooted)
        for r in self._replaced_by(name):
            self.queue.add(r.node)
        if new is not None and new.fulfils and (old is None or old.fulfils != new.fulfils) and self.caches:
            for r in self.caches.remediations.by_index("refill", new.fulfils):
                self.queue.add(r.node)
        if new is not None and new.is_spare and new.ready and new.pool:
            self.wake(Phase.WAITING_FOR_SPARE, new.pool)

    def pod_changed(self, key: str, old: PodView | None, new: PodView | None) -> None:
        for p in (old, new):
            if p is not None and p.node:
                self.queue.add(p.node)
                for r in self._replaced_by(p.node):
                    self.queue.add(r.node)
        host = new.label(labels.SLINKY_POD_HOSTNAME) if new is not None and new.node else None
        if host and self.caches:
            # A Slurm node's pod placed: a remediation waiting for a spare whose Slurm node it is may count the
            # node it landed on (the scheduler may give a spare promoted for another fault to it: decide._adopt).
            for r in self.caches.remediations.by_index("phase", Phase.WAITING_FOR_SPARE):
                if host in r.slurm_nodes:
                    self.queue.add(r.node)
        if any(p is not None and p.label(labels.HEALTH_CHECK_NODE) for p in (old, new)):
            self.check(PLACE_SOON)  # a health check's pod moved on: the validation pass reads its verdict

    def remediation_changed(self, name: str, old, new) -> None:
        for r in (old, new):
            if r is not None and r.node:
                self.queue.add(r.node)
        was = isinstance(old, Remediation) and old.phase.holds_capacity
        if was and not (isinstance(new, Remediation) and new.phase.holds_capacity):
            self.wake(Phase.HELD)  # a slot came free

    def wake(self, phase: Phase, pool: str | None = None) -> None:
        for r in (self.caches.remediations.by_index("phase", phase) if self.caches else []):
            if pool is None or r.pool == pool:
                self.queue.add(r.node)
