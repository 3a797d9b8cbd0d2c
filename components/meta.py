"""Small helpers every component uses: standard labels and object metadata."""
from __future__ import annotations

from typing import Any

from gpufleet.fleetspec import labels


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


# Pod Security admission (kubernetes.io/docs/concepts/security/pod-security-admission): the level a
# namespace enforces, pinned to the policy version of the Kubernetes release the stack targets, so an
# upgrade never tightens or loosens it unseen. `warn` and `audit` follow the strictest level, so a
# namespace enforcing less still says what would not pass `restricted`.
POD_SECURITY = "pod-security.kubernetes.io"
POD_SECURITY_VERSION = "v1.34"


def pod_security_labels(enforce: str) -> dict[str, str]:
    return {f"{POD_SECURITY}/enforce": enforce, f"{POD_SECURITY}/enforce-version": POD_SECURITY_VERSION,
            f"{POD_SECURITY}/warn": "restricted", f"{POD_SECURITY}/warn-version": POD_SECURITY_VERSION,
            f"{POD_SECURITY}/audit": "restricted", f"{POD_SECURITY}/audit-version": POD_SECURITY_VERSION}


def namespace_metadata(name: str, component: str, instance: str, enforce: str) -> dict[str, Any]:
    """A namespace's metadata with the Pod Security level it enforces."""
    return metadata(name, component, instance, extra_labels=pod_security_labels(enforce))
