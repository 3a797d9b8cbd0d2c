"""The stand-in for slurm-operator v1.2.1 against the real control plane (kube-scheduler places its pods
on kwok nodes, the disruption controller runs its PodDisruptionBudget) and a real Slurm 26.05. Each
test names the upstream file whose behaviour it checks (SlinkyProject/slurm-operator at v1.2.1).

The Slurm here runs the operator's slurm.conf for a Controller that declares no ReturnToService (Slurm's
default, 0), so what the operator does alone shows: a DOWN stays DOWN unless the operator sets IDLE."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels
from gpufleet.waiting import wait_for
from localenv import slinky_conf
from localenv import slinky_update as upd
from localenv.fake_nodes import fake_node
from localenv.slinky_standin import (
    CORDON_REASON_ANNOTATION, POD_CORDON_ANNOTATION, POD_HOSTNAME_LABEL, POD_PROTECT_LABEL, PREFIX,
    TERMINATING_REASON, NodeSetDef, SlinkyStandIn,
)
from localenv.ports import free_ports
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI
from tests.fixtures.slurm_cluster import build_slurm_root, cluster_extra_conf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

NS = "slinky-it"
POOL = "pool-a"
KUBE_NODES = ["kwok-a-0", "kwok-a-1"]
SPARE = "kwok-a-spare-0"
SPARE_TAINT = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
NODESET = NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8)
RESYNC = 4.0  # the operator's is 30 s (nodeset_sync.go); shorter here, the same rule


@pytest.fixture(scope="module")
def world(kube_cluster, tmp_path_factory) -> Iterator[tuple[SlinkyStandIn, client.CoreV1Api, SlurmCLI, LocalSlurm]]:
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    for name in KUBE_NODES + [SPARE]:
        taints = [SPARE_TAINT] if name == SPARE else []
        core.create_node(fake_node(name, {labels.NODE_POOL: POOL}, taints, cpus=8, memory="32Gi", gpus=8))
    for name in KUBE_NODES + [SPARE]:
        kube_cluster.wait_node_ready(name)
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("standin-slurm"), {"gpu": [POOL]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest, extra_conf=cluster_extra_conf())  # a dead slurmd: DOWN in 10 s
    # The operator's files for a Controller without ReturnToService (and the local stack's other lines).
    stack = slurm.operator_files()
    extra = "GresTypes=gpu\nPartitionName=gpu Nodes=pool-a State=UP Default=YES\n" + "\n".join(slurm.extra_conf) + "\n"
    controller = slinky_conf.synthetic_controller("standin-it", extra)
    stack["slurm.conf"] = slinky_conf.slurm_conf(controller, None, [NODESET.resource(NS)])
    slurm.operator_dir.mkdir(parents=True, exist_ok=True)
    for name, text in stack.items():
        (slurm.operator_dir / name).write_text(text)
    slurm.up()
    try:
        yield (SlinkyStandIn(api, slurm, [NODESET], namespace=NS, resync=RESYNC), core,
               SlurmCLI(env=slurm.env(), timeout=20), slurm)
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


def where(core) -> dict[str, str]:
    return {p.metadata.labels[POD_HOSTNAME_LABEL]: p.spec.node_name for p in pods(core).values()}


def test_pods_are_named_by_ordinal_and_slurmd_registers_with_the_nodesets_conf(world) -> None:
    """utils.go GetOrdinalPodName/initIdentity, labels.go WithWorkerLabels, worker_app.go slurmdConfArgs,
    slurmcontrol.go UpdateNodeWithPodInfo (the comment)."""
    standin, core, cli, slurm = world
    placed = settle(standin, "both NodeSet pods Running", lambda: (
        (ps := pods(core)) and len(ps) == 2 and all(p.status.phase == "Running" for p in ps.values()) and ps))
    assert set(placed) == {"pool-a-0", "pool-a-1"}
    # the NodeSet object on the API server, as the operator's pods find theirs (stack-less runs declare it)
    nodeset = client.CustomObjectsApi(core.api_client).get_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", NS, "nodesets", POOL)
    uid = nodeset["metadata"]["uid"]
    for name, p in placed.items():
        assert p.spec.hostname == name == p.metadata.labels[POD_HOSTNAME_LABEL]
        # utils.go NewNodeSetStatefulSetPod: metav1.NewControllerRef(nodeset, NodeSetGVK)
        (owner,) = p.metadata.owner_references
        assert (owner.api_version, owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
            "slinky.slurm.net/v1beta1", "NodeSet", POOL, uid, True, True)
        assert p.metadata.labels["app.kubernetes.io/instance"] == POOL
        assert p.metadata.labels["slinky.slurm.net/cluster"] == "slurm"
    on = where(core)
    assert set(on.values()) == set(KUBE_NODES)  # never on the tainted spare
    settle(standin, "Slurm nodes registered with the operator's comment",
           lambda: {n.name for n in cli.nodes() if n.comment} == set(on))
    for n in cli.nodes():
        assert json.loads(n.comment) == {"namespace": NS, "podName": n.name, "node": on[n.name],
                                         "nodeSetName": POOL, "nodeSetUID": uid}
        assert not n.drained_or_down
    info = slurm.node_info()["pool-a-0"]
    assert "gpu:8" in str(info.get("gres", "")) and POOL in str(info.get("features", ""))


def test_cordon_drains_only_an_empty_or_own_reason_and_never_an_unresponsive_node(world) -> None:
    """nodeset_sync.go syncCordon; slurmcontrol.go MakeNodeDrain (keeps a reason already there),
    MakeNodeUndrain, IsNodeReasonOurs, IsNodeDownForUnresponsive."""
    standin, core, cli, _ = world
    on = where(core)
    target, other = "pool-a-0", "pool-a-1"
    cli.drain(other, "maintenance: alice")  # a person's drain
    core.patch_node(on[target], {"metadata": {"annotations": {CORDON_REASON_ANNOTATION: "gpufleet: xid 79\n"}},
                                 "spec": {"unschedulable": True}})
    core.patch_node(on[other], {"metadata": {"annotations": {CORDON_REASON_ANNOTATION: "gpufleet: xid 48"}},
                                "spec": {"unschedulable": True}})
    n = settle(standin, "the cordoned node's Slurm node drained", lambda: (n := cli.node(target)) and "DRAIN" in n.states and n)
    assert n.reason == PREFIX + "gpufleet: xid 79"  # sanitized: the newline gone
    assert (pods(core)[target].metadata.annotations or {}).get(POD_CORDON_ANNOTATION) == "true"
    for _ in range(3):
        standin.reconcile_once()
    assert cli.node(other).reason == "maintenance: alice"  # not the operator's: left as it is
    core.patch_node(on[target], {"spec": {"unschedulable": False}})
    core.patch_node(on[other], {"spec": {"unschedulable": False}})
    settle(standin, "undrained after uncordon", lambda: not cli.node(target).drained_or_down)
    assert POD_CORDON_ANNOTATION not in (pods(core)[target].metadata.annotations or {})
    for _ in range(3):
        standin.reconcile_once()
    assert cli.node(other).reason == "maintenance: alice" and "DRAIN" in cli.node(other).states
    cli.resume(other)


def test_a_pod_back_on_its_node_stays_down_and_a_moved_one_is_set_idle(world) -> None:
    """worker_app.go preStop (DOWN, `slurm-operator: Pod is terminating`); slurmcontrol.go
    UpdateNodeWithPodInfo: IDLE only when the pod info changed and named a node before. Slurm 26.05
    node_mgr.c: with ReturnToService 0 a DOWN node stays DOWN when its slurmd registers again."""
    standin, core, cli, _ = world
    name = "pool-a-1"
    settle(standin, "takes jobs to begin with", lambda: not cli.node(name).drained_or_down)
    home = where(core)[name]
    core.delete_namespaced_pod(name, NS)
    settle(standin, "preStop: DOWN with the operator's reason", lambda: cli.node(name).reason == TERMINATING_REASON)
    back = settle(standin, "the pod Running again", lambda: (
        (p := pods(core).get(name)) and p.status.phase == "Running" and p))
    assert back.spec.node_name == home  # the only node it fits (the spare is tainted)
    for _ in range(4):
        standin.reconcile_once()
    n = cli.node(name)
    assert "DOWN" in n.states and n.reason == TERMINATING_REASON  # same pod info: no IDLE
    # Now it moves: the node cordoned (as gpufleet's quarantine does), the spare promoted, the pod evicted.
    core.patch_node(home, {"spec": {"unschedulable": True}})
    core.patch_node(SPARE, {"spec": {"taints": None}})
    core.create_namespaced_pod_eviction(name, NS, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                   "metadata": {"name": name, "namespace": NS}})
    moved = settle(standin, "the pod Running on the spare", lambda: (
        (p := pods(core).get(name)) and p.status.phase == "Running" and p.spec.node_name == SPARE and p))
    assert moved.spec.hostname == name
    n = settle(standin, "IDLE on migration: takes jobs", lambda: (n := cli.node(name)) and not n.drained_or_down and n)
    assert json.loads(n.comment)["node"] == SPARE
    core.patch_node(home, {"spec": {"unschedulable": False}})


def test_a_busy_pod_is_protected_by_the_pdb_until_the_next_sync_after_its_job(world) -> None:
    """workerbuilder/worker_pdb.go (slurm-workers-pdb-<controller>, maxUnavailable 0),
    nodeset_sync_status.go updateNodeSetPodPDBLabels, pkg/conditions IsNodeBusy, nodeset_sync.go resync."""
    standin, core, cli, slurm = world
    pdb = client.PolicyV1Api(core.api_client).read_namespaced_pod_disruption_budget("slurm-workers-pdb-slurm", NS)
    assert pdb.spec.max_unavailable == 0 and pdb.spec.selector.match_labels == {POD_PROTECT_LABEL: "true",
                                                                                 "slinky.slurm.net/cluster": "slurm"}
    name = "pool-a-0"
    job = slurm.sbatch("-p", "gpu", "-w", name, "--wrap", "sleep 600")
    settle(standin, "the busy pod labelled pod-protect", lambda: (
        pods(core)[name].metadata.labels or {}).get(POD_PROTECT_LABEL) == "true", timeout=RESYNC * 4)
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod_eviction(name, NS, body)
    assert e.value.status == 429
    slurm.run(["scancel", str(job)], timeout=15)
    t0 = time.monotonic()
    settle(standin, "the label gone at the next sync", lambda: POD_PROTECT_LABEL not in (
        pods(core)[name].metadata.labels or {}), timeout=RESYNC * 4)
    lag = time.monotonic() - t0
    wait_for("the eviction allowed", lambda: _evicts(core, name, body), 30, interval=0.5)
    print(f"busy-pod PDB released {lag:.1f}s after the job ended (resync {RESYNC}s)")


def _evicts(core, name, body) -> bool:
    try:
        core.create_namespaced_pod_eviction(name, NS, body)
        return True
    except ApiException as e:
        if e.status == 429:
            return False
        raise


def test_scale_in_drains_first_and_keeps_the_slurm_node_record(world) -> None:
    """nodeset_sync.go processCondemned (drain, then delete once drained); pruneSlurmNodeRecords
    applies to DaemonSet NodeSets only (syncSlurmNodeRecords)."""
    standin, core, cli, _ = world
    settle(standin, "two pods Running", lambda: len([p for p in pods(core).values() if p.status.phase == "Running"]) == 2)
    standin.fixed = [NodeSetDef(POOL, 1, {labels.NODE_POOL: POOL}, [], gpus=8)]
    settle(standin, "pool-a-1 gone", lambda: "pool-a-1" not in pods(core), timeout=90)
    n = cli.node("pool-a-1")
    assert n is not None and "DOWN" in n.states  # the record stays, DOWN by the preStop
    standin.fixed = [NODESET]


def revision_of(p: client.V1Pod) -> str:
    return (p.metadata.labels or {}).get(upd.REVISION_LABEL, "")


def test_scale_in_takes_the_cheaper_pod_first_and_scale_out_the_lowest_free_ordinal(world) -> None:
    """utils/sort.go ActivePods.Less (a lower pod-deletion-cost goes before a higher ordinal);
    nodeset_sync.go syncNodeSetPods (scale-out: the lowest ordinal no pod holds). Before, the stand-in
    always removed the ordinals at or above `replicas`."""
    standin, core, cli, _ = world
    standin.fixed = [NODESET]
    settle(standin, "two pods Running", lambda: sorted(n for n, p in pods(core).items()
                                                       if p.status.phase == "Running") == ["pool-a-0", "pool-a-1"])
    settle(standin, "both Slurm nodes registered", lambda: {n.name for n in cli.nodes()} >= {"pool-a-0", "pool-a-1"})
    core.patch_namespaced_pod("pool-a-1", NS, {"metadata": {"annotations": {upd.POD_DELETION_COST_ANNOTATION: "10"}}})
    standin.fixed = [NodeSetDef(POOL, 1, {labels.NODE_POOL: POOL}, [], gpus=8)]
    settle(standin, "pool-a-0 condemned and gone", lambda: set(pods(core)) == {"pool-a-1"}, timeout=90)
    assert "DRAIN" not in cli.node("pool-a-1").states
    standin.fixed = [NODESET]
    settle(standin, "pool-a-0 made again (not pool-a-2)", lambda: sorted(
        n for n, p in pods(core).items() if p.status.phase == "Running") == ["pool-a-0", "pool-a-1"], timeout=90)
    core.patch_namespaced_pod("pool-a-1", NS, {"metadata": {"annotations": {upd.POD_DELETION_COST_ANNOTATION: None}}})
    settle(standin, "pool-a-0's slurmd back", lambda: {n.name for n in cli.nodes()} >= {"pool-a-0", "pool-a-1"})
    for name in ("pool-a-0", "pool-a-1"):
        if cli.node(name).drained_or_down:
            cli.resume(name)


def test_an_image_change_rolls_one_pod_at_a_time_waiting_for_a_busy_node(world) -> None:
    """nodeset_sync.go syncRollingUpdate/splitUpdatePods (maxUnavailable 25 % of 2: one pod at a time, the
    highest ordinal first), processCondemned (drain with the operator's reason, overriding a person's;
    delete only once drained and idle: IsNodeDrained), then the ordinal made again at the new revision."""
    standin, core, cli, slurm = world
    standin.fixed = [NODESET]
    settle(standin, "two pods Running", lambda: sorted(n for n, p in pods(core).items()
                                                       if p.status.phase == "Running") == ["pool-a-0", "pool-a-1"])
    for name in ("pool-a-0", "pool-a-1"):
        if cli.node(name).drained_or_down:
            cli.resume(name)
    before = {n: p.metadata.uid for n, p in pods(core).items()}
    old_rev = {revision_of(p) for p in pods(core).values()}
    job = slurm.sbatch("-p", "gpu", "-w", "pool-a-1", "--wrap", "sleep 600")
    wait_for("the job running", lambda: "ALLOCATED" in cli.node("pool-a-1").states or "MIXED" in cli.node("pool-a-1").states,
             30, interval=0.3)
    cli.drain("pool-a-1", "maintenance: alice")  # a person's drain: the operator overwrites it
    v2 = NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8, image="slurmd:v2")
    standin.fixed = [v2]
    n = settle(standin, "pool-a-1 drained for the update", lambda: (n := cli.node("pool-a-1")).reason.startswith(PREFIX) and n)
    assert n.reason == PREFIX + f"Pod ({NS}/pool-a-1) is pending termination for scale-in" and "DRAIN" in n.states
    for _ in range(5):  # busy: the pod waits, and the budget (one) holds pool-a-0 back
        standin.reconcile_once()
    now = pods(core)
    assert now["pool-a-1"].metadata.uid == before["pool-a-1"] and now["pool-a-0"].metadata.uid == before["pool-a-0"]
    assert not cli.node("pool-a-0").drained_or_down
    slurm.run(["scancel", str(job)], timeout=15)
    most = [0]

    def rolled() -> bool:
        ps = pods(core)
        most[0] = max(most[0], sum(1 for p in ps.values() if (p.metadata.annotations or {}).get(POD_CORDON_ANNOTATION)))
        return sorted(ps) == ["pool-a-0", "pool-a-1"] and all(
            p.status.phase == "Running" and p.metadata.uid != before[n] and revision_of(p) not in old_rev
            for n, p in ps.items())
    settle(standin, "both pods at the new revision", rolled, timeout=180)
    assert most[0] <= 1  # never both condemned at once
    assert {p.spec.containers[0].image for p in pods(core).values()} == {"slurmd:v2"}
    assert cli.node("pool-a-1").reason != "maintenance: alice"  # the person's reason is gone (upstream loses it)
    for name in ("pool-a-0", "pool-a-1"):
        if cli.node(name).drained_or_down:
            cli.resume(name)


def test_on_delete_condemns_nothing_until_a_pod_is_deleted(world) -> None:
    """nodeset_sync.go syncUpdate (OnDelete: nothing) and splitUpdatePods; a deleted pod comes back at the
    new revision."""
    standin, core, cli, _ = world
    standin.fixed = [NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8, image="slurmd:v2",
                                update_strategy=(("type", "OnDelete"),))]
    settle(standin, "two pods Running", lambda: sorted(n for n, p in pods(core).items()
                                                       if p.status.phase == "Running") == ["pool-a-0", "pool-a-1"])
    revs = {n: revision_of(p) for n, p in pods(core).items()}
    standin.fixed = [NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8, image="slurmd:v3",
                                update_strategy=(("type", "OnDelete"),))]
    for _ in range(5):
        standin.reconcile_once()
    assert {n: revision_of(p) for n, p in pods(core).items()} == revs
    assert not any("pending termination" in cli.node(n).reason for n in revs)
    core.delete_namespaced_pod("pool-a-0", NS)
    back = settle(standin, "pool-a-0 back at the new revision", lambda: (
        (p := pods(core).get("pool-a-0")) and p.status.phase == "Running" and revision_of(p) != revs["pool-a-0"] and p))
    assert back.spec.containers[0].image == "slurmd:v3" and revision_of(pods(core)["pool-a-1"]) == revs["pool-a-1"]
    standin.fixed = [NODESET]  # back to the first revision (rolled), for the tests after this one
    first = upd.revision(NODESET.resource(NS))
    settle(standin, "both pods back at the first revision", lambda: sorted(pods(core)) == ["pool-a-0", "pool-a-1"] and all(
        p.status.phase == "Running" and revision_of(p) == first for p in pods(core).values()), timeout=180)
    settle(standin, "both slurmds registered", lambda: {n.name for n in cli.nodes()} >= {"pool-a-0", "pool-a-1"})
    for name in ("pool-a-0", "pool-a-1"):
        if cli.node(name).drained_or_down:
            cli.resume(name)


def test_a_dead_machine_runs_no_prestop_and_slurmctld_marks_its_node_not_responding(world) -> None:
    """A machine that dies takes its kubelet with it (localenv/fake_nodes.py kill_kubelet), and only a kubelet
    runs a container's preStop (kubernetes v1.34 pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer),
    so the Slurm node never gets worker_app.go's `Pod is terminating`: its slurmd goes silent and slurmctld sets it
    DOWN "Not responding" SlurmdTimeout later (slurm src/slurmctld/ping_nodes.c). The pod keeps its Running phase
    (nothing updates a dead kubelet's pods; the operator deletes none: nodeset_sync.go). The kubelet back, the
    pod's slurmd runs again, and the node stays DOWN (ReturnToService 0 here) until resumed."""
    from gpufleet.reconciler.adapters.slurm import SlurmError
    from localenv.fake_nodes import KWOK_ANNOTATION, kill_kubelet

    standin, core, cli, slurm = world
    name = "pool-a-0"
    def up() -> bool:
        p = pods(core).get(name)
        try:
            return p is not None and p.status.phase == "Running" and not cli.node(name).drained_or_down
        except SlurmError:  # its slurmd not registered yet
            return False

    settle(standin, "takes jobs to begin with", up)
    host = where(core)[name]
    kill_kubelet(core, host)
    reasons: set[str] = set()

    def not_responding():
        n = cli.node(name)
        reasons.add(n.reason or "")
        return "DOWN" in n.states and n

    try:
        n = settle(standin, "DOWN Not responding, set by slurmctld", not_responding, timeout=120)
        assert n.reason == "Not responding" and TERMINATING_REASON not in reasons  # no preStop ran
        assert pods(core)[name].status.phase == "Running" and pods(core)[name].spec.node_name == host
        assert name not in slurm.wanted_nodes()  # its slurmd died with the machine
    finally:
        core.patch_node(host, {"metadata": {"annotations": {KWOK_ANNOTATION: "fake"}}})  # the kubelet back
    settle(standin, "the pod's slurmd running again", lambda: name in slurm.wanted_nodes())
    cli.resume(name)
    settle(standin, "takes jobs again", lambda: not cli.node(name).drained_or_down)
