"""Healing on: the policy the reconciler reads is sane, and a stack with GPU pools deploys
the reconciler (and its node agent) at all.

The policy is the ConfigMap `gpufleet-policy`, `data["fleet.json"]` = the whole FleetSpec.
"""
from __future__ import annotations

import json
from typing import Any

from .base import Rule
from .k8s import UNKNOWN, Resource, config, dig, report
from .spares import is_pool_capacity

HEALING = "healing-enabled"
DEPLOYED = "reconciler-deployed"
POLICY_CONFIGMAP = "gpufleet-policy"
RECONCILER = "gpufleet-reconciler"
AGENT = "gpufleet-agent"

HEALING_SCHEMA: dict[str, dict] = {
    "requireEnabled": {"type": "boolean", "default": False,
                       "description": "healing.enabled must be true and healing.dry_run false (prod)."},
    "minGracePeriodSeconds": {"type": "integer", "minimum": 0, "default": 30},
    "maxGracePeriodSeconds": {"type": "integer", "minimum": 0, "default": 600},
    "maxUnhealthyFraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1,
                             "description": "healing.max_unhealthy_fraction must be set and at most this."},
}

DEPLOYED_SCHEMA: dict[str, dict] = {
    "requireAgent": {"type": "boolean", "default": True,
                     "description": f"Also require the node agent DaemonSet {AGENT} (it reports GPU faults)."},
}


def is_policy(r: Resource) -> bool:
    return r.is_kind("ConfigMap") and r.group_version == "core/v1" and r.name == POLICY_CONFIGMAP


def check_policy(r: Resource, cfg: dict[str, Any]) -> list[str]:
    doc = dig(r.props, "data", "fleet.json")
    if doc is UNKNOWN:
        return []
    try:
        fleet = json.loads(doc) if isinstance(doc, str) else None
    except ValueError:
        fleet = None
    healing = fleet.get("healing") if isinstance(fleet, dict) else None
    if not isinstance(healing, dict):
        return [f"{r.ref}: data[\"fleet.json\"] is missing or has no `healing` section. Fix: deploy the policy "
                f"through components.Reconciler, which renders the whole fleet spec here."]
    where = "gpufleet:fleet.healing"
    out = []
    if cfg["requireEnabled"]:
        if healing.get("enabled") is not True:
            out.append(f"{r.ref}: healing is disabled (healing.enabled: {json.dumps(healing.get('enabled'))}); failed GPU "
                       f"nodes would stay in the pool. Fix: set `enabled: true` in {where}.")
        if healing.get("dry_run") is True:
            out.append(f"{r.ref}: healing runs in dry-run mode (healing.dry_run: true): it decides but never "
                       f"acts. Fix: set `dry_run: false` in {where}.")
    grace = healing.get("grace_period_seconds")
    lo, hi = int(cfg["minGracePeriodSeconds"]), int(cfg["maxGracePeriodSeconds"])
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not lo <= grace <= hi:
        out.append(f"{r.ref}: healing.grace_period_seconds is {grace!r}, outside {lo}..{hi} s: too short and a job "
                   f"cannot checkpoint, too long and a broken node holds the job. Fix: set "
                   f"`grace_period_seconds` between {lo} and {hi} in {where}.")
    frac = healing.get("max_unhealthy_fraction")
    cap = float(cfg["maxUnhealthyFraction"])
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac <= cap:
        out.append(f"{r.ref}: healing.max_unhealthy_fraction is {frac!r}; it must be set, above 0 and at most "
                   f"{cap:g}, so a fleet-wide failure (bad driver push, power event) stops the reconciler "
                   f"instead of draining every node. Fix: set `max_unhealthy_fraction` (e.g. 0.1) in {where}.")
    return out


def validate_policy(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not is_policy(r):
        return
    for msg in check_policy(r, config(args, HEALING_SCHEMA)):
        report(report_violation, None, msg)


def check_stack(resources: list[Resource], cfg: dict[str, Any]) -> list[tuple[Resource | None, str]]:
    pools = [r for r in resources if is_pool_capacity(r)]
    if not pools:
        return []
    names = ", ".join(sorted(r.name for r in pools))
    out: list[tuple[Resource | None, str]] = []
    deps = [r for r in resources if r.is_kind("Deployment") and r.name == RECONCILER]
    if not deps:
        out.append((None, f"the stack declares GPU pools ({names}) but no Deployment {RECONCILER}: nothing would "
                          f"drain, requeue or replace a failed node. Fix: deploy components.Reconciler in the "
                          f"same stack (components.GpuFleet does)."))
    for d in deps:
        replicas = dig(d.props, "spec", "replicas", default=1)
        if isinstance(replicas, (int, float)) and not isinstance(replicas, bool) and replicas < 1:
            out.append((d, f"{d.ref} runs {replicas:g} replicas: healing is off. Fix: set "
                           f"healing.reconciler.replicas to 1 or more (2 for leader election failover)."))
    if cfg["requireAgent"] and not any(r.is_kind("DaemonSet") and r.name == AGENT for r in resources):
        out.append((None, f"the stack declares GPU pools ({names}) but no DaemonSet {AGENT}: no node would report "
                          f"a GPU fault (Xid) for the reconciler to act on. Fix: deploy components.Reconciler, "
                          f"which declares the agent."))
    if not any(is_policy(r) for r in resources):
        out.append((None, f"the stack declares GPU pools ({names}) but no ConfigMap {POLICY_CONFIGMAP}: the "
                          f"reconciler has no policy to read. Fix: deploy components.Reconciler."))
    return out


def validate_stack(args: Any, report_violation) -> None:
    for res, msg in check_stack(Resource.all_of(args), config(args, DEPLOYED_SCHEMA)):
        report(report_violation, res, msg)


HEALING_RULE = Rule(
    name=HEALING,
    description="The healing policy is on, gives jobs 30-600 s to checkpoint, and caps the unhealthy fraction.",
    validate=validate_policy,
    config_schema=HEALING_SCHEMA,
    remediation="Fix gpufleet:fleet.healing in the stack file.",
)

DEPLOYED_RULE = Rule(
    name=DEPLOYED,
    description="A stack with GPU pools deploys the reconciler (and its node agent and policy).",
    validate=validate_stack,
    scope="stack",
    config_schema=DEPLOYED_SCHEMA,
    remediation="Declare the fleet with components.GpuFleet, which deploys the reconciler.",
)
