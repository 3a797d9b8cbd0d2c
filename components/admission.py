"""Admission policies the stack ships: what the reconciler's and the agent's tokens may do beyond what
RBAC can say (RBAC names verbs on resources; it cannot say "this node only", "these fields only").

ValidatingAdmissionPolicy, admissionregistration.k8s.io/v1 (GA since Kubernetes 1.30; the API as
k8s.io/api v0.34 admissionregistration/v1 types.go defines it): CEL over `object`, `oldObject` and
`request` (the AdmissionRequest, whose `userInfo.extra` carries what the token says), one binding per
policy with `validationActions: [Deny]`. Each policy matches one identity by its username, so nothing
else in the cluster is judged by them, and fails closed (`failurePolicy: Fail`).

- `<ns>-reconciler-pods`: the reconciler creates only its capacity-request placeholders
  (reconciler/adapters/providers.py placeholder_pod): in its namespace, the placeholder image, no host
  namespace, volume, privilege or capability, non-root. So a stolen token starts no privileged pod of its
  own, even where the namespace's Pod Security level would let one in (the local environment's).
- `<ns>-reconciler-jobs`: the Jobs it creates are its health checks (reconciler/adapters/health_checks.py
  job_manifest), judged by their pod template, since the Job controller, not the reconciler, creates their
  pods: in its namespace, labelled with the node they check, one container of the health-check image
  (`healing.repair.health_check.image`, else the agent's), no host namespace, volume or ServiceAccount token,
  no privilege or capability, non-root with RuntimeDefault seccomp. So no Job starts a privileged pod for it
  either, whatever the namespace's level.
- `<ns>-reconciler-nodes`: on a node it may change its own marks (`gpufleet.io/` labels, annotations and
  taints), Slinky's cordon reason and topology annotation, the cordon itself, and add the pool's labels
  and taints that membership sets; the proven pool (`node-restriction.kubernetes.io/gpufleet-pool`) only
  where a node has none, never changed or removed (membership never relabels a node); in its status (the
  subresource it patches to mark a repaired node healthy) only the GPU condition; nothing else of a node.
- `<ns>-reconciler-pod-deletion`: it deletes (with any grace, force included) only borrowers (a pod of
  a borrower PriorityClass) and its own placeholders. Evictions go through PodDisruptionBudgets and
  are not limited here.
- `<agent ns>-agent-own-node`: the agent writes only the node its token is bound to (the user's extra
  `authentication.kubernetes.io/node-name`: k8s.io/apiserver pkg/authentication/serviceaccount/util.go
  NodeNameKey, which the API server puts in a token bound to a pod that runs on a node; feature
  ServiceAccountTokenPodNodeInfo, on by default since 1.30 and GA, locked on, since 1.32:
  k8s.io/kubernetes v1.34.4 pkg/features/kube_features.go), and there only its kernel-log cursor and
  its GPU condition. A token without a node name writes no node.
- `<agent ns>-agent-own-events`: the Events the agent creates (a fault that leaves its node in service:
  core/v1, in `default`; events.k8s.io/v1 is judged alike) are about the node its token is bound to
  (`involvedObject`, or `regarding`: kind Node, that name), since `gpufleet why` counts an Event on a
  node that names an Xid as that node's fault: root on node A cannot write node B's history. A token
  without a node name creates no Event.
- `<ns>-kubelet-membership`: a kubelet (any `system:node:` user) changes no `gpufleet.io/` label or taint and
  none of the pools' membership labels on a node that exists, its own included, so a compromised
  kubelet cannot enrol its node as a spare or a system node, nor shed the spare taint. What a node
  registers with (`--node-labels`) this policy cannot judge; that is why membership and the system mark
  are `node-restriction.kubernetes.io/` labels (fleetspec/labels.py NODE_POOL, SYSTEM_NODE), which
  NodeRestriction (on in kubeadm and managed clusters, and in the local API server) refuses a kubelet at
  registration too, and why the membership pass trusts no label a kubelet may set
  (reconciler/core/membership.py).
"""
from __future__ import annotations

import json
from typing import Iterable

import pulumi
import pulumi_kubernetes as k8s

from fleetspec import health_report, labels
from fleetspec.models import FleetSpec
from fleetspec.placement import nodeset_names

from .agent import agent_username
from .meta import metadata

