"""What holds a node's GPUs, stopped before a GPU reset and restored after it (the agent's share of a reset,
reconciler/agent/repairs.py).

`nvidia-smi -r` refuses a GPU that anything has open. NVIDIA's nvidia-smi manual (--gpu-reset,
docs.nvidia.com/deploy/nvidia-smi): "Requires root. There can't be any applications using these devices (e.g.
CUDA application, graphics application like X server, monitoring application like other instance of
nvidia-smi). There also can't be any compute applications running on any other GPU in the system if individual
GPU reset is not feasible." On a Kubernetes GPU node the device plugin, DCGM, dcgm-exporter and GPU feature
discovery hold them, and so does persistence mode. NVIDIA's NVSentinel resets the same way this does
(github.com/NVIDIA/NVSentinel):
- janitor/pkg/gpuservices/manager.go: the GPU Operator's operands are stopped through the node labels the
  operator deploys them by (`nvidia.com/gpu.deploy.<operand>`: "true" deploys, "false" removes), only those
  running on the node, waited for (TeardownTimeout), and set back after the reset (RestoreTimeout);
- gpu-reset/gpu_reset.sh: persistence mode "counts as an attachment to the device, so nvidia-smi --gpu-reset is
  refused with 'In use by another client' while it is enabled": it is turned off on the GPUs that had it,
  and back on after the reset, on the failure path too.
On a host without the GPU Operator the same clients run as systemd units: NVIDIA's persistence daemon
(nvidia-persistenced, docs.nvidia.com/deploy/driver-persistence) and DCGM's host engine (nvidia-dcgm, DCGM's
user guide, "Start the DCGM service"): those that are active are stopped and started again.

What is stopped is written on the node first (`gpufleet.io/gpu-clients-stopped`), so an agent that dies
half-way restores it when it starts again. When something still holds the GPUs after the wait (`fuser` on the
NVIDIA device files), everything is restored and the reset is answered failed, saying what holds them: the
repair goes on to a reboot, which frees every client.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from gpufleet.fleetspec import labels

HOST = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]  # the host's own tools
OPERATOR_LABELS = labels.GPU_OPERATOR_DEPLOY  # the GPU Operator's operands, by the node label that deploys each
ENABLED, DISABLED = "true", "false"
HOST_SERVICES = ("nvidia-persistenced", "nvidia-dcgm")
# Every process with an NVIDIA device file open, on the host (psmisc's fuser: exit 0 and the PIDs when some
# process has one open, 1 when none has).
HOLDERS = ["sh", "-c", "fuser /dev/nvidiactl /dev/nvidia[0-9]* /dev/nvidia-uvm 2>&1"]
# NVSentinel waits up to 5 minutes (TeardownTimeout); here the whole reset answers within the pool's reset timeout
# (reset_timeout_seconds, 300 s by default), before the reconciler asks again at half of it.
TEARDOWN_SECONDS = 90.0
POLL = 5.0


@dataclass(frozen=True)
class Stopped:
    """What one reset stopped, to be restored: the operator's labels set to false, the host units stopped,
    the GPUs whose persistence mode was turned off."""

    request: str
    labels: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    persistence: tuple[str, ...] = ()

    def dumps(self) -> str:
        return json.dumps(asdict(self))


def parse_stopped(text: str | None) -> Stopped | None:
    if not text:
        return None
    try:
        d = json.loads(text)
        return Stopped(str(d["request"]), *(tuple(str(x) for x in d.get(k) or ()) for k in
                                            ("labels", "services", "persistence")))
    except (ValueError, KeyError, TypeError):
        return None


class GpuClients:
    """Stops and restores the clients of a node's GPUs, with the host's own tools (`run`: argv -> (exit, output))."""

    def __init__(self, kube, node: str, run: Callable[[list[str]], tuple[int, str]],
                 sleep: Callable[[float], None] = time.sleep, teardown: float = TEARDOWN_SECONDS):
        self.kube, self.node, self.run, self.sleep, self.teardown = kube, node, run, sleep, teardown

    # --- what runs now -----------------------------------------------------------------------------------

    def _labels(self) -> dict[str, str]:
        return (self.kube.get_node(self.node).get("metadata") or {}).get("labels") or {}

    def _active(self, service: str) -> bool:
        code, _ = self.run(HOST + ["systemctl", "is-active", "--quiet", service])
        return code == 0

    def _persistent(self, gpu: str) -> bool:
        code, out = self.run(HOST + ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", gpu])
        return code == 0 and out.strip() == "Enabled"

    def _gpus(self, gpus: tuple[str, ...]) -> tuple[str, ...]:
        if gpus:
            return gpus
        code, out = self.run(HOST + ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"])
        return tuple(x.strip() for x in out.splitlines() if x.strip()) if code == 0 else ()

    def holders(self) -> str:
        """What still has an NVIDIA device open on the host ('' when nothing does, or fuser cannot tell)."""
        code, out = self.run(HOST + HOLDERS)
        return out.strip() if code == 0 and out.strip() else ""

    # --- stop, wait, restore -----------------------------------------------------------------------------

    def stop(self, request: str, gpus: tuple[str, ...]) -> tuple[Stopped, str]:
        """Stop what holds the GPUs (noted on the node first) and wait until nothing does. (what was stopped,
        '' when the GPUs are free, else what still holds them after the wait)."""
        have = self._labels()
        plan = Stopped(
            request,
            labels=tuple(k for k in OPERATOR_LABELS if have.get(k) == ENABLED),
            services=tuple(s for s in HOST_SERVICES if self._active(s)),
            persistence=tuple(g for g in self._gpus(gpus) if self._persistent(g)))
        self.kube.patch_node(self.node, {"metadata": {"annotations": {labels.GPU_CLIENTS_STOPPED: plan.dumps()}}})
        if plan.labels:
            self.kube.patch_node(self.node, {"metadata": {"labels": {k: DISABLED for k in plan.labels}}})
        for s in plan.services:
            self.run(HOST + ["systemctl", "stop", s])
        for g in plan.persistence:
            self.run(HOST + ["nvidia-smi", "-pm", "0", "-i", g])
        waited = 0.0
        while (held := self.holders()) and waited < self.teardown:
            self.sleep(POLL)
            waited += POLL
        return plan, held

    def restore(self, stopped: Stopped) -> list[str]:
        """Everything `stopped` stopped, back as it was (each step tried, whatever the others did); then the note
        on the node goes. What could not be restored, for the answer."""
        failed = []
        for g in stopped.persistence:
            code, out = self.run(HOST + ["nvidia-smi", "-pm", "1", "-i", g])
            if code != 0:
                failed.append(f"persistence mode on {g}: {out[:100]}")
        for s in stopped.services:
            code, out = self.run(HOST + ["systemctl", "start", s])
            if code != 0:
                failed.append(f"{s}: {out[:100]}")
        if stopped.labels:
            self.kube.patch_node(self.node, {"metadata": {"labels": {k: ENABLED for k in stopped.labels}}})
        self.kube.patch_node(self.node, {"metadata": {"annotations": {labels.GPU_CLIENTS_STOPPED: None}}})
        return failed
