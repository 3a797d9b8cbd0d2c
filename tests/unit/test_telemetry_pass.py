"""The telemetry pass in the runtime, with fakes of the adapters and a fake clock: dcgm-exporter's exposition (the
stand-in's, for each node's GPU state) read, judged by the core and acted on through the heal every fault takes."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from gpufleet.fleetspec.faults import Kind
from gpufleet.reconciler.adapters.dcgm import parse_exposition
from gpufleet.reconciler.adapters.slurm import SlurmJob
from gpufleet.reconciler.core.phases import Phase
from localenv.dcgm_exporter_standin import NodeGpus, exposition
from localenv.gpu_hardware_standin import HEALTHY, HUNG, ROW_REMAP_PENDING, THROTTLING
from tests.unit.fakes import World, fleet

DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
WATCH = {"telemetry": {"source": "exporter", "exporter_urls": ["http://dcgm-exporter:9400/metrics"],
                       "every_seconds": 15}}


class Exporter:
    """dcgm-exporter as the stand-in renders it, for the GPU states a test sets (healthy by default)."""

    def __init__(self, world: World, states: dict[str, str] | None = None):
        self.world, self.states, self.reads = world, states or {}, 0

    def read(self):
        self.reads += 1
        nodes = [NodeGpus(n, self.states.get(n, HEALTHY), 8) for n in sorted(self.world.kube.nodes)]
        return parse_exposition(exposition(nodes), self.world.clock())


def world(**pool_telemetry) -> tuple[World, Exporter]:
    spec = fleet(nodes=3, spares=1, grace_period_seconds=60, **WATCH)
    if pool_telemetry:
        doc = spec.model_dump(mode="json")
        doc["pools"][0]["telemetry"] = pool_telemetry
        spec = type(spec).model_validate(doc)
    w = World(spec)
    exporter = Exporter(w)
    w.manager.passes["telemetry"].reader = exporter
    return w, exporter


def running(w: World, jid: int, *hosts: str) -> None:
    w.slurm.jobs[jid] = SlurmJob(jid, "train", "RUNNING", hosts, start_time=(w.clock() - timedelta(hours=1)).timestamp())


def test_a_pending_row_remap_read_from_the_exporter_heals_the_node_and_signals_its_job_to_checkpoint():
    w, exporter = world()
    running(w, 7, "h100-w0")
    w.run(30)
    assert exporter.reads >= 2 and w.store.list() == []  # a healthy fleet: nothing
    exporter.states["h100-0"] = ROW_REMAP_PENDING
    w.run(20)
    r = w.remediation("h100-0")
    assert (r.kind, r.xid) == (Kind.DCGM, 396) and r.jobs == (7,) and ("signal", (7,)) in w.slurm.calls
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING=1 on GPU 0 (00000000:19:00.0), threshold >= 1" in r.reason
    assert r.phase is not Phase.DETECTED
    w.run(120)
    assert [x.name for x in w.store.list()] == [r.name]  # one record, however often the exporter is read


def test_a_hung_job_is_paged_once_after_the_pools_time_and_requeued_only_with_its_consent():
    for consent in (False, True):
        w, exporter = world(hang_after_seconds=120, requeue_hung_jobs=consent)
        running(w, 9, "h100-w1", "h100-w2")
        exporter.states.update({"h100-1": HUNG, "h100-2": HUNG})
        w.run(105)
        assert "job-hung" not in w.notifier.sent and 9 not in w.slurm.comments  # quiet for less than the pool's 120 s
        w.run(45)
        (page,) = w.notifier.texts["job-hung"]
        assert "job 9 hung: DCGM_FI_PROF_SM_ACTIVE=0 on all 16 GPUs of h100-1, h100-2" in page
        assert "hung: DCGM_FI_PROF_SM_ACTIVE=0 on all 16 GPUs of h100-1, h100-2" in w.slurm.comments[9]
        assert (("requeue", (9,)) in w.slurm.calls) is consent
        if consent:
            w.slurm.jobs[9] = replace(w.slurm.jobs[9], state="RUNNING", nodes=("h100-w1", "h100-w2"),
                                      start_time=w.clock().timestamp())  # runs again, and hangs again
        w.run(60)
        assert w.slurm.comments[9].count("hung:") == 1 and w.notifier.sent.count("job-hung") == 1  # one per run
        assert w.store.list() == []  # a hang is the job's: no node is healed


def test_a_hang_is_paged_once_across_a_reconciler_restart():
    """The dedup survives the process: a restarted reconciler (fresh memory, the same Slurm) reads the hang's line in
    the job's admin comment and pages nothing more."""
    w, exporter = world(hang_after_seconds=120)
    running(w, 9, "h100-w1")
    exporter.states["h100-1"] = HUNG
    w.run(150)
    assert w.notifier.sent.count("job-hung") == 1 and "hung:" in w.slurm.comments[9]
    w.restart()
    w.manager.passes["telemetry"].reader = exporter
    w.run(200)
    assert w.notifier.sent.count("job-hung") == 1 and w.slurm.comments[9].count("hung:") == 1


def test_an_uncorrectable_ecc_error_drains_the_node_at_its_jobs_boundary_and_heals_it_once_the_job_ended():
    """NVIDIA's DRAIN_AND_RESET (Xid 48 with 63/64): the running job is not signalled; no new job lands; the heal
    follows once the node runs nothing."""
    w, exporter = world()
    running(w, 4, "h100-w0")
    w.run(20)
    dbe = {"count": 0.0}
    plain = exporter.read

    def read():
        samples, pci = plain()
        return [replace(s, value=dbe["count"]) if (s.node, s.gpu, s.field) == ("h100-0", "2", DBE) else s
                for s in samples], pci

    exporter.read = read
    w.run(20)
    dbe["count"] = 1.0  # one double-bit error
    w.run(30)
    assert w.store.list() == [] and ("signal", (4,)) not in w.slurm.calls
    drained = w.slurm.table["h100-w0"]
    assert "DRAIN" in drained.states and drained.reason.startswith("gpufleet: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    w.slurm.jobs[4] = replace(w.slurm.jobs[4], state="COMPLETED")  # the job ends on its own
    w.run(20)
    r = w.remediation("h100-0")
    assert (r.kind, r.xid, r.jobs) == (Kind.DCGM, 311, ()) and "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=1 on GPU 2" in r.reason
    assert ("signal", (4,)) not in w.slurm.calls


def test_a_throttled_node_of_a_job_is_a_straggler_even_beside_a_node_a_finished_heal_left_its_annotation_on():
    """The peer's `gpufleet.io/remediation` annotation names a heal that is over (its GPU condition healthy): its
    clocks still count as the job's pace."""
    w, exporter = world(straggler_after_seconds=30)
    w.kube.nodes["h100-0"]["metadata"]["annotations"]["gpufleet.io/remediation"] = "h100-0-xid79-1"
    running(w, 4, "h100-w0", "h100-w1")
    w.run(20)
    exporter.states["h100-1"] = THROTTLING
    w.run(60)
    r = w.remediation("h100-1")
    assert (r.kind, r.xid, r.jobs) == (Kind.DCGM, 100, (4,)) and "a straggler in job 4" in r.reason
    assert "DCGM_FI_DEV_SM_CLOCK=990 on GPU 3 (00000000:5D:00.0)" in r.reason and "HW_THERMAL" in r.reason
