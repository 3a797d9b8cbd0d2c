"""Where the project keeps what it builds and runs: tools, the local environment, Pulumi state.

GPUFLEET_LOCAL_DIR moves the local environment (tests give each run its own).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
TOOLS_BIN = PROJECT_DIR / ".tools" / "bin"


def local_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_LOCAL_DIR") or PROJECT_DIR / ".local").resolve()


def local_kubeconfig() -> Path:
    return local_dir() / "kube" / "kubeconfig"


def default_kubeconfig(stack: str | None) -> Path | None:
    """The local cluster's kubeconfig for the local stack (or no stack); else the user's default."""
    if stack in (None, "local") and local_kubeconfig().exists():
        return local_kubeconfig()
    return None


def local_state_file() -> Path:
    return local_dir() / "env.json"


def local_slurm_env() -> dict[str, str] | None:
    """Environment for Slurm clients of the local cluster (SLURM_CONF), when it runs."""
    f = local_state_file()
    if not f.exists():
        return None
    conf = json.loads(f.read_text()).get("slurm_conf")
    if not conf:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))}
    env["SLURM_CONF"] = conf
    # The local Slurm's tools are wrappers that run them in its Slurm 26.05 root.
    env["PATH"] = f"{Path(conf).parent.parent / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def local_slurm_rest() -> tuple[str, str] | None:
    """(slurmrestd URL, JWT key file) of the running local environment, if any."""
    f = local_state_file()
    if not f.exists():
        return None
    state = json.loads(f.read_text())
    if not state.get("slurm_rest_url") or not state.get("slurm_jwt_key"):
        return None
    return state["slurm_rest_url"], state["slurm_jwt_key"]
