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
  no privilege or capability, non-root with RuntimeDefault seccomp; the spec's command and nothing else that
  runs one (no lifecycle hook, no probe), its pool's GPUs and no other resource, only the labels job_manifest
  gives (no other pod's NetworkPolicy selects it), no priority class, scheduler or runtime class of its own.
  So no Job starts a privileged pod for it either, whatever the namespace's level, nor runs anything but the check.
- `<ns>-reconciler-nodes`: it writes only a declared pool's nodes (the proven pool on them) and the nodes
  membership enrols, by the evidence membership enrols them by that no kubelet can write (a kubernetes-spares
  pool's `node-restriction.kubernetes.io/` member labels; for an aws-asg pool, whose evidence is EC2's word that
  admission cannot ask, an AWS instance), never a node marked system or control-plane. There it may change its own marks (`gpufleet.io/` labels, annotations and
  taints), Slinky's cordon reason and topology annotation, the cordon itself, and add the pool's labels
  and taints that membership sets (the pool's taints with the spec's value and effect; its own taints
  only NoSchedule: a NoExecute taint evicts past PodDisruptionBudgets); the proven pool (`node-restriction.kubernetes.io/gpufleet-pool`) only
  where a node has none, never changed or removed (membership never relabels a node); in its status (the
  subresource it patches to mark a repaired node healthy) only the GPU condition; nothing else of a node.
- `<ns>-reconciler-pod-deletion`: it deletes (with any grace, force included) only borrowers (a pod of
  a borrower PriorityClass) and its own placeholders. Evictions go through PodDisruptionBudgets and
  are not limited here.
- `<ns>-reconciler-token-nudge`: on its Slinky Token (RBAC: `patch` on that one Token, components/slinky.py
  token_reader_rules) it changes one annotation, its stale-token condition (fleetspec/labels.py TOKEN_NUDGE),
  and nothing else: not the spec (the user, lifetime or key a token is minted with), labels, other
  annotations (slurm-operator copies a Token's labels and annotations onto its Secret:
  internal/builder/common/token_secret.go), finalizers or owners. The change is what makes the operator
  reconcile the Token again (reconciler/core/slurm_token.py).
- `<agent ns>-agent-own-node`: the agent writes only the node its token is bound to (the user's extra
  `authentication.kubernetes.io/node-name`: k8s.io/apiserver pkg/authentication/serviceaccount/util.go
  NodeNameKey, which the API server puts in a token bound to a pod that runs on a node; feature
  ServiceAccountTokenPodNodeInfo, on by default since 1.30 and GA, locked on, since 1.32:
  k8s.io/kubernetes v1.34.4 pkg/features/kube_features.go), and there only its kernel-log cursor and
  its GPU condition. A token without a node name writes no node. The metadata rules hold on `nodes/status`
  too: that subresource's strategy resets only the spec, and stores the labels, annotations, finalizers
  and owners the request carries (kubernetes v1.34.4 pkg/registry/core/node/strategy.go
  nodeStatusStrategy.PrepareForUpdate: `newNode.Spec = oldNode.Spec`, and Status.Config when unused;
  GetResetFields names only `spec`), and validating admission judges the object after that strategy ran
  (k8s.io/apiserver pkg/registry/generic/registry/store.go Update: BeforeUpdate, then the update
  validation). So no rule of these policies may skip metadata on the status subresource.
- `<agent ns>-agent-own-events`: the Events the agent creates (a fault that leaves its node in service:
  core/v1, in `default`; events.k8s.io/v1 is judged alike) are about the node its token is bound to
  (`involvedObject`, or `regarding`: kind Node, that name), since `gpufleet why` counts an Event on a
  node that names an Xid as that node's fault: root on node A cannot write node B's history. A token
  without a node name creates no Event.
- `<ns>-kubelet-events`: a kubelet's Events about a node are about its own (NodeRestriction has no case for
  Events), so node A's kubelet does not write node B's history either.
- `<ns>-kubelet-membership`: a kubelet (any `system:node:` user) changes no `gpufleet.io/` label, annotation or taint and
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

