"""`bench/lending.py --real`: the two delays of lending, measured on the real local pieces.

The world of tests/integration/test_lending.py (a real API server and scheduler with kwok GPU nodes,
a real Slurm 26.05 over slurmrestd, the Slinky stand-in placing NodeSet pods, borrowers as a real
Deployment), but with the reconciler running as it does in its pod (`Manager.run`: informers, the
work queue, its workers) and the stand-in in its own loop, instead of the test's step-by-step ticks.
Each round starts from the declared state (the test's `World.reset`) and measures one of:

- reclaim: both active nodes and a spare lent with borrowers on them; `sbatch -N1` -> the job RUNNING
  (on a node taken back from its borrowers);
- heal, lent spare: both spares lent with borrowers (which exit on SIGTERM), a fault on an active node
  -> its record Succeeded (the chosen spare was reclaimed first);
- heal, unlent spare: the same fault with the spares kept unlent (a floor of 2).
"""
from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from pathlib import Path

from _output import load, machine, pct, say, Table  # noqa: E402
from _cluster import install_crd_and_namespace, new_kube, teardown  # noqa: E402

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurmError
from tests.integration import test_lending as lt


class Bench(lt.World):
    """The test's world; the reconciler and the stand-in run in their own threads."""

    def __init__(self, *args, interval: float):
        super().__init__(*args)
        self.stop_all = threading.Event()
        self.interval = interval
        self.thread: threading.Thread | None = None
        self.standin_thread = threading.Thread(target=self.standin.run, args=(self.stop_all, interval), daemon=True)
        self.standin_thread.start()

    def tick(self) -> None:  # the loops run by themselves
        pass

    def slurm_state(self, name: str) -> str:
        """As the test's, but waits for the Slurm node to register: here the stand-in starts its slurmd
        on its own pass, after the pod shows Running."""
        def registered() -> str | None:
            try:
                return super(Bench, self).slurm_state(name)
            except LocalSlurmError:
                return None

        return wait_for(f"Slurm node {name} registered", registered, 30, interval=0.2)

    def until(self, what: str, cond, timeout: float = 90.0):
        if not what.startswith("NodeSet pods back"):
            return super().until(what, cond, timeout)

        def back():  # after a heal, a NodeSet pod runs on the promoted spare: the stand-in places it anew
            for p in self.core.list_namespaced_pod(lt.NS).items:
                if p.spec.node_name and p.spec.node_name not in lt.ACTIVE and p.metadata.deletion_timestamp is None:
                    self.core.delete_namespaced_pod(p.metadata.name, lt.NS, grace_period_seconds=0)
            return cond()

        return super().until(what, back, timeout)

    def start(self, spec) -> None:
        rec = self.reconciler(spec)
        self.thread = threading.Thread(target=rec.run, name="reconciler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.rec is not None:
            self.rec.stop.set()
            if self.thread:
                self.thread.join(timeout=15)
        self.rec, self.thread = None, None

    def reset(self) -> None:
        """The test's reset, after the borrowers are gone (here the scheduler and the garbage collector
        race the test's pod deletes, which expect the pods to still be there)."""
        self.stop()
        policy = lt.client.PolicyV1Api(self.api)
        for delete in (lambda: self.apps.delete_namespaced_deployment("inference", "default"),
                       lambda: policy.delete_namespaced_pod_disruption_budget("inference", "default")):
            try:
                delete()
            except lt.ApiException as e:
                if e.status != 404:
                    raise
        def gone() -> bool:
            pods = self.core.list_namespaced_pod("default", label_selector="app.kubernetes.io/name=inference").items
            for p in pods:
                try:
                    self.core.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=0)
                except lt.ApiException as e:
                    if e.status != 404:
                        raise
            return not pods

        wait_for("the borrower pods gone", gone, 60, interval=0.2)
        super().reset()

    def reclaims_since(self, t: float) -> list[str]:
        """Active nodes a reclaim began on since `t` (their Reclaiming Events)."""
        return [e.involved_object.name for e in self.core.list_namespaced_event("default").items
                if e.reason == "Reclaiming" and e.involved_object.name in lt.ACTIVE
                and (e.event_time or e.last_timestamp or e.metadata.creation_timestamp).timestamp() >= t - 1]

    def state(self) -> str:
        """What a failed round leaves, for its report."""
        recs = [(r.name, r.phase.value, r.replacement, r.reclaim_started, r.reason[-200:], r.last_error[-200:])
                for r in (self.rec.store.list() if self.rec else [])]
        nodes = {}
        for n in lt.ACTIVE + lt.SPARES:
            node = self.node(n)
            nodes[n] = ((node.metadata.labels or {}).get(lt.labels.ROLE), (node.metadata.labels or {}).get(lt.labels.LENT),
                        [t.key for t in node.spec.taints or []], node.spec.unschedulable,
                        (node.metadata.annotations or {}).get(lt.labels.RECLAIMING))
        return (f"records {recs}; nodes {nodes}; borrowers {self.borrowers()}; NodeSet pods {self.nodeset_pods()}; "
                f"Slurm {self.slurm.run(['sinfo', '-N', '-h', '-o', '%N %T %E']).stdout.strip()!r}")

    def close(self) -> None:
        self.stop()
        self.stop_all.set()
        self.standin_thread.join(timeout=10)


