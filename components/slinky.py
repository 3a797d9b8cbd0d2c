"""Slurm on Kubernetes through SchedMD's Slinky: the operator and the Slurm custom resources.

`operator.mode: helm` installs the slurm-operator-crds and slurm-operator charts;
`crds-only` installs gpufleet's own definitions of the Slinky kinds instead (the chart
cannot be pulled everywhere, e.g. the local environment), so the API server still accepts
the Slurm resources. One NodeSet per GPU pool, bound to the pool's nodes by selector and
tolerations; partitions map to NodeSets.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from fleetspec.models import FleetSpec

from .meta import metadata, resources
from .node_pool import GpuNodePool

GROUP = "slinky.slurm.net"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KINDS = ("Controller", "NodeSet", "LoginSet", "RestApi", "Accounting", "Token")


def _plural(kind: str) -> str:
    return kind.lower() + "s"


def crd_manifest(kind: str) -> dict:
    """A permissive definition of one Slinky kind, for clusters without the operator chart."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{_plural(kind)}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "gpufleet",
                                                                  "gpufleet.io/slinky-definitions": "crds-only"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": _plural(kind), "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    }


def slurm_conf_partitions(spec: FleetSpec) -> str:
    """Partitions for slurm.conf: each pool's NodeSet is a Slurm nodeset named after the pool."""
    lines = [f"NodeSet={p.name} Feature={p.name}" for p in spec.pools]
    for part in spec.slurm.partitions:
        line = f"PartitionName={part.name} Nodes={','.join(part.pools)} State=UP"
        if part.default:
            line += " Default=YES"
        if part.max_time:
            line += f" MaxTime={part.max_time}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass
class SlinkySlurmArgs:
    spec: FleetSpec
    pools: dict[str, GpuNodePool]
    slurm_key: pulumi.Input[str] = ""
    jwt_key: pulumi.Input[str] = ""


