"""Small helpers every component uses: standard labels and object metadata."""
from __future__ import annotations

from typing import Any

from fleetspec import labels


def metadata(name: str, component: str, instance: str, namespace: str | None = None,
             extra_labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {**labels.standard_labels(name, component, instance), **(extra_labels or {})},
    }
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = annotations
    return meta


def resources(cpu: str, memory: str, cpu_limit: str | None = None, memory_limit: str | None = None) -> dict[str, Any]:
    return {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu_limit or cpu, "memory": memory_limit or memory},
    }