API_VERSION = "admissionregistration.k8s.io/v1"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
OWN = f"{labels.GROUP}/"  # the prefix of gpufleet's own labels, annotations and taints
# Slinky's annotations the reconciler writes on a node: the cordon reason, and the Slurm topology membership
# sets for slurm-operator 1.2.1 (api/v1beta1/well_known.go AnnotationNodeTopologySpec).
SLINKY_NODE_ANNOTATIONS = (labels.SLINKY_CORDON_REASON, "topology.slinky.slurm.net/spec")


def _strings(values) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(json.dumps(v) for v in sorted(set(values))) + "]"


def _rule(resources: list[str], operations: list[str], group: str = "") -> dict:
    return {"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": resources}


def _policy(name: str, username: str, rules: list[dict], validations: list[dict],
            variables: list[dict] | None = None) -> dict:
    spec: dict = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": rules},
        "matchConditions": [{"name": "is-the-identity", "expression": f"request.userInfo.username == {json.dumps(username)}"}],
        "validations": [{"reason": "Forbidden", **v} for v in validations],
    }
    if variables:
        spec["variables"] = variables
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": spec}


def _changed_only(old: str, new: str, allowed: str) -> str:
    """CEL: between two string maps, only keys for which `allowed` (an expression of `k`) holds were
    added, changed or removed."""
    return (f"variables.{new}.all(k, ({allowed}) || (k in variables.{old} && variables.{old}[k] == variables.{new}[k]))"
            f" && variables.{old}.all(k, ({allowed}) || k in variables.{new})")


def _maps(prefix: str, path: str) -> list[dict]:
    return [{"name": f"old{prefix}", "expression": f"oldObject.metadata.?{path}.orValue({{}})"},
            {"name": f"new{prefix}", "expression": f"object.metadata.?{path}.orValue({{}})"}]


def reconciler_pods_policy(spec: FleetSpec, username: str) -> dict:
    dep = spec.healing.reconciler
    capacity = f"{labels.GROUP}/capacity-request"
    return _policy(f"{dep.namespace}-reconciler-pods", username, [_rule(["pods"], ["CREATE"])], [
        {"expression": f"request.namespace == {json.dumps(dep.namespace)}",
         "message": f"the reconciler creates pods only in {dep.namespace}"},
        {"expression": f"object.metadata.?labels[?{json.dumps(capacity)}].hasValue()",
         "message": f"the reconciler creates only capacity-request placeholders (label {capacity})"},
        {"expression": "!object.spec.?hostNetwork.orValue(false) && !object.spec.?hostPID.orValue(false) && "
                       "!object.spec.?hostIPC.orValue(false)",
         "message": "a placeholder shares no host namespace"},
        {"expression": "object.spec.?volumes.orValue([]).size() == 0 && "
                       "object.spec.?automountServiceAccountToken.orValue(true) == false",
         "message": "a placeholder mounts nothing, not even a ServiceAccount token"},
        {"expression": "object.spec.?initContainers.orValue([]).size() == 0 && "
                       "object.spec.?ephemeralContainers.orValue([]).size() == 0 && object.spec.containers.size() == 1",
         "message": "a placeholder has one container"},
        {"expression": f"object.spec.containers.all(c, c.image == {json.dumps(dep.placeholder_image)} && "
                       "!c.?securityContext.?privileged.orValue(false) && "
                       "c.?securityContext.?allowPrivilegeEscalation.orValue(true) == false && "
                       "c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && "
                       "c.?ports.orValue([]).size() == 0)",
         "message": f"a placeholder runs {dep.placeholder_image}, unprivileged, without capabilities or ports"},
        {"expression": "object.spec.?securityContext.?runAsNonRoot.orValue(false) == true",
         "message": "a placeholder runs as non-root"},
    ])


