"""Least privilege: RBAC without wildcards or cluster-admin, and no privileged pods but the
node agent, which mounts nothing from the host but the kernel log.
"""
from __future__ import annotations

from typing import Any

from .base import Rule
from .k8s import UNKNOWN, Resource, as_dict, as_list, config, containers, pod_specs, report

RBAC = "rbac-least-privilege"
PRIVILEGED = "privileged-only-node-agent"

RBAC_SCHEMA: dict[str, dict] = {
    "forbiddenRoles": {"type": "array", "items": {"type": "string"}, "default": ["cluster-admin"],
                       "description": "ClusterRoles no binding may grant."},
}

PRIVILEGED_SCHEMA: dict[str, dict] = {
    "allowedWorkloads": {"type": "array", "items": {"type": "string"}, "default": ["DaemonSet/gpufleet-agent"],
                         "description": "Kind/name of the only workloads that may run privileged or mount host paths."},
    "allowedHostPaths": {"type": "array", "items": {"type": "string"}, "default": ["/dev/kmsg"],
                         "description": "Host paths those workloads may mount."},
}

ROLE_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")
RBAC_GROUP = "rbac.authorization.k8s.io/"


def check_rbac(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    if r.kind in ROLE_KINDS:
        for i, rule in enumerate(as_list(r.props.get("rules"))):
            rule = as_dict(rule)
            for field in ("verbs", "resources", "apiGroups"):
                values = as_list(rule.get(field))
                if "*" in values:
                    out.append(f"{r.ref}: rules[{i}].{field} contains \"*\" ({values}). A wildcard grants today's "
                               f"and tomorrow's {field} alike. Fix: list the {field} the component uses, by name.")
            if "*" in as_list(rule.get("nonResourceURLs")):
                out.append(f"{r.ref}: rules[{i}].nonResourceURLs contains \"*\". Fix: list the URLs by path.")
        if as_dict(r.props.get("aggregationRule")):
            out.append(f"{r.ref} aggregates other roles (aggregationRule): its permissions grow with every role "
                       f"that matches. Fix: list its rules explicitly.")
    if r.kind in BINDING_KINDS:
        ref = as_dict(r.props.get("roleRef"))
        name = ref.get("name")
        if isinstance(name, str) and name in cfg["forbiddenRoles"]:
            out.append(f"{r.ref} binds {ref.get('kind', 'ClusterRole')} {name}: full control of the cluster. Fix: "
                       f"bind a Role/ClusterRole listing only the verbs and resources the subject needs "
                       f"(see components/reconciler.py cluster_rules()).")
    return out


def validate_rbac(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not (r.is_k8s and r.group_version.startswith(RBAC_GROUP) and r.kind in ROLE_KINDS + BINDING_KINDS):
        return
    for msg in check_rbac(r, config(args, RBAC_SCHEMA)):
        report(report_violation, None, msg)


def check_privileged(r: Resource, cfg: dict[str, Any]) -> list[str]:
    allowed = f"{r.kind}/{r.name}" in cfg["allowedWorkloads"]
    paths = list(cfg["allowedHostPaths"])
    out = []
    for c in containers(r):
        sc = as_dict(c.body.get("securityContext"))
        if sc.get("privileged") is True and not allowed:
            out.append(f"{r.ref}: container {c.name} ({c.path}.securityContext.privileged) runs privileged: root "
                       f"on the node. Fix: remove `privileged: true`; only {', '.join(cfg['allowedWorkloads'])} "
                       f"may run privileged.")
        caps = [x for x in as_list(as_dict(sc.get("capabilities")).get("add")) if x in ("SYS_ADMIN", "ALL")]
        if caps and not allowed:
            out.append(f"{r.ref}: container {c.name} adds capabilities {caps} ({c.path}.securityContext). "
                       f"Fix: drop them; add only the narrow capability the process needs.")
    for path, spec in pod_specs(r):
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(host) is True and not allowed:
                out.append(f"{r.ref}: {path}.{host} is true: the pod shares the node's namespaces. Fix: remove "
                           f"{host}.")
        for i, v in enumerate(as_list(spec.get("volumes"))):
            hp = as_dict(as_dict(v).get("hostPath"))
            if not hp:
                continue
            hpath = hp.get("path")
            if hpath is UNKNOWN:
                continue
            if not allowed:
                out.append(f"{r.ref}: volume {as_dict(v).get('name')} ({path}.volumes[{i}]) mounts the host path "
                           f"{hpath}. Fix: use a PersistentVolumeClaim or a ConfigMap; only "
                           f"{', '.join(cfg['allowedWorkloads'])} may mount host paths.")
            elif hpath not in paths:
                out.append(f"{r.ref}: volume {as_dict(v).get('name')} ({path}.volumes[{i}]) mounts the host path "
                           f"{hpath}; the node agent may mount only {paths}. Fix: remove the volume.")
    return out


def validate_privileged(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not r.is_k8s:
        return
    for msg in check_privileged(r, config(args, PRIVILEGED_SCHEMA)):
        report(report_violation, None, msg)


RBAC_RULE = Rule(
    name=RBAC,
    description="Roles name their verbs, resources and API groups (no \"*\"); nothing is bound to cluster-admin.",
    validate=validate_rbac,
    config_schema=RBAC_SCHEMA,
    remediation="List the verbs, resources and API groups the component uses.",
)

PRIVILEGED_RULE = Rule(
    name=PRIVILEGED,
    description="Only the node agent runs privileged, and it mounts only /dev/kmsg from the host.",
    validate=validate_privileged,
    config_schema=PRIVILEGED_SCHEMA,
    remediation="Remove privileged/host settings from the workload.",
)
