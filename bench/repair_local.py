"""Fault to back among the spares (issue 25) on the real local pieces: how long the repair loop takes a node
from its fault to a proven spare again, for a reset-fixable fault and a reboot-fixable one.

The world of tests/integration/test_repair_local.py: a real API server, scheduler, Job controller and kwok
nodes, the GPU hardware stand-in the control plane runs (localenv/gpu_hardware_standin.py: it answers the
reset or the reboot and ends the health-check pod from the node's simulated state), and the reconciler as
built for a cluster (`gpufleet.reconciler.app.build`), here running as in its pod (`Manager.run`: informers, the work
queue, its workers) in a thread. No Slurm: the heal's path is the one `time_to_heal.py` measures. The fault is
the demo's (`demos/demo.py` `demo_fault`, `hardware_state`): XID 95 (the catalogue says reset-gpu; the node is
made `reset-fixes`) and XID 79 (reboot; `reboot-fixes`), taken in turns on the pool's active nodes. Each round
waits for its remediation's repair to end, and checks it ended Returned on the rung the fault needs, the node
a spare with a passed check on its boot; then the next fault. The pool (2 nodes, 1 spare) cycles: the
returned node is the next fault's spare. The attempt cap and the lemon rule are lifted (as `time_to_heal.py`
lifts the cap), `min_healthy_seconds` is 0 and the storm brake's window 1 s, or the same few nodes faulting one
after another would be escalated, retired, taken for relapses or held as a storm.

Milestones, seconds after the fault's condition was written (the host's clock; the record's times are the
reconciler's, on the same host): healed (the record Succeeded: the spare promoted), repaired (the reset
answered, or the node Ready on a new boot id; the health check starts then), the check Job Complete (its
`status.completionTime`, whole seconds), back (the repair Returned: the verdict read, the node a spare again).

Run: ``flock /tmp/gpufleet-heavy.lock .venv/bin/python bench/repair_local.py --rounds 5`` (about 1 min to start,
then about 30-60 s a round here); `--from-json A.json B.json` makes one table of the rounds of earlier runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from _repo import REPO  # noqa: F401  (the checkout on the import path)
from _output import add_json_option, exit_on_sigterm, machine, Output, pct, say, Table
from _cluster import install_crd_and_namespace, new_kube, teardown

from kubernetes import client

from demos.demo import demo_fault, hardware_state
from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import Kind
from gpufleet.fleetspec.faults.condition import format_message, reason_for
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.fixtures.reconciler_kube import fleet, make_nodes, reconciler
from tests.integration.test_repair_local import proven, simulate

POOL = "rlb"
FAULTS = {"reset-fixable (XID 95)": 95, "reboot-fixable (XID 79)": 79}
MILESTONES = ("healed_s", "repaired_s", "check_complete_s", "back_s")


def bench_spec(nodes: int, spares: int):
    """The test's pool, with what cycling faults through a few nodes would otherwise trip lifted."""
    return fleet(POOL, nodes=nodes, spares=spares, max_attempts_per_node=1000, unhealthy_window_seconds=1,
                 repair={"retire_after_faults": 100, "retire_window_seconds": 3600, "min_healthy_seconds": 0})


def one_round(rec, kube: Kube, core, spec, node: str, xid: int, timeout: float) -> dict:
    """One fault on `node`, to its repair's end. Raises RuntimeError when it ends anywhere but back."""
    fault = demo_fault(spec, xid)
    before = {r.name for r in rec.store.list() if r.node == node}
    simulate(core, node, hardware_state(fault))
    at = time.time()
    kube.set_condition(node, spec.healing.condition_types[0], "False", reason_for(Kind.XID, xid),
                       format_message(fault, "injected by bench/repair_local.py"))

    def ended():
        new = [r for r in rec.store.list() if r.node == node and r.name not in before]
        return new[0] if new and new[0].repair is not None and new[0].repair.phase.terminal else None

    r = wait_for(f"the repair of {node} to end", ended, timeout, interval=0.2)
    rep = r.repair
    seen_back = wait_for(f"{node} a proven spare", lambda: (
        core.read_node(node).metadata.labels.get(labels.ROLE) == labels.ROLE_SPARE and proven(core, node)
        and time.time()), 30, interval=0.2)
    if rep.phase is not RepairPhase.RETURNED or rep.rungs != (fault.action.value,):
        raise RuntimeError(f"{r.name}: repair {rep.phase.value} after {rep.rungs}, not Returned after "
                           f"{fault.action.value}: {rep.reason}")
    ok = next((e.at for e in rep.history if e.step == fault.action.value and e.outcome == "ok"), None)
    healed = r.entered(Phase.SUCCEEDED)
    job = client.BatchV1Api(core.api_client).read_namespaced_job(rep.job, spec.healing.reconciler.namespace)
    done = job.status.completion_time  # the Job controller's, whole seconds
    return {"node": node, "xid": xid, "action": fault.action.value, "remediation": r.name,
            "replacement": r.replacement, "healed_s": healed.timestamp() - at if healed else None,
            "repaired_s": ok.timestamp() - at if ok else None, "back_s": rep.ended.timestamp() - at,
            "check_complete_s": done.timestamp() - at if done else None,
            "seen_back_s": seen_back - at, "history": [(e.step, e.outcome) for e in rep.history]}


