"""The runtime (informers, work queue, workers, fencing, intents) with fakes of the adapters and a
fake clock: what it does around the core when things fail, restart or race."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest

from fleetspec import labels, parse_fleet
from reconciler.errors import TemporaryError
from localenv.fake_nodes import pool_node
from reconciler.core.phases import Phase
from reconciler.adapters.records import MemoryRecordStore, to_object
from reconciler.runtime.controller import Runtime
from reconciler.adapters.slurm import SlurmError, SlurmJob, SlurmNode
from reconciler.runtime.workqueue import WorkQueue

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def mono(self) -> float:
        return self.now.timestamp()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class FakeKube:
    """Nodes and pods as dicts; every write recorded."""

    def __init__(self, store: MemoryRecordStore):
        self.store, self.nodes, self.pods, self.calls = store, {}, {}, []
        self.down = False

    def list_page(self, kind, limit=500, cont=None):
        if self.down:
            raise TemporaryError(f"list {kind}: connection refused")
        items = {"nodes": list(self.nodes.values()), "pods": list(self.pods.values()),
                 "remediations": [json.loads(v) for v in self.store.objects.values()]}[kind]
        return items, "1", None

    def watch(self, kind, rv, timeout_seconds=300):
        return iter(())

    def _write(self, *call):
        if self.down:
            raise TemporaryError(f"{call[0]}: connection refused")
        self.calls.append(call)

    def cordon(self, name, reason, remediation=None):
        self._write("cordon", name)
        self.nodes[name]["spec"]["unschedulable"] = True

    def apply_membership(self, name, set_labels, add_taints=(), set_annotations=None):
        self._write("membership", name)
        n = self.nodes[name]
        n["metadata"]["labels"].update(set_labels)
        n["metadata"].setdefault("annotations", {}).update(set_annotations or {})
        n["spec"]["taints"] = (n["spec"].get("taints") or []) + [dict(t) for t in add_taints]

    def patch_node(self, name, body):
        self._write("patch", name)
        self.nodes[name]["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])

    def evict(self, pod):
        self._write("evict", pod["metadata"]["name"])
        self.pods.pop(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", None)
        return True

    def event(self, involved, reason, message, type_="Normal", namespace="default"):
        self.calls.append(("event", reason))


class FakeSlurm:
    def __init__(self):
        self.nodes: dict[str, SlurmNode] = {}
        self.jobs: dict[int, SlurmJob] = {}
        self.calls, self.down = [], False

    def _check(self, what):
        if self.down:
            raise SlurmError(f"{what}: Unable to contact slurm controller", temporary=True)

    def node(self, name):
        self._check("node")
        if name not in self.nodes:
            raise SlurmError(f"node {name} not found")
        return self.nodes[name]

    def jobs_on_node(self, name):
        self._check("jobs")
        return [j for j in self.jobs.values() if name in j.nodes and j.state == "RUNNING"]

    def drain(self, name, reason):
        self._check("drain")
        self.calls.append(("drain", name))
        self.nodes[name] = SlurmNode(name, frozenset({"IDLE", "DRAIN"}), reason)

    def signal_jobs(self, ids, signal="TERM"):
        self._check("signal")
        self.calls.append(("signal", tuple(ids)))

    def requeue(self, ids):
        self._check("requeue")
        self.calls.append(("requeue", tuple(ids)))
        for i in ids:
            self.jobs[i] = SlurmJob(i, "j", "PENDING")

    def resume(self, name):
        self._check("resume")
        self.calls.append(("resume", name))
        self.nodes[name] = SlurmNode(name, frozenset({"IDLE"}), "")

    def release(self, ids):
        self.calls.append(("release", tuple(ids)))


class Provider:
    def __init__(self, kube: FakeKube):
        self.kube, self.calls = kube, []
        self.fail_return = False

    def _role(self, name, role, taint=None):
        n = self.kube.nodes[name]
        n["metadata"]["labels"][labels.ROLE] = role
        n["spec"]["taints"] = [taint] if taint else None
        n["spec"]["unschedulable"] = None if role == labels.ROLE_ACTIVE else n["spec"].get("unschedulable")

    def promote(self, spare, replaces):
        self.calls.append(("promote", spare))
        self._role(spare, labels.ROLE_ACTIVE)

    def quarantine(self, node, xid):
        self.calls.append(("quarantine", node))
        self._role(node, labels.ROLE_QUARANTINED, {"key": labels.QUARANTINE_TAINT, "effect": "NoSchedule"})

    def request_capacity(self, pool, reason, key):
        self.calls.append(("capacity", key))

    def membership_facts(self):
        from reconciler.core.membership import MembershipFacts

        return MembershipFacts()

    def settle_capacity_requests(self, nodes=None):
        return []

    def return_to_spares(self, node):
        if self.fail_return:
            raise TemporaryError("return to spares: conflict")
        self.calls.append(("return", node))


class Notifier:
    namespace = "default"

    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg.event)


def fleet(nodes=10, spares=2, pools=("h100",), **healing):
    return parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": p, "node_type": "x", "gpu_model": "H100", "nodes": nodes, "spares": spares} for p in pools],
        "slurm": {"partitions": [{"name": "train", "pools": list(pools)}]},
        "healing": {"grace_period_seconds": 60, "max_concurrent": 4, "max_unhealthy_fraction": 0.5,
                    "drain_timeout_seconds": 10, **healing},
    })


class World:
    """A fleet whose pools' nodes each run one NodeSet pod named as Slinky names them."""

    def __init__(self, spec, fence=lambda: True):
        self.spec, self.clock = spec, Clock()
        self.store = MemoryRecordStore()
        self.kube, self.slurm, self.notifier = FakeKube(self.store), FakeSlurm(), Notifier()
        self.provider = Provider(self.kube)
        for pool in spec.pools:
            for i, name in enumerate(pool.node_names()):
                self.kube.nodes[name] = self._ready(pool_node(pool, name, labels.ROLE_ACTIVE))
                host = f"{pool.name}-w{i}"
                self.kube.pods[f"slurm/slurm-worker-{host}"] = {
                    "metadata": {"name": f"slurm-worker-{host}", "namespace": "slurm",
                                 "labels": {labels.SLINKY_POD_HOSTNAME: host}},
                    "spec": {"nodeName": name}, "status": {"phase": "Running"}}
                self.slurm.nodes[host] = SlurmNode(host, frozenset({"ALLOCATED"}), "")
            for name in pool.spare_names():
                self.kube.nodes[name] = self._ready(pool_node(pool, name, labels.ROLE_SPARE))
        self.fence = fence
        self.runtime = self.make_runtime()

    @staticmethod
    def _ready(node):
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        return node

    def make_runtime(self) -> Runtime:
        """A (re)started reconciler: fresh caches and queue, the same API objects."""
        rt = Runtime(self.spec, self.kube, self.store, self.slurm, {p.name: self.provider for p in self.spec.pools},
                     self.notifier, clock=self.clock, fence=lambda: self.fence(),
                     queue=WorkQueue(clock=self.clock.mono))
        return rt

    def sync(self):
        """What the watches would deliver: the informers report what changed, and queue it."""
        for i in self.runtime.informers:
            i.relist()

    def fault(self, node, xid=79):
        self.kube.nodes[node]["status"]["conditions"].append(
            {"type": "GpuHealthy", "status": "False", "reason": f"Xid{xid}", "message": "off the bus",
             "lastTransitionTime": self.clock.now.isoformat()})

    def run(self, seconds=0.0, step=0.5):
        """Sync, then process what is due, advancing the fake clock in steps."""
        end = self.clock.now + timedelta(seconds=seconds)
        while True:
            for _ in range(50):
                self.sync()
                if not self.runtime.drain():
                    break
            if self.clock.now >= end:
                return
            self.clock.advance(step)

    def record(self, node):
        (r,) = [r for r in self.store.list() if r.node == node]
        return r