def reclaim_round(w: Bench) -> dict:
    w.reset()
    w.start(lt.lending_spec())
    w.until("both idle nodes and one spare lent", lambda: set(w.loans()) == {*lt.ACTIVE, "kwok-lend-spare-1"}, 90)
    w.inference(3)
    w.until("three borrowers running", lambda: sorted(n for n in w.borrowers().values() if n)
            == sorted([*lt.ACTIVE, "kwok-lend-spare-1"]), 90)
    jid = w.slurm.sbatch("-p", lt.PARTITION, "-N", "1", "--output=/dev/null", "--wrap", "sleep 600")
    t0, t_wall = time.monotonic(), time.time()
    taken = None

    def running() -> list[str] | None:
        nonlocal taken
        if taken is None and len([n for n in lt.ACTIVE if w.loans().get(n) == lt.labels.LENT_IDLE]) < 2:
            taken = time.monotonic() - t0  # the lent label gone from one: the reclaim began
        out = w.slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T %N"]).stdout.split()
        return out if out and out[0] == "RUNNING" else None

    out = wait_for(f"job {jid} running", running, 120, interval=0.1, explain=lambda: f"loans {w.loans()}")
    took = time.monotonic() - t0
    host = w.nodeset_pods().get(out[1])
    time.sleep(3)  # a few more passes: does a second loan go for the same one-node job?
    return {"pending_to_running_s": took, "reclaim_began_s": taken, "slurm_node": out[1], "node": host,
            "idle_loans_taken_back": len(set(w.reclaims_since(t_wall))),
            "reclaiming_events": w.reclaims_since(t_wall), "load": load()}


