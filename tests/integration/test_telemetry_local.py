"""GPU telemetry end to end on the local pieces: a real API server with kwok nodes, a real Slurm 26.05 through
slurmrestd, the dcgm-exporter stand-in (localenv/dcgm_exporter_standin.py) serving each node's GPUs as the GPU
hardware stand-in's state drives them, and the reconciler as built for a cluster reading it (`healing.telemetry:
source exporter`). Nothing in the reconciler knows the exporter is a stand-in.

- a GPU whose pending row remap rises: its node is drained in Slurm, its job gets SIGTERM and checkpoints, is
  requeued and moved to the spare before any crash; the record and `gpufleet why` name the field, the GPU, the
  value and the threshold;
- a job whose GPUs all go quiet is paged as hung within the pool's declared time, and requeued (the pool consents);
- a throttled node of a two-node job is a straggler: degraded, healed like any fault, its evidence recorded."""
from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels, parse_fleet
from localenv.dcgm_exporter_standin import KwokNodes, serve
from localenv.gpu_hardware_standin import HEALTHY, HUNG, ROW_REMAP_PENDING, THROTTLING
from gpufleet.reconciler.core.phases import Phase
from tests.fixtures.reconciler_kube import reconciler, records_for, run_until

from .test_job_story_slurm import why
from .test_reconciler_slurm import POOL, fleet_with_slurm, job_on, moved_by_the_operator  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
HANG_AFTER = 4  # seconds: the pool's declared time for a hang (short, for the test)


@pytest.fixture
def exporter(api):
    """The stand-in for the pool's nodes' exporters: the pool's nodes only (every other test's kwok nodes stay on the
    shared API server, and each scrape of all of them made each pass of this file's reconciler slower)."""
    server = serve(KwokNodes(api, label_selector=f"{labels.NODE_POOL}={POOL}"), 0)
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


@pytest.fixture
def watched(fleet_with_slurm, exporter, api):  # noqa: F811
    """The fixture's fleet, its reconciler reading the exporter stand-in every second; every GPU healthy first."""
    spec, _, channel, slurm, rest = fleet_with_slurm
    core = client.CoreV1Api(api)
    for n in (f"{POOL}-0", f"{POOL}-1", f"{POOL}-spare-0"):
        core.patch_node(n, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: HEALTHY}}})
    doc = spec.model_dump(mode="json")
    doc["healing"]["telemetry"] = {"source": "exporter", "exporter_urls": [exporter], "every_seconds": 1}
    doc["pools"][0]["telemetry"] = {"hang_after_seconds": HANG_AFTER, "requeue_hung_jobs": True,
                                    "straggler_after_seconds": 2}
    yield parse_fleet(doc), reconciler(api, parse_fleet(doc), channel, rest), channel, slurm, rest
    for n in (f"{POOL}-0", f"{POOL}-1", f"{POOL}-spare-0"):
        core.patch_node(n, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: HEALTHY}}})


def gpu_state(api, node: str, state: str) -> None:
    client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: state}}})


def test_a_gpu_whose_row_remap_is_pending_is_drained_and_its_job_checkpointed_and_moved_before_a_crash(
        watched, api, kube_cluster, tmp_path):
    spec, rec, channel, slurm, rest = watched
    jid = job_on(slurm, "gpu-a-0", tmp_path)
    run_until(rec, lambda: True)  # a pass reads the healthy fleet: nothing is degraded
    assert not records_for(rec, f"{POOL}-0")
    gpu_state(api, f"{POOL}-0", ROW_REMAP_PENDING)
    run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase is Phase.RESUMING], timeout=90)
    (r,) = records_for(rec, f"{POOL}-0")
    evidence = "DCGM_FI_DEV_ROW_REMAP_PENDING=1 on GPU 0 (00000000:19:00.0), threshold >= 1"
    assert (r.kind.value, r.xid, r.action.value) == ("dcgm", 396, "reset-gpu") and evidence in r.reason, r.reason
    assert "DRAIN" in slurm.scontrol("show", "node", "gpu-a-0")
    assert "gpufleet: DCGM_FI_DEV_ROW_REMAP_PENDING" in slurm.scontrol("show", "node", "gpu-a-0")
    assert "saved" in (tmp_path / f"out-{jid}").read_text()  # SIGTERM and its grace: the job checkpointed itself
    moved_by_the_operator(api, rec, f"{POOL}-0", "gpu-a-0")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase.terminal], timeout=90)
    assert r.phase is Phase.SUCCEEDED and r.jobs == (jid,) and r.replacement == f"{POOL}-spare-0", r.reason
    state = slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T"]).stdout.split()
    assert state and state[0] in ("PENDING", "RUNNING")  # requeued, not lost
    assert [m.event for m in channel.messages].count("detected") == 1
    out = why(kube_cluster, slurm, jid)
    assert out.exit_code == 0, out.output
    assert f"fault: DCGM_FI_DEV_ROW_REMAP_PENDING on {POOL}-0 (Slurm gpu-a-0)" in out.output, out.output
    assert evidence in out.output and "next GPU reset" in out.output, out.output
    slurm.run(["scancel", str(jid)], timeout=15)


