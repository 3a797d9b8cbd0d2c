"""Supply chain: images are pinned (a tag other than latest; a digest where required), and
every container says what it needs and may use (cpu and memory requests and limits).

Containers are those of pod templates and the Slinky components the operator turns into
containers (`spec.slurmctld`, `spec.slurmd`, `spec.login`...). Images the reconciler starts at run time
reach the cluster only in its policy (the ConfigMap `gpufleet-policy`, `data["fleet.json"]`): the
capacity-request placeholders' (`healing.reconciler.placeholder_image`) and the health checks'
(`healing.repair.health_check.image`; unset, the checks run the agent's image, judged on the agent's
DaemonSet), so they are judged there, by the same rules.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .base import Rule
from .healing import is_policy
from .k8s import UNKNOWN, Resource, as_dict, config, containers, dig, report

IMAGES = "images-pinned"
RESOURCES = "container-resources"

_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")

IMAGES_SCHEMA: dict[str, dict] = {
    "requireDigest": {"type": "boolean", "default": False,
                      "description": "Images must be pinned by digest (@sha256:...), not only by tag (prod)."},
    "digestExemptPrefixes": {"type": "array", "items": {"type": "string"}, "default": [],
                             "description": "Image prefixes allowed a tag instead of a digest (still not latest)."},
}

RESOURCES_SCHEMA: dict[str, dict] = {
    "exemptContainers": {
        "type": "array", "items": {"type": "string"}, "default": ["NodeSet/slurmd"],
        "description": "Kind/container exempt from cpu/memory requests and limits. Default: Slurm's slurmd, which "
                       "owns the whole GPU node; Slurm's cgroups confine each job, and a limit on slurmd would cap "
                       "every job on the node.",
    },
}


def parse_image(ref: str) -> tuple[str, str | None, str | None]:
    """'ghcr.io/x/y:1.0@sha256:..' -> ('ghcr.io/x/y', '1.0', 'sha256:..')"""
    name, _, digest = ref.partition("@")
    head, _, last = name.rpartition("/")
    repo, _, tag = last.partition(":")
    return (f"{head}/{repo}" if head else repo), (tag or None), (digest or None)


def check_image(ref: str, cfg: dict[str, Any]) -> str | None:
    """Why the image reference is not acceptable, or None."""
    repo, tag, digest = parse_image(ref)
    if digest is not None:
        if not _DIGEST.match(digest):
            return f"has a malformed digest {digest!r} (expected sha256: and 64 hex digits)"
        return None
    if tag is None:
        return "has no tag, so it means :latest and changes under you"
    if tag == "latest":
        return "uses the :latest tag, which changes under you"
    if cfg["requireDigest"] and not any(ref.startswith(p) for p in cfg["digestExemptPrefixes"]):
        return "is pinned by tag only; this environment requires a digest (a tag can be moved)"
    return None


def pinning_fix(image: str, cfg: dict[str, Any]) -> str:
    """What to set an unacceptable image to, for this environment's rule."""
    repo = parse_image(image)[0]
    return (f"{repo}@sha256:<digest> (e.g. from `crane digest {image}`)" if cfg["requireDigest"]
            else f"{repo}:<version> or @sha256:<digest>")


def check_images(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    for c in containers(r):
        image = c.body.get("image")
        if image is UNKNOWN:
            continue
        if not isinstance(image, str) or not image:
            out.append(f"{r.ref}: container {c.name} ({c.path}) has no image. Fix: set {c.path}.image.")
            continue
        why = check_image(image, cfg)
        if why:
            out.append(f"{r.ref}: container {c.name} image {image!r} {why}. Fix: set {c.path}.image to "
                       f"{pinning_fix(image, cfg)}; "
                       f"for gpufleet's own images that is healing.reconciler.image/agent_image in the stack file.")
    return out


# The images the reconciler starts at run time (fleetspec/models.py), by their place in the fleet spec: what
# each becomes, and where in the spec it lives.
RUNTIME_IMAGES = (
    ("healing.reconciler.placeholder_image", "capacity-request placeholder pods (reconciler/adapters/providers.py)"),
    ("healing.repair.health_check.image", "health-check Jobs (reconciler/adapters/health_checks.py)"),
)


def runtime_images(r: Resource) -> list[tuple[str, str, Any]]:
    """(field, what runs it, image) for each image the reconciler's policy names, when `r` is that policy. A
    missing field is the spec's default: the placeholder's is pinned by digest (fleetspec/models.py
    PAUSE_IMAGE), and the health checks' is then the agent's image, judged on the agent's DaemonSet. A policy
    that does not parse is healing-enabled's to report."""
    if not is_policy(r):
        return []
    doc = dig(r.props, "data", "fleet.json")
    try:
        fleet = json.loads(doc) if isinstance(doc, str) else None
    except ValueError:
        return []
    out = []
    for field, what in RUNTIME_IMAGES:
        image = dig(fleet, *field.split("."))
        if image is not None:
            out.append((field, what, image))
    return out


def check_runtime_images(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    for field, what, image in runtime_images(r):
        if not isinstance(image, str) or not image:
            out.append(f"{r.ref}: data[\"fleet.json\"] {field} is {image!r}, not an image. Fix: set {field} in the "
                       f"stack file to an image pinned by digest.")
            continue
        why = check_image(image, cfg)
        if why:
            out.append(f"{r.ref}: {field} image {image!r} {why}; the reconciler starts it at run time in its "
                       f"{what}, so no declared pod shows it. Fix: set {field} in the stack file to "
                       f"{pinning_fix(image, cfg)}.")
    return out


def validate_images(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not r.is_k8s:
        return
    cfg = config(args, IMAGES_SCHEMA)
    for msg in check_images(r, cfg) + check_runtime_images(r, cfg):
        report(report_violation, None, msg)


def check_resources(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    for c in containers(r):
        if f"{r.kind}/{c.name}" in cfg["exemptContainers"]:
            continue
        res = c.body.get("resources")
        if res is UNKNOWN:
            continue
        res = as_dict(res)
        missing = []
        for part in ("requests", "limits"):
            got = res.get(part)
            if got is UNKNOWN:
                continue
            got = as_dict(got)
            missing += [f"{part}.{k}" for k in ("cpu", "memory") if got.get(k) in (None, "")]
        if missing:
            out.append(f"{r.ref}: container {c.name} sets no {', '.join(missing)} ({c.path}.resources). Without "
                       f"requests the scheduler cannot place it, without limits it can starve the node. Fix: set "
                       f"resources.requests and resources.limits for cpu and memory (gpufleet.components.meta.resources()).")
    return out


def validate_resources(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not r.is_k8s:
        return
    for msg in check_resources(r, config(args, RESOURCES_SCHEMA)):
        report(report_violation, None, msg)


IMAGES_RULE = Rule(
    name=IMAGES,
    description="Container images are pinned: never :latest or untagged, and by digest where required.",
    validate=validate_images,
    config_schema=IMAGES_SCHEMA,
    remediation="Pin the image to a version tag or, in prod, a sha256 digest.",
)

RESOURCES_RULE = Rule(
    name=RESOURCES,
    description="Containers set cpu and memory requests and limits.",
    validate=validate_resources,
    config_schema=RESOURCES_SCHEMA,
    remediation="Set resources.requests and resources.limits for cpu and memory.",
)
