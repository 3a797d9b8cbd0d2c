"""What people see of the runtime besides its actions: metrics, gauges and log lines for gates and phase
moves, and one Warning Event per unreadable remediation. Pages are not sent here: they are actions of
the core (the storm page is a once-only action of the remediation it holds).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from gpufleet.fleetspec.remediation_crd import Reason

from gpufleet.reconciler.adapters.records import Unreadable
from gpufleet.reconciler.core.actions import Report
from gpufleet.reconciler.core.model import Gate, Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import context
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
GATES = (Reason.TOO_MANY_UNHEALTHY, Reason.MAX_CONCURRENT, Reason.HEALING_DISABLED)


class Alerts:
    def __init__(self, metrics: Metrics, caches: Caches, clock: Callable):
        self.metrics, self.caches, self.clock = metrics, caches, clock
        self._lock = threading.Lock()
        self._logged: set[str] = set()  # gates logged (reason:pool) while they hold
        self._reported: set[str] = set()  # unreadable remediations reported

    def gate(self, g: Gate) -> None:
        """One warning per gate and pool while it holds (the metric counts the held nodes)."""
        key = f"{g.reason}:{g.pool}"
        with self._lock:
            first = key not in self._logged
            self._logged.add(key)
        if first:
            log.warning("gate %s: %s", g.reason, g.message)

    def moved(self, old: Remediation, new: Remediation) -> None:
        now = self.clock()
        entered = old.entered(old.phase) or old.created
        self.metrics.phase_seconds.labels(old.phase.value).observe((now - entered).total_seconds())
        log.info("phase %s -> %s", old.phase.value, new.phase.value, extra=context(new))
        if old.phase is Phase.REPLACING and new.reclaim_started is not None:
            self.metrics.heal_reclaim_wait.observe((now - new.reclaim_started).total_seconds())
        if new.phase.terminal:
            self.metrics.remediations.labels(str(new.xid), new.phase.value.lower()).inc()
            if new.phase is Phase.SUCCEEDED:
                self.metrics.time_to_healthy.observe((now - new.created).total_seconds())

    def repair_moved(self, old: Remediation, new: Remediation) -> None:
        """Metrics and a log line for a repair's step (issue 25)."""
        was, rep = old.repair, new.repair
        if rep is None:
            return
        for e in rep.history[len(was.history) if was else 0:]:
            self.metrics.repair_steps.labels(e.step, e.outcome).inc()
            if e.outcome == "relapsed":
                self.metrics.repairs.labels(new.pool, "relapsed").inc()
        if was is not None and was.phase is rep.phase:
            return
        log.info("repair %s -> %s (%s)", was.phase.value if was else "-", rep.phase.value, rep.reason,
                 extra=context(new))
        if rep.phase.terminal or rep.phase is RepairPhase.STOPPED:
            self.metrics.repairs.labels(new.pool, rep.phase.value.lower()).inc()
        if rep.phase is RepairPhase.RETURNED:
            self.metrics.time_to_return.observe((self.clock() - new.created).total_seconds())

    def unreadable(self, node: str, bad: list[Unreadable]) -> tuple[tuple[str, Report], ...]:
        """(name, Warning Event) for each unreadable remediation not reported yet; its node is left alone.
        `reported(name)` once the Event is sent."""
        out = []
        for b in bad:
            with self._lock:
                if b.name in self._reported:
                    continue
            log.error("%s: node %s is left alone until the remediation is fixed or deleted", b.error, node)
            self.metrics.action_errors.labels("read-remediation", "permanent").inc()
            out.append((b.name, Report("Node", node, "RemediationUnreadable", b.error)))
        return tuple(out)

    def reported(self, name: str) -> None:
        with self._lock:
            self._reported.add(name)

    def refresh_gauges(self) -> None:
        """Gauges from the caches; a gate that holds nothing any more is logged again next time."""
        remediations = [r for r in self.caches.remediations.values() if isinstance(r, Remediation)]
        self.metrics.nodes.set(len(self.caches.nodes))
        self.metrics.in_progress.set(sum(1 for r in remediations if r.active and r.phase is not Phase.OPTED_OUT))
        held: dict[str, int] = {}
        for r in remediations:
            if r.phase is Phase.HELD:
                reason = r.held_reason or Reason.MAX_CONCURRENT
                held[reason] = held.get(reason, 0) + 1
        for reason in GATES:
            self.metrics.held.labels(reason).set(held.get(reason, 0))
        repairing: dict[tuple[str, str], int] = {}
        for r in remediations:
            if r.repair is not None and (r.repair.active or r.repair.phase is RepairPhase.RETIRED):
                key = (r.pool, r.repair.phase.value)
                repairing[key] = repairing.get(key, 0) + 1
        for pool in {r.pool for r in remediations}:
            for phase in (RepairPhase.REPAIRING, RepairPhase.VALIDATING, RepairPhase.STOPPED, RepairPhase.WAITING,
                          RepairPhase.RETIRED):
                self.metrics.repairing.labels(pool, phase.value).set(repairing.get((pool, phase.value), 0))
        pools = {r.pool for r in remediations if r.phase is Phase.HELD and r.held_reason == Reason.TOO_MANY_UNHEALTHY}
        with self._lock:
            self._logged = {k for k in self._logged
                            if not k.startswith(f"{Reason.TOO_MANY_UNHEALTHY}:") or k.split(":", 1)[1] in pools}
