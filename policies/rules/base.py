"""What a rule is: a name, a description, a validate function and its config schema.

`policies/__main__.py` turns each into a pulumi_policy Resource/StackValidationPolicy; tests
call `validate` directly with ResourceValidationArgs / StackValidationArgs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    validate: Callable[[Any, Callable[..., None]], None]
    scope: Literal["resource", "stack"] = "resource"
    config_schema: dict[str, dict] = field(default_factory=dict)
    remediation: str = ""

    def defaults(self) -> dict[str, Any]:
        return {k: v["default"] for k, v in self.config_schema.items() if "default" in v}
