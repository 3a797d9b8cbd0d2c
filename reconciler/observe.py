"""Turn raw Kubernetes objects (dicts, as the API sends them) into the core's views. Pure."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Iterable

from fleetspec import labels

from .model import Fault, NodeView

_XID_IN_REASON = re.compile(r"(?i)xid[ _-]?(\d+)")


def parse_time(value: str | None) -> datetime:
    if not value:
        return datetime.now(timezone.utc)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def node_view(node: dict[str, Any], condition_types: Iterable[str]) -> NodeView:
    meta, spec, status = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
    lab = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    types = set(condition_types)
    ready, fault, healthy_check = False, None, False
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            ready = c.get("status") == "True"
        elif c.get("type") in types:
            if c.get("status") == "False":
                m = _XID_IN_REASON.search(c.get("reason", "")) or _XID_IN_REASON.search(c.get("message", ""))
                if m:
                    fault = Fault(int(m.group(1)), c.get("message", ""), parse_time(c.get("lastTransitionTime")))
            elif c.get("status") == "True" and c.get("reason") == "HealthCheckPassed":
                healthy_check = True
    return NodeView(
        name=meta["name"],
        pool=lab.get(labels.POOL),
        role=lab.get(labels.ROLE, ""),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        fault=fault,
        health_check_passed=healthy_check,
        remediation=ann.get(labels.REMEDIATION),
    )


def has_taint(node: dict[str, Any], key: str) -> bool:
    return any(t.get("key") == key for t in (node.get("spec", {}).get("taints") or []))


def opted_out(pods: Iterable[dict[str, Any]], label_key: str) -> tuple[str, ...]:
    """Pods that opt out of automatic replacement (label present and not 'false')."""
    out = []
    for p in pods:
        value = (p.get("metadata", {}).get("labels") or {}).get(label_key)
        if value is not None and value.lower() != "false":
            out.append(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}")
    return tuple(sorted(out))


def evictable(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods a drain must evict: not DaemonSet pods, not mirror pods, not already finished."""
    out = []
    for p in pods:
        meta = p.get("metadata", {})
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            continue
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(p)
    return out
