"""Stand-in for SchedMD Slinky's slurm-operator in the local environment (its chart cannot be had here).

It does, for the local environment's NodeSets, the part of the operator that gpufleet meets:

* **NodeSet pods, StatefulSet scaling mode.** For each NodeSet resource the stack declares
  (``slinky.slurm.net/v1beta1``, one per pool, named after it; or a list given for tests that
  apply no stack) it keeps ``spec.replicas`` pods ``slurm-worker-<nodeset>-<i>`` with
  hostname ``<nodeset>-<i>`` (the Slurm node name) and the label
  ``nodeset.slinky.slurm.net/pod-hostname``, the pool's node selector and tolerations and one
  pod's worth of GPUs. The real kube-scheduler places them: never on a spare while the spare
  taint is there, nor on a cordoned or quarantined node. A pod that is gone is made again with
  the same name, so it keeps its Slurm name wherever it lands. Pods beyond ``replicas`` (or of a
  NodeSet no longer declared) are deleted and their Slurm nodes removed (scale-in).
* **slurmd per pod.** Pods do not run under kwok, so for each Running pod it starts a slurmd
  (a dynamic node, :meth:`LocalSlurm.start_node`) and writes the operator's JSON comment
  (``node`` = the Kubernetes node). When a pod terminates or is gone it does the pod's
  preStop: the Slurm node DOWN with ``slurm-operator: Pod is terminating``, then slurmd stops.
  (kwok deletes a pod at once, so this runs right after, not before.)
* **Cordon.** A cordoned Kubernetes node: the Slurm node of each NodeSet pod on it is drained
  with ``slurm-operator: `` + the node's ``nodeset.slinky.slurm.net/node-cordon-reason``
  annotation (else ``slurm-operator: Node cordoned``). On a schedulable node, a Slurm node
  drained with a reason that carries the ``slurm-operator: `` prefix is undrained; no other
  reason is ever changed.

* **Tokens.** For each ``Token`` resource (any namespace) it keeps the Secret ``spec.secretRef``
  holding a JWT for ``spec.username``, signed HS256 with the key slurmctld really uses (the local
  Slurm's; the stack's ``jwtKeyRef`` names the key the operator would take), renewed when a fifth of
  its ``lifetime`` is left, as the operator's token controller does with ``refresh: true``.

Level-based: each pass compares what is with what should be, so a missed event heals itself.
Never imported by ``reconciler/``: the reconciler meets the operator only through Kubernetes
and Slurm, as in production.

Run as a process: ``python -m localenv.slinky_standin --config FILE`` (LocalEnv writes
the file and supervises the process).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from localenv.slurm import LocalSlurm

log = logging.getLogger("slinky-standin")

PREFIX = "slurm-operator: "
POD_HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"
CORDON_REASON_ANNOTATION = "nodeset.slinky.slurm.net/node-cordon-reason"
NODESET_LABEL = "app.kubernetes.io/instance"  # slurm-worker-<nodeset>, as the chart labels workers
COMPONENT_LABEL = "app.kubernetes.io/component"
DEFAULT_CORDON_REASON = "Node cordoned"
NODESET_GROUP, NODESET_VERSION = "slinky.slurm.net", "v1beta1"


@dataclass(frozen=True)
class NodeSetDef:
    """A NodeSet as the stack declares it (components/slinky.py): what the stand-in acts on."""
    name: str
    replicas: int
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 0
    uid: str = ""

    def hostname(self, i: int) -> str:
        return f"{self.name}-{i}"

    def pod_name(self, i: int) -> str:
        return f"slurm-worker-{self.name}-{i}"


def operator_comment(namespace: str, pod: str, kube_node: str, nodeset: str, uid: str) -> dict[str, str]:
    """The JSON the operator writes into a Slurm node's comment."""
    return {"namespace": namespace, "podName": pod, "node": kube_node, "nodeSetName": nodeset, "nodeSetUID": uid}


