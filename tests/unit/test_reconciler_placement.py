"""Where the reconciler pods run: the system pool on a cluster; on the local environment's kubelet nodes,
the host's network with the API server on loopback (what a real pod there needed)."""
from __future__ import annotations

from pathlib import Path

from gpufleet.components.reconciler import HostNetworkApi, ReconcilerArgs, placement
from gpufleet.fleetspec import load_stack_file

ROOT = Path(__file__).resolve().parents[2]


def test_on_a_cluster_the_system_pool_and_the_in_cluster_service():
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    p = placement(ReconcilerArgs(spec))
    assert p.pod == {"nodeSelector": dict(spec.system_pool.node_selector)}  # the system pool the spec declares
    assert p.env == [] and p.args == [] and "host" not in p.probe and p.strategy is None


def test_locally_the_host_network_and_the_api_server_on_loopback():
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    p = placement(ReconcilerArgs(spec, host_network_api=HostNetworkApi("127.0.0.1", 31443)))
    assert p.pod["hostNetwork"] is True and p.pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert p.pod["nodeSelector"] == {"node-restriction.kubernetes.io/gpufleet-system": "true"}  # the platform's mark
    assert {e["name"]: e["value"] for e in p.env} == {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                                      "KUBERNETES_SERVICE_PORT": "31443"}
    assert p.probe == {"path": "/healthz", "port": 9103, "host": "127.0.0.1"}  # the probes' own port
    # one pod per node (hostPort): a rollout replaces, it cannot surge
    assert p.strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_locally_the_pods_reach_the_local_slurmrestd_with_the_tokens_secret():
    from gpufleet.components.reconciler import reconciler_args

    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    p = placement(ReconcilerArgs(spec, host_network_api=HostNetworkApi("127.0.0.1", 31443, "http://127.0.0.1:26820")))
    args = [*reconciler_args(spec, slurm_url=p.slurm_url), *p.args]
    assert args[args.index("--slurm-url") + 1] == "http://127.0.0.1:26820" and "none" not in args
    assert args[args.index("--slurm-token-secret") + 1] == f"{spec.slurm.namespace}/gpufleet-reconciler-slurm-token/SLURM_JWT"
