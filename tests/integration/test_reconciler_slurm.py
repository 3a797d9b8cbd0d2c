"""The reconciler against a real API server (kwok nodes) and a real Slurm 26.05 reached through
slurmrestd with a JWT, named as Slinky names it: Slurm nodes are the NodeSet pods' hostnames
(gpu-a-0, ...), the Kubernetes nodes are kgpu-0, ...; nothing assumes the two are equal.

Here the test plays the part of Slinky's operator (it places the NodeSet pods); the local
environment does the same with `localenv.slinky_standin`."""
from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels
from gpufleet.waiting import wait_for
from localenv.slinky_standin import NodeSetDef, declare_nodesets, nodeset_owner
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core.phases import Phase

from tests.fixtures.slurm_cluster import RECONCILER_USER, fail_epilog
from tests.fixtures.reconciler_kube import Recorder, fleet, make_nodes, reconciler, records_for, run_until, step

pytestmark = pytest.mark.integration
POOL = "kgpu"  # Kubernetes: kgpu-0, kgpu-1, kgpu-spare-0; Slurm: gpu-a-0, gpu-a-1, gpu-a-2 (the fixture's)


SLURM_NS = "default"  # the spec's Slurm namespace (set below): NodeSet pods count there only


def nodeset_pod(api, slurm_name: str, node: str) -> dict:
    """A pod of the pool's NodeSet (an object on the API server, that the pod's controller reference names)."""
    (nodeset,) = declare_nodesets(api, SLURM_NS, [NodeSetDef(POOL, 0, {})])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": slurm_name, "namespace": SLURM_NS, "ownerReferences": [nodeset_owner(nodeset)],
                         "labels": {labels.SLINKY_POD_HOSTNAME: slurm_name, "app.kubernetes.io/name": "slurmd"}},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "slurmd", "image": "ghcr.io/slinkyproject/slurmd:26.05"}]}}


def place(api, slurm_name: str, node: str) -> None:
    core = client.CoreV1Api(api)
    name = slurm_name  # a NodeSet pod is named as its Slurm node: <nodeset>-<ordinal>
    try:
        core.delete_namespaced_pod(name, SLURM_NS, grace_period_seconds=0)
    except ApiException as e:
        assert e.status == 404
    wait_for(f"{name} to be gone", lambda: name not in {p.metadata.name for p in core.list_namespaced_pod(SLURM_NS).items},
             timeout=10)
    core.create_namespaced_pod(SLURM_NS, nodeset_pod(api, slurm_name, node))


@pytest.fixture
def fleet_with_slurm(kube_cluster, api, slurm_fresh, slurm_rest):
    spec = fleet(POOL, nodes=2, spares=1, grace_period_seconds=5)
    spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"namespace": SLURM_NS})})
    core = client.CoreV1Api(api)
    if not any(n.metadata.name == f"{POOL}-0" for n in core.list_node().items):
        make_nodes(kube_cluster, spec)
    for n in (f"{POOL}-0", f"{POOL}-1", f"{POOL}-spare-0"):  # undo what an earlier test did
        core.patch_node(n, {"spec": {"unschedulable": None, "taints": None}, "metadata": {"labels": {
            labels.ROLE: labels.ROLE_SPARE if "spare" in n else labels.ROLE_ACTIVE},
            # what an earlier test's heal, repair or person's drain left on the node (returned to the spares, the
            # provider takes the first three off too): a node that names a heal is no telemetry's to judge, and a
            # person's drain noted here would be put back on its Slurm node
            "annotations": {labels.REMEDIATION: None, labels.REPAIR_REQUEST: None, labels.PROMOTED_FOR: None,
                            labels.PERSON_HOLDS: None}}})
        Kube(api).set_condition(n, "GpuHealthy", "True", "Healthy", "ok")
    for r in client.CustomObjectsApi(api).list_cluster_custom_object("gpufleet.io", "v1alpha1", "remediations")["items"]:
        if r["spec"]["pool"] == POOL:
            client.CustomObjectsApi(api).delete_cluster_custom_object("gpufleet.io", "v1alpha1", "remediations",
                                                                    r["metadata"]["name"])
    core.patch_node(f"{POOL}-spare-0", {"spec": {"taints": [{"key": labels.SPARE_TAINT, "value": "true",
                                                           "effect": "NoSchedule"}]}})
    # Slurm node gpu-a-2 is the spare's slurmd (drained "gpufleet: spare" until promoted)
    for slurm_name, node in (("gpu-a-0", f"{POOL}-0"), ("gpu-a-1", f"{POOL}-1"), ("gpu-a-2", f"{POOL}-spare-0")):
        place(api, slurm_name, node)
    channel = Recorder()
    return spec, reconciler(api, spec, channel, slurm_rest), channel, slurm_fresh, slurm_rest


