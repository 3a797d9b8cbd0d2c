"""Where a local development cluster is: the typed state file its environment writes, read here.

The local environment (`localenv/`, in a development checkout only) records, when it comes up, what a
command needs to reach it: the kubeconfig, the Slurm clients' configuration, slurmrestd and its JWT key,
and the local stack's Pulumi backend and generated stack configuration. It writes that file through
:class:`LocalCluster` and every reader reads it through the same model. The product never imports the
environment: it finds the file through the ``GPUFLEET_LOCAL_STATE`` environment variable, else where the
environment's CLI plugin said it is when it registered (:func:`set_default_state`; a development checkout
only). Explicit flags (``--kubeconfig``, ``--slurm-url``...) always win.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, ValidationError

STATE_ENV = "GPUFLEET_LOCAL_STATE"
LOCAL_PASSPHRASE = "gpufleet-local"  # the local stack's secrets passphrase (docs/local.md); PULUMI_CONFIG_PASSPHRASE overrides


class LocalClusterError(RuntimeError):
    """The state file is there but unreadable."""


class LocalCluster(BaseModel):
    """The environment's state file (`env.json`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    environment: str
    kubeconfig: Path
    slurm_conf: Path
    slurm_bin_dir: Path           # wrappers that run the Slurm clients (scontrol, squeue...) against it
    slurm_rest_url: str
    slurm_jwt_key: Path
    pulumi_backend_url: str       # the local stack's state (a file backend)
    pulumi_config_file: Path      # the local stack's configuration with what the environment supplies

    def slurm_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients of this cluster: `base` (os.environ) without another cluster's
        SLURM_* variables, with SLURM_CONF and the wrappers first on PATH."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"))}
        env["SLURM_CONF"] = str(self.slurm_conf)
        env["PATH"] = f"{self.slurm_bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> "LocalCluster":
        try:
            return LocalCluster.model_validate_json(Path(path).read_text())
        except ValidationError as e:
            raise LocalClusterError(f"{path}: not a local environment's state file ({e.error_count()} error(s): "
                                    f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}); `gpufleet local up` writes "
                                    f"it again") from None


_default_state: Callable[[], Path] | None = None


def set_default_state(where: Callable[[], Path]) -> None:
    """Where the state file is when GPUFLEET_LOCAL_STATE is unset: the development environment's CLI
    plugin says so when it registers (localenv/commands.py); an installed gpufleet has no default."""
    global _default_state
    _default_state = where


def state_path() -> Path | None:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    return _default_state() if _default_state is not None else None


def find() -> LocalCluster | None:
    """The local cluster whose state file `state_path` names, when that file exists (the environment is up)."""
    path = state_path()
    if path is None or not path.is_file():
        return None
    return LocalCluster.read(path)
