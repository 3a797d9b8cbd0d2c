"""What the repair loop writes on a node and reads back (issue 25), as typed data with one JSON form.

- `RepairRequest` (annotation `gpufleet.io/repair-request`, by the reconciler): reset these GPUs, or
  reboot. Whoever acts on the node (the node agent; in the local environment the GPU hardware stand-in)
  acts once per `id`, so writing the same request again after a crash repeats nothing.
- `RepairResult` (annotation `gpufleet.io/repair-result`, by whoever acted): how request `id` went.
- `HealthCheckRecord` (annotation `gpufleet.io/health-check`, by the reconciler): the node's last
  health check, on which boot, and its verdict; a spare serves only with a passed one for its boot.

An annotation that does not read back is treated as absent (`parse_*` return None): each absence is the
safe side (no result: the step times out and the ladder climbs; no passed check: the node is checked).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, TypeVar

RESET_GPU, REBOOT = "reset-gpu", "reboot"
RUNNING, PASSED, FAILED = "running", "passed", "failed"
UNPROVEN = "unproven"  # the check could not prove the node (a required tool not in its image): it does not serve
MAX_MESSAGE = 1000

T = TypeVar("T")


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _parse(text: str | None, build: Callable[[dict], T]) -> T | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return build(data) if isinstance(data, dict) else None
    except (ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True)
class RepairRequest:
    id: str  # once per id: "<remediation>/<attempt>-<action>"
    action: str  # reset-gpu | reboot
    at: datetime
    gpus: tuple[str, ...] = ()  # PCI addresses as the driver printed them; () = every GPU of the node

    def dumps(self) -> str:
        return json.dumps({"id": self.id, "action": self.action, "gpus": list(self.gpus), "at": self.at.isoformat()})


# A GPU as the repair request names it: its PCI bus id, as the driver prints it in an Xid line (`0000:3b:00`) or
# nvidia-smi in its own (`00000000:3B:00.0`): domain, bus, device, optional function. `nvidia-smi -i` takes
# that form among others (an index, a UUID); a request names no GPU in any other form.
PCI_BUS_ID = re.compile(r"(?:[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?")


def bad_gpu_ids(gpus) -> list[str]:
    """The GPU ids of a request that are not PCI bus ids: nothing of them reaches a host command."""
    return [g for g in gpus if not PCI_BUS_ID.fullmatch(g)]


def parse_request(text: str | None) -> RepairRequest | None:
    def build(d: dict) -> RepairRequest:
        if d["action"] not in (RESET_GPU, REBOOT):
            raise ValueError(d["action"])
        return RepairRequest(str(d["id"]), d["action"], _time(d["at"]), tuple(str(g) for g in d.get("gpus") or ()))
    return _parse(text, build)


@dataclass(frozen=True)
class RepairResult:
    id: str  # the request it answers
    ok: bool
    message: str
    at: datetime
    boot: str = ""  # the node's boot id when it answered

    def dumps(self) -> str:
        return json.dumps({"id": self.id, "ok": self.ok, "message": self.message[:MAX_MESSAGE],
                           "at": self.at.isoformat(), "boot": self.boot})


def parse_result(text: str | None) -> RepairResult | None:
    return _parse(text, lambda d: RepairResult(str(d["id"]), bool(d["ok"]), str(d.get("message") or ""),
                                               _time(d["at"]), str(d.get("boot") or "")))


@dataclass(frozen=True)
class HealthCheckRecord:
    job: str
    boot: str  # the boot it ran on: a reboot makes a passed check stale
    state: str  # running | passed | failed | unproven
    at: datetime  # started (running) or decided (passed, failed)
    message: str = ""
    action: str = ""  # failed: what the check says the node needs (reset-gpu, reboot, replace)

    @property
    def passed(self) -> bool:
        return self.state == PASSED

    def proves(self, boot: str) -> bool:
        return self.passed and self.boot == boot

    def dumps(self) -> str:
        return json.dumps({"job": self.job, "boot": self.boot, "state": self.state, "at": self.at.isoformat(),
                           "message": self.message[:MAX_MESSAGE], "action": self.action})


def parse_check(text: str | None) -> HealthCheckRecord | None:
    def build(d: dict) -> HealthCheckRecord:
        if d["state"] not in (RUNNING, PASSED, FAILED, UNPROVEN):
            raise ValueError(d["state"])
        return HealthCheckRecord(str(d["job"]), str(d.get("boot") or ""), d["state"], _time(d["at"]),
                                 str(d.get("message") or ""), str(d.get("action") or ""))
    return _parse(text, build)
