"""The repair loop end to end on the local control plane (issue 25): a real API server, scheduler, Job
controller and kwok nodes, the reconciler as built for a cluster, and the GPU hardware stand-in the local
control plane runs (localenv/gpu_hardware_standin.py) doing to a kwok node what the node agent and the health
check do to a real one. Replace first, repair after: the job's node is replaced by a proven spare at once, then
rebooted (a new boot id), checked by a Job on the node, and returned to the spares; a node nothing fixes is
retired with a page; a bad spare is caught by its check and never promoted."""
from __future__ import annotations

import json

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.node_repair import parse_check, parse_result
from gpufleet.waiting import wait_for
from localenv.gpu_hardware_standin import BROKEN, NVLINK_DOWN, REBOOT_FIXES
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.fixtures.reconciler_kube import fleet, make_nodes, reconciler, records_for, run_until, step

pytestmark = pytest.mark.integration


def simulate(core: client.CoreV1Api, node: str, state: str) -> None:
    """What a test sets and the reconciler never reads: the kwok node's GPU hardware."""
    core.patch_node(node, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: state}}})


def annotations(core, node):
    return core.read_node(node).metadata.annotations or {}


def proven(core, node) -> bool:
    n = core.read_node(node)
    check = parse_check((n.metadata.annotations or {}).get(labels.HEALTH_CHECK))
    return check is not None and check.proves(n.status.node_info.boot_id)


def check_pods(core, node):
    return core.list_namespaced_pod("default", label_selector=f"{labels.HEALTH_CHECK_NODE}={node}").items


def a_pool_with_a_proven_spare(kube_cluster, api, pool: str):
    """Two nodes and a spare, and the reconciler; the spare is proven (a health-check Job on it, passed) before
    anything may use it."""
    spec = fleet(pool, nodes=2, spares=1)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    run_until(rec, lambda: proven(client.CoreV1Api(api), f"{pool}-spare-0"))
    return rec


def replaced_then_returned(rec, core, node: str, spare: str):
    """Replace first, repair after: `node`'s remediation ends with `spare` serving in its place, then its repair
    returns it to the spares. The record."""
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, node) if r.phase.terminal])
    assert r.replacement == spare, "replaced first: the job's node gets the proven spare"
    assert core.read_node(spare).metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, node)
                                   if r.repair is not None and r.repair.phase.terminal], timeout=120)
    assert r.repair.phase is RepairPhase.RETURNED, r.repair
    return r


