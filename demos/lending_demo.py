"""The second demo, on the local environment: idle GPUs serve inference and are taken back.

After `pulumi up` (as in the main demo) the reconciler lends what the spec lets it: the spares beyond
each pool's floor and the Slurm nodes idle long enough. An inference Deployment of borrower pods
scales onto them; a training job arrives and takes its nodes back; a fault takes a lent spare (its
borrowers evicted first). Each step prints what happened and how long it took.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec, NodePool
from gpufleet.fleetspec.placement import borrower_placement

from demos.demo import bring_up, say, submit_training
from localenv.env import LocalEnv
from gpufleet.stack import Stack
from gpufleet.waiting import wait_for

DEPLOYMENT = "inference"
TOTAL = 7


def lending_pools(spec: FleetSpec) -> list[NodePool]:
    return [p for p in spec.pools if p.lending is not None]


def loans(core, spec: FleetSpec) -> dict[str, tuple[str, str]]:
    """Nodes on loan -> (pool, spare | idle | reclaiming)."""
    out = {}
    for n in core.list_node().items:
        lab = n.metadata.labels or {}
        if any(t.key == labels.LENDING_TAINT for t in n.spec.taints or []):
            out[n.metadata.name] = (lab.get(labels.NODE_POOL, "?"), lab.get(labels.LENT) or "reclaiming")
    return out


def expected_loans(pool: NodePool) -> int:
    """What a quiet pool lends: its spares beyond the floor and (if it lends them) its idle nodes, within the cap."""
    lend = pool.lending
    if lend is None:
        return 0
    n = (pool.spares - lend.spare_floor if lend.spares else 0) + (pool.nodes if lend.idle_nodes else 0)
    return min(n, pool.max_lent())


def borrowers(core, pool: str) -> dict[str, str | None]:
    """Borrower pods of a pool's Deployment -> the node they run on (None: waiting for a node)."""
    pods = core.list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={DEPLOYMENT}-{pool}").items
    return {p.metadata.name: (p.spec.node_name if p.status.phase == "Running" else None)
            for p in pods if p.metadata.deletion_timestamp is None}


def inference_deployment(pool: NodePool, replicas: int) -> dict:
    """Borrower pods: the pool's declared selector, and what `borrower_placement` says they need."""
    assert pool.lending is not None
    pod_labels = {**pool.lending.borrowers.selector, "app.kubernetes.io/instance": f"{DEPLOYMENT}-{pool.name}"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"{DEPLOYMENT}-{pool.name}", "namespace": "default", "labels": pod_labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels},
                                  "spec": {**borrower_placement(pool), "terminationGracePeriodSeconds": 5,
                                           "containers": [{"name": "serve", "image": "registry.example/vllm:0.6",
                                                           "resources": {"limits": {
                                                               "nvidia.com/gpu": str(pool.gpus_per_node)}}}]}}}}


ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"})


def job_running(env: LocalEnv, job: int) -> str | None:
    """The job's nodes while it runs; None while it waits. A job that ended is an error (waiting on would
    only time out)."""
    got = env.slurm.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T %N"]).stdout.split()
    if got and got[0] in ENDED:
        raise RuntimeError(f"job {job} ended {got[0]} while it was expected to run")
    return got[1] if got and got[0] == "RUNNING" else None


