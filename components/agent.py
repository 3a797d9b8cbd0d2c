"""The node agent: a DaemonSet on the GPU nodes that reads the kernel log for NVRM Xid lines and sets
the GPU condition of its own node.

It runs in a namespace of its own, the only one of the stack at Pod Security level `privileged`, with
the least reading /dev/kmsg needs. What that is, measured on this project's machine (kernel 6.18):

- the kernel: with `kernel.dmesg_restrict=1` opening /dev/kmsg needs CAP_SYSLOG (CAP_SYS_ADMIN is not
  enough), with 0 any user may read it (the node is 0644 root:root);
- the container's device cgroup: runc admits only its default devices (null, zero, full, random,
  urandom, tty, ptmx, pts) to a container that is not privileged, so a hostPath mount of /dev/kmsg
  fails with EPERM whatever the capabilities; only `privileged`, or a device plugin that hands the
  device to the container (the runtime then adds it to the cgroup, read-only), gets past it.

So, with `healing.reconciler.agent_kmsg_device` (the extended resource a device plugin advertises for
/dev/kmsg): not privileged, every capability dropped but CAP_SYSLOG, no host path. Without: privileged,
because nothing else opens the device; /dev/kmsg is still mounted read-only (the agent never writes to
the kernel log) and nothing else of the host is. Both as uid 0: Kubernetes sets no ambient
capabilities, so a process of the image's own user (65532) holds none, privileged or not, and under
`dmesg_restrict=1` reads nothing (tests/e2e/test_reconciler_pods.py saw exactly that on a real node). Both: read-only root filesystem, no host namespaces,
seccomp RuntimeDefault; RBAC get/patch on nodes, patch on nodes/status and create on Events, confined
by admission (components/admission.py) to the node the pod's token names (Events: about that node).

With the repair loop on (`healing.repair.enabled`, issue 25) the agent also resets GPUs and reboots its
node when the reconciler asks (reconciler/agent/repairs.py), with the host's own tools through nsenter
into PID 1: that needs the host's PID namespace and privilege, so the pod is privileged with hostPID
whatever `agent_kmsg_device` says.
"""
from __future__ import annotations

import hashlib
import json

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec

from .meta import metadata, namespace_metadata, resources

AGENT = "gpufleet-agent"
KMSG = "/dev/kmsg"
POLICY_DIR = "/etc/gpufleet"
POLICY_CONFIG_MAP = "gpufleet-agent-policy"
CONFIG_CHECKSUM = labels.CONFIG_CHECKSUM


