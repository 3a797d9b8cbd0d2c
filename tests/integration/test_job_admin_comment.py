"""The admin comment over slurmrestd, on the real Slurm 26.05: what the job notes rely on.

slurmrestd v0.0.45 takes `admin_comment` in a job update (POST /slurm/v0.0.45/job/{id}, job_desc_msg; its
generated OpenAPI), and slurmctld lets only a super user set it (slurm-26-05-3-1 src/slurmctld/job_mgr.c,
`_update_job`): here the SlurmUser's token may, another user's may not. A requeue keeps it, and the
user's own comment is a field apart."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from tests.integration.test_slurm_contract import running, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_slurm_user_sets_the_admin_comment_a_requeue_keeps_it_and_the_users_comment_is_untouched(
        slurm_fresh: LocalSlurm, slurm_rest: SlurmREST, tmp_path: Path) -> None:
    job_id = submit(slurm_fresh, tmp_path / "job", "--comment=my lr sweep")
    wait_for("the job to run", lambda: running(slurm_rest, job_id))
    assert slurm_rest.job(job_id).admin_comment == "" and slurm_rest.job(job_id).comment == "my lr sweep"
    slurm_rest.set_admin_comment(job_id, "checked by ops | gpufleet 2026-12-02T03:12:07Z: requeued: XID 79")
    slurm_rest.requeue([job_id])
    job = wait_for("the requeue", lambda: (j := slurm_rest.job(job_id)) and j.state == "PENDING" and j)
    assert job.admin_comment == "checked by ops | gpufleet 2026-12-02T03:12:07Z: requeued: XID 79"
    assert job.comment == "my lr sweep" and job.user and job.submit_time
    shown = slurm_fresh.scontrol("show", "job", str(job_id))
    assert "AdminComment=checked by ops | gpufleet 2026-12-02T03:12:07Z: requeued: XID 79" in shown
    assert "Comment=my lr sweep" in shown


def test_a_user_who_is_not_a_super_user_may_not_set_it(slurm_fresh: LocalSlurm, slurm_rest: SlurmREST,
                                                       tmp_path: Path) -> None:
    job_id = submit(slurm_fresh, tmp_path / "job")
    other = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path, user="slurmrest"))
    with pytest.raises(SlurmError) as ei:
        other.set_admin_comment(job_id, "not mine to say")
    assert ei.value.temporary is False
    assert slurm_rest.job(job_id).admin_comment == ""


def test_an_unknown_job_is_a_permanent_error(slurm_fresh: LocalSlurm, slurm_rest: SlurmREST) -> None:
    with pytest.raises(SlurmError) as ei:
        slurm_rest.set_admin_comment(999999, "x")
    assert ei.value.temporary is False
