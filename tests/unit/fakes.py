"""Fakes of the reconciler's adapters and a fake clock, for tests of the runtime without an API server,
a Slurm or a cloud: a fleet whose every write is recorded."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.node_repair import PASSED, REBOOT, RESET_GPU, HealthCheckRecord, RepairResult, parse_request
from gpufleet.fleetspec.models import FleetSpec, NodePool
from gpufleet.fleetspec.placement import node_labels, node_taints, worker_selector
from gpufleet.reconciler.adapters.records import MemoryRemediationStore
from gpufleet.reconciler.adapters.slurm import SlurmError, SlurmJob, SlurmNode, SlurmReservation
from gpufleet.reconciler.core.membership import MembershipFacts
from gpufleet.reconciler.core.validation import Verdict, read_report
from gpufleet.reconciler.errors import TemporaryError
from gpufleet.reconciler.runtime.manager import Manager

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
BOOT = "boot-1"
# A spare that passed its health check on its current boot (issue 25: only such a spare is promoted or lent).
PROVEN = HealthCheckRecord("gpufleet-check-fixture", BOOT, PASSED, T0, "fixture")


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def mono(self) -> float:
        return self.now.timestamp()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)



def nodeset_owner(nodeset: str) -> dict:
    """The controller ownerReference slurm-operator 1.2.1 gives a NodeSet pod (internal/controller/nodeset/utils/
    utils.go NewNodeSetStatefulSetPod: metav1.NewControllerRef(nodeset, NodeSetGVK))."""
    return {"apiVersion": labels.SLINKY_NODESET_API_VERSION, "kind": labels.SLINKY_NODESET_KIND, "name": nodeset,
            "uid": f"uid-nodeset-{nodeset}", "controller": True, "blockOwnerDeletion": True}

def pool_node(pool: NodePool, name: str, role: str, proven: bool = True) -> dict:
    """A Ready node of the pool in a role, as the API server would send it; a spare `proven` by a passed
    health check on its boot."""
    annotations = {labels.HEALTH_CHECK: PROVEN.dumps()} if role == labels.ROLE_SPARE and proven else {}
    return {"metadata": {"name": name, "labels": node_labels(pool, role), "annotations": annotations},
            "spec": {"taints": node_taints(pool, role) or None},
            "status": {"capacity": {"nvidia.com/gpu": str(pool.gpus_per_node)}, "nodeInfo": {"bootID": BOOT},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


class FakeKube:
    """Nodes and pods as dicts; every write recorded in `calls`."""

    def __init__(self, store: MemoryRemediationStore):
        self.store, self.nodes, self.pods, self.calls = store, {}, {}, []
        self.evicted: list[dict] = []
        self.deletes: list[tuple[str, int]] = []  # (namespace/name, grace seconds) of each pod delete
        self.dead: set[str] = set()  # nodes whose kubelet is dead (World.kill)
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

    def apply_membership(self, name, set_labels, add_taints=(), set_annotations=None, seen=None):
        n = self.nodes[name]
        if seen is not None and not seen.still(n["metadata"]["labels"].get(labels.ROLE, ""),
                                               (t["key"] for t in n["spec"].get("taints") or [])):
            return False
        self._write("membership", name)
        n["metadata"]["labels"].update(set_labels)
        n["metadata"].setdefault("annotations", {}).update(set_annotations or {})
        n["spec"]["taints"] = (n["spec"].get("taints") or []) + [dict(t) for t in add_taints]
        return True

    def carry_drain(self, name, drains):
        self._write("carry-drain", name)
        ann = self.nodes[name]["metadata"].setdefault("annotations", {})
        have = json.loads(ann.get(labels.CARRIED_DRAIN) or "{}")
        ann[labels.CARRIED_DRAIN] = json.dumps({**drains, **have}, sort_keys=True)
        return json.loads(json.dumps(self.nodes[name]))

    def patch_node(self, name, body):
        self._write("patch", name)
        self.nodes[name]["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return json.loads(json.dumps(self.nodes[name]))

    def take_for_check(self, name):
        self._write("take-for-check", name)
        spec = self.nodes[name]["spec"]
        if not any(t["key"] == labels.CHECK_TAINT for t in spec.get("taints") or []):
            spec["taints"] = (spec.get("taints") or []) + [{"key": labels.CHECK_TAINT, "effect": "NoSchedule"}]
        return json.loads(json.dumps(self.nodes[name]))

    def give_back_from_check(self, name):
        self._write("give-back-from-check", name)
        spec = self.nodes[name]["spec"]
        spec["taints"] = [t for t in spec.get("taints") or [] if t["key"] != labels.CHECK_TAINT] or None
        return json.loads(json.dumps(self.nodes[name]))

    def evict(self, pod, grace_seconds=None):
        self._write("evict", pod["metadata"]["name"])
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if self._on_dead(key):
            return True  # accepted, and never finished: no kubelet there to stop the pod (World.kill)
        gone = self.pods.pop(key, None)
        if gone is not None and labels.SLINKY_POD_HOSTNAME in gone["metadata"].get("labels", {}):
            self.evicted.append(gone)  # its NodeSet makes it again (World.slinky places it)
        return True

    def delete_pod(self, namespace, name, grace_seconds=0):
        self._write("delete", name)
        key = f"{namespace}/{name}"
        self.deletes.append((key, grace_seconds))
        if grace_seconds and self._on_dead(key):
            return  # a graceful delete waits for a kubelet that is not there
        gone = self.pods.pop(key, None)
        if gone is not None and grace_seconds == 0 and labels.SLINKY_POD_HOSTNAME in gone["metadata"].get("labels", {}):
            self.evicted.append(gone)  # force-deleted: its NodeSet makes it again (World.slinky places it)

    def _on_dead(self, key) -> bool:
        """A pod on a machine whose kubelet is dead: marked for deletion, never gone."""
        pod = self.pods.get(key)
        if pod is None or pod["spec"].get("nodeName") not in self.dead:
            return False
        pod["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
        pod["metadata"].setdefault("deletionGracePeriodSeconds", 30)
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

    def start_reclaim(self, name, at):
        self._write("start_reclaim", name)
        n = self.nodes[name]
        n["metadata"]["labels"].pop(labels.LENT, None)
        n["metadata"].setdefault("annotations", {})[labels.RECLAIMING] = at

    def end_loan(self, name, back_to_spare):
        self._write("end_loan", name)
        n = self.nodes[name]
        taints = [t for t in n["spec"].get("taints") or [] if t["key"] != labels.LENDING_TAINT]
        if back_to_spare and not any(t["key"] == labels.SPARE_TAINT for t in taints):
            taints.append({"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"})
        n["spec"]["taints"] = taints or None
        n["metadata"]["labels"].pop(labels.LENT, None)
        for a in (labels.LENT_SINCE, labels.RECLAIMING):
            n["metadata"].get("annotations", {}).pop(a, None)
        return json.loads(json.dumps(n))

    def read_ledger(self, namespace):
        if self.down:
            raise TemporaryError("get the lending ledger: connection refused")
        return dict(self.ledger)

    def write_ledger(self, namespace, pool, text):
        self._write("ledger", pool)
        self.ledger[pool] = text

    def flush_events(self, timeout=5.0):
        return True

    def get_node(self, name):
        return json.loads(json.dumps(self.nodes[name]))

    def set_condition(self, name, ctype, status, reason, message):
        self._write("condition", name, status)
        conds = [c for c in self.nodes[name]["status"]["conditions"] if c["type"] != ctype]
        self.nodes[name]["status"]["conditions"] = conds + [
            {"type": ctype, "status": status, "reason": reason, "message": message}]


class FakeSlurm:
    """Slurm nodes and jobs; every change recorded in `calls` (reads are not)."""

    def __init__(self):
        self.table: dict[str, SlurmNode] = {}
        self.jobs: dict[int, SlurmJob] = {}
        self.calls, self.unreachable = [], False
        self.comments: dict[int, str] = {}  # admin comments (their writes are not in `calls`)
        self.comment_writes = 0
        self.failed: list[tuple[int, str, float]] = []  # accounting's NODE_FAIL runs: (job, Slurm node, epoch)
        self.accounting = True  # False: no slurmdbd (jobs_failed_on raises, as slurmrestd answers then)

    def _check(self, what):
        if self.unreachable:
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

    def jobs_failed_on(self, names, since):
        self._check("accounting")
        if not self.accounting:
            raise SlurmError("slurmdbd: Unable to connect to database", temporary=False)
        return [SlurmJob(j, "train", "NODE_FAIL", (n,)) for j, n, at in self.failed if n in names and at >= since]

    def running_jobs(self):
        self._check("jobs")
        return sorted((replace(j, admin_comment=self.comments.get(j.job_id, "")) for j in self.jobs.values()
                       if j.state == "RUNNING"), key=lambda j: j.job_id)

    def drain(self, name, reason):
        self._check("drain")
        self.calls.append(("drain", name))
        # as Slurm records it: the reconciler's Slurm user set the reason (the local spec's, `gpufleet`)
        self.table[name] = SlurmNode(name, frozenset({"IDLE", "DRAIN"}), reason, reason_set_by="gpufleet")

    def down(self, name, reason):
        """As slurmctld: the node DOWN with the reason (a DRAIN flag kept); what ran there is no longer there."""
        self._check("down")
        self.calls.append(("down", name))
        drain = self.table[name].states & {"DRAIN"} if name in self.table else frozenset()
        self.table[name] = SlurmNode(name, frozenset({"DOWN"}) | drain, reason, reason_set_by="gpufleet")
        for j in self.jobs.values():
            if name in j.nodes and j.state == "RUNNING":
                self.jobs[j.job_id] = replace(j, state="NODE_FAIL")

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

    # reservations, as slurmctld keeps them: a MAINT one without IGNORE_JOBS is refused on a node that runs a job
    def reservations(self):
        self._check("reservations")
        return sorted(getattr(self, "reserved", {}).values(), key=lambda r: r.name)

    def reserve_for_maintenance(self, name, nodes, minutes):
        self._check("reserve")
        busy = [n for n in nodes if self.table[n].states & {"ALLOCATED", "MIXED", "COMPLETING"}]
        if busy:
            raise SlurmError(f"Error creating the reservation: Requested nodes are busy ({busy})")
        self.calls.append(("reserve", name))
        self.__dict__.setdefault("reserved", {})[name] = SlurmReservation(name, tuple(nodes), frozenset({"MAINT"}))

    def delete_reservation(self, name):
        self._check("unreserve")
        self.calls.append(("unreserve", name))
        getattr(self, "reserved", {}).pop(name, None)

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
        self.kept: list[str] = []  # quarantined with repair=True: the machine kept (never terminated)

    def _role(self, name, role, taint=None):
        n = self.kube.nodes[name]
        n["metadata"]["labels"][labels.ROLE] = role
        n["spec"]["taints"] = [taint] if taint else None
        n["spec"]["unschedulable"] = None if role == labels.ROLE_ACTIVE else n["spec"].get("unschedulable")

    def promote(self, spare, replaces):
        self.calls.append(("promote", spare))
        self._role(spare, labels.ROLE_ACTIVE)

    def quarantine(self, node, xid, repair=False):
        self.calls.append(("quarantine", node))
        if repair:
            self.kept.append(node)
        self._role(node, labels.ROLE_QUARANTINED, {"key": labels.QUARANTINE_TAINT, "effect": "NoSchedule"})

    def request_repair(self, node, request):
        """What the kubernetes-spares provider does: the request on the node, for its agent."""
        self.calls.append(("repair", node, request.action))
        self.kube.nodes[node]["metadata"].setdefault("annotations", {})[labels.REPAIR_REQUEST] = request.dumps()

    def retire(self, node, reason, refill=None):
        self.calls.append(("retire", node))
        self._role(node, labels.ROLE_RETIRED, {"key": labels.QUARANTINE_TAINT, "effect": "NoSchedule"})
        if refill:
            self.calls.append(("capacity", refill))

    def forget(self, node, pool, reason, refill=None):
        self.calls.append(("forget", node))
        if refill:
            self.calls.append(("capacity", refill))

    def back_in_service(self, node):
        self.calls.append(("back", node))
        self._role(node, labels.ROLE_ACTIVE)

    def request_capacity(self, pool, reason, key):
        self.calls.append(("capacity", key))

    def withdraw_capacity_request(self, pool, key):
        self.calls.append(("withdraw", key))

    def give_back(self, node, why):
        """What kubernetes-spares does: role surplus, the spare taint kept."""
        self.calls.append(("give-back", node))
        self.kube.nodes[node]["metadata"]["labels"][labels.ROLE] = labels.ROLE_SURPLUS

    def membership_facts(self):
        return MembershipFacts()

    def settle_capacity_requests(self, nodes=None):
        return []

    def return_to_spares(self, node):
        if self.fail_return:
            raise TemporaryError("return to spares: conflict")
        self.calls.append(("return", node))
        self._role(node, labels.ROLE_SPARE, {"key": labels.SPARE_TAINT, "effect": "NoSchedule"})
        self.kube.nodes[node]["spec"]["unschedulable"] = None


class FakeNodes:
    """What stands in for each node's agent and GPUs in these tests: a node is healthy, or broken in a way a
    reset fixes, a reboot fixes, or nothing fixes (`state`, set by a test). It acts on a repair request once
    per id, as the agent does: a reset answers at once; a reboot takes the node NotReady for `reboot_seconds`,
    then Ready with a new boot id."""

    HEALTHY, RESET_FIXES, REBOOT_FIXES, BROKEN = "healthy", "reset-fixes", "reboot-fixes", "broken"

    def __init__(self, kube: "FakeKube", clock: "Clock", reboot_seconds: float = 60.0):
        self.kube, self.clock, self.reboot_seconds = kube, clock, reboot_seconds
        self.state: dict[str, str] = {}
        self.acted: dict[str, str] = {}  # node -> the last request id acted on
        self.resets: list[tuple[str, str]] = []  # (node, request id), each reset done
        self.reboots: list[tuple[str, str]] = []
        self.rebooting: dict[str, datetime] = {}  # node -> Ready again then
        self.boots = 1
        self.revives_dead = True  # a reboot brings a dead machine back (World.kill); False: it never answers

    def healthy(self, node: str) -> bool:
        return self.state.get(node, self.HEALTHY) == self.HEALTHY

    def tick(self) -> None:
        now = self.clock.now
        for name, n in self.kube.nodes.items():
            req = parse_request((n["metadata"].get("annotations") or {}).get(labels.REPAIR_REQUEST))
            if req is None or self.acted.get(name) == req.id:
                continue
            if name in self.kube.dead and (req.action != REBOOT or not self.revives_dead):
                continue  # no agent answers on a dead machine; a reboot comes through the provider (EC2's)
            self.acted[name] = req.id
            if req.action == RESET_GPU:
                self.resets.append((name, req.id))
                fixed = self.state.get(name, self.HEALTHY) in (self.HEALTHY, self.RESET_FIXES)
                if fixed:
                    self.state[name] = self.HEALTHY
                result = RepairResult(req.id, fixed, "GPU reset" if fixed else "Unable to reset GPU: GPU is lost", now,
                                      n["status"].get("nodeInfo", {}).get("bootID", ""))
                n["metadata"]["annotations"][labels.REPAIR_RESULT] = result.dumps()
            elif req.action == REBOOT:
                self.reboots.append((name, req.id))
                self._ready(n, False)
                self.rebooting[name] = now + timedelta(seconds=self.reboot_seconds)
        for name, until in list(self.rebooting.items()):
            if now >= until:
                del self.rebooting[name]
                n = self.kube.nodes[name]
                self.boots += 1
                n["status"].setdefault("nodeInfo", {})["bootID"] = f"boot-{self.boots}"
                self._ready(n, True)
                self.kube.dead.discard(name)  # the machine answers again
                if self.state.get(name) in (self.RESET_FIXES, self.REBOOT_FIXES):
                    self.state[name] = self.HEALTHY

    @staticmethod
    def _ready(n: dict, ready: bool) -> None:
        for c in n["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "True" if ready else "False"


class FakeChecks:
    """Health-check Jobs: each runs `seconds`, then passes when its node's GPUs are healthy (FakeNodes)."""

    def __init__(self, nodes: FakeNodes, clock: "Clock", seconds: float = 30.0):
        self.nodes, self.clock, self.seconds = nodes, clock, seconds
        self.jobs: dict[str, tuple[str, datetime]] = {}
        self.started: list[str] = []  # every create asked for (a second create of a name finds it made)
        self.reports: dict[str, "HealthReport"] = {}  # node -> the real check's report while it is not healthy
        self.hang: dict[str, int] = {}  # node -> how many of its next checks hang (run on, never answer)
        self.hanging: set[str] = set()

    def start(self, node, pool, name):
        self.started.append(name)
        if name not in self.jobs and self.hang.get(node, 0) > 0:
            self.hang[node] -= 1
            self.hanging.add(name)
        self.jobs.setdefault(name, (node, self.clock.now))

    def verdict(self, name):
        if name not in self.jobs:
            return Verdict("missing")
        if name in self.hanging:
            return Verdict("running")
        node, at = self.jobs[name]
        if (self.clock.now - at).total_seconds() < self.seconds:
            return Verdict("running")
        if self.nodes.healthy(node):
            return Verdict("passed", "nvidia-smi: pass")
        if node in self.reports:  # what the real check wrote, read as the adapter reads it
            report = self.reports[node]
            return read_report(report.dumps(), report.passed)
        needs = {FakeNodes.RESET_FIXES: "reset-gpu", FakeNodes.REBOOT_FIXES: "reboot"}.get(
            self.nodes.state.get(node), "replace")
        return Verdict("failed", f"nvidia-smi: fail (remapping pending on 0000:3b:00.0)", needs)


