"""Stand-in for SchedMD's slurm-operator v1.2.1 in the local environment (its images cannot run here).

It does, for the Slinky resources the stack applied, what that release does and nothing else; each
behaviour names the upstream file it follows (SlinkyProject/slurm-operator at v1.2.1):

* **slurm.conf** (internal/builder/controllerbuilder/controller_config.go, via `slinky_conf.py`): rendered
  from the Controller, its Accounting, its NodeSets and its configFileRefs ConfigMaps, and given to the
  local Slurm (`LocalSlurm.apply_operator_files`), which restarts slurmctld when it changes, as the
  operator recreates the controller pod (`inplaceReconfigure: false`).
* **NodeSet pods** (controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod, GetOrdinalPodName,
  initIdentity; builder/labels/labels.go; workerbuilder/worker_app.go): `replicas` pods named
  `<nodeset>-<ordinal>`, hostname the pod name (the Slurm node name), labels app.kubernetes.io/name
  slurmd, instance <nodeset>, component worker, slinky.slurm.net/cluster <controller>, and
  nodeset.slinky.slurm.net/pod-name, pod-index, pod-hostname, scaling-mode; a controller ownerReference
  to the NodeSet object (its real uid: NewControllerRef(nodeset, NodeSetGVK)); the pod template's
  nodeSelector and tolerations plus the operator's worker toleration, the slurmd container's
  resources, anti-affinity to other slurmd pods. kube-scheduler places them. A failed or finished pod
  is deleted and made again (nodeset_sync.go processNodeSetPod). Slurm node records are never deleted
  (pruneSlurmNodeRecords applies to DaemonSet NodeSets only).
* **Scale and update** (nodeset_sync.go syncNodeSetPods, doPodScale, processCondemned, syncUpdate,
  syncRollingUpdate, splitUpdatePods; utils/sort.go ActivePods.Less; decisions in `slinky_update.py`): a
  scale-out makes the lowest free ordinals; a scale-in condemns pods in ActivePods order (unassigned,
  Pending, not Ready first, then lower deletion cost, earlier deadline, cordoned, higher ordinal). A
  change of what makes a revision (the pod template, slurmd with its image, extraConf: nodeset_history.go
  getPatch; label controller-revision-hash) is rolled out by `updateStrategy`: RollingUpdate (the default,
  maxUnavailable 25 %) condemns old pods, unhealthy ones at once and at most maxUnavailable healthy ones in
  ActivePods order less the new pods not yet available; OnDelete condemns none. A condemned pod is cordoned
  and its Slurm node drained with `slurm-operator: Pod (<ns>/<pod>) is pending termination for scale-in`,
  overwriting any reason there (a person's, gpufleet's: MakeNodeDrain with overrideReason), and deleted
  once the node is drained and runs no job (IsNodeDrained); its ordinal is then made again at the new
  revision. Pods being updated are not uncordoned (doPodProcessing keeps only splitUpdatePods' kept pods;
  with OnDelete that is none). ScheduledUpdate (a Slurm reservation's window) is not modelled: refused
  with a warning, nothing updated.
* **slurmd** per Running pod (kwok runs no container): started with the NodeSet's `--conf`
  (`slinky_conf.slurmd_conf`); when the pod terminates, its **preStop**: the Slurm node DOWN with
  `slurm-operator: Pod is terminating` (worker_app.go), then slurmd stops. Only a live kubelet runs it
  (kubernetes v1.34 pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer, and only `if gracePeriod
  > 0`): a pod whose Kubernetes node is gone or not Ready (a dead machine), or deleted with grace 0, gets
  none; its slurmd dies silently (its pod keeps its Running phase) and slurmctld sets the Slurm node DOWN
  `Not responding` SlurmdTimeout later (slurm src/slurmctld/ping_nodes.c); slurmd runs again once the node
  is Ready (`_on_live_machines`, `_machine_lost`). (kwok deletes a pod at
  once, so this runs right after, not before.)
* **Pod info and IDLE on migration** (controller/nodeset/slurmcontrol/slurmcontrol.go
  UpdateNodeWithPodInfo, for healthy pods): the Slurm node's comment is the pod's JSON
  (namespace, podName, node, nodeSetName, nodeSetUID); when it changes and the old one named a
  Kubernetes node, the Slurm node is set IDLE (which clears DRAIN and DOWN). A pod back on the same
  node with the same name changes nothing, so a DOWN stays (ReturnToService is the stack's business).
* **Cordon** (nodeset_sync.go syncCordon and syncPodUncordon, slurmcontrol.go MakeNodeDrain/MakeNodeUndrain,
  IsNodeReasonOurs, IsNodeDownForUnresponsive): nothing when the Slurm node's reason is someone
  else's (not empty, not `slurm-operator: `) or it is DOWN for `Not responding`; else a cordoned
  Kubernetes node cordons the pod (annotation nodeset.slinky.slurm.net/pod-cordon) and drains the
  Slurm node with `slurm-operator: ` + the node's node-cordon-reason annotation (sanitized) or
  `Node (<node>) was cordoned, Pod (<ns>/<pod>) must be cordoned`, keeping a reason already there; a
  cordoned pod drains it `Pod (<ns>/<pod>) was cordoned`; otherwise the pod is uncordoned and a DRAIN
  undone (UNDRAIN).
* **Busy-pod PDB** (workerbuilder/worker_pdb.go, nodeset_sync_status.go updateNodeSetPodPDBLabels,
  pkg/conditions IsNodeBusy): one PodDisruptionBudget `slurm-workers-pdb-<controller>` selecting
  pod-protect=true and the cluster label, maxUnavailable 0; a pod is labelled pod-protect while its
  Slurm node is ALLOCATED, MIXED or COMPLETING (workloadDisruptionProtection, default true).
* **Topology** (nodeset_sync.go syncSlurmTopology): the Kubernetes node's topology.slinky.slurm.net/spec
  annotation onto the pod and the Slurm node's topology.
* **When**: like the operator's NodeSet controller, the steps that read Slurm run when a NodeSet's
  objects change (the NodeSet, any update of its pods, its own patches too, a cordon or a metadata change of
  their nodes: eventhandler/eventhandler_pod.go, eventhandler_node.go), or `RESYNC_SECONDS` after its last sync
  (nodeset_sync.go: every NodeSet is requeued 30 s later); Slurm changes alone trigger nothing sooner.
* **Accounting** (internal/builder/accountingbuilder/accounting_config.go, via `slinky_conf.slurmdbd_conf`):
  the Controller's Accounting becomes the local Slurm's slurmdbd, its storage password read from the
  Accounting's `storageConfig.passwordKeyRef` Secret as the operator reads it, started before slurmctld; a
  MariaDB process of the local Slurm (`localenv.slurm.ACCOUNTING_DB`) stands in for the database it names.
  The stack's SlurmUsers Job, whose pod cannot run here, runs through `localenv.slurm_users_job`.
* **Tokens** (controller/token: token_controller.go, token_sync.go): the Secret `spec.secretRef` holding a
  JWT for `spec.username`, signed with the key slurmctld uses, with the Token's labels and annotations
  (builder/common/token_secret.go), re-minted when a fifth of its `lifetime` is left (`refresh`), by a
  controller that visits a Token when it is first seen, when its object changes, at its RequeueAfter and at
  the 10 h resync, never when its Secret changes. `token_v121_requeue` reproduces v1.2.1's requeue, after
  which a Token whose pass re-minted it is not visited again until it changes.

Level-based: each pass compares what is with what should be. Never imported by `reconciler/`: the
reconciler meets the operator only through Kubernetes and Slurm, as in production.

Run as a process: ``python -m localenv.slinky_standin --config FILE`` (LocalEnv writes the file).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpufleet.stop_signal import set_on_signals
from gpufleet.waiting import wait_for
from localenv import slinky_conf
from localenv import slinky_update as upd
from localenv.slurm import Cancelled, LocalSlurm, LocalSlurmError

log = logging.getLogger("slinky-standin")

GROUP, VERSION = "slinky.slurm.net", "v1beta1"
NODESET_GROUP, NODESET_VERSION = GROUP, VERSION
PREFIX = "slurm-operator: "  # slurmcontrol.go nodeReasonPrefix
# The Slurm user the operator's own client acts as: its token's, slurmjwt.NewToken's default username "slurm"
# (internal/controller/token/slurmjwt/token.go; internal/controller/slurmclient/slurmclient_sync.go signs it), the
# SlurmUser. Its drains, undrains and IDLEs are recorded as set by it; the preStop's DOWN runs scontrol in the
# slurmd container, as root (LocalSlurm.stop_node).
OPERATOR_USER = "slurm"
TERMINATING_REASON = PREFIX + "Pod is terminating"  # workerbuilder/worker_app.go preStop
RESYNC_SECONDS = 30.0  # nodeset_sync.go: durationStore.Push(key, 30*time.Second)
# The manager's informers resync every 10 h (cmd/manager/main.go sets no SyncPeriod; controller-runtime's default)
TOKEN_RESYNC_SECONDS = 10 * 3600.0
MAX_REASON = 256  # nodeset_sync.go maxSlurmReasonLength
# api/v1beta1/well_known.go, builder/labels/labels.go, pkg/taints/taints.go
APP_LABEL, INSTANCE_LABEL, COMPONENT_LABEL = "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"
CLUSTER_LABEL = "slinky.slurm.net/cluster"
POD_NAME_LABEL = "nodeset.slinky.slurm.net/pod-name"
POD_INDEX_LABEL = "nodeset.slinky.slurm.net/pod-index"
POD_HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"
SCALING_MODE_LABEL = "nodeset.slinky.slurm.net/scaling-mode"
POD_PROTECT_LABEL = "nodeset.slinky.slurm.net/pod-protect"
POD_CORDON_ANNOTATION = "nodeset.slinky.slurm.net/pod-cordon"
CORDON_REASON_ANNOTATION = "nodeset.slinky.slurm.net/node-cordon-reason"
TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"
WORKER_TOLERATION = {"key": "nodeset.slinky.slurm.net/worker", "operator": "Equal", "effect": "NoExecute"}
BUSY = {"ALLOCATED", "MIXED", "COMPLETING"}
DECLARED_ANNOTATION = "localenv.gpufleet.io/declared"  # on a fixed NodeSet: its definition's hash (ours, not upstream's)


@dataclass(frozen=True)
class NodeSetDef:
    """A NodeSet for a run without a stack (benchmarks, tests): the stand-in declares it as a NodeSet resource on
    the API server (`SlinkyStandIn.declare_fixed`), whose uid its pods' controller reference names."""
    name: str
    replicas: int
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 0
    controller: str = "slurm"
    image: str = ""  # the slurmd container's image (changing it rolls the NodeSet)
    update_strategy: tuple[tuple[str, Any], ...] = ()  # spec.updateStrategy's items; () the operator's default

    def hostname(self, i: int) -> str:
        return f"{self.name}-{i}"

    def pod_name(self, i: int) -> str:
        return f"{self.name}-{i}"

    def resource(self, namespace: str) -> dict[str, Any]:
        """As components/slinky.py declares a pool's NodeSet."""
        limits = {"nvidia.com/gpu": self.gpus} if self.gpus else {}
        out = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeSet",
               "metadata": {"name": self.name, "namespace": namespace},
               "spec": {"controllerRef": {"name": self.controller}, "replicas": self.replicas,
                        "extraConf": f"Gres=gpu:{self.gpus}" if self.gpus else "",
                        "slurmd": {"resources": {"limits": limits}, **({"image": self.image} if self.image else {})},
                        "template": {"spec": {"nodeSelector": dict(self.node_selector),
                                              "tolerations": list(self.tolerations)}}}}
        if self.update_strategy:
            out["spec"]["updateStrategy"] = dict(self.update_strategy)
        return out


