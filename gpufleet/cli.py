"""`gpufleet`: the command line for platform teams, on-call and drills (the console script's entry).

Exit codes: 0 ok, 1 the operation failed, 2 invalid input (spec or arguments).
Heavy imports (kubernetes, pulumi automation, boto3) happen inside the commands that need them,
so `gpufleet --help` and `gpufleet validate` stay fast.
"""
from __future__ import annotations

from gpufleet import (  # noqa: F401  (each registers its commands)
    capacity_commands, commands, local_commands, preflight, preview, spec_commands)
from gpufleet.console import EXIT_FAILED, EXIT_INVALID, app, load_spec

__all__ = ["app", "load_spec", "EXIT_FAILED", "EXIT_INVALID"]
