"""Opt-out labels: a workload may ask the reconciler not to replace its nodes, but only
with an allowed value, a reason and an expiry date; an expired opt-out fails, and (in prod)
a Slurm NodeSet never opts out as a whole.
"""
from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

from gpufleet.fleetspec import labels

from .base import Rule
from .k8s import UNKNOWN, Resource, config, pod_templates, report

NAME = "opt-out-labels"

SCHEMA: dict[str, dict] = {
    "label": {"type": "string", "default": labels.DEFAULT_OPT_OUT,
              "description": "The opt-out label key (the fleet's healing.opt_out_label)."},
    "allowedValues": {"type": "array", "items": {"type": "string"}, "default": ["true"],
                      "description": "Values the opt-out label may take."},
    "maxDays": {"type": "integer", "minimum": 1, "default": 90,
                "description": "An opt-out may expire at most this many days from today."},
    "forbidOnNodeSets": {"type": "boolean", "default": False,
                         "description": "Slinky NodeSets never carry the opt-out label (prod)."},
}


def today() -> date:  # tests replace this
    return date.today()


def _parse_day(value: str) -> date | None:
    try:
        return date.fromisoformat(value)
    except ValueError:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).date()
        except ValueError:
            return None


def check(r: Resource, cfg: dict[str, Any]) -> list[str]:
    key = cfg["label"]
    allowed = [str(v) for v in cfg["allowedValues"]]
    problems = []
    own = r.props.get("metadata") if isinstance(r.props.get("metadata"), dict) else {}
    if cfg["forbidOnNodeSets"] and r.is_slinky and r.kind == "NodeSet" and key in (own.get("labels") or {}):
        problems.append(
            f"{r.ref} carries the opt-out label {key} (metadata.labels): a whole Slurm NodeSet may not opt out "
            f"of auto-replacement in this environment. Fix: remove the label.")
    for t in pod_templates(r):
        labels_ = t.metadata.get("labels") if isinstance(t.metadata.get("labels"), dict) else {}
        if key not in labels_:
            continue
        where = f"{t.path}.metadata" if t.path else "metadata"
        ann = t.metadata.get("annotations") if isinstance(t.metadata.get("annotations"), dict) else {}
        value = labels_[key]
        if cfg["forbidOnNodeSets"] and r.is_slinky and r.kind == "NodeSet":
            problems.append(
                f"{r.ref} carries the opt-out label {key} on its pods ({where}.labels): a whole Slurm "
                f"NodeSet may not opt out of auto-replacement in this environment. Fix: remove the label; "
                f"opt out the individual job's pods instead, with a reason and an expiry.")
            continue
        if value is not UNKNOWN and str(value) not in allowed:
            problems.append(
                f"{r.ref}: opt-out label {key}={value!r} at {where}.labels is not an allowed value. "
                f"Fix: set it to one of {allowed}, or remove it.")
        reason = ann.get(labels.OPT_OUT_REASON)
        if reason is not UNKNOWN and not (isinstance(reason, str) and reason.strip()):
            problems.append(
                f"{r.ref}: opt-out label {key} at {where}.labels has no reason. Fix: add the annotation "
                f"{labels.OPT_OUT_REASON}: \"<why, and who to ask>\" at {where}.annotations.")
        expires = ann.get(labels.OPT_OUT_EXPIRES)
        if expires is UNKNOWN:
            continue
        if not (isinstance(expires, str) and expires.strip()):
            problems.append(
                f"{r.ref}: opt-out label {key} at {where}.labels has no expiry. Fix: add the annotation "
                f"{labels.OPT_OUT_EXPIRES}: \"YYYY-MM-DD\" (at most {int(cfg['maxDays'])} days ahead) at "
                f"{where}.annotations.")
            continue
        day = _parse_day(expires.strip())
        now = today()
        if day is None:
            problems.append(
                f"{r.ref}: {labels.OPT_OUT_EXPIRES}={expires!r} at {where}.annotations is not an ISO date. "
                f"Fix: write it as YYYY-MM-DD.")
        elif day < now:
            problems.append(
                f"{r.ref}: the opt-out from auto-replacement expired on {day.isoformat()} "
                f"({labels.OPT_OUT_EXPIRES} at {where}.annotations). Fix: remove the label {key}, or renew "
                f"the opt-out with a new expiry date and reason.")
        elif (day - now).days > int(cfg["maxDays"]):
            problems.append(
                f"{r.ref}: the opt-out expires on {day.isoformat()}, more than {int(cfg['maxDays'])} days "
                f"ahead. Fix: set {labels.OPT_OUT_EXPIRES} to {(now + timedelta(days=int(cfg['maxDays']))).isoformat()} "
                f"or earlier, and renew it when needed.")
    return problems


def validate(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not (pod_templates(r) or r.is_slinky):
        return
    for msg in check(r, config(args, SCHEMA)):
        report(report_violation, None, msg)


RULE = Rule(
    name=NAME,
    description="Workloads that opt out of node auto-replacement use an allowed value, a reason and an "
                "unexpired date; NodeSets never opt out where forbidden.",
    validate=validate,
    config_schema=SCHEMA,
    remediation=f"Annotate the pod template with {labels.OPT_OUT_REASON} and {labels.OPT_OUT_EXPIRES} "
                "(YYYY-MM-DD), or remove the opt-out label.",
)