def _spec(r: dict) -> dict:
    return r.get("spec") or {}


def ordinal_name(nodeset: dict, i: int) -> str:
    """GetOrdinalPodName(): `<nodeset>-<ordinal>`, zero-padded to `ordinalPadding` digits."""
    return f"{nodeset['metadata']['name']}-{i:0{int(_spec(nodeset).get('ordinalPadding') or 0)}d}"


def pod_manifest(nodeset: dict, i: int, namespace: str) -> dict[str, Any]:
    """A NodeSet pod as the operator builds it (the parts that matter here)."""
    meta, spec = nodeset["metadata"], _spec(nodeset)
    name = ordinal_name(nodeset, i)
    template = spec.get("template") or {}
    tmeta, tspec = template.get("metadata") or {}, template.get("spec") or {}
    controller = (spec.get("controllerRef") or {}).get("name", "")
    pod_labels = {**(meta.get("labels") or {}), **(tmeta.get("labels") or {}),
                  APP_LABEL: "slurmd", INSTANCE_LABEL: meta["name"], COMPONENT_LABEL: "worker", CLUSTER_LABEL: controller,
                  POD_NAME_LABEL: name, POD_INDEX_LABEL: name.rsplit("-", 1)[1], POD_HOSTNAME_LABEL: name,
                  SCALING_MODE_LABEL: "StatefulSet", upd.REVISION_LABEL: upd.revision(nodeset)}
    slurmd = spec.get("slurmd") or {}
    resources = {k: {r: str(v) for r, v in (slurmd.get("resources") or {}).get(k, {}).items()}
                 for k in ("limits", "requests") if (slurmd.get("resources") or {}).get(k)}
    owner = [nodeset_owner(nodeset)] if meta.get("uid") else []
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels, "ownerReferences": owner,
                     "annotations": {**(tmeta.get("annotations") or {}),
                                     "kubectl.kubernetes.io/default-container": "slurmd"}},
        "spec": {
            "hostname": name,
            "nodeSelector": dict(tspec.get("nodeSelector") or {}),
            "tolerations": list(tspec.get("tolerations") or []) + [WORKER_TOLERATION],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchExpressions": [{"key": APP_LABEL, "operator": "In", "values": ["slurmd"]}]}}]}},
            "containers": [{"name": "slurmd", "image": slurmd.get("image") or "slurmd", "resources": resources}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def nodeset_owner(nodeset: dict) -> dict[str, Any]:
    """The controller reference a NodeSet pod carries to its NodeSet (controller/nodeset/utils/utils.go
    NewNodeSetStatefulSetPod: metav1.NewControllerRef(nodeset, NodeSetGVK), with the NodeSet object's uid)."""
    meta = nodeset["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeSet", "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def declare_nodesets(api: client.ApiClient, namespace: str, defs: list[NodeSetDef]) -> list[dict]:
    """NodeSets of a run without a stack as objects on the API server, made (or brought to their definition)
    first, with their kind if the API server lacks it: a pod's controller reference names its NodeSet's real
    uid, as with the operator, and the garbage collector keeps a pod whose owner exists. A definition's hash
    in an annotation says whether the object is current."""
    custom = client.CustomObjectsApi(api)
    if not defs:
        return []
    try:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "nodesets")["items"]
    except ApiException as e:
        if e.status != 404:
            raise
        _ensure_nodeset_crd(api)
        listed = []
    have = {o["metadata"]["name"]: o for o in listed}
    out = []
    for d in defs:
        body = d.resource(namespace)
        digest = hashlib.sha256(json.dumps(body["spec"], sort_keys=True).encode()).hexdigest()[:16]
        body["metadata"]["annotations"] = {DECLARED_ANNOTATION: digest}
        cur = have.get(d.name)
        if cur is None:
            cur = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "nodesets", body)
        elif (cur["metadata"].get("annotations") or {}).get(DECLARED_ANNOTATION) != digest:
            body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            cur = custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, "nodesets", d.name, body)
        out.append(cur)
    return out


