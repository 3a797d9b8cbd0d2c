"""The job notes pass (a timed runnable): every job a remediation signalled, requeued or held gets a dated
line in its Slurm admin comment (`core/job_notes.py` says which), and one more when it runs again.

Apart from healing on purpose: a Slurm that refuses or does not answer delays only these notes, never a
heal. Level-based: each pass reads the jobs still owed a line and appends what is missing, so a failed
write, a crash or a new leader is made good on a later pass (at least once; a line present is never added
again). Jobs with nothing more to come are remembered as settled and not read again.

A fault that leaves its node in service (restart-app, diagnose, or NVIDIA's drain-and-reset while the job runs to its
end: core/job_boundary.py), read from a node's condition, reaches the
jobs running on that node's Slurm nodes the same way: a line each (`job_notes.notice_line`), and their
owners told; once per node and signal.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Callable

from gpufleet.fleetspec.models import FleetSpec

from gpufleet.reconciler.adapters.slurm import SlurmClient, SlurmJob, call
from gpufleet.reconciler.adapters.slurm.job_facts import job_facts
from gpufleet.reconciler.core import engineer_story, job_notes, job_record
from gpufleet.reconciler.core.job_story import JobFacts
from gpufleet.reconciler.core.actions import NoteJob, NotifyOwner
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.slurm_names import slurm_nodes_on
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.caches import Caches
from gpufleet.reconciler.runtime.executor import Executor
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
BUSY, IDLE, AFTER_ERROR = 2.0, 5.0, 15.0  # seconds to the next pass: jobs owed a line, none (it reads only the cache), a failure


def job_seen(j: SlurmJob) -> job_notes.JobSeen:
    start = datetime.fromtimestamp(j.start_time, timezone.utc) if j.start_time else None
    return job_notes.JobSeen(j.job_id, j.state, j.nodes, start, j.admin_comment or "", j.user, j.account)


class JobNotesPass:
    def __init__(self, spec: FleetSpec, caches: Caches, slurm: SlurmClient | None, executor: Executor,
                 metrics: Metrics, clock: Callable[[], datetime]):
        self.spec, self.caches, self.slurm, self.executor = spec, caches, slurm, executor
        self.metrics, self.clock = metrics, clock
        self._settled: set[tuple[str, int]] = set()  # (remediation, job) owed nothing more
        self._unreadable_said = False
        self._told: dict[int, list[datetime]] = {}  # job -> when its owner was told (the rate limit)
        self._routes = [t for t in spec.healing.notifications if getattr(t, "job_owners", None) is not None]
        self._noticed: set[tuple[str, datetime]] = set()  # (node, signal) whose jobs got their line
        self._models = {p.name: p.gpu_model for p in spec.pools}  # the GPU model each record names

    def __call__(self) -> float:
        if self.slurm is None:
            return IDLE * 10
        self.executor.fenced()
        pools = {p.name for p in self.spec.pools}
        pairs = [(r, j) for r in self.caches.remediations_in(pools) for j in r.jobs]
        self._settled &= {(r.name, j) for r, j in pairs}  # forget what retention deleted
        owed = [(r, j) for r, j in pairs if (r.name, j) not in self._settled]
        failed = False
        for r, jid in sorted(owed, key=lambda x: (x[0].created, x[0].name, x[1])):
            try:
                self._note(r, jid)
            except (TemporaryError, PermanentError) as e:
                failed = True
                kind = "temporary" if isinstance(e, TemporaryError) else "permanent"
                self.metrics.action_errors.labels("NoteJob", kind).inc()
                log.warning("job %s: admin comment not written (%s), tried again later: %s", jid, kind, e,
                            extra={"remediation": r.name, "node": r.node})
        try:
            self._notices(pools)
        except (TemporaryError, PermanentError) as e:
            failed = True
            log.warning("a fault that leaves its node in service was not noted on its jobs, tried again later: %s", e)
        if failed:
            return AFTER_ERROR
        return BUSY if any((r.name, j) not in self._settled for r, j in owed) else IDLE

    def _notices(self, pools: set[str]) -> None:
        """Each node fault that leaves the node in service, once: a line on each job running there, its owner told."""
        now_faults = {(n.name, n.fault.since): n for n in self.caches.nodes.values()
                      if n.pool in pools and n.fault is not None and job_notes.noticed(n.fault)}
        self._noticed &= set(now_faults)  # forget what cleared
        for key, n in sorted(now_faults.items()):
            if key in self._noticed:
                continue
            for name in sorted(slurm_nodes_on(n.name, self.caches.pods_on(n.name)).names):
                for running in call(self.slurm.jobs_on_node, name):
                    found = call(self.slurm.job, running.job_id)  # with its admin comment, as `_note` reads it
                    if found is None:
                        continue
                    seen = job_seen(found)
                    line = job_notes.notice_line(name, n.fault, seen)  # the Slurm node: what the engineer knows
                    if line is None or found.admin_comment is None or not job_notes.writable(seen):
                        continue
                    rec = job_record.notice_record(n.name, slurm_nodes_on(n.name, self.caches.pods_on(n.name)).names,
                                                   n.fault, self._models.get(n.pool or "", ""))
                    text = job_notes.appended(seen.admin_comment, seen.job_id, (line,), (job_record.encode(rec),))
                    if text is not None:
                        self.executor.run(NoteJob(seen.job_id, text))
                        if not self.executor.dry_run:
                            log.info("job %s: admin comment noted (%s on %s)", seen.job_id, n.fault.needs.value, n.name)
                            self._tell(None, seen, [line], job_facts(found, admin_comment=text))
            self._noticed.add(key)

    def _note(self, r: Remediation, jid: int) -> None:
        found = call(self.slurm.job, jid)
        seen = job_seen(found) if found is not None else None
        if found is not None and found.admin_comment is None:
            if not self._unreadable_said:
                log.warning("this Slurm backend does not read admin comments (use --slurm rest): jobs get no notes")
                self._unreadable_said = True
            self._settled.add((r.name, jid))
            return
        if seen is not None and job_notes.writable(seen):
            peers = [p for p in self.caches.remediations_in({x.name for x in self.spec.pools}) if jid in p.jobs]
            lines = job_notes.lines_for(r, seen, peers)
            records = [job_record.encode(job_record.record_of(p, self._models.get(p.pool, ""))) for p in
                       sorted({p.name: p for p in [r, *peers]}.values(), key=lambda p: (p.created, p.name))]
            text = job_notes.appended(seen.admin_comment, jid, lines, records)
            if text is not None:
                self.executor.run(NoteJob(jid, text), r)
                if not self.executor.dry_run:
                    log.info("job %s: admin comment noted", jid, extra={"remediation": r.name, "node": r.node})
                    back = job_notes.back_after(r, seen)
                    if back is not None and any(job_notes.RESUMED in x and x not in seen.admin_comment for x in lines):
                        self.metrics.job_back_seconds.observe(back)  # once: when its resume line is written
                    self._tell(r, seen, [x for x in lines if x not in seen.admin_comment], job_facts(found, admin_comment=text))
        if job_notes.settled(r, seen, self.clock()):
            self._settled.add((r.name, jid))

    def _tell(self, r: Remediation | None, job: job_notes.JobSeen, new_lines: list[str], facts: JobFacts) -> None:
        """Each line just written, to the owner routes of the job's user or account, within the rate limit, as
        the engineer's paragraph `gpufleet why` prints on the login node (core/engineer_story.py, from what
        Slurm now holds). Sent after the line is in Slurm, so a line is told once (a crash in between loses the
        message)."""
        routes = job_notes.owner_routes(self._routes, job)
        if not routes:
            return
        per_hour = min(t.job_owners.max_per_job_per_hour for t in self._routes if t.name in routes)
        for line in new_lines:
            now, sent = self.clock(), self._told.setdefault(job.job_id, [])
            if not job_notes.may_tell(sent, now, per_hour):
                log.warning("job %s: owner not told (more than %d messages within the hour): %s", job.job_id,
                            per_hour, line, extra={"remediation": r.name if r else ""})
                continue
            sent.append(now)
            records = job_record.records_in(facts.admin_comment, job_notes.SEPARATOR)
            paragraph = engineer_story.tell(job.job_id, facts, records, now).paragraph
            for route in routes:
                self.executor.run(NotifyOwner(route, job.job_id, job.user, job.account, job_notes.event_of(line),
                                              f"your job {job.job_id}: {paragraph}"), r)