class Notifier:
    namespace = "default"

    def __init__(self):
        self.sent = []
        self.texts: dict[str, list[str]] = {}  # event -> the texts sent
        self.to_owners = []  # (route, Message)

    def send(self, msg):
        self.sent.append(msg.event)
        self.texts.setdefault(msg.event, []).append(msg.text)

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

    def __init__(self, spec, fence=lambda: True, dry_run=False, operator=False):
        """`operator`: evicted NodeSet pods are made again and placed as Slinky's operator would (`slinky`), so
        a heal reaches Succeeded and the repair loop (issue 25) follows."""
        self.spec, self.clock, self.dry_run, self.operator = spec, Clock(), dry_run, operator
        self.store = MemoryRemediationStore()
        self.kube, self.slurm, self.notifier = FakeKube(self.store), FakeSlurm(), Notifier()
        self.provider = Provider(self.kube)
        for pool in spec.pools:
            for i, name in enumerate(pool.node_names()):
                self.kube.nodes[name] = pool_node(pool, name, labels.ROLE_ACTIVE)
                host = f"{pool.name}-w{i}"
                self.kube.pods[f"slurm/slurm-worker-{host}"] = {
                    "metadata": {"name": f"slurm-worker-{host}", "namespace": "slurm", "uid": f"uid-{host}",
                                 "labels": {labels.SLINKY_POD_HOSTNAME: host},
                                 "ownerReferences": [nodeset_owner(pool.name)]},
                    "spec": {"nodeName": name, "nodeSelector": worker_selector(pool)}, "status": {"phase": "Running"}}
                self.slurm.table[host] = SlurmNode(host, frozenset({"ALLOCATED"}), "")
            for name in pool.spare_names():
                self.kube.nodes[name] = pool_node(pool, name, labels.ROLE_SPARE)
        self.fence = fence
        self.hardware = FakeNodes(self.kube, self.clock)
        self.checks = FakeChecks(self.hardware, self.clock)
        self.manager = self.start()

    def start(self) -> Manager:
        """A (re)started reconciler: fresh caches, queue and timers; the same API objects."""
        return Manager(self.spec, self.kube, self.store, self.slurm, {p.name: self.provider for p in self.spec.pools},
                       self.notifier, clock=self.clock, monotonic=self.clock.mono, fence=lambda: self.fence(),
                       dry_run=self.dry_run, checks=self.checks)

    def restart(self) -> None:
        self.manager = self.start()

    def sync(self):
        """What the watches would deliver: the caches report what changed, and queue it."""
        self.manager.caches.relist()

    def kill(self, node, slurm_marks_down=True):
        """The machine stops answering: the node controller sets its Ready condition Unknown ("Kubelet stopped
        posting node status.", k8s.io/kubernetes pkg/controller/nodelifecycle), nothing on it acts any more, and
        (`slurm_marks_down`) slurmctld marks its Slurm nodes DOWN "Not responding" and requeues their --requeue jobs."""
        self.kube.dead.add(node)
        for c in self.kube.nodes[node]["status"]["conditions"]:
            if c["type"] == "Ready":
                c.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                         lastTransitionTime=self.clock.now.isoformat())
        if not slurm_marks_down:
            return
        hosts = {p["metadata"]["labels"].get(labels.SLINKY_POD_HOSTNAME) for p in self.kube.pods.values()
                 if p["spec"].get("nodeName") == node}
        for host in hosts - {None}:
            self.slurm.table[host] = SlurmNode(host, frozenset({"DOWN"}), "Not responding", reason_set_by="slurm")
            for j in list(self.slurm.jobs.values()):
                if host in j.nodes and j.state == "RUNNING":
                    self.slurm.jobs[j.job_id] = replace(j, state="PENDING", nodes=(), restarts=j.restarts + 1)
                    self.slurm.failed.append((j.job_id, host, self.clock.now.timestamp()))

    def fault(self, node, xid=79):
        self.kube.nodes[node]["status"]["conditions"].append(
            {"type": "GpuHealthy", "status": "False", "reason": f"Xid{xid}", "message": "off the bus",
             "lastTransitionTime": self.clock.now.isoformat()})

    def run(self, seconds=0.0, step=0.5):
        """Sync, then process what is due, advancing the fake clock in steps."""
        end = self.clock.now + timedelta(seconds=seconds)
        while True:
            for _ in range(50):
                self.hardware.tick()
                if self.operator:
                    self.slinky()
                self.sync()
                if not self.manager.process_due():
                    break
            if self.clock.now >= end:
                return
            self.clock.advance(step)

    def slinky(self) -> None:
        """What Slinky's operator does with an evicted NodeSet pod (StatefulSet mode): made again under the
        same name, it runs on a node that takes it (its NodeSet's nodeSelector, the pool's label, as
        components/slinky.py renders the template; active, schedulable, untainted, no NodeSet pod there), and
        its slurmd registers with that node in its comment (the drain gpufleet set stays until resumed). With no
        such node it stays pending: kube-scheduler never places a pod on a node its nodeSelector does not match."""
        for pod in list(self.kube.evicted):
            host = pod["metadata"]["labels"][labels.SLINKY_POD_HOSTNAME]
            taken = {p["spec"]["nodeName"] for p in self.kube.pods.values()}
            selector = pod["spec"].get("nodeSelector") or {}
            to = next((name for name, n in sorted(self.kube.nodes.items())
                       if n["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_ACTIVE and not n["spec"].get("unschedulable")
                       and not n["spec"].get("taints") and name not in taken
                       and all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())), None)
            if to is None:
                continue
            self.kube.evicted.remove(pod)
            pod = json.loads(json.dumps(pod))
            if pod["metadata"].pop("deletionTimestamp", None):  # a new pod of the same name: a new uid
                pod["metadata"]["uid"] = f"{pod['metadata']['uid']}-again"
            pod["spec"]["nodeName"] = to
            self.kube.pods[f"slurm/{pod['metadata']['name']}"] = pod
            old = self.slurm.table.get(host)
            self.slurm.table[host] = SlurmNode(host, old.states if old else frozenset({"IDLE"}), old.reason if old else "",
                                               comment=json.dumps({"node": to}))

    def remediation(self, node):
        (r,) = [r for r in self.store.list() if r.node == node]
        return r

    def remediation_named(self, node, phase):
        """The node's remediation in `phase` (a node may have older ones)."""
        (r,) = [r for r in self.store.list() if r.node == node and r.phase is phase]
        return r
