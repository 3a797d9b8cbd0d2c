"""Least privilege, judged by what a resource is, never by its name:

- `rbac-least-privilege`: roles list their verbs, resources and groups (no "*", no aggregation), grant no
  verb that lifts the holder above its own rights (`escalate`, `bind`, `impersonate`, and `create` on
  `serviceaccounts/token` or any `*/token`, which mints another identity's token), no `nodes/proxy` (the
  kubelets' API), no write to admission policies or webhooks; nothing is bound to cluster-admin.
- `pod-host-access`: a pod shares no host namespace; a privileged pod runs only in a namespace set aside
  for it (the node agent's), with no host namespace but the host's PIDs (a privileged container is root on
  the node already; the agent's repairs enter the host's PID 1 to reset a GPU or reboot), and only the
  allowed host paths, read-only; a host path is mounted only there, read-only. Any DaemonSet named `gpufleet-agent` got all of that before.
- `capabilities-allowed`: a container adds only capabilities on an allow-list (globally, or for one
  namespace: CAP_SYSLOG for the node agent's).
"""
from __future__ import annotations

from typing import Any

from .base import Rule
from .k8s import UNKNOWN, Resource, as_dict, as_list, config, containers, pod_specs, pod_templates, report

RBAC = "rbac-least-privilege"
HOST_ACCESS = "pod-host-access"
CAPABILITIES = "capabilities-allowed"

RBAC_SCHEMA: dict[str, dict] = {
    "forbiddenRoles": {"type": "array", "items": {"type": "string"}, "default": ["cluster-admin"],
                       "description": "ClusterRoles no binding may grant."},
}

HOST_ACCESS_SCHEMA: dict[str, dict] = {
    "privilegedNamespaces": {"type": "array", "items": {"type": "string"}, "default": ["gpufleet-agent"],
                             "description": "Namespaces set aside for privileged pods (Pod Security level privileged)."},
    "allowedHostPaths": {"type": "array", "items": {"type": "string"}, "default": ["/dev/kmsg"],
                         "description": "Host paths a pod in those namespaces may mount, read-only."},
    "hostNetworkWorkloads": {"type": "array", "items": {"type": "string"}, "default": [],
                             "description": "namespace/Kind/name of workloads allowed the host's network (the local "
                                            "environment's reconciler: it has no pod network)."},
}

CAPABILITIES_SCHEMA: dict[str, dict] = {
    "allowedCapabilities": {"type": "array", "items": {"type": "string"}, "default": ["NET_BIND_SERVICE"],
                            "description": "Capabilities any container may add (Pod Security restricted allows only "
                                           "NET_BIND_SERVICE)."},
    "namespaceCapabilities": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}},
                              "default": {"gpufleet-agent": ["SYSLOG"]},
                              "description": "Capabilities a container may add in one namespace (namespace -> list)."},
}

ROLE_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")
RBAC_GROUP = "rbac.authorization.k8s.io/"
# Verbs that let a holder act above its own rights (kubernetes.io/docs/concepts/security/rbac-good-practices:
# "escalate", "bind", "impersonate"; creating serviceaccounts/token mints any ServiceAccount's token).
ESCALATING_VERBS = {"escalate": "grants roles it does not hold itself",
                    "bind": "binds roles it does not hold itself",
                    "impersonate": "acts as another user, group or ServiceAccount"}


