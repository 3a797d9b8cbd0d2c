"""LocalEnv's Slurm side: Slurm 26.05 with slurmrestd, and the Slinky stand-in acting on NodeSet
resources as the stack declares them (applied here directly, without the Pulumi engine)."""
from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.components.slinky import API_VERSION, GROUP, VERSION, crd_manifest
from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.fleetspec.placement import worker_selector, worker_tolerations
from localenv.env import LocalEnv
from localenv.slinky_standin import POD_HOSTNAME_LABEL
from gpufleet import local_cluster
from gpufleet.paths import PROJECT_DIR
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.slurm import make_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def nodeset(pool) -> dict:
    """As components/slinky.py declares a pool's NodeSet (the parts the operator places pods by)."""
    return {"apiVersion": API_VERSION, "kind": "NodeSet", "metadata": {"name": pool.name, "namespace": "slurm"},
            "spec": {"controllerRef": {"name": "slurm", "namespace": "slurm"}, "replicas": pool.nodes,
                     "slurmd": {"image": "slurmd", "resources": {"limits": {"nvidia.com/gpu": pool.gpus_per_node}}},
                     "template": {"spec": {"nodeSelector": worker_selector(pool),
                                           "tolerations": worker_tolerations(pool)}}}}


def test_local_env_runs_slurm_nodes_for_the_nodeset_pods(kube_bin_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUFLEET_LOCAL_DIR", str(tmp_path))
    monkeypatch.setenv(local_cluster.STATE_ENV, str(tmp_path / "env.json"))
    spec = load_stack_file(PROJECT_DIR / "Pulumi.local.yaml").fleet
    env = LocalEnv(spec, root=tmp_path, bin_dir=kube_bin_dir, ports=LocalEnv.free_ports(spec), progress=print)
    try:
        env.up()
        st = env.status()
        assert st["slinky_standin"].startswith("running") and st["slurm"]["rest"] is True
        assert st["autoscaler_standin"].startswith("running")
        assert st["slurm"]["nodes"] == {}  # no NodeSet declared yet: no Slurm node, as with the operator
        api = env.kube.api_client()
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest("NodeSet"))
        def served() -> bool:
            try:
                return any(r.name == "nodesets"
                           for r in client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources)
            except ApiException:
                return False
        wait_for("the NodeSet kind served", served, 30)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "slurm"}})
        for pool in spec.pools:
            client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, "slurm", "nodesets",
                                                                         nodeset(pool))
        env.wait_slurm_nodes()
        names = env.slurm_node_names()
        assert names == ["h100-0", "h100-1", "l40s-0"]
        pods = {p.metadata.labels[POD_HOSTNAME_LABEL]: p for p in client.CoreV1Api(api).list_namespaced_pod("slurm").items}
        assert set(pods) == set(names)
        nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
        for name, pod in pods.items():
            assert pod.metadata.name == name  # <nodeset>-<ordinal> (utils.go GetOrdinalPodName)
            kube_node = nodes[pod.spec.node_name]
            assert kube_node.metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE  # never on a spare
            assert pod.spec.node_name.startswith("kwok-") and pod.spec.node_name != name  # two names, two things
        # The reconciler's default path: --slurm rest with the URL and key the environment recorded.
        recorded = local_cluster.find()
        assert recorded is not None and recorded.kubeconfig == env.kube.kubeconfig_path
        rest = make_client("rest", url=recorded.slurm_rest_url, jwt_key_file=recorded.slurm_jwt_key)
        seen = {n.name: json.loads(n.comment) for n in rest.nodes()}
        assert {k: v["node"] for k, v in seen.items()} == {k: p.spec.node_name for k, p in pods.items()}
        assert all(v["nodeSetUID"] for v in seen.values())
        env.stop_standin()
        assert env.status()["slinky_standin"] == "stopped"
        env.start_standin()  # supervised again; the running slurmds are kept
        assert set(env.slurm.wanted_nodes()) == set(names)
    finally:
        env.down()
    assert not any(env.slurm.status()["daemons"].values())
