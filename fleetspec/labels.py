"""Every label, taint and annotation gpufleet reads or writes, in one place.

Keys are prefixed `gpufleet.io/` (versioned API objects use `gpufleet.io/v1alpha1`).
A node's role in its pool is one label, `gpufleet.io/role`, whose values and
transitions are drawn in `reconciler/core/phases.py`.
"""
from __future__ import annotations

GROUP = "gpufleet.io"
API_VERSION = f"{GROUP}/v1alpha1"

# Node labels (a Node's pool is NODE_POOL below; POOL names the pool on gpufleet's own objects)
POOL = f"{GROUP}/pool"
ROLE = f"{GROUP}/role"
ROLE_ACTIVE = "active"
ROLE_SPARE = "spare"
ROLE_QUARANTINED = "quarantined"
ROLE_SYSTEM = "system"
ROLE_RETIRED = "retired"  # out for good: quarantined for the vendor (RMA), never returned by gpufleet
ROLE_SURPLUS = "surplus"  # a spare above the pool's declared count, given back (scaled in, or left to the autoscaler)
TOPOLOGY_BLOCK = f"{GROUP}/topology-block"
# Membership a kubelet cannot claim for its own node: the API server's NodeRestriction admission refuses a
# kubelet any label under this prefix, at registration and after (k8s.io/api v0.34 core/v1 well_known_labels.go
# LabelNamespaceNodeRestriction, enforced by k8s.io/kubernetes plugin/pkg/admission/noderestriction; the local
# API server runs it, tests/integration/test_admission.py shows it). Only the reconciler (on its provider's
# evidence) or the platform sets them.
TRUSTED_PREFIX = "node-restriction.kubernetes.io/"
NODE_POOL = f"{TRUSTED_PREFIX}gpufleet-pool"      # on a Node: the pool it is proven to belong to
SYSTEM_NODE = f"{TRUSTED_PREFIX}gpufleet-system"  # on a Node: "true" where the platform runs gpufleet and Slurm's control plane


def untrusted_keys(keys) -> list[str]:
    """The label keys (of a node selector) a kubelet may set on its own node: all but TRUSTED_PREFIX's."""
    return sorted(str(k) for k in keys if not str(k).startswith(TRUSTED_PREFIX))
GPU_MODEL = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"

# Node taints
SPARE_TAINT = f"{GROUP}/spare"            # NoSchedule until promoted
QUARANTINE_TAINT = f"{GROUP}/quarantined"  # NoSchedule, value = the XID
LENDING_TAINT = f"{GROUP}/lending"         # NoSchedule, value = the pool: only borrowers tolerate it
# NoSchedule while an active check runs on an idle node (reconciler/core/active_checks.py): its NodeSet pods leave
# it, so the check's Job gets the GPUs; only that Job (it tolerates every taint) lands there meanwhile.
CHECK_TAINT = f"{GROUP}/active-check"

# Lending (issue 13): a lent node carries the lending taint and this label (value: spare | idle);
# borrower pods tolerate the taint and require the label. While borrowers are being evicted the
# label is gone (no new borrower lands) and RECLAIMING says since when.
LENT = f"{GROUP}/lent"
LENT_SPARE = "spare"
LENT_IDLE = "idle"
LENT_SINCE = f"{GROUP}/lent-since"         # annotation: when the current loan began (ISO 8601)
RECLAIMING = f"{GROUP}/reclaiming"         # annotation: when the reclaim began, and why

