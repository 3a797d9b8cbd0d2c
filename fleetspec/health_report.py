"""The health check's verdict, as the check writes it to its container's termination log and the
reconciler reads it from the pod's status (never from a log line).

The kubelet keeps at most 4096 bytes of a termination message (Kubernetes' "Determine Reason for Pod
Failure" task: "The total message length across all containers is limited to 12KiB ... The default is
4096 bytes per container"), so `dumps` cuts the messages to fit. Which checks ran and which were
skipped is part of the verdict: a pass says what it proved. A check may be skipped only where the spec
allows it (`healing.repair.health_check.allow_skip`); a required check whose tool is not in the check's
image is `unproven`: the node is not shown broken, but it is not proven either, and it does not pass.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

LIMIT = 4096
EXPECTED_GPUS = "GPUFLEET_EXPECTED_GPUS"  # the check Job's one variable: the GPUs its node should have
PASS, FAIL, SKIP, UNPROVEN = "pass", "fail", "skip", "unproven"
CHECKS = ("nvidia-smi", "nvlink", "dcgm", "all-reduce", "pcie")  # what `gpufleet health-check` runs, in order
ACTIONS = ("none", "reset-gpu", "reboot", "replace")  # what a failed check says the node needs, mildest first


@dataclass(frozen=True)
class CheckOutcome:
    name: str  # one of CHECKS (a command of one's own may name its own)
    status: str  # pass | fail | skip | unproven
    message: str = ""
    gpus: tuple[str, ...] = ()  # the failing GPUs' PCI addresses
    action: str = "none"  # what this check's failure needs


@dataclass(frozen=True)
class HealthReport:
    checks: tuple[CheckOutcome, ...]

    @property
    def passed(self) -> bool:
        """Every check that ran passed, none is unproven (a required one whose tool is missing) and at least
        one passed: a skip is written only for a check the spec lets be skipped."""
        return bool(self.checks) and all(c.status in (PASS, SKIP) for c in self.checks) and \
            any(c.status == PASS for c in self.checks)

    @property
    def unproven(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if c.status == UNPROVEN)

    @property
    def action(self) -> str:
        """The most a failed check needs ('none' when it passed)."""
        failed = [c.action for c in self.checks if c.status == FAIL]
        return max(failed, key=ACTIONS.index) if failed else "none"

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(sorted({g for c in self.checks if c.status == FAIL for g in c.gpus}))

    def summary(self) -> str:
        parts = [f"{c.name}: {c.status}" + (f" ({c.message})" if c.message else "") for c in self.checks]
        return "; ".join(parts) or "no check ran"

    def dumps(self, limit: int = LIMIT) -> str:
        """The JSON, cut to fit `limit` bytes (messages shortened first, never the verdict)."""
        for room in (400, 120, 40, 0):
            doc = {"passed": self.passed, "action": self.action, "gpus": list(self.gpus),
                   "unproven": list(self.unproven), "checks": [{"name": c.name, "status": c.status, "message": c.message[:room], "gpus": list(c.gpus),
                               "action": c.action} for c in self.checks]}
            text = json.dumps(doc, separators=(",", ":"))
            if len(text.encode()) <= limit:
                return text
        return json.dumps({"passed": self.passed, "action": self.action, "gpus": list(self.gpus)[:8],
                           "unproven": list(self.unproven), "checks": []})


class UnreadableReport(ValueError):
    """A termination message that is not a health report (a command of the user's, or cut short)."""


@dataclass(frozen=True)
class Reading:
    """A termination message, read: its verdict, what its failures need, what it could not prove."""

    passed: bool
    action: str
    summary: str
    unproven: tuple[str, ...] = ()
    failed: bool = False  # a check failed (the node is shown broken), not only unproven


def loads(text: str) -> Reading:
    try:
        doc = json.loads(text)
        passed, action = bool(doc["passed"]), str(doc.get("action") or "none")
        checks = doc.get("checks") or []
        summary = "; ".join(f"{c['name']}: {c['status']}" + (f" ({c['message']})" if c.get("message") else "")
                            for c in checks)
        unproven = tuple(str(x) for x in doc.get("unproven") or ())
        failed = action != "none" or any(c.get("status") == FAIL for c in checks)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UnreadableReport(f"not a health report ({e.__class__.__name__}): {text[:200]!r}") from None
    if action not in ACTIONS:
        raise UnreadableReport(f"unknown action {action!r} in the health report")
    return Reading(passed, action, summary or ("passed" if passed else "failed"), unproven, failed)
