"""The local control plane (localenv.control_plane) against real kube binaries and kwok.

Needs the ``kube_cluster`` fixture (tests/fixtures/kube_cluster.py), which builds
the tools with scripts/build-kube.sh when they are not cached yet.
"""

from __future__ import annotations

import urllib.request

from pathlib import Path
from typing import Any

import pytest

from gpufleet.waiting import wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

from localenv.control_plane import COMPONENTS, DEFAULT_PORTS, KWOK_ANNOTATION, LocalKube, LocalKubeError
from localenv.ports import free_ports

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NS = "default"


def pinned(name: str) -> str:
    for line in (REPO_ROOT / "tools" / "kube" / "versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise KeyError(name)




def gpu_pod(name: str, pool: str, gpus: int = 1) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "gpufleet-it"}},
        "spec": {
            "nodeSelector": {"gpufleet.io/pool": pool},
            "tolerations": [GPU_TOLERATION],
            "containers": [{
                "name": "train",
                "image": "registry.invalid/gpufleet/train:never-pulled",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }],
        },
    }


def pod_phase(core: client.CoreV1Api, name: str) -> str | None:
    try:
        return core.read_namespaced_pod(name, NS).status.phase
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def pod_gone(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, NS)
        return False
    except ApiException as e:
        if e.status == 404:
            return True
        raise


def taint_keys(node: client.V1Node) -> set[str]:
    return {t.key for t in (node.spec.taints or [])}


@pytest.fixture(scope="module")
def gpu_node(kube_cluster: LocalKube) -> client.V1Node:
    return kube_cluster.create_fake_node(
        "gpu-h100-0",
        labels={"gpufleet.io/pool": "h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        taints=[GPU_TAINT],
        capacity={"nvidia.com/gpu": 8, "cpu": "96", "memory": "1Ti", "pods": 110},
    )


def test_api_server_answers(kube_cluster: LocalKube) -> None:
    info = client.VersionApi(kube_cluster.api_client()).get_code()
    assert info.git_version == pinned("K8S_VERSION")

    status = kube_cluster.status()
    assert status["ready"], status
    assert set(status["components"]) == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "gpu-hardware-standin",
        "dcgm-exporter-standin"}
    assert Path(status["kubeconfig"]) == kube_cluster.kubeconfig_path

    # A second up() reuses the running processes.
    pids = {n: c["pid"] for n, c in status["components"].items()}
    kube_cluster.up()
    assert {n: c["pid"] for n, c in kube_cluster.status()["components"].items()} == pids


def test_fake_gpu_node_becomes_ready(kube_cluster: LocalKube, gpu_node: client.V1Node) -> None:
    core = kube_cluster.core_v1()
    node = core.read_node("gpu-h100-0")
    assert node.metadata.annotations[KWOK_ANNOTATION] == "fake"
    assert node.metadata.labels["gpufleet.io/pool"] == "h100"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    ready = {c.type: c.status for c in node.status.conditions}
    assert ready["Ready"] == "True"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.status.capacity["cpu"] == "96"
    assert any(t.key == "nvidia.com/gpu" and t.value == "present" and t.effect == "NoSchedule"
               for t in node.spec.taints)
    # kwok heartbeats through a Lease, so the node lifecycle controller keeps it Ready
    # and lifts its not-ready taint.
    lease = wait_for("node lease", lambda: _lease(kube_cluster, "gpu-h100-0"))
    assert lease.spec.holder_identity  # kwok's controller id
    assert lease.spec.lease_duration_seconds == 40
    assert lease.spec.renew_time is not None
    wait_for("not-ready taint removed",
             lambda: "node.kubernetes.io/not-ready" not in taint_keys(core.read_node("gpu-h100-0")))


