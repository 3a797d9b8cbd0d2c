"""Stand-in for the GPU hardware of the local environment's kwok nodes (issue 25), and for what the node agent
and the health check do to it on a real machine. kwok fakes a node's kubelet; it has no GPUs to reset, no
machine to reboot and nothing to check, so this does, from each node's simulated state (annotation
`localenv.gpufleet.io/gpu-state`, set by a test or a demo): healthy, or broken in a way a reset fixes
(`reset-fixes`), a reboot fixes (`reboot-fixes`), or nothing fixes (`broken`; `nvlink-down`: an NVLink
inactive; `low-bandwidth`: the all-reduce under the model's floor). Absent: healthy. States its telemetry shows
(localenv/dcgm_exporter_standin.py serves it as dcgm-exporter would): `row-remap-pending` (a GPU degrading: a row
waits to be remapped, which a reset does), `throttling` (one GPU held in a thermal slowdown, its clock halved),
`idle` (no work on the GPUs) and `hung` (clocks up, nothing issued: a job that stopped making progress); a reset or
reboot ends a hang.

What it follows, and nothing more:
- a repair request on the node (fleetspec/node_repair.py) is acted on once per id and answered on the node,
  as reconciler/agent/repairs.py does on a real node: a reset is answered with how `nvidia-smi -r` went (a GPU
  a reset cannot bring back answers as the driver does, "Unable to reset"); a reboot is answered first, then
  the node goes NotReady with a new `status.nodeInfo.bootID` (a real kubelet reports the new boot's id when it
  registers again: kubernetes v1.34 pkg/kubelet/nodestatus/setters.go MachineInfo). kwok's node-initialize
  stage (tools/kube/kwok/stages) makes a NotReady kwok node Ready at once and keeps the boot id, so a reboot
  here takes about a second where hardware takes minutes;
- a health-check pod (label `gpufleet.io/health-check-node`) that kwok made Running on a kwok node ends as
  the real check's container does: the real check (reconciler/healthcheck/run.py, what `gpufleet
  health-check` runs) reads the tools' outputs the node's state gives (real drivers' published outputs,
  `tools`), its report goes in the termination message (fleetspec/health_report.py), exit 0 when it passed,
  1 when not, with the action the failure needs. kwok's pod-complete stage leaves these pods to it (its selector skips them).

The reconciler runs unchanged against it: nothing in the reconciler knows the node is fake.
Run: ``python -m localenv.gpu_hardware_standin --kubeconfig FILE`` (LocalKube supervises it).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Collection

from kubernetes import client, config

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.health_report import EXPECTED_GPUS, HealthReport
from gpufleet.fleetspec.node_repair import REBOOT, RESET_GPU, RepairResult, parse_request, parse_result
from gpufleet.stop_signal import set_on_signals

from gpufleet.reconciler.healthcheck.run import Ran, run_checks

log = logging.getLogger("gpu-hardware-standin")
HEALTHY, RESET_FIXES, REBOOT_FIXES, BROKEN = "healthy", "reset-fixes", "reboot-fixes", "broken"
NVLINK_DOWN, LOW_BANDWIDTH = "nvlink-down", "low-bandwidth"  # degraded in a way no reset or reboot fixes
ROW_REMAP_PENDING, THROTTLING, IDLE, HUNG = "row-remap-pending", "throttling", "idle", "hung"  # seen in telemetry
STATES = (HEALTHY, RESET_FIXES, REBOOT_FIXES, BROKEN, NVLINK_DOWN, LOW_BANDWIDTH, ROW_REMAP_PENDING, THROTTLING, IDLE,
          HUNG)
RESET_CURES = (RESET_FIXES, ROW_REMAP_PENDING, HUNG)  # what a GPU reset (or a reboot) makes healthy
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# What the stand-in's tools print: real drivers' and nccl-tests' published outputs (their sources:
# tests/fixtures/gpu/SOURCES.md), changed only where a state says a GPU is broken.
OUTPUTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpu"
SMI_Q = "nvidia-smi-q.h100x8.535.161.08.txt"
ALL_REDUCE = {LOW_BANDWIDTH: "nccl-all-reduce.h100x16.two-nodes.143gbs.txt"}
ALL_REDUCE_OK = "nccl-all-reduce.h100x8.439gbs.txt"
DCGM_SAMPLE = "dcgmi-diag-3x.nvidia-sample.json"
NVLINK_DOWN_AT = (3, 5)  # (GPU, link) that an `nvlink-down` node prints <inactive>


def _now() -> datetime:
    return datetime.now(timezone.utc)


def state_of(node: dict) -> str:
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(labels.SIMULATED_GPU_STATE) or HEALTHY
    return value if value in STATES else BROKEN  # a state it does not know: nothing it knows fixes it


def _first_gpus(text: str, n: int) -> str:
    """`nvidia-smi -q` cut to its first `n` GPUs (a pool of fewer GPUs than the published 8)."""
    blocks = re.split(r"(?m)^(?=GPU [0-9A-Fa-f]{8}:)", text)
    return "".join(blocks[: n + 1]).replace("Attached GPUs                             : 8",
                                            f"Attached GPUs                             : {n}")


def smi_q(state: str, gpus: int) -> str:
    text = _first_gpus((OUTPUTS / SMI_Q).read_text(), gpus)
    if state in (RESET_FIXES, ROW_REMAP_PENDING):  # a row waits to be remapped: a reset
        return text.replace("        Pending                           : No", "        Pending                           : Yes", 1)
    if state == REBOOT_FIXES:  # a GPU fell off the bus: one fewer than the node should have
        return _first_gpus(text, gpus - 1)
    if state == BROKEN:  # the row remapper ran out: the vendor
        return text.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes", 1)
    return text


def nvlink_status(state: str, gpus: int) -> str:
    """`nvidia-smi nvlink --status` of an HGX H100 board, in the layout real drivers print (SOURCES.md)."""
    out = []
    for g in range(gpus):
        out.append(f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-00000000000{g})")
        for link in range(18):
            down = state == NVLINK_DOWN and (g, link) == NVLINK_DOWN_AT
            out.append(f"\t Link {link}: " + ("<inactive>" if down else "26.562 GB/s"))
    return "\n".join(out) + "\n"


def dcgm_diag() -> str:
    """`dcgmi diag -j` of a node whose diagnostic passed: NVIDIA's own sample of the output with its failing
    results marked passed (no published passing run was found whole)."""
    return (OUTPUTS / DCGM_SAMPLE).read_text().replace('"Fail"', '"Pass"').replace('"FAIL"', '"PASS"')


def tools(state: str, gpus: int, missing: Collection[str] = ()) -> tuple[Callable, Callable]:
    """(run, which) for `run_checks`: nvidia-smi, dcgmi and nccl-tests' all_reduce_perf, but those `missing`
    (a check image without them)."""
    def run(argv: list[str], timeout: int) -> Ran:
        if argv[:2] == ["nvidia-smi", "-q"]:
            return Ran(0, smi_q(state, gpus))
        if argv[:2] == ["nvidia-smi", "nvlink"]:
            return Ran(0, nvlink_status(state, gpus))
        if argv[0] == "dcgmi":
            return Ran(0, dcgm_diag())
        if argv[0] == "all_reduce_perf":
            return Ran(0, (OUTPUTS / ALL_REDUCE.get(state, ALL_REDUCE_OK)).read_text())
        return Ran(127, f"{argv[0]}: not found")
    present = {"nvidia-smi", "dcgmi", "all_reduce_perf"} - set(missing)
    return run, (lambda name: name if name in present else None)


def report(state: str, gpus: int = 8, argv: list[str] | None = None, missing: Collection[str] = ()) -> HealthReport:
    """What `gpufleet health-check` finds on a node in `state`: the real check (reconciler/healthcheck/run.py)
    on the outputs above, with the options of the Job's command (`argv`: the spec's)."""
    argv = list(argv or [])
    skips = frozenset(argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--allow-skip")
    level = next((int(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "--dcgm-level"), None)
    run, which = tools(state, gpus, missing)
    return run_checks(level, "--no-all-reduce" not in argv, gpus, run, which, skips)


class GpuHardware:
    """One pass (`once`) over the kwok nodes' repair requests and the health-check pods on them."""

    def __init__(self, api: client.ApiClient, clock=_now):
        self.core = client.CoreV1Api(api)
        self.clock = clock

    def once(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self._json(self.core.list_node(_preload_content=False))["items"]
                 if ((n["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION))}
        for name, node in nodes.items():
            self._repair(name, node)
        pods = self._json(self.core.list_pod_for_all_namespaces(
            label_selector=labels.HEALTH_CHECK_NODE, field_selector="status.phase=Running",
            _preload_content=False))["items"]
        for pod in pods:
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if node is not None and not pod["metadata"].get("deletionTimestamp"):
                self._finish_check(pod, node)

    def _repair(self, name: str, node: dict) -> None:
        ann = node["metadata"].get("annotations") or {}
        req, done = parse_request(ann.get(labels.REPAIR_REQUEST)), parse_result(ann.get(labels.REPAIR_RESULT))
        if req is None or (done is not None and done.id == req.id):
            return
        state, boot = state_of(node), ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID", "")
        if req.action == RESET_GPU:
            fixed = state in (HEALTHY, IDLE, THROTTLING) + RESET_CURES
            message = ("GPU 00000000:3B:00.0 was successfully reset." if fixed else
                       "Unable to reset GPU 00000000:3B:00.0: GPU is lost (local GPU hardware stand-in)")
            self._answer(name, RepairResult(req.id, fixed, message, self.clock(), boot),
                         {labels.SIMULATED_GPU_STATE: HEALTHY} if state in RESET_CURES else {})
        elif req.action == REBOOT:
            self._answer(name, RepairResult(req.id, True, "rebooting", self.clock(), boot),
                         {labels.SIMULATED_GPU_STATE: HEALTHY} if state in RESET_CURES + (REBOOT_FIXES,) else {})
            new_boot = str(uuid.uuid4())
            self.core.patch_node_status(name, {"status": {
                "nodeInfo": {"bootID": new_boot},
                "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                "message": "rebooting (local GPU hardware stand-in)",
                                "lastHeartbeatTime": self.clock().isoformat(),
                                "lastTransitionTime": self.clock().isoformat()}]}})
            log.warning("node %s rebooted for %s: boot id %s -> %s", name, req.id, boot[:8], new_boot[:8])

    def _answer(self, name: str, result: RepairResult, state: dict[str, str]) -> None:
        self.core.patch_node(name, {"metadata": {"annotations": {labels.REPAIR_RESULT: result.dumps(), **state}}})
        log.warning("node %s: %s %s", name, result.id, "done" if result.ok else f"failed: {result.message}")

    def _finish_check(self, pod: dict, node: dict) -> None:
        container = pod["spec"]["containers"][0]
        env = {e.get("name"): e.get("value") for e in container.get("env") or []}
        found = report(state_of(node), int(env.get(EXPECTED_GPUS) or 8), container.get("command") or [])
        now = self.clock().isoformat()
        exit_code = 0 if found.passed else 1
        statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                     "started": False, "state": {"terminated": {
                         "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                         "message": found.dumps(), "startedAt": now, "finishedAt": now}}}
                    for c in pod["spec"]["containers"]]
        self.core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": statuses}})
        log.warning("health check %s on %s: %s (%s)", pod["metadata"]["name"], node["metadata"]["name"],
                    "passed" if found.passed else "failed", found.summary())

    @staticmethod
    def _json(resp) -> dict:
        import json
        return json.loads(resp.data)

    def loop(self, stop: threading.Event, every: float = 0.5, ready: Path | None = None) -> None:
        while not stop.is_set():
            try:
                self.once()
                if ready is not None:
                    ready.touch()
            except Exception as e:  # noqa: BLE001 - the API server away: tried again next pass
                log.warning("pass failed: %s", e)
            stop.wait(every)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--ready-file", type=Path, help="touched after each pass that reached the API server")
    ap.add_argument("--every", type=float, default=0.5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    set_on_signals(stop)  # SIGTERM sets it (never from inside the handler: gpufleet/stop_signal.py)
    GpuHardware(config.new_client_from_config(config_file=args.kubeconfig)).loop(stop, args.every, args.ready_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