def state_of(env: LocalEnv, kube, pool: NodePool, partition: str, job: int | None) -> str:
    """What a timed-out step leaves to look at: the job and its reason, the partition's Slurm nodes, the
    pool's Kubernetes nodes as lending marks them, and the last lines the reconciler's pods logged."""
    lines = []
    if job is not None:
        lines.append("squeue: " + env.slurm.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T %r %D %N"]).stdout.strip())
    lines.append("sinfo:\n" + env.slurm.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T %E"]).stdout.rstrip())
    for n in kube.core.list_node(label_selector=f"{labels.NODE_POOL}={pool.name}").items:
        marks = {k: v for k, v in {**(n.metadata.labels or {}), **(n.metadata.annotations or {})}.items()
                 if k.startswith("gpufleet.io/")}
        taints = [t.key for t in n.spec.taints or []]
        lines.append(f"node {n.metadata.name}: unschedulable={bool(n.spec.unschedulable)} taints={taints} {marks}")
    for log in sorted(env.root.glob("nodes/*/pod-logs/*gpufleet-reconciler*/*/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-25:]
        lines.append(f"{log.parent.parent.name}:\n  " + "\n  ".join(tail))
    return "\n".join(lines)


def run_lending_demo(spec: FleetSpec, env: LocalEnv, stack: Stack, *, fresh: bool = True, timeout: float = 180,
                     out: Callable[[str], None] = say) -> dict[str, float]:
    """Returns the figures it printed (seconds)."""
    if not lending_pools(spec):
        raise RuntimeError("no pool of this environment declares `lending`")
    kube, alive, where = bring_up(spec, env, stack, total=TOTAL, fresh=fresh, out=out)
    return show_lending(spec, env, kube, alive, where, timeout=timeout, out=out)


def show_lending(spec: FleetSpec, env: LocalEnv, kube, alive: Callable[[], bool], where: str, *,
                 timeout: float = 180, out: Callable[[str], None] = say) -> dict[str, float]:
    """Steps 4-7, on an environment where the stack is up and the reconciler runs."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pools = lending_pools(spec)
    total = TOTAL
    core, apps = kube.core, client.AppsV1Api(kube.api)
    figures: dict[str, float] = {}

    for p in pools:
        lend = p.lending
        assert lend is not None
        out(f"      pool {p.name}: lends {'spares' if lend.spares else ''}{' and ' if lend.spares and lend.idle_nodes else ''}"
            f"{f'nodes idle {lend.idle_after_seconds}s' if lend.idle_nodes else ''}; floor {lend.spare_floor} "
            f"unlent spare(s), at most {p.max_lent()} node(s) lent, reclaim grace {lend.reclaim_grace_seconds}s")

    expect = {p.name: expected_loans(p) for p in pools}
    longest = max((p.lending.idle_after_seconds for p in pools if p.lending and p.lending.idle_nodes), default=0)
    out(f"[4/{total}] idle GPUs lend (no human action): {sum(expect.values())} node(s) expected"
        + (f", idle nodes after {longest}s without a job" if longest else ""))
    t0 = time.monotonic()

    def lent_as_expected():
        if not alive():
            raise RuntimeError(f"the reconciler is not running; see {where}")
        now = loans(core, spec)
        counts = {p: sum(1 for pool, kind in now.values() if pool == p and kind != "reclaiming") for p in expect}
        return now if all(counts[p] >= n for p, n in expect.items()) else None

    lent = wait_for("the loans the spec allows", lent_as_expected, timeout + longest)
    for node, (pool, kind) in sorted(lent.items()):
        out(f"      {node:<22} lent ({kind}, pool {pool}) after {time.monotonic() - t0:.0f}s")
    figures["lend_seconds"] = time.monotonic() - t0

    out(f"[5/{total}] inference scales onto the lent nodes")
    for p in pools:
        n = sum(1 for pool, _ in lent.values() if pool == p.name)
        body = inference_deployment(p, n)
        try:
            apps.create_namespaced_deployment("default", body)
        except ApiException as e:
            if e.status != 409:
                raise
            apps.replace_namespaced_deployment(body["metadata"]["name"], "default", body)
    for p in pools:
        want = sum(1 for pool, _ in lent.values() if pool == p.name)
        def all_placed(p=p, want=want):
            b = borrowers(core, p.name)
            return b if sum(1 for v in b.values() if v) == want else None

        placed = wait_for(f"borrowers of {p.name} running", all_placed, 60)
        for pod, node in sorted(placed.items()):
            out(f"      {pod:<34} on {node}")

    job = None
    idle_pool = next((p for p in pools if p.lending and p.lending.idle_nodes
                      and any(v == (p.name, labels.LENT_IDLE) for v in lent.values())), None)
    if idle_pool is not None:
        part = next(x for x in spec.slurm.partitions if idle_pool.name in x.pools)
        out(f"[6/{total}] a training job arrives: sbatch --partition={part.name} --nodes={idle_pool.nodes}")
        storage = spec.checkpoint_storage
        run_dir = Path(storage.host_path if storage and storage.host_path else env.root / "checkpoints") / "lend-run"
        # A fresh run: the storage outlives environments, and a finished run's checkpoint would end the
        # job at once (it resumes from it), before anyone saw it running.
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        t0 = time.monotonic()
        job = submit_training(env, part.name, idle_pool.nodes, run_dir)  # ~15 s: still running at step 7's fault
        running = lambda: job_running(env, job)  # noqa: E731

        nodes = wait_for("the job to run on its nodes, taken back", running, timeout,
                         explain=lambda: state_of(env, kube, idle_pool, part.name, job))
        took = time.monotonic() - t0
        figures["pending_to_running_seconds"] = took
        back = [e for e in core.list_namespaced_event("default").items if e.reason == "Reclaimed"]
        out(f"      {len(back)} node(s) taken back from their borrowers; job {job} RUNNING on {nodes} "
            f"{took:.1f}s after sbatch")
        b = borrowers(core, idle_pool.name)
        out(f"      borrowers of {idle_pool.name}: {sum(1 for v in b.values() if v)} running, "
            f"{sum(1 for v in b.values() if not v)} waiting for idle GPUs again")
    else:
        out(f"[6/{total}] (no pool lends idle nodes: no training job to take them back)")

    spare_pool = next((p for p in pools if any(v == (p.name, labels.LENT_SPARE) for v in lent.values())
                       and not any(n.metadata.labels.get(labels.ROLE) == labels.ROLE_SPARE
                                   and labels.LENT not in (n.metadata.labels or {})
                                   for n in core.list_node(label_selector=f"{labels.NODE_POOL}={p.name}").items)), None)
    if spare_pool is not None:
        victim = next(n.metadata.name for n in core.list_node(label_selector=f"{labels.NODE_POOL}={spare_pool.name},"
                                                                              f"{labels.ROLE}={labels.ROLE_ACTIVE}").items)
        out(f"[7/{total}] a fault takes a lent spare: XID 79 on {victim} (pool {spare_pool.name}, every spare lent)")
        fault_at = time.time()
        kube.set_condition(victim, spec.healing.condition_types[0], "False", "Xid79",
                           "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus.")
        from gpufleet.reconciler.adapters.records import KubeRemediationStore
        store = KubeRemediationStore(kube.api)

        def heal_state() -> str:
            now = [f"record {r.name}: {r.phase.value} ({r.reason})" for r in store.list() if r.node == victim]
            spare_part = next(x.name for x in spec.slurm.partitions if spare_pool.name in x.pools)
            return "\n".join(now or ["no record yet"]) + "\n" + state_of(env, kube, spare_pool, spare_part, job)

        record = wait_for("the heal", lambda: next((r for r in store.list() if r.node == victim and r.phase.terminal),
                                                   None), timeout, explain=heal_state)
        for phase, at in record.phase_times:
            out(f"      +{at.timestamp() - fault_at:5.1f}s  {phase}")
        out(f"      {record.phase.value}: {record.replacement} replaces {victim}; {record.reason.split('; ', 1)[-1]}")
        figures["fault_to_healthy_seconds"] = record.phase_times[-1][1].timestamp() - fault_at
        if record.phase.value != "Succeeded":
            raise RuntimeError(f"the heal ended {record.phase.value}: {record.reason}")
        if job is not None and record.jobs:
            from demos.demo import kube_node_of

            again = wait_for("the requeued job to run again", running, timeout,
                             explain=lambda: state_of(env, kube, spare_pool, part.name, job))
            out(f"      job {job} running again on Slurm node {again} (Kubernetes node "
                f"{kube_node_of(kube, spec.slurm.namespace, again)}) {time.time() - fault_at:.1f}s after the fault")
    else:
        out(f"[7/{total}] (no pool has only lent spares: the fault part is skipped)")

    from datetime import timedelta

    from gpufleet.capacity_commands import KubeSource, read, table_rows

    snap = read(spec, KubeSource(kube.api, spec.healing.reconciler.namespace, "the local cluster"), timedelta(hours=1))
    out("      gpufleet capacity (pool, active busy/idle/lent, spares lent/unlent, quarantined, GPUs lent, "
        "GPU-hours lent in the last hour):")
    for row in table_rows(snap):
        out("        " + "  ".join(f"{c:>6}" for c in row[:-1]))
    return figures
