"""A job as the engineer's own `scontrol` shows it: `scontrol --json show job JOBID`, run as the user on the
login node (Slinky's LoginSet: sackd authenticates the user, no token needed). slurmctld answers with what
this user may see (slurm.conf PrivateData); scontrol prints it through the same data_parser as slurmrestd's
GET /slurm/v0.0.45/job/{id} (Slurm 26.05 src/scontrol/info_job.c, `--json`: DATA_PARSER_JOB_INFO_MSG), so
the REST client's models read it (rest.py JobsResponse)."""
from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from gpufleet.reconciler.adapters.slurm import SlurmError, SlurmJob
from gpufleet.reconciler.adapters.slurm.rest import ESLURM_ACCESS_DENIED, ESLURM_INVALID_JOB_ID, JobsResponse, _job


def jobs_from_json(text: str) -> list[SlurmJob]:
    """The jobs in scontrol's `--json` output; SlurmError when it is not that."""
    try:
        resp = JobsResponse.model_validate_json(text)
    except ValidationError as e:
        raise SlurmError(f"scontrol --json: not a job listing ({e.error_count()} error(s))") from None
    return [_job(j) for j in resp.jobs]


Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


class ScontrolJobs:
    """`job(id)` through the user's own scontrol."""

    def __init__(self, scontrol: str = "scontrol", run: Run = _run):
        self.scontrol, self.run = scontrol, run

    def job(self, job_id: int) -> SlurmJob | None:
        """The job, or None when slurmctld shows this user no such job (unknown, purged, or not theirs to see)."""
        try:
            r = self.run([self.scontrol, "--json", "show", "job", str(int(job_id))])
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"scontrol: {e}", temporary=True) from None
        try:
            resp = JobsResponse.model_validate_json(r.stdout)
        except ValidationError:
            raise SlurmError(f"scontrol show job {job_id} ({r.returncode}): {(r.stderr or r.stdout).strip()[:300]}") \
                from None
        if {e.error_number for e in resp.errors} & {ESLURM_INVALID_JOB_ID, ESLURM_ACCESS_DENIED}:
            return None  # unknown to slurmctld, or not this user's to see
        if resp.errors or r.returncode != 0:
            raise SlurmError(f"scontrol show job {job_id}: {'; '.join(map(str, resp.errors)) or r.stderr.strip()}")
        return next((_job(j) for j in resp.jobs if j.job_id == int(job_id)), None)
