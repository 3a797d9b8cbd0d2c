"""Storms: many GPUs failing at once. Real API server with kwok nodes; the reconciler as a host
process (`gpufleet reconcile --slurm none`).

Part 1, a storm: 150 simultaneous faults (default) on a 1,500-node pool with the brakes off
(max_concurrent 1000, max_unhealthy_fraction 1.0): fault -> cordon P50/P90 per node, as this script's
own watch of cordoned nodes sees it and as the reconciler's log says its cordon call returned (the
difference is the API server's delivery of the change under the storm's load); fault -> record and
fault -> Succeeded (spare promoted and Ready), nodes per second, and whether any spare was handed to
two nodes. Reference: an open-source remediation system
published fault -> cordon P50 16.8 s / P90 28.2 s for 150 simultaneous failures on 1,503 nodes.

Part 2, the brake: 1%, 5% and 20% of a 200-node pool failing at once with
max_unhealthy_fraction 0.1 (default here; the spec's default is 0.2), each tier on a pool of its own,
with max_concurrent 2 (the spec's default) and then high: how many were started, how many healed,
how fast, and whether the brake (gate TooManyUnhealthy) engaged.

    .venv/bin/python bench/storms.py                                       # 150 on 1,500, then the tiers
    .venv/bin/python bench/storms.py --storm-nodes 300 --storm-faults 30 --tier-nodes 100   # quicker
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repo import PYTHON  # noqa: E402
from _output import load, machine, parse_bench_args, pct, say, Table  # noqa: E402
from _fleets import make_spec, pool_doc, write_policy  # noqa: E402
from _procstats import cpu_seconds, rss_kib  # noqa: E402
from _cluster import (  # noqa: E402
    apiserver_requests, create_nodes, install_crd_and_namespace, release_lease, request_delta, teardown,
    wait_all_ready,
)
from _watch import NodeWatcher  # noqa: E402
from _reconciler import HostReconciler, json_lines, wait_leading  # noqa: E402
from gpufleet.waiting import wait_for  # noqa: E402
from localenv.ports import free_port  # noqa: E402

TIERS = (1, 5, 20)


def fleet(a) -> tuple[list[dict], list[str]]:
    pools = [pool_doc("storm", a.storm_nodes, a.storm_faults + 10)]
    if not a.skip_prod:  # sized so that the storm is above the prod brake (10 %): 150 of 1,200 is 12.5 %
        pools.append(pool_doc("prodstorm", a.storm_faults * 8, 10))
    tier_pools = []
    for mc in ([] if a.skip_tiers else a.tier_max_concurrent):
        for p in TIERS:
            name = f"t{p}-c{mc}"
            faults = max(1, round(a.tier_nodes * p / 100))
            pools.append(pool_doc(name, a.tier_nodes, faults + 5))
            tier_pools.append(name)
    return pools, tier_pools


def inject(kubeconfig: Path, nodes: list[str], concurrency: int, took: dict[str, float] | None = None) -> dict[str, float]:
    """Set the fault on every node at once (threads), as the agent writes it (a read, then the condition's
    patch); returns when each write was started (`took`: how long each took, the API server's latency)."""
    from gpufleet.reconciler.app import api_client
    from gpufleet.reconciler.adapters.kube import Kube

    local = threading.local()
    at: dict[str, float] = {}

    def one(n: str) -> None:
        if not hasattr(local, "kube"):
            local.kube = Kube(api_client(str(kubeconfig)))
        local.kube.get_node(n)  # warm the connection; the fault time is taken at the write
        at[n] = time.time()
        local.kube.set_condition(n, "GpuHealthy", "False", "Xid79", "Xid 79: GPU has fallen off the bus.")
        if took is not None:
            took[n] = time.time() - at[n]

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for f in [ex.submit(one, n) for n in nodes]:
            f.result()
    return at


def start_reconciler(kube, api, root: Path, spec, tag: str, total: int, profile: Path | None = None) -> HostReconciler:
    policy = write_policy(spec, root / f"policy-{tag}.json")
    log = root / f"reconciler-{tag}.log"
    release_lease(api)
    rec = HostReconciler(kube.kubeconfig_path, policy, log, slurm="none", metrics_port=free_port(),
                         profile=profile, count_calls=root / f"calls-{tag}.json")
    wait_leading(log, 60)
    wait_for("the first pass", lambda: rec.check() or rec.metric("gpufleet_nodes_watched") == total, 300, interval=0.2)
    return rec


def gate_lines(log: Path, reason: str, pool: str | None = None) -> list[dict]:
    return [d for d in json_lines(log) if str(d.get("message", "")).startswith(f"gate {reason}")
            and (pool is None or f"pool {pool} " in str(d.get("message", "")))]


def page_lines(log: Path, event: str, pool: str) -> list[dict]:
    """The pages the reconciler sent (its notifier's log line per page), for one pool."""
    return [d for d in json_lines(log) if str(d.get("message", "")).startswith(f"notify {event}:")
            and f"pool {pool} " in str(d.get("message", ""))]


def cordons_logged(log: Path) -> dict[str, float]:
    """When the reconciler's cordon call returned, per node (its JSON log, this host's clock): the
    cordon is in the API server then; a watch sees it after the API server delivers it."""
    from datetime import datetime

    out: dict[str, float] = {}
    for d in json_lines(log):
        if d.get("message") == "cordoned" and d.get("node"):
            out.setdefault(d["node"], datetime.strptime(d["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def victims_of(pool: str, nodes: int, count: int) -> list[str]:
    step = max(1, nodes // count)
    return [f"{pool}-{i}" for i in range(0, nodes, step)][:count]


class Observer:
    """`_observe_nodes.py` in a process of its own (storms.py --observer): when an idle client saw each
    fault and each cordon, so the API server's delivery shows apart from any busy client's lag."""

    def __init__(self, kubeconfig: Path, out: Path):
        self.out = out
        self.proc = subprocess.Popen([PYTHON, str(Path(__file__).with_name("_observe_nodes.py")), str(kubeconfig),
                                      str(out)], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "synced":  # type: ignore[union-attr]
            raise RuntimeError("the observer did not sync")

    def stop(self) -> dict[str, dict[str, float]]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        return json.loads(self.out.read_text())


def observed(seen: dict[str, dict[str, float]] | None, at: dict[str, float], logged: dict[str, float]) -> dict:
    """The observer's figures: fault -> seen, and the reconciler's cordon call returned -> seen."""
    if seen is None:
        return {}
    fault = [seen["fault"][n] - at[n] for n in at if n in seen["fault"]]
    cordon = [seen["cordon"][n] - logged[n] for n in at if n in seen["cordon"] and n in logged]
    return {"observer_fault_p50": pct(fault, 50), "observer_fault_p90": pct(fault, 90),
            "observer_fault_max": max(fault, default=None), "observer_cordon_lag_p50": pct(cordon, 50),
            "observer_cordon_lag_p90": pct(cordon, 90), "observer_cordon_lag_max": max(cordon, default=None)}


def storm(kube, api, root: Path, a, watcher, total: int) -> dict:
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    pools, _ = fleet(a)
    spec = make_spec(pools, {"grace_period_seconds": 0, "max_concurrent": 1000, "max_unhealthy_fraction": 1.0,
                             "drain_timeout_seconds": 30, "reconciler": {"workers": a.workers}})
    rec = start_reconciler(kube, api, root, spec, "storm", total, a.profile)
    store = KubeRemediationStore(api)
    victims = victims_of("storm", a.storm_nodes, a.storm_faults)
    observer = Observer(kube.kubeconfig_path, root / "observer-storm.json") if a.observer else None
    seen = None
    try:
        watcher.arm()
        cpu0, calls0, own0 = cpu_seconds(rec.pid), apiserver_requests(api), rec.calls()
        say(f"storm: {len(victims)} faults at once on a {a.storm_nodes}-node pool ({a.inject_threads} threads) ...")
        took: dict[str, float] = {}
        at = inject(kube.kubeconfig_path, victims, a.inject_threads, took)
        spread = max(at.values()) - min(at.values())
        say(f"  faults written within {spread:.2f}s; waiting for every remediation to end ...")

        def all_done():
            rec.check()
            rs = {r.node: r for r in store.list() if r.node in at and r.created.timestamp() >= at[r.node] - 1}
            ended = [r for r in rs.values() if r.phase.terminal]
            if len(ended) % 25 == 0 and ended:
                pass
            return rs if len(ended) == len(victims) else None

        records = wait_for("the storm's remediations to end", all_done, a.timeout, interval=0.5)
        cpu, calls = cpu_seconds(rec.pid) - cpu0, request_delta(calls0, apiserver_requests(api))
        time.sleep(1.5)  # the counts are written every second
        own = {k: v - own0.get(k, 0) for k, v in sorted(rec.calls().items(), key=lambda kv: -kv[1])
               if v - own0.get(k, 0) > 0}
        held = rec.metric("gpufleet_nodes_held", {"reason": "MaxConcurrent"})
        rss = (rss_kib(rec.pid) or 0) / 1024
    finally:
        rec.stop()
        if observer is not None:
            seen = observer.stop()
    t0 = min(at.values())
    cordon = [watcher.cordoned_at[n] - at[n] for n in victims if n in watcher.cordoned_at]
    logged = cordons_logged(rec.log)
    written = [logged[n] - at[n] for n in victims if n in logged]
    created = [records[n].created.timestamp() - at[n] for n in victims]
    drained = [dict(records[n].phase_times)["Checkpointing"].timestamp() - at[n] for n in victims
               if "Checkpointing" in dict(records[n].phase_times)]
    succeeded = [dict(records[n].phase_times)["Succeeded"].timestamp() - at[n] for n in victims
                 if records[n].phase.value == "Succeeded"]
    last_cordon = max(watcher.cordoned_at[n] for n in victims if n in watcher.cordoned_at)
    last_ok = max(dict(records[n].phase_times)["Succeeded"].timestamp() for n in victims
                  if records[n].phase.value == "Succeeded")
    replacements = [records[n].replacement for n in victims if records[n].replacement]
    out = {
        "faults": len(victims), "pool_nodes": a.storm_nodes, "inject_spread_s": spread,
        "cordoned": len(cordon), "succeeded": len(succeeded),
        "outcomes": sorted({r.phase.value for r in records.values()}),
        "cordon_p50": pct(cordon, 50), "cordon_p90": pct(cordon, 90), "cordon_max": max(cordon),
        "cordon_written_p50": pct(written, 50), "cordon_written_p90": pct(written, 90),
        "cordon_written_max": max(written, default=None),
        "fault_write_p50": pct(list(took.values()), 50), "fault_write_p90": pct(list(took.values()), 90),
        "fault_write_max": max(took.values()),
        "record_p50": pct(created, 50), "record_p90": pct(created, 90),
        "drained_p50": pct(drained, 50), "drained_p90": pct(drained, 90), "drained_max": max(drained, default=None),
        "reconciler_cpu_s": cpu, "reconciler_rss_mib": rss, "api_requests": calls,
        "api_requests_per_fault": sum(calls.values()) / len(victims),
        "reconciler_calls": own, "reconciler_calls_per_fault": sum(own.values()) / len(victims),
        "ok_p50": pct(succeeded, 50), "ok_p90": pct(succeeded, 90), "ok_max": max(succeeded),
        "cordon_rate": len(cordon) / (last_cordon - t0), "heal_rate": len(succeeded) / (last_ok - t0),
        "double_promoted": len(replacements) - len(set(replacements)), "held_max_concurrent": held, "load": load(),
        **observed(seen, at, logged),
    }
    say(f"  storm: cordon P50 {out['cordon_p50']:.2f}s P90 {out['cordon_p90']:.2f}s; Succeeded P50 {out['ok_p50']:.2f}s "
        f"P90 {out['ok_p90']:.2f}s; {out['cordon_rate']:.1f} nodes/s cordoned, {out['heal_rate']:.1f} nodes/s healed; "
        f"spares handed out twice: {out['double_promoted']}")
    return out


def kube_unschedulable(api, node: str) -> bool:
    from kubernetes import client

    return bool(client.CoreV1Api(api).read_node(node).spec.unschedulable)


def prod_storm(kube, api, root: Path, a, watcher, total: int) -> dict:
    """The same storm under the prod stack's policy (max_concurrent 4, brake above 10 %, admission hold): every fault
    must be contained (cordoned) at once, none replaced, one page."""
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    pools, _ = fleet(a)
    from gpufleet.fleetspec import load_stack_file, stack_file

    prod = load_stack_file(stack_file("prod", Path(__file__).resolve().parents[1])).fleet.healing
    spec = make_spec(pools, {"grace_period_seconds": 0, "max_concurrent": prod.max_concurrent,
                             "max_unhealthy_fraction": prod.max_unhealthy_fraction, "drain_timeout_seconds": 30,
                             "admission_hold_seconds": prod.admission_hold_seconds})
    rec = start_reconciler(kube, api, root, spec, "prod-storm", total)
    store = KubeRemediationStore(api)
    victims = victims_of("prodstorm", a.storm_faults * 8, a.storm_faults)
    try:
        watcher.arm()
        say(f"prod storm: {len(victims)} faults at once, prod policy (max_concurrent {prod.max_concurrent}, "
            f"brake above {prod.max_unhealthy_fraction:.0%}) ...")
        at = inject(kube.kubeconfig_path, victims, a.inject_threads)

        def contained():
            rec.check()
            rs = {r.node: r for r in store.list() if r.node in at}
            if len(rs) < len(victims) or not all(n in watcher.cordoned_at for n in victims):
                return None
            contained = ("Requeued", "Held", "Evicting", "Replacing", "WaitingForSpare", "Resuming", "OptedOut")
            return rs if all(r.phase.terminal or r.phase.value in contained for r in rs.values()) else None

        records = wait_for("every fault of the prod storm to be contained", contained, a.timeout, interval=0.5)
        time.sleep(3 + prod.admission_hold_seconds)  # anything replaced after containment (and the hold) shows now
        records = {r.node: r for r in store.list() if r.node in at}
        pages = len(page_lines(rec.log, "storm", "prodstorm"))
    finally:
        rec.stop()
    cordon = [watcher.cordoned_at[n] - at[n] for n in victims if n in watcher.cordoned_at]
    logged = cordons_logged(rec.log)
    written = [logged[n] - at[n] for n in victims if n in logged]
    drained = [dict(r.phase_times)["Checkpointing"].timestamp() - at[r.node] for r in records.values()
               if "Checkpointing" in dict(r.phase_times)]
    out = {
        "faults": len(victims), "cordoned": len(cordon), "cordon_p50": pct(cordon, 50), "cordon_p90": pct(cordon, 90),
        "cordon_max": max(cordon), "cordon_written_p90": pct(written, 90), "cordon_written_max": max(written, default=None),
        "drained": len(drained), "drained_p90": pct(drained, 90), "drained_max": max(drained, default=None), "replaced": sum(1 for r in records.values() if r.replacement),
        "held": sum(1 for r in records.values() if r.phase.value == "Held"), "pages": pages, "load": load(),
    }
    say(f"  prod storm: {out['cordoned']}/{out['faults']} cordoned (P90 {out['cordon_p90']:.2f}s, max "
        f"{out['cordon_max']:.2f}s), {out['replaced']} replaced, {out['held']} held, {pages} page(s)")
    return out


def tiers(kube, api, root: Path, a, total: int, mc: int) -> list[dict]:
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    pools, _ = fleet(a)
    spec = make_spec(pools, {"grace_period_seconds": 0, "max_concurrent": mc,
                             "max_unhealthy_fraction": a.fraction, "drain_timeout_seconds": 30})
    rec = start_reconciler(kube, api, root, spec, f"tiers-c{mc}", total)
    store = KubeRemediationStore(api)
    rows = []
    try:
        for p in TIERS:
            pool = f"t{p}-c{mc}"
            count = max(1, round(a.tier_nodes * p / 100))
            victims = victims_of(pool, a.tier_nodes, count)
            say(f"tier {p}% (max_concurrent {mc}): {count} of {a.tier_nodes} nodes of pool {pool} fail at once ...")
            at = inject(kube.kubeconfig_path, victims, a.inject_threads)
            last = [None, time.monotonic()]

            def settled():
                """Every fault has a finished record, or the brake held the rest; and nothing changed for
                `quiet` seconds (or for longer than the reconciler's idle pass, 30 s, whatever the state)."""
                rec.check()
                rs = [r for r in store.list() if r.pool == pool]
                sig = tuple(sorted((r.name, r.phase.value) for r in rs))
                if sig != last[0]:
                    last[0], last[1] = sig, time.monotonic()
                    return None
                quiet = time.monotonic() - last[1]
                if not all(r.phase.terminal or r.phase.value == "Held" for r in rs):
                    return None
                braked = bool(gate_lines(rec.log, "TooManyUnhealthy", pool))
                if (len(rs) >= count or braked) and quiet >= a.quiet or quiet >= 40:
                    return {"records": rs}
                return None

            rs = wait_for(f"tier {p}% to settle", settled, a.timeout, interval=0.3)["records"]
            t0 = min(at.values())
            ok = [r for r in rs if r.phase.value == "Succeeded"]
            heal = [dict(r.phase_times)["Succeeded"].timestamp() - at[r.node] for r in ok]
            gates = gate_lines(rec.log, "TooManyUnhealthy", pool)
            cordoned = sum(1 for n in victims if kube_unschedulable(api, n))
            row = {
                "tier": f"{p}%", "max_concurrent": mc, "failed_nodes": count, "started": len(rs), "healed": len(ok),
                "contained": cordoned, "held": sum(1 for r in rs if r.phase.value == "Held"),
                "brake": "engaged" if gates else "no",
                "heal_p50": pct(heal, 50), "heal_max": max(heal) if heal else None,
                "all_healed_after": (max(dict(r.phase_times)["Succeeded"].timestamp() for r in ok) - t0) if ok else None,
                "gate": gates[0]["message"] if gates else "", "load": load(),
            }
            rows.append(row)
            say(f"  {row['started']} started, {row['contained']} cordoned, {row['healed']} healed, {row['held']} held; "
                f"brake {row['brake']}"
                + (f" ({row['gate']})" if gates else "")
                + (f"; fault -> Succeeded P50 {row['heal_p50']:.2f}s, all done after {row['all_healed_after']:.2f}s"
                   if ok else ""))
    finally:
        rec.stop()
    return rows


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.2f} / {b:.2f}"


def result_tables(s: dict | None, tier_rows: list[dict], a) -> list[Table]:
    out = []
    if s:
        out.append(Table(
            f"Storm: {s['faults']} simultaneous faults on a {s['pool_nodes']}-node pool ({machine()}; "
            f"faults written within {s['inject_spread_s']:.2f}s; load {s['load']:.2f})",
            ["measure", "P50 s", "P90 s", "max s", "nodes/s"], [
                ["the fault's own write (read + patch, as the agent writes it)", s.get("fault_write_p50"),
                 s.get("fault_write_p90"), s.get("fault_write_max"), None],
                ["fault -> an idle observer sees it (--observer)", s.get("observer_fault_p50"),
                 s.get("observer_fault_p90"), s.get("observer_fault_max"), None],
                ["fault -> record", s["record_p50"], s["record_p90"], None, None],
                ["fault -> cordon seen (this script's watch)", s["cordon_p50"], s["cordon_p90"], s["cordon_max"],
                 s["cordon_rate"]],
                ["fault -> cordon written (the reconciler's log)", s.get("cordon_written_p50"),
                 s.get("cordon_written_p90"), s.get("cordon_written_max"), None],
                ["cordon written -> an idle observer sees it (--observer)", s.get("observer_cordon_lag_p50"),
                 s.get("observer_cordon_lag_p90"), s.get("observer_cordon_lag_max"), None],
                ["fault -> Slurm drain step done (no Slurm here)", s["drained_p50"], s["drained_p90"],
                 s["drained_max"], None],
                ["fault -> Succeeded (spare Ready)", s["ok_p50"], s["ok_p90"], s["ok_max"], s["heal_rate"]],
                ["reference: fault -> cordon, 150 on 1,503 nodes", 16.8, 28.2, None, "~1"],
            ],
            [f"{s['cordoned']}/{s['faults']} cordoned, {s['succeeded']}/{s['faults']} Succeeded "
             f"(outcomes {s['outcomes']}); spares handed to two nodes: {s['double_promoted']}",
             "Slurm drain step: the record entered Checkpointing (its DrainSlurm step done); this storm runs "
             "`--slurm none`, so no Slurm call is made: bench/hang.py measures it with a real Slurm.",
             f"reconciler CPU over the storm: {s['reconciler_cpu_s']:.1f} s ({1000 * s['reconciler_cpu_s'] / s['faults']:.0f}"
             f" ms per fault), RSS {s['reconciler_rss_mib']:.0f} MiB",
             f"the reconciler's own calls during the storm: {s.get('reconciler_calls_per_fault', 0):.1f} per fault: "
             + ", ".join(f"{k} {v:.0f}" for k, v in (s.get("reconciler_calls") or {}).items()),
             f"requests the API server served meanwhile (every client: kwok's node leases, the scheduler, this "
             f"script): {s['api_requests_per_fault']:.1f} per fault: "
             + ", ".join(f"{k} {v:.0f}" for k, v in list(s["api_requests"].items())[:12])]))
    if tier_rows:
        out.append(Table(
            f"Brake: a share of one {a.tier_nodes}-node pool fails at once, max_unhealthy_fraction {a.fraction}",
            ["tier", "max_concurrent", "failed", "started", "cordoned", "healed", "held", "brake",
             "fault->Succeeded P50 s", "last healed after s", "load"],
            [[r["tier"], r["max_concurrent"], r["failed_nodes"], r["started"], r["contained"], r["healed"], r["held"],
              r["brake"], r["heal_p50"], r["all_healed_after"], r["load"]] for r in tier_rows]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storm-nodes", type=int, default=1500)
    ap.add_argument("--storm-faults", type=int, default=150)
    ap.add_argument("--tier-nodes", type=int, default=200, help="nodes of each tier's pool")
    ap.add_argument("--fraction", type=float, default=0.1, help="max_unhealthy_fraction for the tiers")
    ap.add_argument("--tier-max-concurrent", default="2,1000", help="max_concurrent values for the tiers")
    ap.add_argument("--inject-threads", type=int, default=16)
    ap.add_argument("--quiet", type=float, default=5.0, help="a tier has settled after this long without change")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per storm or tier")
    ap.add_argument("--skip-storm", action="store_true")
    ap.add_argument("--skip-tiers", action="store_true")
    ap.add_argument("--skip-prod", action="store_true", help="skip the storm under the prod stack's policy")
    ap.add_argument("--observer", action="store_true",
                    help="also watch every node from an idle process of its own (the API server's delivery latency)")
    ap.add_argument("--workers", type=int, default=16, help="the reconciler's workers (healing.reconciler.workers)")
    ap.add_argument("--profile", type=Path, metavar="FILE",
                    help="run the storm's reconciler under py-spy and write its samples (raw, per thread) to FILE")
    ap.add_argument("--concurrency", type=int, default=8, help="threads creating nodes")
    a, out = parse_bench_args(ap, argv, "storms")
    a.tier_max_concurrent = [int(x) for x in a.tier_max_concurrent.split(",") if x.strip()]

    from _cluster import new_kube
    from localenv import fake_nodes

    root = a.root or Path(tempfile.mkdtemp(prefix="gf-storm-"))
    pools, _ = fleet(a)
    spec = make_spec(pools)
    manifests = fake_nodes.fleet_nodes(spec)[1:]  # no system node
    say(f"storms: {machine()}; {len(manifests)} nodes in {len(pools)} pools; work folder {root}")
    kube = new_kube(root / "kube")
    watcher = None
    storm_out, prod_out, tier_rows = None, None, []
    try:
        kube.up()
        api = kube.api_client()
        install_crd_and_namespace(api)
        took = create_nodes(kube.kubeconfig_path, manifests, a.concurrency)
        say(f"created {len(manifests)} nodes in {took:.1f}s; waiting until Ready ...")
        wait_all_ready(api, len(manifests))
        watcher = NodeWatcher(kube.kubeconfig_path).start()
        if not a.skip_storm:
            storm_out = storm(kube, api, root, a, watcher, len(manifests))
        if not a.skip_prod:
            prod_out = prod_storm(kube, api, root, a, watcher, len(manifests))
        if not a.skip_tiers:
            for mc in a.tier_max_concurrent:
                tier_rows += tiers(kube, api, root, a, len(manifests), mc)
    finally:
        teardown(kube.down, root, a.keep, a.root is None, watcher)

    tables = result_tables(storm_out, tier_rows, a)
    if prod_out:
        tables.insert(1 if storm_out else 0, Table(
            f"Storm under the prod policy: {prod_out['faults']} faults (load {prod_out['load']:.2f})",
            ["cordoned", "cordon seen P50 / P90 / max s", "cordon written P90 / max s", "drain step done P90 / max s",
             "replaced", "held", "pages"],
            [[prod_out["cordoned"], f"{prod_out['cordon_p50']:.2f} / {prod_out['cordon_p90']:.2f} / "
              f"{prod_out['cordon_max']:.2f}", _pair(prod_out.get("cordon_written_p90"), prod_out.get("cordon_written_max")),
              _pair(prod_out.get("drained_p90"), prod_out.get("drained_max")),
              prod_out["replaced"], prod_out["held"], prod_out["pages"]]]))
    out.emit(tables, raw={"storm": storm_out, "prod_storm": prod_out, "tiers": tier_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
