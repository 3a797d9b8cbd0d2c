"""Two faults in one small pool, on the local pieces production's contracts run on: a real API server, scheduler
and Job controller with kwok GPU nodes, the GPU hardware stand-in the local control plane runs (a reboot, a
health check's answer), a real Slurm 26.05 reached through slurmrestd with a JWT, the Slinky stand-in making
NodeSet pods again under the same name (slurm-operator v1.2.1's StatefulSet mode) with a slurmd per pod, and
the reconciler as built for a cluster.

- two heals, one spare: a 2-node job's nodes fault together; the scheduler puts the Slurm node of the
  remediation waiting for a spare on the spare promoted for the other. Neither heal waits on the other: the
  job runs again and both faulted nodes end repaired;
- the storm brake counts nodes unhealthy now: a fault minutes after another node was healed, repaired and
  returned is not held."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.node_repair import parse_check
from gpufleet.waiting import wait_for
from localenv import fake_nodes
from localenv.gpu_hardware_standin import REBOOT_FIXES
from localenv.ports import free_ports
from localenv.slinky_standin import NodeSetDef, SlinkyStandIn, pod_manifest
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.fixtures.reconciler_kube import reconciler
from tests.fixtures.slurm_cluster import build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NS = "slurm-two"
TWO, BRAKE = "tf2", "tfb"  # one pool per test: two nodes and one spare each (names no other test of the session uses)
K = "kwok-"  # the Kubernetes nodes' prefix: the Slurm nodes are the NodeSets' (named after the pools), two-0 ...
PARTITIONS = {f"{TWO}p": [TWO], f"{BRAKE}p": [BRAKE]}
NODESETS = [NodeSetDef(TWO, 2, {labels.NODE_POOL: TWO}, [], gpus=8),
            NodeSetDef(BRAKE, 2, {labels.NODE_POOL: BRAKE}, [], gpus=8)]


def spec(fraction: float):
    """Two pools of two nodes and a spare each; repairs reboot (never in place: a heal that waits for a spare
    gets one only when another node comes back)."""
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": p, "node_type": "kwok", "gpu_model": "H100", "gpus_per_node": 8, "cpus_per_node": 8,
                   "memory_per_node": "32Gi", "nodes": 2, "spares": 1, "provider": "kubernetes-spares",
                   "repair": {"in_place": False}} for p in (TWO, BRAKE)],
        "slurm": {"namespace": NS, "partitions": [{"name": f"{p}p", "pools": [p]} for p in (TWO, BRAKE)]},
        "healing": {"grace_period_seconds": 0, "drain_timeout_seconds": 10, "max_unhealthy_fraction": fraction,
                    "reconciler": {"namespace": "default"}},
    })


class World:
    def __init__(self, api, slurm: LocalSlurm, standin: SlinkyStandIn):
        self.api, self.slurm, self.standin = api, slurm, standin
        self.core, self.kube = client.CoreV1Api(api), Kube(api)
        self.rest = SlurmREST(slurm.rest_url, SignedToken(slurm.jwt_key_path, user="slurm"), timeout=10)
        self.rec = None
        self.operator = True  # the stand-in runs its passes (a test pauses it to order what the scheduler sees)

    def reconciler(self, fraction: float):
        self.rec = reconciler(self.api, spec(fraction), slurm=self.rest)
        return self.rec

    def tick(self) -> None:
        if self.operator:
            self.standin.reconcile_once()
        if self.rec is not None:
            self.rec.sync()
            self.rec.process_due()

    def until(self, what: str, cond, timeout: float = 120.0):
        return wait_for(what, lambda: (self.tick(), cond())[1], timeout, 0.2,
                        explain=lambda: f"records: {self.records()}; pods: {self.nodeset_pods()}")

    def records(self) -> list:
        return self.rec.store.list() if self.rec is not None else []

    def record(self, node: str):
        mine = [r for r in self.records() if r.node == node]
        return max(mine, key=lambda r: r.created) if mine else None

    def nodeset_pods(self, nodeset: str | None = None) -> dict[str, str | None]:
        """Slurm name -> the Kubernetes node its NodeSet pod runs on (None: pending)."""
        return {p.metadata.labels[labels.SLINKY_POD_HOSTNAME]: (p.spec.node_name if p.status.phase == "Running" else None)
                for p in self.core.list_namespaced_pod(NS).items if p.metadata.deletion_timestamp is None
                and (nodeset is None or p.metadata.labels[labels.SLINKY_POD_HOSTNAME].startswith(nodeset))}

    def role(self, node: str) -> str:
        return self.core.read_node(node).metadata.labels[labels.ROLE]

    def fault(self, node: str) -> None:
        """XID 79 on `node`, whose GPU a reboot fixes (what the test sets, and the reconciler never reads)."""
        self.core.patch_node(node, {"metadata": {"annotations": {labels.SIMULATED_GPU_STATE: REBOOT_FIXES}}})
        self.kube.set_condition(node, "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")

    def job(self, jid: int) -> tuple[str, str]:
        out = self.slurm.run(["squeue", "-h", "-j", str(jid), "-o", "%T %N"]).stdout.split()
        return (out[0], out[1] if len(out) > 1 else "") if out else ("", "")


@pytest.fixture(scope="module")
def world(kube_cluster, api, tmp_path_factory) -> Iterator[World]:  # noqa: F811
    core = client.CoreV1Api(api)
    for node in fake_nodes.fleet_nodes(spec(1.0), prefix=K)[1:]:  # the pools' nodes and spares
        core.create_node(node)
    for p in (TWO, BRAKE):
        for name in (f"{K}{p}-0", f"{K}{p}-1", f"{K}{p}-spare-0"):
            kube_cluster.wait_node_ready(name)
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("two-faults-slurm"), PARTITIONS, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest)
    slurm.up()
    w = World(api, slurm, SlinkyStandIn(api, slurm, NODESETS, namespace=NS))
    try:
        w.until("NodeSet pods Running on the active nodes", lambda: sorted(v or "" for v in w.nodeset_pods().values())
                == sorted(f"{K}{p}-{i}" for p in (TWO, BRAKE) for i in range(2)), timeout=90)
        yield w
    finally:
        w.rest.close()
        slurm.down()
        for p in (TWO, BRAKE):
            for name in (f"{K}{p}-0", f"{K}{p}-1", f"{K}{p}-spare-0"):
                try:
                    core.delete_node(name)
                except ApiException:
                    pass


def proven(w: World, node: str) -> bool:
    n = w.core.read_node(node)
    check = parse_check((n.metadata.annotations or {}).get(labels.HEALTH_CHECK))
    return check is not None and check.proves(n.status.node_info.boot_id)


def test_two_nodes_of_one_job_faulting_together_with_one_spare_both_heal_and_both_are_repaired(world):
    """The scheduler gives the spare promoted for one remediation to the other's Slurm node (the pod made first
    takes the only node that takes it). Before, each heal waited on the other for good: one in Resuming (its
    pod could be placed nowhere), one in WaitingForSpare; neither node was repaired, so no spare came back."""
    w = world
    w.reconciler(1.0)  # the brake never holds two faults of two nodes here: the heals are the point
    w.until("the spare proven", lambda: proven(w, f"{K}{TWO}-spare-0"))
    jid = w.slurm.sbatch("--requeue", "-p", f"{TWO}p", "-N", "2", "--output=/dev/null", "--wrap", "sleep 3600")
    w.until("the 2-node job running", lambda: w.job(jid)[0] == "RUNNING")

    w.operator = False  # the operator's pass waits: both NodeSet pods are made again once the heals are placed
    w.fault(f"{K}{TWO}-0")
    w.fault(f"{K}{TWO}-1")
    w.until("one heal promoted the spare, the other waits for a spare", lambda: sorted(
        (r.phase.value, r.replacement or "") for r in (w.record(f"{K}{TWO}-0"), w.record(f"{K}{TWO}-1")) if r) == [
        (Phase.RESUMING.value, f"{K}{TWO}-spare-0"), (Phase.WAITING_FOR_SPARE.value, "")])
    promoted = next(n for n in (f"{K}{TWO}-0", f"{K}{TWO}-1") if w.record(n).replacement)
    waiting = next(n for n in (f"{K}{TWO}-0", f"{K}{TWO}-1") if n != promoted)
    (theirs,) = w.record(waiting).slurm_nodes
    # The operator makes the waiting heal's Slurm node's pod first (the real one makes missing pods in ordinal
    # order, as they were deleted): the scheduler puts it on the only node that takes a NodeSet pod, the spare
    # promoted for the other heal.
    nodeset = next(n for n in w.standin.nodesets() if n["metadata"]["name"] == TWO)
    w.core.create_namespaced_pod(NS, pod_manifest(nodeset, int(theirs.rsplit("-", 1)[1]), NS))
    w.until(f"{theirs}'s pod on the promoted spare", lambda: w.nodeset_pods(TWO).get(theirs) == f"{K}{TWO}-spare-0")
    w.operator = True

    w.until("both heals over", lambda: all(w.record(n).phase is Phase.SUCCEEDED for n in (promoted, waiting)),
            timeout=300)
    assert w.record(waiting).replacement == f"{K}{TWO}-spare-0" and "came back on" in w.record(waiting).reason
    assert f"{TWO}-spare-0 took Slurm node(s) {theirs}" in w.record(promoted).reason
    w.until("both faulted nodes repaired", lambda: all(
        w.record(n).repair is not None and w.record(n).repair.phase is RepairPhase.RETURNED for n in (promoted, waiting)),
        timeout=240)
    w.until("the job running again on two Slurm nodes", lambda: w.job(jid)[0] == "RUNNING", timeout=60)
    hosts = w.nodeset_pods(TWO)
    assert None not in hosts.values() and len(set(hosts.values())) == 2, hosts
    # the node promoted for the waiting heal once it came back, repaired: the other stays a spare
    assert sorted(w.role(n) for n in (f"{K}{TWO}-0", f"{K}{TWO}-1", f"{K}{TWO}-spare-0")) == \
        [labels.ROLE_ACTIVE, labels.ROLE_ACTIVE, labels.ROLE_SPARE]
    w.slurm.run(["scancel", str(jid)], timeout=15)


def test_a_fault_minutes_after_another_nodes_heal_and_repair_is_not_held_by_the_brake(world):
    """Two nodes, brake at 50 %: one node's fault is healed on the spare and the node repaired and returned;
    the other node's fault, within the brake's window, is one unhealthy node of two: replaced, never Held."""
    w = world
    w.reconciler(0.5)
    w.until("the spare proven", lambda: proven(w, f"{K}{BRAKE}-spare-0"))
    w.fault(f"{K}{BRAKE}-0")
    w.until(f"{BRAKE}-0 healed, repaired and returned", lambda: (r := w.record(f"{K}{BRAKE}-0")) is not None
            and r.phase is Phase.SUCCEEDED and r.repair is not None and r.repair.phase is RepairPhase.RETURNED,
            timeout=240)
    assert w.role(f"{K}{BRAKE}-0") == labels.ROLE_SPARE
    w.until(f"{BRAKE}-0 proven again", lambda: proven(w, f"{K}{BRAKE}-0"))
    w.fault(f"{K}{BRAKE}-1")
    w.until(f"{BRAKE}-1's heal over", lambda: (r := w.record(f"{K}{BRAKE}-1")) is not None and r.phase.terminal,
            timeout=120)
    r = w.record(f"{K}{BRAKE}-1")
    assert r.phase is Phase.SUCCEEDED and r.replacement == f"{K}{BRAKE}-0", r
    assert Phase.HELD.value not in [p for p, _ in r.phase_times], r.phase_times