# Node annotations (progress persisted on the object, so a restart resumes)
REMEDIATION = f"{GROUP}/remediation"       # name of the Remediation record in progress
PROMOTED_FOR = f"{GROUP}/promoted-for"     # on a promoted spare: the node it replaced
SIGNALS = f"{GROUP}/fault-signals"          # when the node's faults were signalled (JSON list), for `occurrences`
FULFILS = f"{GROUP}/fulfils"               # the capacity request (placeholder pod) this node answered
SLINKY_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
# On a faulted machine: the drains people had set on its Slurm nodes (JSON {slurm node: reason}), carried
# here before its NodeSet pods left (their preStop and the operator's IDLE after the move clear them on the
# Slurm node). The machine does not return to the spares while it carries one: a person removes it.
CARRIED_DRAIN = f"{GROUP}/person-drain"
# People's Slurm drains on the Slurm nodes this machine runs, kept to put back after Slinky's operator overwrites
# them (reconciler/core/person_holds.py): JSON {slurm node: [reason, pod uid]}
PERSON_HOLDS = f"{GROUP}/person-holds"
# The slurm-drain-again page sent for a Slurm drain of this machine's Slurm nodes: its key (Slurm node, the reason's
# code and Slurm's time of it), so a restart or a new leader does not page the same drain again
SLURM_DRAIN_PAGED = f"{GROUP}/slurm-drain-paged"
KMSG_REPORTED = f"{GROUP}/kmsg-reported"   # the node agent's cursor: "<boot id>:<kernel-log record>" reported up to

# The repair loop (issue 25): what is asked of a node, what it answered, what its last health check said.
# JSON, read and written through fleetspec/node_repair.py.
REPAIR_REQUEST = f"{GROUP}/repair-request"  # node annotation, by the reconciler: reset its GPU(s) or reboot (once per id)
REPAIR_RESULT = f"{GROUP}/repair-result"    # node annotation, by whoever acts on the node (the agent): how it went
GPU_CLIENTS_STOPPED = f"{GROUP}/gpu-clients-stopped"  # node annotation, by the agent: what a GPU reset stopped
# The NVIDIA GPU Operator's node labels that deploy its operands on a node ("true") or remove them ("false"):
# a GPU reset stops them so (NVIDIA's NVSentinel, janitor/pkg/gpuservices/manager.go, its registry's
# gpu-operator entry: the device plugin, DCGM, dcgm-exporter, GPU feature discovery).
GPU_OPERATOR_DEPLOY = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm",
                       "nvidia.com/gpu.deploy.dcgm-exporter", "nvidia.com/gpu.deploy.gpu-feature-discovery")
HEALTH_CHECK = f"{GROUP}/health-check"      # node annotation, by the reconciler: its last check (Job, boot, verdict)
RETIRED = f"{GROUP}/retired"                # node annotation: why it was retired, and when
HEALTH_CHECK_NODE = f"{GROUP}/health-check-node"  # label on a health-check Job and its pod: the node it checks
# The local environment only (localenv/gpu_hardware_standin.py): a kwok node's simulated GPU hardware, set by
# tests and demos (healthy | reset-fixes | reboot-fixes | broken; absent: healthy). Nothing in the reconciler reads it.
SIMULATED_GPU_STATE = "localenv.gpufleet.io/gpu-state"
ONCALL_REQUEST = f"{GROUP}/request"         # Remediation annotation, by a person (gpufleet release|return|retire|mark-healthy)

# Remediation objects: the node they are about (a label, so a corrupt object still names its node)
REMEDIATION_NODE = f"{GROUP}/node"

# kubernetes-spares capacity requests: placeholder pods in the reconciler's namespace
CAPACITY_REQUEST = f"{GROUP}/capacity-request"  # label: the pool that needs a node
REQUEST_KEY = f"{GROUP}/request-key"            # annotation: the remediation and purpose that asked
REQUEST_REASON = f"{GROUP}/reason"              # annotation: why, for a person

# Tags on AWS resources (aws-asg pools)
QUARANTINED_TAG = f"{GROUP}/quarantined"            # EC2 instance kept for a human: value xid-<N>
QUARANTINED_FROM_TAG = f"{GROUP}/quarantined-from"  # EC2 instance: the group it left
REPAIRING_TAG = f"{GROUP}/repairing"                # EC2 instance out of its group while repaired: value xid-<N>
NODE_TAG = f"{GROUP}/node"                          # EC2 instance: its Kubernetes node
REFILL_TAG_PREFIX = f"{GROUP}/refill/"              # Auto Scaling group: one per remediation's refill

# The stack's own marks
CONFIG_CHECKSUM = f"{GROUP}/config-checksum"  # pod template annotation: a config change rolls the pods