def test_the_dcgm_exporter_standin_serves_the_fake_gpu_nodes_telemetry(kube_cluster: LocalKube,
                                                                        gpu_node: client.V1Node) -> None:
    """Started with the control plane: dcgm-exporter's exposition for each kwok GPU node, at the URL a spec's
    `healing.telemetry.exporter_urls` names."""
    def scraped() -> str | None:
        try:
            with urllib.request.urlopen(kube_cluster.dcgm_exporter_url, timeout=2) as r:  # noqa: S310 - loopback
                body = r.read().decode()
        except OSError:
            return None
        return body if 'Hostname="gpu-h100-0"' in body else None

    body = wait_for("the stand-in to serve gpu-h100-0's GPUs", scraped, timeout=30)
    assert "# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge" in body
    assert 'DCGM_FI_DEV_SM_CLOCK{gpu="0",' in body and 'pci_bus_id="00000000:19:00.0"' in body


def _lease(kube: LocalKube, name: str):
    try:
        return client.CoordinationV1Api(kube.api_client()).read_namespaced_lease(name, "kube-node-lease")
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_gpu_pod_runs_then_eviction_deletes_it(kube_cluster: LocalKube, gpu_node: client.V1Node) -> None:
    core = kube_cluster.core_v1()
    core.create_namespaced_pod(NS, gpu_pod("train-0", pool="h100", gpus=2))
    wait_for("pod train-0 Running", lambda: pod_phase(core, "train-0") == "Running")
    pod = core.read_namespaced_pod("train-0", NS)
    assert pod.spec.node_name == "gpu-h100-0"
    assert pod.status.pod_ip
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"

    core.create_namespaced_pod_eviction(
        "train-0", NS, client.V1Eviction(metadata=client.V1ObjectMeta(name="train-0", namespace=NS)))
    wait_for("evicted pod deleted", lambda: pod_gone(core, "train-0"))


def test_cordon_keeps_pods_off_until_uncordoned(kube_cluster: LocalKube) -> None:
    core = kube_cluster.core_v1()
    kube_cluster.create_fake_node(
        "gpu-a100-0",
        labels={"gpufleet.io/pool": "a100"},
        taints=[GPU_TAINT],
        capacity={"nvidia.com/gpu": 4},
    )
    core.patch_node("gpu-a100-0", {"spec": {"unschedulable": True}})
    node = core.read_node("gpu-a100-0")
    assert node.spec.unschedulable is True
    wait_for("unschedulable taint",
             lambda: "node.kubernetes.io/unschedulable" in taint_keys(core.read_node("gpu-a100-0")))

    core.create_namespaced_pod(NS, gpu_pod("train-a100", pool="a100"))

    def unschedulable() -> bool:
        conds = core.read_namespaced_pod("train-a100", NS).status.conditions or []
        return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in conds)

    wait_for("pod reported Unschedulable on the cordoned node", unschedulable)
    assert core.read_namespaced_pod("train-a100", NS).spec.node_name is None

    core.patch_node("gpu-a100-0", {"spec": {"unschedulable": False}})
    wait_for("pod Running after uncordon", lambda: pod_phase(core, "train-a100") == "Running", timeout=90)
    assert core.read_namespaced_pod("train-a100", NS).spec.node_name == "gpu-a100-0"
    core.delete_namespaced_pod("train-a100", NS)
    wait_for("deleted pod gone", lambda: pod_gone(core, "train-a100"))


def test_the_apiservers_kubelet_client_may_use_the_kubelet_api_and_nothing_else(kube_cluster: LocalKube) -> None:
    """What a kubelet in Webhook mode asks the API server for each request of the API server's kubelet client
    (a SubjectAccessReview: GET logs -> get nodes/proxy, POST exec -> create nodes/proxy): allowed through
    system:kubelet-api-admin; anything else is refused, as that client is in no group."""
    from localenv.certs import APISERVER_KUBELET_CLIENT_CN

    authz = client.AuthorizationV1Api(kube_cluster.api_client())

    def allowed(**attributes: str) -> bool:
        review = authz.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": APISERVER_KUBELET_CLIENT_CN, "resourceAttributes": attributes}})
        return bool(review.status.allowed)

    assert allowed(verb="get", resource="nodes", subresource="proxy", name="system-0")
    assert allowed(verb="create", resource="nodes", subresource="proxy", name="system-0")
    assert allowed(verb="get", resource="nodes", subresource="log", name="system-0")
    assert not allowed(verb="create", resource="pods", namespace=NS)
    assert not allowed(verb="get", resource="secrets", namespace="kube-system")