# Admission's own configuration: who writes it can switch off or rewrite every policy that confines the stack's
# identities (components/admission.py), and a webhook sees (or changes) every object it matches.
ADMISSION_GROUP = "admissionregistration.k8s.io"
ADMISSION_RESOURCES = {"validatingadmissionpolicies", "validatingadmissionpolicybindings",
                       "mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
                       "validatingwebhookconfigurations", "mutatingwebhookconfigurations"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# nodes/proxy reaches the kubelet's API with the API server's own credentials: exec and run in any pod of the
# node (kubernetes.io/docs/concepts/security/rbac-good-practices, "Access to proxy subresource of Nodes").
NODE_PROXY = "nodes/proxy"


def check_rbac(r: Resource, cfg: dict[str, Any]) -> list[str]:
    out = []
    if r.kind in ROLE_KINDS:
        for i, rule in enumerate(as_list(r.props.get("rules"))):
            rule = as_dict(rule)
            for field in ("verbs", "resources", "apiGroups"):
                values = as_list(rule.get(field))
                # RBAC matches "*" and, in resources, "*/<sub>" and "<resource>/*" (k8s.io/component-helpers
                # auth/rbac ResourceMatches): "*/token" is every token subresource
                if any(isinstance(v, str) and "*" in v for v in values):
                    out.append(f"{r.ref}: rules[{i}].{field} contains a wildcard ({values}). A wildcard grants today's "
                               f"and tomorrow's {field} alike. Fix: list the {field} the component uses, by name.")
            if "*" in as_list(rule.get("nonResourceURLs")):
                out.append(f"{r.ref}: rules[{i}].nonResourceURLs contains \"*\". Fix: list the URLs by path.")
            verbs = {str(v).lower() for v in as_list(rule.get("verbs"))}
            for verb, why in ESCALATING_VERBS.items():
                if verb in verbs:
                    out.append(f"{r.ref}: rules[{i}] grants {verb!r}: its holder {why}, so the role is worth every "
                               f"role in the cluster. Fix: remove {verb!r}; grant the permissions themselves.")
            resources = [str(x) for x in as_list(rule.get("resources"))]
            tokens = [x for x in resources if x.endswith("/token")]
            if "create" in verbs and tokens:
                out.append(f"{r.ref}: rules[{i}] grants create on {', '.join(tokens)}: its holder mints a token "
                           f"for any ServiceAccount in reach and acts as it. Fix: mount the token the pod needs "
                           f"(a projected volume) instead.")
            if NODE_PROXY in resources and verbs:
                out.append(f"{r.ref}: rules[{i}] grants {sorted(verbs)} on {NODE_PROXY}: its holder talks to the "
                           f"kubelets' API, which runs commands in any pod of the node. Fix: read what you need "
                           f"through the API server's own resources (nodes, pods/log).")
            groups = {str(g) for g in as_list(rule.get("apiGroups"))}
            admission = sorted(ADMISSION_RESOURCES & set(resources))
            if ADMISSION_GROUP in groups and admission and verbs & WRITE_VERBS:
                out.append(f"{r.ref}: rules[{i}] grants {sorted(verbs & WRITE_VERBS)} on {', '.join(admission)}: its "
                           f"holder rewrites or removes the admission policies that confine every identity. Fix: "
                           f"only the deploying identity writes admission configuration; grant get/list/watch.")
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


def _read_only_mounts(spec: dict, volume: str) -> bool:
    """Every container of the pod that mounts `volume` mounts it read-only."""
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in as_list(spec.get(field)):
            for m in as_list(as_dict(c).get("volumeMounts")):
                m = as_dict(m)
                if m.get("name") == volume and m.get("readOnly") is not True:
                    return False
    return True


def _all_privileged(spec: dict) -> bool:
    """Every container of the pod is privileged (root on the node already: the host's PIDs add nothing)."""
    cs = [as_dict(c) for f in ("initContainers", "containers") for c in as_list(spec.get(f))]
    return bool(cs) and all(as_dict(c.get("securityContext")).get("privileged") is True for c in cs)


def check_host_access(r: Resource, cfg: dict[str, Any]) -> list[str]:
    ns = r.namespace
    set_aside = ns in cfg["privilegedNamespaces"]
    paths = list(cfg["allowedHostPaths"])
    out = []
    for path, spec in pod_specs(r):
        host_ns = [h for h in ("hostNetwork", "hostPID", "hostIPC") if spec.get(h) is True
                   and not (h == "hostPID" and set_aside and _all_privileged(spec))]
        if host_ns and f"{ns}/{r.kind}/{r.name}" not in cfg["hostNetworkWorkloads"]:
            out.append(f"{r.ref}: {path}.{'/'.join(host_ns)} is true: the pod shares the node's namespaces (its "
                       f"network, processes or IPC), whatever it is called. Fix: remove {', '.join(host_ns)}.")
        for i, v in enumerate(as_list(spec.get("volumes"))):
            v = as_dict(v)
            hp = as_dict(v.get("hostPath"))
            if not hp or hp.get("path") is UNKNOWN:
                continue
            where = f"volume {v.get('name')} ({path}.volumes[{i}]) mounts the host path {hp.get('path')}"
            if not set_aside:
                out.append(f"{r.ref}: {where} in namespace {ns or '(unknown)'}, which is not set aside for host "
                           f"access ({cfg['privilegedNamespaces']}). Fix: use a PersistentVolumeClaim or a ConfigMap.")
            elif hp.get("path") not in paths:
                out.append(f"{r.ref}: {where}; only {paths} may be. Fix: remove the volume.")
            elif not _read_only_mounts(spec, v.get("name")):
                out.append(f"{r.ref}: {where} writable. Fix: mount it with readOnly: true.")
    for c in containers(r):
        if as_dict(c.body.get("securityContext")).get("privileged") is not True:
            continue
        if not set_aside:
            out.append(f"{r.ref}: container {c.name} ({c.path}.securityContext.privileged) runs privileged, root on "
                       f"the node, in namespace {ns or '(unknown)'}: only a namespace set aside for it "
                       f"({cfg['privilegedNamespaces']}) may hold one. Fix: remove `privileged: true`; add the one "
                       f"capability the process needs.")
    return out


def validate_host_access(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not (r.is_k8s and pod_templates(r)):
        return
    for msg in check_host_access(r, config(args, HOST_ACCESS_SCHEMA)):
        report(report_violation, None, msg)


def _capability(name: Any) -> str:
    return str(name).upper().removeprefix("CAP_")


def check_capabilities(r: Resource, cfg: dict[str, Any]) -> list[str]:
    allowed = {_capability(c) for c in cfg["allowedCapabilities"]}
    allowed |= {_capability(c) for c in as_list(as_dict(cfg["namespaceCapabilities"]).get(r.namespace))}
    out = []
    for c in containers(r):
        added = as_list(as_dict(as_dict(c.body.get("securityContext")).get("capabilities")).get("add"))
        extra = [str(x) for x in added if x is not UNKNOWN and _capability(x) not in allowed]
        if extra:
            out.append(f"{r.ref}: container {c.name} adds capabilities {extra} ({c.path}.securityContext."
                       f"capabilities.add); allowed in namespace {r.namespace or '(unknown)'}: {sorted(allowed)}. "
                       f"Fix: drop them, or allow the one the process needs for this namespace "
                       f"(namespaceCapabilities in the policy config).")
    return out


def validate_capabilities(args: Any, report_violation) -> None:
    r = Resource.of(args)
    if not r.is_k8s:
        return
    for msg in check_capabilities(r, config(args, CAPABILITIES_SCHEMA)):
        report(report_violation, None, msg)


RBAC_RULE = Rule(
    name=RBAC,
    description="Roles name their verbs, resources and API groups (no \"*\"), grant no escalate, bind, impersonate, "
                "token minting, nodes/proxy or write to admission configuration; nothing is bound to cluster-admin.",
    validate=validate_rbac,
    config_schema=RBAC_SCHEMA,
    remediation="List the verbs, resources and API groups the component uses; never escalate, bind or impersonate.",
)

HOST_ACCESS_RULE = Rule(
    name=HOST_ACCESS,
    description="No pod shares a host namespace; privileged pods and host paths (read-only, allowed paths) only in "
                "namespaces set aside for them.",
    validate=validate_host_access,
    config_schema=HOST_ACCESS_SCHEMA,
    remediation="Remove privileged/host settings from the workload, or move it to a namespace set aside for them.",
)

CAPABILITIES_RULE = Rule(
    name=CAPABILITIES,
    description="Containers add only allowed capabilities (globally, or per namespace).",
    validate=validate_capabilities,
    config_schema=CAPABILITIES_SCHEMA,
    remediation="Drop added capabilities outside the allow-list.",
)
