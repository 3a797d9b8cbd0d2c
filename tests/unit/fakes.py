"""Fakes of the reconciler's adapters and a fake clock, for tests of the runtime without an API server,
a Slurm or a cloud: a fleet whose every write is recorded."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from fleetspec import labels, parse_fleet
from fleetspec.models import FleetSpec, NodePool
from fleetspec.placement import node_labels, node_taints
from reconciler.adapters.records import MemoryRemediationStore
from reconciler.adapters.slurm import SlurmError, SlurmJob, SlurmNode
from reconciler.core.membership import MembershipFacts
from reconciler.errors import TemporaryError
from reconciler.runtime.manager import Manager

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


def pool_node(pool: NodePool, name: str, role: str) -> dict:
    """A Ready node of the pool in a role, as the API server would send it."""
    return {"metadata": {"name": name, "labels": node_labels(pool, role)},
            "spec": {"taints": node_taints(pool, role) or None},
            "status": {"capacity": {"nvidia.com/gpu": str(pool.gpus_per_node)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


class FakeKube:
    """Nodes and pods as dicts; every write recorded in `calls`."""

    def __init__(self, store: MemoryRemediationStore):
        self.store, self.nodes, self.pods, self.calls = store, {}, {}, []
        self.down = False
        self.ledger: dict[str, str] = {}

    def list_page(self, kind, limit=500, cont=None):
        if self.down:
            raise TemporaryError(f"list {kind}: connection refused")
        items = {"nodes": list(self.nodes.values()), "pods": list(self.pods.values()),
                 "remediations": [json.loads(v) for v in self.store.objects.values()]}[kind]
        return json.loads(json.dumps(items)), "1", None

    def watch(self, kind, rv, timeout_seconds=300):
        return iter(())

    def _write(self, *call):
        if self.down:
            raise TemporaryError(f"{call[0]}: connection refused")
        self.calls.append(call)

    def cordon(self, name, reason, remediation=None):
        self._write("cordon", name)
        self.nodes[name]["spec"]["unschedulable"] = True
        return json.loads(json.dumps(self.nodes[name]))

    def apply_membership(self, name, set_labels, add_taints=()):
        self._write("membership", name)
        n = self.nodes[name]
        n["metadata"]["labels"].update(set_labels)
        n["spec"]["taints"] = (n["spec"].get("taints") or []) + [dict(t) for t in add_taints]

    def patch_node(self, name, body):
        self._write("patch", name)
        self.nodes[name]["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return json.loads(json.dumps(self.nodes[name]))

    def evict(self, pod, grace_seconds=None):
        self._write("evict", pod["metadata"]["name"])
        self.pods.pop(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", None)
        return True

    def event(self, involved, reason, message, type_="Normal", namespace="default"):
        self._write("event", reason)

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

    def flush_events(self, timeout=5.0):
        return True


class FakeSlurm:
    """Slurm nodes and jobs; every change recorded in `calls` (reads are not)."""

    def __init__(self):
        self.table: dict[str, SlurmNode] = {}
        self.jobs: dict[int, SlurmJob] = {}
        self.calls, self.down = [], False
        self.comments: dict[int, str] = {}  # admin comments (their writes are not in `calls`)
        self.comment_writes = 0

    def _check(self, what):
        if self.down:
            raise SlurmError(f"{what}: Unable to contact slurm controller", temporary=True)

    def node(self, name):
        self._check("node")
        if name not in self.table:
            raise SlurmError(f"node {name} not found")
        return self.table[name]

    def nodes(self):
        self._check("nodes")
        return sorted(self.table.values(), key=lambda n: n.name)

    def pending_jobs(self):
        self._check("jobs")
        return [j for j in self.jobs.values() if j.state == "PENDING"]

    def jobs_on_node(self, name):
        self._check("jobs")
        return [j for j in self.jobs.values() if name in j.nodes and j.state == "RUNNING"]

    def drain(self, name, reason):
        self._check("drain")
        self.calls.append(("drain", name))
        self.table[name] = SlurmNode(name, frozenset({"IDLE", "DRAIN"}), reason)

    def signal_jobs(self, ids, signal="TERM"):
        self._check("signal")
        self.calls.append(("signal", tuple(ids)))

    def requeue(self, ids):
        self._check("requeue")
        self.calls.append(("requeue", tuple(ids)))
        for i in ids:  # as Slurm: the same job, back in the queue (its owner, comments... kept)
            self.jobs[i] = replace(self.jobs[i], state="PENDING", nodes=()) if i in self.jobs else SlurmJob(i, "j", "PENDING")

    def resume(self, name):
        self._check("resume")
        self.calls.append(("resume", name))
        self.table[name] = SlurmNode(name, frozenset({"IDLE"}), "")

    def release(self, ids):
        self.calls.append(("release", tuple(ids)))

    def job(self, job_id):
        self._check("job")
        j = self.jobs.get(job_id)
        return replace(j, admin_comment=self.comments.get(job_id, "")) if j else None

    def set_admin_comment(self, job_id, text):
        self._check("admin comment")
        self.comment_writes += 1
        self.comments[job_id] = text


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
        self.to_owners = []  # (route, Message)

    def send(self, msg):
        self.sent.append(msg.event)

    def send_to(self, route, msg):
        self.to_owners.append((route, msg))


def fleet(nodes=10, spares=2, pools=("h100",), **healing) -> FleetSpec:
    return parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": p, "node_type": "x", "gpu_model": "H100", "nodes": nodes, "spares": spares} for p in pools],
        "slurm": {"partitions": [{"name": "train", "pools": list(pools)}]},
        "healing": {"grace_period_seconds": 60, "max_concurrent": 4, "max_unhealthy_fraction": 0.5,
                    "drain_timeout_seconds": 10, **healing},
    })


class World:
    """A fleet whose pools' nodes each run one NodeSet pod named as Slinky names them (`<pool>-w<i>`)."""

    def __init__(self, spec, fence=lambda: True, dry_run=False):
        self.spec, self.clock, self.dry_run = spec, Clock(), dry_run
        self.store = MemoryRemediationStore()
        self.kube, self.slurm, self.notifier = FakeKube(self.store), FakeSlurm(), Notifier()
        self.provider = Provider(self.kube)
        for pool in spec.pools:
            for i, name in enumerate(pool.node_names()):
                self.kube.nodes[name] = pool_node(pool, name, labels.ROLE_ACTIVE)
                host = f"{pool.name}-w{i}"
                self.kube.pods[f"slurm/slurm-worker-{host}"] = {
                    "metadata": {"name": f"slurm-worker-{host}", "namespace": "slurm", "uid": f"uid-{host}",
                                 "labels": {labels.SLINKY_POD_HOSTNAME: host}},
                    "spec": {"nodeName": name}, "status": {"phase": "Running"}}
                self.slurm.table[host] = SlurmNode(host, frozenset({"ALLOCATED"}), "")
            for name in pool.spare_names():
                self.kube.nodes[name] = pool_node(pool, name, labels.ROLE_SPARE)
        self.fence = fence
        self.manager = self.start()

    def start(self) -> Manager:
        """A (re)started reconciler: fresh caches, queue and timers; the same API objects."""
        return Manager(self.spec, self.kube, self.store, self.slurm, {p.name: self.provider for p in self.spec.pools},
                       self.notifier, clock=self.clock, monotonic=self.clock.mono, fence=lambda: self.fence(),
                       dry_run=self.dry_run)

    def restart(self) -> None:
        self.manager = self.start()

    def sync(self):
        """What the watches would deliver: the caches report what changed, and queue it."""
        self.manager.caches.relist()

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
                if not self.manager.process_due():
                    break
            if self.clock.now >= end:
                return
            self.clock.advance(step)

    def remediation(self, node):
        (r,) = [r for r in self.store.list() if r.node == node]
        return r
