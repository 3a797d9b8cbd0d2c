"""The second demo, on the local environment: idle GPUs serve inference and are taken back.

After `pulumi up` (as in the main demo) the reconciler lends what the spec lets it: the spares beyond
each pool's floor and the Slurm nodes idle long enough. An inference Deployment of borrower pods
scales onto them; a training job arrives and takes its nodes back; a fault takes a lent spare (its
borrowers evicted first). Each step prints what happened and how long it took.
"""
from __future__ import annotations

import time
from typing import Callable

from fleetspec import labels
from fleetspec.models import FleetSpec, NodePool
from fleetspec.placement import borrower_placement

from gpufleet.demo import bring_up, say, submit_training
from gpufleet.localenv.env import LocalEnv
from gpufleet.stack import Stack
from gpufleet.waiting import wait_for

DEPLOYMENT = "inference"


def lending_pools(spec: FleetSpec) -> list[NodePool]:
    return [p for p in spec.pools if p.lending is not None]


def loans(core, spec: FleetSpec) -> dict[str, tuple[str, str]]:
    """Nodes on loan -> (pool, spare | idle | reclaiming)."""
    out = {}
    for n in core.list_node().items:
        lab = n.metadata.labels or {}
        if any(t.key == labels.LENDING_TAINT for t in n.spec.taints or []):
            out[n.metadata.name] = (lab.get(labels.POOL, "?"), lab.get(labels.LENT) or "reclaiming")
    return out


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


def run_lending_demo(spec: FleetSpec, env: LocalEnv, stack: Stack, *, fresh: bool = True, timeout: float = 180,
                     out: Callable[[str], None] = say) -> dict[str, float]:
    """Returns the figures it printed (seconds)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pools = lending_pools(spec)
    if not pools:
        raise RuntimeError("no pool of this environment declares `lending`")
    total = 7
    kube, alive, where = bring_up(spec, env, stack, total=total, fresh=fresh, out=out)
    core, apps = kube.core, client.AppsV1Api(kube.api)
    figures: dict[str, float] = {}

    for p in pools:
        lend = p.lending
        assert lend is not None
        out(f"      pool {p.name}: lends {'spares' if lend.spares else ''}{' and ' if lend.spares and lend.idle_nodes else ''}"
            f"{f'nodes idle {lend.idle_after_seconds}s' if lend.idle_nodes else ''}; floor {lend.spare_floor} "
            f"unlent spare(s), at most {p.max_lent()} node(s) lent, reclaim grace {lend.reclaim_grace_seconds}s")

    out(f"[4/{total}] idle GPUs lend (no human action)")
    t0 = time.monotonic()
    stable: dict = {}

    def settled():
        now = loans(core, spec)
        if not alive():
            raise RuntimeError(f"the reconciler is not running; see {where}")
        key = tuple(sorted(now.items()))
        if now and stable.get("key") == key and time.monotonic() - stable["since"] > 5:
            return now
        if stable.get("key") != key:
            stable.update(key=key, since=time.monotonic())
        return None

    lent = wait_for("loans to settle", settled, timeout)
    for node, (pool, kind) in sorted(lent.items()):
        out(f"      {node:<22} lent ({kind}, pool {pool})")
    figures["lend_seconds"] = time.monotonic() - t0 - 5

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
        placed = wait_for(f"borrowers of {p.name} running", lambda p=p, want=want: (
            b if len([v for v in (b := borrowers(core, p.name)).values() if v]) == want else None), 60)
        for pod, node in sorted(placed.items()):
            out(f"      {pod:<34} on {node}")

    idle_pool = next((p for p in pools if p.lending and p.lending.idle_nodes
                      and any(v == (p.name, labels.LENT_IDLE) for v in lent.values())), None)
    if idle_pool is not None:
        part = next(x for x in spec.slurm.partitions if idle_pool.name in x.pools)
        out(f"[6/{total}] a training job arrives: sbatch --partition={part.name} --nodes={idle_pool.nodes}")
        storage = spec.checkpoint_storage
        from pathlib import Path
        run_dir = Path(storage.host_path if storage and storage.host_path else env.root / "checkpoints") / "lend-run"
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        job = submit_training(env, part.name, idle_pool.nodes, run_dir, steps=100)

        def running():
            got = env.slurm.run(["squeue", "-h", "-j", str(job), "-o", "%T %N"]).stdout.split()
            return got[1] if got and got[0] == "RUNNING" else None

        nodes = wait_for("the job to run on its nodes, taken back", running, timeout)
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
                                   for n in core.list_node(label_selector=f"{labels.POOL}={p.name}").items)), None)
    if spare_pool is not None:
        victim = next(n.metadata.name for n in core.list_node(label_selector=f"{labels.POOL}={spare_pool.name},"
                                                                              f"{labels.ROLE}={labels.ROLE_ACTIVE}").items)
        out(f"[7/{total}] a fault takes a lent spare: XID 79 on {victim} (pool {spare_pool.name}, every spare lent)")
        fault_at = time.time()
        kube.set_condition(victim, spec.healing.condition_types[0], "False", "Xid79",
                           "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus.")
        from reconciler.adapters.records import KubeRecordStore
        store = KubeRecordStore(kube.api)
        record = wait_for("the heal", lambda: next((r for r in store.list() if r.node == victim and r.phase.terminal),
                                                   None), timeout)
        for phase, at in record.phase_times:
            out(f"      +{at.timestamp() - fault_at:5.1f}s  {phase}")
        out(f"      {record.phase.value}: {record.replacement} replaces {victim}; {record.reason.split('; ', 1)[-1]}")
        figures["fault_to_healthy_seconds"] = record.phase_times[-1][1].timestamp() - fault_at
        if record.phase.value != "Succeeded":
            raise RuntimeError(f"the heal ended {record.phase.value}: {record.reason}")
    else:
        out(f"[7/{total}] (no pool has only lent spares: the fault part is skipped)")

    now = loans(core, spec)
    out(f"      on loan now: {', '.join(sorted(now)) or 'nothing'}  (gpufleet capacity shows the pools)")
    return figures
