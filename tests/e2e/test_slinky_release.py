"""End to end on the local stack, with the stand-in of slurm-operator 1.2.1 (issue 20's tests): a loan
taken back ends with the job running (the stack's ReturnToService: the operator sets a pod back on
its own node no IDLE), a person's drain on a node that faults goes with the faulted machine, and an
eviction meets the busy-pod PodDisruptionBudget and still heals, after a delay that is measured.
(The heal itself: tests/e2e/test_local_stack.py.) The tests share one environment and run in order."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from demos import demo
from demos.lending_demo import job_running
from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.waiting import wait_for
from localenv.env import LocalEnv
from localenv.slinky_standin import BUSY, POD_PROTECT_LABEL, TERMINATING_REASON
from gpufleet.reconciler.adapters.records import KubeRemediationStore
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI
from gpufleet.reconciler.core.phases import Phase

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory, kube_bin_dir, slurm_root, pulumi_bin_dir):
    root = tmp_path_factory.mktemp("e2e-slinky")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUFLEET_LOCAL_DIR", str(root))
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    env = LocalEnv(spec, root=root, bin_dir=kube_bin_dir, ports=LocalEnv.free_ports(spec), progress=print)
    try:
        env.up()
        stack = env.stack()  # the local environment's backend and stack configuration
        kube, _alive, _where = demo.bring_up(spec, env, stack, total=3, fresh=False, grace=5, out=print)
        yield spec, env, kube, SlurmCLI(env=env.slurm.env(), timeout=20)
    finally:
        env.down()
        mp.undo()


def _remediations(env, node):
    return [r for r in KubeRemediationStore(env.kube.api_client()).list() if r.node == node]


def _pod_of(kube, slurm_name: str):
    pods = kube.core.list_namespaced_pod("slurm", label_selector=f"{labels.SLINKY_POD_HOSTNAME}={slurm_name}").items
    return next((p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp), None)


def test_the_local_slurm_runs_the_operators_configuration(world):
    spec, env, kube, cli = world
    conf = env.slurm.conf_path.read_text()
    assert "ReturnToService=2" in conf and "NodeSet=h100 Feature=h100" in conf
    assert conf.count("NodeSet=h100 ") == 1 and "PartitionName=h100" not in conf  # the operator's partition off
    assert (env.slurm.etc_dir / "topology.yaml").exists()
    assert _pod_of(kube, "h100-0").metadata.name == "h100-0"


def test_a_loan_taken_back_ends_with_the_job_running(world):
    """The idle L40S node is lent; a job for the pool takes it back; its NodeSet pod comes back to the
    same node (the operator sets no IDLE: same pod info) and the preStop's DOWN ends when slurmd
    registers again, because the stack declares ReturnToService=2; the job runs there."""
    spec, env, kube, cli = world
    pool = spec.pool("l40s")
    node = "kwok-l40s-0"
    wait_for("the idle L40S node lent", lambda: (kube.get_node(node)["metadata"].get("labels") or {}).get(
        labels.LENT) == labels.LENT_IDLE, pool.lending.idle_after_seconds + 120, interval=1)
    wait_for("its NodeSet pod gone (the lending taint)", lambda: _pod_of(kube, "l40s-0") is None, 60, interval=0.5)
    # Its preStop set it DOWN with the operator's reason; under ReturnToService=2 a ping answered before slurmd
    # exits may return it (Slurm 26.05 node_mgr.c node_did_resp), still drained for the loan: no job lands.
    wait_for("the preStop's DOWN", lambda: (n := cli.node("l40s-0")) and n.reason in (TERMINATING_REASON,) or
             "DOWN" in cli.node("l40s-0").states, 30, interval=0.5)
    assert cli.node("l40s-0").drained_or_down
    job = env.slurm.sbatch("--partition=infer", "--nodes=1", "--wrap", "sleep 300")
    t0 = time.monotonic()
    nodes = wait_for("the job running on the node taken back", lambda: job_running(env, job), 180, interval=1)
    print(f"loan taken back: job {job} RUNNING on {nodes} {time.monotonic() - t0:.1f}s after sbatch")
    assert nodes == "l40s-0" and _pod_of(kube, "l40s-0").spec.node_name == node  # back on the same node
    env.slurm.run(["scancel", str(job)], timeout=15)


def test_a_persons_drain_on_a_node_that_faults_goes_with_the_machine(world):
    spec, env, kube, cli = world
    slurm_name = "h100-1"
    machine = _pod_of(kube, slurm_name).spec.node_name
    cli.drain(slurm_name, "ops: fan noise, check before use")
    kube.set_condition(machine, spec.healing.condition_types[0], "False", "Xid79", "GPU has fallen off the bus")
    (done,) = wait_for("the remediation to end",
                       lambda: [r for r in _remediations(env, machine) if r.phase.terminal] or None, 300, interval=1)
    assert done.phase is Phase.SUCCEEDED and done.kept_drains == (slurm_name,)
    carried = json.loads(kube.get_node(machine)["metadata"]["annotations"][labels.CARRIED_DRAIN])
    assert carried == {slurm_name: "ops: fan noise, check before use"}
    n = wait_for("the Slurm node usable on the replacement", lambda: (n := cli.node(slurm_name)) and not n.drained_or_down and n,
                 60, interval=0.5)
    assert json.loads(n.comment)["node"] == done.replacement
    # A passing health check does not return a machine that carries a person's drain to the spares.
    kube.set_condition(machine, spec.healing.condition_types[0], "True", "HealthCheckPassed", "all GPUs pass")
    time.sleep(5)  # nothing to await: the assertion is that nothing happens (several reconciles)
    assert kube.get_node(machine)["metadata"]["labels"][labels.ROLE] == labels.ROLE_QUARANTINED


def test_an_eviction_meets_the_busy_pod_pdb_and_still_heals(world):
    """The faulted node's NodeSet pod is labelled pod-protect while its job runs; after the requeue the
    operator relabels it only at its next sync: the reconciler's evictions get 429 until then. The test
    brings each of those syncs on with an update of the pod (`_touch`) instead of waiting up to 30 s for the
    operator's resync; the resync itself is tests/integration/test_slinky_standin.py's."""
    spec, env, kube, cli = world
    # The second fault of this two-node pool within the window would be a storm: open the brake.
    env.stop_reconciler()
    policy = env.root / "policy.json"
    doc = json.loads(policy.read_text())
    doc["healing"]["max_unhealthy_fraction"] = 1.0
    policy.write_text(json.dumps(doc))
    env.start_reconciler(policy)
    slurm_name = "h100-0"
    machine = _pod_of(kube, slurm_name).spec.node_name
    # A job that uses its whole grace period (it ignores SIGTERM, as one still writing a checkpoint would).
    job = env.slurm.sbatch("--partition=train", f"--nodelist={slurm_name}", "--requeue", "--wrap",
                           "trap '' TERM; sleep 600")
    wait_for("the job running", lambda: job_running(env, job), 60, interval=0.5)
    _touch(kube, slurm_name)  # the operator's sync now: the busy node's pod gets pod-protect
    wait_for("the pod protected", lambda: (_pod_of(kube, slurm_name).metadata.labels or {}).get(POD_PROTECT_LABEL)
             == "true", 60, interval=0.5)
    kube.set_condition(machine, spec.healing.condition_types[0], "False", "Xid79", "GPU has fallen off the bus")
    protected_while_evicting = []
    touched = []

    def done():
        recs = _remediations(env, machine)
        live = [r for r in recs if not r.phase.terminal]
        if live and live[0].phase is Phase.EVICTING:
            pod = _pod_of(kube, slurm_name)
            protected = pod is not None and (pod.metadata.labels or {}).get(POD_PROTECT_LABEL) == "true"
            protected_while_evicting.append(protected)
            # Refused while protected: once the job has left the Slurm node, the operator's next sync relabels the
            # pod; an update of the pod brings that sync on (else its resync does, at most 30 s later).
            if protected and not touched and not cli.node(slurm_name).states & BUSY:
                touched.append(_touch(kube, slurm_name))
        return [r for r in recs if r.phase.terminal and r.xid == 79] or None

    (rec,) = wait_for("the heal", done, 300, interval=0.2)
    assert rec.phase is Phase.SUCCEEDED
    times = dict(rec.phase_times)
    evicting = (times["Replacing"] - times["Evicting"]).total_seconds()
    print(f"busy-pod PDB: Evicting took {evicting:.1f}s; pod protected in {sum(protected_while_evicting)} of "
          f"{len(protected_while_evicting)} looks while evicting"
          f"{'; its relabelling sync brought on by a pod update' if touched else '; relabelled at the resync'}")
    assert any(protected_while_evicting), "the PDB never protected the pod while it was evicted"
    assert evicting <= spec.healing.drain_timeout_seconds + 5  # bounded by the drain timeout
    wait_for("the job running again", lambda: job_running(env, job), 120, interval=1)
    env.slurm.run(["scancel", str(job)], timeout=15)


def _touch(kube, slurm_name: str) -> float:
    """An update of the NodeSet pod (an annotation of the test's): upstream, any new resourceVersion of a pod the
    NodeSet owns queues the NodeSet (internal/controller/nodeset/eventhandler/eventhandler_pod.go updatePod), so
    its sync runs now instead of at its resync 30 s after the last (nodeset_sync.go); the stand-in does the same."""
    pod = _pod_of(kube, slurm_name)
    kube.core.patch_namespaced_pod(pod.metadata.name, "slurm",
                                   {"metadata": {"annotations": {"e2e.gpufleet.io/touched": str(time.time())}}})
    return time.monotonic()


def test_the_pdb_the_stand_in_declares_is_the_operators(world):
    _, env, kube, _ = world
    pdb = client.PolicyV1Api(kube.api).read_namespaced_pod_disruption_budget("slurm-workers-pdb-slurm", "slurm")
    assert pdb.spec.max_unavailable == 0
