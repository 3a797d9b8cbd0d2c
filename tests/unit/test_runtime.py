"""The runtime (caches, work queue, workers, timed passes, fencing, intents) with fakes of the adapters
and a fake clock: what it does around the core when things fail, restart or race."""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.ledger import parse as parse_ledger
from gpufleet.reconciler.adapters.records import to_object
from gpufleet.reconciler.adapters.slurm import SlurmJob, SlurmNode
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.unit.fakes import T0, FakeNodes, World, fleet, nodeset_owner, pool_node


def test_nothing_is_decided_before_every_cache_has_listed():
    w = World(fleet())
    w.fault("h100-0")
    w.manager.caches.nodes.relist()  # nodes listed, pods and remediations not yet
    w.manager.queue.add("h100-0")
    w.manager.process_due()
    assert w.store.objects == {} and w.kube.calls == []
    w.run()
    assert w.remediation("h100-0").phase is not Phase.DETECTED


def test_a_fault_heals_with_slurm_names_from_the_nodeset_pods():
    w = World(fleet(grace_period_seconds=0))
    w.fault("h100-3")
    w.run()
    r = w.remediation("h100-3")
    assert r.slurm_nodes == ("h100-w3",)  # not the Kubernetes name
    assert ("drain", "h100-w3") in w.slurm.calls and ("cordon", "h100-3") in w.kube.calls
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"


def test_a_pod_that_forges_the_pod_hostname_label_names_no_slurm_node():
    """A tenant's pod outside the Slurm namespace carrying `pod-hostname` of another node's Slurm node: the
    fault drains only the faulted node's own Slurm node; the forged pod is evicted like any other pod."""
    w = World(fleet(grace_period_seconds=0))
    w.kube.pods["tenant/squatter"] = {
        "metadata": {"name": "squatter", "namespace": "tenant", "uid": "uid-squatter",
                     "labels": {labels.SLINKY_POD_HOSTNAME: "h100-w5"}},
        "spec": {"nodeName": "h100-3"}, "status": {"phase": "Running"}}
    w.fault("h100-3")
    w.run()
    r = w.remediation("h100-3")
    assert r.slurm_nodes == ("h100-w3",)
    assert ("drain", "h100-w5") not in w.slurm.calls and ("drain", "h100-w3") in w.slurm.calls
    assert any(c[0] == "evict" and "squatter" in str(c) for c in w.kube.calls), w.kube.calls
    # in the Slurm namespace but controlled by no NodeSet, or by a NodeSet the spec does not declare, or by
    # something else that calls itself NodeSet: not a NodeSet pod either
    for owners in ([], [nodeset_owner("l40s")], [{**nodeset_owner("h100"), "apiVersion": "example.com/v1"}],
                   [{**nodeset_owner("h100"), "controller": False}]):
        w = World(fleet(grace_period_seconds=0))
        w.kube.pods["slurm/lookalike"] = {
            "metadata": {"name": "lookalike", "namespace": "slurm", "uid": "uid-lookalike",
                         "labels": {labels.SLINKY_POD_HOSTNAME: "h100-w5"}, "ownerReferences": owners},
            "spec": {"nodeName": "h100-3"}, "status": {"phase": "Running"}}
        w.fault("h100-3")
        w.run()
        assert w.remediation("h100-3").slurm_nodes == ("h100-w3",), owners
        assert ("drain", "h100-w5") not in w.slurm.calls, owners
    # and the same pod in the Slurm namespace, controlled by the pool's NodeSet, is a NodeSet pod: its Slurm
    # node is drained with the node's
    w = World(fleet(grace_period_seconds=0))
    w.kube.pods["slurm/slurm-worker-extra"] = {**w.kube.pods.pop("slurm/slurm-worker-h100-w3")}
    w.kube.pods["slurm/slurm-worker-extra"]["metadata"] = {
        "name": "slurm-worker-extra", "namespace": "slurm", "uid": "uid-extra",
        "labels": {labels.SLINKY_POD_HOSTNAME: "h100-w5"}, "ownerReferences": [nodeset_owner("h100")]}
    w.fault("h100-3")
    w.run()
    assert ("drain", "h100-w5") in w.slurm.calls


@pytest.mark.parametrize("forged", [False, True])
def test_a_squatter_on_an_unlent_spare_is_evicted_before_the_promotion(forged):
    """A pod that tolerates the spare taint sits on a spare nobody lent: the promotion waits until it is gone.
    Carrying a forged pod-hostname label (outside the Slurm namespace) does not make it a NodeSet pod."""
    w = World(fleet(grace_period_seconds=0))
    w.kube.pods["tenant/squatter"] = {
        "metadata": {"name": "squatter", "namespace": "tenant", "uid": "uid-squatter",
                     "labels": {labels.SLINKY_POD_HOSTNAME: "h100-spare-0"} if forged else {}},
        "spec": {"nodeName": "h100-spare-0"}, "status": {"phase": "Running"}}
    squatter_at_promotion = []
    promote = w.provider.promote

    def watched(spare, replaces):
        squatter_at_promotion.append("tenant/squatter" in w.kube.pods)
        return promote(spare, replaces)

    w.provider.promote = watched
    w.fault("h100-3")
    w.run()
    assert ("evict", "squatter") in w.kube.calls and "tenant/squatter" not in w.kube.pods, w.kube.calls
    assert w.remediation("h100-3").replacement == "h100-spare-0"
    assert squatter_at_promotion == [False]  # promoted once, with the squatter gone


