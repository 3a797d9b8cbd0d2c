"""The main job, end to end on the local environment: bring the fleet up with `pulumi up`,
run a training job under Slurm, break a GPU under it, and show the fleet heal: the job resumes on a spare,
then the faulty node is repaired (the reset or reboot its fault needs, done by the local GPU hardware
stand-in), health-checked and returned to the spares (issue 25: replace first, repair after).

Each step prints a progress line; the end is a timeline and a check that no training step
was lost (the resumed job's final weights equal an uninterrupted run's).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import Kind, describe
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, reason_for
from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.repair import RESET_GPU

from localenv import train
from localenv.gpu_hardware_standin import REBOOT_FIXES, RESET_FIXES
from localenv.env import LocalEnv
from gpufleet.stack import Stack
from gpufleet.waiting import wait_for
from gpufleet.reconciler.core.repair_phases import RepairPhase

STEPS, EVERY, DELAY = 300, 10, 0.05


def say(msg: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S')} {msg}", flush=True)


@dataclass
class Timeline:
    fault_at: float
    phases: list[tuple[str, float]] = field(default_factory=list)
    healthy_at: float | None = None
    job_running_again_at: float | None = None
    resumed_step: int | None = None
    resumed_on: str | None = None
    replacement: str | None = None
    node: str = ""
    outcome: str = ""

    def render(self) -> str:
        lines = ["", "Timeline (seconds after the fault):", f"  {'phase':<18}{'entered':>9}{'took':>8}"]
        for i, (phase, at) in enumerate(self.phases):
            took = (self.phases[i + 1][1] - at) if i + 1 < len(self.phases) else None
            lines.append(f"  {phase:<18}{at - self.fault_at:>8.1f}s{'' if took is None else f'{took:>7.1f}s'}")
        if self.healthy_at:
            lines.append(f"  fault -> healthy replacement taking jobs: {self.healthy_at - self.fault_at:.1f}s "
                         f"({self.node} -> {self.replacement})")
        if self.job_running_again_at:
            lines.append(f"  fault -> job running again:               {self.job_running_again_at - self.fault_at:.1f}s "
                         f"(resumed at step {self.resumed_step} on {self.resumed_on})")
        return "\n".join(lines)


def bring_up(spec: FleetSpec, env: LocalEnv, stack: Stack, *, total: int, fresh: bool = True,
             grace: int | None = None, out: Callable[[str], None] = say):
    """Steps 1-3 of both demos: the local environment, `pulumi up`, the reconciler running. Returns the
    Kube adapter, a liveness check of the reconciler, and where its log is."""
    from gpufleet.reconciler.adapters.kube import Kube

    from localenv.pods import reconciler_pods, wait_reconciler_pods_ready

    out(f"[1/{total}] local environment: control plane, {sum(p.nodes + p.spares for p in spec.pools)} fake GPU "
        f"nodes, Slurm")
    if fresh:
        reset(env, stack)
    env.up()

    out(f"[2/{total}] pulumi up -s {stack.name}")
    stack.ensure()
    stack.ensure_secrets(spec.secret_keys())
    t0 = time.monotonic()
    stack.up()
    out(f"      applied in {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    env.wait_slurm_nodes()  # the NodeSets' pods placed, their slurmd registered (the Slinky stand-in)
    out(f"      Slurm nodes {', '.join(env.slurm_node_names())} up {time.monotonic() - t0:.1f}s later")

    api = env.kube.api_client()
    kube = Kube(api, manager=labels.MANAGER_INJECT_FAULT)  # the drill's fault is a person's: named so in pages
    ns = spec.healing.reconciler.namespace
    if env.kubelet_nodes:
        out(f"[3/{total}] reconciler: the Deployment pulumi up applied, as pods from the project's image")
        pods = wait_reconciler_pods_ready(kube.core, ns, spec.healing.reconciler.replicas)
        leader = next(p for p in pods if p["leader"])
        out(f"      {len(pods)} pods Ready on {', '.join(sorted(p['node'] for p in pods))}; "
            f"{leader['name']} holds the Lease")
        alive = lambda: any(p["ready"] for p in reconciler_pods(kube.core, ns))  # noqa: E731
        where = f"kubectl -n {ns} logs -l app.kubernetes.io/name=gpufleet-reconciler"
    else:
        out(f"[3/{total}] reconciler: same code and policy as its Deployment, as a host process")
        policy = _policy_from_cluster(kube, spec, env.root)
        if grace is not None:
            doc = json.loads(policy.read_text())
            doc["healing"]["grace_period_seconds"] = grace
            policy.write_text(json.dumps(doc, indent=2))
        env.start_reconciler(policy)
        alive, where = env.reconciler_running, str(env.reconciler_log)

    return kube, alive, where


def demo_fault(spec: FleetSpec, xid: int) -> FaultSignal:
    """The fault the demo injects, with the action the spec's policy gives it (issue 21). Raises
    ValueError for an XID that leaves the node in service (none, restart-app): nothing would heal."""
    need = FaultPolicy.from_spec(spec.healing).action(Kind.XID, xid)
    if not need.remediates:
        raise ValueError(f"--xid {xid}: {describe(xid)} needs {need.value}, which leaves the node in service, "
                         f"so there is nothing to heal; pick one that needs reset-gpu, reboot or replace (e.g. 79)")
    return FaultSignal(Kind.XID, xid, need, DEMO_PCI, gpu=standin_gpu_index(DEMO_PCI))


DEMO_PCI = "0000:3b:00"  # a GPU of the stand-in's H100 machine (localenv/gpu_hardware_standin.py SMI_Q)


def standin_gpu_index(pci: str) -> int | None:
    """The index the node agent would give this GPU (gpufleet/commands.py _gpu_indexes: nvidia-smi's `index`):
    its place in the stand-in's `nvidia-smi -q`, which lists the GPUs in index order."""
    from localenv.gpu_hardware_standin import OUTPUTS, SMI_Q
    from gpufleet.reconciler.agent.sightings import pci_key
    from gpufleet.reconciler.healthcheck.nvidia_smi import parse

    _, gpus = parse((OUTPUTS / SMI_Q).read_text())
    keys = [pci_key(g.bus_id) for g in gpus]
    return keys.index(pci_key(pci)) if pci_key(pci) in keys else None


def run_demo(spec: FleetSpec, env: LocalEnv, stack: Stack, *, fresh: bool = True, xid: int = 79,
             grace: int | None = None, timeout: float = 300, out: Callable[[str], None] = say) -> Timeline:
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    fault = demo_fault(spec, xid)  # before anything starts
    total = 8
    kube, alive, where = bring_up(spec, env, stack, total=total, fresh=fresh, grace=grace, out=out)
    api = kube.api

    out(f"[4/{total}] sbatch: {STEPS} steps of SGD, checkpoint every {EVERY} steps and on SIGTERM")
    storage = spec.checkpoint_storage
    run_dir = Path(storage.host_path if storage and storage.host_path else env.root / "checkpoints") / "demo-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    part = next(p for p in spec.slurm.partitions if p.default) if any(p.default for p in spec.slurm.partitions) \
        else spec.slurm.partitions[0]
    nodes_needed = spec.pool(part.pools[0]).nodes
    job = submit_training(env, part.name, nodes_needed, run_dir)
    batch = wait_for("the job to start", lambda: _batch_host(env, job), 60)
    wait_for("the first checkpoints", lambda: _last_step(run_dir) >= 60, 120)
    out(f"      job {job} running on {nodes_needed} node(s), batch host {batch}, step {_last_step(run_dir)}")

    node = kube_node_of(kube, spec.slurm.namespace, batch)  # Slurm names are the NodeSet pods' hostnames
    out(f"[5/{total}] inject {describe(xid)}, which needs {fault.action.value}, on {node} (Slurm node {batch})")
    # The kwok node's simulated GPU hardware (localenv/gpu_hardware_standin.py): broken in the way the fault's
    # action fixes, so its repair has something to do; the reconciler never reads this.
    kube.patch_node(node, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: hardware_state(fault)}}})
    fault_at = time.time()
    kube.set_condition(node, spec.healing.condition_types[0], "False", reason_for(Kind.XID, xid),
                       format_message(fault, "injected by gpufleet demo"))  # as the node agent writes it

    out(f"[6/{total}] the fleet heals itself (no human action):")
    store = KubeRemediationStore(api)
    tl = Timeline(fault_at=fault_at, node=node)
    seen: set[str] = set()

    def finished():  # prints each phase as it is entered
        if not alive():
            raise RuntimeError(f"the reconciler is not running; see {where}")
        recs = [r for r in store.list() if r.node == node]
        if not recs:
            return None
        record = max(recs, key=lambda r: r.created)
        for phase, at in record.phase_times:
            if phase not in seen:
                seen.add(phase)
                extra = f" -> {record.replacement}" if phase == "Resuming" and record.replacement else ""
                out(f"      +{at.timestamp() - fault_at:5.1f}s  {phase}{extra}")
        return record if record.phase.terminal or record.phase.value == "OptedOut" else None

    try:
        record = wait_for("a finished remediation", finished, timeout, interval=0.2)
    except TimeoutError:
        raise RuntimeError(f"no finished remediation within {timeout}s; see {where}") from None
    if not record.phase.terminal:
        raise RuntimeError(f"the remediation ended {record.phase.value}, not finished; see {where}")
    tl.phases = [(p, at.timestamp()) for p, at in record.phase_times]
    tl.replacement, tl.outcome = record.replacement, record.phase.value
    if record.phase.value == "Succeeded":
        tl.healthy_at = record.phase_times[-1][1].timestamp()

    out(f"[7/{total}] the requeued job resumes from its checkpoint")
    wait_for("the job to finish", lambda: (run_dir / "result.json").exists(), timeout)
    restart = next((e for e in _events(run_dir) if e["event"] == "start" and e["time"] > fault_at), None)
    if restart:
        tl.job_running_again_at, tl.resumed_step, tl.resumed_on = restart["time"], restart["step"], restart["host"]
    print(tl.render(), flush=True)
    result = json.loads((run_dir / "result.json").read_text())["weights"]
    same = result == train.reference(STEPS)
    print(f"\n  final weights {'EQUAL' if same else 'DIFFER FROM'} those of an uninterrupted {STEPS}-step run: "
          f"{'no training step was lost' if same else 'steps were lost or repeated'}", flush=True)
    if not same:
        raise RuntimeError("the resumed job's result differs from an uninterrupted run")
    out(f"[8/{total}] replace first, repair after: {node} is repaired, checked and back among the spares")
    show_repair(store, kube, node, fault_at, alive, where, timeout, out)
    print_why(job, env, out)
    return tl


