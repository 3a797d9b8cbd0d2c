"""The `gpufleet` Typer application and what every command module shares: exit codes, errors,
loading a spec. Command modules import this; `gpufleet/cli.py` imports them all (no circle).

Exit codes: 0 ok, 1 the operation failed, 2 invalid input (spec or arguments).
"""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer

from gpufleet.fleetspec import SpecError, load_document, load_stack_file, stack_file
from gpufleet.fleetspec.models import FleetSpec

app = typer.Typer(
    help="gpufleet: self-healing GPU training clusters declared as code.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_FAILED = 1
EXIT_INVALID = 2


def _err(msg: str) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)


def refuse_jwt_key(where: str, instead: str) -> NoReturn:
    """Exit 2: the Slurm JWT key signs a token for any Slurm user, root included, so no command reads it
    outside the local environment (`reconcile`, `why`); `instead` names the token to give."""
    _err(f"--slurm-jwt-key-file: refused for {where}: the JWT key signs a token for any Slurm user, root "
         f"included, so it stays where slurmctld and the Token's controller read it; give {instead} instead")
    raise typer.Exit(EXIT_INVALID)


def load_spec(stack: Optional[str], file: Optional[Path], project_dir: Path = Path(".")) -> FleetSpec:
    """The fleet of a stack or a file; exits 2 with `path: reason` lines when invalid."""
    try:
        if file is not None:
            return load_document(file)
        return load_stack_file(stack_file(stack or "local", project_dir)).fleet
    except SpecError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    except FileNotFoundError as e:
        _err(f"no such file: {e.filename}")
        raise typer.Exit(EXIT_INVALID)