def moved_by_the_operator(api, rec, node: str, slurm_name: str) -> None:
    """What Slinky's operator does once the NodeSet pod was evicted from the faulted node: it makes the pod
    again (same hostname, so the same Slurm node), and the scheduler places it on the promoted spare. The
    remediation succeeds only once that Slurm node is back there (issue 23)."""
    run_until(rec, lambda: [r for r in records_for(rec, node) if r.phase is Phase.RESUMING], timeout=90)
    place(api, slurm_name, f"{POOL}-spare-0")


def job_on(slurm, node: str, tmp_path, slow_checkpoint: bool = False) -> int:
    """A job that saves and exits on SIGTERM (or, slow_checkpoint, goes on for its whole grace period).

    It counts as running once its script has set its trap and said so: squeue says RUNNING as soon as
    slurmctld allocates, and a SIGTERM before the trap would kill it unsaved. Its output is appended to,
    so a requeued run does not truncate what the first one wrote."""
    script = tmp_path / "job.sh"
    on_term = "echo saving" if slow_checkpoint else "echo saved; exit 0"
    script.write_text(f"#!/bin/bash\ntrap '{on_term}' TERM\necho started\nwhile true; do sleep 0.2; done\n")
    script.chmod(0o755)
    jid = slurm.sbatch("--requeue", "--open-mode=append", "-w", node, "-o", str(tmp_path / "out-%j"), str(script))
    out = tmp_path / f"out-{jid}"
    wait_for(f"job {jid} to run and set its trap", lambda: out.exists() and "started" in out.read_text(), timeout=30)
    return jid


def slurm_node(slurm, name: str) -> str:
    return slurm.scontrol("show", "node", name)


def test_heals_with_slurm_names_that_are_not_kubernetes_names(fleet_with_slurm, api, tmp_path):
    spec, rec, channel, slurm, rest = fleet_with_slurm
    jid = job_on(slurm, "gpu-a-0", tmp_path)
    Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase is Phase.RESUMING], timeout=90)
    (r,) = records_for(rec, f"{POOL}-0")
    bad = slurm_node(slurm, "gpu-a-0")
    assert "DRAIN" in bad and f"gpufleet: XID 79 (GPU has fallen off the bus) [{r.name}]" in bad
    for _ in range(5):  # its pod is placed nowhere yet: not a success
        step(rec)
    assert records_for(rec, f"{POOL}-0")[0].phase is Phase.RESUMING
    moved_by_the_operator(api, rec, f"{POOL}-0", "gpu-a-0")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase.terminal], timeout=90)
    assert r.phase is Phase.SUCCEEDED, r.reason
    assert r.slurm_nodes == ("gpu-a-0",) and r.jobs == (jid,) and r.replacement == f"{POOL}-spare-0"
    assert "DRAIN" not in slurm_node(slurm, "gpu-a-0")  # back, on the replacement
    spare = slurm_node(slurm, "gpu-a-2")
    assert "DRAIN" not in spare  # the replacement's Slurm node was resumed: it takes jobs
    saved = (tmp_path / f"out-{jid}").read_text()
    assert "saved" in saved  # the job got SIGTERM and its grace period
    state = slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T %r"]).stdout
    assert state.split()[0] in ("PENDING", "RUNNING")  # requeued, not lost
    assert [m.event for m in channel.messages].count("succeeded") == 1