def hardware_state(fault: FaultSignal) -> str:
    """What the demo's node is made to need (the hardware stand-in's state): what its fault's action fixes."""
    return RESET_FIXES if fault.action.value == RESET_GPU else REBOOT_FIXES


def show_repair(store, kube, node: str, fault_at: float, alive: Callable[[], bool], where: str, timeout: float,
                out: Callable[[str], None] = say) -> None:
    """Wait for the faulty node's repair to end (the remediation's `status.repair`), printing each phase as it
    is entered; it must end Returned, the node a spare again."""
    seen: set[str] = set()

    def ended():
        if not alive():
            raise RuntimeError(f"the reconciler is not running; see {where}")
        recs = [r for r in store.list() if r.node == node]
        rep = max(recs, key=lambda r: r.created).repair if recs else None
        if rep is None:
            return None
        for phase, at in rep.phase_times:
            if phase not in seen:
                seen.add(phase)
                out(f"      +{at.timestamp() - fault_at:5.1f}s  {phase}  {rep.reason if phase == rep.phase.value else ''}".rstrip())
        return rep if rep.phase.terminal else None

    try:
        rep = wait_for("the faulty node's repair to end", ended, timeout, interval=0.5)
    except TimeoutError:
        raise RuntimeError(f"the repair of {node} did not end within {timeout}s; see {where}") from None
    role = (kube.get_node(node)["metadata"].get("labels") or {}).get(labels.ROLE)
    steps = ", ".join(f"{e.step} {e.outcome}" for e in rep.history)
    out(f"      {node}: repair {rep.phase.value} ({steps}); role now {role}")
    if rep.phase is not RepairPhase.RETURNED or role != labels.ROLE_SPARE:
        raise RuntimeError(f"the repair of {node} ended {rep.phase.value} (role {role}), not back among the spares; "
                           f"see {where}")