def run(a: argparse.Namespace) -> dict:
    spec = bench_spec(a.nodes, a.spares)
    root = Path(tempfile.mkdtemp(prefix="gf-repair-local-"))
    say(f"repair loop, real local pieces: {machine()}; work folder {root}; {a.rounds} rounds of each fault")
    kube_env = new_kube(root / "kube")
    raw: dict = {"rounds": [], "failed": []}
    rec = thread = None
    try:
        say("control plane up ...")
        kube_env.up()
        api = kube_env.api_client()
        install_crd_and_namespace(api, spec.healing.reconciler.namespace)
        make_nodes(kube_env, spec)
        core, kube = client.CoreV1Api(api), Kube(api)
        rec = reconciler(api, spec)
        thread = threading.Thread(target=rec.run, name="reconciler", daemon=True)
        thread.start()
        wait_for("the spares proven (their health check passed)",
                 lambda: all(proven(core, n) for p in spec.pools for n in p.spare_names()), 120, interval=0.5)
        deadline = time.monotonic() + a.budget if a.budget else None
        turn = 0
        for i in range(a.rounds):
            for label, xid in FAULTS.items():
                if deadline and time.monotonic() > deadline:
                    say(f"budget of {a.budget:g}s spent: stopping after {len(raw['rounds'])} rounds")
                    return raw
                active = sorted(n.metadata.name for n in core.list_node(label_selector=f"{labels.NODE_POOL}={POOL},"
                                                                         f"{labels.ROLE}={labels.ROLE_ACTIVE}").items)
                node = active[turn % len(active)]
                turn += 1
                try:
                    r = one_round(rec, kube, core, spec, node, xid, a.timeout)
                except (TimeoutError, RuntimeError) as e:
                    say(f"{label} round {i + 1} on {node} failed: {e}")
                    raw["failed"].append({"fault": label, "node": node, "error": str(e)})
                    continue
                r["fault"] = label
                raw["rounds"].append(r)
                say(f"{label} {i + 1}/{a.rounds} on {node} (spare {r['replacement']}): healed {r['healed_s']:.2f}s, "
                    f"repaired {r['repaired_s']:.2f}s, back among the spares {r['back_s']:.2f}s")
        return raw
    finally:
        if rec is not None:
            rec.stop.set()
            if thread is not None:
                thread.join(timeout=15)
        teardown(kube_env.down, root, a.keep, True)


def tables(rounds: list[dict], failed: list[dict], notes: list[str]) -> list[Table]:
    cols = ["fault", "stat", "rounds", "healed (spare promoted)", "repaired (reset answered / rebooted)",
            "check Job Complete (1 s resolution)", "back among the spares"]
    rows = []
    for label in FAULTS:
        mine = [r for r in rounds if r["fault"] == label]
        for stat, p in (("median", 50), ("p95", 95), ("max", 100)):
            rows.append([label, stat, len(mine)] + [pct([r.get(m) for r in mine], p) for m in MILESTONES])
    fails = f"{len(failed)} round(s) failed: " + "; ".join(f"{f['fault']} on {f['node']}: {f['error'][:200]}"
                                                          for f in failed) if failed else "no round failed"
    return [Table("Fault to back among the spares, local environment (seconds after the fault)", cols, rows,
                  notes + [fails])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="faults of each kind (taken in turns)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--spares", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=180, help="seconds one round may take")
    ap.add_argument("--budget", type=float, default=0, help="stop starting rounds after this many seconds (0: none)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--from-json", nargs="+", metavar="FILE", help="no run: one table of these runs' rounds")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output("repair_local", a.json)
    exit_on_sigterm()
    if a.from_json:
        docs = [json.loads(Path(f).read_text()) for f in a.from_json]
        rounds = [r for d in docs for r in d["raw"]["rounds"]]
        failed = [f for d in docs for f in d["raw"]["failed"]]
        notes = [f"{len(docs)} runs: " + "; ".join(f"{d['date']} ({d['machine']})" for d in docs)]
        out.emit(tables(rounds, failed, notes), raw={"rounds": rounds, "failed": failed})
        return 0
    raw = run(a)
    notes = [f"Pool of {a.nodes} nodes and {a.spares} spare (kubernetes-spares), no Slurm; {machine()}."]
    out.emit(tables(raw["rounds"], raw["failed"], notes), raw=raw)
    return 0 if raw["rounds"] and not raw["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
