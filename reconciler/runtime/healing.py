"""The healing reconcile of one node: detect its fault, then take the steps of its remediation that
follow from each other now, and end with one write.

    caches ─► facts (what the core's `needs` asks) ─► core (detect | plan_step | retry) ─► executor ─┐
        ▲── the step carries (Step.carry) and the next follows at once ◄─────────────────────────────┤
    write the status once, with the once-only actions noted ─► run those ─► next look (decide.next_look)

A slow or hanging call (Slurm, the API server, a webhook) delays only its own node. Admission and the
choice of a spare are planned under the claims lock, with the steps being applied counted, so no slot
and no spare is given twice. A step that carries is written with the next; one that does not ends the
reconcile with its write. Its actions run only on top of a written remediation: when something carried
is not written yet, that is written first and the step is planned again (level-based, from what is then
seen). A new remediation is also written before its first Slurm call, and goes on. Once-only actions run
after the write that notes them as begun, so a crash repeats idempotent actions at most, never a page; an
at-least-once action (the SIGTERM) is marked delivered by one more write after its send, and the core plans
it again while it is not (`core/signals.py`). A dry run plans every step it can take now, writes and runs
nothing, and logs each.

Before that, the node's records with a refill outstanding are settled when it was answered or its deadline
passed (`core/refills.py`), by the same worker, so one record never has two writers.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.records import Unreadable
from gpufleet.reconciler.core import decide as core
from gpufleet.reconciler.core import job_boundary, node_lost, oncall
from gpufleet.reconciler.core import refills
from gpufleet.reconciler.core.actions import Action
from gpufleet.reconciler.core.model import Needs, Remediation, Step
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.core.slurm_states import ON_NODE_JOB_STATES
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.alerts import Alerts
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.claims import Claims
from gpufleet.reconciler.runtime.executor import Executor, NotLeader, context
from gpufleet.reconciler.runtime.facts import Facts
from gpufleet.reconciler.runtime.metrics import Metrics
from gpufleet.reconciler.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)
UNSYNCED_RECHECK = 0.5
MAX_CARRIED = 12  # steps one reconcile takes at most before it writes (a bound, not a rule: no path is this long)


def begun(r: Remediation, a: Action) -> bool:
    """Whether `r` has `a` (a once-only action) behind it: noted as begun, or for an at-least-once one,
    marked delivered."""
    return a.once in (r.delivered if a.at_least_once else r.intents)


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class Healing:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, claims: Claims, executor: Executor,
                 alerts: Alerts, metrics: Metrics, queue: WorkQueue, clock: Callable[[], datetime], repairs=None,
                 diagnoses=None):
        self.spec, self.caches, self.facts, self.claims = spec, caches, facts, claims
        self.executor, self.alerts, self.metrics, self.queue, self.clock = executor, alerts, metrics, queue, clock
        self.repairs = repairs  # runtime/repairs.py: what follows a heal (issue 25)
        self.diagnoses = diagnoses  # runtime/diagnoses.py: a node checked while it stays in service

    def reconcile(self, node: str) -> float | None:
        """One node. Returns seconds until it wants another look (None: on an event, or the resync)."""
        if not self.caches.synced():
            return UNSYNCED_RECHECK  # a decision on a half-filled cache sees no spares and no remediations
        mine = self.caches.remediations.by_index("node", node)
        bad = [r for r in mine if isinstance(r, Unreadable)]
        if bad:
            for name, report in self.alerts.unreadable(node, bad):
                self.executor.run(report)
                if not self.executor.dry_run:
                    self.alerts.reported(name)
            return None
        ours = self._ours(mine)
        wrote, refill_look = self._settle_refills(ours)
        if wrote:
            ours = self._ours(self.caches.remediations.by_index("node", node))  # as just written
        live = sorted((r for r in ours if r.active), key=lambda r: (r.created, r.name))
        repairs = self.repairs is not None and self.repairs.wants(node)
        if not live:
            return _sooner(self.repairs.reconcile(node) if repairs else self._detect(node, ours), refill_look)
        r, now = live[0], self.clock()
        if r.phase is Phase.DIAGNOSING:
            return _sooner(self._diagnose(r), refill_look)
        if r.next_attempt and now < r.next_attempt:
            delay = core.next_look(r, None, False, now)
        else:
            delay = self._advance(r)
        if repairs:  # repaired in place while its heal waits for a spare (the repair reads the heal's write)
            delay = _sooner(delay, self.repairs.reconcile(node))
        return _sooner(delay, refill_look)

    def _diagnose(self, r: Remediation) -> float | None:
        """A step of a diagnosis (runtime/diagnoses.py); a check that failed makes it a heal, looked at again at
        once (its step asks for that). An error backs off on the node's key and is tried again: a diagnosis
        leaves the node in service meanwhile."""
        if self.diagnoses is None:
            return None
        try:
            return self.diagnoses.reconcile(r)
        except (TemporaryError, PermanentError) as e:
            kind = "temporary" if isinstance(e, TemporaryError) else "permanent"
            self.metrics.action_errors.labels("diagnosis", kind).inc()
            log.warning("diagnosis of %s (%s failure): %s; tried again", r.node, kind, e, extra=context(r))
            return 10.0 if kind == "temporary" else 60.0

    def _ours(self, records: list) -> list[Remediation]:
        pools = {p.name for p in self.spec.pools}
        return [r for r in records if isinstance(r, Remediation) and r.pool in pools]  # others are not this fleet's

    def _settle_refills(self, records: list[Remediation]) -> tuple[bool, float | None]:
        """Record what became of each outstanding refill (answered, refused by the provider, or due) and ask
        again for each failed one whose time came: whether a record was written, and seconds until the next
        look at those still open (None: none is)."""
        soonest: float | None = None
        wrote = False
        for r in records:
            if not (refills.outstanding(r) or refills.to_retry(r)):
                continue
            now = self.clock()
            retry = refills.to_retry(r)
            if retry and refills.due(r, self.spec) > now:
                soonest = _sooner(soonest, refills.next_look(r, self.spec, now))
                continue
            answered = {n.fulfils for n in self.caches.nodes.by_index("pool", r.pool) if n.fulfils}
            if retry:  # asked again only while the pool lacks a node, and the provider has room
                refusal = self.facts.refusal(r.pool)
                step = refills.settle(r, answered, self.spec, now, stock_now=self.facts.stock(r),
                                      can_refill=not refusal, refusal=refusal)
            else:
                step = refills.settle(r, answered, self.spec, now, refusals=self._refusals(r))
            if step is None:
                soonest = _sooner(soonest, refills.next_look(r, self.spec, now))
                continue
            once = [a for a in step.actions if a.once]
            for a in step.actions:
                if a.once is None:
                    self.executor.run(a, r)
            self._flush(replace(step.remediation, revision=r.revision), True, once)
            wrote = True
            soonest = _sooner(soonest, refills.next_look(step.remediation, self.spec, now))
        return wrote, soonest

    def _refusals(self, r: Remediation) -> dict[str, str]:
        """The provider's no to `r`'s outstanding request (kubernetes-spares: the cluster autoscaler's Event
        on the placeholder), read at each look."""
        read = getattr(self.facts.providers.get(r.pool), "capacity_refusals", None)
        if read is None or r.refill is None:
            return {}
        try:
            return read(r.pool, [refills.request_name(r.pool, r.refill.key)])
        except TemporaryError as e:
            log.warning("capacity answers of pool %s unreadable now: %s", r.pool, e)
            return {}

    def _detect(self, node: str, remediations: list[Remediation]) -> float | None:
        view = self.caches.nodes.get(node)
        if view is None:
            return None
        now = self.clock()
        names = slurm_nodes_on(node, self.caches.pods_on(node)).names
        carries = bool(names)  # a NodeSet pod is on it
        on = None
        if core.boundary_facts_needed(view, remediations):  # NVIDIA's DRAIN_AND_RESET: does a job run there?
            jobs = self.facts.jobs_on(names)
            on = job_boundary.OnNode(self.facts.slurm_views(names),
                                     tuple(sorted(j.job_id for j in jobs if j.state in ON_NODE_JOB_STATES)))
        d = core.detect(view, remediations, self.spec, now, carries_nodeset_pod=carries, on_node=on)
        for a in d.actions:
            self.executor.run(a)
        if d.gate is not None:
            self.alerts.gate(d.gate)
        if d.remediation is None:
            # a node not Ready is looked at again when it would count as lost (no event marks a timeout), one
            # waiting for its job's boundary when that may have come (no event marks a job's end)
            return _sooner(node_lost.look_again_after(view, self.spec, now, carries), d.look_after)
        delay = self._advance(d.remediation, stored=False)  # contain at once: the cordon is the first step
        if delay == 0.0:
            self.queue.add(node, soon=True)  # its next step (admission, or containment's rest) after new faults
        return delay

    def _advance(self, first: Remediation, stored: bool = True) -> float | None:
        """The steps of one remediation that follow from each other now, ended by one write (a new
        remediation's containment by two: its create and first status, before the first Slurm call, and
        the end of containment)."""
        dry = self.executor.dry_run
        current, once, dirty, wrote = first, [], not stored, False
        step: Step | None = None
        doing = "observe"
        try:
            for _ in range(MAX_CARRIED):
                if not stored and core.needs(current, self.clock()).asks_slurm:
                    # A new remediation is written (and its page sent) before its first Slurm call, so a Slurm
                    # that hangs delays neither; its containment then goes on in this reconcile.
                    written = self._flush(current, False, once)
                    if written is None:
                        self.claims.release(first.name)
                        return 0.0  # made already (another replica, or before a restart): the informer brings it
                    current, stored, dirty, once, wrote = written, True, False, [], True
                doing = "observe"
                step = self._plan(current)
                if step.gate is not None:
                    self.alerts.gate(step.gate)
                if dirty and step.remediation is not None and not (step.carry or dry) and step.actions:
                    self.claims.hold(current)  # not the step it will not apply now
                    step = Step(recheck_after=0.0)  # write what was carried; this step next time
                    break
                doing = step.actions[0].kind if step.actions else "persist"
                for a in step.actions:
                    if a.once is None:
                        self.executor.run(a, current)
                    elif not begun(current, a) and all(a.once != b.once for b in once):
                        once.append(a)
                if step.remediation is None:
                    break
                new = replace(step.remediation, revision=current.revision,
                              intents=tuple(dict.fromkeys(current.intents + step.remediation.intents)))
                if new.phase is not current.phase:
                    self.alerts.moved(current, new)
                current, dirty = new, True
                self.claims.hold(current, Step(tuple(once)))
                if not (step.carry or dry) or current.phase.terminal or current.next_attempt is not None:
                    break
            else:
                step = Step(recheck_after=0.0)
        except NotLeader:
            self.claims.release(first.name)
            raise
        except (TemporaryError, PermanentError) as e:
            kind = "temporary" if isinstance(e, TemporaryError) else "permanent"
            self.metrics.action_errors.labels(doing, kind).inc()
            log.warning("%s failure (%s): %s", kind, doing, e, extra=context(current))
            step = (core.retry(current, f"{doing}: {e}", self.spec, self.clock()) if isinstance(e, TemporaryError)
                    else core.fail(current, f"{doing}: {e}", self.clock()))
            once += [a for a in step.actions if a.once and not begun(current, a)]
            if step.remediation is not None:
                old, current, dirty = current, replace(step.remediation, revision=current.revision), True
                if current.phase is not old.phase:
                    self.alerts.moved(old, current)
        try:
            if dirty or once:
                written = self._flush(current, stored, once, changed=dirty)
                if written is None:
                    return 0.0  # made already (another replica, or before a restart): the informer brings it
                current, wrote = written, True
        finally:
            self.claims.release(first.name)
        if dry and wrote:
            return None  # nothing was written: looked at again on an event or the resync, not in a loop
        return core.next_look(current, step, current.phase is not first.phase, self.clock())

    def _plan(self, r: Remediation) -> Step:
        """Observe what the core asks for, then ask the core; facts counted across nodes, and the step,
        under the claims lock (so no slot and no spare is given twice). One time for both: what was read
        for a deadline (`needs`) is what the step decides by."""
        now = self.clock()
        if oncall.pending(r) is not None:  # a person's decision first (issue 23, item 7)
            seen = self.facts.observe(r, Needs(pods=True, slurm_nodes=r.slurm_nodes))
            step = oncall.plan_live(r, seen, self.spec, now)
            if step is not None:
                return step
        need = core.needs(r, now)
        observed = self.facts.observe(r, need)
        if not need.shared:
            return core.plan_step(r, observed, self.spec, now)
        with self.claims.lock:
            step = core.plan_step(r, self.facts.shared(r, need, observed), self.spec, now)
            if step.remediation is not None:
                self.claims.take(step.remediation, step)
            return step

    def _flush(self, r: Remediation, stored: bool, once: list[Action], changed: bool = True) -> Remediation | None:
        """Write the remediation with the once-only actions noted as begun (unless nothing changed: an
        at-least-once action sent again), then run those; an at-least-once one that went out is marked
        delivered by one more write. One that fails is logged: an at-most-once one is not repeated (it may
        have got through), an at-least-once one is planned again. The remediation as written; None when a
        create finds it made already."""
        noted = replace(r, intents=tuple(dict.fromkeys(r.intents + tuple(a.once for a in once))))
        if not stored and not self.executor.create(noted):
            return None
        written = noted if stored and not changed and noted.intents == r.intents else self.executor.write_status(noted)
        delivered = []
        for a in once:
            try:
                self.executor.run(a, written)
            except (TemporaryError, PermanentError) as e:
                self.metrics.action_errors.labels(a.kind, "once-only").inc()
                again = "planned again" if a.at_least_once else "not repeated"
                log.error("%s failed and is %s: %s", a.kind, again, e, extra=context(written))
                continue
            if a.at_least_once:
                delivered.append(a.once)
        if delivered and not self.executor.dry_run:
            written = self.executor.write_status(
                replace(written, delivered=tuple(dict.fromkeys(written.delivered + tuple(delivered)))))
        return written
