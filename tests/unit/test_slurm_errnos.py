"""Which Slurm errors the REST client retries: Slurm 26.05's numbers (slurm/slurm_errno.h at
slurm-26-05-3-1), through a slurmrestd stand-in that answers with them (httpx.MockTransport)."""
from __future__ import annotations

import json

import httpx
import pytest

from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import SlurmREST


class _Tokens:
    def token(self) -> str:
        return "t"

    def refresh(self) -> str:
        return "t"

    def describe(self) -> str:
        return "test"


def _client(errno: int, description: str = "", job_state: str = "RUNNING") -> SlurmREST:
    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        if req.method == "GET" and req.url.path.startswith("/slurm/v0.0.45/job/"):
            jid = int(req.url.path.rstrip("/").rsplit("/", 1)[1])
            return httpx.Response(200, json={"jobs": [{"job_id": jid, "job_state": [job_state], "state_reason": "None"}]})
        return httpx.Response(500, json={"errors": [{"error_number": errno, "description": description,
                                                     "error": "", "source": "slurmctld"}]})
    return SlurmREST("http://slurmrestd", _Tokens(), transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("errno,name", [
    (2020, "ESLURM_TRANSITION_STATE_NO_UPDATE"),
    (2027, "ESLURM_IN_STANDBY_MODE"),
    (2131, "ESLURM_IN_STANDBY_USE_BACKUP"),
    (1800, "SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR"),
    (1804, "SLURMCTLD_COMMUNICATIONS_BACKOFF"),
])
def test_errors_that_pass_are_retried(errno, name):
    with pytest.raises(SlurmError) as e:
        _client(errno).drain("gpu-0", "gpufleet: test")
    assert e.value.temporary, name


@pytest.mark.parametrize("errno,name", [
    (2036, "ESLURM_NOT_SUPPORTED: retried for the whole retry budget before"),
    (2026, "ESLURM_BAD_TASK_COUNT: was taken for TRANSITION_STATE_NO_UPDATE"),
    (2035, "ESLURM_FRAGMENTATION: was taken for standby"),
    (2018, "ESLURM_INVALID_NODE_NAME"),
])
def test_errors_that_do_not_pass_fail_at_once(errno, name):
    with pytest.raises(SlurmError) as e:
        _client(errno).drain("gpu-0", "gpufleet: test")
    assert not e.value.temporary, name


def test_release_skips_a_job_slurm_says_is_no_longer_pending():
    """ESLURM_JOB_NOT_PENDING is 2073 (2019 is ESLURM_WRITING_TO_FILE): a job that started between the
    look and the update is left alone; another error still fails."""
    _client(2073, job_state="PENDING").release([7])
    with pytest.raises(SlurmError):
        _client(2019, job_state="PENDING").release([7])


def test_the_table_is_the_headers_numbering():
    from gpufleet.reconciler.adapters.slurm import rest

    assert (rest.ESLURM_INVALID_JOB_ID, rest.ESLURM_TRANSITION_STATE_NO_UPDATE, rest.ESLURM_ALREADY_DONE,
            rest.ESLURM_IN_STANDBY_MODE, rest.ESLURM_NOT_SUPPORTED, rest.ESLURM_JOB_NOT_PENDING,
            rest.ESLURM_IN_STANDBY_USE_BACKUP, rest.ESLURM_INVALID_NODE_STATE_TRANSITION) == \
        (2017, 2020, 2021, 2027, 2036, 2073, 2131, 2180)
    assert json.dumps(sorted(rest._TEMPORARY_ERRNOS)) == json.dumps(
        [1001, 1002, 1003, 1004, 1800, 1801, 1802, 1803, 1804, 2020, 2027, 2131, 5004, 5005])
