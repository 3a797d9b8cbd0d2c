"""What the Slinky operator and a real cluster need of the stack, checked before `pulumi up`:

- `slinky-resources-complete`: every LoginSet names its sssd.conf Secret (the operator refuses one
  without); every Accounting names its database host and password Secret; a Controller points
  at the Accounting when there is one. (Whether the login Service is internal: `load-balancers-internal`,
  policies/rules/network.py.)
- `reconciler-wiring`: the reconciler's pod template carries the config checksum (a policy change
  rolls it out); its ServiceAccount names an IAM role where the environment needs one (IRSA); with
  a RestApi declared, the reconciler reaches Slurm through it with the Token the stack declares.
"""
from __future__ import annotations

from typing import Any

from gpufleet.fleetspec import labels

from .base import Rule
from .healing import RECONCILER
from .k8s import UNKNOWN, Resource, as_dict, as_list, config, dig, report

COMPLETE = "slinky-resources-complete"
WIRING = "reconciler-wiring"
CHECKSUM = labels.CONFIG_CHECKSUM
IRSA = "eks.amazonaws.com/role-arn"

COMPLETE_SCHEMA: dict[str, dict] = {}
WIRING_SCHEMA: dict[str, dict] = {
    "requireIamRole": {"type": "boolean", "default": False,
                       "description": "The reconciler's ServiceAccount must name an IAM role (eks.amazonaws.com/role-arn)."},
}


def _resources(args: Any) -> list[Resource]:
    return Resource.all_of(args)


def _missing(value: Any) -> bool:
    return value is None or value == "" or value == {}


def check_complete(resources: list[Resource], cfg: dict[str, Any]) -> list[tuple[Resource, str]]:
    out = []
    slinky = [r for r in resources if r.is_slinky]
    accountings = [r for r in slinky if r.kind == "Accounting"]
    for r in slinky:
        spec = as_dict(r.props.get("spec"))
        if r.kind == "LoginSet":
            ref = spec.get("sssdConfRef")
            if ref is not UNKNOWN and (_missing(ref) or _missing(dig(ref, "key"))):
                out.append((r, f"{r.ref}: no spec.sssdConfRef; the operator needs the Secret holding sssd.conf. "
                               f"Fix: declare it through components.SlinkySlurm, which renders a minimal one."))
        if r.kind == "Accounting":
            sc = as_dict(spec.get("storageConfig"))
            if _missing(sc.get("host")) or _missing(dig(sc, "passwordKeyRef", "key")):
                out.append((r, f"{r.ref}: spec.storageConfig needs the database host and passwordKeyRef. Fix: "
                               f"declare slurm.accounting.database in the stack file."))
        if r.kind == "Controller":
            ref = spec.get("accountingRef")
            names = [a.name for a in accountings]
            if names and ref is not UNKNOWN and dig(ref, "name") not in names:
                out.append((r, f"{r.ref}: Accounting {names} is declared but spec.accountingRef does not name it; "
                               f"slurmctld would run without accounting."))
            if not names and not _missing(ref) and ref is not UNKNOWN:
                out.append((r, f"{r.ref}: spec.accountingRef names {dig(ref, 'name')!r}, which is not declared."))
    return out


def check_wiring(resources: list[Resource], cfg: dict[str, Any]) -> list[tuple[Resource, str]]:
    out = []
    deps = [r for r in resources if r.is_kind("Deployment") and r.name == RECONCILER]
    sas = [r for r in resources if r.is_kind("ServiceAccount") and r.name == RECONCILER]
    restapi = [r for r in resources if r.is_slinky and r.kind == "RestApi"]
    tokens = [r for r in resources if r.is_slinky and r.kind == "Token"]
    for d in deps:
        ann = as_dict(dig(d.props, "spec", "template", "metadata", "annotations"))
        if ann.get(CHECKSUM) is not UNKNOWN and not ann.get(CHECKSUM):
            out.append((d, f"{d.ref}: the pod template has no {CHECKSUM} annotation, so a policy or Secret change "
                           f"is never rolled out. Fix: declare it through components.Reconciler."))
        args = [a for c in as_list(dig(d.props, "spec", "template", "spec", "containers")) for a in
                as_list(as_dict(c).get("args"))]
        if restapi and "--slurm-url" not in args:
            out.append((d, f"{d.ref}: a RestApi is declared but the reconciler does not use it (no --slurm-url)."))
        if restapi and not tokens:
            out.append((d, f"{d.ref}: no Slinky Token for the reconciler's Slurm user: it cannot call slurmrestd."))
    if cfg["requireIamRole"]:
        for sa in sas:
            arn = as_dict(dig(sa.props, "metadata", "annotations")).get(IRSA)
            if arn is not UNKNOWN and not arn:
                out.append((sa, f"{sa.ref}: no {IRSA} annotation: the reconciler's Auto Scaling and SNS calls have "
                                f"no credentials in the cluster. Fix: set healing.reconciler.iam_role_arn."))
    return out


def _stack_validator(check, schema):
    def validate(args: Any, report_violation) -> None:
        for r, msg in check(_resources(args), config(args, schema)):
            report(report_violation, r, msg)
    return validate


COMPLETE_RULE = Rule(
    name=COMPLETE,
    description="Slinky resources carry what the operator needs: sssd.conf, the accounting database, accountingRef.",
    validate=_stack_validator(check_complete, COMPLETE_SCHEMA),
    scope="stack",
    config_schema=COMPLETE_SCHEMA,
    remediation="Declare the Slurm resources through components.SlinkySlurm and the database in slurm.accounting.",
)
WIRING_RULE = Rule(
    name=WIRING,
    description="The reconciler rolls out on a config change, reaches Slurm through the RestApi, and has its IAM role.",
    validate=_stack_validator(check_wiring, WIRING_SCHEMA),
    scope="stack",
    config_schema=WIRING_SCHEMA,
    remediation="Declare the reconciler through components.Reconciler; set healing.reconciler.iam_role_arn.",
)
