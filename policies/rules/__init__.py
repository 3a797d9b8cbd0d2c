"""The rules of gpufleet's policy pack, importable without the engine (tests call them directly)."""
from __future__ import annotations

from .base import Rule
from .healing import DEPLOYED_RULE, HEALING_RULE
from .lending import RULE as LENDING_RULE
from .opt_out import RULE as OPT_OUT_RULE
from .network import LB_RULE
from .privilege import CAPABILITIES_RULE, HOST_ACCESS_RULE, RBAC_RULE
from .slinky import COMPLETE_RULE as SLINKY_RULE, WIRING_RULE
from .spares import MEMBERSHIP_RULE, RULE as SPARES_RULE
from .supply_chain import IMAGES_RULE, RESOURCES_RULE

PACK_NAME = "gpufleet"

RULES: list[Rule] = [
    OPT_OUT_RULE, SPARES_RULE, HEALING_RULE, DEPLOYED_RULE, RBAC_RULE, HOST_ACCESS_RULE, CAPABILITIES_RULE,
    IMAGES_RULE, RESOURCES_RULE, SLINKY_RULE, WIRING_RULE, MEMBERSHIP_RULE, LENDING_RULE, LB_RULE,
]
BY_NAME = {r.name: r for r in RULES}


def build_policies(default_level: str = "mandatory") -> list:
    """pulumi_policy Policy objects for every rule (cheap; only PolicyPack() starts a server)."""
    from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, ResourceValidationPolicy,
                               StackValidationPolicy)

    level = EnforcementLevel(default_level)
    out = []
    for rule in RULES:
        cls = StackValidationPolicy if rule.scope == "stack" else ResourceValidationPolicy
        out.append(cls(
            name=rule.name,
            description=rule.description,
            validate=rule.validate,
            enforcement_level=level,
            config_schema=PolicyConfigSchema(properties=rule.config_schema) if rule.config_schema else None,
            remediation_steps=rule.remediation or None,
        ))
    return out


__all__ = ["PACK_NAME", "RULES", "BY_NAME", "Rule", "build_policies"]