def pod_manifest(ns: NodeSetDef, i: int, namespace: str) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(ns.gpus)}} if ns.gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": ns.pod_name(i), "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "slurmd", COMPONENT_LABEL: "worker",
                       NODESET_LABEL: f"slurm-worker-{ns.name}", POD_HOSTNAME_LABEL: ns.hostname(i)},
            "annotations": {"gpufleet.io/made-by": "slinky-standin (local environment)"},
        },
        "spec": {
            "hostname": ns.hostname(i),
            "nodeSelector": ns.node_selector,
            "tolerations": ns.tolerations,
            "containers": [{"name": "slurmd", "image": "slurmd", "resources": resources}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def nodeset_from_resource(obj: dict[str, Any]) -> NodeSetDef:
    """A NodeSet resource (as components/slinky.py declares it) as the stand-in uses it."""
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    limits = ((spec.get("slurmd") or {}).get("resources") or {}).get("limits") or {}
    return NodeSetDef(obj["metadata"]["name"], int(spec.get("replicas") or 0), dict(pod.get("nodeSelector") or {}),
                      list(pod.get("tolerations") or []), int(limits.get("nvidia.com/gpu") or 0),
                      obj["metadata"].get("uid", ""))


class SlinkyStandIn:
    """Args: `nodesets` None to act on the NodeSet resources in `namespace` (what the operator
    does), or a fixed list (tests without a stack; the namespace is then made if missing)."""

    def __init__(self, api: client.ApiClient, slurm: LocalSlurm, nodesets: list[NodeSetDef] | None = None,
                 namespace: str = "slurm"):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.slurm = slurm
        self.fixed = None if nodesets is None else {ns.name: ns for ns in nodesets}
        self.namespace = namespace

    def nodesets(self) -> dict[str, NodeSetDef]:
        if self.fixed is not None:
            return self.fixed
        try:
            items = self.custom.list_namespaced_custom_object(
                NODESET_GROUP, NODESET_VERSION, self.namespace, "nodesets")["items"]
        except ApiException as e:
            if e.status == 404:  # no NodeSet kind or no namespace yet: the stack is not applied
                return {}
            raise
        return {ns.name: ns for ns in map(nodeset_from_resource, items)}

    # ------------------------------------------------------------------ one pass

    def reconcile_once(self) -> None:
        try:
            self._sync_tokens()
        except Exception as e:  # noqa: BLE001 - tokens must not stop the NodeSet pods
            log.warning("tokens: %s", e)
        nodesets = self.nodesets()
        if self.fixed is not None:
            self._ensure_namespace()
        elif not nodesets:
            self._sync_slurmds({}, remove=set(self.slurm.wanted_nodes()))
            return
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{COMPONENT_LABEL}=worker").items}
        nodes = {n.metadata.name: n for n in self.core.list_node().items}
        running: dict[str, tuple[NodeSetDef, Any]] = {}  # Slurm name -> (nodeset, pod)
        declared = set()
        for ns in nodesets.values():
            for i in range(ns.replicas):
                declared.add(ns.pod_name(i))
                pod = pods.get(ns.pod_name(i))
                if pod is None:
                    self._create_pod(ns, i)
                elif pod.metadata.deletion_timestamp is None and pod.status.phase == "Running" \
                        and pod.spec.node_name:
                    running[ns.hostname(i)] = (ns, pod)
        removed = set()
        for name, pod in pods.items():
            if name not in declared:  # scale-in
                removed.add(pod.metadata.labels.get(POD_HOSTNAME_LABEL, ""))
                if pod.metadata.deletion_timestamp is None:
                    log.info("pod %s is beyond its NodeSet's replicas: deleting it", name)
                    self._delete_pod(name)
        self._sync_slurmds(running, remove=removed - {""})
        self._sync_cordons(running, nodes)

    def _delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def _ensure_namespace(self) -> None:
        try:
            self.core.read_namespace(self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.core.create_namespace({"metadata": {"name": self.namespace}})
            except ApiException as e2:
                if e2.status != 409:
                    raise

    def _create_pod(self, ns: NodeSetDef, i: int) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, pod_manifest(ns, i, self.namespace))
            log.info("created pod %s (Slurm node %s)", ns.pod_name(i), ns.hostname(i))
        except ApiException as e:
            if e.status != 409:  # still terminating, or made meanwhile
                raise

    def _sync_slurmds(self, running: dict[str, tuple[NodeSetDef, Any]], remove: set[str] = frozenset()) -> None:
        wanted = set(self.slurm.wanted_nodes())
        for name in sorted(wanted - set(running)):
            log.info("pod of Slurm node %s is terminating or gone: preStop (DOWN), stop slurmd", name)
            self.slurm.stop_node(name)
        known = set(self.slurm.node_names()) if remove else set()
        for name in sorted(remove & known):
            log.info("Slurm node %s left its NodeSet: deleting it from Slurm", name)
            self.slurm.run(["scontrol", "delete", f"NodeName={name}"], timeout=15)
        for name, (ns, pod) in sorted(running.items()):
            comment = operator_comment(self.namespace, pod.metadata.name, pod.spec.node_name, ns.name,
                                       ns.uid or pod.metadata.uid)
            spec = self.slurm.node_spec(name)
            if name in wanted and spec is not None and spec.comment.get("node") != pod.spec.node_name:
                # The pod moved while we looked away: preStop for the old one, then start anew.
                self.slurm.stop_node(name)
            if name not in wanted or spec is None or spec.comment != comment:
                log.info("pod %s Running on %s: slurmd for Slurm node %s", pod.metadata.name,
                         pod.spec.node_name, name)
                self.slurm.start_node(name, ns.name, comment)

    def _sync_cordons(self, running: dict[str, tuple[NodeSetDef, Any]], nodes: dict[str, Any]) -> None:
        if not running:
            return
        states = self._slurm_nodes()
        for name, (_ns, pod) in sorted(running.items()):
            node = nodes.get(pod.spec.node_name)
            st = states.get(name)
            if node is None or st is None:
                continue
            drained = "DRAIN" in st["state"]
            if node.spec.unschedulable:
                ann = (node.metadata.annotations or {}).get(CORDON_REASON_ANNOTATION) or DEFAULT_CORDON_REASON
                reason = PREFIX + ann
                if not drained:
                    log.info("node %s cordoned: drain Slurm node %s (%s)", node.metadata.name, name, reason)
                    self.slurm.set_node_state(name, "DRAIN", reason)
            elif drained and st["reason"].startswith(PREFIX):
                log.info("node %s schedulable: undrain Slurm node %s (was %r)", node.metadata.name, name,
                         st["reason"])
                self.slurm.set_node_state(name, "UNDRAIN")

    def _sync_tokens(self) -> None:
        """Write each Token's Secret, and renew it before it expires."""
        import base64

        import jwt

        try:
            tokens = self.custom.list_cluster_custom_object(NODESET_GROUP, NODESET_VERSION, "tokens")["items"]
        except ApiException as e:
            if e.status == 404:
                return
            raise
        now = int(time.time())
        for t in tokens:
            spec, meta = t.get("spec") or {}, t["metadata"]
            ref = spec.get("secretRef") or {}
            name, key = ref.get("name"), ref.get("key", "SLURM_JWT")
            if not name or not spec.get("username"):
                continue
            lifetime = _seconds(spec.get("lifetime", "15m"))
            try:
                current = self.core.read_namespaced_secret(name, meta["namespace"])
                old = base64.b64decode((current.data or {}).get(key, "")).decode()
                exp = jwt.decode(old, options={"verify_signature": False}).get("exp", 0) if old else 0
            except ApiException as e:
                if e.status != 404:
                    raise
                current, exp = None, 0
            if exp - now > lifetime / 5:
                continue
            token = self.slurm.token(spec["username"], lifetime)
            body = {"metadata": {"name": name, "namespace": meta["namespace"],
                                 "labels": {"app.kubernetes.io/managed-by": "slurm-operator-standin"}},
                    "type": "Opaque", "stringData": {key: token}}
            if current is None:
                self.core.create_namespaced_secret(meta["namespace"], body)
            else:
                self.core.replace_namespaced_secret(name, meta["namespace"], body)
            log.info("token %s/%s: wrote Secret %s for Slurm user %s (%ss)", meta["namespace"], meta["name"],
                     name, spec["username"], lifetime)

    def _slurm_nodes(self) -> dict[str, dict[str, Any]]:
        """Slurm name -> {"state": set, "reason": str}."""
        return {name: {"state": set(n.get("state", [])), "reason": n.get("reason", "")}
                for name, n in self.slurm.node_info().items()}

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.reconcile_once()
            except Exception as e:  # noqa: BLE001 - a failing pass is logged and tried again
                log.warning("pass failed: %s", e)
            stop.wait(interval)


def _seconds(value: Any) -> int:
    """A Token's lifetime: seconds, or a duration like "15m", "1h", "900s"."""
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    units = {"s": 1, "m": 60, "h": 3600}
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(float(text))


# ---------------------------------------------------------------------- process


@dataclass
class StandInConfig:
    """What LocalEnv hands the process (JSON)."""
    kubeconfig: str
    namespace: str
    nodesets: list[dict[str, Any]] | None  # None: the NodeSet resources in the namespace
    slurm: dict[str, Any]  # LocalSlurm's arguments

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def read(path: Path) -> "StandInConfig":
        return StandInConfig(**json.loads(path.read_text()))


def local_slurm(args: dict[str, Any]) -> LocalSlurm:
    a = dict(args)
    return LocalSlurm(a.pop("workdir"), a.pop("partitions"), **a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stand-in for Slinky's slurm-operator (local environment).")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--once", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = StandInConfig.read(a.config)
    nodesets = None if cfg.nodesets is None else [NodeSetDef(**n) for n in cfg.nodesets]
    standin = SlinkyStandIn(config.new_client_from_config(config_file=cfg.kubeconfig), local_slurm(cfg.slurm),
                            nodesets, cfg.namespace)
    if a.once:
        standin.reconcile_once()
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("running for %s in namespace %s", "the NodeSet resources" if nodesets is None
             else "NodeSets " + ", ".join(standin.fixed or {}), cfg.namespace)
    try:
        standin.run(stop, a.interval)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