def reconciler_jobs_policy(spec: FleetSpec, username: str) -> dict:
    """The health-check Jobs (reconciler/adapters/health_checks.py job_manifest), judged by their pod template
    (the Job controller, not the reconciler, creates their pods): in its namespace, labelled with the node they
    check and placed by the scheduler on that node only if it is a pool's, the health-check image running the
    spec's check command, and as restricted as the placeholders but for the GPUs they ask for. So a stolen
    token runs nothing but the check, and only on GPU pool nodes."""
    dep = spec.healing.reconciler
    image = spec.healing.health_check_image()
    argv = spec.healing.repair.health_check.argv()
    pools = json.dumps(sorted(p.name for p in spec.pools))
    terms = "variables.pod.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution.?nodeSelectorTerms" \
        ".orValue([])"
    node = json.dumps(labels.HEALTH_CHECK_NODE)
    return _policy(f"{dep.namespace}-reconciler-jobs", username, [_rule(["jobs"], ["CREATE", "UPDATE"], "batch")], [
        {"expression": f"request.namespace == {json.dumps(dep.namespace)}",
         "message": f"the reconciler creates Jobs only in {dep.namespace}"},
        {"expression": f"object.metadata.?labels[?{node}].hasValue() && "
                       f"object.spec.template.?metadata.?labels[?{node}].hasValue()",
         "message": f"the reconciler creates only health-check Jobs (label {labels.HEALTH_CHECK_NODE} on the Job "
                    "and its pods)"},
        {"expression": "!variables.pod.?hostNetwork.orValue(false) && !variables.pod.?hostPID.orValue(false) && "
                       "!variables.pod.?hostIPC.orValue(false)",
         "message": "a health check shares no host namespace"},
        {"expression": "variables.pod.?volumes.orValue([]).size() == 0 && "
                       "variables.pod.?automountServiceAccountToken.orValue(true) == false",
         "message": "a health check mounts nothing, not even a ServiceAccount token"},
        {"expression": "variables.pod.?initContainers.orValue([]).size() == 0 && "
                       "variables.pod.?ephemeralContainers.orValue([]).size() == 0 && "
                       "variables.pod.containers.size() == 1",
         "message": "a health check has one container"},
        {"expression": f"variables.pod.containers.all(c, c.image == {json.dumps(image)} && "
                       "!c.?securityContext.?privileged.orValue(false) && "
                       "c.?securityContext.?allowPrivilegeEscalation.orValue(true) == false && "
                       "c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && "
                       "c.?securityContext.?runAsNonRoot.orValue(true) == true && "
                       "c.?securityContext.?runAsUser.orValue(1) != 0 && "
                       "c.?securityContext.?seccompProfile.?type.orValue('RuntimeDefault') == 'RuntimeDefault' && "
                       "c.?ports.orValue([]).size() == 0)",
         "message": f"a health check runs {image} (healing.repair.health_check.image, else the agent's image), "
                    "unprivileged, without capabilities or ports"},
        {"expression": "variables.pod.?securityContext.?runAsNonRoot.orValue(false) == true && "
                       "variables.pod.?securityContext.?runAsUser.orValue(1) != 0 && "
                       "variables.pod.?securityContext.?seccompProfile.?type.orValue('') == 'RuntimeDefault'",
         "message": "a health check runs as non-root with the RuntimeDefault seccomp profile"},
        {"expression": "variables.pod.?nodeName.orValue('') == '' && "
                       f"variables.pod.?nodeSelector[?{json.dumps(labels.NODE_POOL)}].orValue('') in {pools} && "
                       f"{terms}.size() > 0 && {terms}.all(t, t.?matchFields.orValue([]).exists(f, "
                       "f.key == 'metadata.name' && f.operator == 'In' && "
                       f"f.values == [object.metadata.?labels[?{node}].orValue('')]))",
         "message": f"a health check is placed by the scheduler (no nodeName) on the node its label "
                    f"{labels.HEALTH_CHECK_NODE} names (its affinity's matchFields metadata.name), a pool's node "
                    f"({labels.NODE_POOL} in its nodeSelector)"},
        {"expression": f"variables.pod.containers.all(c, c.?command.orValue([]) == {json.dumps(argv)} && "
                       "c.?args.orValue([]).size() == 0 && c.?envFrom.orValue([]).size() == 0 && "
                       f"c.?env.orValue([]).all(e, e.name == {json.dumps(health_report.EXPECTED_GPUS)}))",
         "message": "a health check runs the spec's check command (healing.repair.health_check) with no other "
                    f"argument, and no variable but {health_report.EXPECTED_GPUS}"},
    ], variables=[{"name": "pod", "expression": "object.spec.template.spec"}])


def pool_label_keys(spec: FleetSpec) -> set[str]:
    """Labels membership sets on a pool's nodes (fleetspec/placement.py node_labels) outside gpufleet's prefix,
    the proven pool (labels.NODE_POOL) among them."""
    keys = {labels.GPU_MODEL, labels.GPU_COUNT, labels.NODE_POOL}
    for p in spec.pools:
        keys |= set(p.labels)
    return {k for k in keys if not k.startswith(OWN)}


