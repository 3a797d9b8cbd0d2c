"""`load-balancers-internal`: a Service of type LoadBalancer (the login nodes' SSH Service inside a Slinky
LoginSet included) is internal for whichever controller serves it, unless the environment's config names
it as internet-facing on purpose.

Which annotations say "internal" depends on the controller (fleetspec/models.py scheme_annotations): a
Service without a loadBalancerClass may be served by the in-tree cloud controller, which reads only
`aws-load-balancer-internal` and ignores `aws-load-balancer-scheme` (the annotation the AWS Load Balancer
Controller reads): with only the latter, the in-tree controller opens port 22 to the internet. A
Service with a class is served by that class's controller alone. Some annotation being there is not
enough; the rule checks each one the controller reads.
"""
from __future__ import annotations

from typing import Any

from gpufleet.fleetspec.models import LB_INTERNAL, LB_SCHEME

from .base import Rule
from .k8s import UNKNOWN, Resource, as_dict, config, dig, report

LB = "load-balancers-internal"

LB_SCHEMA: dict[str, dict] = {
    "internalAnnotations": {
        "type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "string"}},
        "default": {"": {LB_SCHEME: "internal", LB_INTERNAL: "true"}, "service.k8s.aws/nlb": {LB_SCHEME: "internal"}},
        "description": "loadBalancerClass (\"\": none) -> the annotations, with their values, that make a Service "
                       "internal for the controller serving that class."},
    "internetFacing": {"type": "array", "items": {"type": "string"}, "default": [],
                       "description": "namespace/Kind/name of load balancers meant to face the internet."},
}


def _services(r: Resource) -> list[tuple[str, dict]]:
    """(path, Service-shaped body: metadata + spec) of a Service or a LoginSet's spec.service."""
    if r.is_kind("Service") and r.group_version == "core/v1":
        return [("", {"metadata": as_dict(r.props.get("metadata")), "spec": as_dict(r.props.get("spec"))})]
    if r.is_slinky and r.kind == "LoginSet":
        svc = as_dict(dig(r.props, "spec", "service"))
        return [("spec.service.", {"metadata": as_dict(svc.get("metadata")), "spec": as_dict(svc.get("spec"))})]
    return []


def check_load_balancer(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    for path, svc in _services(r):
        if svc["spec"].get("type") != "LoadBalancer" or f"{r.namespace}/{r.kind}/{r.name}" in cfg["internetFacing"]:
            continue
        cls = svc["spec"].get("loadBalancerClass")
        if cls is UNKNOWN:
            continue
        want = as_dict(cfg["internalAnnotations"]).get(cls or "")
        if want is None:
            out.append(f"{r.ref}: {path}spec.loadBalancerClass {cls!r} is a controller the pack does not know how to "
                       f"make internal. Fix: add its internal annotations to internalAnnotations in the policy config.")
            continue
        have = as_dict(svc["metadata"].get("annotations"))
        wrong = {k: have.get(k) for k, v in as_dict(want).items() if have.get(k) != v}
        if wrong:
            by = f"class {cls}" if cls else "no loadBalancerClass (the in-tree cloud controller may serve it)"
            out.append(f"{r.ref}: a LoadBalancer with {by} is internal only with {as_dict(want)}; it has {wrong}: "
                       f"it may face the internet. Fix: set slurm.login.load_balancer_scheme: internal (and "
                       f"load_balancer_class) in the stack file, or name it in internetFacing if it is meant to.")
    return out


def validate_load_balancer(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not r.is_k8s:
        return
    for msg in check_load_balancer(r, config(args, LB_SCHEMA)):
        report(report_violation, None, msg)


LB_RULE = Rule(
    name=LB,
    description="LoadBalancer Services (the login SSH Service included) are internal for the controller serving them.",
    validate=validate_load_balancer,
    config_schema=LB_SCHEMA,
    remediation="Set the annotations that make the load balancer internal, or list it as internet-facing.",
)