def test_containment_under_the_brake_cordons_and_drains_every_fault_and_replaces_none():
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0))
    for i in range(5):
        w.fault(f"h100-{i}")
    w.run()
    remediations = w.store.list()
    assert len(remediations) == 5 and {r.phase for r in remediations} == {Phase.HELD}
    assert all("unhealthy" in r.held_message for r in remediations)
    assert {c[1] for c in w.kube.calls if c[0] == "cordon"} == {f"h100-{i}" for i in range(5)}
    assert {c[1] for c in w.slurm.calls if c[0] == "drain"} == {f"h100-w{i}" for i in range(5)}
    assert not [c for c in w.provider.calls if c[0] == "promote"]
    assert w.notifier.sent.count("storm") == 1  # one page for the pool, not one per node
    conditions = [c for r in w.store.objects.values() for c in json.loads(r)["status"]["conditions"]
                  if c["type"] == "RemediationAllowed"]
    assert {(c["status"], c["reason"]) for c in conditions} == {("False", "TooManyUnhealthy")}


def test_the_storm_page_is_not_sent_again_after_a_restart():
    """The page is noted on the remediation that sent it: a restarted reconciler (nothing in memory) that
    sees the storm still holding pages no one."""
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0))
    for i in range(3):
        w.fault(f"h100-{i}")
    w.run()
    assert w.notifier.sent.count("storm") == 1
    w.restart()
    w.fault("h100-3")  # the storm grows
    w.run(seconds=20)
    assert {r.phase for r in w.store.list()} == {Phase.HELD}
    assert w.notifier.sent.count("storm") == 1


@pytest.mark.parametrize("hold, replaced", [(0, 1), (5, 0)])
def test_the_admission_hold_lets_the_brake_weigh_a_burst_that_trickles_in(hold, replaced):
    """Faults 3 s apart: weighed at once, the first one is replaced before the others are seen; held
    5 s, the brake sees the burst (3 of 10 > 20 %) and replaces none. Containment never waits."""
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0, admission_hold_seconds=hold))
    w.fault("h100-0")
    w.run(seconds=3)
    assert ("cordon", "h100-0") in w.kube.calls
    w.fault("h100-1")
    w.fault("h100-2")
    w.run(seconds=10)
    assert {c[1] for c in w.kube.calls if c[0] == "cordon"} == {"h100-0", "h100-1", "h100-2"}
    assert len([c for c in w.provider.calls if c[0] == "promote"]) == replaced
    if hold:
        assert {r.phase for r in w.store.list()} == {Phase.HELD}
        assert w.notifier.sent.count("storm") == 1


def test_max_concurrent_holds_replacement_not_containment_and_no_spare_is_given_twice():
    w = World(fleet(nodes=10, spares=6, max_concurrent=2, max_unhealthy_fraction=1.0, grace_period_seconds=0))
    for i in range(5):
        w.fault(f"h100-{i}")
    w.run()
    assert len({c[1] for c in w.kube.calls if c[0] == "cordon"}) == 5
    phases = sorted(r.phase.value for r in w.store.list())
    assert phases.count("Held") == 3
    w.run(seconds=5)
    promoted = [c[1] for c in w.provider.calls if c[0] == "promote"]
    assert len(promoted) == len(set(promoted)) >= 2


