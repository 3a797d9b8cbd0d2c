"""`gpufleet`: the command line for platform teams, on-call and drills (the console script's entry).

Exit codes: 0 ok, 1 the operation failed, 2 invalid input (spec or arguments).
Heavy imports (kubernetes, pulumi automation, boto3) happen inside the commands that need them,
so `gpufleet --help` and `gpufleet validate` stay fast.

The one plugin hook: :func:`load_plugins` adds the commands of the packages named in
:data:`PLUGINS` that are importable (each has ``register(app)``). Today that is the local development
environment (`localenv`: `gpufleet local`, `gpufleet demo`), importable in a development checkout
only; the wheel and the images do not ship it, so an installed gpufleet has only the product's commands.
"""
from __future__ import annotations

import importlib

from gpufleet import (  # noqa: F401  (each registers its commands)
    capacity_commands, commands, health_commands, kmsg_commands, oncall_commands, preflight, preview, spec_commands,
    why_command)
from gpufleet.console import EXIT_FAILED, EXIT_INVALID, app, load_spec

__all__ = ["app", "load_spec", "EXIT_FAILED", "EXIT_INVALID", "PLUGINS", "load_plugins"]

PLUGINS = ("localenv.commands",)


def load_plugins(app=app) -> list[str]:
    """Register the commands of each importable plugin; return the ones registered. A plugin that is
    absent is skipped; one that is present but fails to import raises (a broken checkout says so)."""
    loaded = []
    for name in PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # not shipped here (an installed wheel)
            raise
        module.register(app)
        loaded.append(name)
    return loaded


load_plugins()
