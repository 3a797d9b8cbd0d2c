"""A NodeSet image change rolled out by slurm-operator v1.2.1 (the stand-in follows nodeset_sync.go syncRollingUpdate:
maxUnavailable 25 %, each condemned Slurm node drained with the operator's reason over any other, its pod deleted
once idle and made again) while gpufleet heals a fault and repairs the machine, while a person holds one Slurm node
with a drain, and while a spare of the pool is lent. The world is test_two_faults.py's: a real API server and
scheduler with kwok GPU nodes, the GPU hardware stand-in, a real Slurm 26.05 through slurmrestd (the local stack's
ReturnToService=2), the Slinky stand-in, the reconciler as built for a cluster.

Each ends with the heal and the repair done once, the person's drain on their Slurm node (put back by gpufleet:
reconciler/core/person_holds.py), the lent spare still lent, and every NodeSet pod at the new revision."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from localenv import fake_nodes
from localenv import slinky_update as upd
from localenv.ports import free_ports
from localenv.slinky_standin import POD_CORDON_ANNOTATION, NodeSetDef, SlinkyStandIn
from localenv.slurm import LocalSlurm
from tests.fixtures.slurm_cluster import build_slurm_root
from tests.integration.test_two_faults import World, proven

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NS = "slurm-nsu"
POOL = "nsu"  # a name no other test of the session uses
K = "kwok-"
NODES = [f"{K}{POOL}-{i}" for i in range(3)]
SPARES = [f"{K}{POOL}-spare-{i}" for i in range(2)]
HOLD = "maintenance: alice"
BORROWER = {"app.kubernetes.io/name": "inference"}


def nodeset(image: str = "") -> NodeSetDef:
    return NodeSetDef(POOL, 3, {labels.NODE_POOL: POOL}, [], gpus=8, image=image)


def spec():
    """Three nodes and two spares; one spare may be lent (the floor keeps one unlent for a heal); repairs reboot."""
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": POOL, "node_type": "kwok", "gpu_model": "H100", "gpus_per_node": 8, "cpus_per_node": 8,
                   "memory_per_node": "32Gi", "nodes": 3, "spares": 2, "provider": "kubernetes-spares",
                   "repair": {"in_place": False},
                   "lending": {"spares": True, "idle_nodes": False, "spare_floor": 1, "max_lent_fraction": 1.0,
                               "borrowers": {"selector": BORROWER}}}],
        "slurm": {"namespace": NS, "partitions": [{"name": f"{POOL}p", "pools": [POOL]}]},
        "healing": {"grace_period_seconds": 0, "drain_timeout_seconds": 10, "max_unhealthy_fraction": 1.0,
                    "reconciler": {"namespace": "default"}},
    })


class UpdateWorld(World):
    def reconciler(self, fraction: float = 1.0):
        from tests.fixtures.reconciler_kube import reconciler
        self.rec = reconciler(self.api, spec(), slurm=self.rest)
        return self.rec

    def nodeset_pods(self, nodeset: str | None = None) -> dict[str, str | None]:
        """Slurm name -> the Kubernetes node its NodeSet pod runs on (None: pending), in this world's namespace."""
        return {name: (p.spec.node_name if p.status.phase == "Running" else None) for name, p in self.pods().items()}

    def pods(self) -> dict[str, client.V1Pod]:
        return {p.metadata.name: p for p in self.core.list_namespaced_pod(NS).items
                if p.metadata.deletion_timestamp is None}

    def updated(self, revision: str) -> bool:
        ps = self.pods()
        return len(ps) == 3 and all(
            p.status.phase == "Running" and (p.metadata.labels or {}).get(upd.REVISION_LABEL) == revision
            and not (p.metadata.annotations or {}).get(POD_CORDON_ANNOTATION) for p in ps.values())

    def slurm_node(self, name: str):
        return next(n for n in self.rest.nodes() if n.name == name)

    def lent(self) -> list[str]:
        return sorted(n for n in SPARES if (self.core.read_node(n).metadata.labels or {}).get(labels.LENT))