def work_in_parallel(w, workers: int, done, rounds: int, advance: float = 0.0) -> None:
    """Run `workers` of the manager's worker threads until `done()` holds or `rounds` rounds have passed; each
    round delivers what the watches would (a sync) and moves the clock by `advance`, then the workers stop."""
    stop = threading.Event()
    threads = [threading.Thread(target=w.manager.work, args=(stop, None)) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        for _ in range(rounds):
            if done():
                break
            w.sync()
            if advance:
                w.clock.advance(advance)
            stop.wait(0.05)
    finally:
        stop.set()
        w.manager.queue.shut_down()
        for t in threads:
            t.join()


def test_parallel_workers_never_give_a_spare_twice():
    w = World(fleet(nodes=40, spares=20, max_concurrent=100, max_unhealthy_fraction=1.0, grace_period_seconds=0))
    for i in range(20):
        w.fault(f"h100-{i}")
    w.sync()
    work_in_parallel(w, 8, lambda: len([c for c in w.provider.calls if c[0] == "promote"]) >= 20, rounds=200,
                     advance=0.5)
    promoted = [c[1] for c in w.provider.calls if c[0] == "promote"]
    assert len(promoted) == 20 and len(set(promoted)) == 20


def test_backoff_is_honoured_across_wakes_and_restarts():
    w = World(fleet())
    w.slurm.unreachable = True
    w.fault("h100-0")
    w.run()
    r = w.remediation("h100-0")
    assert r.phase is Phase.SLURM_DRAINING and r.retries >= 1  # cordoned and written; Slurm failed after
    assert ("cordon", "h100-0") in w.kube.calls and r.next_attempt > w.clock.now
    tries = r.retries
    for _ in range(20):  # many wakes (events) within the backoff: no extra attempt
        w.manager.queue.add("h100-0")
        w.manager.process_due()
    assert w.remediation("h100-0").retries == tries
    w.restart()  # a restart reads the backoff from the remediation
    w.sync()
    w.manager.process_due()
    assert w.remediation("h100-0").retries == tries
    w.clock.now = r.next_attempt  # due: one more attempt
    w.sync()
    w.manager.process_due()
    assert w.remediation("h100-0").retries == tries + 1


def test_a_slurm_outage_of_a_minute_is_outlived():
    w = World(fleet(grace_period_seconds=30))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    w.run()
    assert w.remediation("h100-0").phase is Phase.CHECKPOINTING
    w.slurm.unreachable = True
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.phase is Phase.CHECKPOINTING and r.retries > 3  # failing, not Failed
    w.slurm.unreachable = False
    w.slurm.jobs[7] = SlurmJob(7, "train", "COMPLETED", nodes=("h100-w0",))
    w.run(seconds=40)
    r = w.remediation("h100-0")
    assert r.phase in (Phase.RESUMING, Phase.SUCCEEDED) and ("requeue", (7,)) in w.slurm.calls
    assert "failed" not in w.notifier.sent


def test_losing_the_lease_stops_every_action():
    leading = {"yes": True}
    w = World(fleet(), fence=lambda: leading["yes"])
    w.fault("h100-0")
    leading["yes"] = False
    w.run(seconds=3)
    assert w.store.objects == {} and w.kube.calls == [] and w.slurm.calls == []
    leading["yes"] = True
    w.manager.resync()  # what the run loop does when this replica starts leading
    w.run()
    assert w.store.objects != {} and ("cordon", "h100-0") in w.kube.calls


def test_a_reconcile_sees_its_own_eviction_and_asks_once():
    """The NodeSet pod is evicted once: the next step of the same reconcile, and the next reconciles
    before the watch shows the pod gone, see it leaving (the executor wrote it into the cache)."""
    w = World(fleet(grace_period_seconds=0))
    w.kube.evict = lambda pod, grace_seconds=None: w.kube.calls.append(("evict", pod["metadata"]["name"])) or True
    w.fault("h100-0")  # the pod is never deleted: the API server accepted the eviction, the kubelet is slow
    w.run(seconds=5)
    assert w.remediation("h100-0").phase is Phase.EVICTING
    assert [c for c in w.kube.calls if c[0] == "evict"] == [("evict", "slurm-worker-h100-w0")]


def test_a_persons_drain_is_carried_to_the_faulted_machine_and_reported_once():
    """slurm-operator 1.2.1 clears the drain on the Slurm node when its pod moves: before the pod leaves,
    the person's reason is noted on the faulted machine (decide.carry_person_drains), the person is told
    once, and the Slurm node's drain is never overwritten."""
    w = World(fleet(grace_period_seconds=0))
    w.slurm.table["h100-w0"] = SlurmNode("h100-w0", frozenset({"IDLE", "DRAIN"}), "ops: bad fan")
    w.fault("h100-0")
    w.run(seconds=5)
    carried = json.loads(w.kube.nodes["h100-0"]["metadata"]["annotations"][labels.CARRIED_DRAIN])
    assert carried == {"h100-w0": "ops: bad fan"}
    assert w.notifier.sent.count("person-drain-carried") == 1 and ("drain", "h100-w0") not in w.slurm.calls
    assert w.manager.caches.nodes.get("h100-0").carried_drain  # written through: the next look sees it
    assert w.remediation("h100-0").kept_drains == ("h100-w0",)


def test_a_nodeset_pod_a_stale_pdb_keeps_is_deleted_at_the_drain_timeout_when_no_job_runs():
    """slurm-operator 1.2.1's busy-pod PDB refuses the eviction (429) until its next NodeSet sync: at the
    drain timeout (10 s here), a NodeSet pod still there whose Slurm node runs no job is deleted and the
    heal goes on; while a job runs there, it is not. Jobs are read only once the timeout passed."""
    w = World(fleet(grace_period_seconds=0))
    refused = []
    w.kube.evict = lambda pod, grace_seconds=None: refused.append(pod["metadata"]["name"]) and False
    w.fault("h100-0")
    w.run(seconds=5)
    assert w.remediation("h100-0").phase is Phase.EVICTING and "slurm/slurm-worker-h100-w0" in w.kube.pods
    assert refused and not [c for c in w.kube.calls if c[0] == "delete"]
    w.run(seconds=10)
    assert [c for c in w.kube.calls if c[0] == "delete"] == [("delete", "slurm-worker-h100-w0")]
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and "still refused eviction after 10s" in r.reason

    busy = World(fleet(grace_period_seconds=0))
    busy.kube.evict = lambda pod, grace_seconds=None: False
    busy.fault("h100-0")
    busy.run(seconds=5)
    busy.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))  # landed before the drain took
    busy.run(seconds=10)
    assert not [c for c in busy.kube.calls if c[0] == "delete"]
    assert "drain timed out after 10s with pods left" in busy.remediation("h100-0").reason


def test_a_corrupt_remediation_halts_only_its_own_node():
    w = World(fleet(grace_period_seconds=0))
    bad = to_object(r := Remediation(name="h100-1-xid79-1", node="h100-1", pool="h100", xid=79, message="m",
                                     phase=Phase.EVICTING, created=T0))
    bad["status"]["phase"] = "Exploded"
    w.store.objects[r.name] = json.dumps(bad)
    w.fault("h100-1")
    w.fault("h100-2")
    w.run()
    assert w.remediation("h100-2").phase is not Phase.DETECTED
    assert ("cordon", "h100-1") not in w.kube.calls
    assert w.kube.calls.count(("event", "RemediationUnreadable")) == 1