def _ensure_nodeset_crd(api: client.ApiClient) -> None:
    """The NodeSet kind (gpufleet's copy of the release's CRD), for an API server no stack was applied to."""
    from gpufleet.components.slinky_schema import crd_manifest  # (not needed when a stack declares the NodeSets)

    ext = client.ApiextensionsV1Api(api)
    name = f"nodesets.{GROUP}"
    try:
        ext.create_custom_resource_definition(crd_manifest("NodeSet"))
    except ApiException as e:
        if e.status != 409:
            raise
    wait_for(f"CRD {name} to be established", lambda: any(
        c.type == "Established" and c.status == "True"
        for c in ext.read_custom_resource_definition(name).status.conditions or []), timeout=30, interval=0.2)


def pod_facts(pod: Any) -> upd.PodFacts:
    """What the operator's sort and update decisions read of a pod (slinky_update.PodFacts)."""
    ready = next((c for c in pod.status.conditions or [] if c.type == "Ready"), None) if pod.status else None
    meta = pod.metadata
    return upd.PodFacts(
        name=meta.name, node_name=pod.spec.node_name or "", phase=(pod.status.phase if pod.status else None) or "",
        ready=ready is not None and ready.status == "True",
        ready_since=ready.last_transition_time.timestamp() if ready is not None and ready.status == "True"
        and ready.last_transition_time else None,
        created=meta.creation_timestamp.timestamp() if meta.creation_timestamp else None,
        annotations=tuple(sorted((meta.annotations or {}).items())),
        revision=(meta.labels or {}).get(upd.REVISION_LABEL, ""), terminating=meta.deletion_timestamp is not None)


def pod_info(pod: Any, nodeset: dict) -> str:
    """podinfo.PodInfo as JSON (internal/utils/podinfo/podinfo.go: field order, omitempty)."""
    info: dict[str, str] = {"namespace": pod.metadata.namespace, "podName": pod.metadata.name,
                            "node": pod.spec.node_name or ""}
    if nodeset["metadata"]["name"]:
        info["nodeSetName"] = nodeset["metadata"]["name"]
    if nodeset["metadata"].get("uid"):
        info["nodeSetUID"] = nodeset["metadata"]["uid"]
    return json.dumps(info, separators=(",", ":"))


def sanitize_reason(reason: str) -> str:
    """sanitizeSlurmReason(): tabs and newlines to spaces, other control characters dropped, trimmed,
    at most 256 characters."""
    out = "".join(" " if c in "\t\n\r" else c for c in reason if c in "\t\n\r" or unicodedata.category(c) != "Cc")
    return out.strip()[:MAX_REASON].strip()


def reason_is_ours(reason: str) -> bool:
    """IsNodeReasonOurs(): empty, or the operator's prefix."""
    return not reason or reason.startswith(PREFIX)


def unresponsive(states: set[str], reason: str) -> bool:
    """IsNodeDownForUnresponsive(): DOWN with "Not responding" in the reason."""
    return "DOWN" in states and "Not responding" in reason


