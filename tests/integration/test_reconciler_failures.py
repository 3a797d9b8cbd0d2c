"""When a dependency fails: Slurm's controller is down during a remediation. The reconciler
retries with backoff, a bounded number of times, then ends the record in Failed with the reason
and tells the user; when Slurm answers again in time, the same remediation goes on."""
from __future__ import annotations

import time

import pytest
from kubernetes import client

from fleetspec import labels
from reconciler import local_nodes
from reconciler.kube import Kube
from reconciler.phases import Phase
from reconciler.slurm.cli import SlurmCLI

from .test_reconciler_kube import Recorder, api, fleet, reconciler  # noqa: F401  (api is a fixture)

pytestmark = pytest.mark.integration


def make_gpu_a_nodes(kube_cluster, spec):
    core = client.CoreV1Api(kube_cluster.api_client())
    existing = {n.metadata.name for n in core.list_node().items}
    for node in local_nodes.fleet_nodes(spec)[1:]:
        if node["metadata"]["name"] not in existing:
            core.create_node(node)
    for n in spec.pools[0].node_names() + spec.pools[0].spare_names():
        kube_cluster.wait_node_ready(n)


def passes(rec, n, until=None):
    for _ in range(n):
        rec.cache.sync()
        rec.runtime.run_pass()
        if until and until():
            return
        time.sleep(0.05)


def test_slurm_down_is_retried_then_failed_with_reason(kube_cluster, api, slurm_fresh):
    # Pool "gpu-a": Kubernetes nodes gpu-a-0, gpu-a-1 match the Slurm fixture's node names.
    spec = fleet("gpu-a", nodes=2, spares=1)
    make_gpu_a_nodes(kube_cluster, spec)
    channel = Recorder()
    rec = reconciler(api, spec, channel)
    rec.runtime.slurm = SlurmCLI(env=slurm_fresh.env(), timeout=3)
    rec.runtime.max_retries = 3
    slurm_fresh.stop_daemon("slurmctld")
    try:
        Kube(api).set_condition("gpu-a-0", "GpuHealthy", "False", "Xid79", "off the bus")
        records = lambda: [r for r in rec.runtime.store.list() if r.node == "gpu-a-0"]  # noqa: E731
        passes(rec, 20, until=lambda: any(r.phase.terminal for r in records()))
        (r,) = records()
        assert r.phase is Phase.FAILED
        assert "gave up after 3 attempts" in r.reason and "slurm" in r.reason.lower()
        assert [m.event for m in channel.messages].count("failed") == 1
        assert [m.severity for m in channel.messages if m.event == "failed"] == ["critical"]
        # the node stays cordoned: a failed remediation never hands a broken GPU back
        assert client.CoreV1Api(api).read_node("gpu-a-0").spec.unschedulable
    finally:
        slurm_fresh.up()
        # repaired by a person: its fault no longer counts towards the pool's storm brake
        Kube(api).set_condition("gpu-a-0", "GpuHealthy", "True", "Repaired", "replaced by hand")


def test_slurm_back_in_time_and_the_remediation_goes_on(kube_cluster, api, slurm_fresh):
    spec = fleet("gpu-a", nodes=2, spares=1)
    make_gpu_a_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    rec.runtime.slurm = SlurmCLI(env=slurm_fresh.env(), timeout=3)
    slurm_fresh.stop_daemon("slurmctld")
    Kube(api).set_condition("gpu-a-1", "GpuHealthy", "False", "Xid94", "contained ECC")
    records = lambda: [r for r in rec.runtime.store.list() if r.node == "gpu-a-1"]  # noqa: E731
    passes(rec, 2)
    (r,) = records()
    assert r.phase is Phase.SLURM_DRAINING and r.retries >= 1  # waiting, retrying
    slurm_fresh.up()
    passes(rec, 30, until=lambda: records()[0].phase.terminal)
    (r,) = records()
    assert r.phase is Phase.SUCCEEDED and r.replacement == "gpu-a-spare-0"
    node = slurm_fresh.scontrol("show", "node", "gpu-a-1")
    assert "DOWN" in node and "gpufleet: XID 94" in node
    assert client.CoreV1Api(api).read_node("gpu-a-spare-0").metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE
