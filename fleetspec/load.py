"""Load and validate a fleet spec, turning pydantic's errors into `path: reason` lines.

A spec comes from a Pulumi stack file (`Pulumi.<env>.yaml`, key `gpufleet:fleet`), from
the live stack config inside the Pulumi program, or from a bare YAML document.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .models import FieldError, FleetSpec

PROJECT = "gpufleet"
CONFIG_KEY = f"{PROJECT}:fleet"


@dataclass
class SpecError(Exception):
    """The spec is invalid. `issues` holds (field path, reason) pairs, the path rooted at
    the config key, e.g. ("gpufleet:fleet.pools[1].spares", "Input should be ...")."""

    source: str
    issues: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"invalid fleet spec in {self.source}:"]
        lines += [f"  {path}: {reason}" for path, reason in self.issues]
        return "\n".join(lines)


def _path(loc: tuple[Any, ...]) -> str:
    out = CONFIG_KEY
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("webhook", "sns", "function-after[_k8s_name(), str]"):
            continue  # discriminator and validator tags say nothing to a user
        elif isinstance(part, str) and part.startswith("function-after["):
            continue
        else:
            out += f".{part}"
    return out


def _issues(err: ValidationError) -> list[tuple[str, str]]:
    issues = []
    for e in err.errors():
        loc = tuple(e["loc"])
        msg = e["msg"]
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            if cause.path:
                loc += tuple(int(p) if p.isdigit() else p for p in _split(cause.path))
            msg = str(cause)
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see `gpufleet spec-schema`)"
        issues.append((_path(loc), msg))
    return issues


def _split(path: str) -> list[str]:
    """'slurm.partitions[1].pools' -> ['slurm', 'partitions', '1', 'pools']"""
    return [p for p in path.replace("[", ".").replace("]", "").split(".") if p]


def parse_fleet(raw: Any, *, source: str = CONFIG_KEY) -> FleetSpec:
    if raw is None:
        raise SpecError(source, [(CONFIG_KEY, "missing: the stack config declares no fleet")])
    if not isinstance(raw, dict):
        raise SpecError(source, [(CONFIG_KEY, f"must be a mapping, not {type(raw).__name__}")])
    try:
        return FleetSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(source, _issues(err)) from None


@dataclass(frozen=True)
class StackFile:
    """A parsed `Pulumi.<env>.yaml`: the fleet and which config keys hold secrets."""

    path: Path
    fleet: FleetSpec
    secure_keys: frozenset[str]
    plain_keys: frozenset[str]

    def missing_secrets(self) -> list[str]:
        return [k for k in self.fleet.secret_keys() if k not in self.secure_keys]


def load_stack_file(path: str | Path) -> StackFile:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise SpecError(str(path), [("file", e.strerror or str(e))]) from None
    except yaml.YAMLError as e:
        raise SpecError(str(path), [("yaml", str(e))]) from None
    config = doc.get("config") or {}
    fleet = parse_fleet(config.get(CONFIG_KEY), source=str(path))
    secure, plain = set(), set()
    for key, value in config.items():
        short = key.split(":", 1)[1] if key.startswith(PROJECT + ":") else key
        (secure if isinstance(value, dict) and "secure" in value else plain).add(short)
    leaked = [k for k in fleet.secret_keys() if k in plain]
    if leaked:
        raise SpecError(
            str(path),
            [(f"{PROJECT}:{k}", f"holds a secret in plain text: run `pulumi config set --secret {k} ...`") for k in leaked],
        )
    return StackFile(path, fleet, frozenset(secure), frozenset(plain))


def load_document(path: str | Path) -> FleetSpec:
    """A stack file, or a bare fleet document (the value of `gpufleet:fleet` alone)."""
    path = Path(path)
    text = path.read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(str(path), [("yaml", str(e))]) from None
    if isinstance(doc, dict) and "config" in doc:
        return load_stack_file(path).fleet
    return parse_fleet(doc, source=str(path))


def stack_file(stack: str, project_dir: str | Path = ".") -> Path:
    return Path(project_dir) / f"Pulumi.{stack}.yaml"
