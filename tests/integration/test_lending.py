"""Lending on the local pieces that production's contracts run on: a real API server and scheduler
with kwok GPU nodes, a real Slurm 26.05 reached through slurmrestd with a JWT, the Slinky stand-in
placing NodeSet pods (named as Slinky names them) and running a slurmd per pod, and the reconciler's
runtime. Borrowers are a real Deployment that asks for GPUs and carries `borrower_placement`.

- a pending Slurm job takes an idle node back from its borrowers, and starts on it;
- a fault that finds only lent spares evicts the borrowers (a PodDisruptionBudget honoured for the
  reclaim grace, then forced, and the record says so), then promotes;
- never below the floor of unlent spares, never a node a person drained;
- a lent spare whose machine dies (its kubelet with it) is not waited on: its loan ends, counted as lost, and the
  repair loop retires it (last: its machine stays dead)."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.placement import borrower_placement
from localenv.fake_nodes import fake_node
from gpufleet.waiting import wait_for
from localenv.slinky_standin import NodeSetDef, SlinkyStandIn
from localenv.ports import free_ports
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from gpufleet.reconciler.app import build
from gpufleet.fleetspec import ledger
from gpufleet.fleetspec.faults import Kind
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.fixtures.reconciler_kube import Recorder
from tests.fixtures.slurm_cluster import build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

POOL, PARTITION, NS = "lend", "lendp", "slurm-lend"
ACTIVE = ["kwok-lend-0", "kwok-lend-1"]
SPARES = ["kwok-lend-spare-0", "kwok-lend-spare-1"]
SPARE_TAINT = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
BORROWER = {"app.kubernetes.io/name": "inference"}
NODESET = NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8)


def lending_spec(healing: dict | None = None, **lending):
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": POOL, "node_type": "kwok", "gpu_model": "H100", "gpus_per_node": 8, "cpus_per_node": 8,
                   "memory_per_node": "32Gi", "nodes": 2, "spares": 2, "provider": "kubernetes-spares",
                   "lending": {"spares": True, "idle_nodes": True, "idle_after_seconds": 2, "spare_floor": 1,
                               "reclaim_grace_seconds": 3, "max_lent_fraction": 1.0,
                               "borrowers": {"selector": BORROWER}, **lending}}],
        # the stand-in's NodeSet pods are in NS: the reconciler takes Slurm nodes from that namespace only
        "slurm": {"namespace": NS, "partitions": [{"name": PARTITION, "pools": [POOL]}]},
        "healing": {"grace_period_seconds": 0, "drain_timeout_seconds": 10, "max_unhealthy_fraction": 0.9,
                    "reconciler": {"namespace": "default"}, **(healing or {})},
    })


class World:
    def __init__(self, api, slurm: LocalSlurm, standin: SlinkyStandIn):
        self.api, self.slurm, self.standin = api, slurm, standin
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.rest = SlurmREST(slurm.rest_url, SignedToken(slurm.jwt_key_path, user="slurm"), timeout=10)
        self.rec = None

    def reconciler(self, spec):
        self.rec = build(spec, self.api, slurm=self.rest)
        self.rec.notifier.channels = [Recorder()]
        return self.rec

    def tick(self) -> None:
        """One pass of the operator stand-in and of the reconciler's queue (what their loops do)."""
        self.standin.reconcile_once()
        if self.rec is not None:
            self.rec.sync()
            self.rec.process_due()

    def until(self, what: str, cond, timeout: float = 90.0):
        """Tick until `cond` holds (the shared polling loop; a timeout shows the loans and NodeSet pods)."""
        return wait_for(what, lambda: (self.tick(), cond())[1], timeout, 0.2,
                        explain=lambda: f"nodes: {self.loans()}; pods: {self.nodeset_pods()}")

    def node(self, name):
        return self.core.read_node(name)

    def loans(self) -> dict[str, str]:
        """Nodes on loan (the lending taint) -> the lent label ('' while being reclaimed)."""
        out = {}
        for n in ACTIVE + SPARES:
            node = self.node(n)
            if any(t.key == labels.LENDING_TAINT for t in node.spec.taints or []):
                out[n] = (node.metadata.labels or {}).get(labels.LENT, "")
        return out

    def nodeset_pods(self) -> dict[str, str | None]:
        """Slurm name -> the Kubernetes node its NodeSet pod runs on (None: pending)."""
        return {p.metadata.labels[labels.SLINKY_POD_HOSTNAME]: (p.spec.node_name if p.status.phase == "Running" else None)
                for p in self.core.list_namespaced_pod(NS).items if p.metadata.deletion_timestamp is None}

    def borrowers(self) -> dict[str, str | None]:
        return {p.metadata.name: (p.spec.node_name if p.status.phase == "Running" else None)
                for p in self.core.list_namespaced_pod("default", label_selector="app.kubernetes.io/name=inference").items
                if p.metadata.deletion_timestamp is None}

    def inference(self, replicas: int) -> None:
        pool = lending_spec().pool(POOL)
        body = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "inference", "namespace": "default"},
                "spec": {"replicas": replicas, "selector": {"matchLabels": BORROWER},
                         "template": {"metadata": {"labels": BORROWER},
                                      "spec": {**borrower_placement(pool), "terminationGracePeriodSeconds": 1,
                                               "containers": [{"name": "serve", "image": "registry.example/vllm:1",
                                                               "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
        try:
            self.apps.create_namespaced_deployment("default", body)
        except ApiException as e:
            assert e.status == 409
            self.apps.patch_namespaced_deployment_scale("inference", "default", {"spec": {"replicas": replicas}})

    def events(self, reason: str) -> list[str]:
        return [e.involved_object.name for e in self.core.list_namespaced_event("default").items if e.reason == reason]

    def slurm_state(self, name: str) -> str:
        return self.slurm.scontrol("show", "node", name)

    def reset(self) -> None:
        """Undo what a test did: no borrowers, no loans, no records, roles as declared, Slurm nodes back."""
        self.rec = None
        for kind, name in (("deployment", "inference"), ("pdb", "inference")):
            try:
                if kind == "deployment":
                    self.apps.delete_namespaced_deployment(name, "default", propagation_policy="Foreground")
                else:
                    client.PolicyV1Api(self.api).delete_namespaced_pod_disruption_budget(name, "default")
            except ApiException as e:
                assert e.status == 404
        for p in self.core.list_namespaced_pod("default", label_selector="app.kubernetes.io/name=inference").items:
            try:
                self.core.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=0)
            except ApiException as e:
                assert e.status == 404  # gone with its Deployment meanwhile
        custom = client.CustomObjectsApi(self.api)
        for r in custom.list_cluster_custom_object("gpufleet.io", "v1alpha1", "remediations")["items"]:
            if r["spec"]["pool"] == POOL:
                custom.delete_cluster_custom_object("gpufleet.io", "v1alpha1", "remediations", r["metadata"]["name"])
        for n in ACTIVE + SPARES:
            spare = n in SPARES
            self.core.patch_node(n, {"spec": {"unschedulable": None, "taints": [SPARE_TAINT] if spare else None},
                                     "metadata": {"labels": {labels.ROLE: labels.ROLE_SPARE if spare else labels.ROLE_ACTIVE,
                                                             labels.LENT: None},
                                                  "annotations": {labels.LENT_SINCE: None, labels.RECLAIMING: None,
                                                                  labels.REMEDIATION: None}}})
            Kube(self.api).set_condition(n, "GpuHealthy", "True", "Healthy", "ok")
        self.slurm.run(["scancel", "--full", "-u", "root"], timeout=15)
        for p in self.core.list_namespaced_pod(NS).items:  # one a heal moved to a spare: made again on an active node
            if p.spec.node_name not in ACTIVE and p.metadata.deletion_timestamp is None:
                self.core.delete_namespaced_pod(p.metadata.name, NS)
        self.until("NodeSet pods back on the active nodes", lambda: sorted(
            v for v in self.nodeset_pods().values() if v) == ACTIVE, timeout=60)
        for name in (f"{POOL}-0", f"{POOL}-1"):
            if "DRAIN" in self.slurm_state(name) or "DOWN" in self.slurm_state(name):
                self.slurm.set_node_state(name, "RESUME")


@pytest.fixture(scope="module")
def world(kube_cluster, api, tmp_path_factory) -> Iterator[World]:  # noqa: F811
    core = client.CoreV1Api(api)
    for name in ACTIVE + SPARES:
        role = labels.ROLE_SPARE if name in SPARES else labels.ROLE_ACTIVE
        core.create_node(fake_node(name, {labels.NODE_POOL: POOL, labels.ROLE: role},
                                   [SPARE_TAINT] if name in SPARES else [], cpus=8, memory="32Gi", gpus=8))
    for name in ACTIVE + SPARES:
        kube_cluster.wait_node_ready(name)
    try:  # what the stack declares: the ledger ConfigMap (the reconciler writes its data) and the PriorityClass
        core.create_namespaced_config_map("default", {"metadata": {"name": labels.LENDING_LEDGER}})
    except ApiException as e:
        assert e.status == 409
    try:
        client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": "gpufleet-borrower"}, "value": -1000, "preemptionPolicy": "Never",
             "globalDefault": False, "description": "borrowers of idle GPUs"})
    except ApiException as e:
        assert e.status == 409
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("lending-slurm"), {PARTITION: [POOL]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest)
    slurm.up()
    w = World(api, slurm, SlinkyStandIn(api, slurm, [NODESET], namespace=NS))
    try:
        w.until("NodeSet pods Running on the active nodes",
                lambda: sorted(v for v in w.nodeset_pods().values() if v) == ACTIVE, timeout=90)
        yield w
    finally:
        w.rest.close()
        slurm.down()
        for name in ACTIVE + SPARES:
            try:
                core.delete_node(name)
            except ApiException:
                pass


def test_never_below_the_floor_nor_a_node_a_person_drained(world):
    w = world
    w.reset()
    on_1 = next(s for s, n in w.nodeset_pods().items() if n == "kwok-lend-1")
    w.slurm.set_node_state(on_1, "DRAIN", "bad cable - ops")
    w.reconciler(lending_spec())
    w.until("the idle node and the spare beyond the floor lent",
            lambda: w.loans() == {"kwok-lend-0": labels.LENT_IDLE, "kwok-lend-spare-1": labels.LENT_SPARE})
    end = time.monotonic() + 8
    while time.monotonic() < end:  # and it stays so
        w.tick()
        assert set(w.loans()) == {"kwok-lend-0", "kwok-lend-spare-1"}
        time.sleep(0.3)
    assert "bad cable - ops" in w.slurm_state(on_1)  # the person's drain, untouched
    assert w.nodeset_pods()[on_1] == "kwok-lend-1"
    assert set(w.events("Lent")) >= {"kwok-lend-0", "kwok-lend-spare-1"}
    book = ledger.parse(w.core.read_namespaced_config_map(labels.LENDING_LEDGER, "default").data[POOL], POOL)
    assert sorted((x.node, x.kind, x.gpus) for x in book.loans if x.open) == [
        ("kwok-lend-0", "idle", 8), ("kwok-lend-spare-1", "spare", 8)]
    c = book.capacity
    assert (c.active_lent, c.spares_lent, c.spares_unlent, c.active_idle + c.active_busy, c.gpus_lent) == (1, 1, 1, 1, 16)


def test_a_pending_job_takes_an_idle_node_back_and_starts_on_it(world, kube_cluster):
    w = world
    w.reset()
    w.reconciler(lending_spec())
    w.until("both idle nodes and one spare lent", lambda: set(w.loans()) == {*ACTIVE, "kwok-lend-spare-1"})
    assert all(n is None for n in w.nodeset_pods().values())  # the NodeSet pods gave their GPUs up
    w.inference(3)
    w.until("three borrowers running on the lent nodes",
            lambda: sorted(n for n in w.borrowers().values() if n) == sorted([*ACTIVE, "kwok-lend-spare-1"]))
    jid = w.slurm.sbatch("-p", PARTITION, "-N", "1", "--output=/dev/null", "--wrap", "sleep 600")
    started = time.monotonic()

    def running():
        out = w.slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T %N"]).stdout.split()
        return out if out and out[0] == "RUNNING" else None

    state, on = w.until("the pending job running on a reclaimed node", running, timeout=120)
    took = time.monotonic() - started
    host = w.nodeset_pods()[on]
    assert host in ACTIVE and host not in w.loans()
    assert len([n for n in ACTIVE if n in w.loans()]) == 1  # one node was enough: the other stays lent
    assert "kwok-lend-spare-1" in w.loans()
    assert host in w.events("Reclaiming") and host in w.events("Reclaimed")
    assert host not in w.borrowers().values()  # its borrower was evicted (the Deployment's new one waits)
    book = ledger.parse(w.core.read_namespaced_config_map(labels.LENDING_LEDGER, "default").data[POOL], POOL)
    closed = [x for x in book.loans if x.node == host and not x.open]
    assert closed and closed[-1].end >= closed[-1].start  # the loan ended when the node came back
    assert closed[-1].reclaimed is not None and closed[-1].start <= closed[-1].reclaimed <= closed[-1].end
    print(f"pending job to running on a reclaimed node: {took:.1f}s")

    # its owner asks why it waited: `gpufleet why` tells the reclaim, from the ledger and the Events
    from typer.testing import CliRunner

    from gpufleet.cli import app

    out = CliRunner().invoke(app, ["why", str(jid), "--kubeconfig", str(kube_cluster.kubeconfig_path),
                                   "--slurm-url", w.slurm.rest_url, "--slurm-jwt-key-file", str(w.slurm.jwt_key_path),
                                   "--namespace", "default"])
    assert out.exit_code == 0, out.output
    assert f"{host} was lent to inference and taken back for it: the reclaim took " in out.output, out.output
    assert "why: 1 node(s) asked for by pending Slurm jobs" in out.output, out.output
    assert "its start waited for 1 node(s) taken back from inference" in out.output, out.output
    print(out.output)


def test_a_fault_takes_a_lent_spare_after_its_borrowers_leave_forced_past_the_grace(world):
    w = world
    w.reset()
    w.reconciler(lending_spec(spare_floor=0, idle_nodes=False))
    w.until("both spares lent", lambda: set(w.loans()) == set(SPARES))
    w.inference(2)
    w.until("borrowers on both spares", lambda: sorted(n for n in w.borrowers().values() if n) == SPARES)
    client.PolicyV1Api(w.api).create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "inference"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": BORROWER}}})
    victim = next(s for s, n in w.nodeset_pods().items() if n == "kwok-lend-0")
    Kube(w.api).set_condition("kwok-lend-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")

    def done():
        rs = [r for r in w.rec.store.list() if r.node == "kwok-lend-0" and r.phase.terminal]
        return rs[0] if rs else None

    r = w.until("the fault healed", done, timeout=120)
    assert r.phase is Phase.SUCCEEDED, r.reason
    assert r.replacement in SPARES and r.reclaim_started is not None  # both were lent: one was taken back
    assert "outlasted the 3s reclaim grace" in r.reason and "waited" in r.reason
    promoted = w.node(r.replacement)
    assert not any(t.key in (labels.LENDING_TAINT, labels.SPARE_TAINT) for t in promoted.spec.taints or [])
    assert w.nodeset_pods()[victim] == r.replacement  # Slurm moved onto the reclaimed spare
    assert r.replacement not in w.borrowers().values()
    assert r.replacement in w.events("ReclaimForced")
    other = next(s for s in SPARES if s != r.replacement)
    assert w.loans() == {other: labels.LENT_SPARE}  # the other spare lends on


def test_a_lent_spare_whose_machine_dies_ends_its_loan_as_lost_and_is_retired_never_waited_on(world):
    """No eviction ever ends on a dead kubelet: the loan stands until the loss is read
    (`healing.node_lost_after_seconds`), then the heal takes the spare (nothing to move), ends the loan as lost,
    and the repair loop retires it (kubernetes-spares: nothing can power-cycle it). The other loan goes on."""
    from localenv.fake_nodes import kill_kubelet

    w = world
    w.reset()
    w.reconciler(lending_spec({"node_lost_after_seconds": 30}, spare_floor=0, idle_nodes=False))
    w.until("both spares lent", lambda: set(w.loans()) == set(SPARES))
    w.inference(2)
    w.until("borrowers on both spares", lambda: sorted(n for n in w.borrowers().values() if n) == SPARES)
    dead, other = SPARES
    kill_kubelet(w.core, dead)

    def over():
        rs = [r for r in w.rec.store.list() if r.node == dead and r.repair is not None and r.repair.phase.terminal]
        return rs[0] if rs else None

    r = w.until("the dead spare's heal and repair over", over, timeout=120)
    assert r.kind is Kind.NODE_LOST and r.was_spare and r.phase is Phase.SUCCEEDED, r
    assert r.reclaim_started is None  # its borrowers were never waited on
    assert dead in w.events("LoanLost")
    assert r.repair.phase is RepairPhase.RETIRED and "does not answer" in r.repair.reason, r.repair
    node = w.node(dead)
    assert (node.metadata.labels or {}).get(labels.ROLE) == labels.ROLE_RETIRED
    assert not any(t.key == labels.LENDING_TAINT for t in node.spec.taints or [])  # no longer on loan
    assert w.loans() == {other: labels.LENT_SPARE}  # the other spare lends on

    def closed():  # the books close it at the lending pass that follows
        book = ledger.parse(w.core.read_namespaced_config_map(labels.LENDING_LEDGER, "default").data[POOL], POOL)
        return [loan for loan in book.loans if loan.node == dead] and book.open_loan_of(dead) is None

    w.until("the dead spare's loan closed in the ledger", closed, timeout=30)
