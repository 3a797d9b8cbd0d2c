"""SlurmCLI against a real local Slurm 26.05 (the sid root, through LocalSlurm's wrappers): no mocks.

The main test drives what the reconciler does to a failing node that runs a training
job: drain -> SIGTERM the job -> it checkpoints within the grace period -> requeue ->
down the node -> resume the spare -> release, and checks that the job ran again on
another node, resumed from its checkpoint and got the same result as an uninterrupted run.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.waiting import wait_for

from localenv.slurm import SPARE_REASON, LocalSlurm
from reconciler.adapters.slurm import SlurmError, SlurmJob
from reconciler.adapters.slurm.scontrol import SlurmCLI, expand_hostlist
from tests.fixtures.slurm_cluster import KUBE_NODE_OF

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO_ROOT / "localenv" / "jobs" / "checkpoint_job.sh"

STEPS = 40
STEP_SECONDS = 0.1
GRACE_SECONDS = 10.0  # what the reconciler would allow a job to checkpoint


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


def running(cli: SlurmCLI, job_id: int) -> SlurmJob | None:
    j = cli.job(job_id)
    return j if j is not None and j.state == "RUNNING" and j.nodes else None


# --------------------------------------------------------------------------- the job script


def test_job_script_uninterrupted_matches_expected(tmp_path: Path) -> None:
    """The reference: the job script run straight through (outside Slurm)."""
    r = subprocess.run(["bash", str(JOB_SCRIPT), str(tmp_path), str(STEPS), "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int((tmp_path / "result").read_text()) == expected_result()
    assert f"first_step=0 result={expected_result()}" in r.stdout


# --------------------------------------------------------------------------- the cluster


def test_cluster_up_is_idempotent_and_spare_is_drained(slurm_fresh: LocalSlurm) -> None:
    before = slurm_fresh.status()["daemons"]
    t0 = time.monotonic()
    slurm_fresh.up()
    assert time.monotonic() - t0 < 5
    st = slurm_fresh.status()
    assert st["daemons"] == before and all(st["daemons"].values())
    assert st["controller"] is True and st["rest"] is True
    assert st["nodes"] == {"gpu-a-0": "idle", "gpu-a-1": "idle", "gpu-a-2": "drained"}
    assert slurm_fresh.node_names() == ["gpu-a-0", "gpu-a-1", "gpu-a-2"]
    # A second LocalSlurm object on the same folder (another process would do the same)
    # finds the running daemons instead of starting new ones.
    other = LocalSlurm(slurm_fresh.workdir, slurm_fresh.partitions, root=slurm_fresh.root,
                       binds=slurm_fresh.binds, ctld_port=slurm_fresh.ctld_port, rest_port=slurm_fresh.rest_port)
    other.up()
    assert other.status()["daemons"] == before
    assert other.healthy()


def test_nodes_carry_the_operator_comment(slurm_cli: SlurmCLI) -> None:
    nodes = slurm_cli.nodes()
    assert [n.name for n in nodes] == ["gpu-a-0", "gpu-a-1", "gpu-a-2"]
    for n in nodes:
        c = json.loads(n.comment)
        assert c["podName"] == f"slurm-worker-{n.name}" and c["node"] == KUBE_NODE_OF[n.name] != n.name
    assert slurm_cli.node("gpu-a-2").comment == nodes[2].comment


# --------------------------------------------------------------------------- queries


def test_node_states_and_reasons(slurm_cli: SlurmCLI) -> None:
    a0 = slurm_cli.node("gpu-a-0")
    # Dynamic nodes (slurmd -Z, as Slinky runs them) carry the DYNAMIC_NORM flag.
    assert a0.states == {"IDLE", "DYNAMIC_NORM"} and a0.reason == "" and not a0.drained_or_down
    spare = slurm_cli.node("gpu-a-2")
    assert spare.states == {"IDLE", "DRAIN", "DYNAMIC_NORM"} and spare.reason == SPARE_REASON
    assert spare.drained_or_down

    slurm_cli.drain("gpu-a-1", "gpufleet: xid 79 on gpu 3")
    a1 = slurm_cli.node("gpu-a-1")
    assert "DRAIN" in a1.states and a1.reason == "gpufleet: xid 79 on gpu 3"
    slurm_cli.resume("gpu-a-1")
    # Right after RESUME the node is IDLE+NOT_RESPONDING until slurmctld's next ping
    # reaches its slurmd (about a second here).
    assert "DRAIN" not in slurm_cli.node("gpu-a-1").states
    wait_for("gpu-a-1 to be IDLE", lambda: slurm_cli.node("gpu-a-1").states == {"IDLE", "DYNAMIC_NORM"},
             timeout=15)
    slurm_cli.resume("gpu-a-1")  # resuming a node that is up is not an error


def test_unknown_node_and_job_are_permanent_errors(slurm_cli: SlurmCLI) -> None:
    for call in (lambda: slurm_cli.node("gpu-z-9"), lambda: slurm_cli.drain("gpu-z-9", "x"),
                 lambda: slurm_cli.jobs_on_node("gpu-z-9"), lambda: slurm_cli.resume("gpu-z-9"),
                 lambda: slurm_cli.down("gpu-z-9", "x")):
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is False
        assert "gpu-z-9" in str(ei.value)
    assert slurm_cli.job(987654) is None
    for call in (lambda: slurm_cli.signal_jobs([987654]), lambda: slurm_cli.requeue([987654]),
                 lambda: slurm_cli.release([987654])):
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is False
        assert "987654" in str(ei.value)


def test_expand_hostlist() -> None:
    assert expand_hostlist("gpu-a-[0-2,5],cpu-1") == ["gpu-a-0", "gpu-a-1", "gpu-a-2", "gpu-a-5", "cpu-1"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("") == [] and expand_hostlist("(null)") == []


# --------------------------------------------------------------------------- the remediation flow


def test_drain_signal_checkpoint_requeue_down_release_resumes_on_other_node(
        slurm_fresh: LocalSlurm, slurm_cli: SlurmCLI, tmp_path: Path) -> None:
    cli = slurm_cli
    out = tmp_path / "job"
    job_id = submit(slurm_fresh, out)
    job = wait_for("the job to run", lambda: running(cli, job_id))
    bad = job.nodes[0]
    assert job.requeue is True and job.restarts == 0 and job.name == "ckpt-train"
    # Let it get some steps done.
    wait_for("the job to start", lambda: [e for e in events(out) if e["event"] == "start"])
    time.sleep(1.0)

    # 1. drain: the job goes on, nothing new lands there.
    cli.drain(bad, "gpufleet: test fault")
    node = cli.node(bad)
    assert "DRAIN" in node.states and node.reason == "gpufleet: test fault"
    assert [j.job_id for j in cli.jobs_on_node(bad)] == [job_id]

    # 2. SIGTERM to the batch script (and its steps): it checkpoints within the grace period.
    t0 = time.monotonic()
    cli.signal_jobs([job_id], "TERM")
    ckpt = wait_for("the checkpoint", lambda: [e for e in events(out) if e["event"] == "checkpoint"],
                    timeout=GRACE_SECONDS)[0]
    took = time.monotonic() - t0
    assert took < GRACE_SECONDS
    saved_step = int(ckpt["step"])
    assert ckpt["node"] == bad and ckpt["job"] == str(job_id) and ckpt["restart"] == "0"
    assert 0 < saved_step < STEPS, ckpt
    assert (out / "checkpoint").read_text().split() == [ckpt["step"], ckpt["result"]]
    # It exits 143 after checkpointing: Slurm records it as FAILED (NonZeroExitCode).
    ended = wait_for("the job to end", lambda: (j := cli.job(job_id)) and j.state not in ("RUNNING", "COMPLETING") and j)
    assert ended.state == "FAILED"
    assert not (out / "result").exists()

    # 3. requeue: pending again, same id, one restart, held by a begin time.
    cli.requeue([job_id])
    pending = cli.job(job_id)
    assert pending is not None and pending.state == "PENDING" and pending.restarts == 1
    # Held ~2 minutes by a begin time. (The pending reason of a job requeued after it
    # ended stays its old one, NonZeroExitCode; a requeued running job shows BeginTime.)
    assert pending.reason in ("BeginTime", "NonZeroExitCode")
    assert eligible_in(slurm_fresh, job_id) > 60
    cli.requeue([job_id])  # already pending: not an error
    assert cli.job(job_id).restarts == 1

    # 4. down the bad node; promote the spare.
    cli.down(bad, "gpufleet: test fault")
    assert cli.node(bad).drained_or_down
    spare = "gpu-a-2"
    cli.resume(spare)
    assert not cli.node(spare).drained_or_down

    # 5. release: it runs again at once (not ~2 minutes later) on another node.
    t0 = time.monotonic()
    cli.release([job_id])
    again = wait_for("the requeued job to run", lambda: running(cli, job_id), timeout=20)
    started_after = time.monotonic() - t0
    assert started_after < 15
    assert again.nodes[0] != bad and again.restarts == 1
    assert job_id in [j.job_id for j in cli.jobs_on_node(again.nodes[0])]
    assert cli.node(bad).drained_or_down  # DRAIN outlives DOWN's return to service
    cli.release([job_id])  # running: nothing to do, not an error

    # 6. it resumes from the checkpoint and finishes with the uninterrupted result.
    done = wait_for("the job to complete", lambda: (j := cli.job(job_id)) and j.state == "COMPLETED" and j,
                    timeout=60)
    assert done.restarts == 1
    ev = events(out)
    starts = [e for e in ev if e["event"] == "start"]
    assert [(s["restart"], s["node"]) for s in starts] == [("0", bad), ("1", again.nodes[0])]
    assert int(starts[1]["step"]) == saved_step and starts[1]["result"] == ckpt["result"]
    finish = [e for e in ev if e["event"] == "done"]
    assert len(finish) == 1 and finish[0]["node"] == again.nodes[0]
    assert int(finish[0]["step"]) == STEPS
    assert int(finish[0]["result"]) == expected_result()
    assert int((out / "result").read_text()) == expected_result()
    print(f"checkpoint {took:.2f}s after SIGTERM at step {saved_step}; "
          f"ran again on {again.nodes[0]} {started_after:.2f}s after release")


def test_requeue_running_job_terms_it_and_signal_skips_ended_or_pending(
        slurm_fresh: LocalSlurm, slurm_cli: SlurmCLI, tmp_path: Path) -> None:
    cli = slurm_cli
    out = tmp_path / "job"
    job_id = submit(slurm_fresh, out)
    first = wait_for("the job to run", lambda: running(cli, job_id))
    starts = lambda: [e for e in events(out) if e["event"] == "start"]  # noqa: E731
    wait_for("the script to start", lambda: len(starts()) == 1)
    # Requeue without a signal first: the running job is killed and pending again.
    cli.requeue([job_id])
    pending = wait_for("the job to be pending", lambda: (j := cli.job(job_id)) and j.state == "PENDING" and j)
    assert pending.restarts == 1 and pending.reason == "BeginTime"
    assert eligible_in(slurm_fresh, job_id) > 60
    cli.signal_jobs([job_id], "SIGTERM")  # pending: nothing to signal, not an error
    cli.release([job_id])
    assert eligible_in(slurm_fresh, job_id) < 2
    second = wait_for("the job to run again", lambda: running(cli, job_id), timeout=20)
    assert second.restarts == 1
    assert first.nodes  # where it ran first does not matter here
    wait_for("the script to start again", lambda: len(starts()) == 2)
    cli.signal_jobs([job_id], "TERM")
    wait_for("the job to end", lambda: (j := cli.job(job_id)) and j.state == "FAILED")
    cli.signal_jobs([job_id], "TERM")  # ended: nothing to signal, not an error
    cli.release([job_id])              # ended: nothing to release, not an error
    # `scontrol requeue` of a running job sends SIGTERM to the batch script first
    # (SIGKILL KillWait seconds later): the script checkpointed, the 2nd run resumed.
    ckpts = [e for e in events(out) if e["event"] == "checkpoint"]
    assert [c["restart"] for c in ckpts] == ["0", "1"]
    assert [(s["step"], s["restart"]) for s in starts()] == [("0", "0"), (ckpts[0]["step"], "1")]


# --------------------------------------------------------------------------- controller outages


def test_dead_controller_port_is_temporary(slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(
        "SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
        for line in slurm_fresh.conf_path.read_text().splitlines()) + "\n")
    env = {**slurm_fresh.env(), "SLURM_CONF": str(conf)}
    cli = SlurmCLI(env=env, timeout=15)
    # Each call takes ~4 s here (the client's connect retries). `scontrol requeue` says
    # "Unexpected message received" instead of "Unable to contact slurm controller".
    for call in (lambda: cli.requeue([1]), lambda: cli.drain("gpu-a-0", "x")):
        t0 = time.monotonic()
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is True, str(ei.value)
        assert time.monotonic() - t0 < 15
        assert "Unable to contact slurm controller" in str(ei.value) or "Unexpected message" in str(ei.value)


def test_hung_controller_times_out_as_temporary(slurm_fresh: LocalSlurm) -> None:
    pid = slurm_fresh.status()["daemons"]["slurmctld"]
    assert pid
    cli = SlurmCLI(env=slurm_fresh.env(), timeout=2)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(SlurmError) as ei:
            cli.node("gpu-a-0")
        assert ei.value.temporary is True
        assert "timed out after 2s" in str(ei.value)
        assert time.monotonic() - t0 < 4
    finally:
        os.kill(pid, signal.SIGCONT)
    assert cli.node("gpu-a-0").states == {"IDLE", "DYNAMIC_NORM"}


def test_stopped_controller_is_temporary_and_comes_back(slurm_fresh: LocalSlurm) -> None:
    cli = SlurmCLI(env=slurm_fresh.env(), timeout=15)
    t0 = time.monotonic()
    slurm_fresh.stop_daemon("slurmctld")
    print(f"slurmctld stopped in {time.monotonic() - t0:.2f}s")
    try:
        with pytest.raises(SlurmError) as ei:
            cli.node("gpu-a-1")
        assert ei.value.temporary is True
        assert "Unable to contact slurm controller" in str(ei.value)
    finally:
        t0 = time.monotonic()
        slurm_fresh.up()
        print(f"slurmctld restarted, nodes up in {time.monotonic() - t0:.2f}s")
    # Node states survive the restart (saved state), the spare is still drained.
    assert cli.node("gpu-a-2").reason == SPARE_REASON
    assert cli.node("gpu-a-0").states == {"IDLE", "DYNAMIC_NORM"}