def test_down_then_up_reuses_state_and_certs(kube_cluster: LocalKube, gpu_node: client.V1Node) -> None:
    pki = kube_cluster.pki
    before = {p: p.read_bytes() for p in (pki.ca_cert, pki.ca_key, pki.admin_cert, pki.sa_key, pki.apiserver_cert,
                                           pki.apiserver_kubelet_client_cert)}

    kube_cluster.down()
    status = kube_cluster.status()
    assert not any(c["running"] for c in status["components"].values()), status
    assert not status["ready"]
    kube_cluster.down()  # idempotent

    kube_cluster.up()
    assert kube_cluster.status()["ready"]
    assert {p: p.read_bytes() for p in before} == before
    core = kube_cluster.core_v1()
    # etcd kept the cluster state: the node is still there, and kwok keeps it Ready.
    node = kube_cluster.wait_node_ready("gpu-h100-0", timeout=60)
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    core.create_namespaced_pod(NS, gpu_pod("train-after-restart", pool="h100"))
    wait_for("pod Running after restart", lambda: pod_phase(core, "train-after-restart") == "Running")
    core.delete_namespaced_pod("train-after-restart", NS)
    wait_for("pod deleted", lambda: pod_gone(core, "train-after-restart"))


def test_up_right_after_the_api_server_was_stopped_waits_for_it(kube_cluster: LocalKube) -> None:
    """Issue 14.6: up() while a SIGTERMed kube-apiserver is still shutting down waits for it to be gone
    and starts a new one (it used to fail with "exited during start-up (pid ..., exit code None)")."""
    import psutil

    old = psutil.Process(kube_cluster.status()["components"]["kube-apiserver"]["pid"])
    old.terminate()
    kube_cluster.up()
    new = kube_cluster.status()["components"]["kube-apiserver"]
    assert new["healthy"] and new["pid"] != old.pid
    assert not old.is_running() or old.status() == psutil.STATUS_ZOMBIE


# --- failure handling, with stand-in binaries (no real cluster needed) ----------------

def _fake_bins(tmp_path: Path, script: str) -> Path:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in COMPONENTS:
        f = bins / name
        f.write_text("#!/bin/sh\n" + script)
        f.chmod(0o755)
    return bins


def _fake_kube(tmp_path: Path, bins: Path, **kw: Any) -> LocalKube:
    ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS))))
    return LocalKube(tmp_path / "wd", bins, **{f"{k}_port": v for k, v in ports.items()}, **kw)


def test_component_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    bins = _fake_bins(tmp_path, 'echo "fake $0: unknown flag --data-dir" >&2\nexit 3\n')
    kube = _fake_kube(tmp_path, bins, start_timeout=10)
    with pytest.raises(LocalKubeError, match=r"^etcd exited during start-up \(pid \d+, exit code 3\)") as err:
        kube.up()
    assert "unknown flag --data-dir" in str(err.value)
    assert not kube.status()["components"]["etcd"]["running"]
    kube.down()


def test_unhealthy_component_times_out_and_down_kills_it(tmp_path: Path) -> None:
    # Ignores SIGTERM (the ignore survives exec) and never answers its health check.
    bins = _fake_bins(tmp_path, "trap '' TERM\nexec sleep 120\n")
    kube = _fake_kube(tmp_path, bins, start_timeout=2, stop_timeout=1)
    with pytest.raises(LocalKubeError, match=r"^etcd \(pid \d+\) did not become healthy at http://127.0.0.1:\d+/health"):
        kube.up()
    pid = kube.status()["components"]["etcd"]["pid"]
    assert pid is not None  # left running for inspection until down()
    lines: list[str] = []
    kube.progress = lines.append
    kube.down()
    assert any("sending SIGKILL" in line for line in lines), lines
    assert any(line.startswith("[local] etcd killed") for line in lines), lines
    assert kube.status()["components"]["etcd"]["pid"] is None
    assert not kube.pid_path("etcd").exists()
