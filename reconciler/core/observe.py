"""Turn raw Kubernetes objects (dicts, as the API sends them) into the core's views. Pure."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Iterable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.node_repair import parse_check, parse_request, parse_result

from gpufleet.reconciler.core.faults import FaultReader
from gpufleet.reconciler.core.model import NodeView, PodView


EPOCH = datetime.fromtimestamp(0, timezone.utc)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def fault_since(condition: dict[str, Any]) -> datetime:
    """When the fault was signalled: the condition's lastTransitionTime. A detector that leaves it
    out gets the epoch, a fixed value, so the same signal always names the same record (the current
    time would make a new record at every update)."""
    value = condition.get("lastTransitionTime")
    return parse_time(value) if value else EPOCH


def condition_reporters(managed: Iterable[dict[str, Any]] | None) -> dict[str, str]:
    """Condition type -> the field manager that last wrote its status or reason (the node's managedFields:
    an update takes the fields it changes from their earlier managers), i.e. who reported it."""
    out: dict[str, str] = {}
    for entry in managed or []:
        conds = (((entry.get("fieldsV1") or {}).get("f:status") or {}).get("f:conditions") or {})
        for key, fields in conds.items():
            if not key.startswith("k:") or not isinstance(fields, dict):
                continue
            try:
                ctype = json.loads(key[2:]).get("type")
            except (ValueError, AttributeError):
                continue
            if isinstance(ctype, str) and ("f:status" in fields or "f:reason" in fields):
                out[ctype] = str(entry.get("manager") or "")[:128]
    return out


def node_view(node: dict[str, Any], conditions: FaultReader | Iterable[str]) -> NodeView:
    """`conditions`: how faults are read (FaultReader.from_spec), or condition types in gpufleet's
    own format. Of several faulted conditions, the one that needs most is the node's fault."""
    meta, spec, status = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
    lab = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    reader = FaultReader.of(conditions)
    types = reader.types
    ready, fault, healthy_check = False, None, False
    not_ready_since, ready_status, ready_message = None, "", ""
    reporters = None
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            ready, ready_status = c.get("status") == "True", str(c.get("status") or "")[:16]
            ready_message = str(c.get("message") or "")[:256]
            if not ready and c.get("lastTransitionTime"):
                # Since when (core/node_lost.py); without the time it stays unknown: never lost on a guess.
                try:
                    not_ready_since = parse_time(c["lastTransitionTime"])
                except ValueError:
                    not_ready_since = None
        elif c.get("type") in types:
            if c.get("type") in reader.own and c.get("status") == "True" and c.get("reason") == "HealthCheckPassed":
                healthy_check = True
            elif (f := reader.read(c, fault_since(c))) is not None and (
                    fault is None or f.needs.rank > fault.needs.rank):
                reporters = condition_reporters(meta.get("managedFields")) if reporters is None else reporters
                fault = replace(f, reporter=reporters.get(c.get("type"), ""))
    return NodeView(
        name=meta["name"],
        pool=lab.get(labels.NODE_POOL),
        role=lab.get(labels.ROLE, ""),
        ready=ready,
        not_ready_since=not_ready_since,
        ready_status=ready_status,
        ready_message=ready_message,
        unschedulable=bool(spec.get("unschedulable")),
        fault=fault,
        health_check_passed=healthy_check,
        remediation=ann.get(labels.REMEDIATION),
        taints=tuple(sorted(t.get("key", "") for t in spec.get("taints") or [])),
        signals=_signals(ann.get(labels.SIGNALS)),
        labels=tuple(sorted(lab.items())),
        provider_id=spec.get("providerID") or "",
        gpus=_int((status.get("capacity") or {}).get("nvidia.com/gpu")),
        created=meta.get("creationTimestamp") or "",
        fulfils=ann.get(labels.FULFILS),
        lent=lab.get(labels.LENT, ""),
        lent_since=_time(ann.get(labels.LENT_SINCE)),
        reclaiming=_time(ann.get(labels.RECLAIMING)),
        boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
        check=parse_check(ann.get(labels.HEALTH_CHECK)),
        repair_request=parse_request(ann.get(labels.REPAIR_REQUEST)),
        repair_result=parse_result(ann.get(labels.REPAIR_RESULT)),
        carried_drain=ann.get(labels.CARRIED_DRAIN, ""),
        person_holds=ann.get(labels.PERSON_HOLDS, ""),
        slurm_drain_paged=ann.get(labels.SLURM_DRAIN_PAGED, ""),
        topology=ann.get(labels.SLINKY_TOPOLOGY_SPEC, ""),
    )