def heal_round(w: Bench, lent: bool, pdb: bool = False) -> dict:
    w.reset()
    spec = lt.lending_spec(spare_floor=0, idle_nodes=False) if lent else lt.lending_spec(spare_floor=2, idle_nodes=False)
    w.start(spec)
    if lent:
        w.until("both spares lent", lambda: set(w.loans()) == set(lt.SPARES), 90)
        w.inference(2)
        w.until("borrowers on both spares", lambda: sorted(n for n in w.borrowers().values() if n) == lt.SPARES, 90)
        if pdb:  # the borrowers may not leave: the reclaim waits out the grace, then forces
            lt.client.PolicyV1Api(w.api).create_namespaced_pod_disruption_budget("default", {
                "metadata": {"name": "inference"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": lt.BORROWER}}})
    else:
        time.sleep(2 * w.interval)  # a lending pass or two: nothing is lent
        assert not w.loans(), w.loans()
    t0 = time.time()
    lt.Kube(w.api).set_condition("kwok-lend-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    r = wait_for("the fault healed", lambda: next((r for r in w.rec.store.list()
                                                   if r.node == "kwok-lend-0" and r.phase.terminal), None),
                 120, interval=0.1, explain=lambda: str(w.state()))
    if r.phase is not lt.Phase.SUCCEEDED:
        raise RuntimeError(f"{r.name} ended {r.phase.value}: {r.reason}")
    times = dict(r.phase_times)
    m = re.search(r"waited (\d+)s for the borrowers", r.reason)
    reclaim = (times["Resuming"] - r.reclaim_started).total_seconds() if r.reclaim_started else None
    return {"fault_to_healthy_s": times["Succeeded"].timestamp() - t0, "record_s":
            (times["Succeeded"] - r.created).total_seconds(), "reclaim_wait_s": reclaim,
            "reason_waited_s": int(m.group(1)) if m else None, "replacement": r.replacement,
            "forced": "outlasted" in r.reason, "load": load()}


def run(a: argparse.Namespace) -> tuple[list[Table], dict]:
    from localenv.ports import free_ports
    from localenv.slurm import LocalSlurm
    from tests.fixtures.slurm_cluster import build_slurm_root

    root = a.root or Path(tempfile.mkdtemp(prefix="gf-lending-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # bound into the Slurm root: its daemons' users must get through
    say(f"lending, real pieces: {machine()}; work folder {root}; {a.repeat} rounds of each")
    kube = new_kube(root / "kube")
    slurm = w = None
    raw: dict[str, list[dict]] = {"reclaim": [], "heal_unlent": [], "heal_lent": [], "heal_lent_pdb": []}
    try:
        say("control plane up ...")
        kube.up()
        api = kube.api_client()
        install_crd_and_namespace(api, "default")
        core = lt.client.CoreV1Api(api)
        for name in lt.ACTIVE + lt.SPARES:
            role = lt.labels.ROLE_SPARE if name in lt.SPARES else lt.labels.ROLE_ACTIVE
            core.create_node(lt.fake_node(name, {lt.labels.NODE_POOL: lt.POOL, lt.labels.ROLE: role},
                                          [lt.SPARE_TAINT] if name in lt.SPARES else [], cpus=8, memory="32Gi", gpus=8))
        for name in lt.ACTIVE + lt.SPARES:
            kube.wait_node_ready(name)
        lt.client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": "gpufleet-borrower"}, "value": -1000, "preemptionPolicy": "Never",
             "globalDefault": False, "description": "borrowers of idle GPUs"})
        say("Slurm up ...")
        ctld, rest = free_ports(2)
        (root / "slurm").mkdir()
        slurm = LocalSlurm(root / "slurm", {lt.PARTITION: [lt.POOL]}, root=build_slurm_root(), ctld_port=ctld,
                           rest_port=rest)
        slurm.up()
        w = Bench(api, slurm, lt.SlinkyStandIn(api, slurm, [lt.NODESET], namespace=lt.NS), interval=a.standin_interval)
        w.until("NodeSet pods Running on the active nodes",
                lambda: sorted(v for v in w.nodeset_pods().values() if v) == lt.ACTIVE, timeout=90)
        raw["failed"] = []

        def attempt(key, fn, *args):
            try:
                return fn(*args)
            except (TimeoutError, RuntimeError, AssertionError) as e:
                say(f"{key} round failed: {e}")
                raw["failed"].append({"round": key, "error": str(e)})
                return None

        for i in range(a.repeat):
            r = attempt("reclaim", reclaim_round, w)
            if r is None:
                continue
            raw["reclaim"].append(r)
            say(f"reclaim {i + 1}/{a.repeat}: pending -> running on {r['node']} in {r['pending_to_running_s']:.2f}s "
                f"(reclaim began after {r['reclaim_began_s'] or 0:.2f}s)")
            for lent, pdb, key in ((False, False, "heal_unlent"), (True, False, "heal_lent"), (True, True, "heal_lent_pdb")):
                h = attempt(key, heal_round, w, lent, pdb)
                if h is None:
                    continue
                raw[key].append(h)
                say(f"heal {i + 1}/{a.repeat} ({key}, spare {h['replacement']}): fault -> healthy "
                    f"{h['fault_to_healthy_s']:.2f}s, reclaim wait {h['reclaim_wait_s'] or 0:.2f}s, forced {h['forced']}")
    finally:
        if w is not None:
            w.close()
            w.rest.close()
        if slurm is not None:
            slurm.down()
        teardown(kube.down, root, a.keep, a.root is None)
    return real_tables(raw), raw


def _row(name: str, xs: list) -> list:
    xs = [x for x in xs if x is not None]
    return [name, len(xs), pct(xs, 50), pct(xs, 95), max(xs) if xs else None]


def real_tables(raw: dict[str, list[dict]]) -> list[Table]:
    lent = [r["fault_to_healthy_s"] for r in raw["heal_lent"]]
    unlent = [r["fault_to_healthy_s"] for r in raw["heal_unlent"]]
    rows = [
        _row("pending job -> running on a reclaimed node", [r["pending_to_running_s"] for r in raw["reclaim"]]),
        _row("  of which: until the reclaim began", [r["reclaim_began_s"] for r in raw["reclaim"]]),
        _row("fault -> healthy, unlent spare", unlent),
        _row("fault -> healthy, lent spare", lent),
        _row("  of which: the record's wait for the borrowers", [r["reclaim_wait_s"] for r in raw["heal_lent"]]),
        _row("fault -> healthy, lent spare, borrowers kept by a PDB",
             [r["fault_to_healthy_s"] for r in raw["heal_lent_pdb"]]),
        _row("  of which: the record's wait for the borrowers", [r["reclaim_wait_s"] for r in raw["heal_lent_pdb"]]),
    ]
    taken = [r["idle_loans_taken_back"] for r in raw["reclaim"]]
    loads = [r["load"] for k, v in raw.items() if k != "failed" for r in v]
    added = (pct(lent, 50) - pct(unlent, 50)) if lent and unlent else None
    pdb = [r["fault_to_healthy_s"] for r in raw["heal_lent_pdb"]]
    added_pdb = (pct(pdb, 50) - pct(unlent, 50)) if pdb and unlent else None
    notes = [f"failed rounds: {len(raw.get('failed', []))} ({', '.join(sorted(set(f['round'] for f in raw['failed'])))})"
             if raw.get("failed") else "failed rounds: 0",
             f"idle loans taken back for a one-node job: {sorted(set(taken))} (1 is right; rounds with 2: "
             f"{sum(1 for t in taken if t > 1)} of {len(taken)})" if taken else "",
             f"a lent spare whose borrowers are kept by a PDB adds {added_pdb:.2f}s (the reclaim grace, then forced)"
             if added_pdb is not None else "",
             f"a lent spare adds {added:.2f}s to fault -> healthy (median minus median)" if added is not None else "",
             f"load average during the rounds: {min(loads):.2f} - {max(loads):.2f}" if loads else "",
             "lending: idle after 2 s, reclaim grace 3 s, borrowers' terminationGracePeriodSeconds 1; Slinky stand-in "
             "pass every second; healing grace period 0 s"]
    return [Table(f"Lending on the real local pieces, seconds ({machine()})",
                  ["measure", "n", "median", "p95", "max"], rows, [n for n in notes if n])]