def pool_taint_keys(spec: FleetSpec) -> set[str]:
    return {t.key for p in spec.pools for t in p.taints if not t.key.startswith(OWN)}


STATUS_FIELDS = ("capacity", "allocatable", "addresses", "nodeInfo", "daemonEndpoints")
SUBRESOURCE = {"name": "subResource", "expression": "request.?subResource.orValue('')"}  # absent on the object itself
# the node a pod-bound token names (absent from other tokens): the agent's policies key on it
TOKEN_NODE = {"name": "tokenNode", "expression": f"request.userInfo.extra[?{json.dumps(NODE_NAME_KEY)}].orValue([])"}


def status_only_conditions(condition_types) -> str:
    """CEL: on a node's status subresource, only the conditions of `condition_types` change (not Ready, not the
    addresses the API server dials the kubelet at, not capacity). Needs the variable `subResource`."""
    types = _strings(condition_types)
    others = lambda o: f"{o}.status.?conditions.orValue([]).filter(c, !(c.type in {types}))"  # noqa: E731
    same = " && ".join(f"object.status.?{f} == oldObject.status.?{f}" for f in STATUS_FIELDS)
    return f"variables.subResource != 'status' || ({others('object')} == {others('oldObject')} && {same})"


def reconciler_nodes_policy(spec: FleetSpec, username: str) -> dict:
    dep = spec.healing.reconciler
    own = f"k.startsWith({json.dumps(OWN)})"
    pool_labels = _strings(pool_label_keys(spec) - {labels.NODE_POOL})
    pool_taints = _strings(pool_taint_keys(spec))
    # the proven pool is set once (membership adds it to a node without one and never relabels: core/membership.py)
    proven = f"(k == {json.dumps(labels.NODE_POOL)} && !(k in variables.oldLabels))"
    same = lambda f: f"object.spec.?{f} == oldObject.spec.?{f}"  # noqa: E731
    # a taint is the same when key, value and effect are (timeAdded is the API server's)
    taint_in = lambda t, where: (f"variables.{where}.exists(x, x.key == {t}.key && x.?value == {t}.?value && "  # noqa: E731
                                 f"x.effect == {t}.effect)")
    return _policy(f"{dep.namespace}-reconciler-nodes", username, [_rule(["nodes", "nodes/status"], ["UPDATE"])], [
        {"expression": _changed_only("oldLabels", "newLabels",
                                     f"{own} || (k in {pool_labels} && k in variables.newLabels) || {proven}"),
         "message": f"the reconciler changes only {OWN} labels, and adds the pool labels membership sets "
                    f"({labels.NODE_POOL} only to a node without one: it never changes or removes it)"},
        {"expression": _changed_only("oldAnnotations", "newAnnotations",
                                     f"{own} || k in {_strings(SLINKY_NODE_ANNOTATIONS)}"),
         "message": f"the reconciler changes only {OWN} annotations and Slinky's {', '.join(SLINKY_NODE_ANNOTATIONS)}"},
        {"expression": f"variables.oldTaints.filter(t, !t.key.startsWith({json.dumps(OWN)})).all(t, {taint_in('t', 'newTaints')})"
                       f" && variables.newTaints.filter(t, !t.key.startsWith({json.dumps(OWN)}))"
                       f".all(t, {taint_in('t', 'oldTaints')} || t.key in {pool_taints})",
         "message": f"the reconciler changes only {OWN} taints, and adds the pool's taints"},
        {"expression": " && ".join(same(f) for f in ("podCIDR", "podCIDRs", "providerID", "externalID", "configSource")),
         "message": "the reconciler changes no node spec field but the cordon and taints"},
        {"expression": "object.metadata.?ownerReferences == oldObject.metadata.?ownerReferences && "
                       "object.metadata.?finalizers == oldObject.metadata.?finalizers",
         "message": "the reconciler changes no owner or finalizer of a node"},
        {"expression": status_only_conditions(spec.healing.condition_types),
         "message": f"in a node's status the reconciler changes only the GPU condition "
                    f"({', '.join(spec.healing.condition_types)}) it sets back after a repair"},
    ], variables=[SUBRESOURCE, *_maps("Labels", "labels"), *_maps("Annotations", "annotations"),
                  {"name": "oldTaints", "expression": "oldObject.spec.?taints.orValue([])"},
                  {"name": "newTaints", "expression": "object.spec.?taints.orValue([])"}])


