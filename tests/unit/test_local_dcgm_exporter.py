"""The local control plane starts the dcgm-exporter stand-in with its other processes, on the environment's port,
and stops it with them; the local spec reads it only where `healing.telemetry` says so (docs/local.md)."""
from __future__ import annotations

from localenv.control_plane import DCGM_EXPORTER, DEFAULT_PORTS, PROCESSES, LocalKube
from localenv.env import LocalEnv


def test_the_control_plane_runs_the_exporter_standin_on_its_port(tmp_path):
    kube = LocalKube(tmp_path, dcgm_exporter_port=31234)
    proc = kube._components()[DCGM_EXPORTER]
    assert DCGM_EXPORTER in PROCESSES  # started by up(), stopped by down(), shown by `gpufleet local status`
    assert proc.command()[1:] == ["-m", "localenv.dcgm_exporter_standin", f"--kubeconfig={kube.kubeconfig_path}",
                                  "--port=31234"]
    assert proc.ports == (31234,) and kube.dcgm_exporter_url == "http://127.0.0.1:31234/metrics"
    assert LocalKube(tmp_path).dcgm_exporter_port == DEFAULT_PORTS["dcgm_exporter"] != 9400  # not a real exporter's


def test_the_environment_passes_its_exporter_port_on(tmp_path):
    from tests.unit.fakes import fleet

    env = LocalEnv(fleet(nodes=1, spares=0), tmp_path, ports={"dcgm_exporter": 31999})
    assert env.kube.dcgm_exporter_port == 31999
    assert 31999 in env.nodes.relay_ports  # the reconciler's pods on the kubelet nodes reach it on their loopback
