"""Hang: one node's Slurm call hangs while a burst of faults heals. Does it delay only its own node?

A real local environment (control plane, kwok nodes, a real Slurm with slurmrestd and one slurmd per
node, the Slinky stand-in) and the real reconciler as a host process with the REST backend. The
reconciler reaches slurmrestd through `_slow_link.SlowLink`, a loopback proxy that holds the first
`--hang-calls` calls naming one Slurm node (the "hung" node's) for `--hang` seconds, and forwards every
other call at once. Slurm stays real.

Every node of one pool fails at once (spares for all, grace 0, brakes off). For each node, in seconds
after its fault was written (this host's clock):
  cordoned       the node is unschedulable (this script's node watch)
  Slurm drained  slurmctld set its Slurm node DRAIN (slurmctld's log, ms stamps)
  healed         its record reached Succeeded (spare promoted, Ready, resumed in Slurm)
The question: do the other nodes heal while the hung node's call is held, and what does the hang
cost the hung node itself (the reconciler's Slurm client gives up on a call after its timeout, 10 s,
and retries with backoff)?

    .venv/bin/python bench/hang.py                       # 8 faults, one node's first Slurm call held 30 s
    .venv/bin/python bench/hang.py --faults 4 --hang 15  # quicker
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _output import load, machine, parse_bench_args, pct, say, Table  # noqa: E402
from _fleets import make_spec, pool_doc, write_policy  # noqa: E402
from _cluster import install_crd_and_namespace, release_lease, start_standin_for_the_spec, teardown  # noqa: E402
from _watch import NodeWatcher  # noqa: E402
from _reconciler import HostReconciler, wait_leading  # noqa: E402
from gpufleet.waiting import wait_for  # noqa: E402
from localenv.ports import free_port  # noqa: E402
from _slow_link import SlowLink  # noqa: E402
from time_to_heal import slurm_state_times  # noqa: E402

from gpufleet.fleetspec import labels  # noqa: E402

POOL = "gpu"


def spec_for(faults: int):
    return make_spec([pool_doc(POOL, nodes=faults, spares=faults)],
                     {"grace_period_seconds": 0, "max_concurrent": 1000, "max_unhealthy_fraction": 1.0,
                      "drain_timeout_seconds": 30, "max_attempts_per_node": 1000})


def slurm_names(api, namespace: str) -> dict[str, str]:
    """Kubernetes node -> the Slurm node of the NodeSet pod running on it (its hostname label)."""
    from kubernetes import client

    out = {}
    for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items:
        name = (p.metadata.labels or {}).get(labels.SLINKY_POD_HOSTNAME)
        if name and p.spec.node_name and p.status.phase not in ("Succeeded", "Failed"):
            out[p.spec.node_name] = name
    return out


def inject(kubeconfig: Path, nodes: list[str]) -> dict[str, float]:
    from gpufleet.reconciler.app import api_client
    from gpufleet.reconciler.adapters.kube import Kube

    local = threading.local()
    at: dict[str, float] = {}

    def one(n: str) -> None:
        if not hasattr(local, "kube"):
            local.kube = Kube(api_client(str(kubeconfig)))
        local.kube.get_node(n)
        at[n] = time.time()
        local.kube.set_condition(n, "GpuHealthy", "False", "Xid79", "Xid 79: GPU has fallen off the bus.")

    with ThreadPoolExecutor(max_workers=len(nodes)) as ex:
        for f in [ex.submit(one, n) for n in nodes]:
            f.result()
    return at


def run(env, root: Path, a) -> dict:
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    spec = spec_for(a.faults)
    api = env.kube.api_client()
    store = KubeRemediationStore(api)
    names = slurm_names(api, spec.slurm.namespace)
    victims = sorted(names, key=lambda n: names[n])  # every node running a Slurm node of the pool
    if len(victims) < a.faults:
        raise RuntimeError(f"only {len(victims)} nodes run a NodeSet pod: {names}")
    hung = victims[0]
    policy = write_policy(spec, root / "policy.json")
    log = root / "reconciler-hang.log"
    release_lease(api, spec.healing.reconciler.namespace)
    watcher = NodeWatcher(env.kube.kubeconfig_path).start()
    with SlowLink(env.slurm.rest_url, {names[hung]}, a.hang, hang_calls=a.hang_calls) as link:
        rec = HostReconciler(env.kube.kubeconfig_path, policy, log, slurm="rest", metrics_port=free_port(),
                             env=env.slurm.env(),
                             extra_args=["--slurm-url", link.url, "--slurm-jwt-key-file", str(env.slurm.jwt_key_path)])
        try:
            wait_leading(log, 60)
            wait_for("the reconciler's caches", lambda: rec.check() or (rec.metric("gpufleet_nodes_watched") or 0) >= 2 * a.faults, 120, interval=0.2)
            watcher.arm()
            say(f"{a.faults} faults at once; the Slurm calls naming {names[hung]} (on {hung}) hang {a.hang:.0f}s "
                f"(the first {a.hang_calls}) ...")
            at = inject(env.kube.kubeconfig_path, victims)

            def done():
                rec.check()
                rs = {r.node: r for r in store.list() if r.node in at and r.created.timestamp() >= at[r.node] - 1}
                return rs if len(rs) == len(victims) and all(r.phase.terminal for r in rs.values()) else None

            records = wait_for("every remediation to end", done, a.timeout, interval=0.3)
        finally:
            rec.stop()
            watcher.close()
        held = [(path, at, next((h[2] for h in link.held if h[0] == path and h[1] == at), None))
                for path, at in link.holding]  # a hold may outlast the run: it was begun, that is what counts
    rows = []
    t0 = min(at.values())
    for n in victims:
        r = records[n]
        phases = {p: t.timestamp() for p, t in r.phase_times}
        slurm = slurm_state_times(env, names[n], at[n] - 0.01)
        rows.append({
            "node": n, "slurm_node": names[n], "hung": n == hung, "outcome": r.phase.value,
            "cordoned": watcher.cordoned_at.get(n, float("nan")) - at[n],
            "slurm_drained": slurm.get("slurm_drain", float("nan")) - at[n],
            "drain_step": phases.get("Checkpointing", float("nan")) - at[n],
            "healed": phases.get("Succeeded", float("nan")) - at[n],
            "retries": r.retries, "last_error": r.last_error,
        })
    others = [x for x in rows if not x["hung"]]
    mine = next(x for x in rows if x["hung"])
    hold_end = max((h[1] + (h[2] if h[2] is not None else a.hang) for h in held), default=None)
    return {
        "faults": a.faults, "hang_s": a.hang, "hang_calls": a.hang_calls, "hung_node": hung, "rows": rows,
        "held": [{"call": h[0], "began_after_s": h[1] - t0, "held_s": h[2]} for h in held],
        "others_healed_p50": pct([x["healed"] for x in others], 50),
        "others_healed_max": max(x["healed"] for x in others),
        "others_drained_p90": pct([x["slurm_drained"] for x in others], 90),
        "others_healed_during_hold": sum(1 for x in others if hold_end and at[x["node"]] + x["healed"] < hold_end),
        "hung_healed": mine["healed"], "hung_drained": mine["slurm_drained"], "load": load(),
    }


def result_tables(res: dict) -> list[Table]:
    held = "; ".join(f"{h['call']} held " + (f"{h['held_s']:.1f}s" if h["held_s"] is not None else
                                               f"{res['hang_s']:.0f}s (still held when the run ended)")
                     + f" from {h['began_after_s']:.2f}s" for h in res["held"])
    return [
        Table(f"Hang: {res['faults']} faults at once; the first {res['hang_calls']} Slurm call(s) naming one node's "
              f"Slurm node hang {res['hang_s']:.0f}s ({machine()}; load {res['load']:.2f})",
              ["node", "Slurm node", "its call hangs", "outcome", "cordoned s", "Slurm drained s", "drain step s",
               "healed s"],
              [[r["node"], r["slurm_node"], "yes" if r["hung"] else "", r["outcome"], r["cordoned"], r["slurm_drained"],
                r["drain_step"], r["healed"]] for r in res["rows"]],
              [f"held at the link: {held or 'nothing'}",
               "Slurm drained: slurmctld set the node DRAIN (its log); with Slinky the operator (here its stand-in) "
               "drains a cordoned node's Slurm node itself. drain step: the record entered Checkpointing (the "
               "reconciler's Slurm step, which reads the node from slurmrestd first, done).",
               f"the other {res['faults'] - 1} nodes: healed P50 {res['others_healed_p50']:.2f}s, max "
               f"{res['others_healed_max']:.2f}s; {res['others_healed_during_hold']} of them healed while the hung "
               f"call was still held; the hung node healed after {res['hung_healed']:.2f}s"]),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=8, help="nodes of the pool, all failing at once (default 8)")
    ap.add_argument("--hang", type=float, default=30.0, help="seconds each held Slurm call hangs (default 30)")
    ap.add_argument("--hang-calls", type=int, default=1, help="how many calls naming the hung node are held (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed for every remediation to end")
    a, out = parse_bench_args(ap, argv, "hang")
    if a.faults < 2:
        ap.error("--faults must be at least 2 (one hung node and others)")

    from localenv.env import LocalEnv

    root = a.root or Path(tempfile.mkdtemp(prefix="gf-hang-"))
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    spec = spec_for(a.faults)
    say(f"hang: {machine()}; work folder {root}")
    env = LocalEnv(spec, root=root, ports=LocalEnv.free_ports(spec), progress=lambda m: None)
    res = None
    try:
        say("local environment up (control plane, kwok nodes, Slurm with slurmrestd) ...")
        env.up()
        install_crd_and_namespace(env.kube.api_client(), spec.healing.reconciler.namespace)
        start_standin_for_the_spec(env)
        env.wait_slurm_nodes(timeout=300)
        res = run(env, root, a)
        say(f"others healed P50 {res['others_healed_p50']:.2f}s max {res['others_healed_max']:.2f}s; "
            f"hung node healed {res['hung_healed']:.2f}s")
    finally:
        teardown(env.down, root, a.keep, a.root is None)
    out.emit(result_tables(res), raw=res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
