"""Stand-in for the Kubernetes cluster autoscaler in the local environment: scale-up for a pending pod.

What it does follows cluster-autoscaler 1.32.0 (kubernetes/autoscaler, tag cluster-autoscaler-1.32.0),
the part gpufleet meets when a `kubernetes-spares` pool asks for a node (a placeholder pod that fits one
node of the pool, reconciler/adapters/providers.py):

* **Which pods.** A pod is unschedulable when it is not bound, not being deleted, and its
  ``PodScheduled`` condition is ``False`` with reason ``Unschedulable`` (utils/kubernetes/listers.go,
  ``isUnschedulable``). Only those start a scale-up (FAQ.md, "How does scale-up work?").
* **Node groups and templates.** All nodes of a group are alike; a scale-up adds one more like them.
  A pod starts one when it would fit a group's template node: node selector, required node affinity,
  taints tolerated, resource requests within the template's allocatable (FAQ.md, same section). A group
  at its maximum size is not grown (core/scaleup/orchestrator/orchestrator.go).
* **Where the template comes from.** As upstream, a group's template is made from one of its existing
  nodes that is Ready (for a minute: the stabilization delay), schedulable, and first in the list: a copy
  with a fresh name and hostname, its labels kept, its taints kept but for the autoscaler's own, the
  node-condition taints and those with the ignore/startup/status prefixes
  (processors/nodeinfosprovider/mixed_nodeinfos_processor.go, simulator/node_info_utils.go
  createSanitizedNode, utils/taints/taints.go SanitizeTaints). Only when the group has no such node is the
  node group's own template used (here: the pool's node as it joins, before gpufleet labels it). So a
  template carries `gpufleet.io/role` (and a spare's taint when it is made from a spare), as it would on
  a real cluster. Departures: the list is the API server's (by name), where upstream's comes from an
  informer cache in no fixed order; the DaemonSet pods upstream adds to a template are not counted (the
  local ones ask for no GPU, the only resource a capacity request names).
* **Upcoming nodes.** A node asked for a pod counts for that pod until it joins; the pod does not grow
  the group again meanwhile.
* **Events.** ``TriggeredScaleUp`` on a pod that grew a group, ``NotTriggerScaleUp`` on one no group can
  take, with upstream's message: "pod didn't trigger scale-up: " and each reason counted over the groups
  that gave it, e.g. "1 max node group size reached" or "1 node(s) didn't match Pod's node
  affinity/selector" (processors/status/eventing_scale_up_processor.go ReasonsMessage,
  core/scaleup/orchestrator/skippedreasons.go), once per pod here (upstream repeats it each loop; the
  Event recorder folds repeats into one Event's count). gpufleet reads it as the request's refusal
  (reconciler/core/refills.py `pool_refusals`).

Local: the node groups are the spec's pools (:mod:`localenv.fake_nodes`: a node is of a group when its name
is one the group has room for; the group's own template is the pool's node as it joins: its node group's
labels and taints, no gpufleet role, no spare taint); joining a node is
creating the next reserved kwok node of the pool. The reconciler's membership pass then makes it a
spare and settles the request, exactly as on a real cluster. Nothing more: no scale-down, no expanders
(the pools' templates are disjoint, so at most one group fits), no node-provision timeout.

Run as a process: ``python -m localenv.autoscaler_standin --config FILE`` (LocalEnv writes the file and
supervises the process).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kubernetes import client, config
from kubernetes.utils import parse_quantity

from gpufleet.fleetspec.models import FleetSpec
from gpufleet.stop_signal import set_on_signals
from localenv import fake_nodes

log = logging.getLogger("autoscaler-standin")
COMPONENT = "cluster-autoscaler-standin"
STABILIZATION_DELAY = timedelta(minutes=1)  # mixed_nodeinfos_processor.go stabilizationDelay
# utils/taints/taints.go: the taints a template made from a real node leaves out.
AUTOSCALER_TAINTS = frozenset({"ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler"})
NODE_CONDITION_TAINTS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure", "node.kubernetes.io/network-unavailable",
    "node.kubernetes.io/pid-pressure", "node.cloudprovider.kubernetes.io/uninitialized",
    "node.cloudprovider.kubernetes.io/shutdown", "cloud.google.com/impending-node-termination",
    "NodeWithImpairedVolumes"})
# The reasons a pod does not fit a node, in kube-scheduler's words (the autoscaler runs its filter plugins):
# pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go ErrReasonPod, tainttoleration
# "node(s) had untolerated taint {key: value}", noderesources/fit.go "Insufficient <resource>".
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
# cluster-autoscaler 1.32.0 core/scaleup/orchestrator/skippedreasons.go MaxLimitReachedReason.
MAX_SIZE_REACHED = "max node group size reached"
SANITIZED_PREFIXES = ("ignore-taint.cluster-autoscaler.kubernetes.io/", "startup-taint.cluster-autoscaler.kubernetes.io/",
                      "status-taint.cluster-autoscaler.kubernetes.io/")


@dataclass(frozen=True)
class NodeGroup:
    """A pool's node group: the node a scale-up adds (without its name), the names of its nodes (its
    size is how many exist), and the names a scale-up may give (in order)."""

    name: str
    template: dict[str, Any]
    members: tuple[str, ...]
    reserve: tuple[str, ...]

    @property
    def max_size(self) -> int:
        return len(self.members)

    def node(self, name: str) -> dict[str, Any]:
        node = json.loads(json.dumps(self.template))
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        return node

    @staticmethod
    def of_pool(pool, prefix: str = fake_nodes.KWOK_PREFIX) -> "NodeGroup":
        reserve = fake_nodes.reserve_names(pool, prefix)
        template = fake_nodes.joining_node(pool, "")
        return NodeGroup(pool.name, template, tuple(prefix + n for n in pool.node_names()) + tuple(reserve),
                         tuple(reserve))


def node_groups(spec: FleetSpec) -> list[NodeGroup]:
    return [NodeGroup.of_pool(p) for p in spec.pools]


# ---------------------------------------------------------------------- pure: which pod, which group

def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Not bound, not being deleted, and the scheduler found no node for it (listers.go isUnschedulable)."""
    if (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return c.get("status") == "False" and c.get("reason") == "Unschedulable"
    return False


def _expression_holds(expr: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, op, want = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and want:
        try:
            return int(have) > int(want[0]) if op == "Gt" else int(have) < int(want[0])
        except ValueError:
            return False
    return False


def _affinity_holds(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    required = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution")) or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    node_labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"].get("name", "")}
    return any(all(_expression_holds(e, node_labels) for e in t.get("matchExpressions") or [])
               and all(_expression_holds(e, fields) for e in t.get("matchFields") or []) for t in terms)


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        op = t.get("operator") or "Equal"
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        if not t.get("key") and op != "Exists":
            continue
        if op == "Equal" and (t.get("value") or "") != (taint.get("value") or ""):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        return True
    return False


def _requests(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's requests, summed over its containers (a limit stands for a missing request, as the API
    server defaults it)."""
    out: dict[str, Any] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        for name, q in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[name] = out.get(name, 0) + parse_quantity(q)
    return out


def misfit(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why the pod would not fit the node; None when it would."""
    spec = pod.get("spec") or {}
    node_labels = node["metadata"].get("labels") or {}
    wrong = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if node_labels.get(k) != v}
    if wrong or not _affinity_holds(spec, node):
        return NODE_AFFINITY  # one reason for both, as kube-scheduler's NodeAffinity plugin says it
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, spec.get("tolerations") or []):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for name, want in _requests(spec).items():
        if want > parse_quantity(allocatable.get(name, "0")):
            return f"Insufficient {name}"
    return None


