"""The diagnosis of one node (a `diagnose` fault: the node is checked while it stays in service), through the same
node queue as its heal: a remediation in the Diagnosing phase is this module's (core/diagnosis.py decides).

    caches (+ Slurm, + the health-check Job) ─► core (diagnosis.plan) ─► executor
    idempotent actions, then one write with the once-only ones noted as begun, then those (a page) ─► next look

One step per reconcile: every stage waits for the world (a job to end, pods to leave, a Job's verdict), so nothing
carries. When the check fails the record moves to Detected, and the heal (healing.py) takes it from there.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

from fleetspec.models import FleetSpec

from reconciler.core import diagnosis
from reconciler.core.actions import Action
from reconciler.core.model import Remediation, Step
from reconciler.errors import PermanentError, TemporaryError
from reconciler.runtime.alerts import Alerts
from reconciler.runtime.caches import Caches
from reconciler.runtime.executor import Executor, context
from reconciler.runtime.facts import Facts
from reconciler.runtime.metrics import Metrics

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
        """Idempotent actions, then the write with the once-only ones noted, then those (as repairs.py)."""
        once: list[Action] = []
        for a in step.actions:
            if a.once is None:
                self.executor.run(a, r)
            elif a.once not in r.intents:
                once.append(a)
        if step.remediation is None:
            return step.recheck_after
        new = replace(step.remediation, revision=r.revision,
                      intents=tuple(dict.fromkeys(r.intents + tuple(a.once for a in once))))
        if new.phase is not r.phase:
            self.alerts.moved(r, new)
        written = self.executor.write_status(new)
        for a in once:
            try:
                self.executor.run(a, written)
            except (TemporaryError, PermanentError) as e:
                self.metrics.action_errors.labels(a.kind, "once-only").inc()
                log.error("%s failed and is not repeated: %s", a.kind, e, extra=context(written))
        if self.executor.dry_run:
            return None
        return step.recheck_after