def test_a_job_whose_gpus_all_go_quiet_is_paged_as_hung_within_the_declared_time_and_requeued(
        watched, api, kube_cluster, tmp_path):
    spec, rec, channel, slurm, rest = watched
    jid = job_on(slurm, "gpu-a-1", tmp_path)
    gpu_state(api, f"{POOL}-1", HUNG)
    quiet_from = time.time()

    def paged():
        return [m for m in channel.messages if m.event == "job-hung"]

    (page,) = run_until(rec, paged, timeout=60)
    took = time.time() - quiet_from
    assert HANG_AFTER <= took <= HANG_AFTER + 10, took  # not before the declared time; within a few passes of it
    assert page.severity == "critical"
    assert f"job {jid} hung: DCGM_FI_PROF_SM_ACTIVE=0 on all 8 GPUs of {POOL}-1" in page.text, page.text
    assert "requeued from its checkpoint" in page.text
    gpu_state(api, f"{POOL}-1", HEALTHY)
    run_until(rec, lambda: (j := rest.job(jid)) is not None and j.restarts >= 1, timeout=30)
    assert not records_for(rec, f"{POOL}-1")  # a hang is the job's: the node is not healed
    out = why(kube_cluster, slurm, jid)
    assert out.exit_code == 0 and f"hung: DCGM_FI_PROF_SM_ACTIVE=0 on all 8 GPUs of {POOL}-1" in out.output, out.output
    for _ in range(5):
        run_until(rec, lambda: True)
    assert len(paged()) == 1  # one page for the run that hung
    slurm.run(["scancel", str(jid)], timeout=15)


def test_a_throttled_node_of_a_job_is_flagged_as_a_straggler_and_healed_as_degraded(watched, api, tmp_path):
    spec, rec, channel, slurm, rest = watched
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrap 'echo saved; exit 0' TERM\necho started\nwhile true; do sleep 0.2; done\n")
    script.chmod(0o755)
    jid = slurm.sbatch("--requeue", "-N", "2", "-w", "gpu-a-0,gpu-a-1", "-o", str(tmp_path / "out-%j"), str(script))
    run_until(rec, lambda: (j := rest.job(jid)) is not None and j.state == "RUNNING", timeout=30)
    gpu_state(api, f"{POOL}-1", THROTTLING)
    (r,) = run_until(rec, lambda: records_for(rec, f"{POOL}-1"), timeout=60)
    assert (r.kind.value, r.xid) == ("dcgm", 100), r
    assert f"a straggler in job {jid}" in r.reason, r.reason
    assert "DCGM_FI_DEV_SM_CLOCK=990 on GPU 3 (00000000:5D:00.0)" in r.reason and "HW_THERMAL" in r.reason, r.reason
    assert not records_for(rec, f"{POOL}-0")  # its peer, at the job's pace, is not
    run_until(rec, lambda: (j := rest.job(jid)) is not None and (j.restarts >= 1 or j.state == "PENDING"), timeout=60)
    slurm.run(["scancel", str(jid)], timeout=15)
    print(json.dumps({"reason": r.reason}))
