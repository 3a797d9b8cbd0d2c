"""Where the local environment keeps what it runs: `.local/` in the checkout. GPUFLEET_LOCAL_DIR moves
it (tests give each run its own)."""
from __future__ import annotations

import os
from pathlib import Path

from gpufleet.paths import PROJECT_DIR, TOOLS_BIN

__all__ = ["PROJECT_DIR", "TOOLS_BIN", "LOCAL_DIR_ENV", "local_dir", "state_file"]

LOCAL_DIR_ENV = "GPUFLEET_LOCAL_DIR"


def local_dir() -> Path:
    return Path(os.environ.get(LOCAL_DIR_ENV) or PROJECT_DIR / ".local").resolve()


def state_file(root: Path | None = None) -> Path:
    """The environment's state file (:class:`gpufleet.local_cluster.LocalCluster`)."""
    return (root or local_dir()) / "env.json"
