"""`gpufleet capacity` against a real API server: the Nodes alone, then the ledger ConfigMap the
reconciler writes, then a cluster that does not answer (exit 1). The stack file names the cluster
(cluster.kubeconfig and context) and the reconciler's namespace, as a real stack's does."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from gpufleet.fleetspec import labels
from gpufleet.cli import app
from localenv.control_plane import CONTEXT_NAME
from gpufleet.fleetspec import ledger as L
from gpufleet.reconciler.core import ledger as B

pytestmark = pytest.mark.integration
NS = "gpufleet-cap"


def stack_doc(kubeconfig: str) -> dict:
    return {"config": {"gpufleet:fleet": {
        "environment": "itest", "cluster": {"kind": "kubeconfig", "kubeconfig": kubeconfig, "context": CONTEXT_NAME},
        "pools": [{"name": "cap", "node_type": "x", "gpu_model": "H100", "gpus_per_node": 8, "nodes": 2, "spares": 2,
                   "lending": {"spares": True, "idle_nodes": True, "spare_floor": 1,
                               "borrowers": {"selector": {"app.kubernetes.io/name": "inference"}}}}],
        "slurm": {"partitions": [{"name": "p", "pools": ["cap"]}]},
        "healing": {"reconciler": {"namespace": NS}}}}}


def capacity(tmp_path, monkeypatch, kubeconfig: str) -> tuple[int, str]:
    (tmp_path / "Pulumi.itest.yaml").write_text(yaml.safe_dump(stack_doc(kubeconfig)))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["capacity", "--stack", "itest", "--json"], env={"NO_COLOR": "1"})
    return r.exit_code, r.output


def test_capacity_reads_the_nodes_then_the_ledger(kube_cluster, tmp_path, monkeypatch):
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    role = lambda r, lent=None: {labels.NODE_POOL: "cap", labels.ROLE: r, **({labels.LENT: lent} if lent else {})}  # noqa: E731
    gpus = {"nvidia.com/gpu": "8"}
    kube_cluster.create_fake_node("cap-0", labels=role(labels.ROLE_ACTIVE), capacity=gpus)
    kube_cluster.create_fake_node("cap-1", labels=role(labels.ROLE_ACTIVE, labels.LENT_IDLE), capacity=gpus)
    kube_cluster.create_fake_node("cap-spare-0", labels=role(labels.ROLE_SPARE, labels.LENT_SPARE), capacity=gpus)
    kube_cluster.create_fake_node("cap-spare-1", labels=role(labels.ROLE_SPARE), capacity=gpus)
    kubeconfig = str(kube_cluster.kubeconfig_path)

    code, out = capacity(tmp_path, monkeypatch, kubeconfig)  # no namespace, no ledger yet: a 404, not an error
    assert code == 0, out
    (pool,) = json.loads(out)["pools"]
    assert (pool["source"], pool["active_busy"], pool["active_lent"], pool["spares_lent"], pool["spares_unlent"],
            pool["gpus_lent"]) == ("nodes", None, 1, 1, 1, 16)

    now = datetime.now(timezone.utc)
    led = B.open_loan(L.empty(now), "cap-spare-0", "spare", 8, now - timedelta(hours=2))
    led = B.record_capacity(led, L.Capacity(active_busy=1, active_lent=1, spares_lent=1, spares_unlent=1,
                                            gpus_lent=16), now)
    core.create_namespace({"metadata": {"name": NS}})
    core.create_namespaced_config_map(NS, {"metadata": {"name": labels.LENDING_LEDGER}, "data": {"cap": L.dump(led)}})
    code, out = capacity(tmp_path, monkeypatch, kubeconfig)
    assert code == 0, out
    (pool,) = json.loads(out)["pools"]
    assert (pool["source"], pool["active_busy"], pool["active_idle"], pool["gpus_lent"]) == ("ledger", 1, 0, 16)
    assert 15.9 < pool["gpu_hours_lent"] < 16.2  # 8 GPUs for 2 h (and the seconds the test took)


def test_an_unreachable_cluster_exits_1(kube_cluster, tmp_path, monkeypatch):
    from localenv.ports import free_ports

    doc = yaml.safe_load(kube_cluster.kubeconfig_path.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{free_ports(1)[0]}"  # nobody listens there
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(doc))
    code, out = capacity(tmp_path, monkeypatch, str(dead))
    assert code == 1 and "cluster unreachable" in out and str(dead) in out, out
