"""The spec reference (`docs/spec-reference.md`), written from the fleet spec's JSON schema, the one
`gpufleet spec-schema` prints, so the page and the models cannot part: every field at its path, with its
type, default, constraints and description. A test renders it again and compares it with the committed file.

A section per object: the whole document (`gpufleet:fleet`), then each object under it at its path
(`pools[]` is each item of the list `pools`, `pools[].lending` its `lending`; `<key>` a map's values).
"""
from __future__ import annotations

import json
from typing import Any

HEADER = """# Spec reference

Every field of the fleet spec, the value of `gpufleet:fleet` in an environment's stack file
(`Pulumi.<env>.yaml`), generated from its schema (`gpufleet spec-schema`) by `gpufleet spec-reference`;
do not edit it by hand: `gpufleet spec-reference > docs/spec-reference.md` writes it again, and a test
fails when the two differ. Unknown keys are refused. Rules that join several fields (a partition names a
pool that exists, a floor of spares no larger than the pool's spares, ...) are checked by
`gpufleet validate`, which names the field; they are not listed here. How to use the spec:
[platform.md](platform.md).
"""

_CONSTRAINTS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"),
                ("exclusiveMaximum", "< {}"), ("minLength", "length >= {}"), ("maxLength", "length <= {}"),
                ("minItems", "items >= {}"), ("maxItems", "items <= {}"), ("pattern", "matches `{}`"),
                ("format", "format {}"))


class _Schema:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(self, s: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in s:
            merged = {**self.defs[s["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in s.items() if k != "$ref"}}
            return merged
        return s

    def type_of(self, s: dict[str, Any]) -> str:
        s2 = self.resolve(s)
        if "anyOf" in s2 or "oneOf" in s2:
            options = [o for o in s2.get("anyOf", s2.get("oneOf", [])) if o.get("type") != "null"]
            nullable = len(options) < len(s2.get("anyOf", s2.get("oneOf", [])))
            text = " or ".join(self.type_of(o) for o in options)
            return f"{text} or null" if nullable else text
        if "enum" in s2:
            return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in s2["enum"])
        if "const" in s2:
            return f"`{json.dumps(s2['const'])}`"
        t = s2.get("type")
        if t == "array":
            return f"list of {self.type_of(s2.get('items', {}))}"
        if t == "object" or "properties" in s2:
            if "properties" in s2:
                return "object"
            extra = s2.get("additionalProperties")
            return f"map of string to {self.type_of(extra)}" if isinstance(extra, dict) else "map"
        if isinstance(t, list):
            return " or ".join(t)
        return t or "any"

    def children(self, path: str, s: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        """The objects under a field, each at its path, with the tag of a union's member ('' elsewhere)."""
        s2 = self.resolve(s)
        if "properties" in s2:
            return [(path, "", s2)]
        found: list[tuple[str, str, dict[str, Any]]] = []
        options = [o for o in s2.get("anyOf", s2.get("oneOf", [])) if o.get("type") != "null"]
        tagged = len([o for o in options if "properties" in self.resolve(o)]) > 1
        for o in options:
            for p, tag, obj in self.children(path, o):
                found.append((p, (_tag(obj) or "") if tagged else tag, obj))
        if s2.get("type") == "array":
            found += self.children(f"{path}[]", s2.get("items", {}))
        if isinstance(s2.get("additionalProperties"), dict):
            found += self.children(f"{path}.<key>", s2["additionalProperties"])
        return found


def _tag(obj: dict[str, Any]) -> str | None:
    """A union member's distinguishing field (pydantic's discriminator: a one-value enum or const)."""
    for name, p in obj.get("properties", {}).items():
        if "const" in p:
            return f"{name}: {p['const']}"
        if len(p.get("enum", [])) == 1:
            return f"{name}: {p['enum'][0]}"
    return obj.get("title")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _constraints(sch: _Schema, s: dict[str, Any]) -> str:
    s2 = sch.resolve(s)
    parts = [fmt.format(s2[k]) for k, fmt in _CONSTRAINTS if k in s2]
    for o in s2.get("anyOf", []):
        parts += [fmt.format(o[k]) for k, fmt in _CONSTRAINTS if k in o]
    if s2.get("uniqueItems"):
        parts.append("unique")
    if s2.get("type") == "array":
        parts += [f"each {c}" for c in [_constraints(sch, s2.get("items", {}))] if c]
    if isinstance(s2.get("additionalProperties"), dict):
        parts += [f"each value {c}" for c in [_constraints(sch, s2["additionalProperties"])] if c]
    if "propertyNames" in s2:
        parts += [f"each key {c}" for c in [_constraints(sch, s2["propertyNames"])] if c]
    return "; ".join(parts)


def _default(name: str, field: dict[str, Any], required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" in field:
        return f"`{json.dumps(field['default'])}`"
    return "optional"


def _description(sch: _Schema, field: dict[str, Any]) -> str:
    """The field's own description, else that of the object it holds (its model's docstring)."""
    if field.get("description"):
        return field["description"]
    inner = [field, *field.get("anyOf", []), field.get("items", {})]
    for s in inner:
        if "$ref" in s and sch.resolve(s).get("description"):
            return sch.resolve(s)["description"]
        if s is not field and "items" in s:
            return _description(sch, s["items"])
    return ""


def render(schema: dict[str, Any]) -> str:
    """The reference page for a fleet spec's JSON schema."""
    sch = _Schema(schema)
    out = [HEADER]
    queue: list[tuple[str, str, dict[str, Any]]] = [("gpufleet:fleet", "", schema)]
    seen: set[str] = set()
    while queue:
        path, tag, obj = queue.pop(0)
        heading = f"{path} ({tag})" if tag else path
        if heading in seen:
            continue
        seen.add(heading)
        out.append(f"## `{heading}`\n")
        if obj.get("description"):
            out.append(_cell(obj["description"]) + "\n")
        required = set(obj.get("required", []))
        rows = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
        below: list[tuple[str, str, dict[str, Any]]] = []
        for name, field in obj.get("properties", {}).items():
            rows.append(f"| `{name}` | {_cell(sch.type_of(field))} | {_cell(_default(name, field, required))} | "
                        f"{_cell(_constraints(sch, field))} | {_cell(_description(sch, field))} |")
            base = name if path == "gpufleet:fleet" else f"{path}.{name}"
            below += sch.children(base, field)
        out.append("\n".join(rows) + "\n")
        queue = below + queue  # depth first: an object's parts follow it
    return "\n".join(out)