def test_an_unreadable_remediation_found_without_the_lease_is_reported_once_it_is_held():
    leading = {"yes": False}
    w = World(fleet(), fence=lambda: leading["yes"])
    bad = to_object(r := Remediation(name="h100-1-xid79-1", node="h100-1", pool="h100", xid=79, message="m",
                                     phase=Phase.EVICTING, created=T0))
    bad["spec"].pop("xid")
    w.store.objects[r.name] = json.dumps(bad)
    w.run(seconds=2)
    assert w.kube.calls == []
    leading["yes"] = True
    w.manager.resync()
    w.run(seconds=5)
    assert w.kube.calls.count(("event", "RemediationUnreadable")) == 1


def test_a_failing_return_to_spares_is_isolated_to_its_node():
    w = World(fleet(grace_period_seconds=0))
    q = w.kube.nodes["h100-9"]
    q["metadata"]["labels"][labels.ROLE] = labels.ROLE_QUARANTINED
    q["status"]["conditions"].append({"type": "GpuHealthy", "status": "True", "reason": "HealthCheckPassed"})
    w.provider.fail_return = True
    w.fault("h100-0")
    w.run()
    assert w.remediation("h100-0").phase is not Phase.DETECTED


def test_waiting_for_a_spare_holds_no_slot_of_another_pool():
    w = World(fleet(nodes=4, spares=0, pools=("a100", "h100"), max_concurrent=1, max_unhealthy_fraction=1.0,
                    grace_period_seconds=0))
    w.fault("a100-0")
    w.run()
    assert w.remediation("a100-0").phase is Phase.WAITING_FOR_SPARE
    # h100 gets a spare: its fault is replaced although a100 waits
    w.kube.nodes["h100-spare-0"] = pool_node(w.spec.pool("h100"), "h100-spare-0", labels.ROLE_SPARE)
    w.fault("h100-0")
    w.run(seconds=2)
    assert w.remediation("h100-0").phase in (Phase.RESUMING, Phase.SUCCEEDED)


def test_occurrences_are_counted_on_the_node_so_a_restart_keeps_counting():
    w = World(fleet(occurrences=2, occurrence_window_seconds=600, grace_period_seconds=0))
    w.fault("h100-0")
    w.run()
    assert w.store.objects == {}  # one signal of two
    assert [c for c in w.kube.calls if c[0] == "patch"] == [("patch", "h100-0")]  # noted once, not per reconcile
    w.restart()  # restarted: memory gone
    w.clock.advance(30)
    cond = w.kube.nodes["h100-0"]["status"]["conditions"]
    cond[:] = [c for c in cond if c["type"] != "GpuHealthy"]
    w.fault("h100-0")  # the second signal, after the restart
    w.run()
    assert w.remediation("h100-0").phase is not Phase.DETECTED


def test_a_node_that_joins_is_labelled_into_its_pool_and_a_gpu_node_of_no_pool_is_reported():
    spec = fleet()
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(update={"member_selector": {"team": "h100"}})]})
    w = World(spec)
    ready = [{"type": "Ready", "status": "True"}]
    w.kube.nodes["new-0"] = {"metadata": {"name": "new-0", "labels": {"team": "h100"}}, "spec": {},
                             "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": ready}}
    w.kube.nodes["stray-0"] = {"metadata": {"name": "stray-0", "labels": {}}, "spec": {},
                               "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": ready}}
    w.kube.nodes["h100-spare-1"]["metadata"]["labels"][labels.ROLE] = labels.ROLE_RETIRED  # a spare short: not a surplus
    w.run(seconds=2)
    joined = w.kube.nodes["new-0"]["metadata"]["labels"]
    assert joined[labels.NODE_POOL] == "h100" and joined[labels.ROLE] == labels.ROLE_SPARE  # the pool's actives are full
    assert labels.SPARE_TAINT in {t["key"] for t in w.kube.nodes["new-0"]["spec"]["taints"]}
    w.run(seconds=60)  # two more passes: the stray node is reported once
    assert w.kube.calls.count(("event", "NodeInNoPool")) == 1
    assert w.manager.metrics.unlabelled._value.get() == 1


def test_the_membership_pass_writes_the_pools_slurm_topology_on_its_nodes_once():
    """The annotation slurm-operator 1.2.1 copies to the Slurm node (nodeset_sync.go syncSlurmTopology) goes
    through the executor with the pool's labels: written once, then nothing is left to change."""
    spec = fleet()
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(update={"topology_block": "block-a"})]})
    w = World(spec)
    w.run(seconds=2)
    assert w.kube.nodes["h100-0"]["metadata"]["annotations"][labels.SLINKY_TOPOLOGY_SPEC] == "blocks:block-a"
    assert w.kube.nodes["h100-spare-1"]["metadata"]["annotations"][labels.SLINKY_TOPOLOGY_SPEC] == "blocks:block-a"
    writes = w.kube.calls.count(("membership", "h100-0"))
    w.run(seconds=60)  # two more passes
    assert w.kube.calls.count(("membership", "h100-0")) == writes == 1


def test_own_relabels_queue_no_membership_pass_a_joining_node_does():
    """Promote and quarantine relabel members (a pass reads every node: at 10,000 nodes the costliest
    part of a heal); a node that joins is placed within seconds."""
    w = World(fleet(grace_period_seconds=0))
    w.run(seconds=1)
    passes = []
    w.manager.timers["membership"].poke(1000)  # nothing due from before: only what follows counts
    membership = w.manager.passes["membership"]
    w.manager.passes["membership"] = lambda: passes.append(w.clock.now) or membership()
    w.fault("h100-3")
    w.run(seconds=10)
    assert w.remediation("h100-3").phase in (Phase.RESUMING, Phase.SUCCEEDED)
    assert w.kube.nodes["h100-spare-0"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_ACTIVE  # relabelled
    assert passes == []
    w.kube.nodes["new-0"] = {"metadata": {"name": "new-0", "labels": {}}, "spec": {},
                             "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": [
                                 {"type": "Ready", "status": "True"}]}}
    w.run(seconds=2)
    assert len(passes) == 1


