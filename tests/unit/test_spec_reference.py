"""docs/spec-reference.md is the schema's, so the page and the models cannot part: it is what
`gpufleet spec-reference` writes now, it lists every field of every model at its path, and each field says
what it is for."""
from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from gpufleet.fleetspec.models import FleetSpec
from gpufleet.cli import app
from gpufleet.spec_reference import render

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "spec-reference.md"
AGAIN = ("docs/spec-reference.md is not the schema's: write it again with "
         "`.venv/bin/gpufleet spec-reference > docs/spec-reference.md` (after a merge, too: never merge it by hand)")


def sections(text: str) -> dict[str, str]:
    """Each `## `path`` section's text, by path."""
    parts = re.split(r"^## `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def models_under(tp) -> list[type[BaseModel]]:
    """The models a field's type holds (through Optional, unions, lists and maps)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in models_under(arg)]


def field_paths(model: type[BaseModel], path: str) -> list[tuple[str, str, type[BaseModel]]]:
    """(section path, field name, model) for every field of the model and of the models under it."""
    out = []
    for name, info in model.model_fields.items():
        out.append((path, name, model))
        tp = info.annotation
        base = name if path == "gpufleet:fleet" else f"{path}.{name}"
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is list or (origin is typing.Union and any(typing.get_origin(a) is list for a in args)):
            base += "[]"
        elif origin is dict:
            base += ".<key>"
        for sub in models_under(tp):
            out += field_paths(sub, base)
    return out


def test_the_page_is_what_the_command_writes_from_the_schema():
    assert PAGE.read_text() == render(FleetSpec.model_json_schema()), AGAIN
    r = CliRunner().invoke(app, ["spec-reference"])
    assert r.exit_code == 0, r.output
    assert r.output == PAGE.read_text()


def test_every_field_of_every_model_is_on_the_page_at_its_path_with_a_description():
    found = sections(PAGE.read_text())
    missing, undescribed = [], []
    for path, name, model in field_paths(FleetSpec, "gpufleet:fleet"):
        # A union of models (notifications: webhook or sns) has a section per member, tagged.
        texts = [t for p, t in found.items() if p == path or p.startswith(f"{path} (")]
        rows = [line for t in texts for line in t.splitlines() if line.startswith(f"| `{name}` |")]
        if not rows:
            missing.append(f"{path}: {name} ({model.__name__})")
        elif any(line.rstrip(" |").endswith("|") or line.split(" | ")[-1].strip(" |") == "" for line in rows):
            undescribed.append(f"{path}.{name} ({model.__name__}): add Field(description=...)")
    assert not missing, missing
    assert not undescribed, undescribed


def test_a_field_added_to_the_models_changes_the_page():
    """The comparison above catches a model change: a new field, a new default, a new bound each show."""
    schema = FleetSpec.model_json_schema()
    pool = schema["$defs"]["NodePool"]["properties"]
    pool["gpus_per_node"]["maximum"] = 32
    assert "<= 32" in render(schema) and render(schema) != PAGE.read_text()
    pool["nvme_per_node"] = {"type": "integer", "default": 4, "description": "NVMe drives."}
    assert "| `nvme_per_node` | integer | `4` |  | NVMe drives. |" in render(schema)


def test_no_tracker_numbers_on_the_page():
    assert not re.search(r"\bissues? ?#?\d+", PAGE.read_text(), re.I)
