"""The node agent's share of the repair loop (issue 25): a reset or a reboot the reconciler asks of this
node (annotation `gpufleet.io/repair-request`, fleetspec/node_repair.py), carried out once per request id,
answered in `gpufleet.io/repair-result`.

The agent is already privileged on the node; with the DaemonSet's `hostPID` it runs the host's own tools
in the host's namespaces (nsenter into PID 1), so the reconciler needs no privilege on any node:
- a reset: what holds the GPUs stopped first (the GPU Operator's operands, the host's persistence and DCGM
  daemons, persistence mode: gpu_clients.py, as NVIDIA's NVSentinel does), then `nvidia-smi -r -i <PCI
  address>` per GPU named (every GPU when none is: on an NVSwitch system NVIDIA resets them together), then
  what was stopped restored, and the answer says how it went. When the GPUs' clients cannot be stopped, the
  reset is not tried: it is answered failed with what holds them, and the repair goes on to a reboot;
- a reboot: answered first (the answer could not be written after), then `systemctl reboot`. The
  reconciler sees the reboot by the node's new boot id.

Once per id across restarts: the answer on the node names the last id acted on; a request whose answer is
there is not acted on again. (A reset cut short by the agent's own death, before its answer, is tried
again when the agent is back: a reset is safe to repeat; what it had stopped is restored first.)
"""
from __future__ import annotations

import logging
import subprocess
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.node_repair import (REBOOT, RESET_GPU, RepairRequest, RepairResult, bad_gpu_ids, parse_request,
                                   parse_result)

from gpufleet.reconciler.agent.gpu_clients import HOST, GpuClients, parse_stopped

log = logging.getLogger(__name__)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
POLL = 5.0


def shell(argv: list[str], timeout: float = 300) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError) as e:
        return 124, str(e)
    return p.returncode, ((p.stdout or "") + (p.stderr or "")).strip()


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Repairs:
    """Polls the agent's node for a request (the agent may only get and patch nodes: no watch)."""

    def __init__(self, kube, node: str, run: Callable[[list[str]], tuple[int, str]] = shell,
                 boot: Callable[[], str] = lambda: BOOT_ID.read_text().strip(), clock: Callable[[], datetime] = _now,
                 clients: GpuClients | None = None):
        self.kube, self.node, self.run, self.boot, self.clock = kube, node, run, boot, clock
        self.clients = clients or GpuClients(kube, node, run)

    def once(self) -> RepairResult | None:
        """Act on the node's request if it was not acted on yet; the answer written, or None."""
        ann = (self.kube.get_node(self.node).get("metadata") or {}).get("annotations") or {}
        noted = ann.get(labels.GPU_CLIENTS_STOPPED)
        left = parse_stopped(noted)
        if noted and left is None:
            log.error("node %s: %s does not read (%r): restore the GPU Operator's labels and the host's GPU daemons "
                      "by hand, then remove it", self.node, labels.GPU_CLIENTS_STOPPED, noted[:200])
        if left is not None:  # an agent died during a reset: what it stopped comes back first
            log.warning("node %s: restoring the GPU clients reset %s stopped: %s", self.node, left.request,
                        self.clients.restore(left) or "all back")
        req = parse_request(ann.get(labels.REPAIR_REQUEST))
        done = parse_result(ann.get(labels.REPAIR_RESULT))
        if req is None or (done is not None and done.id == req.id):
            return None
        if req.action == RESET_GPU:
            result = self._reset(req)
            self._answer(result)
            return result
        if req.action == REBOOT:
            result = RepairResult(req.id, True, "rebooting", self.clock(), self.boot())
            self._answer(result)  # before: nothing is written after a reboot
            code, out = self.run(HOST + ["systemctl", "reboot"])
            if code != 0:
                result = RepairResult(req.id, False, f"systemctl reboot exited {code}: {out[:300]}", self.clock(),
                                      self.boot())
                self._answer(result)
            return result
        return None

    def _reset(self, req: RepairRequest) -> RepairResult:
        """Stop the GPUs' clients, reset, restore them: answered failed (so the repair reboots) when the clients
        could not be stopped, a reset failed, or they could not be restored."""
        bad = bad_gpu_ids(req.gpus)
        if bad:  # the request is the reconciler's, but its words reach root commands on the host: PCI ids only
            return RepairResult(req.id, False, f"refused: {bad} not a GPU's PCI bus id (nothing was run)",
                                self.clock(), self.boot())
        stopped, held = self.clients.stop(req.id, req.gpus)
        ok, message = self._reset_gpus(req) if not held else (
            False, f"the GPUs' clients could not be stopped within {self.clients.teardown:.0f}s ({held[:200]}), and "
                   "nvidia-smi -r needs none: not reset, a reboot frees them")
        unrestored = self.clients.restore(stopped)
        if unrestored:
            ok, message = False, f"{message}; not restored after the reset: {'; '.join(unrestored)}"
        return RepairResult(req.id, ok, message, self.clock(), self.boot())

    def _reset_gpus(self, req: RepairRequest) -> tuple[bool, str]:
        targets = [["-i", g] for g in req.gpus] or [[]]
        said = []
        for t in targets:
            code, out = self.run(HOST + ["nvidia-smi", "-r", *t])
            said.append(out[:200])
            if code != 0:
                return False, f"nvidia-smi -r {' '.join(t)} exited {code}: {out[:300]}"
        return True, "; ".join(s for s in said if s) or "GPU reset"

    def _answer(self, result: RepairResult) -> None:
        self.kube.patch_node(self.node, {"metadata": {"annotations": {labels.REPAIR_RESULT: result.dumps()}}})
        log.warning("node %s: %s %s", self.node, result.id, "done" if result.ok else f"failed: {result.message}")

    def loop(self, stop: threading.Event, every: float = POLL) -> None:
        while not stop.is_set():
            try:
                self.once()
            except Exception as e:  # noqa: BLE001 - the API server away: asked again next time
                log.warning("repair requests of %s not read: %s", self.node, e)
            stop.wait(every)