# --- lending through the same fence ---------------------------------------------------------------------

def lending_world(fence=lambda: True) -> World:
    spec = parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 2, "spares": 2,
                   "lending": {"spares": True, "spare_floor": 1, "borrowers": {"selector": {"app": "inference"}}}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })
    return World(spec, fence)


def test_lending_is_fenced_and_lends_the_spare_beyond_the_floor_once_the_lease_is_held():
    leading = {"yes": False}
    w = lending_world(fence=lambda: leading["yes"])
    w.run(seconds=3)
    assert w.kube.calls == []  # no lend, no ledger write without the Lease
    leading["yes"] = True
    w.manager.resync()
    w.run(seconds=3)
    assert [c for c in w.kube.calls if c[0] == "lend"] == [("lend", "h100-spare-1")]  # spare-0 is the floor
    book = parse_ledger(w.kube.ledger["h100"], "h100")
    assert [(x.node, x.kind) for x in book.loans if x.open] == [("h100-spare-1", "spare")]
    assert (book.capacity.spares_lent, book.capacity.spares_unlent) == (1, 1)


def test_a_ledger_the_api_could_not_take_is_written_on_a_later_pass_and_a_restart_keeps_the_loan():
    from gpufleet.reconciler.errors import TemporaryError

    w = lending_world()
    original = w.kube.write_ledger
    w.kube.write_ledger = lambda ns, pool, text: (_ for _ in ()).throw(TemporaryError("patch: timeout"))
    w.run(seconds=3)
    assert ("lend", "h100-spare-1") in w.kube.calls and w.kube.ledger == {}
    w.kube.write_ledger = original
    w.run(seconds=2)
    assert parse_ledger(w.kube.ledger["h100"]).lent_nodes() == ("h100-spare-1",)
    w.restart()  # nothing in memory: the loan is on the node and in the ledger
    w.run(seconds=3)
    book = parse_ledger(w.kube.ledger["h100"])
    assert [x.node for x in book.loans] == ["h100-spare-1"]  # one loan, not a second one
    assert [c for c in w.kube.calls if c[0] == "lend"] == [("lend", "h100-spare-1")]  # not lent again


def test_the_retention_pass_deletes_old_finished_remediations_and_keeps_recent_and_live_ones():
    leading = [True]
    w = World(fleet(record_retention_days=30), fence=lambda: leading[0])

    def put(name, node, phase, days_ago):
        at = T0 - timedelta(days=days_ago)
        r = Remediation(name=name, node=node, pool="h100", xid=79, message="m", phase=phase, created=at,
                        phase_times=((phase.value, at),))
        w.store.objects[name] = json.dumps(to_object(r))

    put("old-1", "h100-1", Phase.SUCCEEDED, 40)
    put("old-2", "h100-2", Phase.FAILED, 31)
    put("recent", "h100-3", Phase.SUCCEEDED, 2)
    put("live", "h100-4", Phase.WAITING_FOR_SPARE, 60)
    w.sync()
    leading[0] = False  # a replica without the Lease deletes nothing
    w.manager.timers["retention"].fire()
    assert set(w.store.objects) == {"old-1", "old-2", "recent", "live"}
    leading[0] = True
    w.manager.resync()  # pokes the retention pass, as a new leader does
    w.run(seconds=2)
    assert set(w.store.objects) == {"recent", "live"}
    assert {r.name for r in w.manager.caches.remediations.values()} == {"recent", "live"}


# --- one SIGTERM per job (issue 23) ----------------------------------------------------------------------

def two_node_job(w: World) -> None:
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0", "h100-w1"))


def test_a_job_on_two_nodes_that_fault_in_the_same_second_gets_one_sigterm():
    """The later remediation sees the checkpoint under way and waits on the same deadline; both requeue it
    when the grace is over, neither signals it twice."""
    w = World(fleet(grace_period_seconds=60))
    two_node_job(w)
    w.fault("h100-0")
    w.fault("h100-1")
    w.run(seconds=2)
    assert [c for c in w.slurm.calls if c[0] == "signal"] == [("signal", (7,))]
    first, second = sorted((w.remediation("h100-0"), w.remediation("h100-1")), key=lambda r: len(r.signalled),
                           reverse=True)
    assert first.signalled == (7,) and second.signalled == () and "signal:TERM" not in second.intents
    assert first.phase is second.phase is Phase.CHECKPOINTING and second.jobs == (7,)
    assert second.grace_deadline == first.grace_deadline
    w.run(seconds=65)  # the job ignores the SIGTERM: the grace runs out, the requeue ends it
    assert [c for c in w.slurm.calls if c[0] == "signal"] == [("signal", (7,))]
    assert ("requeue", (7,)) in w.slurm.calls
    assert {w.remediation(n).phase for n in ("h100-0", "h100-1")} <= {Phase.RESUMING, Phase.SUCCEEDED}