def test_nothing_is_decided_before_every_cache_has_listed():
    w = World(fleet())
    w.fault("h100-0")
    w.runtime.nodes.relist()  # nodes listed, pods and records not yet
    w.runtime.queue.add("h100-0")
    w.runtime.drain()
    assert w.store.objects == {} and w.kube.calls == []
    w.run()
    assert w.record("h100-0").phase is not Phase.DETECTED


def test_a_fault_heals_with_slurm_names_from_the_nodeset_pods():
    w = World(fleet(grace_period_seconds=0))
    w.fault("h100-3")
    w.run()
    r = w.record("h100-3")
    assert r.slurm_nodes == ("h100-w3",)  # not the Kubernetes name
    assert ("drain", "h100-w3") in w.slurm.calls and ("cordon", "h100-3") in w.kube.calls
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"


def test_containment_under_the_brake_cordons_and_drains_every_fault_and_replaces_none():
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0))
    for i in range(5):
        w.fault(f"h100-{i}")
    w.run()
    records = w.store.list()
    assert len(records) == 5 and {r.phase for r in records} == {Phase.HELD}
    assert all("unhealthy" in r.held for r in records)
    assert {c[1] for c in w.kube.calls if c[0] == "cordon"} == {f"h100-{i}" for i in range(5)}
    assert {c[1] for c in w.slurm.calls if c[0] == "drain"} == {f"h100-w{i}" for i in range(5)}
    assert not [c for c in w.provider.calls if c[0] == "promote"]
    assert w.notifier.sent.count("storm") == 1  # one page for the pool, not one per node


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