# On a Kubernetes node: its Slurm dynamic topology ("<topology>:<unit>"), which slurm-operator 1.2.1 gives the
# Slurm node of each NodeSet pod there (api/v1beta1/well_known.go AnnotationNodeTopologySpec). gpufleet's
# membership sets it from the pool's topology_block: "blocks:<block>" (components/slinky.py topology_yaml).
SLINKY_TOPOLOGY_SPEC = "topology.slinky.slurm.net/spec"
SLURM_TOPOLOGY = "blocks"

# Slinky's NodeSet pods: the label carrying the pod's Slurm node name (its hostname). It counts only on a pod
# that a NodeSet controls: slurm-operator 1.2.1 gives each NodeSet pod a controller ownerReference to its NodeSet
# (internal/controller/nodeset/utils/utils.go NewNodeSetStatefulSetPod: metav1.NewControllerRef(nodeset,
# NodeSetGVK); api/v1beta1/groupversion_info.go, nodeset_types.go).
SLINKY_POD_HOSTNAME = "nodeset.slinky.slurm.net/pod-hostname"
SLINKY_NODESET_API_VERSION = "slinky.slurm.net/v1beta1"
SLINKY_NODESET_KIND = "NodeSet"
# On the reconciler's Slinky Token: the reconciler's nudge, a condition (JSON) whose every write is a change of the
# object, which makes slurm-operator reconcile the Token again (reconciler/core/slurm_token.py says why).
TOKEN_NUDGE = f"{GROUP}/slurm-token-condition"

# Pod opt-out (key configurable in the spec; this is the default)
DEFAULT_OPT_OUT = f"{GROUP}/auto-replace-opt-out"
OPT_OUT_REASON = f"{GROUP}/opt-out-reason"
OPT_OUT_EXPIRES = f"{GROUP}/opt-out-expires"

# Node condition the agent and inject-fault write, and the reconciler reads by default
GPU_CONDITION = "GpuHealthy"
# The field managers gpufleet writes node conditions as: a condition's manager in the node's managedFields names
# who reported a fault (reconciler/core/observe.py condition_reporters). Another detector is known by its own
# (node-problem-detector's, kubectl's for a person's `kubectl patch`). A manager name is the writer's claim; what
# bounds a forger is who may write a node's conditions at all (components/admission.py: an agent its own node).
MANAGER_AGENT = "gpufleet-agent"
MANAGER_INJECT_FAULT = "gpufleet-inject-fault"  # a person, with `gpufleet inject-fault` / `mark-healthy`
MANAGER_RECONCILER = "gpufleet-reconciler"

# Slurm drain/down reasons written by gpufleet carry this prefix; Slinky's carry
# "slurm-operator:". Anything else was set by a person and is never undone.
SLURM_REASON_PREFIX = "gpufleet:"
SLINKY_REASON_PREFIX = "slurm-operator:"
SLURM_LENDING_PREFIX = "gpufleet-lending:"  # an idle node drained to be lent (not a fault, not a person's)
LENDING_LEDGER = "gpufleet-lending"         # ConfigMap in the reconciler's namespace: loans and capacity per pool

# Standard Kubernetes labels on every object the stack declares
PART_OF = "gpufleet"
APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
APP_COMPONENT = "app.kubernetes.io/component"
APP_PART_OF = "app.kubernetes.io/part-of"
APP_MANAGED_BY = "app.kubernetes.io/managed-by"
MIRROR_POD = "kubernetes.io/config.mirror"  # annotation the kubelet puts on static pods' mirrors
# The node's instance type, as the kubelet or its cloud provider sets it (Kubernetes' well-known labels:
# kubernetes.io/docs/reference/labels-annotations-taints/#nodekubernetesioinstance-type)
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def standard_labels(name: str, component: str, instance: str) -> dict[str, str]:
    return {
        APP_NAME: name,
        APP_COMPONENT: component,
        APP_INSTANCE: instance,
        APP_PART_OF: PART_OF,
        APP_MANAGED_BY: "pulumi",
    }

# The label (and value) that the Grafana sidecar of kube-prometheus-stack loads dashboards from by default
# (prometheus-community/helm-charts kube-prometheus-stack-88.5.3 values.yaml, grafana.sidecar.dashboards).
GRAFANA_DASHBOARD = "grafana_dashboard"
GRAFANA_DASHBOARD_VALUE = "1"
