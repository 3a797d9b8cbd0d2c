"""Scale: the reconciler's memory and CPU at rest, and its reaction time, on fleets of 100 to 10,000
kwok nodes. Real API server; the reconciler runs as a host process (`gpufleet reconcile --slurm none`).

For each fleet size (the nodes are added to one control plane, smallest fleet first):
  1. create the missing nodes (parallel threads, bounded concurrency) and wait until all are Ready;
  2. start a fresh reconciler; startup = until its first pass saw every node (gpufleet_nodes_watched);
  3. at rest: over a window (default 60 s) its CPU (utime+stime from /proc/PID/stat) and VmRSS, and
     the CPU of the control plane's processes over the same window, for context;
  4. reaction: K faults one after the other (GpuHealthy=False reason Xid79 on an active node):
     fault -> record created, fault -> node cordoned (this script's own node watch), fault -> Succeeded.

    .venv/bin/python bench/scale.py                          # 100, 1000, 5000 nodes
    .venv/bin/python bench/scale.py --sizes 100,1000 --window 20 --faults 3   # quicker
    .venv/bin/python bench/scale.py --sizes 100,1000,5000,10000
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _output import load, machine, parse_bench_args, pct, say, Table  # noqa: E402
from _fleets import make_spec, pool_doc, write_policy  # noqa: E402
from _procstats import cpu_seconds, rss_kib  # noqa: E402
from _cluster import (  # noqa: E402
    create_nodes, install_crd_and_namespace, list_nodes_raw, release_lease, teardown, wait_all_ready,
)
from _watch import NodeWatcher  # noqa: E402
from _reconciler import HostReconciler, wait_leading  # noqa: E402
from gpufleet.waiting import wait_for  # noqa: E402
from localenv.ports import free_port  # noqa: E402

POOL = "gpu"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def spec_for(nodes: int, spares: int):
    return make_spec([pool_doc(POOL, nodes, spares)],
                     {"grace_period_seconds": 0, "max_concurrent": 2, "max_unhealthy_fraction": 0.2,
                      "drain_timeout_seconds": 30})


def component_pids(kube) -> dict[str, int]:
    out = {}
    for name in COMPONENTS:
        try:
            out[name] = json.loads(kube.pid_path(name).read_text())["pid"]
        except (OSError, ValueError, KeyError):
            pass
    return out


def measure_size(kube, api, root: Path, n: int, spares: int, existing: set[str], a, watcher) -> dict:
    from localenv import fake_nodes
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    spec = spec_for(n, spares)
    pool = spec.pools[0]
    wanted = [fake_nodes.pool_node(pool, name, "active") for name in pool.node_names()]
    wanted += [fake_nodes.pool_node(pool, name, "spare") for name in pool.spare_names()]
    missing = [m for m in wanted if m["metadata"]["name"] not in existing]
    say(f"[{n}] creating {len(missing)} nodes ({a.concurrency} threads) ...")
    took = create_nodes(kube.kubeconfig_path, missing, a.concurrency)
    existing |= {m["metadata"]["name"] for m in missing}
    total = len(existing)
    say(f"[{n}] created in {took:.1f}s ({len(missing) / max(took, 1e-9):.0f}/s); waiting for {total} Ready ...")
    ready = wait_all_ready(api, total, timeout=a.ready_timeout, min_fraction=a.min_ready)

    policy = write_policy(spec, root / f"policy-{n}.json")
    log = root / f"reconciler-{n}.log"
    port = free_port()
    release_lease(api)
    t0 = time.monotonic()
    rec = HostReconciler(kube.kubeconfig_path, policy, log, slurm="none", metrics_port=port,
                         count_calls=root / f"calls-{n}.json")
    try:
        wait_leading(log, 60)
        wait_for(f"the reconciler to see {total} nodes", lambda: rec.check() or rec.metric("gpufleet_nodes_watched") == total, 300, interval=0.2)
        startup = time.monotonic() - t0
        rss_start = rss_kib(rec.pid)
        say(f"[{n}] reconciler up, first pass over {total} nodes after {startup:.1f}s; RSS {rss_start / 1024:.0f} MiB; "
            f"settling {a.settle:.0f}s, then {a.window:.0f}s at rest ...")
        time.sleep(a.settle)
        pids = component_pids(kube)
        c0 = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        r0, w0, l0 = cpu_seconds(rec.pid), time.monotonic(), load()
        time.sleep(a.window)
        r1, w1, l1 = cpu_seconds(rec.pid), time.monotonic(), load()
        c1 = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        rec.check()
        wall = w1 - w0
        rest_cpu = 100 * (r1 - r0) / wall
        rss_rest = rss_kib(rec.pid)
        env_cpu = {k: 100 * (c1[k] - c0[k]) / wall for k in pids}
        say(f"[{n}] at rest: reconciler CPU {rest_cpu:.2f}% of a core, RSS {rss_rest / 1024:.0f} MiB; control plane "
            + ", ".join(f"{k} {v:.0f}%" for k, v in env_cpu.items()))

        # reaction to single faults, one after the other
        kube_api, store = Kube(api), KubeRemediationStore(api)
        views = list_nodes_raw(api)
        active = sorted((v["metadata"]["name"] for v in views
                         if (v["metadata"].get("labels") or {}).get("gpufleet.io/role") == "active"
                         and (v["metadata"].get("labels") or {}).get("node-restriction.kubernetes.io/gpufleet-pool") == POOL
                         and not (v.get("spec") or {}).get("unschedulable")),
                        key=lambda s: (len(s), s))
        step = max(1, len(active) // a.faults)
        victims = active[::step][:a.faults]
        reacts = []
        calls0 = rec.calls()
        for v in victims:
            watcher.arm()
            cpu0 = cpu_seconds(rec.pid)
            fault_at = time.time()
            kube_api.set_condition(v, "GpuHealthy", "False", "Xid79", "Xid 79: GPU has fallen off the bus.")

            def done():
                rec.check()
                rs = [r for r in store.list() if r.node == v and r.created.timestamp() >= fault_at - 1]
                return rs[0] if rs and rs[0].phase.terminal and v in watcher.cordoned_at else None

            r = wait_for(f"the remediation of {v}", done, 120, interval=0.1)
            cpu = (cpu_seconds(rec.pid) - cpu0) - (time.time() - fault_at) * rest_cpu / 100
            times = {p: at.timestamp() for p, at in r.phase_times}
            row = {"node": v, "record": r.created.timestamp() - fault_at, "cordon": watcher.cordoned_at[v] - fault_at,
                   "succeeded": times.get("Succeeded", float("nan")) - fault_at, "phase": r.phase.value,
                   "cpu_ms": cpu * 1000}
            reacts.append(row)
            say(f"[{n}] fault on {v}: record {row['record']:.3f}s, cordoned {row['cordon']:.3f}s, "
                f"{r.phase.value} {row['succeeded']:.3f}s; reconciler CPU {row['cpu_ms']:.0f} ms (load {load():.2f})")
            time.sleep(a.pause)
        rss_end = rss_kib(rec.pid)
        time.sleep(1.2)  # the call counts are written every second
        calls = {k: v - calls0.get(k, 0) for k, v in rec.calls().items() if v - calls0.get(k, 0) > 0}
        relists = sum(1 for line in log.read_text(errors="replace").splitlines() if "listing again" in line)
        lived = time.monotonic() - t0
        reaction = rec.metric("gpufleet_reaction_seconds_sum"), rec.metric("gpufleet_reaction_seconds_count")
    finally:
        rec.stop()
    return {
        "nodes": n, "total_nodes": total, "ready_nodes": ready, "create_s": took, "startup_s": startup,
        "rss_start_mib": rss_start / 1024, "rss_rest_mib": rss_rest / 1024, "rss_end_mib": rss_end / 1024,
        "rest_cpu_pct": rest_cpu, "env_cpu_pct": env_cpu, "load": (l0 + l1) / 2,
        "record_med": pct([x["record"] for x in reacts], 50), "record_max": max(x["record"] for x in reacts),
        "cordon_med": pct([x["cordon"] for x in reacts], 50), "cordon_max": max(x["cordon"] for x in reacts),
        "succeeded_med": pct([x["succeeded"] for x in reacts], 50),
        "cpu_ms_mean": sum(x["cpu_ms"] for x in reacts) / len(reacts),
        "reaction_mean": (reaction[0] / reaction[1]) if reaction[1] else None, "faults": reacts,
        "relists": relists, "lived_s": lived,
        "calls_per_fault": sum(calls.values()) / len(reacts), "calls": calls,
    }


def result_tables(results: list[dict], a) -> list[Table]:
    return [
        Table(f"Reconciler at scale ({machine()}; window {a.window:.0f}s at rest; {a.faults} single faults per size)",
              ["nodes", "watched", "startup s", "RSS MiB", "KiB/node", "CPU at rest %", "fault->record med/max s",
               "fault->cordon med/max s", "fault->Succeeded med s", "CPU ms/fault", "API calls/fault", "relists",
               "load"],
              [[r["nodes"], f"{r['total_nodes']} ({r['ready_nodes']} Ready)", r["startup_s"], r["rss_rest_mib"],
                None if i == 0 else (r["rss_rest_mib"] - results[0]["rss_rest_mib"]) * 1024
                / max(1, r["total_nodes"] - results[0]["total_nodes"]),
                r["rest_cpu_pct"], f"{r['record_med']:.3f} / {r['record_max']:.3f}",
                f"{r['cordon_med']:.3f} / {r['cordon_max']:.3f}", r["succeeded_med"], r["cpu_ms_mean"],
                r.get("calls_per_fault"),
                f"{r['relists']} in {r['lived_s']:.0f}s", r["load"]]
               for i, r in enumerate(results)],
              ["KiB/node: extra resident memory per extra node, against the smallest fleet.",
               "CPU ms/fault: the reconciler's utime+stime from the fault to Succeeded, less its rate at rest "
               "(mean of the faults; /proc ticks are 10 ms).",
               "API calls/fault: the reconciler's API server calls from the first fault to the last one's end "
               "(bench/_count_calls.py), per fault; the membership passes and Lease renewals meanwhile included.",
               "relists: the node watch failed and listed every node again (log 'listing again') over the "
               "reconciler's life."]),
        Table("Control plane CPU over the same window (% of one core), for context:",
              ["nodes"] + list(COMPONENTS),
              [[r["nodes"]] + [r["env_cpu_pct"].get(c) for c in COMPONENTS] for r in results]),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,5000", help="fleet sizes (active nodes), ascending")
    ap.add_argument("--window", type=float, default=60, help="seconds at rest to measure CPU over")
    ap.add_argument("--settle", type=float, default=10, help="seconds after startup before the window")
    ap.add_argument("--faults", type=int, default=5, help="single faults per size")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between faults")
    ap.add_argument("--concurrency", type=int, default=8, help="threads creating nodes")
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--min-ready", type=float, default=0.995,
                    help="go on when this fraction of the nodes is Ready (kwok nodes flap at 10,000 on 2 cores)")
    a, out = parse_bench_args(ap, argv, "scale")
    sizes = [int(s) for s in a.sizes.split(",")]
    if sizes != sorted(sizes):
        ap.error("--sizes must be ascending (nodes are added to one control plane)")
    spares = a.faults * len(sizes) + 5

    from _cluster import new_kube

    root = a.root or Path(tempfile.mkdtemp(prefix="gf-scale-"))
    say(f"scale: {machine()}; sizes {sizes}; work folder {root}")
    kube = new_kube(root / "kube")
    results = []
    watcher = None
    try:
        kube.up()
        api = kube.api_client()
        install_crd_and_namespace(api)
        watcher = NodeWatcher(kube.kubeconfig_path).start()
        existing: set[str] = set()
        for n in sizes:
            try:
                results.append(measure_size(kube, api, root, n, spares, existing, a, watcher))
            except Exception as e:  # noqa: BLE001 - keep the sizes measured so far
                say(f"[{n}] FAILED: {e!r}; stopping here")
                break
    finally:
        teardown(kube.down, root, a.keep, a.root is None, watcher)

    out.emit(result_tables(results, a), raw=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