def agent_rules() -> list[dict]:
    return [
        # patch on nodes: the agent keeps its kernel-log cursor in an annotation on its node
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        # a fault that needs only the job restarted is an Event on the node, which stays in service (admission:
        # only about the node its token names, components/admission.py agent_events_policy)
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def agent_args() -> list[str]:
    """The agent reads the same policy as the reconciler (fleet.json, copied into its own namespace): its
    fault actions and the condition to write come from the spec, never from a copy of its own."""
    return ["agent", "--kmsg", KMSG, "--node", "$(NODE_NAME)", "--policy", f"{POLICY_DIR}/fleet.json"]


def agent_checksum(spec: FleetSpec) -> str:
    """sha256 over what the agent reads of the policy: on the agent's pod template, a change of the
    fault actions or the condition rolls the DaemonSet (a mounted ConfigMap changes under a running
    process, which read it at start), and nothing else does."""
    part = {"faults": spec.healing.faults.model_dump(mode="json"), "condition": spec.healing.condition_types[0]}
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()


def agent_repairs(spec: FleetSpec) -> bool:
    """Whether the agent carries out the resets and reboots asked of its node (reconciler/agent/repairs.py):
    a reset is always asked of the node, and so is a reboot on every provider but aws-asg (EC2 reboots)."""
    return spec.healing.repair.enabled


def agent_username(spec: FleetSpec) -> str:
    """The agent's identity as the API server names it (its ServiceAccount)."""
    return f"system:serviceaccount:{spec.healing.reconciler.agent_namespace}:{AGENT}"


def agent_pod_spec(spec: FleetSpec, service_account: str = AGENT) -> dict:
    """The agent's pod spec: on every node of a pool, with the least /dev/kmsg needs (see the module doc)."""
    dep = spec.healing.reconciler
    repairs = agent_repairs(spec)
    container: dict = {
        "name": "agent",
        "image": dep.agent_image,
        "args": agent_args() + (["--repairs"] if repairs else []),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": resources("20m", "32Mi", "200m", "128Mi"),
    }
    pod: dict = {
        "serviceAccountName": service_account,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": labels.NODE_POOL, "operator": "Exists"}]}]}}},
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "policy", "configMap": {"name": POLICY_CONFIG_MAP}}],
    }
    container["volumeMounts"] = [{"name": "policy", "mountPath": POLICY_DIR, "readOnly": True}]
    if repairs:
        # issue 25: the agent resets GPUs and reboots its node with the host's own tools (nsenter into the
        # host's PID 1: reconciler/agent/repairs.py), which needs the host's PID namespace and privilege.
        pod["hostPID"] = True
    if dep.agent_kmsg_device and not repairs:
        # The device plugin puts /dev/kmsg in the container (and its cgroup); CAP_SYSLOG opens it under
        # dmesg_restrict=1, and a non-root user would not hold it.
        limit = {dep.agent_kmsg_device: "1"}
        container["resources"] = {"requests": {**container["resources"]["requests"], **limit},
                                  "limits": {**container["resources"]["limits"], **limit}}
        container["securityContext"] = {
            "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsUser": 0, "runAsNonRoot": False, "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]}}
    else:
        # uid 0 as well: the image runs as 65532, and a non-root process holds none of a privileged container's
        # capabilities, so under dmesg_restrict=1 it could not open /dev/kmsg (found on a real node here).
        container["securityContext"] = {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0,
                                        "runAsNonRoot": False, **({"runAsGroup": 0} if repairs else {})}
        container["volumeMounts"].append({"name": "kmsg", "mountPath": KMSG, "readOnly": True})
        pod["volumes"].append({"name": "kmsg", "hostPath": {"path": KMSG, "type": "CharDevice"}})
    return pod


def declare_agent(name: str, spec: FleetSpec, parent: pulumi.Resource) -> k8s.apps.v1.DaemonSet:
    """The agent's namespace, identity, RBAC and DaemonSet, as children of `parent` (the Reconciler component:
    their Pulumi names are those the stack has always given them, so an existing stack updates them in place)."""
    env, namespace = spec.environment, spec.healing.reconciler.agent_namespace
    ns = k8s.core.v1.Namespace(f"{name}-agent-ns", metadata=namespace_metadata(namespace, "agent", env, "privileged"),
                               opts=pulumi.ResourceOptions(parent=parent))
    # The namespace by name (known in a preview, so the policy pack sees where the agent runs), after it.
    child = pulumi.ResourceOptions(parent=parent, depends_on=[ns])
    sa = k8s.core.v1.ServiceAccount(f"{name}-agent-sa", metadata=metadata(AGENT, "agent", env, namespace), opts=child)
    # The policy as the reconciler reads it, in the agent's namespace (a pod mounts only its own namespace's).
    policy = k8s.core.v1.ConfigMap(f"{name}-agent-policy", metadata=metadata(POLICY_CONFIG_MAP, "agent", env, namespace),
                                   data={"fleet.json": spec.model_dump_json(indent=2)}, opts=child)
    role = k8s.rbac.v1.ClusterRole(f"{name}-agent-clusterrole", metadata=metadata(AGENT, "agent", env),
                                   rules=agent_rules(), opts=child)
    k8s.rbac.v1.ClusterRoleBinding(
        f"{name}-agent-clusterrolebinding", metadata=metadata(AGENT, "agent", env),
        role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.metadata.name},
        subjects=[{"kind": "ServiceAccount", "name": sa.metadata.name, "namespace": namespace}], opts=child)
    selector = {labels.APP_NAME: AGENT, labels.APP_INSTANCE: env}
    return k8s.apps.v1.DaemonSet(
        f"{name}-agent",
        metadata=metadata(AGENT, "agent", env, namespace),
        spec={"selector": {"matchLabels": selector},
              "template": {"metadata": {"labels": metadata(AGENT, "agent", env)["labels"],
                                        "annotations": {CONFIG_CHECKSUM: agent_checksum(spec)}},
                           "spec": agent_pod_spec(spec, AGENT)}},
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[ns, sa, policy],
                                    custom_timeouts=pulumi.CustomTimeouts(create="2m", update="2m")),
    )