def print_why(job: int, env: LocalEnv, out: Callable[[str], None] = say) -> None:
    """What the job's owner sees on the login node, without Kubernetes: `gpufleet why` through Slurm alone, with
    the token `scontrol token` gives the job's owner (the demo submits as root: its owner)."""
    import os

    out(f"\nWhat the job's owner sees, without Kubernetes:\n$ export $(scontrol token)\n$ gpufleet why {job}")
    from localenv.slurm import LocalSlurmError

    try:
        token = env.slurm.scontrol("token").strip()
    except LocalSlurmError as e:  # the story is a courtesy at the demo's end: its absence fails nothing
        print(f"  (no Slurm token for the job's owner: {e})", flush=True)
        return
    r = subprocess.run([sys.executable, "-m", "gpufleet", "why", str(job), "--login", "--slurm-url", env.slurm.rest_url],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SLURM_JWT": token.split("=", 1)[-1], "KUBECONFIG": ""})
    print((r.stdout or r.stderr).rstrip(), flush=True)


def reset(env: LocalEnv, stack: Stack) -> None:
    """Start from a clean fleet: stop everything and drop cluster, Slurm and stack state."""
    env.down()
    for sub in ("kube/etcd-data", "kube/etcd", "slurm/ctld/state", "slurm/nodes", "state", "checkpoints"):
        shutil.rmtree(env.root / sub, ignore_errors=True)


def _policy_from_cluster(kube, spec: FleetSpec, root: Path) -> Path:
    """The reconciler's policy exactly as the stack rendered it into its ConfigMap."""
    ns = spec.healing.reconciler.namespace
    cm = kube.core.read_namespaced_config_map("gpufleet-policy", ns)
    path = root / "policy.json"
    path.write_text(cm.data["fleet.json"])
    return path


def submit_training(env: LocalEnv, partition: str, nodes: int, run_dir: Path, steps: int = STEPS,
                    every: int = EVERY, delay: float = DELAY) -> int:
    # The job runs inside the local Slurm's root (Debian sid): its python3 runs train.py (stdlib only)
    # from the project folder, which LocalEnv binds into the root.
    cmd = (f"exec python3 {Path(train.__file__).resolve()} --dir {run_dir} --steps {steps} "
           f"--every {every} --delay {delay}")
    return env.slurm.sbatch(f"--partition={partition}", f"--nodes={nodes}", "--requeue", "--open-mode=append",
                            "--job-name=demo-train", f"--output={run_dir}/slurm-%j.out", f"--chdir={run_dir}",
                            "--wrap", cmd)


def _batch_host(env: LocalEnv, job: int) -> str | None:
    out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T %B"], env=env.slurm.env(), capture_output=True,
                         text=True, timeout=15).stdout.split()
    return out[1] if len(out) == 2 and out[0] == "RUNNING" else None


def kube_node_of(kube, namespace: str, slurm_name: str) -> str:
    """The Kubernetes node a Slurm node runs on: the node of the NodeSet pod whose hostname it is."""
    from gpufleet.fleetspec import labels

    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{labels.SLINKY_POD_HOSTNAME}={slurm_name}").items
    running = [p.spec.node_name for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]
    if not running:
        raise RuntimeError(f"no NodeSet pod with hostname {slurm_name} in namespace {namespace}")
    return running[0]


def _events(run_dir: Path) -> list[dict]:
    f = run_dir / "events.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def _last_step(run_dir: Path) -> int:
    steps = [e["step"] for e in _events(run_dir) if e["event"] == "checkpoint"]
    return max(steps) if steps else 0




def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()