def nodeset_controlled(obj: str, nodesets: Iterable[str]) -> str:
    """CEL: `obj` has a controller ownerReference to one of these NodeSets, as slurm-operator 1.2.1 gives its pods
    (internal/controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod); what observe.pod_view reads."""
    return (f"{obj}.metadata.?ownerReferences.orValue([]).exists(o, o.?controller.orValue(false) && "
            f"o.kind == {json.dumps(labels.SLINKY_NODESET_KIND)} && "
            f"o.apiVersion == {json.dumps(labels.SLINKY_NODESET_API_VERSION)} && o.name in {_strings(nodesets)})")


def reconciler_pod_deletion_policy(spec: FleetSpec, username: str) -> dict:
    dep = spec.healing.reconciler
    capacity = f"{labels.GROUP}/capacity-request"
    borrowers = _strings(spec.borrower_classes())
    return _policy(f"{dep.namespace}-reconciler-pod-deletion", username, [_rule(["pods"], ["DELETE"])], [
        {"expression": f"(request.namespace == {json.dumps(dep.namespace)} && "
                       f"oldObject.metadata.?labels[?{json.dumps(capacity)}].hasValue()) || "
                       # a NodeSet pod a stale busy-pod PDB keeps at the drain timeout (decide.py end_eviction)
                       f"(request.namespace == {json.dumps(spec.slurm.namespace)} && "
                       f"oldObject.metadata.?labels[?{json.dumps(labels.SLINKY_POD_HOSTNAME)}].hasValue() && "
                       f"{nodeset_controlled('oldObject', nodeset_names(spec.pools))}) || "
                       f"oldObject.spec.?priorityClassName.orValue('') in {borrowers}",
         "messageExpression": "'the reconciler deletes only borrowers (PriorityClass " + ", ".join(
             sorted(spec.borrower_classes())) + "), its own capacity requests and the NodeSet pods in the Slurm "
                              "namespace, not ' + request.namespace + '/' + request.name"},
    ])


def agent_nodes_policy(spec: FleetSpec, username: str) -> dict:
    own = _strings({labels.KMSG_REPORTED, labels.REPAIR_RESULT, labels.GPU_CLIENTS_STOPPED})
    # a GPU reset stops the GPU Operator's operands by their deploy labels, and restores them (agent/gpu_clients.py)
    operands = _strings(labels.GPU_OPERATOR_DEPLOY)
    return _policy(f"{spec.healing.reconciler.agent_namespace}-agent-own-node", username,
                   [_rule(["nodes", "nodes/status"], ["UPDATE"])], [
        {"expression": "variables.tokenNode.size() == 1 && variables.tokenNode[0] == object.metadata.name",
         "messageExpression": "'the node agent writes only the node its token is bound to (' + "
                              "(variables.tokenNode.size() == 1 ? variables.tokenNode[0] : 'none: not a pod-bound "
                              "token') + '), not ' + object.metadata.name"},
        {"expression": "variables.subResource == 'status' || (object.?spec == oldObject.?spec && "
                       + _changed_only("oldLabels", "newLabels", f"k in {operands} && "
                                       "variables.newLabels[?k].orValue('false') in ['true', 'false']") + " && "
                       + _changed_only("oldAnnotations", "newAnnotations", f"k in {own}") + ")",
         "message": f"on its node the agent changes only its kernel-log cursor ({labels.KMSG_REPORTED}), the "
                    f"answer to a repair ({labels.REPAIR_RESULT}), what a GPU reset stopped "
                    f"({labels.GPU_CLIENTS_STOPPED}) and the GPU Operator's deploy labels (true or false) of the "
                    "operands a reset stops"},
        {"expression": status_only_conditions(spec.healing.condition_types),
         "message": f"in its node's status the agent changes only its condition ({', '.join(spec.healing.condition_types)})"},
    ], variables=[TOKEN_NODE,
                  SUBRESOURCE,
                  *_maps("Labels", "labels"),
                  *_maps("Annotations", "annotations")])


