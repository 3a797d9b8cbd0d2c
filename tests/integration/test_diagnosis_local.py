"""Diagnostics asked (a repeated Xid 13 on one GPU: NVIDIA's RUN_DCGMEUD) end to end on the local control plane: a
real API server, scheduler, Job controller and kwok nodes, the reconciler as built for a cluster, and the GPU
hardware stand-in answering the health check (localenv/gpu_hardware_standin.py). The node stays in service: it
is checked where it serves (a Job on it) and put back; no spare is used, nothing retired."""
from __future__ import annotations

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core.diagnosis_stages import Stage
from gpufleet.reconciler.core.phases import Phase
from tests.fixtures.reconciler_kube import fleet, make_nodes, reconciler, records_for, run_until

pytestmark = pytest.mark.integration


def test_a_diagnosis_checks_the_node_where_it_serves_and_puts_it_back(kube_cluster, api):
    spec = fleet("dgn", nodes=2, spares=1)
    make_nodes(kube_cluster, spec)
    core, kube = client.CoreV1Api(api), Kube(api)
    rec = reconciler(api, spec)
    msg = format_message(FaultSignal(Kind.XID, 13, FaultAction.DIAGNOSE, "0000:cb:00"),
                         "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    kube.set_condition("dgn-0", "GpuHealthy", "False", "Xid13", msg)
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "dgn-0") if r.phase.terminal], timeout=180)
    assert r.phase is Phase.SUCCEEDED and r.diagnosis.stage is Stage.PASSED, (r.reason, r.diagnosis)
    assert [s for s, _ in r.diagnosis.stage_times] == ["Draining", "Clearing", "Checking", "Returning", "Passed"]
    node = core.read_node("dgn-0")
    assert node.metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE and not node.spec.unschedulable
    assert {c.type: c.status for c in node.status.conditions}["GpuHealthy"] == "True"
    pods = core.list_namespaced_pod("default", label_selector=f"{labels.HEALTH_CHECK_NODE}=dgn-0").items
    check = next(p for p in pods if p.metadata.labels.get("batch.kubernetes.io/job-name") == r.diagnosis.job)
    assert check.spec.node_name == "dgn-0" and check.status.phase == "Succeeded"
    assert core.read_node("dgn-spare-0").metadata.labels[labels.ROLE] == labels.ROLE_SPARE  # no spare used
    assert not [m for m in rec.notifier.channels[0].messages if m.event in ("detected", "retired")]
