"""The top-level component: one environment's training cluster, wired from its spec."""
from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec.models import FleetSpec

from .alerts import prometheus_rule
from .cluster import ClusterAccess, ClusterAccessArgs
from .network import declare_network_policies
from .node_pool import GpuNodePool, GpuNodePoolArgs, borrower_priority_classes
from .reconciler import NAME as RECONCILER_NAME, HostNetworkApi, Reconciler, ReconcilerArgs
from .slinky import SlinkySlurm, SlinkySlurmArgs
from .storage import SharedStorage, SharedStorageArgs


@dataclass
class GpuFleetArgs:
    spec: FleetSpec
    secrets: dict[str, pulumi.Input[str]] = field(default_factory=dict)  # config key -> secret value
    local_kubeconfig: str | None = None
    render_dir: str | None = None
    operator_chart: bool = True  # False: leave the Slinky operator's charts out (a render that cannot fetch them)
    host_network_api: HostNetworkApi | None = None  # the local environment's pods reach the API server here


class GpuFleet(pulumi.ComponentResource):
    cluster: ClusterAccess
    reconciler: Reconciler
    pools: dict[str, GpuNodePool]
    borrower_classes: dict[str, k8s.scheduling.v1.PriorityClass]
    storage: list[SharedStorage]
    slurm: SlinkySlurm

    def __init__(self, name: str, args: GpuFleetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:index:GpuFleet", name, None, opts)
        spec = args.spec
        missing = [k for k in spec.secret_keys() if k not in args.secrets]
        if missing:
            raise ValueError(f"secrets not set: {missing}; run `pulumi config set --secret KEY VALUE` for each")

        self.cluster = ClusterAccess(
            f"{name}-cluster",
            ClusterAccessArgs(spec.cluster, args.local_kubeconfig, args.render_dir),
            pulumi.ResourceOptions(parent=self),
        )
        # Every Kubernetes resource below goes through this environment's provider.
        k8s_opts = pulumi.ResourceOptions(parent=self, providers={"kubernetes": self.cluster.provider})

        webhooks = {n.name: args.secrets[n.url_secret] for n in spec.healing.notifications if n.type == "webhook"}
        self.reconciler = Reconciler(f"{name}-reconciler", ReconcilerArgs(spec, webhooks, args.host_network_api), k8s_opts)

        if spec.healing.prometheus_rule:
            prometheus_rule(f"{name}-alerts", spec, self.reconciler.namespace, k8s_opts)

        self.pools = {
            p.name: GpuNodePool(
                f"{name}-pool-{p.name}",
                GpuNodePoolArgs(p, self.reconciler.namespace, spec.environment),
                k8s_opts,
            )
            for p in spec.pools
        }
        self.borrower_classes = borrower_priority_classes(name, spec, k8s_opts)
        self.slurm = SlinkySlurm(
            f"{name}-slurm",
            SlinkySlurmArgs(
                spec, self.pools,
                slurm_key=args.secrets[spec.slurm.munge_key_secret],
                jwt_key=args.secrets[spec.slurm.jwt_key_secret],
                db_password=args.secrets[db.password_secret]
                if spec.slurm.accounting.enabled and (db := spec.slurm.accounting.database) else "",
                reconciler_namespace=self.reconciler.namespace,
                reconciler_account=RECONCILER_NAME,
                operator_chart=args.operator_chart,
            ),
            k8s_opts,
        )
        self.reconciler.grant_in_slurm_namespace(self.slurm.namespace)  # after the namespace: its output
        # What each of the reconciler, the agent and slurmrestd may reach (components/network.py).
        declare_network_policies(name, spec, pulumi.ResourceOptions.merge(
            k8s_opts, pulumi.ResourceOptions(depends_on=[self.reconciler, self.slurm])))
        # Claims live in the Slurm namespace; taking it as an output orders them after it.
        self.storage = [
            SharedStorage(f"{name}-storage-{s.name}", SharedStorageArgs(s, self.slurm.namespace, spec.environment),
                          k8s_opts)
            for s in spec.storage
        ]
        self.register_outputs({
            "environment": spec.environment,
            "kubeconfig": self.cluster.kubeconfig,
            "context": self.cluster.context,
            "slurm_namespace": self.slurm.namespace,
            "reconciler_namespace": self.reconciler.namespace,
            "login_endpoint": self.slurm.login_endpoint,
            "borrower_priority_classes": sorted(self.borrower_classes),
        })


def pool_summaries(spec: FleetSpec) -> list[dict]:
    return [
        {"name": p.name, "gpu_model": p.gpu_model, "nodes": p.nodes, "spares": p.spares,
         "gpus": p.nodes * p.gpus_per_node, "provider": p.provider}
        for p in spec.pools
    ]
