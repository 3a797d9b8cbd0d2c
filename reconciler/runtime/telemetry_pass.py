"""The telemetry pass (a timed runnable): read dcgm-exporter's GPU metrics (adapters/dcgm.py), let the core judge
them (core/telemetry.py: thresholds, stragglers, hangs) and carry out what it asks.

A degraded node gets gpufleet's GPU condition and the node queue heals it like any fault; a job-boundary row drains
it in Slurm first. A hang is paged once per run of the job, and requeued where the pool consents. The samples are
remembered in memory for the longest span a rule reads: a new leader or a restart reads the spans again from its
start, so it decides later, never twice (a condition written is on the node, a drain in Slurm, a hang's line in the
job's admin comment, written before its page: core/telemetry.py `paged_before`). Where that line cannot be written
(Slurm refuses it), the page still goes, deduplicated in this process's memory only.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.dcgm import TelemetryReader, reader_for
from gpufleet.reconciler.adapters.slurm import SlurmClient, SlurmError, call
from gpufleet.reconciler.core import telemetry
from gpufleet.reconciler.core.actions import NoteJob
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.facts import Facts, slurm_view

log = logging.getLogger(__name__)
OFF = 600.0  # seconds to the next look when no source is declared (the spec is fixed for the process's life)


class TelemetryPass:
    def __init__(self, spec: FleetSpec, caches: Caches, facts: Facts, slurm: SlurmClient | None, executor: Executor,
                 clock: Callable[[], datetime], reader: TelemetryReader | None = None):
        self.spec, self.caches, self.facts, self.slurm, self.executor = spec, caches, facts, slurm, executor
        self.clock = clock
        self.reader = reader or reader_for(spec.healing.telemetry, clock)
        self.history: dict = {}
        self.pci: dict[tuple[str, str], str] = {}
        self._paged: set[str] = set()  # hang pages sent: Hang.key, one per run of a job
        self.last: list[telemetry.Degradation] = []  # the pass's latest verdicts (metrics, tests)
        self.hung: list[telemetry.Hang] = []

    def __call__(self) -> float:
        every = float(self.spec.healing.telemetry.every_seconds)
        if self.reader is None:
            return OFF
        self.executor.fenced()
        now = self.clock()
        samples, pci = self.reader.read()
        self.pci.update(pci)
        self.history = telemetry.remember(self.history, samples, now, telemetry.keep_seconds(self.spec))
        pools = {p.name for p in self.spec.pools}
        views = {n.name: n for p in pools for n in self.caches.nodes.by_index("pool", p)}
        # a node whose GPU condition is False (its heal and repair until the check passes) is judged afresh after
        self.history = telemetry.forget(self.history, [k for k, v in views.items() if v.fault is not None])
        on = {name: slurm_nodes_on(name, self.caches.pods_on(name)).names for name in views}
        where = {s: k for k, names in on.items() for s in names}  # Slurm node -> Kubernetes node
        running = call(self.slurm.running_jobs) if self.slurm is not None else []
        jobs = []
        for j in running:
            kube = tuple(sorted({where[s] for s in j.nodes if s in where}))
            if kube:
                started = datetime.fromtimestamp(j.start_time, timezone.utc) if j.start_time else None
                jobs.append(telemetry.RunningJob(j.job_id, kube, tuple(sorted({views[k].pool or "" for k in kube})),
                                                 started, j.admin_comment))
        degraded = telemetry.crossed(self.history, now, self.pci)
        seen = {d.node for d in degraded}
        degraded += [d for d in telemetry.stragglers(jobs, self.history, self.spec, now, self.pci) if d.node not in seen]
        self.last = degraded
        mine = {s for names in on.values() for s in names}
        by_name = {n.name: slurm_view(n, self.facts.users) for n in call(self.slurm.nodes) if n.name in mine} \
            if self.slurm is not None else {}
        busy = {k: tuple(sorted({j.job_id for j in jobs if k in j.nodes})) for k in views}
        nodes = {k: telemetry.NodeJobs(v, tuple(by_name[s] for s in on[k] if s in by_name), busy[k])
                 for k, v in views.items()}
        for a in telemetry.plan(degraded, nodes, self.spec, now):
            self.executor.run(a)
        self.hung = telemetry.hangs(jobs, self.history, self.spec, now)
        for h in self.hung:
            if h.key in self._paged:
                continue
            self._paged.add(h.key)  # at most once: a page lost in a crash here is the lesser harm than two
            if not telemetry.paged_before(h):
                log.warning("%s", h.text(), extra={"job": h.job_id})
            for a in telemetry.page_hang(h):
                if not self._run_page(a):
                    self._paged.discard(h.key)  # its line could not be written now: paged at the next pass
                    break
        self._paged &= {h.key for h in self.hung}  # a run no longer hung is forgotten
        return every

    def _run_page(self, a) -> bool:
        """Run a hang's action; False when it is its admin-comment line and Slurm cannot take it now (the page waits
        for the next pass). A line Slurm refuses for good is logged, and the page goes, deduplicated in memory only."""
        try:
            self.executor.run(a)
        except (TemporaryError, PermanentError, SlurmError) as e:
            if not isinstance(a, NoteJob):
                raise
            if isinstance(e, TemporaryError) or (isinstance(e, SlurmError) and e.temporary):
                log.warning("job %s: its hang line not written now (%s): paged at the next pass", a.job_id, e)
                return False
            log.warning("job %s: its hang line refused (%s): paged, deduplicated in memory only", a.job_id, e)
        return True