def _ready_since(node: Mapping[str, Any]) -> datetime | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            at = c.get("lastTransitionTime")
            if isinstance(at, datetime):
                return at
            return datetime.fromisoformat(str(at).replace("Z", "+00:00")) if at else datetime.min.replace(tzinfo=timezone.utc)
    return None


def good_template_candidate(node: Mapping[str, Any], now: datetime) -> bool:
    """Ready for the stabilization delay, and schedulable (mixed_nodeinfos_processor.go isNodeGoodTemplateCandidate)."""
    since = _ready_since(node)
    return since is not None and since + STABILIZATION_DELAY < now and not (node.get("spec") or {}).get("unschedulable")


def sanitized(node: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A template made from a real node: a fresh name and hostname, the same labels, the taints less those
    upstream leaves out (node_info_utils.go createSanitizedNode, taints.go SanitizeTaints)."""
    out = json.loads(json.dumps(node, default=str))
    meta = out.setdefault("metadata", {})
    meta["name"] = name
    meta.setdefault("labels", {})["kubernetes.io/hostname"] = name
    for k in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(k, None)
    spec = out.setdefault("spec", {})
    spec["taints"] = [t for t in spec.get("taints") or []
                      if t.get("key") not in AUTOSCALER_TAINTS | NODE_CONDITION_TAINTS
                      and not str(t.get("key", "")).startswith(SANITIZED_PREFIXES)] or None
    return out


def template_node(group: NodeGroup, nodes: Iterable[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """The node a scale-up of `group` would add, as upstream sees it: made from the first good node of the
    group in `nodes` (in their order), else the group's own template."""
    fresh = f"template-node-for-{group.name}"
    for n in nodes:
        if (n.get("metadata") or {}).get("name") in group.members and good_template_candidate(n, now):
            return sanitized(n, fresh)
    return group.node(fresh)


def choose(pod: Mapping[str, Any], groups: Iterable[NodeGroup], nodes: Iterable[Mapping[str, Any]] = (),
           now: datetime | None = None) -> tuple[NodeGroup | None, dict[str, str]]:
    """The first group whose template node the pod would fit, and why each other group was rejected.
    `nodes`: the cluster's nodes (templates are made from them); `now`: for the stabilization delay."""
    nodes, now = list(nodes), now or datetime.now(timezone.utc)
    why: dict[str, str] = {}
    for g in groups:
        reason = misfit(pod, template_node(g, nodes, now))
        if reason is None:
            return g, why
        why[g.name] = reason
    return None, why


def not_triggered(reasons: Iterable[str]) -> str:
    """The `NotTriggerScaleUp` Event's message for a pod no group can take: each reason counted over the node
    groups that gave it, "pod didn't trigger scale-up: 1 max node group size reached" (cluster-autoscaler
    1.32.0 processors/status/eventing_scale_up_processor.go Process and ReasonsMessage; upstream's order is a
    Go map's, here the order the groups were weighed in)."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    return "pod didn't trigger scale-up: " + ", ".join(f"{n} {r}" for r, n in counts.items())


# ---------------------------------------------------------------------- I/O

class AutoscalerStandIn:
    def __init__(self, api: client.ApiClient, groups: list[NodeGroup],
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.api, self.core = api, client.CoreV1Api(api)
        self.groups, self.clock = groups, clock
        self.upcoming: dict[str, str] = {}  # pod uid -> the node asked for it
        self.told: set[str] = set()         # pods told NotTriggerScaleUp

    def _pending(self) -> list[dict]:
        resp = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=,status.phase=Pending",
                                                     _preload_content=False)
        return [p for p in json.loads(resp.data)["items"] if unschedulable(p)]

    def scale_up_once(self) -> list[str]:
        """One pass: a node for each unschedulable pod that fits a group with room; the nodes joined."""
        pods = self._pending()
        pending = {p["metadata"]["uid"] for p in pods}
        self.upcoming = {uid: n for uid, n in self.upcoming.items() if uid in pending}  # placed, or gone
        if not pods:
            return []
        listed = json.loads(self.core.list_node(_preload_content=False).data)["items"]
        existing = {n["metadata"]["name"] for n in listed}
        joined = []
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if uid in self.upcoming:
                continue  # its node was asked for; the scheduler places it once it joined
            group, why = choose(pod, self.groups, listed, self.clock())
            if group is None:
                self._tell_once(pod, not_triggered(why.values()))
                continue
            free = [n for n in group.reserve if n not in existing]
            size = sum(1 for n in group.members if n in existing)
            if not free or size >= group.max_size:
                self._tell_once(pod, not_triggered([*why.values(), MAX_SIZE_REACHED]))
                continue
            name = free[0]
            self.core.create_node(group.node(name))
            existing.add(name)
            self.upcoming[uid] = name
            joined.append(name)
            msg = f"pod triggered scale-up: [{{{group.name} {size}->{size + 1} (max: {group.max_size})}}]"
            log.info("%s/%s: %s; node %s joins", pod["metadata"]["namespace"], pod["metadata"]["name"], msg, name)
            self._event(pod, "TriggeredScaleUp", msg)
        return joined

    def _tell_once(self, pod: dict, message: str) -> None:
        uid = pod["metadata"]["uid"]
        if uid not in self.told:
            self.told.add(uid)
            log.info("%s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], message)
            self._event(pod, "NotTriggerScaleUp", message)

    def _event(self, pod: dict, reason: str, message: str) -> None:
        meta = pod["metadata"]
        now = datetime.now(timezone.utc)
        try:
            self.core.create_namespaced_event(meta["namespace"], {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"],
                                   "name": meta["name"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": "Normal", "source": {"component": COMPONENT},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})
        except client.ApiException as e:  # an event is for people; its loss stops nothing
            log.warning("event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], e.reason)

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.scale_up_once()
            except Exception as e:  # noqa: BLE001 - a failing pass is logged and tried again
                log.warning("pass failed: %s", e)
            stop.wait(interval)


# ---------------------------------------------------------------------- process

@dataclass
class AutoscalerConfig:
    """What LocalEnv hands the process (JSON)."""

    kubeconfig: str
    groups: list[dict[str, Any]] = field(default_factory=list)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def read(path: Path) -> "AutoscalerConfig":
        return AutoscalerConfig(**json.loads(path.read_text()))

    @staticmethod
    def of(kubeconfig: Path, spec: FleetSpec) -> "AutoscalerConfig":
        return AutoscalerConfig(str(kubeconfig), [asdict(g) for g in node_groups(spec)])

    def node_groups(self) -> list[NodeGroup]:
        return [NodeGroup(g["name"], g["template"], tuple(g["members"]), tuple(g["reserve"])) for g in self.groups]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stand-in for the cluster autoscaler's scale-up (local environment).")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--scan-interval", type=float, default=1.0, help="Seconds between passes (upstream: 10).")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = AutoscalerConfig.read(a.config)
    standin = AutoscalerStandIn(config.new_client_from_config(config_file=cfg.kubeconfig), cfg.node_groups())
    stop = threading.Event()
    set_on_signals(stop)  # SIGTERM sets it (never from inside the handler: gpufleet/stop_signal.py)
    log.info("node groups: %s", ", ".join(f"{g.name} (max {g.max_size})" for g in standin.groups))
    try:
        standin.run(stop, a.scan_interval)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