class SlinkySlurm(pulumi.ComponentResource):
    namespace: pulumi.Output[str]
    login_endpoint: pulumi.Output[str]
    operator_mode: str
    nodesets: dict[str, k8s.apiextensions.CustomResource]

    def __init__(self, name: str, args: SlinkySlurmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:slurm:SlinkySlurm", name, None, opts)
        spec, slurm, env = args.spec, args.spec.slurm, args.spec.environment
        child = pulumi.ResourceOptions(parent=self)
        image = lambda what: f"{slurm.image_registry}/{what}:{slurm.image_tag}"  # noqa: E731

        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=metadata(slurm.namespace, "slurm", env), opts=child)
        self.namespace = ns.metadata.name

        # The operator, or gpufleet's definitions of its kinds.
        self.operator_mode = slurm.operator.mode
        if slurm.operator.mode == "helm":
            crds = k8s.helm.v3.Release(
                f"{name}-operator-crds",
                chart=f"{slurm.operator.repository}/slurm-operator-crds", version=slurm.operator.chart_version,
                namespace=self.namespace, opts=child)
            operator = k8s.helm.v3.Release(
                f"{name}-operator",
                chart=f"{slurm.operator.repository}/slurm-operator", version=slurm.operator.chart_version,
                namespace=self.namespace, create_namespace=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[crds]))
            ready = [crds, operator]
        else:
            ready = [
                k8s.apiextensions.v1.CustomResourceDefinition(f"{name}-crd-{kind.lower()}", **_crd_args(kind), opts=child)
                for kind in KINDS
            ]

        # Keys for Slurm's own auth (auth/slurm) and slurmrestd's JWTs: Pulumi secrets in, Secrets out.
        key_secret = k8s.core.v1.Secret(
            f"{name}-slurm-key", metadata=metadata("slurm-auth-slurm", "slurm", env, self.namespace),
            string_data={"slurm.key": args.slurm_key}, opts=child)
        jwt_secret = k8s.core.v1.Secret(
            f"{name}-jwt-key", metadata=metadata("slurm-auth-jwths256", "slurm", env, self.namespace),
            string_data={"jwt_hs256.key": args.jwt_key}, opts=child)

        def cr(kind: str, cr_name: str, body: dict, depends: list | None = None) -> k8s.apiextensions.CustomResource:
            return k8s.apiextensions.CustomResource(
                f"{name}-{kind.lower()}-{cr_name}",
                api_version=API_VERSION, kind=kind,
                metadata=metadata(cr_name, f"slurm-{kind.lower()}", env, self.namespace),
                spec=body,
                opts=pulumi.ResourceOptions(parent=self, depends_on=ready + (depends or [])),
            )

        controller = cr("Controller", "slurm", {
            "clusterName": slurm.cluster_name,
            "slurmKeyRef": {"name": "slurm-auth-slurm", "key": "slurm.key"},
            "jwtHs256KeyRef": {"name": "slurm-auth-jwths256", "key": "jwt_hs256.key"},
            "slurmctld": {"image": image("slurmctld"), "resources": resources("1", "2Gi", "4", "8Gi")},
            "extraConf": slurm_conf_partitions(spec),
        }, [key_secret, jwt_secret])
        controller_ref = {"name": "slurm"}

        # Claims are named after the storage (SharedStorage creates them in this namespace).
        volumes = [{"name": s.name, "persistentVolumeClaim": {"claimName": s.name}} for s in spec.storage]
        mounts = [{"name": s.name, "mountPath": s.mount_path} for s in spec.storage]

        self.nodesets = {}
        for pool in spec.pools:
            p = args.pools[pool.name]
            self.nodesets[pool.name] = cr("NodeSet", pool.name, {
                "controllerRef": controller_ref,
                "replicas": pool.nodes,
                "slurmd": {
                    "image": image("slurmd"),
                    "resources": {"limits": {"nvidia.com/gpu": pool.gpus_per_node}},
                    "volumeMounts": mounts,
                },
                "extraConf": f"Features={pool.name} Gres=gpu:{pool.gpus_per_node}",
                "partition": {"enabled": True},
                "template": {"spec": {
                    "nodeSelector": p.selector,
                    "tolerations": p.tolerations,
                    "volumes": volumes,
                }},
            }, [controller])

        login = None
        if slurm.login.replicas:
            login = cr("LoginSet", "login", {
                "controllerRef": controller_ref,
                "replicas": slurm.login.replicas,
                "login": {"image": image("login"), "volumeMounts": mounts,
                          "resources": resources("500m", "1Gi", "2", "4Gi")},
                "rootSshAuthorizedKeys": "\n".join(slurm.login.ssh_authorized_keys),
                "template": {"spec": {"volumes": volumes}},
                "service": {"spec": {"type": "LoadBalancer"}},
            }, [controller])
        if slurm.restapi:
            cr("RestApi", "restapi", {
                "controllerRef": controller_ref, "replicas": 1,
                "slurmrestd": {"image": image("slurmrestd"), "resources": resources("250m", "512Mi", "1", "1Gi")},
            }, [controller])
        if slurm.accounting:
            cr("Accounting", "accounting", {
                "slurmKeyRef": {"name": "slurm-auth-slurm", "key": "slurm.key"},
                "jwtHs256KeyRef": {"name": "slurm-auth-jwths256", "key": "jwt_hs256.key"},
                "slurmdbd": {"image": image("slurmdbd"), "resources": resources("500m", "1Gi", "2", "4Gi")},
                "storageConfig": {"host": "mariadb", "database": "slurm_acct_db"},
            }, [controller])

        self.login_endpoint = pulumi.Output.concat("login-slurm.", self.namespace, ".svc:22") if login \
            else pulumi.Output.from_input("")
        self.register_outputs({
            "namespace": self.namespace,
            "login_endpoint": self.login_endpoint,
            "operator_mode": self.operator_mode,
            "nodesets": list(self.nodesets),
        })


def _crd_args(kind: str) -> dict:
    m = crd_manifest(kind)
    return {"metadata": m["metadata"], "spec": m["spec"]}
