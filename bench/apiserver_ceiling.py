"""How many requests a second the local API server serves on this machine, for the calls a remediation
makes, and so how many nodes a second any reconciler could heal here.

The local control plane (etcd, kube-apiserver, kwok keeping N fake nodes Ready, as `storms.py` runs
it), then, with nothing else running, T client threads (each its own connection, as the reconciler's
workers) for D seconds each making one kind of call: replacing a Remediation record (the reconciler's
most frequent write), patching a Node's annotation (cordon, relabel), getting a Node, posting an Event.
Prints requests/s per kind and thread count, the API server's and etcd's CPU over the run, and the
ceiling that gives: requests/s divided by the calls one remediation needs.

    .venv/bin/python bench/apiserver_ceiling.py                           # 1,500 nodes, 1/4/16 threads, 10 s
    .venv/bin/python bench/apiserver_ceiling.py --nodes 300 --threads 16 --seconds 5 --json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _output import load, machine, parse_bench_args, say, Table  # noqa: E402
from _fleets import make_spec, pool_doc  # noqa: E402
from _procstats import cpu_seconds  # noqa: E402
from _cluster import create_nodes, install_crd_and_namespace, new_kube, teardown, wait_all_ready  # noqa: E402

from gpufleet.fleetspec import labels, remediation_crd  # noqa: E402

NS = "gpufleet-system"
KINDS = ("PUT remediation", "PATCH node", "GET node", "POST event")
# One remediation's API calls (storms.py counts them, 7ff9b54: 18.9 per fault) by the kind above that
# stands for them: 8 record writes and the create; cordon, promote and quarantine writes; their reads;
# 4 Events and the capacity-request pod.
MIX = {"PUT remediation": 9, "PATCH node": 3, "GET node": 2, "POST event": 5}


def record_body(i: int) -> dict:
    return {"apiVersion": f"{labels.GROUP}/{remediation_crd.VERSION}", "kind": remediation_crd.KIND,
            "metadata": {"name": f"ceiling-{i}"},
            "spec": {"node": f"kwok-gpu-{i}", "pool": "gpu", "xid": 79}}


def one_kind(kubeconfig: Path, kind: str, threads: int, seconds: float, nodes: list[str]) -> int:
    """Calls of `kind` made by `threads` threads in `seconds` (each thread its own client and objects)."""
    from kubernetes import client, config

    stop, counts, errors = threading.Event(), [0] * threads, []

    def work(t: int) -> None:
        try:
            calls(t)
        except Exception as e:  # noqa: BLE001 - reported after the run
            errors.append(e)
            stop.set()

    def calls(t: int) -> None:
        api = config.new_client_from_config(str(kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        group, ver, plural = labels.GROUP, remediation_crd.VERSION, remediation_crd.PLURAL
        node = nodes[t % len(nodes)]
        obj = None
        if kind == "PUT remediation":
            name = f"ceiling-{t}"
            try:
                custom.delete_cluster_custom_object(group, ver, plural, name)
            except client.exceptions.ApiException:
                pass
            obj = custom.create_cluster_custom_object(group, ver, plural, record_body(t))
        n = 0
        while not stop.is_set():
            if kind == "PUT remediation":
                obj["status"] = {"phase": "Detected", "revision": n}
                obj = custom.replace_cluster_custom_object(group, ver, plural, obj["metadata"]["name"], obj)
            elif kind == "PATCH node":
                core.patch_node(node, {"metadata": {"annotations": {"bench.gpufleet.io/n": str(n)}}},
                                _preload_content=False).read()
            elif kind == "GET node":
                core.read_node(node, _preload_content=False).read()
            else:
                core.create_namespaced_event("default", {
                    "metadata": {"generateName": "ceiling-"}, "involvedObject": {"kind": "Node", "name": node},
                    "reason": "Bench", "message": "apiserver_ceiling", "type": "Normal"}, _preload_content=False).read()
            n += 1
        counts[t] = n
        api.close()

    ts = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join(timeout=30)
    if errors:
        raise RuntimeError(f"{kind}: {len(errors)} thread(s) failed; the first: {errors[0]}") from errors[0]
    return sum(counts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1500, help="kwok nodes kept Ready meanwhile (their heartbeats load the server)")
    ap.add_argument("--threads", default="1,4,16", help="client thread counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="per kind and thread count")
    a, out = parse_bench_args(ap, argv, "apiserver_ceiling")
    from localenv import fake_nodes

    threads = [int(x) for x in a.threads.split(",") if x.strip()]
    spec = make_spec([pool_doc("gpu", nodes=a.nodes, spares=0)])
    manifests = fake_nodes.fleet_nodes(spec)[1:]
    root = a.root or Path(tempfile.mkdtemp(prefix="gf-ceiling-"))
    say(f"apiserver ceiling: {machine()}; {len(manifests)} kwok nodes; work folder {root}")
    kube = new_kube(root / "kube")
    rows, raw = [], []
    try:
        kube.up()
        api = kube.api_client()
        install_crd_and_namespace(api, NS)
        create_nodes(kube.kubeconfig_path, manifests)
        wait_all_ready(api, len(manifests))
        names = [m["metadata"]["name"] for m in manifests]
        pids = {c: kube.supervisor.pid(c) for c in ("kube-apiserver", "etcd", "kwok")}
        time.sleep(5)  # the nodes' first heartbeats settle
        for kind in KINDS:
            for t in threads:
                cpu0 = {c: cpu_seconds(p) or 0.0 for c, p in pids.items()}
                t0 = time.monotonic()
                n = one_kind(kube.kubeconfig_path, kind, t, a.seconds, names)
                took = time.monotonic() - t0
                cpu = {c: ((cpu_seconds(p) or 0.0) - cpu0[c]) / took for c, p in pids.items()}
                rate = n / a.seconds
                say(f"  {kind:<16} {t:>3} threads: {rate:7.1f}/s (load {load():.2f})")
                rows.append([kind, t, round(rate, 1), round(1000 * a.seconds * t / n, 1) if n else None,
                             f"{cpu['kube-apiserver']:.0%}", f"{cpu['etcd']:.0%}", f"{cpu['kwok']:.0%}",
                             round(load(), 2)])
                raw.append({"kind": kind, "threads": t, "calls": n, "seconds": a.seconds, "rate": rate, "cpu": cpu})
    finally:
        teardown(kube.down, root, a.keep, a.root is None)
    ceiling = []
    for t in threads:
        rate = {r["kind"]: r["rate"] for r in raw if r["threads"] == t}
        per_fault = sum(n / rate[k] for k, n in MIX.items() if rate.get(k))
        ceiling.append([t, round(per_fault * 1000), round(1 / per_fault, 1) if per_fault else None])
    out.emit([
        Table(f"API server requests/s, {len(manifests)} kwok nodes Ready, nothing else running ({machine()})",
              ["call", "threads", "requests/s", "ms per call", "kube-apiserver CPU", "etcd CPU", "kwok CPU", "load"],
              rows),
        Table("The ceiling: one remediation's calls (" + ", ".join(f"{n} x {k}" for k, n in MIX.items())
              + ") at those rates", ["threads", "API server ms per remediation", "nodes/s at most"], ceiling,
              ["No reconciler heals faster here than this, even one that cost no CPU of its own: in a storm the "
               "reconciler, the scheduler and the benchmark share the same 2 cores."]),
    ], raw=raw, nodes=len(manifests), mix=MIX)
    return 0


if __name__ == "__main__":
    sys.exit(main())