from gpufleet.fleetspec import health_report, labels
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.placement import nodeset_names

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
    pool_gpus = "{" + ", ".join(f"{json.dumps(p.name)}: {json.dumps(str(p.gpus_per_node))}"
                               for p in sorted(spec.pools, key=lambda p: p.name)) + "}"
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
        # what else runs a command in the container, or runs it elsewhere or first: a lifecycle hook (postStart's
        # exec runs any shell in the image), a probe's exec, a working directory (core/v1 Container)
        {"expression": "variables.pod.containers.all(c, !c.?lifecycle.hasValue() && !c.?livenessProbe.hasValue() && "
                       "!c.?readinessProbe.hasValue() && !c.?startupProbe.hasValue() && !c.?workingDir.hasValue() && "
                       "c.?volumeMounts.orValue([]).size() == 0 && c.?volumeDevices.orValue([]).size() == 0)",
         "message": "a health check runs its command and nothing else: no lifecycle hook, no probe, no working "
                    "directory, no mount"},
        # the GPUs its pool's node has, no more and nothing else (no memory or CPU to starve the node's other
        # pods of, no claim, no pod-level resources)
        {"expression": f"variables.pod.containers.all(c, {_gpus_exactly('c.?resources.?requests')} && "
                       f"{_gpus_exactly('c.?resources.?limits')} && c.?resources.?claims.orValue([]).size() == 0) && "
                       "!variables.pod.?resources.hasValue() && variables.pod.?resourceClaims.orValue([]).size() == 0 && "
                       "!variables.pod.?overhead.hasValue()",
         "message": f"a health check asks for its pool's GPUs ({GPU_RESOURCE}: the pool's gpus_per_node, as request and "
                    "limit) and nothing else"},
        # its pods' labels are the ones job_manifest sets, so no NetworkPolicy that selects another of the
        # reconciler's namespace's pods (the reconciler's own egress: components/network.py) selects them
        {"expression": f"variables.podLabels.all(k, k in {_strings([labels.HEALTH_CHECK_NODE, labels.POOL, labels.APP_PART_OF])}"
                       f" || (k in {_strings(JOB_NAME_LABELS)} && variables.podLabels[k] == object.metadata.name) || "
                       f"(k in {_strings(JOB_UID_LABELS)} && variables.podLabels[k] == object.metadata.?uid.orValue('')))"
                       f" && variables.podLabels[?{node}] == "
                       f"object.metadata.?labels[?{node}] && "
                       f"variables.podLabels[?{json.dumps(labels.POOL)}].orValue('') == variables.pool && "
                       f"variables.podLabels[?{json.dumps(labels.APP_PART_OF)}].orValue('') == {json.dumps(labels.PART_OF)} && "
                       "object.spec.template.?metadata.?annotations.orValue({}).size() == 0",
         "message": f"a health check's pods carry only the labels the reconciler gives them ({labels.HEALTH_CHECK_NODE}, "
                    f"{labels.POOL} of its pool, {labels.APP_PART_OF}) and the API server's job-name and controller-uid "
                    "of the Job itself, so no NetworkPolicy of another pod selects them, and no annotation"},
        # how and by whom it is scheduled and run: the default scheduler, no priority of its own (a priority
        # class would preempt the tenants' pods), the default runtime, no sysctl
        {"expression": "!variables.pod.?priorityClassName.hasValue() && !variables.pod.?priority.hasValue() && "
                       "!variables.pod.?preemptionPolicy.hasValue() && "
                       "variables.pod.?schedulerName.orValue('default-scheduler') == 'default-scheduler' && "
                       "!variables.pod.?runtimeClassName.hasValue() && "
                       "variables.pod.?securityContext.?sysctls.orValue([]).size() == 0 && "
                       "variables.pod.?hostAliases.orValue([]).size() == 0 && "
                       "!variables.pod.?shareProcessNamespace.orValue(false) && "
                       "variables.pod.?serviceAccountName.orValue('default') == 'default'",
         "message": "a health check has no priority class, scheduler, runtime class, sysctl, host alias or "
                    "ServiceAccount of its own"},
        # what Pod Security `baseline` refuses besides, for the namespace the local environment runs privileged
        {"expression": "variables.pod.containers.all(c, c.?securityContext.?procMount.orValue('Default') == 'Default' && "
                       "c.?securityContext.?appArmorProfile.?type.orValue('RuntimeDefault') != 'Unconfined' && "
                       "!c.?securityContext.?seLinuxOptions.hasValue() && "
                       "!c.?securityContext.?windowsOptions.?hostProcess.orValue(false)) && "
                       "variables.pod.?securityContext.?appArmorProfile.?type.orValue('RuntimeDefault') != 'Unconfined' && "
                       "!variables.pod.?securityContext.?seLinuxOptions.hasValue()",
         "message": "a health check keeps the default /proc mount, AppArmor and SELinux confinement"},
    ], variables=[{"name": "pod", "expression": "object.spec.template.spec"},
                  {"name": "podLabels", "expression": "object.spec.template.?metadata.?labels.orValue({})"},
                  {"name": "pool", "expression": f"object.spec.template.spec.?nodeSelector[?{json.dumps(labels.NODE_POOL)}]"
                                                 ".orValue('')"},
                  {"name": "gpus", "expression": f"{pool_gpus}[?variables.pool].orValue('')"}])


GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin's resource (the one job_manifest asks for)
# The labels the API server adds to a Job's pod template, with the Job's name and uid (kubernetes v1.34.4
# pkg/registry/batch/job/strategy.go generateSelector; pkg/apis/batch/types.go): admitted with those values only.
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")


def _gpus_exactly(where: str) -> str:
    """CEL: the resource map at `where` (requests or limits, an optional) is exactly the pool's GPUs (variable
    `gpus`, a string). A quantity reaches CEL as its canonical string (k8s.io/apimachinery resource.Quantity)."""
    return (f"{where}.orValue({{}}).size() == 1 && "
            f"{where}.orValue({{}})[?{json.dumps(GPU_RESOURCE)}].hasValue() && "
            f"string({where}.orValue({{}})[{json.dumps(GPU_RESOURCE)}]) == variables.gpus")


def pool_label_keys(spec: FleetSpec) -> set[str]:
    """Labels membership sets on a pool's nodes (fleetspec/placement.py node_labels) outside gpufleet's prefix,
    the proven pool (labels.NODE_POOL) among them."""
    keys = {labels.GPU_MODEL, labels.GPU_COUNT, labels.NODE_POOL}
    for p in spec.pools:
        keys |= set(p.labels)
    return {k for k in keys if not k.startswith(OWN)}


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
    # the proven pool is set once (membership adds it to a node without one and never relabels: core/membership.py)
    proven = f"(k == {json.dumps(labels.NODE_POOL)} && !(k in variables.oldLabels))"
    same = lambda f: f"object.spec.?{f} == oldObject.spec.?{f}"  # noqa: E731
    # a taint is the same when key, value and effect are (timeAdded is the API server's)
    taint_in = lambda t, where: (f"variables.{where}.exists(x, x.key == {t}.key && x.?value == {t}.?value && "  # noqa: E731
                                 f"x.effect == {t}.effect)")
    pools = _strings(p.name for p in spec.pools)
    pool_key = json.dumps(labels.NODE_POOL)
    # the pool's own taints as declared (key, value and effect), not any taint under a pool taint's key
    declared = "[" + ", ".join(json.dumps({"key": k, "value": v, "effect": e}) for k, v, e in sorted(
        {(t.key, t.value, t.effect) for p in spec.pools for t in p.taints if not t.key.startswith(OWN)})) + "]"
    return _policy(f"{dep.namespace}-reconciler-nodes", username, [_rule(["nodes", "nodes/status"], ["UPDATE"])], [
        # first, which nodes: a declared pool's (the proven pool on it), or one membership enrols now, with the
        # evidence membership enrols it by that a kubelet cannot forge (core/membership.py claims); never a
        # system node or the control plane
        {"expression": f"!({json.dumps(labels.SYSTEM_NODE)} in variables.oldLabels) && "
                       f"!({json.dumps(CONTROL_PLANE)} in variables.oldLabels) && "
                       f"(variables.oldLabels[?{pool_key}].orValue('') in {pools} || "
                       f"(!({pool_key} in variables.oldLabels) && ({_enrolled(spec)})))",
         "messageExpression": "'the reconciler writes only the nodes of the pools the spec declares (the proven pool "
                              f"{labels.NODE_POOL}), or enrols one its pool claims ({labels.TRUSTED_PREFIX} member "
                              "labels, or an AWS instance for an aws-asg pool); never a system or control-plane node, "
                              "not ' + object.metadata.name"},
        {"expression": _changed_only("oldLabels", "newLabels",
                                     f"{own} || (k in {pool_labels} && k in variables.newLabels) || {proven}"),
         "message": f"the reconciler changes only {OWN} labels, and adds the pool labels membership sets "
                    f"({labels.NODE_POOL} only to a node without one: it never changes or removes it)"},
        {"expression": _changed_only("oldAnnotations", "newAnnotations",
                                     f"{own} || k in {_strings(SLINKY_NODE_ANNOTATIONS)}"),
         "message": f"the reconciler changes only {OWN} annotations and Slinky's {', '.join(SLINKY_NODE_ANNOTATIONS)}"},
        {"expression": f"variables.oldTaints.filter(t, !t.key.startsWith({json.dumps(OWN)})).all(t, {taint_in('t', 'newTaints')})"
                       f" && variables.newTaints.filter(t, !t.key.startsWith({json.dumps(OWN)}))"
                       f".all(t, {taint_in('t', 'oldTaints')} || {declared}.exists(d, d.key == t.key && "
                       "d.value == t.?value.orValue('') && d.effect == t.effect))",
         "message": f"the reconciler changes only {OWN} taints, and adds the pool's taints as the spec declares them"},
        # its own taints keep pods off (quarantine, spare, lending: all NoSchedule); NoExecute would evict every
        # pod of a node at once, past PodDisruptionBudgets (taint eviction does not go through the eviction API)
        {"expression": f"variables.newTaints.filter(t, t.key.startsWith({json.dumps(OWN)}))"
                       f".all(t, t.effect == 'NoSchedule' || {taint_in('t', 'oldTaints')})",
         "message": f"the reconciler's own taints ({OWN}) are NoSchedule"},
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


CONTROL_PLANE = "node-role.kubernetes.io/control-plane"  # kubeadm's label on its control-plane nodes


def _enrolled(spec: FleetSpec) -> str:
    """CEL: the update sets the proven pool to a pool that claims the node by evidence no kubelet writes: a
    kubernetes-spares pool's member_selector (all `node-restriction.kubernetes.io/` labels, which NodeRestriction
    keeps from kubelets), or, for an aws-asg pool, an AWS instance (its Auto Scaling group is asked of EC2,
    which admission cannot; the node's name is the instance's, which NodeRestriction keeps to its kubelet)."""
    new = f"variables.newLabels[?{json.dumps(labels.NODE_POOL)}].orValue('')"
    terms = []
    for p in sorted(spec.pools, key=lambda p: p.name):
        if p.provider == "aws-asg":
            evidence = "object.spec.?providerID.orValue('').startsWith('aws://')"
        elif p.member_selector:
            evidence = " && ".join(f"variables.oldLabels[?{json.dumps(k)}].orValue('') == {json.dumps(v)}"
                                   for k, v in sorted(p.member_selector.items()))
        else:
            continue  # membership claims no node for it (core/membership.py _matches: an empty selector)
        terms.append(f"({new} == {json.dumps(p.name)} && {evidence})")
    return " || ".join(terms) or "false"


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
                       # a NodeSet pod a stale busy-pod PDB keeps at the drain timeout (decide.py end_eviction),
                       # or one on a machine that stopped answering, force-deleted (core/node_lost.py)
                       f"(request.namespace == {json.dumps(spec.slurm.namespace)} && "
                       f"oldObject.metadata.?labels[?{json.dumps(labels.SLINKY_POD_HOSTNAME)}].hasValue() && "
                       f"{nodeset_controlled('oldObject', nodeset_names(spec.pools))}) || "
                       f"oldObject.spec.?priorityClassName.orValue('') in {borrowers}",
         "messageExpression": "'the reconciler deletes only borrowers (PriorityClass " + ", ".join(
             sorted(spec.borrower_classes())) + "), its own capacity requests and the NodeSet pods in the Slurm "
                              "namespace, not ' + request.namespace + '/' + request.name"},
    ])


