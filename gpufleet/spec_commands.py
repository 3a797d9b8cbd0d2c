"""`gpufleet validate`, `gpufleet spec-schema` and `gpufleet spec-reference`: the fleet spec from the command line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from gpufleet.fleetspec import SpecError, load_document, load_stack_file, stack_file
from gpufleet.fleetspec.models import FleetSpec

from gpufleet.console import EXIT_INVALID, _err, app


@app.command()
def validate(
    file: Optional[Path] = typer.Argument(None, help="A stack file (Pulumi.<env>.yaml) or a bare fleet document."),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="Validate Pulumi.<STACK>.yaml in this folder."),
) -> None:
    """Validate an environment's fleet spec. Exit 0 when valid, 2 with the field path and reason when not."""
    if file is not None and stack is not None:
        _err("give a FILE or --stack, not both")
        raise typer.Exit(EXIT_INVALID)
    path = file if file is not None else stack_file(stack or "local")
    try:
        sf = load_stack_file(path) if file is None or _is_stack_file(path) else None
        fleet = sf.fleet if sf else load_document(path)
    except SpecError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    except FileNotFoundError:
        _err(f"no such file: {path}")
        raise typer.Exit(EXIT_INVALID)
    nodes = sum(p.nodes for p in fleet.pools)
    spares = sum(p.spares for p in fleet.pools)
    gpus = sum((p.nodes + p.spares) * p.gpus_per_node for p in fleet.pools)
    typer.echo(
        f"{path}: valid. environment {fleet.environment}: {len(fleet.pools)} pools, {nodes} nodes + {spares} spares "
        f"({gpus} GPUs), partitions {[p.name for p in fleet.slurm.partitions]}, healing "
        f"{'on' if fleet.healing.enabled else 'OFF'} (grace {fleet.healing.grace_period_seconds}s)"
    )
    if sf and sf.missing_secrets():
        typer.secho(
            "note: secrets not set yet (pulumi up needs them): "
            + ", ".join(f"pulumi config set --secret {k} ..." for k in sf.missing_secrets()),
            fg=typer.colors.YELLOW, err=True,
        )


def _is_stack_file(path: Path) -> bool:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "config" in doc


@app.command("spec-schema")
def spec_schema() -> None:
    """Print the JSON schema of the fleet spec (the value of `gpufleet:fleet`), for editors."""
    typer.echo(json.dumps(FleetSpec.model_json_schema(), indent=2))


@app.command("spec-reference")
def spec_reference() -> None:
    """Print the spec reference (Markdown, docs/spec-reference.md): every field with its type, default,
    constraints and description, from the same schema as `gpufleet spec-schema`."""
    from gpufleet.spec_reference import render

    typer.echo(render(FleetSpec.model_json_schema()), nl=False)
