"""The diagnosis of one node (a `diagnose` fault: the node is checked while it stays in service), through the same
node queue as its heal: a remediation in the Diagnosing phase is this module's (core/diagnosis.py decides).

    caches (+ Slurm, + the health-check Job) ─► core (diagnosis.plan) ─► executor
    idempotent actions, then one write with the once-only ones noted as begun, then those (a page) ─► next look

One step per reconcile: every stage waits for the world (a job to end, pods to leave, a Job's verdict), so nothing
carries. When the check fails the record moves to Detected, and the heal (healing.py) takes it from there.
"""
from __future__ import annotations

import logging
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.core import diagnosis
from gpufleet.reconciler.core.model import Remediation, Step
from gpufleet.reconciler.errors import PermanentError
from gpufleet.reconciler.runtime.alerts import Alerts
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor, apply_step
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)


class Diagnoses:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, executor: Executor, alerts: Alerts,
                 metrics: Metrics, clock: Callable, checks=None):
        self.spec, self.caches, self.facts, self.executor = spec, caches, facts, executor
        self.alerts, self.metrics, self.clock, self.checks = alerts, metrics, clock, checks

    def reconcile(self, r: Remediation) -> float | None:
        """One step of `r`'s diagnosis. A Slurm or API error that may pass is retried on the node's key."""
        facts = self.observe(r)
        return self._apply(r, diagnosis.plan(r, facts, self.spec, self.clock()))

    def observe(self, r: Remediation) -> diagnosis.DiagnosisFacts:
        need = diagnosis.needs(r)
        c = self.caches
        verdict = None
        if need.verdict:
            if self.checks is None:
                raise PermanentError("no health-check adapter: cannot read a health check")
            verdict = self.checks.verdict(need.verdict)
        return diagnosis.DiagnosisFacts(
            node=c.nodes.get(r.node), pods=tuple(c.pods_on(r.node)), slurm=self.facts.slurm_views(need.slurm),
            jobs=self.facts.jobs_on(need.slurm),
            slurm_pods=tuple(p for n in r.slurm_nodes for p in c.pods.by_index("slurm", n)), verdict=verdict)

    def _apply(self, r: Remediation, step: Step) -> float | None:
        """The step applied (executor.apply_step); when to look again."""
        written = apply_step(self.executor, self.metrics, r, step, self.alerts.moved)
        if written is None:
            return step.recheck_after
        if self.executor.dry_run:
            return None
        return step.recheck_after
