"""Run the node's health check, each tool's output read by its parser, into one verdict
(fleetspec/health_report.py) written to the container's termination log, which the reconciler reads from
the pod's status. What it checks, in order:

- `nvidia-smi`: the driver answers; the GPU count the node should have; no pending row remap,
  uncorrectable ECC error or reset asked for (nvidia_smi.py).
- `nvlink`: every GPU's NVLinks active at their model's speed (nvlink.py, floors.py).
- `dcgm`: DCGM's diagnostic at the spec's level (dcgm.py).
- `all-reduce`: nccl-tests' all_reduce_perf across all of the node's GPUs, no wrong value, its average bus
  bandwidth at least the GPU model's floor (nccl.py, floors.py).
- `pcie`: each GPU's PCIe link at its maximum generation and width, read right after the all-reduce
  (nvidia_smi.pcie).

"Passed" means every check passed. A check whose tool is not in the check's image (dcgmi, all_reduce_perf),
or that could not run, is a skip only where the spec allows it (`allow_skip`, the local cluster); otherwise
it is `unproven` and the node does not pass: it is not shown broken, and not proven either. nvidia-smi must
be there: a GPU container without it has no driver (a node that cannot serve).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

from gpufleet.fleetspec.health_report import FAIL, PASS, SKIP, UNPROVEN, CheckOutcome, HealthReport

from gpufleet.reconciler.healthcheck import dcgm, nccl, nvidia_smi, nvlink
from gpufleet.reconciler.healthcheck.floors import CHECK_SIZES, ModelFloor, floor_for

DCGM_TIMEOUT = {1: 300, 2: 900, 3: 3600, 4: 7200}  # seconds, by level (level 3 runs about half an hour)
ORDER = ("none", "reset-gpu", "reboot", "replace")
IMAGE_HINT = "not in the check's image (healing.repair.health_check.image: an image with NVIDIA's DCGM and nccl-tests)"


@dataclass(frozen=True)
class Ran:
    code: int
    out: str


def shell(argv: list[str], timeout: int) -> Ran:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Ran(124, f"{argv[0]} did not finish within {timeout}s")
    return Ran(p.returncode, (p.stdout or "") + (p.stderr or ""))


def _worst(actions) -> str:
    return max(actions, key=ORDER.index, default="none")


def cannot_prove(name: str, why: str, allow_skip: Collection[str]) -> CheckOutcome:
    """A check that could not run: a skip where the spec allows it, else the node is unproven."""
    if name in allow_skip:
        return CheckOutcome(name, SKIP, f"{why} (allowed: allow_skip)")
    return CheckOutcome(name, UNPROVEN, f"{why}: a required check, so the node is not proven")


def check_nvidia_smi(run: Callable, which: Callable, gpus: int | None) -> tuple[CheckOutcome, str]:
    """The outcome, and the output (the product name and the PCIe links are read from it)."""
    if not which("nvidia-smi"):
        return CheckOutcome("nvidia-smi", FAIL, "nvidia-smi is not in the container: no driver (is the NVIDIA "
                            "container toolkit set up on the node?)", action="reboot"), ""
    ran = run(["nvidia-smi", "-q"], 120)
    if ran.code != 0:
        return CheckOutcome("nvidia-smi", FAIL, f"nvidia-smi -q exited {ran.code}: {ran.out.strip()[:200]}",
                            action="reboot"), ""
    report = nvidia_smi.check(ran.out, gpus)
    if report.healthy:
        return CheckOutcome("nvidia-smi", PASS, f"{len(report.gpus)} GPUs ({nvidia_smi.product(ran.out) or '?'}), "
                            f"driver {report.driver}: no pending row remap, no uncorrectable ECC error, no reset "
                            "asked for"), ran.out
    return CheckOutcome("nvidia-smi", FAIL, "; ".join(f"{f.gpu or 'node'}: {f.what}" for f in report.findings),
                        tuple(sorted({f.gpu for f in report.findings if f.gpu})),
                        _worst(f.action for f in report.findings)), ran.out


def check_nvlink(run: Callable, floor: ModelFloor | None) -> CheckOutcome:
    ran = run(["nvidia-smi", "nvlink", "--status"], 120)
    if ran.code != 0:
        if floor is not None and floor.nvlinks:
            return CheckOutcome("nvlink", FAIL, f"nvidia-smi nvlink --status exited {ran.code} where "
                                f"{floor.product} has {floor.nvlinks} NVLinks per GPU: {ran.out.strip()[:160]}",
                                action="reboot")
        return CheckOutcome("nvlink", PASS, f"no NVLink (nvidia-smi nvlink exited {ran.code})")
    try:
        gpus = nvlink.parse(ran.out)
    except nvlink.Unreadable as e:
        if floor is not None and floor.nvlinks:
            return CheckOutcome("nvlink", FAIL, f"{e}, where {floor.product} has {floor.nvlinks} NVLinks per GPU",
                                action="reboot")
        return CheckOutcome("nvlink", PASS, f"no NVLink figures for this model, and its output did not read: {e}")
    bad = nvlink.findings(gpus, floor)
    if bad:
        return CheckOutcome("nvlink", FAIL, "; ".join(bad), action="reboot")
    links = sum(len(g.active) for g in gpus)
    return CheckOutcome("nvlink", PASS, f"{links} NVLinks active on {len(gpus)} GPUs" if links else "no NVLink")


def check_dcgm(run: Callable, which: Callable, level: int | None, allow_skip: Collection[str]) -> CheckOutcome:
    if level is None:
        return CheckOutcome("dcgm", SKIP, "not asked for (dcgm_level: null)")
    if not which("dcgmi"):
        return cannot_prove("dcgm", f"dcgmi is {IMAGE_HINT}", allow_skip)
    ran = run(["dcgmi", "diag", "-r", str(level), "-j"], DCGM_TIMEOUT.get(level, 3600))
    try:
        report = dcgm.parse(ran.out)
    except dcgm.Unreadable as e:
        return cannot_prove("dcgm", f"level {level} gave no result (exit {ran.code}): {e}", allow_skip)
    if not report.ran:
        return cannot_prove("dcgm", f"level {level} could not run: {report.error}", allow_skip)
    if report.healthy:
        return CheckOutcome("dcgm", PASS, f"level {level}: {report.tests} tests, none failed")
    what = "; ".join(f"{f.category}/{f.test} on GPU {','.join(f.gpus)}" + (f": {f.warnings[0]}" if f.warnings else "")
                     for f in report.failures)
    return CheckOutcome("dcgm", FAIL, f"level {level}: {what}", (), _worst(f.action for f in report.failures))


def check_all_reduce(run: Callable, which: Callable, wanted: bool, gpus: int | None, floor: ModelFloor | None,
                     allow_skip: Collection[str]) -> CheckOutcome:
    if not wanted:
        return CheckOutcome("all-reduce", SKIP, "not asked for")
    if not which("all_reduce_perf"):
        return cannot_prove("all-reduce", f"nccl-tests' all_reduce_perf is {IMAGE_HINT}", allow_skip)
    argv = ["all_reduce_perf", *CHECK_SIZES, "-c", "1"] + (["-g", str(gpus)] if gpus else [])
    ran = run(argv, 300)
    report = nccl.parse(ran.out)
    if not report.found:
        return CheckOutcome("all-reduce", FAIL, f"no result (exit {ran.code}): {ran.out.strip()[-160:]}",
                            action="reboot")
    if report.errors or report.wrong_rows or not report.bandwidth_ok:
        return CheckOutcome("all-reduce", FAIL, f"{report.errors} wrong values, {report.wrong_rows} sizes with wrong "
                            f"results (exit {ran.code})", action="reboot")
    bw = report.bus_bandwidth
    if floor is not None and gpus == floor.gpus:
        if bw is None or bw < floor.bus_bandwidth_gbps:
            return CheckOutcome("all-reduce", FAIL, f"bus bandwidth {bw} GB/s on {gpus} GPUs, under the "
                                f"{floor.bus_bandwidth_gbps:g} GB/s floor of {floor.product}", action="reboot")
        return CheckOutcome("all-reduce", PASS, f"{gpus} GPUs, bus bandwidth {bw} GB/s (floor "
                            f"{floor.bus_bandwidth_gbps:g})")
    why = "no floor for this model" if floor is None else f"its floor is for {floor.gpus} GPUs"
    return CheckOutcome("all-reduce", PASS, f"{gpus or 'all'} GPUs, bus bandwidth {bw} GB/s, no wrong value ({why})")


def check_pcie(run: Callable, loaded: bool, before: str) -> CheckOutcome:
    """The PCIe links, read right after the all-reduce when it ran (NVIDIA: the current values "may be reduced
    when the GPU is not in use"); without that load, a lower link is noted, not failed."""
    text = before
    if loaded:
        ran = run(["nvidia-smi", "-q"], 120)
        text = ran.out if ran.code == 0 else before
    bad = nvidia_smi.pcie(text)
    if not bad:
        return CheckOutcome("pcie", PASS, "every GPU's PCIe link at its maximum generation and width")
    what = "; ".join(f"{f.gpu}: {f.what}" for f in bad)
    if not loaded:
        return CheckOutcome("pcie", PASS, f"idle, so not judged: {what}")
    return CheckOutcome("pcie", FAIL, what, tuple(sorted({f.gpu for f in bad})), "reboot")


def run_checks(dcgm_level: int | None, all_reduce: bool, gpus: int | None, run: Callable = shell,
               which: Callable = shutil.which, allow_skip: Collection[str] = ()) -> HealthReport:
    first, smi = check_nvidia_smi(run, which, gpus)
    if first.status == FAIL and first.action in ("reboot", "replace"):
        return HealthReport((first,))  # GPUs gone or the driver away: nothing else can run
    floor = floor_for(nvidia_smi.product(smi))
    links = check_nvlink(run, floor)
    diag = check_dcgm(run, which, dcgm_level, allow_skip)
    reduced = check_all_reduce(run, which, all_reduce, gpus, floor, allow_skip)
    loaded = bool(all_reduce and which("all_reduce_perf"))  # the GPUs were just busy: their links trained up
    return HealthReport((first, links, diag, reduced, check_pcie(run, loaded, smi)))


def write(report: HealthReport, termination_log: Path | None) -> None:
    if termination_log is not None:
        termination_log.write_text(report.dumps())