def test_two_workers_that_read_the_job_at_once_signal_it_once():
    """Both workers have read Slurm (the job runs on both nodes) before either plans: the claims lock counts
    the step the first is applying, so the second does not signal."""
    w = World(fleet(grace_period_seconds=60, max_unhealthy_fraction=1.0))
    two_node_job(w)
    both_read = threading.Barrier(2, timeout=10)
    reads = {"n": 0}
    jobs_on_node = w.slurm.jobs_on_node

    def reading(name):
        out = jobs_on_node(name)
        reads["n"] += 1
        if reads["n"] <= 2:
            both_read.wait()  # neither plans before the other has read
        return out
    w.slurm.jobs_on_node = reading
    w.fault("h100-0")
    w.fault("h100-1")
    w.sync()
    work_in_parallel(w, 2, lambda: {r.phase for r in w.store.list()} == {Phase.CHECKPOINTING}
                     and len(w.store.list()) == 2, rounds=100)
    assert reads["n"] >= 2 and not both_read.broken
    assert [c for c in w.slurm.calls if c[0] == "signal"] == [("signal", (7,))]
    assert sorted(len(r.signalled) for r in w.store.list()) == [0, 1]


# --- a replacement that breaks before its remediation succeeds (issue 23) ---------------------------------

def test_a_replacement_that_breaks_while_resuming_is_given_up_and_another_spare_taken_at_once():
    """The spare promoted for h100-0 faults while h100-0's remediation is Resuming: that remediation notes it
    and promotes the next spare at once; the broken spare's own remediation contains it, stands in (replaces
    nothing, takes no slot) and quarantines it. A pool of 4 with a brake at 25 %: the broken spare is h100-0's
    position again, not a second unhealthy node, so nothing is held for a human while spares are free."""
    w = World(fleet(nodes=4, spares=3, max_unhealthy_fraction=0.25, grace_period_seconds=0))
    w.fault("h100-0")
    w.run(seconds=2)
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"
    w.fault("h100-spare-0")
    w.run(seconds=5)
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-1"
    assert [(f.node, f.why) for f in r.failed_replacements] == [("h100-spare-0", "h100-spare-0 reported XID 79 (GPU has fallen off the bus)")]
    assert "replacement h100-spare-0 reported" in r.reason
    s = w.remediation("h100-spare-0")
    assert s.phase is Phase.SUCCEEDED and s.stands_in_for == r.name and s.replacement is None
    assert [c[1] for c in w.provider.calls if c[0] == "promote"] == ["h100-spare-0", "h100-spare-1"]
    assert ("quarantine", "h100-spare-0") in w.provider.calls
    assert sorted(c[1] for c in w.provider.calls if c[0] == "capacity") == [f"{r.name}/refill", f"{s.name}/refill"]
    assert "storm" not in w.notifier.sent and w.notifier.sent.count("replacement-failed") == 1
    assert not [x for x in w.store.list() if x.phase is Phase.HELD]
    conditions = {c["type"]: c for c in json.loads(w.store.objects[r.name])["status"]["conditions"]}
    assert conditions["Replaced"]["reason"] == "ReplacementFailed"
    assert "h100-spare-0 reported XID 79" in conditions["Replaced"]["message"]


# --- pages that say the truth (issue 23) ---------------------------------------------------------------

def test_under_the_brake_no_page_promises_a_replacement_and_the_storm_page_says_what_to_do():
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=30))
    for i in range(3):
        w.fault(f"h100-{i}")
    w.run(seconds=40)
    assert {r.phase for r in w.store.list()} == {Phase.HELD}
    detected = w.notifier.texts["detected"]
    assert len(detected) == 3
    for text in detected:
        assert "replacing it; no action needed" not in text
        assert "cordoned it" in text and "SIGTERM and 30s to checkpoint" in text
        assert "unless the storm brake or the attempt cap holds it for a person, which pages again" in text
    (storm,) = w.notifier.texts["storm"]
    assert "none is replaced until a human looks" in storm and "Action needed:" in storm


def test_an_escalated_node_with_spares_free_pages_that_the_pool_runs_short_and_what_to_do():
    w = World(fleet(max_attempts_per_node=1, grace_period_seconds=0))
    earlier = Remediation(name="h100-0-xid79-1", node="h100-0", pool="h100", xid=79, message="m",
                          phase=Phase.SUCCEEDED, created=T0 - timedelta(hours=2),
                          phase_times=((Phase.SUCCEEDED.value, T0 - timedelta(hours=2)),))
    w.store.objects[earlier.name] = json.dumps(to_object(earlier))
    w.fault("h100-0")
    w.run(seconds=3)
    assert w.remediation_named("h100-0", Phase.ESCALATED)
    assert not [c for c in w.provider.calls if c[0] == "promote"]
    (text,) = w.notifier.texts["escalated"]
    assert "does not replace it" in text and "pool h100 runs 1 Slurm node(s) (h100-w0) short" in text
    assert "although 2 spare(s) are free" in text and "Action needed: repair h100-0" in text


# --- refills the record, an Event and a metric account for (issue 23) -----------------------------------

def test_a_refill_nobody_answers_in_time_is_a_failed_refill_in_the_record_a_page_and_a_metric():
    w = World(fleet(grace_period_seconds=0, refill_timeout_seconds=120))
    w.fault("h100-0")
    w.run(seconds=2)
    r = w.remediation("h100-0")
    assert r.refill.state == "Requested" and r.refill.key == f"{r.name}/refill"
    w.run(seconds=100)
    assert w.remediation("h100-0").refill.state == "Requested" and "refill-failed" not in w.notifier.sent
    w.run(seconds=25)
    r = w.remediation("h100-0")
    assert r.refill.state == "Failed" and "nobody answered the capacity request for pool h100 within 120s" in r.refill.message
    assert w.notifier.sent.count("refill-failed") == 1 and "Action needed: add capacity to pool h100" in \
        w.notifier.texts["refill-failed"][0]
    assert ("withdraw", f"{r.name}/refill") in w.provider.calls
    assert w.manager.metrics.refills.labels("h100", "failed")._value.get() == 1
    condition = {c["type"]: c for c in json.loads(w.store.objects[r.name])["status"]["conditions"]}["Refilled"]
    assert (condition["status"], condition["reason"]) == ("False", "RefillFailed")
    w.restart()
    w.run(seconds=30)
    assert w.notifier.sent.count("refill-failed") == 1


