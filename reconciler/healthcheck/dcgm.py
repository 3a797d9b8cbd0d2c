"""`dcgmi diag -r <level> -j`, read for the tests that failed and on which GPU.

Two shapes, by DCGM version: 3.x writes `{"DCGM GPU Diagnostic": {"test_categories": [{"category",
"tests": [{"name", "results": [{"gpu_ids"|"gpu_id", "status", "warnings": [{"warning", ...}]}]}]}]}}`
(NVIDIA/DCGM nvvs JsonOutput.cpp); 4.x renamed the top key to "DCGM Diagnostic", and each result names its
entity (`entity_group`, `entity_id`) (NVIDIA/DCGM v4.6.0 testing/python3/dcgm_diag_schema.json). Statuses
are compared without case (3.x samples write both `Pass` and `PASS`). A run DCGM could not make
(`runtime_error`) proves nothing either way: it reads as not run.

What a failure needs: a Hardware test (memory, the diagnostic, EUD) points at the GPU itself: the vendor;
anything else (deployment, integration, stress, performance) is first worth a reboot.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

HARDWARE = frozenset({"hardware"})
REBOOT, REPLACE = "reboot", "replace"


@dataclass(frozen=True)
class Failure:
    category: str
    test: str
    gpus: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def action(self) -> str:
        return REPLACE if self.category.lower() in HARDWARE else REBOOT


@dataclass(frozen=True)
class Report:
    ran: bool
    tests: int
    failures: tuple[Failure, ...]
    error: str = ""

    @property
    def healthy(self) -> bool:
        return self.ran and not self.failures


class Unreadable(ValueError):
    pass


def parse(text: str) -> Report:
    """dcgmi prints a line before its JSON ("Successfully ran diagnostic for group."): the JSON starts at
    the first `{`."""
    start = text.find("{")
    if start < 0:
        raise Unreadable(f"no JSON in dcgmi's output: {text[:200]!r}")
    try:
        doc = json.loads(text[start:])
    except ValueError as e:
        raise Unreadable(f"dcgmi's JSON does not read: {e}") from None
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict):
        raise Unreadable(f"neither 'DCGM Diagnostic' nor 'DCGM GPU Diagnostic' in {sorted(doc)[:5]}")
    if body.get("runtime_error"):
        return Report(False, 0, (), str(body["runtime_error"]))
    failures, tests = [], 0
    for cat in body.get("test_categories") or []:
        for test in cat.get("tests") or []:
            tests += 1
            bad = [r for r in test.get("results") or [] if str(r.get("status", "")).lower() == "fail"]
            if not bad:
                continue
            gpus = tuple(str(r.get("gpu_ids", r.get("gpu_id", r.get("entity_id", "?")))) for r in bad)
            warnings = tuple(str(w.get("warning", "")) for r in bad for w in r.get("warnings") or [])
            failures.append(Failure(str(cat.get("category", "")), str(test.get("name", "")), gpus, warnings))
    return Report(True, tests, tuple(failures))
