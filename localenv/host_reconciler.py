"""`gpufleet reconcile` as a host process of the local environment: the one way the harness (and the
benchmarks) run the reconciler outside its pods. Everything it needs is on its command line; it never
reads another environment's state (GPUFLEET_LOCAL_STATE points at this run's own file)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from gpufleet.local_cluster import STATE_ENV
from localenv.paths import PROJECT_DIR
from localenv.supervisor import Proc


def reconciler_proc(name: str, kubeconfig: Path, policy: Path, state_file: Path, *, slurm: str = "rest",
                    slurm_url: str | None = None, jwt_key: Path | None = None, metrics_port: int = 0,
                    env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
                    launcher: Sequence[str] = ("-m", "gpufleet"), wrapper: Sequence[str] = ()) -> Proc:
    """The supervised process: `wrapper` (e.g. a profiler) runs `python <launcher> reconcile ...`
    (`launcher`: a script that wraps the CLI, e.g. bench/_count_calls.py, instead of `-m gpufleet`)."""
    argv = [*wrapper, sys.executable, *launcher, "reconcile", "--policy", str(policy), "--kubeconfig", str(kubeconfig),
            "--slurm", slurm, "--leader-elect", "--metrics-port", str(metrics_port)]
    if slurm_url:
        argv += ["--slurm-url", slurm_url]
    if jwt_key:
        argv += ["--slurm-jwt-key-file", str(jwt_key)]
    argv += list(extra_args)
    return Proc(name, argv, _up, ports=(metrics_port,) if metrics_port else (),
                env={**os.environ, **(env or {}), STATE_ENV: str(state_file)}, cwd=PROJECT_DIR)


def _up() -> bool:
    """It runs (the supervisor checks that); its work is checked by what waits for it (its Lease, its log)."""
    return True
