"""The repair reconcile of one node (issue 25), through the same node queue as its heal: once the heal is
over (or, repairing in place, while it waits for a spare), the node's newest remediation carries its repair.

    caches (+ Slurm, + the health-check Job) ─► core (oncall.plan_ended | repair.plan_repair) ─► executor
    idempotent actions, then one write with the once-only ones noted as begun, then those (a reset or a
    reboot asked through the cloud's API, a page) ─► next look

One step per reconcile: every step of a repair waits for the world (a node to answer, a reboot, a Job), so
nothing carries. A temporary failure backs off on the node's queue key; an error retrying cannot fix stops
the repair there with a page (`repair.stopped_by_error`), rather than timing out up the ladder.
"""
from __future__ import annotations

import logging
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.core import oncall, repair
from gpufleet.reconciler.core.model import Remediation, Step
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import RepairFacts
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.errors import PermanentError
from gpufleet.reconciler.runtime.alerts import Alerts
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import Claims
from gpufleet.reconciler.runtime.executor import Executor, apply_step, context
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)


class Repairs:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, executor: Executor, alerts: Alerts,
                 metrics: Metrics, clock: Callable, checks=None, claims: Claims | None = None):
        self.spec, self.caches, self.facts, self.executor = spec, caches, facts, executor
        self.alerts, self.metrics, self.clock, self.checks = alerts, metrics, clock, checks
        self.claims = claims or Claims()

    # --- which nodes are the loop's ------------------------------------------------------------------

    def newest(self, node: str) -> Remediation | None:
        pools = {p.name for p in self.spec.pools}
        mine = [r for r in self.caches.remediations.by_index("node", node)
                if isinstance(r, Remediation) and r.pool in pools]
        return max(mine, key=lambda r: (r.created, r.name)) if mine else None

    def wants(self, node: str) -> bool:
        """Whether the repair loop (or a person's request on an ended heal) has work on this node now."""
        r, view = self.newest(node), self.caches.nodes.get(node)
        if r is None:
            return self._marked_healthy(view)
        if oncall.pending(r) is not None and r.phase.terminal:
            return True
        return repair.wants(r, view, self.spec) or (self._marked_healthy(view) and not (r.repair and r.repair.active)
                                                    and r.phase.terminal)

    def _marked_healthy(self, view) -> bool:
        """A quarantined node whose GPU condition a person set back to healthy by hand (the condition only)."""
        return view is not None and view.role == labels.ROLE_QUARANTINED and view.health_check_passed \
            and view.fault is None and view.pool in {p.name for p in self.spec.pools}

    # --- one reconcile -------------------------------------------------------------------------------

    def reconcile(self, node: str) -> float | None:
        r = self.newest(node)
        now = self.clock()
        if r is None or (self._marked_healthy(self.caches.nodes.get(node)) and oncall.pending(r) is None
                         and not (r.repair and r.repair.active)):
            return self._orphan(node)
        try:
            step = self._plan(r, now)
            try:
                return self._apply(r, step)
            except PermanentError as e:
                log.error("repair of %s: %s", node, e, extra=context(r))
                self.metrics.action_errors.labels("repair", "permanent").inc()
                return self._apply(r, repair.stopped_by_error(r, self.clock(), str(e)))
        finally:
            self.claims.release(r.name)

    def _plan(self, r: Remediation, now) -> Step:
        """A repair about to begin is planned under the claims lock, counting the repairs other workers have
        planned and not yet written (the caps' slots), and its own step is claimed until it is written: two
        workers never both take a pool's last slot. Other steps need no one else's."""
        if not repair.repair_needs(r).slots:
            return self._decide(r, self.observe(r), now)
        with self.claims.lock:
            step = self._decide(r, self.observe(r, self.claims.applying()), now)
            if step.remediation is not None:
                self.claims.take(step.remediation)
            return step

    def _decide(self, r: Remediation, facts: RepairFacts, now) -> Step:
        step = oncall.plan_ended(r, facts, self.spec, now) if r.phase.terminal else None
        return step if step is not None else repair.plan_repair(r, facts, self.spec, now)

    def observe(self, r: Remediation, applying: tuple[Remediation, ...] | list = ()) -> RepairFacts:
        """What `repair_needs` asks for: the node and its pods from the caches, Slurm's view of the
        remediation's Slurm nodes, the health-check Job's verdict, the node's remediations, and (a repair
        about to begin) the fleet's repairs under way or waiting, for the caps, those being written (`applying`)
        counted as planned."""
        need = repair.repair_needs(r)
        c = self.caches
        history = tuple(x for x in c.remediations.by_index("node", r.node) if isinstance(x, Remediation))
        promoted = tuple(at for x in c.remediations.by_index("replacement", r.node)
                         if isinstance(x, Remediation) and (at := x.entered(Phase.RESUMING)) is not None)
        verdict = None
        if need.verdict:
            if self.checks is None:
                raise PermanentError("no health-check adapter: cannot read a health check")
            verdict = self.checks.verdict(need.verdict)
        known = {x.name: x for x in c.remediations.values() if isinstance(x, Remediation)}
        known.update({x.name: x for x in applying})
        slots = tuple(s for x in known.values() if (s := repair.repair_slot(x)) is not None) if need.slots else ()
        return RepairFacts(node=c.nodes.get(r.node), pods=tuple(c.pods_on(r.node)) if need.pods else (),
                           slurm=self.facts.slurm_views(need.slurm), verdict=verdict, history=history,
                           promotions=promoted, repairs=slots)

    def _moved(self, r: Remediation, new: Remediation) -> None:
        if new.phase is not r.phase:
            self.alerts.moved(r, new)
        self.alerts.repair_moved(r, new)

    def _apply(self, r: Remediation, step: Step) -> float | None:
        """The step applied (executor.apply_step); when to look again."""
        written = apply_step(self.executor, self.metrics, r, step, self._moved)
        if written is None:
            return step.recheck_after
        if self.executor.dry_run:
            return None
        rep = written.repair
        moved = (rep.phase if rep else None) is not (r.repair.phase if r.repair else None) or \
            (rep is not None and r.repair is not None and rep.attempt != r.repair.attempt)
        if written.phase is not r.phase and not written.phase.terminal:
            return 0.0  # a person's release: the heal goes on now
        return 0.0 if moved and rep is not None and rep.active else step.recheck_after

    def _orphan(self, node: str) -> float | None:
        """A quarantined node marked healthy by the condition alone, with no remediation to end: back to the
        spares once nothing of the pool runs there."""
        view = self.caches.nodes.get(node)
        if view is None:
            return None
        here = slurm_nodes_on(node, self.caches.pods_on(node)).names
        left = f"NodeSet pod(s) of {list(here)} still run there" if here else ""
        for a in oncall.orphan_marked_healthy(view, left):
            self.executor.run(a)
        if left:
            log.warning("%s was marked healthy, but %s: it stays out until they leave", node, left)
            return 10.0
        return None