def reconciler_token_policy(spec: FleetSpec, username: str) -> dict:
    from .slinky import TOKEN_NAME
    from .slinky_schema import GROUP as SLINKY_GROUP
    from .slinky_schema import VERSION as SLINKY_VERSION

    nudge = json.dumps(labels.TOKEN_NUDGE)
    rule = {"apiGroups": [SLINKY_GROUP], "apiVersions": [SLINKY_VERSION], "operations": ["UPDATE"],
            "resources": ["tokens", "tokens/status"]}
    return _policy(f"{spec.healing.reconciler.namespace}-reconciler-token-nudge", username, [rule], [
        {"expression": f"request.namespace == {json.dumps(spec.slurm.namespace)} && "
                       f"request.name == {json.dumps(TOKEN_NAME)} && request.?subResource.orValue('') == ''",
         "messageExpression": f"'the reconciler changes only its own Token ({spec.slurm.namespace}/{TOKEN_NAME}), "
                              "not ' + request.namespace + '/' + request.name"},
        {"expression": "object.?spec == oldObject.?spec && object.?status == oldObject.?status && "
                       "object.metadata.?finalizers == oldObject.metadata.?finalizers && "
                       "object.metadata.?ownerReferences == oldObject.metadata.?ownerReferences && "
                       "variables.oldLabels == variables.newLabels && "
                       + _changed_only("oldAnnotations", "newAnnotations", f"k == {nudge}"),
         "message": f"on its Token the reconciler changes only its {labels.TOKEN_NUDGE} annotation"},
    ], variables=_maps("Labels", "labels") + _maps("Annotations", "annotations"))


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
        # on the object and on its status alike: the status subresource's strategy resets only the spec
        # (PrepareForUpdate, see the module's docstring), so labels, annotations, finalizers and owners written
        # through nodes/status are stored as sent
        {"expression": "object.?spec == oldObject.?spec && "
                       "object.metadata.?finalizers == oldObject.metadata.?finalizers && "
                       "object.metadata.?ownerReferences == oldObject.metadata.?ownerReferences && "
                       + _changed_only("oldLabels", "newLabels", f"k in {operands} && "
                                       "variables.newLabels[?k].orValue('false') in ['true', 'false']") + " && "
                       + _changed_only("oldAnnotations", "newAnnotations", f"k in {own}"),
         "message": f"on its node the agent changes only its kernel-log cursor ({labels.KMSG_REPORTED}), the "
                    f"answer to a repair ({labels.REPAIR_RESULT}), what a GPU reset stopped "
                    f"({labels.GPU_CLIENTS_STOPPED}) and the GPU Operator's deploy labels (true or false) of the "
                    "operands a reset stops, through the node or its status alike"},
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
        # gpufleet's annotations on a node are its records (the capacity request a node answered, a repair's
        # answer, the kernel-log cursor): a kubelet that writes its node's fulfils would settle another request
        {"expression": _changed_only("oldAnnotations", "newAnnotations", f"!k.startsWith({json.dumps(OWN)})"),
         "message": f"a kubelet changes no {OWN} annotation of a node"},
    ], variables=_maps("Labels", "labels") + _maps("Annotations", "annotations"))
    policy["spec"]["matchConditions"] = [{
        "name": "is-a-kubelet",
        "expression": f"request.userInfo.username.startsWith({json.dumps(KUBELET_PREFIX)})"}]
    return policy


