"""Issue 24, "a Slurm identity of its own", against a real slurmrestd, slurmctld and slurmdbd (Slurm 26.05):
the reconciler's own Slurm user (`gpufleet`, declared in accounting by the stack's SlurmUsers script with
AdminLevel Administrator: gpufleet.fleetspec.models.RECONCILER_ADMIN_LEVEL) does every call the heal loop makes on nodes
and on other users' jobs; an ordinary user's token does none of them; and Operator, the level the issue first
named, is refused node updates (slurmctld's validate_super_user), which is why the stack declares Administrator.

The cluster (tests/fixtures/slurm_cluster.py) runs accounting as the local stack declares it."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from tests.fixtures.slurm_cluster import RECONCILER_USER, TENANT_USER
from tests.integration.test_slurm_contract import running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = "gpu-a-0"


def rest_as(cluster: LocalSlurm, user: str) -> SlurmREST:
    return SlurmREST(cluster.rest_url, SignedToken(cluster.jwt_key_path, user=user), timeout=10)


def submit_as(cluster: LocalSlurm, user: str) -> int:
    """A requeueable job of `user` (submitted as that user in the Slurm root) on NODE."""
    r = cluster.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={cluster.daemon_conf}", "sbatch", "--parsable", "--requeue", "-p", "gpu", "-w", NODE,
                     "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 600"], timeout=15, check=True)
    return int(r.stdout.strip().split(";")[0])


def admin_level(cluster: LocalSlurm, user: str) -> str:
    return cluster.run(["sacctmgr", "-n", "-P", "show", "user", f"name={user}", "format=adminlevel"],
                       check=True).stdout.strip()


@pytest.fixture
def reconciler(slurm_fresh: LocalSlurm) -> Iterator[SlurmREST]:
    client = rest_as(slurm_fresh, RECONCILER_USER)
    yield client
    client.close()


def test_the_stack_declared_the_reconcilers_user_with_its_admin_level(slurm_fresh: LocalSlurm) -> None:
    assert admin_level(slurm_fresh, RECONCILER_USER) == "Administrator"
    assert admin_level(slurm_fresh, TENANT_USER) == ""  # not in accounting: no level


def test_the_reconcilers_token_drains_and_resumes_a_node(slurm_fresh: LocalSlurm, reconciler: SlurmREST) -> None:
    reconciler.drain(NODE, "gpufleet: XID 79")
    node = reconciler.node(NODE)
    assert node.drained_or_down and node.reason == "gpufleet: XID 79"
    reconciler.resume(NODE)
    assert not reconciler.node(NODE).drained_or_down


def test_the_reconcilers_token_signals_requeues_and_notes_another_users_job(
        slurm_fresh: LocalSlurm, reconciler: SlurmREST) -> None:
    job_id = submit_as(slurm_fresh, TENANT_USER)
    wait_for("the tenant's job to run", lambda: running(reconciler, job_id))
    reconciler.set_admin_comment(job_id, "gpufleet: requeued off gpu-a-0 (XID 79)")  # validate_super_user
    reconciler.requeue([job_id])
    # (slurmctld sets the begin time a moment after the state, as test_slurm_contract.py waits for too)
    wait_for("the job to be requeued", lambda: (j := reconciler.job(job_id)) and j.state == "PENDING"
             and j.reason == "BeginTime")
    reconciler.release([job_id])
    wait_for("the job to run again", lambda: running(reconciler, job_id), 60,
             explain=lambda: slurm_fresh.scontrol("-o", "show", "job", str(job_id)))
    reconciler.signal_jobs([job_id], "KILL")
    wait_for("the job to end", lambda: (j := reconciler.job(job_id)) is None or j.state not in ("RUNNING", "PENDING"))


def test_an_ordinary_users_token_changes_no_node_and_no_other_users_job(slurm_fresh: LocalSlurm) -> None:
    tenant = rest_as(slurm_fresh, TENANT_USER)
    assert tenant.node(NODE).name == NODE  # reading is allowed
    with pytest.raises(SlurmError) as ei:
        tenant.drain(NODE, "x")
    assert ei.value.temporary is False and "Invalid user id" in str(ei.value)  # ESLURM_USER_ID_MISSING
    assert not tenant.node(NODE).drained_or_down
    job_id = slurm_fresh.sbatch("-p", "gpu", "-w", NODE, "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for("root's job to run", lambda: running(tenant, job_id))
    for call in (lambda: tenant.requeue([job_id]), lambda: tenant.set_admin_comment(job_id, "x")):
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is False
    tenant.signal_jobs([job_id], "KILL")  # slurmrestd answers; slurmctld skips the job it may not signal
    assert running(tenant, job_id)
    tenant.close()


def test_operator_is_not_enough_for_node_updates(slurm_fresh: LocalSlurm) -> None:
    """Why Administrator is the least level for the calls the reconciler makes: an Operator may requeue another
    user's job (validate_operator) but not update a node (proc_req.c _slurm_rpc_update_node: validate_super_user)
    nor set a job's admin comment (job_mgr.c _update_job: validate_super_user); the one other
    field an Operator may write, `comment`, is the job owner's to write and overwrite, so no record of gpufleet's."""
    slurm_fresh.run(["sacctmgr", "-i", "add", "user", f"name={TENANT_USER}", "account=root", "adminlevel=Operator"],
                    check=True)
    tenant = rest_as(slurm_fresh, TENANT_USER)
    try:
        wait_for("slurmctld to know the Operator level", lambda: admin_level(slurm_fresh, TENANT_USER) == "Operator")
        job_id = slurm_fresh.sbatch("--requeue", "-p", "gpu", "-w", NODE, "--chdir=/tmp", "-o", "/dev/null",
                                    "--wrap", "sleep 600")
        wait_for("root's job to run", lambda: running(tenant, job_id))

        def requeued() -> bool:
            try:
                tenant.requeue([job_id])
            except SlurmError:
                return False  # slurmdbd's update may not have reached slurmctld yet
            return True

        wait_for("the Operator's requeue to be accepted", requeued, 30, interval=1)
        with pytest.raises(SlurmError) as ei:
            tenant.drain(NODE, "x")
        assert "Invalid user id" in str(ei.value)
        with pytest.raises(SlurmError) as ei:
            tenant.set_admin_comment(job_id, "gpufleet: requeued off gpu-a-0")
        assert ei.value.temporary is False and "Access/permission denied" in str(ei.value), ei.value  # ESLURM_ACCESS_DENIED
    finally:
        tenant.close()
        slurm_fresh.run(["sacctmgr", "-i", "delete", "user", f"name={TENANT_USER}"], check=True)


def test_accounting_remembers_a_job_for_gpufleet_why(slurm_fresh: LocalSlurm, reconciler: SlurmREST) -> None:
    """`gpufleet why`'s fallback once slurmctld forgot a job: slurmrestd's GET /slurmdb/v0.0.45/job/{id} from the
    real slurmdbd, read by the reconciler's user (an Administrator sees every user's jobs)."""
    from gpufleet.why_command import accounted

    job_id = submit_as(slurm_fresh, TENANT_USER)
    wait_for("the tenant's job to run", lambda: running(reconciler, job_id))
    reconciler.set_admin_comment(job_id, "gpufleet: requeued off gpu-a-0")
    reconciler.signal_jobs([job_id], "KILL")

    def recorded():
        j = reconciler.accounted_job(job_id)
        return j if j is not None and j.end_time and j.admin_comment else None

    j = wait_for("slurmdbd to record the job's end", recorded, 60, interval=1)
    assert j.job_id == job_id and j.user == TENANT_USER and j.nodes == (NODE,) and j.partitions == ("gpu",)
    assert j.state in ("CANCELLED", "FAILED") and j.admin_comment == "gpufleet: requeued off gpu-a-0"
    assert j.submit_time and j.start_time and j.end_time >= j.start_time
    assert accounted(reconciler, job_id) == j
    assert reconciler.accounted_job(987654) is None and accounted(reconciler, 987654) is None


def test_accounting_names_the_job_slurm_requeued_off_a_node_it_set_down(slurm_fresh: LocalSlurm,
                                                                        reconciler: SlurmREST) -> None:
    """What a lost machine's heal reads when slurmctld requeued the job itself (core/node_lost.py): a node set DOWN
    requeues its --requeue batch job as a run that ended NODE_FAIL (slurm-26-05-3-1 src/slurmctld/job_mgr.c
    kill_running_job_by_node_ptr, the path SlurmdTimeout's "Not responding" takes too), after which slurmctld keeps
    no node for it; slurmdbd keeps that run (GET /slurmdb/v0.0.45/jobs/ with node, state=NODE_FAIL, start_time and
    end_time)."""
    import time

    since = time.time() - 5
    job_id = submit_as(slurm_fresh, TENANT_USER)
    wait_for("the tenant's job to run", lambda: running(reconciler, job_id))
    slurm_fresh.set_node_state(NODE, "DOWN", reason="Not responding")
    wait_for("slurmctld to requeue it", lambda: (j := reconciler.job(job_id)) is not None and j.state == "PENDING"
             and not j.nodes)
    def explain():
        from urllib.parse import urlencode
        from gpufleet.reconciler.adapters.slurm.rest import AccountedJobsResponse
        q = urlencode({"node": NODE, "state": "NODE_FAIL", "start_time": str(int(since)),
                       "end_time": str(int(time.time()) + 60), "show_duplicates": "true", "skip_steps": "true"})
        resp = reconciler._call("GET", f"/slurmdb/{reconciler.parser}/jobs/?{q}", AccountedJobsResponse,
                                versioned=False)
        return f"{reconciler.parser} {q} -> {resp!r}"
    [j] = wait_for("slurmdbd to record the failed run", lambda: reconciler.jobs_failed_on([NODE], since), 60,
                   interval=1, explain=explain)
    assert (j.job_id, j.state, j.nodes) == (job_id, "NODE_FAIL", (NODE,))
    assert reconciler.jobs_failed_on(["gpu-a-1"], since) == []  # another node: none
    assert reconciler.jobs_failed_on([NODE], time.time() + 3600) == []  # none since then
