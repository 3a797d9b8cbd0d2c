"""Reading Kubernetes resources as the policy engine hands them over.

The engine gives a resource's inputs camelCased, wrapped in read-only proxies (Mappings and
Sequences, not dicts and lists) that raise on values not known during a preview. `plain()`
turns that into ordinary data with unknown values replaced by `UNKNOWN`, so a rule reads a
whole resource without stumbling on one output it does not care about.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterator

try:  # the sentinels the engine uses for values unknown during a preview
    from pulumi_policy.proxy import (
        UNKNOWN_ARCHIVE_VALUE, UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_BOOLEAN_VALUE,
        UNKNOWN_NUMBER_VALUE, UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE, UnknownValueError,
    )
    _SENTINELS = {UNKNOWN_ARCHIVE_VALUE, UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_BOOLEAN_VALUE,
                  UNKNOWN_NUMBER_VALUE, UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE}
except ImportError:  # pragma: no cover - the pack always has pulumi_policy
    _SENTINELS = set()

    class UnknownValueError(Exception):  # type: ignore[no-redef]
        pass


class _Unknown:
    """A value the engine cannot know yet (an output of a resource not created)."""

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:
        return False


UNKNOWN = _Unknown()

K8S_PREFIX = "kubernetes:"
SLINKY_GROUP = "slinky.slurm.net"

# Workload kinds whose pod template sits at spec.template (CronJob: spec.jobTemplate.spec.template).
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"}


def plain(value: Any) -> Any:
    """Proxies and unknowns out: dicts, lists, scalars and UNKNOWN."""
    if isinstance(value, str):
        return UNKNOWN if value in _SENTINELS else value
    if isinstance(value, Mapping):
        out = {}
        for k in list(value):
            try:
                out[k] = plain(value[k])
            except UnknownValueError:
                out[k] = UNKNOWN
        return out
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = []
        for i in range(len(value)):
            try:
                items.append(plain(value[i]))
            except UnknownValueError:
                items.append(UNKNOWN)
        return items
    return value


def dig(obj: Any, *path: str | int, default: Any = None) -> Any:
    """obj[path[0]][path[1]]... or `default` when a step is missing or not a container."""
    for p in path:
        if isinstance(p, int):
            if not isinstance(obj, list) or p >= len(obj):
                return default
        elif not isinstance(obj, dict) or p not in obj:
            return default
        obj = obj[p]
    return obj


def as_dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> list:
    return v if isinstance(v, list) else []


@dataclass
class Resource:
    """One resource as the rules see it: its Pulumi type, Kubernetes kind and plain props."""

    resource_type: str
    props: dict
    urn: str = ""
    pulumi_name: str = ""

    @classmethod
    def of(cls, args: Any) -> "Resource":
        return cls(args.resource_type, plain(args.props) or {}, getattr(args, "urn", "") or "",
                   getattr(args, "name", "") or "")

    @classmethod
    def all_of(cls, args: Any) -> list["Resource"]:
        """Every resource of a stack-scoped policy's arguments."""
        return [cls.of(r) for r in args.resources]

    @property
    def is_k8s(self) -> bool:
        return self.resource_type.startswith(K8S_PREFIX) and not self.resource_type.startswith("pulumi:")

    @property
    def group_version(self) -> str:
        """`apps/v1`, `core/v1`, `slinky.slurm.net/v1beta1`."""
        parts = self.resource_type.split(":")
        return parts[1] if len(parts) == 3 else ""

    @property
    def kind(self) -> str:
        return self.resource_type.rsplit(":", 1)[-1]

    @property
    def is_slinky(self) -> bool:
        return self.group_version.startswith(SLINKY_GROUP + "/")

    @property
    def name(self) -> str:
        n = dig(self.props, "metadata", "name")
        return n if isinstance(n, str) and n else self.pulumi_name

    @property
    def namespace(self) -> str:
        ns = dig(self.props, "metadata", "namespace")
        return ns if isinstance(ns, str) else ""

    @property
    def ref(self) -> str:
        """How a message names the resource: `Deployment gpufleet-system/gpufleet-reconciler`."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where!s} ({self.resource_type})"

    def is_kind(self, *kinds: str) -> bool:
        return self.is_k8s and self.kind in kinds


@dataclass
class PodTemplate:
    """A pod template inside a workload: where it is, its metadata and its pod spec."""

    path: str                 # e.g. "spec.template"
    metadata: dict
    spec: dict


def pod_templates(r: Resource) -> list[PodTemplate]:
    """Every pod template a resource carries: workloads, CronJobs, bare Pods, Slinky NodeSets/LoginSets."""
    p = r.props
    if not r.is_k8s:
        return []
    if r.kind == "Pod" and r.group_version == "core/v1":
        return [PodTemplate("", as_dict(p.get("metadata")), as_dict(p.get("spec")))]
    if r.kind == "CronJob":
        t = dig(p, "spec", "jobTemplate", "spec", "template")
        return [PodTemplate("spec.jobTemplate.spec.template", as_dict(dig(t, "metadata")), as_dict(dig(t, "spec")))] \
            if isinstance(t, dict) else []
    if r.kind in POD_TEMPLATE_KINDS or r.is_slinky:
        t = dig(p, "spec", "template")
        if isinstance(t, dict):
            return [PodTemplate("spec.template", as_dict(t.get("metadata")), as_dict(t.get("spec")))]
    return []


@dataclass
class Container:
    """A container (or a Slinky component that becomes one): its path, name and body."""

    path: str
    name: str
    body: dict


def containers(r: Resource) -> list[Container]:
    """Containers of every pod template, plus Slinky components (`spec.slurmd`, `spec.slurmctld`...),
    which the operator turns into containers: any mapping directly under `spec` with an `image`."""
    out: list[Container] = []
    for t in pod_templates(r):
        for field in ("initContainers", "containers", "ephemeralContainers"):
            for i, c in enumerate(as_list(t.spec.get(field))):
                if isinstance(c, dict):
                    base = f"{t.path}.spec" if t.path else "spec"
                    out.append(Container(f"{base}.{field}[{i}]", str(c.get("name") or f"#{i}"), c))
    if r.is_slinky:
        for key, body in as_dict(r.props.get("spec")).items():
            if isinstance(body, dict) and "image" in body:
                out.append(Container(f"spec.{key}", key, body))
    return out


def pod_specs(r: Resource) -> Iterator[tuple[str, dict]]:
    for t in pod_templates(r):
        yield (f"{t.path}.spec" if t.path else "spec"), t.spec


def config(args: Any, schema: dict[str, dict]) -> dict[str, Any]:
    """The policy's config with the schema's defaults filled in (the engine may or may not)."""
    got = dict(plain(args.get_config() or {}) or {})
    got.pop("enforcementLevel", None)
    return {**{k: v["default"] for k, v in schema.items() if "default" in v}, **got}


Report = Callable[..., None]


def report(report_violation: Report, r: Resource | None, message: str) -> None:
    """Report with the resource's URN when there is one (stack policies point at a resource)."""
    if r is not None and r.urn:
        report_violation(message, r.urn)
    else:
        report_violation(message)
