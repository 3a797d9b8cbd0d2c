"""gpufleet's policy pack, as Pulumi runs it: `pulumi preview --policy-pack policies
[--policy-pack-config policies/config/<env>.json]` (or `gpufleet preview --stack <env>`).

Every rule defaults to mandatory; each environment's config file sets its levels
(advisory for local, mandatory for prod) and its thresholds.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout first; gpufleet.policies via the editable install

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from gpufleet.policies.rules import PACK_NAME, build_policies  # noqa: E402

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=build_policies("mandatory"),
    description="Guard rails for self-healing GPU fleets: spares, healing, opt-outs, least privilege (RBAC, host "
                "access, capabilities), internal load balancers, pinned images, resource limits and safe lending.",
)
