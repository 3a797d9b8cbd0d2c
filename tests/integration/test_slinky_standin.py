"""The Slinky operator stand-in against the real control plane (kube-scheduler places its pods on
kwok nodes) and a real Slurm 26.05: pod names and hostnames, slurmd registered under the pod
hostname with the operator's comment, the cordon rule, a pod moved to a promoted spare."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleetspec import labels
from localenv.slinky_standin import (CORDON_REASON_ANNOTATION, POD_HOSTNAME_LABEL, PREFIX, NodeSetDef,
                                              SlinkyStandIn)
from localenv.slurm import POD_TERMINATING_REASON, LocalSlurm, free_ports
from gpufleet.waiting import wait_for
from localenv.fake_nodes import fake_node
from reconciler.adapters.slurm.scontrol import SlurmCLI
from tests.fixtures.slurm_cluster import build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NS = "slinky-it"
POOL = "pool-a"
KUBE_NODES = ["kwok-a-0", "kwok-a-1"]
SPARE = "kwok-a-spare-0"
SPARE_TAINT = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
NODESET = NodeSetDef(POOL, 2, {labels.POOL: POOL}, [], gpus=8, uid="nodeset-uid-a")


@pytest.fixture(scope="module")
def world(kube_cluster, tmp_path_factory) -> Iterator[tuple[SlinkyStandIn, client.CoreV1Api, SlurmCLI]]:
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    for name in KUBE_NODES + [SPARE]:
        taints = [SPARE_TAINT] if name == SPARE else []
        core.create_node(fake_node(name, {labels.POOL: POOL}, taints, cpus=8, memory="32Gi", gpus=8))
    for name in KUBE_NODES + [SPARE]:
        kube_cluster.wait_node_ready(name)
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("standin-slurm"), {"gpu": [POOL]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest)
    slurm.up()
    try:
        yield SlinkyStandIn(api, slurm, [NODESET], namespace=NS), core, SlurmCLI(env=slurm.env(), timeout=20)
    finally:
        slurm.down()
        for name in KUBE_NODES + [SPARE]:
            try:
                core.delete_node(name)
            except ApiException:
                pass


def settle(standin: SlinkyStandIn, what: str, cond, timeout: float = 60):
    """Run the stand-in's passes until `cond()` holds (as its loop would)."""
    def step():
        standin.reconcile_once()
        return cond()
    return wait_for(what, step, timeout, interval=0.3)


def pods(core: client.CoreV1Api) -> dict[str, client.V1Pod]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(NS).items
            if p.metadata.deletion_timestamp is None}


def test_pods_placed_and_slurmd_registered_under_the_pod_hostname(world) -> None:
    standin, core, cli = world
    placed = settle(standin, "both NodeSet pods Running", lambda: (
        (ps := pods(core)) and len(ps) == 2 and all(p.status.phase == "Running" for p in ps.values()) and ps))
    assert set(placed) == {"slurm-worker-pool-a-0", "slurm-worker-pool-a-1"}
    on = {p.metadata.labels[POD_HOSTNAME_LABEL]: p.spec.node_name for p in placed.values()}
    assert {p.spec.hostname for p in placed.values()} == set(on) == {"pool-a-0", "pool-a-1"}
    assert set(on.values()) == set(KUBE_NODES)  # never on the tainted spare
    settle(standin, "Slurm nodes registered", lambda: {n.name for n in cli.nodes()} == set(on))
    for n in cli.nodes():
        c = json.loads(n.comment)
        assert c == {"namespace": NS, "podName": f"slurm-worker-{n.name}", "node": on[n.name],
                     "nodeSetName": POOL, "nodeSetUID": "nodeset-uid-a"}
        assert n.name not in KUBE_NODES + [SPARE]  # Slurm names are not Kubernetes names
        assert not n.drained_or_down


def test_cordon_drains_with_the_operators_prefix_and_uncordon_undrains_only_its_own(world) -> None:
    standin, core, cli = world
    on = {p.metadata.labels[POD_HOSTNAME_LABEL]: p.spec.node_name for p in pods(core).values()}
    target, other = "pool-a-0", "pool-a-1"
    cli.drain(other, "maintenance: alice")  # a person's drain
    core.patch_node(on[target], {"metadata": {"annotations": {CORDON_REASON_ANNOTATION: "gpufleet: xid 79"}},
                                 "spec": {"unschedulable": True}})
    n = settle(standin, "the cordoned node's Slurm node drained",
               lambda: (n := cli.node(target)) and "DRAIN" in n.states and n)
    assert n.reason == PREFIX + "gpufleet: xid 79"
    core.patch_node(on[target], {"spec": {"unschedulable": False}})
    settle(standin, "undrained after uncordon", lambda: not cli.node(target).drained_or_down)
    for _ in range(3):
        standin.reconcile_once()
    assert cli.node(other).reason == "maintenance: alice" and "DRAIN" in cli.node(other).states
    cli.resume(other)


def test_evicted_pod_moves_to_the_promoted_spare_and_keeps_its_slurm_name(world) -> None:
    standin, core, cli = world
    on = {p.metadata.labels[POD_HOSTNAME_LABEL]: p.spec.node_name for p in pods(core).values()}
    name = "pool-a-1"
    bad = on[name]
    # What the reconciler does: quarantine (cordon) the bad node, promote the spare, evict the pod.
    core.patch_node(bad, {"spec": {"unschedulable": True}})
    core.patch_node(SPARE, {"spec": {"taints": None}})
    core.create_namespaced_pod_eviction(f"slurm-worker-{name}", NS, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": f"slurm-worker-{name}", "namespace": NS}})
    settle(standin, "preStop: the Slurm node DOWN while its pod is gone",
           lambda: (n := cli.node(name)).reason == POD_TERMINATING_REASON or json.loads(n.comment)["node"] == SPARE)
    moved = settle(standin, "the pod Running again on the spare", lambda: (
        (p := pods(core).get(f"slurm-worker-{name}")) and p.status.phase == "Running" and p))
    assert moved.spec.node_name == SPARE and moved.spec.hostname == name
    n = settle(standin, "slurmd registered again with the new node in its comment",
               lambda: (n := cli.node(name)) and json.loads(n.comment)["node"] == SPARE and n)
    # The preStop's DOWN carried the operator's prefix: on a schedulable node it undrains it.
    settle(standin, "the moved Slurm node takes jobs", lambda: not cli.node(name).drained_or_down)
    assert {n.name for n in cli.nodes()} == {"pool-a-0", "pool-a-1"}
    core.patch_node(bad, {"spec": {"unschedulable": False}})
