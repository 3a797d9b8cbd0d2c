"""NVIDIA XID catalogue: which error codes mean the node needs a reset or a replacement.

From NVIDIA's "XID Errors" documentation. Application-caused codes (a bad kernel, an
out-of-bounds access) must never take a node out of service: restarting the job on
another GPU would hit the same bug.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class XidClass(str, Enum):
    CRITICAL = "critical"        # hardware: drain, replace
    APPLICATION = "application"  # the job's fault: never remediate
    INFO = "info"                # everything else: recorded, not acted on


@dataclass(frozen=True)
class Xid:
    code: int
    name: str
    cls: XidClass


_CATALOGUE = [
    Xid(13, "Graphics engine exception", XidClass.APPLICATION),
    Xid(31, "GPU memory page fault", XidClass.APPLICATION),
    Xid(43, "GPU stopped processing", XidClass.APPLICATION),
    Xid(45, "Preemptive cleanup, due to previous errors", XidClass.APPLICATION),
    Xid(48, "Double bit ECC error", XidClass.CRITICAL),
    Xid(61, "Internal micro-controller breakpoint/warning", XidClass.CRITICAL),
    Xid(62, "Internal micro-controller halt", XidClass.CRITICAL),
    Xid(63, "ECC page retirement or row remapping recording event", XidClass.CRITICAL),
    Xid(64, "ECC page retirement or row remapper recording failure", XidClass.CRITICAL),
    Xid(74, "NVLink error", XidClass.CRITICAL),
    Xid(79, "GPU has fallen off the bus", XidClass.CRITICAL),
    Xid(92, "High single-bit ECC error rate", XidClass.CRITICAL),
    Xid(94, "Contained ECC error", XidClass.CRITICAL),
    Xid(95, "Uncontained ECC error", XidClass.CRITICAL),
    Xid(119, "GSP RPC timeout", XidClass.CRITICAL),
    Xid(120, "GSP error", XidClass.CRITICAL),
    Xid(140, "Unrecovered ECC error", XidClass.CRITICAL),
    Xid(154, "GPU recovery action changed (reset or reboot required)", XidClass.CRITICAL),
]

CATALOGUE: dict[int, Xid] = {x.code: x for x in _CATALOGUE}
DEFAULT_CRITICAL: tuple[int, ...] = tuple(x.code for x in _CATALOGUE if x.cls is XidClass.CRITICAL)
APPLICATION: frozenset[int] = frozenset(x.code for x in _CATALOGUE if x.cls is XidClass.APPLICATION)


def describe(code: int) -> str:
    x = CATALOGUE.get(code)
    return f"XID {code} ({x.name})" if x else f"XID {code}"