def agent_events_policy(spec: FleetSpec, username: str) -> dict:
    """The agent's Events (reconciler/adapters/kube.py node_event: core/v1, in `default`, about its node, for a
    fault that leaves the node in service) are about the node its token is bound to: `gpufleet why` reads an
    Event on a node that names an Xid as that node's fault (gpufleet/why_command.py node_faults), so root on
    node A must not write node B's history. events.k8s.io/v1 (the same objects; `regarding` for
    `involvedObject`) is judged alike, though the agent's role grants only the core group's."""
    return _policy(f"{spec.healing.reconciler.agent_namespace}-agent-own-events", username,
                   [_rule(["events"], ["CREATE", "UPDATE"]), _rule(["events"], ["CREATE", "UPDATE"], "events.k8s.io")], [
        {"expression": "variables.tokenNode.size() == 1 && variables.about.?kind.orValue('') == 'Node' && "
                       "variables.about.?name.orValue('') == variables.tokenNode[0]",
         "messageExpression": "'the node agent creates Events only about the node its token is bound to (' + "
                              "(variables.tokenNode.size() == 1 ? variables.tokenNode[0] : 'none: not a pod-bound "
                              "token') + '), not ' + variables.about.?kind.orValue('<no kind>') + ' ' + "
                              "variables.about.?name.orValue('<no name>')"},
        {"expression": "request.namespace == 'default'",
         "message": "the node agent's Events are in default, where Events about nodes live"},
    ], variables=[TOKEN_NODE,
                  {"name": "about",
                   "expression": "request.resource.group == 'events.k8s.io' ? object.?regarding.orValue({}) : "
                                 "object.?involvedObject.orValue({})"}])


KUBELET_PREFIX = "system:node:"  # a kubelet's username (k8s.io/apiserver pkg/authentication/user: NodeUserNamePrefix)


def kubelet_membership_policy(spec: FleetSpec) -> dict:
    membership = f"k.startsWith({json.dumps(OWN)}) || k in {_strings(pool_label_keys(spec))}"
    own_taint = f"t.key.startsWith({json.dumps(OWN)})"
    policy = _policy(f"{spec.healing.reconciler.namespace}-kubelet-membership", "", [
        _rule(["nodes", "nodes/status"], ["UPDATE"])], [
        {"expression": f"variables.newLabels.all(k, !({membership}) || "
                       "(k in variables.oldLabels && variables.oldLabels[k] == variables.newLabels[k])) && "
                       f"variables.oldLabels.all(k, !({membership}) || k in variables.newLabels)",
         "messageExpression": f"'a kubelet (' + request.userInfo.username + ') changes no {OWN} or pool membership "
                              "label of a node: the reconciler sets membership'"},
        {"expression": f"object.spec.?taints.orValue([]).filter(t, {own_taint}) == "
                       f"oldObject.spec.?taints.orValue([]).filter(t, {own_taint})",
         "message": f"a kubelet changes no {OWN} taint of a node"},
    ], variables=_maps("Labels", "labels"))
    policy["spec"]["matchConditions"] = [{
        "name": "is-a-kubelet",
        "expression": f"request.userInfo.username.startsWith({json.dumps(KUBELET_PREFIX)})"}]
    return policy


def policies(spec: FleetSpec, reconciler: str, agent: str) -> list[dict]:
    """Every policy, for the reconciler's and the agent's usernames, and the kubelets'."""
    return [reconciler_pods_policy(spec, reconciler), reconciler_nodes_policy(spec, reconciler),
            reconciler_pod_deletion_policy(spec, reconciler), reconciler_jobs_policy(spec, reconciler),
            agent_nodes_policy(spec, agent), agent_events_policy(spec, agent),
            kubelet_membership_policy(spec)]


def binding(policy: dict) -> dict:
    name = policy["metadata"]["name"]
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}}


def declare_admission(name: str, spec: FleetSpec, reconciler: str, parent: pulumi.Resource) -> list[pulumi.Resource]:
    """The policies and their bindings, children of `parent`."""
    out: list[pulumi.Resource] = []
    env = spec.environment
    for p in policies(spec, reconciler, agent_username(spec)):
        pname = p["metadata"]["name"]
        pol = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-vap-{pname}", metadata=metadata(pname, "admission", env), spec=p["spec"],
            opts=pulumi.ResourceOptions(parent=parent))
        b = binding(p)
        out += [pol, k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-vapb-{pname}", metadata=metadata(pname, "admission", env), spec=b["spec"],
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[pol]))]
    return out
