"""A SlurmJob (what the Slurm clients read) as the core's JobFacts: for `gpufleet why` and for the job owners'
message the job notes pass sends. For a pending job Slurm's start_time is an expected start, for a running
one end_time the expected end (slurmrestd's `v0.0.45_job_info`: start_time, end_time), so neither is taken
then."""
from __future__ import annotations

from datetime import datetime, timezone

from gpufleet.reconciler.adapters.slurm import SlurmJob
from gpufleet.reconciler.core.job_story import ENDED, JobFacts


def _time(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, timezone.utc) if epoch else None


def job_facts(j: SlurmJob, source: str = "slurmctld", admin_comment: str | None = None) -> JobFacts:
    """`source`: slurmctld, or accounting; `admin_comment`: the one just written, in place of the one read."""
    started = None if j.state == "PENDING" else _time(j.start_time)
    ended = _time(j.end_time) if j.state in ENDED else None
    text = j.admin_comment if admin_comment is None else admin_comment
    return JobFacts(j.job_id, j.name, j.state, j.user, j.account, j.nodes, _time(j.submit_time), started, ended,
                    j.restarts, j.reason, j.exit_code, text or "", source)