def test_a_refill_a_node_answers_is_recorded_as_answered_when_the_node_joins():
    from gpufleet.reconciler.core.refills import request_name

    w = World(fleet(grace_period_seconds=0, refill_timeout_seconds=600))
    w.fault("h100-0")
    w.run(seconds=2)
    r = w.remediation("h100-0")
    joined = pool_node(w.spec.pool("h100"), "h100-spare-9", labels.ROLE_SPARE)
    joined["metadata"]["annotations"] = {labels.FULFILS: request_name("h100", r.refill.key)}  # membership settled it
    w.kube.nodes["h100-spare-9"] = joined
    w.run(seconds=1)
    r = w.remediation("h100-0")
    assert r.refill.state == "Answered" and "refill-failed" not in w.notifier.sent
    assert w.manager.metrics.refills.labels("h100", "answered")._value.get() == 1
    w.run(seconds=700, step=5)  # past the refill timeout (600 s)
    assert w.remediation("h100-0").refill.state == "Answered"


def test_a_slurm_node_whose_pod_landed_on_the_replacement_that_broke_is_resumed_only_on_the_next():
    """h100-w0's pod has just started on h100-spare-0 when that spare faults: h100-0's remediation takes
    h100-spare-1 and neither resumes h100-w0 on the broken spare nor calls itself a success; once the pod
    runs on h100-spare-1, h100-w0 is resumed there and the remediation succeeds."""
    w = World(fleet(nodes=4, spares=3, grace_period_seconds=0))
    w.fault("h100-0")
    w.run(seconds=2)
    assert w.remediation("h100-0").replacement == "h100-spare-0"
    pod = {"metadata": {"name": "slurm-worker-h100-w0", "namespace": "slurm", "uid": "uid-h100-w0-2",
                        "labels": {labels.SLINKY_POD_HOSTNAME: "h100-w0"}, "ownerReferences": [nodeset_owner("h100")]},
           "spec": {"nodeName": "h100-spare-0"}, "status": {"phase": "Running"}}
    w.kube.pods["slurm/slurm-worker-h100-w0"] = pod
    w.fault("h100-spare-0")
    w.run(seconds=5)
    r = w.remediation("h100-0")
    assert r.replacement == "h100-spare-1" and r.phase is Phase.RESUMING
    assert ("resume", "h100-w0") not in w.slurm.calls and "DRAIN" in w.slurm.table["h100-w0"].states
    moved = json.loads(json.dumps(pod))
    moved["spec"]["nodeName"], moved["metadata"]["uid"] = "h100-spare-1", "uid-h100-w0-3"
    w.kube.pods["slurm/slurm-worker-h100-w0"] = moved
    w.run(seconds=2)
    assert ("resume", "h100-w0") in w.slurm.calls and w.remediation("h100-0").phase is Phase.SUCCEEDED


def slurm_pod(host: str, node: str | None, uid: str, unschedulable: str = "") -> dict:
    """A NodeSet pod as the API server sends it: placed on `node`, or Pending with the scheduler's words."""
    status = {"phase": "Running"} if node else {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}]}
    return {"metadata": {"name": f"slurm-worker-{host}", "namespace": "slurm", "uid": uid,
                         "labels": {labels.SLINKY_POD_HOSTNAME: host}, "ownerReferences": [nodeset_owner("h100")]},
            "spec": {"nodeName": node} if node else {}, "status": status}


def test_a_heal_whose_own_slurm_nodes_pod_cannot_be_scheduled_is_not_a_success():
    """The drill's false success: another Slurm node's pod lands on the replacement and takes jobs, while the
    remediation's own (h100-w0) stays Pending with nowhere to go. Not a success: the spare is given up (it counts
    for the Slurm node that runs there), the record says so, and another spare is promoted; the heal succeeds once
    h100-w0's pod runs there and Slurm takes jobs."""
    w = World(fleet(grace_period_seconds=0))
    w.fault("h100-0")
    w.run(seconds=2)
    assert w.remediation("h100-0").phase is Phase.RESUMING
    why = "0/12 nodes are available: 10 node(s) had untolerated taint {gpufleet.io/spare: true}, 2 node(s) were unschedulable."
    w.kube.pods["slurm/slurm-worker-h100-w0"] = slurm_pod("h100-w0", None, "uid-h100-w0-2", why)
    w.kube.pods["slurm/slurm-worker-h100-w9"] = slurm_pod("h100-w9", "h100-spare-0", "uid-h100-w9")
    w.slurm.table["h100-w9"] = SlurmNode("h100-w9", frozenset({"IDLE"}), "")
    w.run(seconds=2)
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-1" and ("resume", "h100-w0") not in w.slurm.calls
    assert "h100-spare-0 took Slurm node(s) h100-w9 instead of h100-w0" in r.reason
    w.kube.pods["slurm/slurm-worker-h100-w0"] = slurm_pod("h100-w0", "h100-spare-1", "uid-h100-w0-2")
    w.run(seconds=2)
    assert ("resume", "h100-w0") in w.slurm.calls and w.remediation("h100-0").phase is Phase.SUCCEEDED


