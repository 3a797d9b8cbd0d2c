"""Run the node's health check: what the node has of nvidia-smi, DCGM and nccl-tests, each read by its
parser, into one verdict (fleetspec/health_report.py) written to the container's termination log, which
the reconciler reads from the pod's status. A tool that is not there is skipped and says so: a pass says
what it proved. nvidia-smi must be there: a GPU container without it has no driver (a node that cannot
serve).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fleetspec.health_report import FAIL, PASS, SKIP, CheckOutcome, HealthReport

from reconciler.healthcheck import dcgm, nccl, nvidia_smi

DCGM_TIMEOUT = {1: 300, 2: 900, 3: 3600, 4: 7200}  # seconds, by level (level 3 runs about half an hour)
ORDER = ("none", "reset-gpu", "reboot", "replace")


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


def check_nvidia_smi(run: Callable, which: Callable, gpus: int | None) -> CheckOutcome:
    if not which("nvidia-smi"):
        return CheckOutcome("nvidia-smi", FAIL, "nvidia-smi is not in the container: no driver (is the NVIDIA "
                            "container toolkit set up on the node?)", action="reboot")
    ran = run(["nvidia-smi", "-q"], 120)
    if ran.code != 0:
        return CheckOutcome("nvidia-smi", FAIL, f"nvidia-smi -q exited {ran.code}: {ran.out.strip()[:200]}",
                            action="reboot")
    report = nvidia_smi.check(ran.out, gpus)
    if report.healthy:
        return CheckOutcome("nvidia-smi", PASS, f"{len(report.gpus)} GPUs, driver {report.driver}: no pending "
                            "row remap, no uncorrectable ECC error, no reset asked for")
    return CheckOutcome("nvidia-smi", FAIL, "; ".join(f"{f.gpu or 'node'}: {f.what}" for f in report.findings),
                        tuple(sorted({f.gpu for f in report.findings if f.gpu})),
                        _worst(f.action for f in report.findings))


def check_dcgm(run: Callable, which: Callable, level: int | None) -> CheckOutcome:
    if level is None:
        return CheckOutcome("dcgm", SKIP, "not asked for (dcgm_level: null)")
    if not which("dcgmi"):
        return CheckOutcome("dcgm", SKIP, "dcgmi is not on the node")
    ran = run(["dcgmi", "diag", "-r", str(level), "-j"], DCGM_TIMEOUT.get(level, 3600))
    try:
        report = dcgm.parse(ran.out)
    except dcgm.Unreadable as e:
        return CheckOutcome("dcgm", SKIP, f"level {level} gave no result (exit {ran.code}): {e}")
    if not report.ran:
        return CheckOutcome("dcgm", SKIP, f"level {level} could not run: {report.error}")
    if report.healthy:
        return CheckOutcome("dcgm", PASS, f"level {level}: {report.tests} tests, none failed")
    what = "; ".join(f"{f.category}/{f.test} on GPU {','.join(f.gpus)}" + (f": {f.warnings[0]}" if f.warnings else "")
                     for f in report.failures)
    return CheckOutcome("dcgm", FAIL, f"level {level}: {what}", (), _worst(f.action for f in report.failures))


def check_all_reduce(run: Callable, which: Callable, wanted: bool, gpus: int | None) -> CheckOutcome:
    if not wanted:
        return CheckOutcome("all-reduce", SKIP, "not asked for")
    if not which("all_reduce_perf"):
        return CheckOutcome("all-reduce", SKIP, "nccl-tests' all_reduce_perf is not on the node")
    argv = ["all_reduce_perf", "-b", "8M", "-e", "256M", "-f", "2", "-c", "1"] + (["-g", str(gpus)] if gpus else [])
    ran = run(argv, 300)
    report = nccl.parse(ran.out)
    if report.healthy:
        return CheckOutcome("all-reduce", PASS, f"{gpus or 'all'} GPUs, bus bandwidth {report.bus_bandwidth} GB/s")
    why = "no result" if not report.found else \
        f"{report.errors} wrong values, {report.wrong_rows} sizes with wrong results" if report.errors or \
        report.wrong_rows else f"bus bandwidth {report.bus_bandwidth} GB/s under its target"
    return CheckOutcome("all-reduce", FAIL, f"{why} (exit {ran.code})", (), "reboot")


def run_checks(dcgm_level: int | None, all_reduce: bool, gpus: int | None, run: Callable = shell,
               which: Callable = shutil.which) -> HealthReport:
    first = check_nvidia_smi(run, which, gpus)
    if first.status == FAIL and first.action in ("reboot", "replace"):
        return HealthReport((first,))  # GPUs gone or the driver away: nothing else can run
    return HealthReport((first, check_dcgm(run, which, dcgm_level), check_all_reduce(run, which, all_reduce, gpus)))


def write(report: HealthReport, termination_log: Path | None) -> None:
    if termination_log is not None:
        termination_log.write_text(report.dumps())
