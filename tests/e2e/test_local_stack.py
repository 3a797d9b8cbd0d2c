"""End to end on the `local` stack: the real Pulumi engine, a real API server with kwok nodes, real
Slurm, the real reconciler as a host process. The tests run in order and share one environment."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels, load_stack_file
from demos import demo
from localenv.env import LocalEnv
from gpufleet.stack import Stack
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.adapters.records import KubeRemediationStore

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local(tmp_path_factory, kube_bin_dir, slurm_root, pulumi_bin_dir):
    root = tmp_path_factory.mktemp("e2e")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUFLEET_LOCAL_DIR", str(root))
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    env = LocalEnv(spec, root=root, bin_dir=kube_bin_dir, ports=LocalEnv.free_ports(spec), progress=print)
    try:  # down also when up or the stack fails half-way: nothing left running for the tests after these
        env.up()
        stack = env.stack()
        stack.ensure()
        stack.ensure_secrets(spec.secret_keys())
        yield spec, env, stack
    finally:
        env.down()
        mp.undo()


def preview_changes(stack: Stack) -> dict:
    out = stack.preview("--json", capture=True).stdout
    return json.loads(out).get("changeSummary", {})


def test_preview_then_up_then_nothing_to_do(local):
    spec, env, stack = local
    assert preview_changes(stack).get("create", 0) > 30
    stack.up()
    outputs = stack.outputs()
    assert outputs["slinky_operator"] == "crds-only" and outputs["reconciler_namespace"] == "gpufleet-system"
    assert {p["name"] for p in outputs["pools"]} == {"h100", "l40s"}
    api = env.kube.api_client()
    nodesets = client.CustomObjectsApi(api).list_namespaced_custom_object("slinky.slurm.net", "v1beta1", "slurm",
                                                                          "nodesets")["items"]
    assert {n["metadata"]["name"] for n in nodesets} == {"h100", "l40s"}
    assert client.CoreV1Api(api).read_namespaced_config_map("gpufleet-policy", "gpufleet-system").data["fleet.json"]
    stack.run("up", "--yes", "--expect-no-changes")  # a second up has nothing to do


def test_xid79_heals_and_the_job_resumes_from_its_checkpoint(local):
    spec, env, stack = local
    tl = demo.run_demo(spec, env, stack, fresh=False, timeout=300, out=print)
    assert tl.outcome == "Succeeded" and tl.replacement == "kwok-h100-spare-0"
    assert tl.resumed_step and tl.resumed_step >= 60  # resumed from a checkpoint, not from zero
    assert [p for p, _ in tl.phases] == ["Detected", "SlurmDraining", "Checkpointing", "Requeued", "Evicting",
                                         "Replacing", "Resuming", "Succeeded"]
    run_dir = Path(spec.checkpoint_storage.host_path) / "demo-run"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "checkpoint-on-sigterm" for e in events)  # SIGTERM reached the job in its grace period
    # the swap does not make the stack want to change anything
    stack.run("up", "--yes", "--expect-no-changes")


def _records(env, node):
    return [r for r in KubeRemediationStore(env.kube.api_client()).list() if r.node == node]


def test_reconciler_killed_mid_remediation_finishes_without_repeating(local):
    spec, env, stack = local
    kube = Kube(env.kube.api_client())
    # the unlent spares (the pool lends its spare beyond the floor; a fault takes an unlent one first)
    spare_before = sorted(n["metadata"]["name"] for n in kube.list_nodes()[0]
                          if (n["metadata"].get("labels") or {}).get(labels.ROLE) == labels.ROLE_SPARE
                          and n["metadata"]["labels"].get(labels.NODE_POOL) == "h100"
                          and labels.LENT not in n["metadata"]["labels"])
    assert spare_before, "the pool's spare was refilled after the first remediation"
    # an active node of the pool (which one the demo's fault left active depends on where its pods landed)
    victim = sorted(n["metadata"]["name"] for n in kube.list_nodes()[0]
                    if (n["metadata"].get("labels") or {}).get(labels.ROLE) == labels.ROLE_ACTIVE
                    and n["metadata"]["labels"].get(labels.NODE_POOL) == "h100")[0]
    kube.set_condition(victim, "GpuHealthy", "False", "Xid48", "Double bit ECC error")
    wait_for("a phase past Detected", lambda: [r for r in _records(env, victim) if r.phase not in (Phase.DETECTED,)],
             120)
    env.stop_reconciler(signal.SIGKILL)  # killed mid-remediation
    (mid,) = [r for r in _records(env, victim) if r.xid == 48]
    assert not mid.phase.terminal
    # A second fault in this two-node pool within the brake's window is a storm (2 of 2): contained and
    # held. Restart with the brake opened, so the held record goes on from where it was.
    policy = env.root / "policy.json"
    doc = json.loads(policy.read_text())
    doc["healing"]["max_unhealthy_fraction"] = 1.0
    policy.write_text(json.dumps(doc))
    env.start_reconciler(policy)
    (done,) = wait_for("the remediation to end",
                       lambda: [r for r in _records(env, victim) if r.xid == 48 and r.phase.terminal], 120)
    assert done.phase is Phase.SUCCEEDED and done.replacement == spare_before[0]
    phases = [p for p, _ in done.phase_times]
    assert len(phases) == len(set(phases))  # no phase done twice
    node = kube.get_node(done.replacement)
    assert node["metadata"]["labels"][labels.ROLE] == labels.ROLE_ACTIVE


def test_opt_out_label_means_nothing_is_replaced(local):
    spec, env, stack = local
    core = client.CoreV1Api(env.kube.api_client())
    # The L40S pool lends its node while Slurm leaves it idle: a job on it takes it back (and keeps it), so
    # its NodeSet pod runs there when the fault comes.
    job = env.slurm.sbatch("--partition=infer", "--nodes=1", "--requeue", "--output=/dev/null", "--wrap", "sleep 900")
    wait_for("a job running on the L40S node",
             lambda: "RUNNING" in env.slurm.run(["squeue", "-h", "-j", str(job), "-o", "%T"]).stdout, 120)
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "debug-session", "labels": {labels.DEFAULT_OPT_OUT: "true"},
                     "annotations": {labels.OPT_OUT_REASON: "profiling a kernel", labels.OPT_OUT_EXPIRES: "2099-01-01"}},
        "spec": {"nodeName": "kwok-l40s-0", "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "registry.example/debug:1.0"}]}})
    Kube(env.kube.api_client()).set_condition("kwok-l40s-0", "GpuHealthy", "False", "Xid79", "off the bus")
    (r,) = wait_for("OptedOut", lambda: [r for r in _records(env, "kwok-l40s-0") if r.phase is Phase.OPTED_OUT], 120)
    assert "default/debug-session" in r.reason and "drained in Slurm" in r.reason
    assert r.slurm_nodes == ("l40s-0",)  # the NodeSet pod's hostname, not the Kubernetes node's name
    time.sleep(2)
    assert core.read_node("kwok-l40s-spare-0").metadata.labels[labels.ROLE] == labels.ROLE_SPARE
    assert core.read_node("kwok-l40s-0").spec.unschedulable
    core.read_namespaced_pod("debug-session", "default")  # not evicted
    # DRAIN keeps jobs off and nothing undoes it (DOWN would be undone by Slurm's ReturnToService), and
    # its reason says gpufleet (through the operator's cordon drain, or gpufleet's own)
    state = env.slurm.scontrol("show", "node", "l40s-0")
    assert "DRAIN" in state and "gpufleet:" in state


def test_destroy_removes_the_stack(local):
    spec, env, stack = local
    env.stop_reconciler()
    stack.destroy()
    assert stack.outputs() == {}
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(env.kube.api_client()).read_namespaced_config_map("gpufleet-policy", "gpufleet-system")
    assert e.value.status == 404