def test_parallel_workers_never_give_a_spare_twice():
    w = World(fleet(nodes=40, spares=20, max_concurrent=100, max_unhealthy_fraction=1.0, grace_period_seconds=0))
    for i in range(20):
        w.fault(f"h100-{i}")
    w.sync()
    stop = threading.Event()
    threads = [threading.Thread(target=w.runtime._work, args=(stop, None)) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            if len([c for c in w.provider.calls if c[0] == "promote"]) >= 20:
                break
            w.sync()  # what the watches would deliver
            w.clock.advance(0.5)
            stop.wait(0.05)
    finally:
        stop.set()
        w.runtime.queue.shut_down()
        for t in threads:
            t.join()
    promoted = [c[1] for c in w.provider.calls if c[0] == "promote"]
    assert len(promoted) == 20 and len(set(promoted)) == 20


def test_backoff_is_honoured_across_wakes_and_restarts():
    w = World(fleet())
    w.slurm.down = True
    w.fault("h100-0")
    w.run()
    r = w.record("h100-0")
    assert r.phase is Phase.DETECTED or r.retries >= 1
    tries = r.retries
    for _ in range(20):  # many wakes (events) within the backoff: no extra attempt
        w.runtime.queue.add("h100-0")
        w.runtime.drain()
    assert w.record("h100-0").retries == tries
    w.runtime = w.make_runtime()  # a restart reads the backoff from the record
    w.sync()
    w.runtime.drain()
    assert w.record("h100-0").retries == tries


def test_a_slurm_outage_of_a_minute_is_outlived():
    w = World(fleet(grace_period_seconds=30))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    w.run()
    assert w.record("h100-0").phase is Phase.CHECKPOINTING
    w.slurm.down = True
    w.run(seconds=60)
    r = w.record("h100-0")
    assert r.phase is Phase.CHECKPOINTING and r.retries > 3  # failing, not Failed
    w.slurm.down = False
    w.slurm.jobs[7] = SlurmJob(7, "train", "COMPLETED", nodes=("h100-w0",))
    w.run(seconds=40)
    r = w.record("h100-0")
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
    w.runtime.resync()  # what the run loop does when this replica starts leading
    w.run()
    assert w.store.objects != {} and ("cordon", "h100-0") in w.kube.calls


class Crash(BaseException):
    """The reconciler dies here (not an error it could handle)."""


def crash_after(w: World, n: int, calls, seconds: float) -> None:
    """Run the world until the n-th of these calls (object, method), which kills the reconciler
    before it is made; then restart it: fresh caches and queue, the same API objects."""
    made = {"n": 0}
    originals = {}

    def counting(fn):
        def wrapped(*a, **kw):
            made["n"] += 1
            if made["n"] == n:
                raise Crash()
            return fn(*a, **kw)
        return wrapped

    for obj, name in calls:
        originals[(obj, name)] = getattr(obj, name)
        setattr(obj, name, counting(getattr(obj, name)))
    try:
        w.run(seconds=seconds)
    except Crash:
        pass
    for (obj, name), fn in originals.items():
        setattr(obj, name, fn)
    w.runtime = w.make_runtime()


@pytest.mark.parametrize("crash_at", range(1, 12))
def test_one_sigterm_and_one_notification_across_a_crash_at_every_point(crash_at):
    """Kill the reconciler after its n-th write (any write: a record, a cordon, a Slurm call), restart
    it, and finish: every once-only action happened at most once."""
    w = World(fleet(grace_period_seconds=60))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    crash_after(w, crash_at, [(w.store, "update"), (w.store, "create"), (w.kube, "cordon"), (w.slurm, "drain"),
                              (w.slurm, "signal_jobs"), (w.slurm, "requeue"), (w.notifier, "send")], seconds=2)
    w.slurm.jobs[7] = SlurmJob(7, "train", "COMPLETED", nodes=("h100-w0",))
    w.run(seconds=70)
    assert [c for c in w.slurm.calls if c[0] == "signal"].__len__() <= 1
    assert w.notifier.sent.count("detected") <= 1
    assert w.record("h100-0").phase in (Phase.RESUMING, Phase.SUCCEEDED)


def counted_writes(w) -> list[tuple[str, str]]:
    """The record writes the runtime makes, as (create | update, phase written)."""
    made: list[tuple[str, str]] = []
    for name in ("create", "update"):
        fn = getattr(w.store, name)

        def wrapped(record, _fn=fn, _name=name):
            made.append((_name, record.phase.value))
            return _fn(record)
        setattr(w.store, name, wrapped)
    return made


def test_steps_that_carry_are_written_with_the_next_and_every_phase_stays_on_the_record():
    """No job on the node, grace 0. The first reconcile cordons, creates the record (before any Slurm
    call, so its page goes out first), drains in Slurm and writes the end of containment. Admission,
    eviction's end and the spare's choice are one more write; the promotion one more (it waits for the
    Slurm node on the replacement). Not one write per phase: eight before."""
    w = World(fleet(grace_period_seconds=0))
    writes = counted_writes(w)
    at_create = []
    create = w.store.create

    def creating(r):
        at_create.append((list(w.notifier.sent), list(w.slurm.calls), list(w.kube.calls)))
        return create(r)
    w.store.create = creating
    w.fault("h100-0")
    w.runtime.nodes.relist()
    w.runtime.pods.relist()
    w.runtime.records.relist()
    key = w.runtime.queue.get(timeout=0)
    assert key == "h100-0"  # a new fault is first in line
    w.runtime.process(key)  # one reconcile
    assert writes == [("create", "SlurmDraining"), ("update", "Requeued")]
    assert at_create == [([], [], [("cordon", "h100-0")])]  # cordoned, nothing sent or asked of Slurm yet
    assert w.notifier.sent == ["detected"] and ("drain", "h100-w0") in w.slurm.calls
    w.run(seconds=3)
    r = w.record("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"
    assert [p for p, _ in r.phase_times] == ["Detected", "SlurmDraining", "Checkpointing", "Requeued", "Evicting",
                                             "Replacing", "Resuming"]
    # the NodeSet pod's eviction is waited for (written), then the choice, then the promotion
    assert [p for _, p in writes] == ["SlurmDraining", "Requeued", "Evicting", "Replacing", "Resuming"]
    assert w.notifier.sent.count("detected") == 1


@pytest.mark.parametrize("crash_at", range(1, 10))
def test_a_crash_amid_carried_steps_repeats_no_page_and_promotes_one_spare(crash_at):
    """Kill the reconciler after its n-th call (record writes, cordon, drain, eviction, promotion,
    quarantine, notification) on the path where most steps carry, restart it, and finish."""
    w = World(fleet(grace_period_seconds=0))
    w.fault("h100-0")
    crash_after(w, crash_at, [(w.store, "update"), (w.store, "create"), (w.kube, "cordon"), (w.slurm, "drain"),
                              (w.kube, "evict"), (w.provider, "promote"), (w.provider, "quarantine"),
                              (w.notifier, "send")], seconds=4)
    w.run(seconds=6)
    r = w.record("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"
    assert {c[1] for c in w.provider.calls if c[0] == "promote"} == {"h100-spare-0"}
    assert w.notifier.sent.count("detected") <= 1
    assert ("cordon", "h100-0") in w.kube.calls


def test_a_corrupt_record_halts_only_its_own_node():
    w = World(fleet(grace_period_seconds=0))
    bad = to_object(w_record := __import__("reconciler.core.model", fromlist=["Record"]).Record(
        name="h100-1-xid79-1", node="h100-1", pool="h100", xid=79, message="m", phase=Phase.EVICTING, created=T0))
    bad["status"]["phase"] = "Exploded"
    w.store.objects[w_record.name] = json.dumps(bad)
    w.fault("h100-1")
    w.fault("h100-2")
    w.run()
    assert w.record("h100-2").phase is not Phase.DETECTED
    assert ("cordon", "h100-1") not in w.kube.calls
    assert ("event", "RemediationUnreadable") in w.kube.calls


def test_a_failing_return_to_spares_is_isolated_to_its_node():
    w = World(fleet(grace_period_seconds=0))
    q = w.kube.nodes["h100-9"]
    q["metadata"]["labels"][labels.ROLE] = labels.ROLE_QUARANTINED
    q["status"]["conditions"].append({"type": "GpuHealthy", "status": "True", "reason": "HealthCheckPassed"})
    w.provider.fail_return = True
    w.fault("h100-0")
    w.run()
    assert w.record("h100-0").phase is not Phase.DETECTED


def test_waiting_for_a_spare_holds_no_slot_of_another_pool():
    w = World(fleet(nodes=4, spares=0, pools=("a100", "h100"), max_concurrent=1, max_unhealthy_fraction=1.0,
                    grace_period_seconds=0))
    w.fault("a100-0")
    w.run()
    assert w.record("a100-0").phase is Phase.WAITING_FOR_SPARE
    # h100 gets a spare: its fault is replaced although a100 waits
    spare = w.spec.pool("h100")
    w.kube.nodes["h100-spare-0"] = w._ready(pool_node(spare, "h100-spare-0", labels.ROLE_SPARE))
    w.fault("h100-0")
    w.run(seconds=2)
    assert w.record("h100-0").phase in (Phase.RESUMING, Phase.SUCCEEDED)


def test_occurrences_are_counted_on_the_node_so_a_restart_keeps_counting():
    w = World(fleet(occurrences=2, occurrence_window_seconds=600, grace_period_seconds=0))
    w.fault("h100-0")
    w.run()
    assert w.store.objects == {}  # one signal of two
    w.runtime = w.make_runtime()  # restarted: memory gone
    w.clock.advance(30)
    cond = w.kube.nodes["h100-0"]["status"]["conditions"]
    cond[:] = [c for c in cond if c["type"] != "GpuHealthy"]
    w.fault("h100-0")  # the second signal, after the restart
    w.run()
    assert w.record("h100-0").phase is not Phase.DETECTED


def test_a_node_that_joins_is_labelled_into_its_pool_and_a_gpu_node_of_no_pool_is_reported():
    spec = fleet()
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(update={"member_selector": {"team": "h100"}})]})
    w = World(spec)
    w.kube.nodes["new-0"] = w._ready({"metadata": {"name": "new-0", "labels": {"team": "h100"}}, "spec": {},
                                      "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    w.kube.nodes["stray-0"] = w._ready({"metadata": {"name": "stray-0", "labels": {}}, "spec": {},
                                        "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    w.run(seconds=2)
    joined = w.kube.nodes["new-0"]["metadata"]["labels"]
    assert joined[labels.POOL] == "h100" and joined[labels.ROLE] == labels.ROLE_SPARE  # the pool's actives are full
    assert labels.SPARE_TAINT in {t["key"] for t in w.kube.nodes["new-0"]["spec"]["taints"]}
    assert ("event", "NodeInNoPool") in w.kube.calls
    assert w.runtime.metrics.unlabelled._value.get() == 1


def test_own_relabels_queue_no_membership_pass_a_joining_node_does():
    """Promote and quarantine relabel members (a pass reads every node: at 10,000 nodes the costliest
    part of a heal); a node that joins is placed within seconds."""
    w = World(fleet(grace_period_seconds=0))
    w.run(seconds=1)
    passes = []
    membership = w.runtime._membership
    w.runtime._membership = lambda: passes.append(w.clock.now) or membership()
    w.fault("h100-3")
    w.run(seconds=10)
    assert w.record("h100-3").phase in (Phase.RESUMING, Phase.SUCCEEDED)
    assert w.kube.nodes["h100-spare-0"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_ACTIVE  # relabelled
    assert passes == []
    w.kube.nodes["new-0"] = w._ready({"metadata": {"name": "new-0", "labels": {}}, "spec": {},
                                      "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    w.run(seconds=2)
    assert len(passes) == 1


# --- lending through the same queue and fence ------------------------------------------------------------

class LendingKube(FakeKube):
    """FakeKube with the lending calls and the ledger ConfigMap."""

    def __init__(self, store):
        super().__init__(store)
        self.ledger: dict[str, str] = {}

    def lend(self, name, pool, loan, since):
        self._write("lend", name)
        n = self.nodes[name]
        n["spec"]["taints"] = [t for t in n["spec"].get("taints") or [] if t["key"] != labels.SPARE_TAINT] + [
            {"key": labels.LENDING_TAINT, "value": pool, "effect": "NoSchedule"}]
        n["metadata"]["labels"][labels.LENT] = loan
        n["metadata"].setdefault("annotations", {})[labels.LENT_SINCE] = since

    def read_ledger(self, namespace):
        if self.down:
            raise TemporaryError("get the lending ledger: connection refused")
        return dict(self.ledger)

    def write_ledger(self, namespace, pool, text):
        self._write("ledger", pool)
        self.ledger[pool] = text


def lending_world(fence=lambda: True) -> World:
    spec = parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 2, "spares": 2,
                   "lending": {"spares": True, "spare_floor": 1, "borrowers": {"selector": {"app": "inference"}}}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })
    w = World(spec, fence)
    kube = LendingKube(w.store)
    kube.nodes, kube.pods = w.kube.nodes, w.kube.pods
    w.kube = kube
    w.runtime = w.make_runtime()
    w.runtime.slurm = SlurmShim(w.slurm)
    w.runtime.resync()  # what the run loop does first: it queues the lending pass
    return w


class SlurmShim:
    """FakeSlurm with the two calls the lending pass makes (its `nodes` attribute is the node table)."""

    def __init__(self, fake: FakeSlurm):
        self.fake = fake

    def __getattr__(self, name):
        return getattr(self.fake, name)

    def nodes(self):
        self.fake._check("nodes")
        return list(self.fake.nodes.values())

    def pending_jobs(self):
        self.fake._check("jobs")
        return []


def test_lending_is_fenced_and_lends_the_spare_beyond_the_floor_once_the_lease_is_held():
    from reconciler.core import ledger

    leading = {"yes": False}
    w = lending_world(fence=lambda: leading["yes"])
    w.run(seconds=3)
    assert w.kube.calls == []  # no lend, no ledger write without the Lease
    leading["yes"] = True
    w.runtime.resync()
    w.run(seconds=3)
    assert [c for c in w.kube.calls if c[0] == "lend"] == [("lend", "h100-spare-1")]  # spare-0 is the floor
    book = ledger.parse(w.kube.ledger["h100"], "h100")
    assert [(x.node, x.kind) for x in book.loans if x.open] == [("h100-spare-1", "spare")]
    assert (book.capacity.spares_lent, book.capacity.spares_unlent) == (1, 1)


def test_a_ledger_the_api_could_not_take_is_written_on_a_later_pass_and_a_restart_keeps_the_loan():
    from reconciler.core import ledger

    w = lending_world()
    w.kube.ledger = {}
    original = w.kube.write_ledger
    w.kube.write_ledger = lambda ns, pool, text: (_ for _ in ()).throw(TemporaryError("patch: timeout"))
    w.run(seconds=3)
    assert ("lend", "h100-spare-1") in w.kube.calls and w.kube.ledger == {}
    w.kube.write_ledger = original
    w.run(seconds=2)
    assert ledger.parse(w.kube.ledger["h100"]).lent_nodes() == ("h100-spare-1",)
    w.runtime = w.make_runtime()  # a restart: nothing in memory, the loan is on the node and in the ledger
    w.runtime.slurm = SlurmShim(w.slurm)
    w.runtime.resync()
    w.run(seconds=3)
    book = ledger.parse(w.kube.ledger["h100"])
    assert [x.node for x in book.loans] == ["h100-spare-1"]  # one loan, not a second one
    assert [c for c in w.kube.calls if c[0] == "lend"] == [("lend", "h100-spare-1")]  # not lent again


def test_the_retention_pass_deletes_old_finished_records_and_keeps_recent_and_live_ones():
    from reconciler.core.model import Record
    from reconciler.runtime.controller import RETENTION

    leading = [True]
    w = World(fleet(record_retention_days=30), fence=lambda: leading[0])

    def put(name, node, phase, days_ago):
        at = T0 - timedelta(days=days_ago)
        r = Record(name=name, node=node, pool="h100", xid=79, message="m", phase=phase, created=at,
                   phase_times=((phase.value, at),))
        w.store.objects[name] = json.dumps(to_object(r))

    put("old-1", "h100-1", Phase.SUCCEEDED, 40)
    put("old-2", "h100-2", Phase.FAILED, 31)
    put("recent", "h100-3", Phase.SUCCEEDED, 2)
    put("live", "h100-4", Phase.WAITING_FOR_SPARE, 60)
    w.sync()
    leading[0] = False  # a replica without the Lease deletes nothing
    w.runtime.queue.add(RETENTION)
    w.runtime.drain()
    assert set(w.store.objects) == {"old-1", "old-2", "recent", "live"}
    leading[0] = True
    w.runtime.resync()  # queues the retention pass, as a new leader does
    w.run(seconds=2)
    assert set(w.store.objects) == {"recent", "live"}
    assert {r.name for r in w.runtime.records.values()} == {"recent", "live"}