def test_a_drain_and_reset_xid_drains_the_busy_node_lets_its_job_finish_and_heals_the_node_after(
        fleet_with_slurm, api, tmp_path):
    """NVIDIA's DRAIN_AND_RESET (Xid 48 with 63/64), as the node agent writes it: the job's Slurm node is drained,
    the job is not signalled and runs on; once it ended, the heal starts and its record says why it waited."""
    spec, rec, channel, slurm, rest = fleet_with_slurm
    jid = job_on(slurm, "gpu-a-0", tmp_path)
    Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid48",
                            "[action=reset-gpu pci=0000:3b:00 when=job-boundary] XID 48 (DBE ECC error): DBE (double "
                            "bit error) ECC error detected. [NVIDIA: WORKFLOW_XID_48: with 63/64, DRAIN_AND_RESET]")
    run_until(rec, lambda: "DRAIN" in slurm_node(slurm, "gpu-a-0"), timeout=30)
    assert f"[xid48 {POOL}-0]" in slurm_node(slurm, "gpu-a-0")
    for _ in range(5):
        step(rec)
    assert not records_for(rec, f"{POOL}-0")  # no heal while the job runs
    assert slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T"]).stdout.split() == ["RUNNING"]
    assert "saved" not in (tmp_path / f"out-{jid}").read_text()  # never signalled
    noted = run_until(rec, lambda: (j := rest.job(jid)) is not None and ": drained at its end: " in (
        j.admin_comment or "") and j.admin_comment, timeout=30)
    assert "on gpu-a-0: " in noted and "NVIDIA: drain, reset after the job" in noted, noted  # what `why` tells its owner
    slurm.run(["scancel", str(jid)], timeout=15)  # the job ends
    (r,) = run_until(rec, lambda: records_for(rec, f"{POOL}-0"), timeout=60)
    assert r.jobs == () and "drained at its job's boundary" in r.reason and "DRAIN_AND_RESET" in r.reason, r.reason


def test_a_persons_drain_is_never_changed_nor_its_spare_promoted(fleet_with_slurm, api):
    spec, rec, channel, slurm, rest = fleet_with_slurm
    slurm.set_node_state("gpu-a-2", "DRAIN", "hardware check by ops")  # the spare's Slurm node
    slurm.set_node_state("gpu-a-1", "DRAIN", "cable reseat by ops")  # and the node that faults
    Kube(api).set_condition(f"{POOL}-1", "GpuHealthy", "False", "Xid48", "DBE")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-1")
                                   if r.phase in (Phase.WAITING_FOR_SPARE,) or r.phase.terminal], timeout=60)
    assert r.phase is Phase.WAITING_FOR_SPARE  # the only spare is held by a person: never promoted
    assert r.kept_drains == ("gpu-a-1",)
    assert "cable reseat by ops" in slurm_node(slurm, "gpu-a-1")
    assert "hardware check by ops" in slurm_node(slurm, "gpu-a-2")
    assert client.CoreV1Api(api).read_node(f"{POOL}-spare-0").metadata.labels[labels.ROLE] == labels.ROLE_SPARE


def test_slurms_own_drain_on_a_faulted_node_is_drained_over_not_kept_as_a_persons(fleet_with_slurm, api):
    """slurmctld drained gpu-a-1 itself (its Epilog failed: "Epilog error", recorded as the SlurmUser), then the
    GPU under it faults. Any reason without gpufleet's or the operator's prefix used to be a person's: kept,
    carried to the faulted machine (which then never returned to the spares) and paged. Who set it says it is
    Slurm's own: the heal drains over it with gpufleet's reason, keeps nothing, carries nothing, pages no one
    about a person's drain."""
    spec, rec, channel, slurm, rest = fleet_with_slurm
    core = client.CoreV1Api(api)
    core.patch_node(f"{POOL}-1", {"metadata": {"annotations": {labels.CARRIED_DRAIN: None}}})  # an earlier test's
    fail_epilog(slurm, "gpu-a-1")
    slurm.sbatch("-w", "gpu-a-1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "true")
    wait_for("slurmctld to drain gpu-a-1", lambda: "Reason=Epilog error [slurm@" in slurm_node(slurm, "gpu-a-1"),
             timeout=60, interval=0.5, explain=lambda: slurm_node(slurm, "gpu-a-1"))
    Kube(api).set_condition(f"{POOL}-1", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-1")
                                   if r.phase not in (Phase.DETECTED, Phase.SLURM_DRAINING)], timeout=60)
    assert r.kept_drains == ()
    assert f"[{r.name}] [{RECONCILER_USER}@" in slurm_node(slurm, "gpu-a-1")  # gpufleet's reason, by its own user
    assert "person-drain-carried" not in [m.event for m in channel.messages]
    assert labels.CARRIED_DRAIN not in (core.read_node(f"{POOL}-1").metadata.annotations or {})