class SlinkyStandIn:
    """Args: `nodesets` None to act on the Slinky resources in `namespace` (what the operator does), or
    a fixed list (runs without a stack; the namespace is then made if missing, and the local Slurm
    keeps the configuration it was started with)."""

    def __init__(self, api: client.ApiClient, slurm: LocalSlurm, nodesets: list[NodeSetDef] | None = None,
                 namespace: str = "slurm", resync: float = RESYNC_SECONDS, clock: Callable[[], float] = time.monotonic,
                 token_v121_requeue: bool = False):
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.slurm = slurm
        self.fixed = None if nodesets is None else list(nodesets)
        self.namespace = namespace
        self.resync = resync
        self.clock = clock
        self._synced: dict[str, tuple[str, float]] = {}  # NodeSet -> (fingerprint, when) of its last Slurm sync
        self.batch = client.BatchV1Api(api)
        self._users_done: set[str] = set()  # uids of the SlurmUsers Jobs whose script succeeded
        self.token_v121_requeue = token_v121_requeue
        self.token_resync = TOKEN_RESYNC_SECONDS
        self._token_due: dict[str, float | None] = {}  # Token -> when its RequeueAfter comes due; None: never
        self._token_version: dict[str, str | None] = {}  # Token -> the resourceVersion last reconciled
        self._token_resync_at = time.time()
        self._not_kept: dict[str, set[str]] = {}  # NodeSet -> its pods outside doPodProcessing's podsToKeep
        self._deleted: set[str] = set()  # pods deleted in this pass

    # ------------------------------------------------------------------ reading

    def _list(self, plural: str) -> list[dict]:
        try:
            return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)["items"]
        except ApiException as e:
            if e.status == 404:  # no such kind or namespace yet: the stack is not applied
                return []
            raise

    def nodesets(self) -> list[dict]:
        if self.fixed is not None:
            return self.declare_fixed()
        return self._list("nodesets")

    def declare_fixed(self) -> list[dict]:
        self._ensure_namespace()
        return declare_nodesets(self.core.api_client, self.namespace, self.fixed or [])

    # ------------------------------------------------------------------ one pass

    def reconcile_once(self) -> None:
        try:
            self._sync_tokens()
        except Exception as e:  # noqa: BLE001 - tokens must not stop the NodeSet pods
            log.warning("tokens: %s", e)
        if self.fixed is None:
            try:
                self._sync_slurm_users()
            except Exception as e:  # noqa: BLE001 - nor the Slurm users Job
                log.warning("slurm users job: %s", e)
        nodesets = self.nodesets()
        if self.fixed is not None:
            self._ensure_namespace()
        else:
            self._sync_config(nodesets)
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{COMPONENT_LABEL}=worker").items}
        nodes = {n.metadata.name: n for n in self.core.list_node().items}
        slurm = self._slurm_nodes()
        running: dict[str, tuple[dict, Any]] = {}  # Slurm name -> (nodeset, pod)
        mine: set[str] = set()
        for ns in nodesets:
            controller = (_spec(ns).get("controllerRef") or {}).get("name", "")
            self._sync_pdb(controller)
            own = {n: p for n, p in pods.items() if (p.metadata.labels or {}).get(INSTANCE_LABEL) == ns["metadata"]["name"]}
            mine |= set(own)
            self._deleted.clear()
            self._not_kept[ns["metadata"]["name"]] = self._sync_nodeset_pods(ns, own, slurm)
            for name, pod in own.items():  # (a pod deleted just now is gone: its preStop runs below)
                if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running" and pod.spec.node_name \
                        and name not in self._deleted:
                    running[name] = (ns, pod)
        for name, pod in pods.items():  # pods of a NodeSet no longer declared (garbage collection)
            if name not in mine and pod.metadata.deletion_timestamp is None:
                self._delete_pod(name, "its NodeSet is gone")
        self._sync_slurmds(running)
        for ns in nodesets:
            self._maybe_sync_slurm(ns, {n: rp for n, rp in running.items() if rp[0] is ns}, pods, nodes)

    # ------------------------------------------------------------------ config (controller_config.go)

    def _sync_config(self, nodesets: list[dict]) -> None:
        controllers = self._list("controllers")
        if not controllers:
            return
        controller = controllers[0]
        spec = _spec(controller)
        accounting = None
        if spec.get("accountingRef"):
            accounting = next((a for a in self._list("accountings")
                               if a["metadata"]["name"] == spec["accountingRef"].get("name")), None)
        if accounting is not None and not self._sync_accounting(accounting):
            return  # the operator fails the sync until the Accounting's Secret exists
        files: dict[str, str] = {}
        for ref in spec.get("configFileRefs") or []:
            try:
                files.update(self.core.read_namespaced_config_map(ref["name"], self.namespace).data or {})
            except ApiException as e:
                if e.status != 404:
                    raise
                log.warning("configFileRefs: ConfigMap %s not found yet", ref["name"])
                return  # the operator fails the sync until it exists
        files["slurm.conf"] = slinky_conf.slurm_conf(controller, accounting, slinky_conf.nodesets_of(controller, nodesets))
        files.setdefault("cgroup.conf", slinky_conf.cgroup_conf())
        if self.slurm.apply_operator_files(files):
            log.info("controller %s: slurm.conf and config files changed: slurmctld restarted with them",
                     controller["metadata"]["name"])

    # ------------------------------------------------------------------ accounting (accountingbuilder)

    def _sync_accounting(self, accounting: dict) -> bool:
        """The Accounting's slurmdbd.conf (BuildAccountingConfig: its password from passwordKeyRef) and the
        database it names, given to the local Slurm, which (re)starts slurmdbd and the database stand-in.
        False while the password's Secret is missing (BuildAccountingConfig returns the error)."""
        import base64

        from localenv.slurm import AccountingDb

        storage = _spec(accounting).get("storageConfig") or {}
        ref = storage.get("passwordKeyRef") or {}
        try:
            secret = self.core.read_namespaced_secret(ref.get("name", ""), self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            log.warning("accounting %s: Secret %s not found yet", accounting["metadata"]["name"], ref.get("name"))
            return False
        password = base64.b64decode((secret.data or {}).get(ref.get("key", ""), "")).decode()
        db = AccountingDb(database=storage.get("database", ""), user=storage.get("username", ""), password=password)
        if self.slurm.apply_accounting(slinky_conf.slurmdbd_conf(accounting, password), db):
            log.info("accounting %s: slurmdbd and the database stand-in for %s:%s started with it",
                     accounting["metadata"]["name"], storage.get("host"), storage.get("port"))
        return True

    def _sync_slurm_users(self) -> None:
        """The stack's SlurmUsers Job (its pod's stand-in: localenv/slurm_users_job.py)."""
        from localenv import slurm_users_job

        slurm_users_job.run_pending(self.batch, self.core, self.slurm, self.namespace, self._users_done)

    # ------------------------------------------------------------------ pods (nodeset_sync.go)

    def _create_pod(self, ns: dict, i: int) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, pod_manifest(ns, i, self.namespace))
            log.info("created pod %s", ordinal_name(ns, i))
        except ApiException as e:
            if e.status != 409:  # still terminating, or made meanwhile
                raise

    def _delete_pod(self, name: str, why: str) -> None:
        log.info("deleting pod %s: %s", name, why)
        self._deleted.add(name)
        try:
            self.core.delete_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def _sync_nodeset_pods(self, ns: dict, own: dict[str, Any], slurm: dict[str, dict]) -> set[str]:
        """syncNodeSetPods (StatefulSet mode), then syncUpdate: scale out to the lowest free ordinals, scale in
        in ActivePods order, else doPodProcessing and the update strategy's condemned pods. Returns the pods
        that are not in podsToKeep (not to be uncordoned this pass)."""
        spec = _spec(ns)
        replicas = int(spec.get("replicas") if spec.get("replicas") is not None else 1)
        facts = [pod_facts(p) for p in own.values()]
        diff = len(own) - replicas  # every pod of the NodeSet, a terminating one too (getNodeSetPods)
        if diff < 0:
            for i in upd.free_ordinals({upd.ordinal(n) for n in own}, -diff):
                self._create_pod(ns, i)
            return set()  # doPodScale keeps them all; syncUpdate waits for the creations (expectations)
        if diff > 0:
            condemned, _ = upd.split_active(facts, diff)
            for p in condemned:
                self._condemn(own[p.name], slurm.get(p.name), "scale-in: beyond the NodeSet's replicas")
            return {p.name for p in condemned}
        for name, pod in own.items():  # processNodeSetPod
            if pod.metadata.deletion_timestamp is None and pod.status.phase in ("Failed", "Succeeded"):
                self._delete_pod(name, "failed or finished: made again")
        kind, _ = upd.strategy(spec)
        if kind == upd.SCHEDULED_UPDATE:
            log.warning("NodeSet %s: updateStrategy ScheduledUpdate is not modelled by the stand-in: no update",
                        ns["metadata"]["name"])
            return set(own)
        revision = upd.revision(ns)
        condemned, keep = upd.split_update(spec, facts, revision, time.time())
        if kind == upd.ROLLING_UPDATE:  # syncRollingUpdate: the unhealthy old pods, then splitUpdatePods' choice
            unhealthy, _ = upd.split_unhealthy(upd.find_updated(facts, revision)[1])
            for p in unhealthy + condemned:
                self._condemn(own[p.name], slurm.get(p.name), f"rolling update to revision {revision}")
        return set(own) - {p.name for p in keep}

    def _condemn(self, pod: Any, node: dict | None, why: str) -> None:
        """processCondemned(): drain the Slurm node (overriding the reason), delete the pod once drained and
        idle (IsNodeDrained: DRAIN, not UNDRAIN, not ALLOCATED, MIXED or COMPLETING)."""
        if pod.metadata.deletion_timestamp is not None:
            return
        name = pod.metadata.name
        if node is not None:
            states = set(node.get("state", []))
            drained = "DRAIN" in states and "UNDRAIN" not in states and not states & BUSY
            if not drained:
                self._cordon_pod(pod)
                self._drain(name, node, f"Pod ({self.namespace}/{name}) is pending termination for scale-in",
                            override=True)
                return
        self._delete_pod(name, f"{why}, drained")

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

    def _sync_pdb(self, controller: str) -> None:
        """BuildClusterWorkerPodDisruptionBudget(): one per cluster (Controller)."""
        name = f"slurm-workers-pdb-{controller}"
        body = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"selector": {"matchLabels": {POD_PROTECT_LABEL: "true", CLUSTER_LABEL: controller}},
                         "maxUnavailable": 0}}
        try:
            self.policy.read_namespaced_pod_disruption_budget(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.policy.create_namespaced_pod_disruption_budget(self.namespace, body)
            except ApiException as e2:
                if e2.status != 409:
                    raise

    # ------------------------------------------------------------------ slurmd per pod

    def _sync_slurmds(self, running: dict[str, tuple[dict, Any]]) -> None:
        running = self._on_live_machines(running)
        wanted = set(self.slurm.wanted_nodes())
        for name in sorted(wanted - set(running)):
            if self._machine_lost(name):
                continue
            log.info("pod of Slurm node %s terminating or gone: preStop (DOWN, %r), slurmd stops", name,
                     TERMINATING_REASON)
            self.slurm.stop_node(name)
        for name, (ns, pod) in sorted(running.items()):
            spec = self.slurm.node_spec(name)
            moved = spec is not None and spec.host not in ("", pod.spec.node_name)
            if name in wanted and moved:
                self.slurm.stop_node(name)  # the pod moved while we looked away: the old one's preStop first
            if name not in wanted or moved:
                log.info("pod %s Running on %s: slurmd for Slurm node %s", name, pod.spec.node_name, name)
                # The Slurm comment is the status sync's (UpdateNodeWithPodInfo), not the slurmd's start.
                self.slurm.start_node(name, ns["metadata"]["name"], None, conf=slinky_conf.slurmd_conf(ns),
                                      host=pod.spec.node_name)

    def _on_live_machines(self, running: dict[str, tuple[dict, Any]]) -> dict[str, tuple[dict, Any]]:
        """The Running pods whose Kubernetes node is Ready. A pod on a node gone or not Ready (a dead kubelet,
        which the node lifecycle controller marks Ready Unknown) keeps its Running phase, since nothing updates
        a dead kubelet's pods, and the operator deletes none of them, but its slurmd died with the machine: it
        is lost, with no preStop (LocalSlurm.lose_node; slurmctld marks it DOWN "Not responding"). A node
        Ready again (its kubelet back) has its pods' slurmds started again."""
        ready = {n.metadata.name for n in self.core.list_node().items
                 if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])}
        wanted = set(self.slurm.wanted_nodes())
        live: dict[str, tuple[dict, Any]] = {}
        for name, (ns, pod) in running.items():
            if pod.spec.node_name in ready:
                live[name] = (ns, pod)
            elif name in wanted:
                log.warning("Slurm node %s: its machine %s is gone or not Ready (kubelet dead): slurmd dies with it, "
                            "no preStop; slurmctld will find it not responding", name, pod.spec.node_name)
                self.slurm.lose_node(name)
        return live

    def _machine_lost(self, name: str) -> bool:
        """A pod whose slurmd stops where no preStop runs: its Kubernetes node is gone or not Ready (the kubelet
        is dead: nothing runs the container's hooks), or the pod is being deleted with a grace period of 0 (the
        kubelet runs a preStop only `if gracePeriod > 0`, the grace being the pod's DeletionGracePeriodSeconds:
        kubernetes v1.34 pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer). Then slurmd dies with
        no DOWN of the operator's, and slurmctld marks the node DOWN "Not responding" after SlurmdTimeout
        (LocalSlurm.lose_node). True when it was so (the slurmd is gone then). kwok removes a deleted pod at once
        on a node it manages, so a grace-0 delete shows here only on a node whose kubelet is dead."""
        spec = self.slurm.node_spec(name)
        try:
            pod = self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            pod = None
        host = (pod.spec.node_name if pod is not None and pod.spec.node_name else None) or (spec.host if spec else "")
        grace0 = pod is not None and pod.metadata.deletion_timestamp is not None and \
            pod.metadata.deletion_grace_period_seconds == 0
        ready = False
        if host:
            try:
                node = self.core.read_node(host)
                ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            except ApiException as e:
                if e.status != 404:
                    raise
        if ready and not grace0:
            return False
        why = "a grace-0 delete" if grace0 else f"its node {host or '?'} is gone or not Ready (kubelet dead)"
        log.warning("pod of Slurm node %s gone with %s: no preStop; slurmd dies, slurmctld will find it not "
                    "responding", name, why)
        self.slurm.lose_node(name)
        return True

    # ------------------------------------------------------------------ what reads Slurm, when it would run

    def _fingerprint(self, ns: dict, pods: dict[str, Any], nodes: dict[str, Any]) -> str:
        own = sorted((p.metadata.name, p.metadata.resource_version) for p in pods.values()
                     if (p.metadata.labels or {}).get(INSTANCE_LABEL) == ns["metadata"]["name"])
        hosts = sorted({p.spec.node_name for p in pods.values() if p.spec.node_name
                        and (p.metadata.labels or {}).get(INSTANCE_LABEL) == ns["metadata"]["name"]})
        # Node updates count only for a cordon or metadata change (eventhandler_node.go Update), not status heartbeats.
        data = [ns["metadata"].get("resourceVersion"), own,
                [(h, bool(nodes[h].spec.unschedulable), nodes[h].metadata.annotations or {}, nodes[h].metadata.labels or {})
                 for h in hosts if h in nodes]]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()

    def _maybe_sync_slurm(self, ns: dict, running: dict[str, tuple[dict, Any]], pods: dict[str, Any],
                          nodes: dict[str, Any]) -> None:
        key = ns["metadata"]["name"]
        fp, now = self._fingerprint(ns, pods, nodes), self.clock()
        last = self._synced.get(key)
        if last is not None and last[0] == fp and now - last[1] < self.resync:
            return
        slurm = self._slurm_nodes()
        for name, (_, pod) in sorted(running.items()):
            node = nodes.get(pod.spec.node_name)
            st = slurm.get(name)
            if node is None or st is None:
                continue
            self._sync_cordon(pod, node, st)
        slurm = self._slurm_nodes()
        not_kept = self._not_kept.get(key, set())
        for name, (_, pod) in sorted(running.items()):  # syncNodeSetPods -> doPodProcessing -> syncPodUncordon
            node = nodes.get(pod.spec.node_name)
            if node is not None and name in slurm and name not in not_kept:
                self._sync_pod_uncordon(pod, node, slurm[name])
        slurm = self._slurm_nodes()
        for name, (_, pod) in sorted(running.items()):
            node = nodes.get(pod.spec.node_name)
            if node is not None and name in slurm:
                self._sync_topology(pod, node, slurm[name])
        slurm = self._slurm_nodes()
        for name, (nsr, pod) in sorted(running.items()):
            if name in slurm and self._ready(pod):
                self._sync_pod_info(pod, nsr, slurm[name])
        slurm = self._slurm_nodes()
        protect = _spec(ns).get("workloadDisruptionProtection", True) is not False
        for name, (_, pod) in sorted(running.items()):
            busy = bool(set(slurm.get(name, {}).get("state", [])) & BUSY)
            self._label_pod(pod, POD_PROTECT_LABEL, "true" if busy and protect else None)
        # The objects as this pass read them: whatever changed since (a pod turned Ready while the pass ran, or
        # this pass's own label and annotation patches) is an event for the next pass. Upstream, every update of
        # an owned pod with a new resourceVersion queues its NodeSet (eventhandler_pod.go updatePod), the
        # operator's own writes too, and a key queued while it is reconciled is reconciled again after
        # (client-go util/workqueue/queue.go: dirty while processing, re-added at Done).
        self._synced[key] = (fp, self.clock())

    @staticmethod
    def _ready(pod: Any) -> bool:
        """IsHealthy(): Running and Ready, not terminating."""
        conds = {c.type: c.status for c in (pod.status.conditions or [])}
        return pod.status.phase == "Running" and conds.get("Ready") == "True" and pod.metadata.deletion_timestamp is None

    def _sync_cordon(self, pod: Any, node: Any, st: dict) -> None:
        """syncCordon()."""
        reason, states = st.get("reason", ""), set(st.get("state", []))
        if not reason_is_ours(reason) or unresponsive(states, reason):
            return
        name, ref = pod.metadata.name, f"{pod.metadata.namespace}/{pod.metadata.name}"
        cordoned = (pod.metadata.annotations or {}).get(POD_CORDON_ANNOTATION) == "true"
        if node.spec.unschedulable:
            ann = (node.metadata.annotations or {})
            why = (sanitize_reason(ann[CORDON_REASON_ANNOTATION]) if CORDON_REASON_ANNOTATION in ann
                   else f"Node ({node.metadata.name}) was cordoned, Pod ({ref}) must be cordoned")
            self._cordon_pod(pod)
            self._drain(name, st, why, override=False)
        elif cordoned:
            self._drain(name, st, f"Pod ({ref}) was cordoned", override=False)
        else:
            self._uncordon_and_undrain(pod, st, f"Pod ({ref}) was uncordoned")

    def _sync_pod_uncordon(self, pod: Any, node: Any, st: dict) -> None:
        """syncPodUncordon() (for the pods an update keeps): on a schedulable node, with an empty or own
        reason, the pod is uncordoned and its Slurm node undrained."""
        if node.spec.unschedulable or not reason_is_ours(st.get("reason", "")):
            return
        self._uncordon_and_undrain(pod, st, "")

    def _uncordon_and_undrain(self, pod: Any, st: dict, reason: str) -> None:
        """makePodUncordonAndUndrain(); MakeNodeUndrain(): UNDRAIN only a DRAIN, its reason prefixed (or empty)."""
        if (pod.metadata.annotations or {}).get(POD_CORDON_ANNOTATION):
            self._annotate_pod(pod, POD_CORDON_ANNOTATION, None)
            pod.metadata.annotations.pop(POD_CORDON_ANNOTATION, None)
        states = set(st.get("state", []))
        if "DRAIN" in states and "UNDRAIN" not in states:
            log.info("Slurm node %s: undrain (was %r)", pod.metadata.name, st.get("reason", ""))
            self.slurm.set_node_state(pod.metadata.name, "UNDRAIN", PREFIX + reason if reason else None,
                                      user=OPERATOR_USER)

    def _drain(self, name: str, st: dict, reason: str, override: bool) -> None:
        """MakeNodeDrain(): the operator's prefix; a reason already there is kept unless `override`."""
        have = st.get("reason", "")
        new = PREFIX + (reason or "unknown")
        if not override and have:
            new = have
        if "DRAIN" in set(st.get("state", [])) and have == new:
            return
        log.info("Slurm node %s: drain (%s)", name, new)
        self.slurm.set_node_state(name, "DRAIN", new, user=OPERATOR_USER)

    def _cordon_pod(self, pod: Any) -> None:
        if (pod.metadata.annotations or {}).get(POD_CORDON_ANNOTATION) != "true":
            self._annotate_pod(pod, POD_CORDON_ANNOTATION, "true")

    def _sync_topology(self, pod: Any, node: Any, st: dict) -> None:
        """syncSlurmTopology(): the node's topology annotation onto the pod and the Slurm node."""
        spec = (node.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION, "")
        if (pod.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION) != spec:
            self._annotate_pod(pod, TOPOLOGY_ANNOTATION, spec)
        if (st.get("topology") or "") != spec:
            log.info("Slurm node %s: topology %r", pod.metadata.name, spec)
            self.slurm.run(["scontrol", "update", f"NodeName={pod.metadata.name}", f"Topology={spec}"], timeout=15)

    def _sync_pod_info(self, pod: Any, ns: dict, st: dict) -> None:
        """UpdateNodeWithPodInfo(): the comment; IDLE when a pod info naming a node was there before."""
        new = pod_info(pod, ns)
        try:
            old = json.loads(st.get("comment") or "{}")
        except ValueError:
            old = {}
        if isinstance(old, dict) and json.dumps(old, separators=(",", ":")) == new:
            return
        name = pod.metadata.name
        log.info("Slurm node %s: comment %s", name, new)
        self.slurm.scontrol("update", f"NodeName={name}", f"Comment={new}", user=OPERATOR_USER)
        if isinstance(old, dict) and old.get("node"):
            log.info("Slurm node %s: IDLE (its pod moved from %s to %s)", name, old.get("node"), pod.spec.node_name)
            try:
                self.slurm.set_node_state(name, "IDLE", user=OPERATOR_USER)
            except LocalSlurmError as e:
                # Upstream returns the error (controller-runtime logs it and requeues) and never sends the IDLE
                # again: the comment is written, so the next pass finds it equal and skips. slurmctld refuses it,
                # e.g., once the moved node runs a job again ("Invalid node state transition").
                log.warning("Slurm node %s: IDLE refused, not tried again (as upstream): %s", name, e)

    def _annotate_pod(self, pod: Any, key: str, value: str | None) -> None:
        self._patch_pod(pod, {"metadata": {"annotations": {key: value}}})

    def _label_pod(self, pod: Any, key: str, value: str | None) -> None:
        if (pod.metadata.labels or {}).get(key) != value:
            log.info("pod %s: label %s=%s", pod.metadata.name, key, value)
            self._patch_pod(pod, {"metadata": {"labels": {key: value}}})

    def _patch_pod(self, pod: Any, body: dict) -> None:
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise

    def _slurm_nodes(self) -> dict[str, dict[str, Any]]:
        """Slurm name -> {"state", "reason", "comment", "topology"}."""
        return {name: {"state": list(n.get("state", [])), "reason": n.get("reason", ""),
                       "comment": n.get("comment", ""), "topology": n.get("topology", "")}
                for name, n in self.slurm.node_info().items()}

    # ------------------------------------------------------------------ tokens (controller/token)

    def _sync_tokens(self) -> None:
        """The Token controller's work queue (internal/controller/token/token_controller.go): a Token is
        reconciled when it is first seen (the informer's initial list), when its object changes (any update
        event: ``For(&Token{})`` with no predicate), at the informers' resync (TOKEN_RESYNC_SECONDS) and when
        the RequeueAfter its last pass returned comes due. Its Secret changing wakes nothing: the Secret's
        controller owner is the JWT-key Secret (internal/builder/common/token_secret.go BuildSecret(opts,
        jwtSecret)), so ``Owns(&corev1.Secret{})`` maps it to no Token."""
        try:
            tokens = self.custom.list_cluster_custom_object(GROUP, VERSION, "tokens")["items"]
        except ApiException as e:
            if e.status == 404:
                return
            raise
        now = time.time()
        resync = now - self._token_resync_at >= self.token_resync
        for t in tokens:
            meta = t["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            due = self._token_due.get(key, now)  # never seen: queued
            changed = self._token_version.get(key) != meta.get("resourceVersion")
            if not (changed or resync or (due is not None and now >= due)):
                continue
            self._token_version[key] = meta.get("resourceVersion")
            after = self._reconcile_token(t, now)
            self._token_due[key] = None if after is None else now + after
            if after is None:
                log.warning("token %s: the pass returned RequeueAfter <= 0: not visited again until the Token "
                            "changes (slurm-operator v1.2.1, fixed after it)", key)
        if resync:
            self._token_resync_at = now

    def _reconcile_token(self, t: dict, now: float) -> float | None:
        """One pass of token_sync.go ``Sync``; the RequeueAfter it returns (the least duration its steps
        pushed: durationstore.Less), None where that is <= 0 (controller-runtime then forgets the key).

        With `token_v121_requeue` the pushes are v1.2.1's: the preamble pushes ``refreshTime - now`` of the
        token it found (30 s when it has none, or it is expired: getExpTime fails), and the ``Refresh`` step
        pushes it again before re-minting; so a pass that re-mints a token not yet expired returns <= 0 and
        the Token is not revisited. Without it, the fix after v1.2.1 (commit fcc501f1): the preamble's push
        is gone, ``Refresh`` clamps its push to [1 s, lifetime] and pushes 4/5 of the lifetime after a
        re-mint. The status write (syncStatus: issuedAt from the Secret read through the informer cache just
        after writing it, so still the old one in the usual case) is not made: it would change nothing."""
        import base64

        import jwt

        spec, meta = t.get("spec") or {}, t["metadata"]
        ref = spec.get("secretRef") or {}
        name, key = ref.get("name") or f"{meta['name']}-jwt-{spec.get('username', '')}", ref.get("key", "SLURM_JWT")
        if not spec.get("username"):
            return None
        lifetime = _seconds(spec.get("lifetime", "15m"))  # api/v1beta1/token_keys.go Lifetime
        pushes: list[float] = []
        try:
            current = self.core.read_namespaced_secret(name, meta["namespace"])
            old = base64.b64decode((current.data or {}).get(key, "")).decode()
            exp = float(jwt.decode(old, options={"verify_signature": False}).get("exp", 0)) if old else None
        except ApiException as e:
            if e.status != 404:
                raise
            current, exp = None, None
        expired = exp is not None and exp <= now
        if self.token_v121_requeue:  # the preamble (removed by fcc501f1)
            pushes.append(30.0 if exp is None or expired else (exp - lifetime / 5) - now)
        if current is None:  # step "Secret": SyncObject(..., false) creates it, minting a token
            self._write_token_secret(t, name, key, lifetime, None)
            return 1.0  # "Refresh" then fails to read it from the cache yet: an error, requeued with backoff
        if spec.get("refresh", True) is False:  # defaults.DefaultTokenRefresh; false: an immutable Secret
            return min(pushes) if pushes and min(pushes) > 0 else None
        refresh_at = now if exp is None or expired else exp - lifetime / 5
        if exp is not None and not expired:
            pushes.append(refresh_at - now if self.token_v121_requeue else min(max(refresh_at - now, 1.0), lifetime))
        if now >= refresh_at:
            self._write_token_secret(t, name, key, lifetime, current)
            if not self.token_v121_requeue:
                pushes.append(lifetime - lifetime / 5)
        after = min(pushes) if pushes else 0.0
        return after if after > 0 else None

    def _write_token_secret(self, t: dict, name: str, key: str, lifetime: int, current: Any) -> None:
        """BuildTokenSecret: a new JWT for `spec.username`, with the Token's labels and annotations."""
        spec, meta = t.get("spec") or {}, t["metadata"]
        token = self.slurm.token(spec["username"], lifetime)
        labels_ = {**(meta.get("labels") or {}), "app.kubernetes.io/managed-by": "slurm-operator-standin"}
        body = {"metadata": {"name": name, "namespace": meta["namespace"], "labels": labels_,
                             "annotations": dict(meta.get("annotations") or {})},
                "type": "Opaque", "stringData": {key: token}}
        if current is None:
            self.core.create_namespaced_secret(meta["namespace"], body)
        else:
            self.core.replace_namespaced_secret(name, meta["namespace"], body)
        log.info("token %s/%s: wrote Secret %s for Slurm user %s (%ss)", meta["namespace"], meta["name"],
                 name, spec["username"], lifetime)

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Passes until `stop` is set. Give the local Slurm the same event as its `cancel` (main() does): a stop
        then abandons the pass in flight at its next Slurm command or daemon wait, as the operator's manager
        cancels its context on SIGTERM (controller-runtime pkg/manager/signals). The pass is level-based: the
        next start does what was left."""
        while not stop.is_set():
            try:
                self.reconcile_once()
            except Cancelled:
                log.info("stopping: the pass in flight abandoned")
                return
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
    resync: float = RESYNC_SECONDS
    # Reproduce slurm-operator v1.2.1's Token requeue (a pass that re-mints returns RequeueAfter <= 0 and the
    # Token is not visited again until it changes); default: the fix after v1.2.1. SlinkyStandIn._reconcile_token.
    token_v121_requeue: bool = False

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def read(path: Path) -> "StandInConfig":
        return StandInConfig(**json.loads(path.read_text()))


def local_slurm(args: dict[str, Any], cancel: threading.Event | None = None) -> LocalSlurm:
    a = dict(args)
    return LocalSlurm(a.pop("workdir"), a.pop("partitions"), cancel=cancel, **a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stand-in for Slinky's slurm-operator v1.2.1 (local environment).")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--once", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = StandInConfig.read(a.config)
    nodesets = None if cfg.nodesets is None else [NodeSetDef(**n) for n in cfg.nodesets]
    stop = threading.Event()  # set on SIGTERM; the local Slurm's cancel, so the pass in flight ends with it
    standin = SlinkyStandIn(config.new_client_from_config(config_file=cfg.kubeconfig), local_slurm(cfg.slurm, stop),
                            nodesets, cfg.namespace, resync=cfg.resync, token_v121_requeue=cfg.token_v121_requeue)
    if a.once:
        standin.reconcile_once()
        return 0
    term = set_on_signals(stop)  # SIGTERM sets it (never from inside the handler: gpufleet/stop_signal.py)
    log.info("running for %s in namespace %s", "the Slinky resources" if nodesets is None
             else "NodeSets " + ", ".join(n.name for n in nodesets), cfg.namespace)
    try:
        standin.run(stop, a.interval)
    except KeyboardInterrupt:
        pass
    if term:
        log.info("stopped %.1fs after SIGTERM", time.monotonic() - term[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
