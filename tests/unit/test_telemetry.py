"""GPU telemetry: the threshold table, the pure decisions (degraded, straggler, hang, what each asks), the spec's
fields, the exporter stand-in's exposition and the readers of it."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import SpecError, labels, parse_fleet
from gpufleet.fleetspec.faults import FaultAction, Kind, describe
from gpufleet.fleetspec.faults.condition import parse_condition
from gpufleet.fleetspec.faults.telemetry import FIELDS, HW_THERMAL, REQUIRED_COUNTERS, THRESHOLDS, Check, When
from localenv.dcgm_exporter_standin import NodeGpus, exposition
from localenv.gpu_hardware_standin import HUNG, ROW_REMAP_PENDING, THROTTLING
from gpufleet.reconciler.adapters.dcgm import parse_exposition, parse_query
from gpufleet.reconciler.core import telemetry as tm
from gpufleet.reconciler.core.actions import DrainSlurm, MarkDegraded, NoteJob, Notify, RequeueJobs
from gpufleet.reconciler.core.decide import detect
from gpufleet.reconciler.core.faults import FaultReader
from gpufleet.reconciler.core.model import NodeView, SlurmNodeView
from gpufleet.reconciler.core.observe import node_view

T0 = datetime(2026, 12, 6, 4, 0, tzinfo=timezone.utc)
REMAP, DBE = "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"


def spec(**pool_telemetry):
    return parse_fleet({
        "environment": "test", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 1,
                   "telemetry": {"hang_after_seconds": 60, "straggler_after_seconds": 60, **pool_telemetry}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })


def series(node, gpu, field, values, start=T0, every=15):
    """`values` sampled every `every` seconds from `start`."""
    return {(node, str(gpu), field): tuple((start + timedelta(seconds=i * every), float(v)) for i, v in enumerate(values))}


def node(name="h100-0", **kw):
    return NodeView(name=name, pool="h100", role=labels.ROLE_ACTIVE, **kw)


# --- the table ------------------------------------------------------------------------------------

def test_every_threshold_names_a_field_dcgm_exporter_serves_and_cites_its_source():
    for t in THRESHOLDS:
        assert t.field in FIELDS and t.field in REQUIRED_COUNTERS
        assert ("nvidia" in t.source.lower() or "dcgm" in t.source.lower()) and t.meaning
        assert t.action.remediates, t  # a degraded node is taken out: the heal and the repair loop follow
        assert (t.window_seconds > 0) == (t.test is not Check.AT_LEAST)
    assert {t.field: t.when for t in THRESHOLDS}[REMAP] is When.CHECKPOINT
    assert {t.field: t.when for t in THRESHOLDS}[DBE] is When.JOB_BOUNDARY  # Xid 48 with 63/64: DRAIN_AND_RESET
    # the ids are DCGM's (go-dcgm const_fields.go at the version dcgm-exporter 4.5.3-4.8.2 pins)
    assert {n: FIELDS[n].id for n in (REMAP, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_SM_CLOCK",
                                      "DCGM_FI_PROF_SM_ACTIVE")} == {REMAP: 396, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
                                                                     "DCGM_FI_DEV_SM_CLOCK": 100,
                                                                     "DCGM_FI_PROF_SM_ACTIVE": 1002}


def test_a_dcgm_fault_is_a_kind_of_its_own_named_after_its_field():
    assert describe(396, Kind.DCGM) == REMAP
    sig = parse_condition("Dcgm396", "[action=reset-gpu pci=00000000:19:00] row remap pending")
    assert (sig.kind, sig.code, sig.action) == (Kind.DCGM, 396, FaultAction.RESET_GPU)


# --- thresholds ------------------------------------------------------------------------------------

def test_a_pending_row_remap_degrades_the_node_and_moves_its_job_at_a_checkpoint():
    h = {**series("h100-0", 0, REMAP, [0, 0, 1]), **series("h100-0", 1, REMAP, [0, 0, 0]),
         **series("h100-1", 0, REMAP, [0, 0, 0])}
    (d,) = tm.crossed(h, T0 + timedelta(seconds=30), {("h100-0", "0"): "00000000:19:00.0"})
    assert (d.node, d.code, d.action, d.when) == ("h100-0", 396, FaultAction.RESET_GPU, When.CHECKPOINT)
    assert d.evidence.text() == f"{REMAP}=1 on GPU 0 (00000000:19:00.0), threshold >= 1"
    assert "next GPU reset" in d.message()


def test_a_counter_rise_within_its_window_crosses_and_a_counter_reset_is_not_a_fall():
    now = T0 + timedelta(seconds=30)
    assert tm.crossed(series("n", 0, DBE, [5, 5, 5]), now) == []
    (d,) = tm.crossed(series("n", 0, DBE, [5, 5, 6]), now)
    assert d.when is When.JOB_BOUNDARY and d.evidence.value == 1
    assert tm.increase([(T0, 7.0), (T0, 0.0), (T0, 2.0)]) == 2  # the exporter restarted: counted from 0
    old = series("n", 0, DBE, [5, 6], start=T0 - timedelta(hours=2))  # the rise is older than the row's hour
    assert tm.crossed(old, now) == []


def test_a_slowdown_counts_only_when_held_over_the_whole_window_and_the_gravest_row_wins():
    f = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    held = series("n", 3, f, [HW_THERMAL] * 41)  # 600 s at 15 s
    assert tm.crossed(held, T0 + timedelta(seconds=600))[0].evidence.detail == "HW_THERMAL"
    assert tm.crossed(series("n", 3, f, [HW_THERMAL] * 20), T0 + timedelta(seconds=285)) == []  # not yet 600 s
    assert tm.crossed(series("n", 3, f, [0x4] * 41), T0 + timedelta(seconds=600)) == []  # power cap: normal life
    both = {**held, **series("n", 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", [1] * 41)}
    (d,) = tm.crossed(both, T0 + timedelta(seconds=600))
    assert (d.code, d.action, d.when) == (395, FaultAction.CONTACT_SUPPORT, When.CHECKPOINT)


# --- what a degradation asks -------------------------------------------------------------------------

def degraded(when=When.CHECKPOINT):
    return tm.Degradation("h100-0", 396, FaultAction.RESET_GPU, when, "a row remap is pending",
                          tm.Evidence(REMAP, "0", 1, ">= 1", "00000000:19:00.0"), "NVIDIA's doc")


def test_a_checkpoint_row_writes_the_gpu_condition_the_heal_reads():
    (a,) = tm.plan([degraded()], {"h100-0": tm.NodeJobs(node(), (SlurmNodeView("h100-0", frozenset({"ALLOCATED"})),),
                                                         (7,))}, spec())
    assert isinstance(a, MarkDegraded) and a.reason == "Dcgm396"
    raw = {"metadata": {"name": "h100-0", "labels": {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_ACTIVE}},
           "status": {"conditions": [{"type": labels.GPU_CONDITION, "status": "False", "reason": a.reason,
                                      "message": a.message, "lastTransitionTime": T0.isoformat()},
                                     {"type": "Ready", "status": "True"}]}}
    v = node_view(raw, FaultReader.from_spec(spec().healing))
    assert (v.fault.kind, v.fault.xid, v.fault.needs) == (Kind.DCGM, 396, FaultAction.RESET_GPU)
    r = detect(v, [], spec(), T0).remediation
    assert r is not None and r.kind is Kind.DCGM and r.name == "h100-0-dcgm396-" + str(int(T0.timestamp()))
    assert REMAP in r.reason and "=1 on GPU 0 (00000000:19:00.0), threshold >= 1" in r.reason


def test_a_job_boundary_row_drains_a_busy_node_and_heals_it_once_its_job_ended():
    busy = SlurmNodeView("h100-0", frozenset({"ALLOCATED"}))
    (a,) = tm.plan([degraded(When.JOB_BOUNDARY)], {"h100-0": tm.NodeJobs(node(), (busy,), (7,))}, spec())
    assert isinstance(a, DrainSlurm) and a.reason.startswith("gpufleet: ") and "[dcgm396 h100-0]" in a.reason
    drained = SlurmNodeView("h100-0", frozenset({"ALLOCATED", "DRAIN"}), a.reason)
    assert tm.plan([degraded(When.JOB_BOUNDARY)], {"h100-0": tm.NodeJobs(node(), (drained,), (7,))}, spec()) == ()
    idle = SlurmNodeView("h100-0", frozenset({"IDLE", "DRAIN"}), a.reason)
    (m,) = tm.plan([degraded(When.JOB_BOUNDARY)], {"h100-0": tm.NodeJobs(node(), (idle,), ())}, spec())
    assert isinstance(m, MarkDegraded) and m.reason == "Dcgm396"
    # the threshold no longer holds (a counter's window passed): the drain it asked for still ends in the heal
    (m2,) = tm.plan([], {"h100-0": tm.NodeJobs(node(), (idle,), ())}, spec())
    assert isinstance(m2, MarkDegraded) and m2.reason == "Dcgm396"


def test_a_node_with_a_fault_or_a_heal_under_way_or_out_of_the_fleet_is_left_alone():
    from gpufleet.reconciler.core.model import Fault
    for v in (node(fault=Fault(79, "x", T0)), node(remediation="r1"), NodeView("other-0", None, labels.ROLE_ACTIVE)):
        assert tm.plan([degraded()], {"h100-0": tm.NodeJobs(v)}, spec()) == ()


# --- stragglers -------------------------------------------------------------------------------------

def clocks(node_name, per_gpu, n=5):
    out = {}
    for g, mhz in per_gpu.items():
        out.update(series(node_name, g, "DCGM_FI_DEV_SM_CLOCK", [mhz] * n))
    return out


def test_a_node_whose_gpu_lags_the_jobs_other_nodes_is_a_straggler_with_its_throttle_reasons():
    h = {**clocks("a", {0: 1980, 1: 1980}), **clocks("b", {0: 1980, 1: 1975}),
         **clocks("c", {0: 1980, 1: 990}),
         **series("c", 1, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", [HW_THERMAL] * 5)}
    job = tm.RunningJob(12, ("a", "b", "c"), ("h100",), T0 - timedelta(hours=1))
    now = T0 + timedelta(seconds=60)
    (d,) = tm.stragglers([job], h, spec(), now)
    assert (d.node, d.code, d.when, d.action) == ("c", 100, When.CHECKPOINT, FaultAction.CONTACT_SUPPORT)
    assert d.evidence.text() == ("DCGM_FI_DEV_SM_CLOCK=990 on GPU 1, threshold < 0.8 x the job's median node (1975 MHz) "
                                 "for 60s; clock event reasons HW_THERMAL")
    assert "job 12" in d.meaning
    assert tm.stragglers([job], h, spec(straggler_clock_ratio=0.4), now) == []  # within the pool's ratio
    assert tm.stragglers([job], h, spec(), T0 + timedelta(seconds=45)) == []  # not read for the whole span yet
    assert tm.stragglers([tm.RunningJob(13, ("c",), ("h100",))], h, spec(), now) == []  # one node: no peers


# --- hangs ------------------------------------------------------------------------------------------

def quiet(node_name, gpus=2, values=(0,) * 5, field="DCGM_FI_PROF_SM_ACTIVE"):
    out = {}
    for g in range(gpus):
        out.update(series(node_name, g, field, values))
    return out


def test_a_job_whose_gpus_are_all_quiet_for_the_declared_time_is_hung_and_paged_once_per_run():
    job = tm.RunningJob(5, ("a", "b"), ("h100",), T0 - timedelta(hours=1))
    h = {**quiet("a"), **quiet("b")}
    (hang,) = tm.hangs([job], h, spec(), T0 + timedelta(seconds=60))
    assert (hang.job_id, hang.gpus, hang.field, hang.since, hang.requeue) == (5, 4, "DCGM_FI_PROF_SM_ACTIVE", T0, False)
    assert "all 4 GPUs of a, b" in hang.text() and "paged only" in hang.text()
    (page,) = tm.page_hang(hang)  # its admin comment was not read: never written over
    assert isinstance(page, Notify) and page.event == "job-hung" and page.severity == "critical"
    read = tm.RunningJob(5, ("a", "b"), ("h100",), T0 - timedelta(hours=1), "ops: priority")
    note, _ = tm.page_hang(tm.hangs([read], h, spec(), T0 + timedelta(seconds=60))[0])  # the line first
    assert isinstance(note, NoteJob) and note.text == ("ops: priority | gpufleet 2026-12-06T04:00:00Z: hung: "
                                                       "DCGM_FI_PROF_SM_ACTIVE=0 on all 4 GPUs of a, b; paged | "
                                                       "whole story: gpufleet why 5")
    later = {**quiet("a", values=(0,) * 9), **quiet("b", values=(0,) * 9)}
    assert tm.hangs([job], later, spec(), T0 + timedelta(seconds=120))[0].key == hang.key  # one episode, one key


def test_a_hang_needs_every_gpu_quiet_for_the_whole_time():
    job = tm.RunningJob(5, ("a", "b"), ("h100",), T0 - timedelta(hours=1))
    now = T0 + timedelta(seconds=60)
    assert tm.hangs([job], {**quiet("a"), **quiet("b", values=(0, 0, 0, 0.4, 0))}, spec(), now) == []
    assert tm.hangs([job], {**quiet("a"), **quiet("b", values=(0.5, 0, 0, 0, 0))}, spec(), now) == []  # 45 s quiet
    assert tm.hangs([job], quiet("a"), spec(), now) == []  # b's GPUs not read: no verdict
    young = tm.RunningJob(5, ("a", "b"), ("h100",), T0 + timedelta(seconds=30))
    assert tm.hangs([young], {**quiet("a"), **quiet("b")}, spec(), now) == []  # a requeued job counts afresh
    util = {**quiet("a", field="DCGM_FI_DEV_GPU_UTIL"), **quiet("b", field="DCGM_FI_DEV_GPU_UTIL")}
    assert tm.hangs([job], util, spec(), now)[0].field == "DCGM_FI_DEV_GPU_UTIL"  # no profiling metrics: utilisation


def test_a_hung_job_is_requeued_only_where_the_pool_consents():
    job = tm.RunningJob(5, ("a",), ("h100",), T0 - timedelta(hours=1))
    (hang,) = tm.hangs([job], quiet("a"), spec(requeue_hung_jobs=True), T0 + timedelta(seconds=60))
    page, requeue = tm.page_hang(hang)  # (no admin comment read: no line)
    assert requeue == RequeueJobs((5,)) and "requeued from its checkpoint" in page.text


# --- the spec ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("healing,pool,path", [
    ({"telemetry": {"source": "prometheus"}}, {}, "healing.telemetry.prometheus_url"),
    ({"telemetry": {"source": "exporter"}}, {}, "healing.telemetry.exporter_urls"),
    ({"telemetry": {"source": "exporter", "exporter_urls": ["ftp://x"]}}, {}, "healing.telemetry.exporter_urls"),
    ({"telemetry": {"source": "kafka"}}, {}, "healing.telemetry.source"),
    ({}, {"straggler_clock_ratio": 1.5}, "pools[0].telemetry.straggler_clock_ratio"),
    ({}, {"hang_after_seconds": 0}, "pools[0].telemetry.hang_after_seconds"),
    ({}, {"requeue_hung_job": True}, "pools[0].telemetry.requeue_hung_job"),
])
def test_bad_telemetry_settings_name_the_field(healing, pool, path):
    doc = {"environment": "t", "cluster": {"kind": "local"}, "healing": healing,
           "pools": [{"name": "h", "node_type": "x", "gpu_model": "H100", "nodes": 1, "spares": 0, "telemetry": pool}],
           "slurm": {"partitions": [{"name": "p", "pools": ["h"]}]}}
    with pytest.raises(SpecError) as e:
        parse_fleet(doc)
    assert [p for p, _ in e.value.issues] == [f"gpufleet:fleet.{path}"], e.value.issues


def test_telemetry_is_off_and_hangs_are_only_paged_by_default():
    s = parse_fleet({"environment": "t", "cluster": {"kind": "local"},
                     "pools": [{"name": "h", "node_type": "x", "gpu_model": "H100", "nodes": 1, "spares": 0}],
                     "slurm": {"partitions": [{"name": "p", "pools": ["h"]}]}})
    assert s.healing.telemetry.source == "none" and s.pools[0].telemetry.requeue_hung_jobs is False


# --- the exporter stand-in and the readers ------------------------------------------------------------

def test_the_stand_in_serves_dcgm_exporters_lines_driven_by_the_gpu_state():
    text = exposition([NodeGpus("kwok-a", ROW_REMAP_PENDING, 2, {"pod": "slurm-worker-a-0", "namespace": "slurm",
                                                                 "container": "slurmd", "pod_uid": "u1"}),
                       NodeGpus("kwok-b", THROTTLING, 8), NodeGpus("kwok-c", HUNG, 1)])
    line = next(x for x in text.splitlines() if x.startswith(REMAP + "{") and 'Hostname="kwok-a"' in x
                and 'gpu="0"' in x)
    # render_metrics.go gpuMetricsFormat: gpu, UUID, pci_bus_id, device, modelName, Hostname, then labels, attributes
    assert line.startswith(f'{REMAP}{{gpu="0",UUID="GPU-') and line.endswith(
        ',pci_bus_id="00000000:19:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="kwok-a",'
        'DCGM_FI_DRIVER_VERSION="535.161.08",container="slurmd",namespace="slurm",pod="slurm-worker-a-0",'
        'pod_uid="u1"} 1') and line.index("UUID") < line.index("pci_bus_id")
    assert f"# TYPE {REMAP} gauge" in text and "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
    samples, pci = parse_exposition(text, T0)
    got = {(s.node, s.gpu, s.field): s.value for s in samples}
    assert got[("kwok-a", "0", REMAP)] == 1 and got[("kwok-a", "1", REMAP)] == 0
    assert got[("kwok-b", "3", "DCGM_FI_DEV_SM_CLOCK")] == 990 and got[("kwok-b", "2", "DCGM_FI_DEV_SM_CLOCK")] == 1980
    assert got[("kwok-b", "3", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")] == HW_THERMAL
    assert got[("kwok-c", "0", "DCGM_FI_PROF_SM_ACTIVE")] == 0 and got[("kwok-c", "0", "DCGM_FI_DEV_SM_CLOCK")] > 0
    assert pci[("kwok-a", "0")] == "00000000:19:00.0"
    assert got[("kwok-a", "0", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")] == 1  # a counter, read by its own name
    assert got[("kwok-b", "0", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")] == 0
    assert [d.node for d in tm.crossed({(s.node, s.gpu, s.field): ((s.at, s.value),) for s in samples}, T0)] == \
        ["kwok-a"]


def test_prometheus_answers_are_read_with_the_exporters_labels_and_errors_are_temporary():
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": REMAP, "gpu": "2", "Hostname": "h100-0", "pci_bus_id": "00000000:4C:00.0",
                    "job": "dcgm-exporter"}, "value": [T0.timestamp(), "1"]},
        {"metric": {"__name__": REMAP, "gpu": "0"}, "value": [T0.timestamp(), "1"]},  # no Hostname: no node's GPU
    ]}}).encode()
    samples, pci = parse_query(body)
    assert [(s.node, s.gpu, s.field, s.value, s.at) for s in samples] == [("h100-0", "2", REMAP, 1.0, T0)]
    from gpufleet.reconciler.errors import TemporaryError
    with pytest.raises(TemporaryError):
        parse_query(b'{"status": "error", "error": "bad_data"}')
    with pytest.raises(TemporaryError):
        parse_query(b"<html>")


def test_a_node_back_from_its_repair_is_judged_afresh():
    h = {**series("a", 0, DBE, [5, 6]), **series("b", 0, DBE, [5, 5])}
    assert set(k[0] for k in tm.forget(h, ["a"])) == {"b"}
    assert tm.crossed(tm.forget(h, ["a"]), T0 + timedelta(seconds=30)) == []


def test_a_node_someone_else_drained_keeps_that_drain():
    person = SlurmNodeView("h100-0", frozenset({"ALLOCATED", "DRAIN"}), "ops: fan noise")
    assert tm.plan([degraded(When.JOB_BOUNDARY)], {"h100-0": tm.NodeJobs(node(), (person,), (7,))}, spec()) == ()


def test_the_reconcilers_network_policy_lets_it_reach_the_telemetry_it_reads_and_nothing_more():
    from gpufleet.components.network import reconciler_policy
    base = {"environment": "t", "cluster": {"kind": "local"},
            "pools": [{"name": "h", "node_type": "x", "gpu_model": "H100", "nodes": 1, "spares": 0}],
            "slurm": {"partitions": [{"name": "p", "pools": ["h"]}]}}
    off = reconciler_policy(parse_fleet(base))["spec"]["egress"]
    on = reconciler_policy(parse_fleet({**base, "healing": {"telemetry": {
        "source": "prometheus", "prometheus_url": "http://prometheus.monitoring:9090"}}}))["spec"]["egress"]
    assert on[:-1] == off and on[-1] == {"ports": [{"protocol": "TCP", "port": 9090}]}


def test_a_hang_whose_line_is_in_the_jobs_admin_comment_was_paged_and_is_not_paged_again():
    """The line is written before the page: a restarted or new leader reads it back and pages nothing."""
    job = tm.RunningJob(5, ("a",), ("h100",), T0 - timedelta(hours=1), "ops: priority")
    (hang,) = tm.hangs([job], quiet("a"), spec(), T0 + timedelta(seconds=60))
    note, page = tm.page_hang(hang)
    assert isinstance(note, NoteJob) and isinstance(page, Notify)
    again = tm.RunningJob(5, ("a",), ("h100",), T0 - timedelta(hours=1), note.text)  # as Slurm keeps it
    (seen,) = tm.hangs([again], quiet("a"), spec(), T0 + timedelta(seconds=90))
    assert tm.paged_before(seen) and tm.page_hang(seen) == ()
    consents = tm.hangs([again], quiet("a"), spec(requeue_hung_jobs=True), T0 + timedelta(seconds=90))[0]
    assert tm.page_hang(consents) == (RequeueJobs((5,)),)  # a requeue a crash cut off is asked again, never the page
    # the job requeued and running again (a new start): its earlier run's line is not this run's page
    rerun = tm.RunningJob(5, ("a",), ("h100",), T0 + timedelta(seconds=61), note.text)
    later = quiet("a", values=(0,) * 20)
    (new,) = tm.hangs([rerun], later, spec(), T0 + timedelta(seconds=200))
    assert not tm.paged_before(new) and any(isinstance(a, Notify) for a in tm.page_hang(new))
    assert new.line().startswith("gpufleet 2026-12-06T04:01:01Z: hung:")  # dated within its own run