def test_slurmrestd_down_for_a_while_is_outlived_and_the_remediation_goes_on(fleet_with_slurm, api, tmp_path):
    spec, rec, channel, slurm, rest = fleet_with_slurm
    # A grace that outlasts the outage below (slurmrestd stopped, two failed attempts 0.5 s and 1 s apart, started
    # again), so the remediation is still checkpointing while Slurm is away.
    spec = spec.model_copy(update={"healing": spec.healing.model_copy(update={"grace_period_seconds": 20})})
    rec = reconciler(api, spec, channel, rest)
    job_on(slurm, "gpu-a-1", tmp_path, slow_checkpoint=True)  # checkpointing for its whole grace period
    Kube(api).set_condition(f"{POOL}-1", "GpuHealthy", "False", "Xid48", "DBE")  # replace (94 is restart-app since issue 21)
    run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-1") if r.phase is Phase.CHECKPOINTING])
    slurm.stop_daemon("slurmrestd")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-1") if r.retries >= 2], timeout=30)
    assert r.phase is Phase.CHECKPOINTING and "Slurm" in r.last_error
    slurm.up()
    moved_by_the_operator(api, rec, f"{POOL}-1", "gpu-a-1")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-1") if r.phase.terminal], timeout=90)
    assert r.phase is Phase.SUCCEEDED and "failed" not in [m.event for m in channel.messages]


def test_a_long_outage_fails_with_the_reason_and_keeps_the_node_contained(fleet_with_slurm, api):
    spec, rec, channel, slurm, rest = fleet_with_slurm
    spec = spec.model_copy(update={"healing": spec.healing.model_copy(update={"retry_budget_seconds": 10})})
    rec = reconciler(api, spec, channel, rest)
    slurm.stop_daemon("slurmrestd")
    try:
        Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid79", "off the bus")
        (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase.terminal], timeout=60)
        assert r.phase is Phase.FAILED and "Slurm" in r.reason and "gave up after" in r.reason
        assert [m.severity for m in channel.messages if m.event == "failed"] == ["critical"]
        assert client.CoreV1Api(api).read_node(f"{POOL}-0").spec.unschedulable  # never handed back broken
    finally:
        slurm.up()


def test_a_pod_in_the_slurm_namespace_that_no_nodeset_controls_names_no_slurm_node(fleet_with_slurm, api):
    """A pod in the Slurm namespace carrying the pod-hostname label of another node's Slurm node (gpu-a-1, on
    kgpu-1), but no controller reference to a NodeSet (slurm-operator 1.2.1 gives every NodeSet pod one:
    internal/controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod): a fault on the node it sits on drains
    only that node's own Slurm node; gpu-a-1 is touched by nothing."""
    spec, rec, channel, slurm, rest = fleet_with_slurm
    forged = nodeset_pod(api, "forged-gpu-a-1", f"{POOL}-0")
    forged["metadata"]["labels"][labels.SLINKY_POD_HOSTNAME] = "gpu-a-1"
    del forged["metadata"]["ownerReferences"]
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(SLURM_NS, forged)
    try:
        before = slurm_node(slurm, "gpu-a-1")
        Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
        (r,) = run_until(rec, lambda: [r for r in records_for(rec, f"{POOL}-0") if r.phase is Phase.RESUMING],
                         timeout=90)
        assert r.slurm_nodes == ("gpu-a-0",)
        assert "DRAIN" in slurm_node(slurm, "gpu-a-0")
        after = slurm_node(slurm, "gpu-a-1")
        assert "DRAIN" not in after and "gpufleet" not in after and "DRAIN" not in before
    finally:
        try:
            core.delete_namespaced_pod("forged-gpu-a-1", SLURM_NS, grace_period_seconds=0)
        except ApiException as e:
            assert e.status == 404  # evicted with the node's other pods