def test_two_heals_on_one_spare_both_end_when_the_scheduler_gives_it_to_the_other_slurm_node():
    """A 2-node job's two nodes fault together; the pool has one spare. One remediation promotes it, the other
    waits for a spare; the scheduler puts the waiting one's Slurm node on the promoted spare, and the first's pod
    can go nowhere. Neither heal waits on the other: the spare counts for the Slurm node that runs there, whose
    node is quarantined and repaired; the other waits for a spare, takes that repaired node when it comes back,
    and the job's two Slurm nodes run again; both faulted nodes end repaired."""
    w = World(fleet(nodes=2, spares=1, grace_period_seconds=0, max_unhealthy_fraction=1.0))
    two_node_job(w)
    for n in ("h100-0", "h100-1"):
        w.hardware.state[n] = FakeNodes.REBOOT_FIXES
        w.fault(n)
    w.run(seconds=3)
    rs = {n: w.remediation(n) for n in ("h100-0", "h100-1")}
    (first,) = [n for n, r in rs.items() if r.replacement == "h100-spare-0"]
    (second,) = [n for n, r in rs.items() if r.phase is Phase.WAITING_FOR_SPARE]
    mine, theirs = f"h100-w{first[-1]}", f"h100-w{second[-1]}"
    # the scheduler: the waiting remediation's Slurm node on the promoted spare, the first's with nowhere to go
    why = "0/3 nodes are available: 2 node(s) were unschedulable, 1 node(s) didn't match pod anti-affinity rules."
    w.kube.evicted.clear()
    w.kube.pods[f"slurm/slurm-worker-{theirs}"] = slurm_pod(theirs, "h100-spare-0", f"uid-{theirs}-2")
    w.kube.pods[f"slurm/slurm-worker-{mine}"] = slurm_pod(mine, None, f"uid-{mine}-2", why)
    w.slurm.table[theirs] = replace(w.slurm.table[theirs], comment=json.dumps({"node": "h100-spare-0"}))
    w.run(seconds=3)
    a, b = w.remediation_named(first, Phase.WAITING_FOR_SPARE), w.remediation(second)
    assert b.phase is Phase.SUCCEEDED and b.replacement == "h100-spare-0" and ("resume", theirs) in w.slurm.calls
    assert "came back on h100-spare-0" in b.reason and f"h100-spare-0 took Slurm node(s) {theirs}" in a.reason
    # the first's pod is placed by the operator once a node takes it (the second's node, repaired, promoted)
    w.kube.evicted.append(w.kube.pods.pop(f"slurm/slurm-worker-{mine}"))
    w.operator = True
    w.run(seconds=400, step=2.0)
    a, b = w.remediation(first), w.remediation(second)
    assert a.phase is b.phase is Phase.SUCCEEDED, (a, b)
    assert a.repair is not None and a.repair.phase is RepairPhase.RETURNED, a.repair
    assert b.repair is not None and b.repair.phase is RepairPhase.RETURNED, b.repair
    hosts = {w.kube.pods[f"slurm/slurm-worker-{h}"]["spec"].get("nodeName") for h in (mine, theirs)}
    assert len(hosts) == 2 and None not in hosts


@pytest.mark.parametrize("spares, after", [(0, 2), (2, 700)], ids=["no-spare", "failed"])
def test_every_page_says_what_gpufleet_does_and_whether_a_person_must_act(spares, after):
    """No spare (capacity requested: nobody need act yet), and a remediation that fails (its Slurm node's pod
    never placed within the resume timeout: a person must): each page says which."""
    w = World(fleet(spares=spares, grace_period_seconds=0))
    w.fault("h100-0")
    w.run(seconds=after, step=5)
    event = "no-spare" if spares == 0 else "failed"
    (text,) = w.notifier.texts[event]
    assert "h100-0 stays cordoned and drained in Slurm" in text or "it stays cordoned and drained in Slurm" in text
    if event == "no-spare":
        assert "the pool runs 1 Slurm node(s) (h100-w0) short" in text and text.endswith("No action needed now.")
    else:
        assert "Action needed: see why (`kubectl describe remediation h100-0-" in text
    for texts in w.notifier.texts.values():
        assert all("ction needed" in t or t.startswith("h100-0 replaced by") for t in texts)


def test_a_passs_action_that_meets_a_temporary_error_is_deferred_logged_and_counted():
    """The timed passes (person holds, lending, Slurm drains) run their actions through `run_or_defer`: Slurm
    unreachable for one action is counted in gpufleet_action_errors_total and the pass goes on; the next round
    runs it."""
    from gpufleet.reconciler.core.actions import DrainSlurm

    w = World(fleet(nodes=2, spares=0))
    errors = w.manager.metrics.action_errors.labels("DrainSlurm", "temporary")
    before = errors._value.get()
    w.slurm.unreachable = True
    assert w.manager.executor.run_or_defer(DrainSlurm("h100-w0", "gpufleet: test"), "test") is False
    assert errors._value.get() == before + 1
    w.slurm.unreachable = False
    assert w.manager.executor.run_or_defer(DrainSlurm("h100-w0", "gpufleet: test"), "test") is True
    assert w.slurm.calls.count(("drain", "h100-w0")) == 1 and w.slurm.table["h100-w0"].reason == "gpufleet: test"