@pytest.fixture(scope="module")
def world(kube_cluster, api, tmp_path_factory) -> Iterator[UpdateWorld]:  # noqa: F811
    core = client.CoreV1Api(api)
    for node in fake_nodes.fleet_nodes(spec(), prefix=K)[1:]:
        core.create_node(node)
    for name in NODES + SPARES:
        kube_cluster.wait_node_ready(name)
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("nodeset-update-slurm"), {f"{POOL}p": [POOL]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest)
    slurm.up()
    w = UpdateWorld(api, slurm, SlinkyStandIn(api, slurm, [nodeset()], namespace=NS))
    try:
        w.until("NodeSet pods Running on the active nodes",
                lambda: sorted(v or "" for v in w.nodeset_pods().values()) == NODES, timeout=90)
        yield w
    finally:
        w.rest.close()
        slurm.down()
        for name in NODES + SPARES:
            try:
                core.delete_node(name)
            except ApiException:
                pass


def test_an_image_change_during_a_heal_and_a_repair_with_a_persons_drain_and_a_lent_spare(world):
    """The update starts while the heal evicts the faulted node's pod: the operator drains the person's Slurm node
    with its own reason (overriding theirs), deletes and makes it again; gpufleet puts the person's drain back.
    The heal and the repair each run once; no new pod lands on a lent spare; every pod ends at the new revision."""
    w = world
    w.reconciler()
    held = f"{POOL}-2"
    w.until("both spares proven and one lent", lambda: all(proven(w, s) for s in SPARES) and len(w.lent()) == 1,
            timeout=120)
    lent = w.lent()
    on = w.nodeset_pods()
    held_machine, faulted = on[held], on[f"{POOL}-0"]
    held_pod = w.pods()[held].metadata.uid
    w.slurm.run(["scontrol", "update", f"NodeName={held}", "State=DRAIN", f"Reason={HOLD}"], timeout=15)
    w.until("the person's drain noted on its machine", lambda: held in (
        w.core.read_node(held_machine).metadata.annotations or {}).get(labels.PERSON_HOLDS, ""))
    by_person = w.slurm_node(held).reason_set_by

    w.fault(faulted)
    w.until("the heal under way", lambda: (r := w.record(faulted)) is not None
            and r.phase not in (Phase.DETECTED, Phase.SLURM_DRAINING))
    w.standin.fixed = [nodeset("slurmd:v2")]
    revision = upd.revision(nodeset("slurmd:v2").resource(NS))
    def done() -> bool:
        r = w.record(faulted)
        return (w.updated(revision) and r is not None and r.phase is Phase.SUCCEEDED and r.repair is not None
                and r.repair.phase is RepairPhase.RETURNED)
    w.until("the update rolled out, the heal and the repair over", done, timeout=420)

    # The held pod was replaced (idle and drained, it is deleted at once: IsNodeDrained; its preStop's DOWN overwrote
    # the reason); the drain is there again in the person's words, written by the reconciler's Slurm user.
    assert w.pods()[held].metadata.uid != held_pod
    n = w.until("the person's drain there", lambda: (n := w.slurm_node(held)).reason == HOLD and "DRAIN" in n.states
                and n, timeout=15)
    assert n.reason_set_by != by_person, (n.reason_set_by, by_person)
    (rec,) = [r for r in w.records() if r.node == faulted]  # healed once
    phases = [p for p, _ in rec.phase_times]
    assert len(phases) == len(set(phases)), phases  # no step repeated
    assert not [r for r in w.records() if r.pool == POOL and r.node != faulted]  # no other node faulted (of this pool: the API server is shared)
    on = {p.spec.node_name for p in w.pods().values()}
    assert not on & set(w.lent()) and len(on) == 3  # the new pods on three unlent machines
    assert lent  # a spare was on loan through it all (the floor may take it back once the heal took the other)
    assert w.slurm_node(held).reason == HOLD
