"""`gpufleet health-check`: what the health-check Job runs on a node before it serves (issue 25)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from gpufleet.console import EXIT_FAILED, app

from gpufleet.fleetspec.health_report import EXPECTED_GPUS  # set by the Job (reconciler/adapters/health_checks.py)


@app.command("health-check")
def health_check(
    termination_log: Optional[Path] = typer.Option(None, help="Write the verdict (JSON) here: the container's "
                                                               "terminationMessagePath."),
    dcgm_level: Optional[int] = typer.Option(None, min=1, max=4, help="Run DCGM's diagnostic at this level, "
                                                                       "when dcgmi is on the node."),
    all_reduce: bool = typer.Option(True, help="A short all-reduce across the GPUs, when nccl-tests is there."),
    gpus: Optional[int] = typer.Option(None, help=f"GPUs the node should have (default: ${EXPECTED_GPUS})."),
    allow_skip: list[str] = typer.Option([], help="A check that may be skipped when its tool is not in the image "
                                              "(nvlink, dcgm, all-reduce, pcie; the spec's allow_skip). Any other "
                                              "leaves the node unproven."),
) -> None:
    """Check this node's GPUs (nvidia-smi's ECC, row-remap and GPU count, NVLink, DCGM, an all-reduce held to the
    model's bandwidth floor, PCIe links); exit 0 when every check passed."""
    from gpufleet.reconciler.healthcheck.run import run_checks, write

    expected = gpus if gpus is not None else (int(os.environ[EXPECTED_GPUS]) if os.environ.get(EXPECTED_GPUS) else None)
    report = run_checks(dcgm_level, all_reduce, expected, allow_skip=frozenset(allow_skip))
    write(report, termination_log)
    if report.passed:
        verdict = "passed: "
    elif report.action != "none":
        verdict = f"failed (needs {report.action}): "
    else:
        verdict = f"not proven ({', '.join(report.unproven) or 'no check passed'}): "
    typer.echo(verdict + report.summary())
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)
