"""The Slurm contract: what the reconciler needs from Slurm (reconciler/adapters/slurm/__init__.py's
SlurmClient), checked against a real Slurm 26.05 through both clients, SlurmREST (slurmrestd with a
JWT, as Slinky's operator reaches it) and SlurmCLI (scontrol, squeue, scancel): one suite, no mocks.

The remediation flow drives what the reconciler does to a failing node that runs a training job:
drain -> SIGTERM the job -> it checkpoints within the grace period -> requeue -> down the node ->
resume the spare -> release, and checks that the job ran again on another node, resumed from its
checkpoint and got the same result as an uninterrupted run. What only one client has (tokens and
data parsers; hostlists and the tools' time-outs) is in test_slurm_rest.py and test_slurm_cli.py.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmClient, SlurmError, SlurmJob
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from tests.fixtures.slurm_cluster import KUBE_NODE_OF, SLURM_NODES, SPARE_REASON

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO_ROOT / "localenv" / "jobs" / "checkpoint_job.sh"
STEPS = 40
STEP_SECONDS = 0.1
GRACE_SECONDS = 10.0  # what the reconciler would allow a job to checkpoint
PERSON_REASON = "maintenance: alice replaces the PSU"


def expected_result(steps: int = STEPS) -> int:
    """What checkpoint_job.sh computes (same fold as the script)."""
    acc = 7
    for step in range(steps):
        acc = (acc * 31 + step * step + 1) % 1000003
    return acc


def events(out: Path) -> list[dict[str, str]]:
    path = out / "events"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        kind, *kv = line.split()
        row = dict(item.split("=", 1) for item in kv)
        row["event"] = kind
        rows.append(row)
    return rows


def submit(slurm: LocalSlurm, out: Path, *extra: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    return slurm.sbatch("--requeue", "-J", "ckpt-train", "-p", "gpu", "-o", str(out / "slurm-%j.out"),
                        *extra, str(JOB_SCRIPT), str(out), str(STEPS), str(STEP_SECONDS))


def eligible_in(slurm: LocalSlurm, job_id: int) -> float:
    """Seconds until the job may start (its EligibleTime, from scontrol)."""
    line = slurm.scontrol("-o", "show", "job", str(job_id))
    stamp = re.search(r"EligibleTime=(\S+)", line).group(1)
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) - time.time()


def running(client: SlurmClient, job_id: int) -> SlurmJob | None:
    j = client.job(job_id)
    return j if j is not None and j.state == "RUNNING" and j.nodes else None


def idle(states) -> bool:
    return states == {"IDLE", "DYNAMIC_NORM"}  # dynamic nodes (slurmd -Z, as Slinky runs them) carry DYNAMIC_NORM


@pytest.fixture(params=["rest", "cli"])
def slurm(request, slurm_fresh: LocalSlurm):
    """Each client in turn, on a cluster reset to its first state."""
    if request.param == "cli":
        yield SlurmCLI(env=slurm_fresh.env(), timeout=20)
        return
    client = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path, user="slurm"), timeout=10)
    yield client
    client.close()


# --------------------------------------------------------------------------- the job and the cluster


def test_the_job_script_run_straight_through_gives_the_reference_result(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(JOB_SCRIPT), str(tmp_path), str(STEPS), "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int((tmp_path / "result").read_text()) == expected_result()
    assert f"first_step=0 result={expected_result()}" in r.stdout


# --------------------------------------------------------------------------- reading


def test_nodes_states_and_the_operators_comments(slurm: SlurmClient) -> None:
    nodes = slurm.nodes()
    assert [n.name for n in nodes] == SLURM_NODES
    for n in nodes:
        c = json.loads(n.comment)
        assert c["podName"] == f"slurm-worker-{n.name}" and c["node"] == KUBE_NODE_OF[n.name] != n.name
        assert c["nodeSetName"] == "gpu-a"
    assert slurm.node("gpu-a-2").comment == nodes[2].comment
    assert idle(nodes[0].states) and nodes[0].reason == "" and not nodes[0].drained_or_down
    spare = slurm.node("gpu-a-2")
    assert spare.states == {"IDLE", "DRAIN", "DYNAMIC_NORM"} and spare.reason == SPARE_REASON
    assert spare.drained_or_down


def test_unknown_nodes_and_jobs(slurm: SlurmClient) -> None:
    """A node or job Slurm does not know: a permanent error naming it where something was asked of it;
    nothing to report where the question has an answer (no job runs on it, no such job to release)."""
    for call in (lambda: slurm.node("gpu-z-9"), lambda: slurm.drain("gpu-z-9", "x"),
                 lambda: slurm.down("gpu-z-9", "x"), lambda: slurm.resume("gpu-z-9")):
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is False and "gpu-z-9" in str(ei.value)
    assert slurm.jobs_on_node("gpu-z-9") == []
    assert slurm.job(987654) is None
    for call in (lambda: slurm.signal_jobs([987654]), lambda: slurm.requeue([987654])):
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is False and "987654" in str(ei.value)
    slurm.release([987654])  # nothing pending to release: not an error


# --------------------------------------------------------------------------- node state


def test_drain_down_resume_and_a_persons_drain_stays(slurm: SlurmClient, slurm_fresh: LocalSlurm) -> None:
    slurm_fresh.scontrol("update", "NodeName=gpu-a-0", "State=DRAIN", f"Reason={PERSON_REASON}")  # a person
    slurm.drain("gpu-a-1", "gpufleet: xid 79 on gpu 3")
    n = slurm.node("gpu-a-1")
    assert "DRAIN" in n.states and n.reason == "gpufleet: xid 79 on gpu 3" and n.drained_or_down
    slurm.down("gpu-a-1", "gpufleet: xid 79 on gpu 3")
    assert "DOWN" in slurm.node("gpu-a-1").states
    slurm.resume("gpu-a-1")
    # Right after RESUME the node may be IDLE+NOT_RESPONDING until slurmctld's next ping reaches its slurmd.
    assert not slurm.node("gpu-a-1").drained_or_down
    wait_for("gpu-a-1 back to IDLE", lambda: idle(slurm.node("gpu-a-1").states), timeout=15)
    slurm.resume("gpu-a-1")  # a node that is up: not an error
    n0 = slurm.node("gpu-a-0")  # nothing the client did touched the person's drain
    assert "DRAIN" in n0.states and n0.reason == PERSON_REASON


# --------------------------------------------------------------------------- the remediation flow


def test_drain_signal_checkpoint_requeue_down_release_resumes_on_other_node(
        slurm: SlurmClient, slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "job"
    job_id = submit(slurm_fresh, out)
    job = wait_for("the job to run", lambda: running(slurm, job_id))
    bad = job.nodes[0]
    assert job.requeue is True and job.restarts == 0 and job.name == "ckpt-train"
    (start,) = wait_for("the job to start", lambda: [e for e in events(out) if e["event"] == "start"])
    wait_for("a few steps done", lambda: time.time() - float(start["time"]) > 5 * STEP_SECONDS)

    # 1. drain: the job goes on, nothing new lands there.
    slurm.drain(bad, "gpufleet: test fault")
    node = slurm.node(bad)
    assert "DRAIN" in node.states and node.reason == "gpufleet: test fault"
    assert [j.job_id for j in slurm.jobs_on_node(bad)] == [job_id]

    # 2. SIGTERM to the batch script (and its steps): it checkpoints within the grace period.
    t0 = time.monotonic()
    slurm.signal_jobs([job_id], "TERM")
    ckpt = wait_for("the checkpoint", lambda: [e for e in events(out) if e["event"] == "checkpoint"],
                    timeout=GRACE_SECONDS)[0]
    took = time.monotonic() - t0
    assert took < GRACE_SECONDS
    saved_step = int(ckpt["step"])
    assert ckpt["node"] == bad and ckpt["job"] == str(job_id) and ckpt["restart"] == "0"
    assert 0 < saved_step < STEPS, ckpt
    assert (out / "checkpoint").read_text().split() == [ckpt["step"], ckpt["result"]]
    # It exits 143 after checkpointing: Slurm records it as FAILED (NonZeroExitCode).
    ended = wait_for("the job to end",
                     lambda: (j := slurm.job(job_id)) and j.state not in ("RUNNING", "COMPLETING") and j)
    assert ended.state == "FAILED"
    assert not (out / "result").exists()

    # 3. requeue: pending again, same id, one restart, held by a begin time.
    slurm.requeue([job_id])
    pending = slurm.job(job_id)
    assert pending is not None and pending.state == "PENDING" and pending.restarts == 1
    assert eligible_in(slurm_fresh, job_id) > 60
    slurm.requeue([job_id])  # already pending: not an error
    assert slurm.job(job_id).restarts == 1

    # 4. down the bad node; promote the spare.
    slurm.down(bad, "gpufleet: test fault")
    assert slurm.node(bad).drained_or_down
    slurm.resume("gpu-a-2")
    assert not slurm.node("gpu-a-2").drained_or_down

    # 5. release: it runs again at once (not ~2 minutes later) on another node.
    t0 = time.monotonic()
    slurm.release([job_id])
    again = wait_for("the requeued job to run", lambda: running(slurm, job_id), timeout=20)
    started_after = time.monotonic() - t0
    assert started_after < 15
    assert again.nodes[0] != bad and again.restarts == 1
    assert job_id in [j.job_id for j in slurm.jobs_on_node(again.nodes[0])]
    assert slurm.node(bad).drained_or_down  # DRAIN outlives DOWN's return to service
    slurm.release([job_id])  # running: nothing to do, not an error

    # 6. it resumes from the checkpoint and finishes with the uninterrupted result.
    done = wait_for("the job to complete", lambda: (j := slurm.job(job_id)) and j.state == "COMPLETED" and j,
                    timeout=60)
    assert done.restarts == 1
    ev = events(out)
    starts = [e for e in ev if e["event"] == "start"]
    assert [(s["restart"], s["node"]) for s in starts] == [("0", bad), ("1", again.nodes[0])]
    assert int(starts[1]["step"]) == saved_step and starts[1]["result"] == ckpt["result"]
    finish = [e for e in ev if e["event"] == "done"]
    assert len(finish) == 1 and finish[0]["node"] == again.nodes[0]
    assert int(finish[0]["step"]) == STEPS and int(finish[0]["result"]) == expected_result()
    assert int((out / "result").read_text()) == expected_result()
    print(f"checkpoint {took:.2f}s after SIGTERM at step {saved_step}; "
          f"ran again on {again.nodes[0]} {started_after:.2f}s after release")


def test_requeue_of_a_running_job_terms_it_and_a_signal_skips_ended_or_pending_jobs(
        slurm: SlurmClient, slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "job"
    job_id = submit(slurm_fresh, out)
    wait_for("the job to run", lambda: running(slurm, job_id))
    starts = lambda: [e for e in events(out) if e["event"] == "start"]  # noqa: E731
    wait_for("the script to start", lambda: len(starts()) == 1)
    # Requeue without a signal first: the running job is killed and pending again.
    slurm.requeue([job_id])
    # (slurmctld sets the pending reason a moment after the state: a fast client may read "" first)
    pending = wait_for("the job to be pending, held by a begin time",
                       lambda: (j := slurm.job(job_id)) and j.state == "PENDING" and j.reason == "BeginTime" and j)
    assert pending.restarts == 1
    assert eligible_in(slurm_fresh, job_id) > 60
    slurm.signal_jobs([job_id], "SIGTERM")  # pending: nothing to signal, not an error
    slurm.release([job_id])
    assert eligible_in(slurm_fresh, job_id) < 2
    second = wait_for("the job to run again", lambda: running(slurm, job_id), timeout=20)
    assert second.restarts == 1
    wait_for("the script to start again", lambda: len(starts()) == 2)
    slurm.signal_jobs([job_id], "TERM")
    wait_for("the job to end", lambda: (j := slurm.job(job_id)) and j.state == "FAILED")
    slurm.signal_jobs([job_id], "TERM")  # ended: nothing to signal, not an error
    slurm.release([job_id])              # ended: nothing to release, not an error
    # A requeue of a running job sends SIGTERM to the batch script first (SIGKILL KillWait seconds
    # later): the script checkpointed, the second run resumed.
    ckpts = [e for e in events(out) if e["event"] == "checkpoint"]
    assert [c["restart"] for c in ckpts] == ["0", "1"]
    assert [(s["step"], s["restart"]) for s in starts()] == [("0", "0"), (ckpts[0]["step"], "1")]


# --------------------------------------------------------------------------- slurmctld outages


def test_slurmctld_stopped_is_temporary_and_state_survives_its_restart(slurm: SlurmClient,
                                                                       slurm_fresh: LocalSlurm) -> None:
    """Issue 14 point 6 too: a slurmctld restart keeps the run-time node state (no slurm.conf state back)."""
    slurm.resume("gpu-a-2")  # the spare, promoted
    slurm.drain("gpu-a-1", PERSON_REASON)
    before = {n.name: n for n in slurm.nodes()}
    slurm_fresh.stop_daemon("slurmctld")
    try:
        for call in (lambda: slurm.node("gpu-a-0"), lambda: slurm.drain("gpu-a-0", "x")):
            with pytest.raises(SlurmError) as ei:
                call()
            assert ei.value.temporary is True, str(ei.value)
    finally:
        slurm_fresh.up()
    after = {n.name: n for n in slurm.nodes()}
    assert idle(after["gpu-a-2"].states) and after["gpu-a-2"].reason == ""
    assert "DRAIN" in after["gpu-a-1"].states and after["gpu-a-1"].reason == PERSON_REASON
    assert idle(after["gpu-a-0"].states)
    assert {k: v.comment for k, v in after.items()} == {k: v.comment for k, v in before.items()}