def kubelet_events_policy(spec: FleetSpec) -> dict:
    """A kubelet's Events about a node are about its own: NodeRestriction judges a kubelet's Nodes, Pods and
    leases but has no case for Events (kubernetes v1.34.4 plugin/pkg/admission/noderestriction/admission.go
    Admit: its switch names pods, nodes, persistentvolumeclaims, serviceaccounts, podcertificaterequests, leases,
    csinodes, resourceslices and certificatesigningrequests), and the node authorizer grants a kubelet what the
    system:node rules do (plugin/pkg/auth/authorizer/node: NodeRules), Events create in any namespace among them. `gpufleet why` reads an Event
    on a node that names an Xid as that node's fault, so node A's kubelet must not write node B's history."""
    me = f"request.userInfo.username.substring({len(KUBELET_PREFIX)})"
    policy = _policy(f"{spec.healing.reconciler.namespace}-kubelet-events", "", [
        _rule(["events"], ["CREATE", "UPDATE"]), _rule(["events"], ["CREATE", "UPDATE"], "events.k8s.io")], [
        {"expression": f"variables.about.?kind.orValue('') != 'Node' || variables.about.?name.orValue('') == {me}",
         "messageExpression": "'a kubelet (' + request.userInfo.username + ') creates Events about its own node only, "
                              "not ' + variables.about.?name.orValue('<no name>')"},
    ], variables=[{"name": "about",
                   "expression": "request.resource.group == 'events.k8s.io' ? object.?regarding.orValue({}) : "
                                 "object.?involvedObject.orValue({})"}])
    policy["spec"]["matchConditions"] = [{
        "name": "is-a-kubelet",
        "expression": f"request.userInfo.username.startsWith({json.dumps(KUBELET_PREFIX)})"}]
    return policy


def policies(spec: FleetSpec, reconciler: str, agent: str) -> list[dict]:
    """Every policy, for the reconciler's and the agent's usernames, and the kubelets'."""
    return [reconciler_pods_policy(spec, reconciler), reconciler_nodes_policy(spec, reconciler),
            reconciler_pod_deletion_policy(spec, reconciler), reconciler_jobs_policy(spec, reconciler),
            reconciler_token_policy(spec, reconciler), agent_nodes_policy(spec, agent), agent_events_policy(spec, agent),
            kubelet_membership_policy(spec), kubelet_events_policy(spec)]


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
