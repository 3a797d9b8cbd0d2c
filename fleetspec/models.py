"""The declarative fleet spec: one document per environment, under `gpufleet:fleet`.

Pydantic only (no pulumi, no kubernetes), so the components, the reconciler and the
policy pack share it. Every model forbids unknown keys: a typo must fail, not vanish.
Secrets never appear here: fields ending in `_secret` name a Pulumi secret config key.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from . import labels
from .faults.catalogue import FaultAction, Kind
from .active_checks import ActiveChecks
from .active_checks import errors as active_check_errors

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._\-/:]*(@sha256:[a-f0-9]{64})?$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


class FieldError(ValueError):
    """A validation error that knows which field (relative to the model) it is about,
    so cross-field checks still point at a path like `slurm.partitions[1].pools`."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def _k8s_name(v: str) -> str:
    if len(v) > 63 or not _DNS_LABEL.match(v):
        raise ValueError(
            f"{v!r} is not a valid Kubernetes name: use at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return v


def _label_key(v: str) -> str:
    prefix, _, name = v.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(_DNS_LABEL.match(p) for p in prefix.split("."))):
        raise ValueError(f"{v!r} is not a valid label key: the prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(f"{v!r} is not a valid label key: the name part must be 1-63 alphanumerics, '-', '_' or '.'")
    return v


def _label_value(v: str) -> str:
    if len(v) > 63 or not _LABEL_VALUE.match(v):
        raise ValueError(f"{v!r} is not a valid label value")
    return v


def _quantity(v: str) -> str:
    if not _QUANTITY.match(v):
        raise ValueError(f"{v!r} is not a Kubernetes quantity such as '10Ti' or '500Gi'")
    return v


def _image(v: str) -> str:
    if not _IMAGE.match(v):
        raise ValueError(f"{v!r} is not a container image reference")
    return v


def _digest(v: str) -> str:
    if not _DIGEST.match(v):
        raise ValueError(f"{v!r} is not an image digest: sha256: and 64 lower-case hex digits")
    return v


def _cidr(v: str) -> str:
    try:
        ipaddress.ip_network(v)  # strict: no host bits set
    except ValueError:
        raise ValueError(f"{v!r} is not a CIDR block such as 10.0.0.0/16 (network address, then /prefix)") from None
    if "/" not in v:
        raise ValueError(f"{v!r} is not a CIDR block: add the /prefix")
    return v


def _labels(v: dict[str, str]) -> dict[str, str]:
    for k, val in v.items():
        _label_key(k)
        _label_value(val)
    return v


K8sName = Annotated[str, AfterValidator(_k8s_name)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
Quantity = Annotated[str, AfterValidator(_quantity)]
Image = Annotated[str, AfterValidator(_image)]
Digest = Annotated[str, AfterValidator(_digest)]
Cidr = Annotated[str, AfterValidator(_cidr)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- the Kubernetes cluster -------------------------------------------------------------

class ClusterSpec(Strict):
    """How to reach the Kubernetes cluster."""

    kind: Literal["local", "kubeconfig"] = Field(
        description="`local`: the control plane `gpufleet local up` starts; `kubeconfig`: an existing cluster."
    )
    kubeconfig: str | None = Field(None, description="Path to a kubeconfig (kind: kubeconfig). Default: ~/.kube/config.")
    context: str | None = Field(None, description="Context in the kubeconfig; default: its current context.")

    @model_validator(mode="after")
    def _local_has_no_kubeconfig(self) -> "ClusterSpec":
        if self.kind == "local" and (self.kubeconfig or self.context):
            raise FieldError("kubeconfig", "a local cluster writes its own kubeconfig: remove kubeconfig/context or use kind: kubeconfig")
        return self


# --- GPU node pools -----------------------------------------------------------------------

class Taint(Strict):
    key: LabelKey = Field(description="The taint's key.")
    value: str = Field("", description="The taint's value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field("NoSchedule", description="The taint's effect.")


def trusted_selector_error(field: str, selector: dict[str, str], what: str) -> FieldError | None:
    bad = labels.untrusted_keys(selector)
    if not bad:
        return None
    return FieldError(field, f"{bad}: a kubelet may set these labels on its own node, so a compromised node could "
                             f"make itself {what}; select on labels under {labels.TRUSTED_PREFIX}, which "
                             f"NodeRestriction keeps from kubelets and the platform sets (Cluster API syncs them "
                             f"from its Machines)")


class AwsNodeGroup(Strict):
    """The Auto Scaling group behind a pool with provider `aws-asg`. Its instances are the pool's
    members, as the group says; `node_labels` are the kubelet labels its launch template sets, when it sets
    any: a hint for `gpufleet preflight` only, never proof of membership (a kubelet sets them itself)."""

    asg_name: str = Field(min_length=1, description="The Auto Scaling group's name.")
    region: str = Field("us-east-1", min_length=1, description="The group's AWS region.")
    node_labels: Labels = Field(default_factory=dict, description="Kubelet labels the launch template puts on its "
                                "nodes (preflight's hint; membership is the group's word).")
    on_fault: Literal["terminate", "quarantine"] = Field(
        "quarantine",
        description="What happens to a faulted instance after it leaves the group (desired capacity decremented): "
        "`terminate` it, or keep it running, tagged gpufleet.io/quarantined, for a human to inspect.",
    )


class Borrowers(Strict):
    """Which workloads may borrow a pool's idle GPUs. Borrower pods carry `selector`'s labels, run with
    `priority_class` (the stack declares it with `priority`), tolerate the lending taint and require
    the lent label (`gpufleet.fleetspec.placement.borrower_placement` gives both)."""

    selector: Labels = Field(min_length=1, description="Labels every borrower pod carries; nothing else is let on.")
    priority_class: K8sName = Field("gpufleet-borrower", description="PriorityClass the stack declares for borrowers.")
    priority: int = Field(-1000, ge=-2_000_000_000, le=1_000_000_000,
                          description="Its value: lower than anything else that runs on GPU nodes.")

    @model_validator(mode="after")
    def _names(self) -> "Borrowers":
        reserved = [k for k in self.selector if k.startswith(labels.GROUP + "/")]
        if reserved:
            raise FieldError("selector", f"labels {reserved} use the reserved prefix {labels.GROUP}/: gpufleet sets "
                             "those, a borrower's own labels say which workload it is")
        if self.priority_class.startswith("system-"):
            raise FieldError("priority_class", f"{self.priority_class!r}: the API server keeps names starting "
                             "with 'system-' for its own PriorityClasses")
        return self


class LendingSpec(Strict):
    """Idle GPUs serve preemptible work (inference) and are taken back when training needs them."""

    spares: bool = Field(False, description="Spares run borrowers while they wait for a fault.")
    idle_nodes: bool = Field(False, description="Active nodes whose Slurm node is idle lend too.")
    idle_after_seconds: int = Field(600, ge=0, le=86400 * 7, description="How long a Slurm node is idle before it lends.")
    borrowers: Borrowers
    max_lent_fraction: float = Field(0.5, gt=0, le=1, description="The most of the pool (nodes and spares) lent at once.")
    reclaim_grace_seconds: int = Field(30, ge=0, le=3600,
                                       description="SIGTERM to kill for a borrower being evicted (PDBs honoured this long).")
    spare_floor: int = Field(1, ge=0, description="Spares never lent: a fault always finds one at once.")

    @model_validator(mode="after")
    def _lends_something(self) -> "LendingSpec":
        if not (self.spares or self.idle_nodes):
            raise FieldError("spares", "lending lends nothing: set spares and/or idle_nodes to true, or remove `lending`")
        return self


# The repair loop's spec (issue 25) lives in its own module, which builds on Strict, Image and FieldError above.
from .repair import PoolRepair, RepairSpec  # noqa: E402
from .telemetry_spec import PoolTelemetry, TelemetrySpec  # noqa: E402


# The most GPUs one machine of a model family carries: NVIDIA's HGX baseboards hold 8 (HGX A100/H100/H200/B200/
# B300: nvidia.com/en-us/data-center/hgx), a GB200/GB300 NVL72 compute tray 4 (2 Grace CPUs, 4 Blackwell GPUs:
# nvidia.com/en-us/data-center/gb200-nvl72). Longest prefix first; a model not listed is not checked.
GPUS_PER_MACHINE = (("GB300", 4), ("GB200", 4), ("B300", 8), ("B200", 8), ("H200", 8), ("H100", 8), ("H800", 8),
                    ("H20", 8), ("A100", 8), ("A800", 8))


def gpus_per_machine(model: str) -> int | None:
    """The most GPUs a machine of `model` (e.g. "H100-SXM5-80GB") has; None for a model not listed."""
    name = model.upper().removeprefix("NVIDIA").strip(" -_")
    return next((n for prefix, n in GPUS_PER_MACHINE if name.startswith(prefix)), None)


class NodePool(Strict):
    name: K8sName = Field(description="The pool's name: its NodeSet, its label value, its Slurm node names' prefix.")
    node_type: str = Field(min_length=1, description="Instance or machine type, e.g. p5.48xlarge.")
    gpu_model: str = Field(min_length=1, description="e.g. H100-SXM5-80GB")
    gpus_per_node: int = Field(8, ge=1, le=16, description="GPUs each node has (nvidia.com/gpu); the health check wants this many.")
    cpus_per_node: int = Field(96, ge=1, description="CPUs each node has, for Slurm.")
    memory_per_node: Quantity = Field("1Ti", description="Memory each node has (a Kubernetes quantity), for Slurm.")
    nodes: int = Field(ge=0, description="Active nodes that run Slurm workers.")
    spares: int = Field(ge=0, description="Pre-joined spare nodes, tainted until promoted.")
    labels: Labels = Field(default_factory=dict, description="Labels the stack puts on the pool's nodes.")
    taints: list[Taint] = Field(default_factory=list, description="Taints the pool's nodes carry (Slurm's pods tolerate them).")
    topology_block: K8sName | None = Field(None, description="Network block (Slurm topology/block) the pool sits in.")
    provider: Literal["kubernetes-spares", "aws-asg"] = Field(
        "kubernetes-spares", description="Who owns the nodes and refills spares."
    )
    aws: AwsNodeGroup | None = Field(None, description="provider aws-asg: the Auto Scaling group.")
    member_selector: Labels = Field(
        default_factory=dict,
        description="kubernetes-spares: labels that make a node a member of this pool, all under "
        "node-restriction.kubernetes.io/ (set by the platform, never by a kubelet); default: the pool label itself "
        "(node-restriction.kubernetes.io/gpufleet-pool).",
    )
    lending: LendingSpec | None = Field(None, description="Lend idle GPUs to preemptible workloads.")
    repair: PoolRepair = Field(default_factory=PoolRepair, description="How its broken nodes are repaired.")
    active_checks: ActiveChecks | None = Field(None, description=(
        "Run the health check again, at a period, on nodes Slurm has idle and on spares (fleetspec/active_checks.py)."))
    telemetry: PoolTelemetry = Field(default_factory=PoolTelemetry,
                                     description="How its running jobs' hangs and stragglers are judged.")

    @model_validator(mode="after")
    def _provider_settings(self) -> "NodePool":
        if self.provider == "aws-asg" and self.aws is None:
            raise FieldError("aws", "provider aws-asg needs an `aws` block with the Auto Scaling group name")
        if self.provider != "aws-asg" and self.aws is not None:
            raise FieldError("aws", f"an `aws` block only goes with provider aws-asg, not {self.provider}")
        if self.provider == "aws-asg" and self.member_selector:
            raise FieldError("member_selector", "aws-asg pools are known by their Auto Scaling group; "
                             "declare the launch template's kubelet labels in aws.node_labels instead")
        if (e := trusted_selector_error("member_selector", dict(self.member_selector), "a member of this pool")):
            raise e
        reserved = [k for k in self.labels if k.startswith(labels.GROUP + "/")]
        if reserved:
            raise FieldError("labels", f"labels {reserved} use the reserved prefix {labels.GROUP}/")
        if self.lending and self.lending.spares and self.lending.spare_floor > self.spares:
            raise FieldError("lending.spare_floor", f"a floor of {self.lending.spare_floor} unlent spares is more than "
                             f"the pool's {self.spares} spares")
        if self.nodes == 0 and self.spares > 0:
            raise FieldError("nodes", f"0 active nodes with {self.spares} spare(s): a spare stands in for an active "
                             "node that faults, and this pool has none (declare its active nodes, or no spares)")
        most = gpus_per_machine(self.gpu_model)
        if most is not None and self.gpus_per_node > most:
            raise FieldError("gpus_per_node", f"{self.gpus_per_node} GPUs per node, but a {self.gpu_model} machine has "
                             f"at most {most} (the model's baseboard or tray); a count the nodes cannot report never "
                             "passes the health check")
        return self

    def max_lent(self) -> int:
        """The most nodes of this pool lent at once."""
        if self.lending is None:
            return 0
        return int((self.nodes + self.spares) * self.lending.max_lent_fraction)

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.nodes)]

    def spare_names(self) -> list[str]:
        return [f"{self.name}-spare-{i}" for i in range(self.spares)]


# --- shared storage ------------------------------------------------------------------------

class NfsServer(Strict):
    server: str = Field(min_length=1, description="The NFS server's address.")
    path: str = Field(pattern=r"^/", description="The exported path.")


class StorageSpec(Strict):
    """Shared storage mounted in every Slurm pod: checkpoints live here."""

    name: K8sName = Field(description="The claim's name.")
    size: Quantity = Field(description="The claim's size (a Kubernetes quantity).")
    access_mode: Literal["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce"] = Field("ReadWriteMany", description="The claim's access mode.")
    mount_path: str = Field("/checkpoints", pattern=r"^/", description="Where Slurm's pods mount it.")
    storage_class: str | None = Field(None, description="StorageClass of the claim; default: the cluster's default class.")
    nfs: NfsServer | None = Field(None, description="An NFS export to mount instead of a StorageClass's volume.")
    host_path: str | None = Field(None, pattern=r"^/", description="Local environment only: a folder on this machine.")

    @model_validator(mode="after")
    def _one_backend(self) -> "StorageSpec":
        chosen = [k for k in ("storage_class", "nfs", "host_path") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise FieldError("", f"set exactly one of storage_class, nfs, host_path (got {chosen or 'none'})")
        return self


# --- Slurm on Kubernetes (Slinky) ------------------------------------------------------------

# The one slurm-operator release every environment runs (its charts, its CRDs: components/slinky_schema.py,
# the local stand-in of it: localenv), the Slurm images it ships and the REST data parser gpufleet speaks to
# them. slurm-operator v1.2.1 helm/slurm/values.yaml: `26.05-ubuntu26.04`; Slurm 26.05's slurmrestd: v0.0.45.
# Upgrading is this pin and components/slinky_schema.py, changed together.
SLINKY_RELEASE = "1.2.1"
SLURM_VERSION = "26.05"
SLURM_IMAGE_TAG = f"{SLURM_VERSION}-ubuntu26.04"
SLURM_REST_VERSION = "v0.0.45"
# The validating webhook refuses a Controller whose ClusterName is longer (slurm-operator v1.2.1
# internal/webhook/controller_webhook.go; slurm.conf's ClusterName).
CLUSTER_NAME_MAX = 40
# slurm.conf keys gpufleet renders itself (components/slinky.py) or the operator writes
# (internal/builder/controllerbuilder/controller_config.go): `slurm.extra_conf` may not set them again.
MANAGED_SLURM_KEYS = frozenset({
    "clustername", "slurmuser", "slurmctldhost", "slurmctldport", "statesavelocation", "slurmduser", "slurmdport",
    "slurmdspooldir", "maxnodecount", "slurmctldlogfile", "slurmschedlogfile", "slurmdlogfile", "authtype", "credtype",
    "authalttypes", "authaltparameters", "authinfo", "accountingstoragetype", "accountingstoragehost",
    "accountingstorageport", "nodeset", "partitionname", "nodename", "grestypes", "returntoservice", "include",
})


class OperatorSpec(Strict):
    mode: Literal["helm", "crds-only"] = Field(
        "helm",
        description="`helm`: install SchedMD's slurm-operator and CRD charts; `crds-only`: only gpufleet's "
        "definitions of the Slinky kinds (for clusters that cannot pull the chart, like the local one).",
    )
    chart_version: str = Field(
        SLINKY_RELEASE, description=f"The slurm-operator release: {SLINKY_RELEASE}, the one gpufleet's Slinky schema, "
        "its stand-in and its tests follow (an upgrade changes it and components/slinky_schema.py together).")
    repository: str = Field("oci://ghcr.io/slinkyproject/charts", description="Where the operator's charts are pulled from (mode helm).")
    cert_manager: bool = Field(
        True, description="The cluster runs cert-manager (the operator's webhook certificate comes from it); "
        "false sets the chart's certManager.enabled=false.")

    @model_validator(mode="after")
    def _pinned(self) -> "OperatorSpec":
        if self.chart_version != SLINKY_RELEASE:
            raise FieldError("chart_version", f"{self.chart_version!r}: gpufleet pins slurm-operator {SLINKY_RELEASE} for "
                             "every environment (its CRDs, webhook and behaviour are what gpufleet is built and tested "
                             f"against); set {SLINKY_RELEASE} or leave it out")
        return self


class ControllerStorage(Strict):
    """slurmctld's saved state (jobs, node states, reasons) on a PersistentVolumeClaim the operator makes
    from `Controller.spec.persistence` (slurm-operator v1.2.1 controllerbuilder/controller_app.go): a
    restart of slurmctld keeps the jobs that healing just requeued."""

    size: Quantity = Field("4Gi", description="Size of the claim (the operator's chart default).")
    storage_class: str | None = Field(None, description="StorageClass of the claim; default: the cluster's default class.")


class NodeSetUpdate(Strict):
    """How the operator replaces NodeSet pods after their template changes (a new image): each replaced
    pod's Slurm node is drained first, so on a GPU pool this is how many nodes stop taking jobs at once."""

    type: Literal["RollingUpdate", "OnDelete"] = Field(
        "RollingUpdate", description="`RollingUpdate`: the operator replaces pods itself; `OnDelete`: only when "
        "someone deletes a pod.")
    max_unavailable: int | str = Field(
        1, description="RollingUpdate: pods (of each NodeSet) replaced at once, a count >= 1 or a percentage "
        "such as '10%' (the operator's default, 25%, would drain a quarter of a GPU pool).")

    @model_validator(mode="after")
    def _max_unavailable(self) -> "NodeSetUpdate":
        v = self.max_unavailable
        if isinstance(v, int) and v < 1:
            raise FieldError("max_unavailable", f"{v}: at least 1 (the operator's webhook refuses 0)")
        if isinstance(v, str) and not re.fullmatch(r"([1-9]\d?|100)%", v):
            raise FieldError("max_unavailable", f"{v!r}: a count such as 1 or a percentage from 1% to 100%")
        return self


def _slurm_conf_line(v: str) -> str:
    key, sep, value = v.partition("=")
    if not sep or not key.strip() or not value.strip() or "\n" in v or key != key.strip():
        raise ValueError(f"{v!r} is not one slurm.conf line `Key=Value`")
    if key.lower() in MANAGED_SLURM_KEYS:
        raise ValueError(f"{key} is set by gpufleet or the Slinky operator; it may not be set again in extra_conf")
    return v


SlurmConfLine = Annotated[str, AfterValidator(_slurm_conf_line)]


class Partition(Strict):
    name: K8sName = Field(description="The Slurm partition's name.")
    pools: list[K8sName] = Field(min_length=1, description="The pools whose nodes it holds.")
    default: bool = Field(False, description="Slurm's default partition.")
    max_time: str | None = Field(None, pattern=r"^(UNLIMITED|\d+(-\d{1,2})?(:\d{2}){0,2})$", description="Slurm's MaxTime: UNLIMITED, minutes, or days-hours:minutes:seconds.")


# How each load-balancer controller reads a Service's scheme: the AWS Load Balancer Controller reads
# aws-load-balancer-scheme (internal | internet-facing; kubernetes-sigs.github.io/aws-load-balancer-controller,
# guide/service/nlb), the in-tree AWS cloud provider only aws-load-balancer-internal and ignores the scheme
# annotation (a Service without it is internet-facing there). A Service that names a loadBalancerClass is
# left to that class's controller: the in-tree one ignores it.
LB_SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
LB_INTERNAL = "service.beta.kubernetes.io/aws-load-balancer-internal"


def scheme_annotations(scheme: str, load_balancer_class: str | None) -> dict[str, str]:
    """The annotations that make a LoadBalancer Service `scheme` for every controller that may serve it."""
    out = {LB_SCHEME: scheme}
    if load_balancer_class is None and scheme == "internal":
        out[LB_INTERNAL] = "true"  # no class: the in-tree controller may take it, and reads only this one
    return out


class LoginSpec(Strict):
    replicas: int = Field(1, ge=0, le=16, description="Login nodes (Slinky's LoginSet).")
    ssh_authorized_keys: list[str] = Field(default_factory=list, description="SSH public keys allowed on the login nodes.")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Type of the login nodes' SSH Service.")
    service_annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations of the SSH Service, e.g. an internal load balancer's.")
    load_balancer_scheme: Literal["internal", "internet-facing"] = Field(
        "internal", description="With service_type LoadBalancer: internal (reachable from the VPC only) or "
                                "internet-facing (SSH open to the internet).")
    load_balancer_class: str | None = Field(
        None, min_length=1, description="The Service's loadBalancerClass, e.g. service.k8s.aws/nlb for the AWS Load "
                                        "Balancer Controller; the in-tree cloud controller then leaves it alone.")

    @model_validator(mode="after")
    def _keys_look_like_keys(self) -> "LoginSpec":
        for i, k in enumerate(self.ssh_authorized_keys):
            if not re.match(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp\d+|sk-\S+) \S+", k):
                raise FieldError(f"ssh_authorized_keys[{i}]", "not an OpenSSH public key line")
        return self

    @model_validator(mode="after")
    def _scheme_is_one(self) -> "LoginSpec":
        if self.service_type != "LoadBalancer":
            if self.load_balancer_class:
                raise FieldError("load_balancer_class", "only a LoadBalancer Service has a loadBalancerClass")
            return self
        for key, want in scheme_annotations(self.load_balancer_scheme, self.load_balancer_class).items():
            got = self.service_annotations.get(key)
            if got is not None and got != want:
                raise FieldError("service_annotations", f"{key}: {got!r} contradicts load_balancer_scheme "
                                 f"{self.load_balancer_scheme!r} (which sets {want!r}); remove the annotation")
        return self

    def service(self) -> dict:
        """The LoginSet's `spec.service` (slurm-operator v1.0.1 api/v1beta1 LoginSet: Metadata and a ServiceSpec):
        the type, the loadBalancerClass, and for a LoadBalancer the annotations saying its scheme."""
        spec: dict = {"type": self.service_type}
        annotations = dict(self.service_annotations)
        if self.service_type == "LoadBalancer":
            if self.load_balancer_class:
                spec["loadBalancerClass"] = self.load_balancer_class
            annotations.update(scheme_annotations(self.load_balancer_scheme, self.load_balancer_class))
        return {"spec": spec, **({"metadata": {"annotations": annotations}} if annotations else {})}


class ExternalDatabase(Strict):
    """An existing MySQL/MariaDB that slurmdbd writes accounting to."""

    kind: Literal["external"] = Field(description="A database the platform runs.")
    host: str = Field(min_length=1, description="Its host name or address.")
    port: int = Field(3306, ge=1, le=65535, description="Its port.")
    database: str = Field("slurm_acct_db", min_length=1, description="The database slurmdbd uses.")
    user: str = Field("slurm", min_length=1, description="The user slurmdbd connects as (its password: the secret slurmDbPassword).")
    password_secret: str = Field("slurmDbPassword", min_length=1, description="Pulumi secret config key with its password.")


class MariaDbDatabase(Strict):
    """A single MariaDB the stack deploys in the Slurm namespace for slurmdbd."""

    kind: Literal["mariadb"] = Field(description="A MariaDB the stack deploys beside slurmdbd.")
    image: Image = Field("docker.io/library/mariadb:11.4", description="The MariaDB image.")
    size: Quantity = Field("50Gi", description="Size of its claim.")
    storage_class: str | None = Field(None, description="StorageClass of its claim; default: the cluster's default class.")
    database: str = Field("slurm_acct_db", min_length=1, description="The database slurmdbd uses.")
    user: str = Field("slurm", min_length=1, description="The user slurmdbd connects as (its password: the secret slurmDbPassword).")
    password_secret: str = Field("slurmDbPassword", min_length=1, description="Pulumi secret config key with its password.")

    @property
    def host(self) -> str:
        return "mariadb"  # the Service the stack declares next to slurmdbd

    @property
    def port(self) -> int:
        return 3306


Database = Annotated[ExternalDatabase | MariaDbDatabase, Field(discriminator="kind")]


class AccountingSpec(Strict):
    """Slurm accounting (slurmdbd). On by default: the reconciler's Slurm user has its AdminLevel there
    (slurm.reconciler_user); the default database is a MariaDB the stack deploys beside slurmdbd."""

    enabled: bool = Field(True, description="Run slurmdbd.")
    database: Database | None = Field(default_factory=lambda: MariaDbDatabase(kind="mariadb"),
                                      description="slurmdbd's database: `kind: external` or `kind: mariadb` (the default).")

    @model_validator(mode="after")
    def _database(self) -> "AccountingSpec":
        if self.enabled and self.database is None:
            raise FieldError("database", "accounting needs a database: `kind: external` with its host, "
                             "or `kind: mariadb` for one the stack deploys")
        return self


SLURM_IMAGES = ("slurmctld", "slurmd", "slurmrestd", "slurmdbd", "login")
# slurm.conf's SlurmUser in Slinky's images (slurm-operator v1.2.1 internal/builder/common/const.go SlurmUser):
# slurmctld treats it, like root, as a super user whatever accounting says.
SLURM_USER = "slurm"
# The AdminLevel the reconciler's Slurm user needs (sacctmgr's `adminlevel`), the lowest that admits every call
# it makes (reconciler/adapters/slurm/rest.py), per Slurm 26.05's own checks (slurm-26-05-3-1):
# * node drain/down/resume (POST /node/{name}: REQUEST_UPDATE_NODE): src/slurmctld/proc_req.c
#   _slurm_rpc_update_node requires validate_super_user(), i.e. root, the SlurmUser or
#   SLURMDB_ADMIN_SUPER_USER (Administrator);
# * a job's admin_comment (POST /job/{id}): src/slurmctld/job_mgr.c _update_job requires validate_super_user()
#   (twice: before the job_submit plugin and where it sets the field), and so does a signal that carries one
#   (DELETE /jobs/ with admin_comment: proc_req.c _slurm_rpc_kill_jobs);
# * signal another user's job (DELETE /jobs/): job_mgr.c _apply_signal_jobs_filter / _check_access_job_ptr,
#   requeue (GET /job/{id}/requeue): _job_requeue_op, begin time and hold/release (POST /job/{id}):
#   _update_job's `privileged`: validate_operator() (SLURMDB_ADMIN_OPERATOR) suffices for these.
# Operator would do for the job calls alone; node updates and admin comments need Administrator, and no other
# field or path of the REST API as the reconciler uses it does their work at a lower level: a job's `comment`
# (Operator may write it: job_mgr.c _update_job) is its owner's to overwrite, so no record of gpufleet's; a drain
# through Slinky's cordon sync (slurm-operator drains a cordoned node's Slurm nodes with its own super-user token)
# would move the drain to the operator's identity, not lower it. What Administrator also grants, and the
# reconciler never uses: every other slurmctld update (partitions, reservations, other users' jobs' fields) and
# accounting administration (sacctmgr: users, accounts, QOS, admin levels); its token lives slurm.token_lifetime.
RECONCILER_ADMIN_LEVEL = "Administrator"


class SlurmSpec(Strict):
    namespace: K8sName = Field("slurm", description="The namespace of Slurm's pods, the operator's resources and the Slurm Token.")
    cluster_name: K8sName = Field("gpufleet", max_length=CLUSTER_NAME_MAX,
                                  description=f"Slurm's ClusterName (at most {CLUSTER_NAME_MAX} characters: the "
                                  "operator's webhook refuses more).")
    operator: OperatorSpec = Field(default_factory=OperatorSpec, description="SchedMD's slurm-operator: how it is installed.")
    image_tag: str = Field(SLURM_IMAGE_TAG, min_length=1,
                           description=f"Tag of SchedMD's Slurm images: Slurm {SLURM_VERSION}, as the pinned operator "
                           "release ships it (the reconciler speaks its REST API, " + SLURM_REST_VERSION + ").")
    controller_storage: ControllerStorage = Field(default_factory=ControllerStorage)
    nodeset_update: NodeSetUpdate = Field(default_factory=NodeSetUpdate)
    return_to_service: Literal[0, 1, 2] = Field(
        2, description="slurm.conf ReturnToService, declared by the stack (the operator sets none since 1.2.0, and "
        "Slurm's default is 0). 2: a DOWN node whose slurmd registers again takes jobs, so a NodeSet pod that comes "
        "back to the same node (a loan taken back, a rolling update) is usable; a DRAIN stays.")
    disable_root_jobs: bool = Field(
        True, description="slurm.conf DisableRootJobs=YES, declared by the stack: root runs no job, so a token or key "
        "that acts as root submits nothing. Off only for the local cluster, whose tests and demos submit as root.")
    gres_conf: str | None = Field(
        None, description="gres.conf among the Controller's config files; default: gpufleet's, `AutoDetect=nvidia` "
        "(slurmd finds the GPUs itself). A cluster without GPU devices declares its own.")
    cgroup_conf: str | None = Field(
        None, description="cgroup.conf among the Controller's config files; default: the operator's own "
        "(CgroupPlugin=cgroup/v2, IgnoreSystemd=yes). `CgroupPlugin=disabled` where nodes have no cgroup2 mount.")
    extra_conf: list[SlurmConfLine] = Field(
        default_factory=list, description="More slurm.conf lines (`Key=Value`), appended to the Controller's "
        "extraConf in every environment that declares them.")
    image_registry: str = Field("ghcr.io/slinkyproject", description="Registry of SchedMD's Slurm images.")
    image_digests: dict[Literal[SLURM_IMAGES], Digest] = Field(
        default_factory=dict,
        description="Digest of each Slurm image at image_tag (the release records them: a tag can be moved); "
                    "an image with a digest is pulled as registry/name:tag@digest.")
    partitions: list[Partition] = Field(min_length=1, description="Slurm's partitions, each over pools.")
    login: LoginSpec = Field(default_factory=LoginSpec, description="The login nodes and their SSH Service.")
    accounting: AccountingSpec = Field(default_factory=AccountingSpec)
    restapi: bool = Field(True, description="Run slurmrestd (the reconciler's way to Slurm).")
    reconciler_user: str = Field(
        "gpufleet", min_length=1, pattern=r"^[a-z_][a-z0-9_-]*$",
        description="Slurm user of the reconciler's token: a dedicated user the stack declares in accounting with "
        f"AdminLevel {RECONCILER_ADMIN_LEVEL} (components/slinky.py SlurmUsers), never root or the SlurmUser "
        "(slurmctld treats both as root); accounting must be on.")
    token_lifetime: str = Field(
        "24h", pattern=r"^\d+(h|m|s)$",
        description="Lifetime of the reconciler's Slurm JWT (its Slinky Token's). slurm-operator 1.2.1 re-mints it on "
        "time only when 4/5 of it is longer than the operator's informer resync (at most 11 h), so from 14h up; "
        "a shorter one is re-minted when the reconciler nudges its Token (components/slinky.py says why).")
    munge_key_secret: str = Field("mungeKey", description="Pulumi secret config key holding the munge key.")
    jwt_key_secret: str = Field("slurmJwtKey", description="Pulumi secret config key holding the Slurm JWT key.")

    def image(self, name: str) -> str:
        """One of SchedMD's Slurm images: by tag, and by digest where the stack file records one."""
        digest = self.image_digests.get(name)  # type: ignore[call-overload]
        return f"{self.image_registry}/{name}:{self.image_tag}" + (f"@{digest}" if digest else "")
    @model_validator(mode="after")
    def _slurm_release(self) -> "SlurmSpec":
        if not (self.image_tag == SLURM_VERSION or self.image_tag.startswith(SLURM_VERSION + "-")):
            raise FieldError("image_tag", f"{self.image_tag!r}: the pinned slurm-operator {SLINKY_RELEASE} ships Slurm "
                             f"{SLURM_VERSION} ({SLURM_IMAGE_TAG}), whose REST API ({SLURM_REST_VERSION}) the "
                             f"reconciler speaks; use a {SLURM_VERSION}-* tag")
        return self


# --- healing -----------------------------------------------------------------------------

class JobOwners(Strict):
    """Whose jobs a webhook tells: the Slurm users and accounts (`*`: everyone's)."""

    users: list[str] = Field(default_factory=list, description="Slurm users whose jobs it tells of (`*`: all).")
    accounts: list[str] = Field(default_factory=list, description="Slurm accounts whose jobs it tells of (`*`: all).")
    max_per_job_per_hour: int = Field(6, ge=1, le=100, description="Messages about one job at most, per hour.")

    @model_validator(mode="after")
    def _someone(self) -> "JobOwners":
        if not self.users and not self.accounts:
            raise FieldError("users", "name at least one Slurm user or account (or \"*\")")
        return self


class WebhookTarget(Strict):
    type: Literal["webhook"] = Field(description="An HTTPS webhook.")
    name: K8sName = Field(description="The target's name, in logs and metrics.")
    url_secret: str = Field(min_length=1, description="Pulumi secret config key with the URL (it carries a token).")
    job_owners: JobOwners | None = Field(
        None, description="A route to the owners of these users' or accounts' jobs: it gets a message when gpufleet "
        "signals, requeues, holds or resumes one of their jobs (with the user, account and job in the payload), "
        "and none of the on-call pages.")


class SnsTarget(Strict):
    type: Literal["sns"] = Field(description="An AWS SNS topic.")
    name: K8sName = Field(description="The target's name, in logs and metrics.")
    topic_arn: str = Field(pattern=r"^arn:aws[a-z-]*:sns:", description="The topic's ARN.")
    region: str = Field("us-east-1", description="The topic's AWS region.")


NotificationTarget = Annotated[WebhookTarget | SnsTarget, Field(discriminator="type")]


# The capacity-request placeholders' image: it never runs anything. Pinned by the digest of registry.k8s.io's
# pause 3.10 (its manifest list).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a"


class ReconcilerDeployment(Strict):
    namespace: K8sName = Field("gpufleet-system", description="The reconciler's namespace (Pod Security level restricted).")
    agent_namespace: K8sName = Field(
        "gpufleet-agent", description="The node agent's namespace, of its own: Pod Security level privileged (it mounts "
                                      "the host's /dev/kmsg), so the reconciler's stays restricted.")
    placeholder_image: Image = Field(PAUSE_IMAGE, description="Image of the capacity-request placeholder pods.")
    agent_kmsg_device: LabelKey | None = Field(
        None, description="The extended resource a device plugin on the GPU nodes advertises for /dev/kmsg (e.g. "
                          "squat.ai/kmsg): the agent then runs unprivileged with CAP_SYSLOG only. Without one it runs "
                          "privileged: a container's device cgroup admits /dev/kmsg only then.")
    image: Image = Field("ghcr.io/gpufleet/reconciler:0.1.0", description="The reconciler's image (by digest in prod: the release records it).")
    replicas: int = Field(2, ge=1, le=5, description="Reconciler pods; one leads through a Lease.")
    agent_image: Image = Field("ghcr.io/gpufleet/agent:0.1.0", description="The node agent's image (by digest in prod).")
    workers: int = Field(16, ge=1, le=256, description="Nodes reconciled in parallel (each node by one worker at a time).")
    iam_role_arn: str | None = Field(
        None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+",
        description="IAM role for the reconciler's ServiceAccount (IRSA): Auto Scaling and SNS calls use it.")


def _xid_actions(where: str, actions: dict[int, FaultAction], top: int) -> None:
    for code in actions:
        if not 1 <= code <= top:
            raise FieldError(f"{where}.{code}", f"{code} is not a code: 1 to {top}")


class FaultActions(Strict):
    """The spec's word over the catalogue's: an action per code, final (NVIDIA's rules for that code,
    such as Xid 154's label, no longer apply)."""

    xid: dict[int, FaultAction] = Field(default_factory=dict, description="Xid code -> action, e.g. {94: reset-gpu}.")
    sxid: dict[int, FaultAction] = Field(default_factory=dict, description="NVSwitch SXid code -> action (fatal or not).")
    gpu_lost: FaultAction | None = Field(None, description="A GPU lost at probe time (no Xid); default reboot.")

    @model_validator(mode="after")
    def _codes(self) -> "FaultActions":
        _xid_actions("xid", self.xid, 65535)
        _xid_actions("sxid", self.sxid, 999999)
        return self


class RepeatRule(Strict):
    """NVIDIA's WORKFLOW_XID_13 and _31: the same application error on the same GPU (for 13, the same GPC
    and TPC where the line names them), again, may be the hardware: RUN_DCGMEUD, diagnostics; once, or on
    different GPUs, it is the job's. Defaults: NVSentinel's health-events-analyzer (twice within 24 h)."""

    xids: list[int] = Field(default_factory=lambda: [13, 31], description="Codes counted per GPU.")
    count: int = Field(2, ge=2, le=1000, description="Occurrences on one GPU within the window that may be hardware.")
    window_seconds: int = Field(86400, ge=1, le=7 * 86400, description="The window the occurrences are counted in.")
    action: FaultAction = Field(FaultAction.DIAGNOSE, description="What such a GPU needs: diagnose (diagnostics "
                                "asked, the node stays in service), or any other action (final, as an override).")
    diagnose_wait_seconds: int = Field(
        43200, ge=600, le=14 * 86400,
        description="A node asked for diagnostics is drained in Slurm (its job runs on to its end) and checked once "
                    "idle; if its job runs longer than this, a person is paged once and the node stays drained (a "
                    "GPU that may be faulty takes no new job; undraining would also never let the check run).")


class FaultsSpec(Strict):
    """How GPU faults are classified: NVIDIA's catalogue (fleetspec/faults/catalogue.py), NVIDIA's rules,
    and these overrides. The reconciler and the node agent read the same effective catalogue."""

    actions: FaultActions = Field(default_factory=FaultActions, description="Overrides: an action per code.")
    repeats: RepeatRule = Field(default_factory=RepeatRule, description="Application errors repeated on one GPU.")


class ConditionSource(Strict):
    """A node condition another detector sets (NVSentinel, node-problem-detector, a cloud's agent), and
    how its fault is read: its code from the reason or the message (a pattern with a `code` group, and
    optionally `pci`), or the driver's own lines in the message (`read: kernel-log`, as NPD copies them)."""

    type: LabelKey = Field(description="The condition type, e.g. SysLogsXIDError or AcceleratedHardwareReady.")
    fault_status: Literal["True", "False"] = Field(
        "True", description="The status that means a fault: True for NVSentinel and NPD, False for *Ready types.")
    read: Literal["pattern", "kernel-log"] = Field("pattern", description="`pattern`: the code from the reason or message patterns; `kernel-log`: the driver's lines in the message.")
    reason_pattern: str | None = Field(None, description="Regex on the reason; groups `code`, `pci`.")
    message_pattern: str | None = Field(None, description="Regex on the message (its first 1024 characters).")
    kind: Kind = Field(Kind.XID, description="What the codes read are: xid or sxid.")
    action: FaultAction | None = Field(None, description="The action when no code is read (a reason that names none).")
    actions: dict[int, FaultAction] = Field(default_factory=dict, description="Per code, over the catalogue, this source only.")

    @model_validator(mode="after")
    def _readable(self) -> "ConditionSource":
        patterns = {"reason_pattern": self.reason_pattern, "message_pattern": self.message_pattern}
        if self.kind is Kind.NODE_LOST:
            raise FieldError("kind", "node-lost is read from the node's Ready condition, not from a source: "
                             "set healing.node_lost_after_seconds")
        if self.kind is Kind.SLURM_DRAIN:
            raise FieldError("kind", "slurm-drain is read from Slurm's own drains, not from a source: "
                             "see healing.slurm_drains")
        if self.read == "kernel-log":
            extra = [k for k, v in patterns.items() if v]
            if extra:
                raise FieldError(extra[0], "read: kernel-log reads the driver's lines in the message; drop the pattern")
        elif not any(patterns.values()) and self.action is None and self.kind is not Kind.GPU_LOST:
            raise FieldError("reason_pattern", "say how a fault is read: reason_pattern or message_pattern with a "
                             "`code` group, read: kernel-log, or one action for every fault of this type")
        for key, value in patterns.items():
            if value is None:
                continue
            try:
                rx = re.compile(value)
            except re.error as e:
                raise FieldError(key, f"not a regular expression: {e}") from None
            unknown = set(rx.groupindex) - {"code", "pci"}
            if unknown:
                raise FieldError(key, f"unknown groups {sorted(unknown)}: only `code` and `pci` are read")
            if "code" not in rx.groupindex and self.action is None:
                raise FieldError(key, "needs a (?P<code>...) group, or an `action` for every fault it matches")
        if self.kind is Kind.GPU_LOST and (self.read != "pattern" or any(patterns.values())):
            raise FieldError("kind", "gpu-lost has no codes to read: drop the patterns (its action is `action`, "
                             "default reboot)")
        _xid_actions("actions", self.actions, 999999)
        return self


class HealingSpec(Strict):
    enabled: bool = Field(True, description="Heal faulted nodes; off: nothing is done.")
    dry_run: bool = Field(False, description="Decide and record, but change nothing.")
    condition_types: list[LabelKey] = Field(
        default_factory=lambda: [labels.GPU_CONDITION], min_length=1,
        description="Conditions in gpufleet's own format; the node agent writes the first.")
    condition_sources: list[ConditionSource] = Field(
        default_factory=list, description="Conditions other detectors set, and how their faults are read.")
    faults: FaultsSpec = Field(default_factory=FaultsSpec, description="What each GPU fault needs, over NVIDIA's catalogue.")
    occurrences: int = Field(1, ge=1, description="Signals of a critical XID within the window before acting.")
    occurrence_window_seconds: int = Field(600, ge=1, description="The window `occurrences` are counted in.")
    grace_period_seconds: int = Field(120, ge=0, le=3600, description="SIGTERM to kill, for the job to checkpoint.")
    drain_timeout_seconds: int = Field(300, ge=10, le=7200, description="How long the eviction of a faulted node's pods may take before its NodeSet pods are deleted.")
    node_lost_after_seconds: int = Field(
        300, ge=30, le=86400,
        description="An active node carrying a NodeSet pod, or a node on loan, whose Ready condition has not been "
                    "True for this long is "
                    "a lost machine: healed like a fault (its NodeSet pod force-deleted, its job moved to a spare), "
                    "then power-cycled by the repair loop where its provider can (aws-asg), else retired. 300 s: "
                    "Kubernetes' default not-ready/unreachable toleration.")
    slurm_drains: Literal["act", "ignore"] = Field(
        "act",
        description="A node Slurm drained itself (slurmctld's or slurmd's own reason, e.g. `Kill task failed`, "
                    "`Prolog error`, a GPU missing at registration): act: rebooted or health-checked as its reason asks, "
                    "then returned with Slurm's drain lifted; ignore: left drained for a person (spares still avoid it).")
    job_boundary_max_seconds: int = Field(
        86400, ge=0, le=30 * 86400,
        description="A fault NVIDIA resolves with DRAIN_AND_RESET (Xid 48 with 63/64, Xid 154 'Drain and Reset') waits "
                    "for its job's boundary: the node's Slurm nodes are drained (the running job finishes, no new job "
                    "lands) and it is healed once they run no job. Past this long after the fault (for a telemetry row that "
                    "waits so: after its drain), a job still running there is moved at a checkpoint (SIGTERM and the "
                    "grace period) like any fault's. 0: never wait.")
    max_concurrent: int = Field(2, ge=1, description="Remediations in progress at once.")
    max_unhealthy_fraction: float = Field(
        0.2, gt=0, le=1, description="Above this fraction of a pool's declared nodes (its spares not counted) out "
        "for a fault now (contained, replaced, or quarantined and not yet repaired), replace none and page."
    )
    unhealthy_window_seconds: int = Field(
        900, ge=1, description="How long a spare that broke standing in for a faulted node still counts as that "
        "node's position (the brake counts it once), and a finished record is kept at least.")
    admission_hold_seconds: int = Field(
        0, ge=0, le=600,
        description="A contained fault waits this long after it was detected before it may be replaced, so "
                    "the brake weighs a burst of faults as a whole (containment never waits).",
    )
    max_attempts_per_node: int = Field(2, ge=1, description="Remediations of one node within the window before it is quarantined for a human.")
    attempts_window_seconds: int = Field(86400, ge=60, description="The window `max_attempts_per_node` is counted in.")
    refill_timeout_seconds: int = Field(
        1800, ge=10, le=86400,
        description="A capacity request (kubernetes-spares) nobody answers within this long is a failed refill: "
                    "withdrawn, paged, counted; the record says so.")
    record_retention_days: int = Field(
        30, ge=1, description="Finished remediation records older than this (and than the attempts and unhealthy "
        "windows, which count them) are deleted.")
    retry_budget_seconds: int = Field(
        900, ge=10, le=86400,
        description="How long one step may keep failing on temporary errors (Slurm or API server down) before Failed.",
    )
    opt_out_label: LabelKey = Field(labels.DEFAULT_OPT_OUT, description="A node or pod carrying it (any value but false) is not replaced nor repaired: a person decides.")
    notifications: list[NotificationTarget] = Field(default_factory=list, description="Where pages go (webhooks, SNS), and job owners' routes.")
    prometheus_rule: bool = Field(
        False, description="The cluster runs the Prometheus operator: ship gpufleet's alert rules as a PrometheusRule "
        "(a page that could not be delivered, the storm brake, failed remediations).")
    grafana_dashboard: bool = Field(
        False, description="The cluster runs Grafana with its dashboard sidecar (kube-prometheus-stack): ship "
        "gpufleet's fleet-health dashboard as a ConfigMap labelled grafana_dashboard=1.")
    reconciler: ReconcilerDeployment = Field(default_factory=ReconcilerDeployment, description="The reconciler's and the node agent's deployment.")
    repair: RepairSpec = Field(default_factory=RepairSpec, description="The repair loop after a heal.")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec,
                                     description="GPU telemetry (dcgm-exporter): degraded GPUs, hangs, stragglers.")

    def health_check_image(self) -> str:
        """The image of the health-check Jobs (reconciler/adapters/health_checks.py): the check's own, else the
        node agent's. The only image the reconciler's Job admission policy admits (components/admission.py)."""
        return self.repair.health_check.image or self.reconciler.agent_image

    @model_validator(mode="before")
    @classmethod
    def _no_critical_xids(cls, data: object) -> object:
        if isinstance(data, dict) and "critical_xids" in data:
            raise FieldError("critical_xids", "replaced by faults.actions: every Xid now takes NVIDIA's action "
                             "(fleetspec/faults/catalogue.py); to change one, set e.g. faults: {actions: {xid: "
                             "{94: reset-gpu}}}")
        return data

    @model_validator(mode="after")
    def _xids(self) -> "HealingSpec":
        types = [s.type for s in self.condition_sources]
        for i, t in enumerate(types):
            if t in self.condition_types:
                raise FieldError(f"condition_sources[{i}].type", f"{t} is in condition_types (gpufleet's own "
                                 "format); a type is read one way")
            if t in types[:i]:
                raise FieldError(f"condition_sources[{i}].type", f"{t} is listed twice")
        names = [n.name for n in self.notifications]
        if len(names) != len(set(names)):
            raise FieldError("notifications", f"names must be unique: {names}")
        return self


# --- the system pool -----------------------------------------------------------------------

class Toleration(Strict):
    key: LabelKey = Field(description="The taint's key tolerated.")
    operator: Literal["Equal", "Exists"] = Field("Exists", description="Equal: the value must match; Exists: any value.")
    value: str | None = Field(None, description="The value, with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="The effect tolerated; none: all.")


class SystemPool(Strict):
    """The nodes where the reconciler and the Slinky operator run (not GPU nodes)."""

    node_selector: Labels = Field(default_factory=lambda: {labels.SYSTEM_NODE: "true"}, min_length=1,
                                  description="Labels under node-restriction.kubernetes.io/ the platform sets on its "
                                  "system nodes.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints of the system nodes the reconciler and the operator tolerate.")

    @model_validator(mode="after")
    def _trusted(self) -> "SystemPool":
        if (e := trusted_selector_error("node_selector", dict(self.node_selector),
                                        "a system node (the reconciler, slurmctld and the Slurm key)")):
            raise e
        return self


# --- the whole fleet ---------------------------------------------------------------------------

class NetworkSpec(Strict):
    """What the stack's NetworkPolicies let the reconciler, the agent and slurmrestd reach (enforced where the
    cluster's network plugin enforces NetworkPolicies)."""

    policies: bool = Field(True, description="Declare the NetworkPolicies.")
    api_server_cidrs: list[Cidr] = Field(
        default_factory=lambda: ["0.0.0.0/0"], min_length=1,
        description="Where the API server's endpoints are (a NetworkPolicy cannot name a Service outside the "
                    "pod network); narrow it to the control plane's addresses where they are known.")
    api_server_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [443, 6443], min_length=1, description="The API server's ports.")
    https_egress_cidrs: list[Cidr] = Field(
        default_factory=lambda: ["0.0.0.0/0"],
        description="Where the reconciler may open HTTPS (port 443): webhooks, SNS, Auto Scaling. Empty: nowhere.")
    metrics_namespaces: list[K8sName] = Field(
        default_factory=lambda: ["monitoring"], description="Namespaces whose pods may scrape the reconciler's metrics.")


class FleetSpec(Strict):
    """One environment's training cluster."""

    environment: K8sName = Field(description="The environment's name (local, staging, prod, ...).")
    cluster: ClusterSpec = Field(description="How to reach the Kubernetes cluster.")
    pools: list[NodePool] = Field(min_length=1, description="The GPU node pools, each with its active nodes and spares.")
    storage: list[StorageSpec] = Field(default_factory=list, description="Shared storage mounted in every Slurm pod (checkpoints).")
    slurm: SlurmSpec = Field(description="Slurm through Slinky: the operator, images, partitions, accounting.")
    healing: HealingSpec = Field(default_factory=HealingSpec, description="How faults are detected, healed, repaired and paged.")
    system_pool: SystemPool = Field(default_factory=SystemPool, description="Where the reconciler and the operator run.")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="What the NetworkPolicies let through.")

    @model_validator(mode="after")
    def _references(self) -> "FleetSpec":
        _unique("pools", [p.name for p in self.pools])
        _unique("storage", [s.name for s in self.storage])
        _unique("slurm.partitions", [p.name for p in self.slurm.partitions])
        pools = {p.name for p in self.pools}
        for i, part in enumerate(self.slurm.partitions):
            missing = [p for p in part.pools if p not in pools]
            if missing:
                raise FieldError(
                    f"slurm.partitions[{i}].pools",
                    f"partition {part.name!r} names pool(s) {missing} that are not declared; declared pools: {sorted(pools)}",
                )
        if sum(p.default for p in self.slurm.partitions) > 1:
            raise FieldError("slurm.partitions", "at most one partition may be the default")
        if self.slurm.reconciler_user in ("root", SLURM_USER) and self.cluster.kind != "local":
            raise FieldError("slurm.reconciler_user", f"{self.slurm.reconciler_user!r} is a super user to slurmctld "
                             "(root or the SlurmUser): the reconciler acts as a dedicated Slurm user (default "
                             f"'gpufleet', AdminLevel {RECONCILER_ADMIN_LEVEL}), allowed only on the local cluster")
        if self.slurm.reconciler_user not in ("root", SLURM_USER) and self.slurm.restapi \
                and not self.slurm.accounting.enabled:
            raise FieldError("slurm.accounting.enabled", f"the reconciler's Slurm user {self.slurm.reconciler_user!r} "
                             f"gets its AdminLevel ({RECONCILER_ADMIN_LEVEL}) from accounting: turn accounting on "
                             "(slurm.accounting, with its database)")
        if not self.slurm.disable_root_jobs and self.cluster.kind != "local":
            raise FieldError("slurm.disable_root_jobs", "root's jobs may be allowed only on the local cluster")
        for i, s in enumerate(self.storage):
            if s.host_path and self.cluster.kind != "local":
                raise FieldError(f"storage[{i}].host_path", "host_path is only for the local cluster")
        needs_aws = [p.name for p in self.pools if p.provider == "aws-asg"] + \
            [n.name for n in self.healing.notifications if isinstance(n, SnsTarget)]
        if needs_aws and self.cluster.kind != "local" and not self.healing.reconciler.iam_role_arn:
            raise FieldError("healing.reconciler.iam_role_arn",
                             f"{needs_aws} call AWS: name the IAM role the reconciler's ServiceAccount assumes (IRSA)")
        declared: dict[str, int] = {}
        for i, p in enumerate(self.pools):
            if p.lending is None:
                continue
            b = p.lending.borrowers
            if declared.setdefault(b.priority_class, b.priority) != b.priority:
                raise FieldError(f"pools[{i}].lending.borrowers.priority",
                                 f"PriorityClass {b.priority_class!r} is declared once, with one value: another pool "
                                 f"gives it {declared[b.priority_class]}, this one {b.priority}")
        dep = self.healing.reconciler
        if dep.agent_namespace in (dep.namespace, self.slurm.namespace):
            raise FieldError("healing.reconciler.agent_namespace",
                             f"{dep.agent_namespace!r} is also the reconciler's or Slurm's namespace: the node agent needs "
                             f"one of its own (Pod Security level privileged), so theirs can stay restricted")
        for i, p in enumerate(self.pools):
            if p.active_checks is not None and (e := active_check_errors(
                    p.active_checks, pool_size=p.nodes + p.spares, repair_enabled=self.healing.repair.enabled,
                    check_timeout_seconds=self.healing.repair.health_check.timeout_seconds)):
                raise FieldError(f"pools[{i}].active_checks" + (f".{e[0]}" if e[0] else ""), e[1])
        check = self.healing.repair.health_check
        if self.cluster.kind != "local" and not check.command:
            if check.allow_skip:
                raise FieldError("healing.repair.health_check.allow_skip", f"{check.allow_skip}: a check may be skipped "
                                 "only on the local cluster; elsewhere a node serves only once every check proved it "
                                 "(run the check from an image that has the tools: healing.repair.health_check.image)")
            if check.dcgm_level is None:
                raise FieldError("healing.repair.health_check.dcgm_level", "DCGM's diagnostic may be left out only on "
                                 "the local cluster: it is part of what proves a node (level 2 or more)")
            if not check.all_reduce:
                raise FieldError("healing.repair.health_check.all_reduce", "the all-reduce may be left out only on the "
                                 "local cluster: it proves the NVLinks and the bandwidth between the node's GPUs")
        if self.healing.enabled and not self.slurm.restapi:
            raise FieldError("slurm.restapi", "the reconciler reaches Slurm through slurmrestd: keep restapi on "
                             "while healing is enabled")
        return self

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.pools if p.name == name)

    def lending_pools(self) -> list[NodePool]:
        """The pools that lend idle GPUs; the stack grants the reconciler lending's calls only when there are some."""
        return [p for p in self.pools if p.lending is not None]

    def borrower_classes(self) -> dict[str, int]:
        """PriorityClass name -> value for the pools' borrowers (one value per name: the validator saw to it)."""
        return {p.lending.borrowers.priority_class: p.lending.borrowers.priority
                for p in self.pools if p.lending is not None}

    @property
    def checkpoint_storage(self) -> StorageSpec | None:
        return self.storage[0] if self.storage else None

    def secret_keys(self) -> list[str]:
        """Config keys that must hold Pulumi secrets."""
        keys = [self.slurm.munge_key_secret, self.slurm.jwt_key_secret]
        if self.slurm.accounting.enabled and self.slurm.accounting.database is not None:
            keys.append(self.slurm.accounting.database.password_secret)
        keys += [n.url_secret for n in self.healing.notifications if isinstance(n, WebhookTarget)]
        return keys


def _unique(where: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise FieldError(f"{where}[{names.index(dupes[0], names.index(dupes[0]) + 1)}].name", f"duplicate name(s) {dupes}")