def _time(value: str | None) -> datetime | None:
    try:
        return parse_time(value) if value else None
    except ValueError:
        return EPOCH  # unreadable: long ago (a reclaim with a broken stamp is forced, not stuck)


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def membership_dict(v: NodeView) -> dict[str, Any]:
    """The part of a node that pool membership and the settling of capacity requests read
    (`reconciler/core/membership.py`), rebuilt from the cached view instead of holding whole node objects."""
    return {"metadata": {"name": v.name, "labels": dict(v.labels), "creationTimestamp": v.created or None,
                         "annotations": {**({labels.FULFILS: v.fulfils} if v.fulfils else {}),
                                         **({labels.SLINKY_TOPOLOGY_SPEC: v.topology} if v.topology else {})}},
            "spec": {"providerID": v.provider_id, "taints": [{"key": k} for k in v.taints]},
            "status": {"capacity": {"nvidia.com/gpu": str(v.gpus)}}}


def _signals(value: str | None) -> tuple[datetime, ...]:
    try:
        return tuple(parse_time(v) for v in json.loads(value)) if value else ()
    except (ValueError, TypeError, AttributeError):
        return ()  # an unreadable annotation counts as no earlier signal


_POD_LABELS = (labels.SLINKY_POD_HOSTNAME, labels.POOL, labels.HEALTH_CHECK_NODE)


def nodeset_owner(meta: dict[str, Any]) -> str | None:
    """The NodeSet that controls this pod (its controller ownerReference, as slurm-operator 1.2.1 sets it:
    internal/controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod), or None."""
    for o in meta.get("ownerReferences") or []:
        if o.get("controller") is True:
            if o.get("kind") == labels.SLINKY_NODESET_KIND and o.get("apiVersion") == labels.SLINKY_NODESET_API_VERSION:
                return o.get("name") or None
            return None  # one controller at most (the API server refuses two)
    return None


def pod_view(pod: dict[str, Any], opt_out_label: str = labels.DEFAULT_OPT_OUT, *, slurm_namespace: str,
             nodesets: frozenset[str]) -> PodView:
    """The few fields of a pod the core reads; its other labels are dropped (the cache stays small).

    The pod-hostname label makes a pod a Slurm node's (slurm_names.py) only on a NodeSet pod: in the Slurm
    namespace, controlled by one of the NodeSets the spec declares (`nodesets`). Anyone may put the label on a
    pod of their own, which must then neither steer a drain to another Slurm node nor pass for a NodeSet pod
    (and so escape a reclaim). Elsewhere the label is dropped and the pod is like any other."""
    meta = pod.get("metadata", {})
    lab = meta.get("labels") or {}
    keep = {k: v for k, v in lab.items() if k in _POD_LABELS or k == opt_out_label}
    if meta.get("namespace", "") != slurm_namespace or nodeset_owner(meta) not in nodesets:
        keep.pop(labels.SLINKY_POD_HOSTNAME, None)
    unplaced = next((c.get("message") or "no node fits it" for c in (pod.get("status") or {}).get("conditions") or []
                     if c.get("type") == "PodScheduled" and c.get("status") == "False"
                     and c.get("reason") == "Unschedulable"), "")
    return PodView(
        namespace=meta.get("namespace", ""), name=meta["name"], node=(pod.get("spec") or {}).get("nodeName"),
        phase=(pod.get("status") or {}).get("phase", "Pending"), labels=tuple(sorted(keep.items())),
        owner_kinds=tuple(o.get("kind", "") for o in meta.get("ownerReferences") or []),
        mirror=labels.MIRROR_POD in (meta.get("annotations") or {}),
        deleting=bool(meta.get("deletionTimestamp")), uid=meta.get("uid") or "", unschedulable=unplaced[:500],
        deletion_grace=_int(meta["deletionGracePeriodSeconds"]) if meta.get("deletionTimestamp")
        and meta.get("deletionGracePeriodSeconds") is not None else None,
    )


def opted_out_views(pods: Iterable[PodView], label_key: str) -> tuple[str, ...]:
    """Pods that opt out of automatic replacement (label present and not 'false')."""
    return tuple(sorted(p.key for p in pods if (v := p.label(label_key)) is not None and v.lower() != "false"))


def borrower_views(pods: Iterable[PodView]) -> list[PodView]:
    """Pods a reclaim evicts from a lent node: all it would drain but the NodeSet pods (on a lent node
    nothing else tolerates the lending taint)."""
    return [p for p in evictable_views(pods) if p.label(labels.SLINKY_POD_HOSTNAME) is None]


def evictable_views(pods: Iterable[PodView]) -> list[PodView]:
    """Pods a drain must evict: not DaemonSet pods, not mirror pods, not already finished."""
    return [p for p in pods if "DaemonSet" not in p.owner_kinds and not p.mirror
            and p.phase not in ("Succeeded", "Failed")]