def test_a_reboot_fixable_node_is_replaced_then_rebooted_validated_and_returned_to_the_spares(kube_cluster, api):
    rec = a_pool_with_a_proven_spare(kube_cluster, api, "rpr")
    core, kube = client.CoreV1Api(api), Kube(api)
    boot = core.read_node("rpr-0").status.node_info.boot_id

    simulate(core, "rpr-0", REBOOT_FIXES)
    kube.set_condition("rpr-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    r = replaced_then_returned(rec, core, "rpr-0", "rpr-spare-0")
    assert r.repair.rungs == ("reboot",)  # until the fault's action is on the record (branch xid): a reboot
    assert [(e.step, e.outcome) for e in r.repair.history] == [("reboot", "asked"), ("reboot", "ok"), ("return", "ok")]
    assert f"passed its health check ({r.repair.job})" in r.repair.history[-1].message
    assert "nvidia-smi: pass" in r.repair.history[-1].message  # the stand-in's report, read from the Job's pod
    node = core.read_node("rpr-0")
    assert node.status.node_info.boot_id != boot, "rebooted: a new boot id"
    answer = parse_result(node.metadata.annotations[labels.REPAIR_RESULT])
    assert answer.ok and answer.id == f"{r.name}/1-reboot"  # answered, once, for the request the record named
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_SPARE and proven(core, "rpr-0")
    assert {c.type: c.status for c in node.status.conditions}["GpuHealthy"] == "True"
    assert node.metadata.annotations[labels.SIMULATED_GPU_STATE] == "healthy"
    # its verdict came from the Job on the node, after the reboot: the pod's termination message
    pod = next(p for p in check_pods(core, "rpr-0") if p.metadata.labels.get("batch.kubernetes.io/job-name") == r.repair.job)
    assert pod.status.phase == "Succeeded" and pod.spec.node_name == "rpr-0"
    report = json.loads(pod.status.container_statuses[0].state.terminated.message)
    assert report["passed"] is True
    for _ in range(3):  # more passes change nothing: no second reboot
        step(rec)
    assert core.read_node("rpr-0").status.node_info.boot_id == node.status.node_info.boot_id


def test_a_node_nothing_fixes_is_retired_with_a_page_and_a_bad_spare_is_never_promoted(kube_cluster, api):
    spec = fleet("rtr", nodes=2, spares=2)
    make_nodes(kube_cluster, spec)
    core, kube = client.CoreV1Api(api), Kube(api)
    simulate(core, "rtr-spare-0", BROKEN)
    rec = reconciler(api, spec)
    # the bad spare's check fails: it leaves the spares (a remediation of its own); the good one is proven
    run_until(rec, lambda: records_for(rec, "rtr-spare-0") and proven(core, "rtr-spare-1"))
    simulate(core, "rtr-0", BROKEN)
    kube.set_condition("rtr-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "rtr-0") if r.phase.terminal])
    assert r.replacement == "rtr-spare-1"
    assert core.read_node("rtr-spare-0").metadata.labels[labels.ROLE] != labels.ROLE_ACTIVE, "a bad spare never serves"

    run_until(rec, lambda: all(x.repair is not None and x.repair.phase is RepairPhase.RETIRED
                               for x in records_for(rec, "rtr-0")), timeout=180)
    (r,) = records_for(rec, "rtr-0")
    steps = [(e.step, e.outcome) for e in r.repair.history]
    assert r.repair.rungs == ("reboot",) and ("validate", "failed") in steps, steps
    node = core.read_node("rtr-0")
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_RETIRED and node.spec.unschedulable
    assert [m for m in rec.notifier.channels[0].messages if m.event == "retired" and "rtr-0" in m.text]


def test_a_node_whose_nvlink_stays_down_fails_its_check_on_the_node_and_never_returns(kube_cluster, api):
    """`nvlink-down`: the stand-in's node prints one GPU's NVLink `<inactive>` whatever is done to it. Replaced
    first; its reboot does not bring the link back; the real check, run on the node by its Job, fails it on its
    NVLinks, and the node is retired: never a spare again."""
    rec = a_pool_with_a_proven_spare(kube_cluster, api, "nvl")
    core, kube = client.CoreV1Api(api), Kube(api)
    simulate(core, "nvl-0", NVLINK_DOWN)
    kube.set_condition("nvl-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "nvl-0") if r.phase.terminal])
    assert r.replacement == "nvl-spare-0"
    run_until(rec, lambda: all(x.repair is not None and x.repair.phase is RepairPhase.RETIRED
                               for x in records_for(rec, "nvl-0")), timeout=180)
    (r,) = records_for(rec, "nvl-0")
    assert [(e.step, e.outcome) for e in r.repair.history][:3] == [
        ("reboot", "asked"), ("reboot", "ok"), ("validate", "failed")]
    assert "nvlink: fail (GPU 3: 17 of 18 NVLinks active (inactive: [5]))" in r.repair.reason
    pod = next(p for p in check_pods(core, "nvl-0") if p.metadata.labels.get("batch.kubernetes.io/job-name") == r.repair.job)
    report = json.loads(pod.status.container_statuses[0].state.terminated.message)
    assert report["passed"] is False and report["action"] == "reboot"
    assert {c["name"]: c["status"] for c in report["checks"]}["nvlink"] == "fail"
    node = core.read_node("nvl-0")
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_RETIRED and not proven(core, "nvl-0")


def test_a_kwok_nodes_reset_is_answered_once_per_id_as_the_agent_answers(kube_cluster, api):
    """The reset rung on the local environment (the loop asks for it once the fault's action is on the record:
    branch xid): the stand-in answers as reconciler/agent/repairs.py does, from the simulated hardware."""
    from datetime import datetime, timezone

    from gpufleet.fleetspec.node_repair import RepairRequest
    from localenv.gpu_hardware_standin import RESET_FIXES
    spec = fleet("rgp", nodes=2, spares=0)
    make_nodes(kube_cluster, spec)
    core = client.CoreV1Api(api)

    def ask(node, rid):
        req = RepairRequest(rid, "reset-gpu", datetime.now(timezone.utc), ("00000000:3B:00.0",))
        core.patch_node(node, {"metadata": {"annotations": {labels.REPAIR_REQUEST: req.dumps()}}})
        return wait_for(f"the answer to {rid}", lambda: (a := parse_result(annotations(core, node).get(
            labels.REPAIR_RESULT))) and a.id == rid and a, timeout=30)

    simulate(core, "rgp-0", RESET_FIXES)
    simulate(core, "rgp-1", REBOOT_FIXES)
    boot = core.read_node("rgp-0").status.node_info.boot_id
    fixed, lost = ask("rgp-0", "t/1-reset-gpu"), ask("rgp-1", "t/1-reset-gpu")
    assert fixed.ok and annotations(core, "rgp-0")[labels.SIMULATED_GPU_STATE] == "healthy"
    assert fixed.boot == boot == core.read_node("rgp-0").status.node_info.boot_id, "a reset is no reboot"
    assert not lost.ok and "Unable to reset" in lost.message
    assert annotations(core, "rgp-1")[labels.SIMULATED_GPU_STATE] == REBOOT_FIXES
    # the same request written again (a reconciler that crashed before noting it) is not acted on again: once a
    # later request on another node is answered, the stand-in has seen it, and the first answer stands
    simulate(core, "rgp-0", RESET_FIXES)
    ask("rgp-0", "t/1-reset-gpu")  # the same id: its answer is there already
    ask("rgp-1", "t/2-reset-gpu")
    assert parse_result(annotations(core, "rgp-0")[labels.REPAIR_RESULT]).at == fixed.at
    assert annotations(core, "rgp-0")[labels.SIMULATED_GPU_STATE] == RESET_FIXES


def test_a_reset_fixable_node_is_replaced_then_reset_validated_and_returned_with_no_reboot(kube_cluster, api):
    """XID 95 (uncontained memory error): the catalogue's action is reset-gpu (fleetspec/faults), so the loop's
    first rung is a reset of the GPU the fault names, asked for once; the stand-in's reset fixes a `reset-fixes`
    node without a reboot (same boot id); its check passes and it is a spare again."""
    from gpufleet.fleetspec.faults import FaultAction, Kind
    from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, reason_for
    from localenv.gpu_hardware_standin import RESET_FIXES
    rec = a_pool_with_a_proven_spare(kube_cluster, api, "rsf")
    core, kube = client.CoreV1Api(api), Kube(api)
    boot = core.read_node("rsf-0").status.node_info.boot_id

    simulate(core, "rsf-0", RESET_FIXES)
    fault = FaultSignal(Kind.XID, 95, FaultAction.RESET_GPU, "0000:3b:00")
    kube.set_condition("rsf-0", "GpuHealthy", "False", reason_for(Kind.XID, 95), format_message(fault, "injected by a test"))
    r = replaced_then_returned(rec, core, "rsf-0", "rsf-spare-0")
    assert r.repair.rungs == ("reset-gpu",), "the fault's action on the record: a reset first, and enough"
    assert [(e.step, e.outcome) for e in r.repair.history] == [("reset-gpu", "asked"), ("reset-gpu", "ok"), ("return", "ok")]
    assert f"passed its health check ({r.repair.job})" in r.repair.history[-1].message
    node = core.read_node("rsf-0")
    answer = parse_result(node.metadata.annotations[labels.REPAIR_RESULT])
    assert answer.ok and answer.id == f"{r.name}/1-reset-gpu"  # one request id, answered once
    assert r.pci and r.repair.gpus == (r.pci,) and "3b:00" in r.pci.lower(), "the reset named only the faulty GPU"
    assert node.status.node_info.boot_id == boot, "a reset, no reboot: the same boot id"
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_SPARE and proven(core, "rsf-0")
    assert {c.type: c.status for c in node.status.conditions}["GpuHealthy"] == "True"
    assert node.metadata.annotations[labels.SIMULATED_GPU_STATE] == "healthy"
    pod = next(p for p in check_pods(core, "rsf-0") if p.metadata.labels.get("batch.kubernetes.io/job-name") == r.repair.job)
    assert pod.status.phase == "Succeeded" and pod.spec.node_name == "rsf-0"
    for _ in range(3):  # more passes change nothing: no second request, no reboot
        step(rec)
    again = core.read_node("rsf-0")
    assert again.status.node_info.boot_id == boot
    assert parse_result(again.metadata.annotations[labels.REPAIR_RESULT]).at == answer.at
