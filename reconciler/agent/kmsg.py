"""Parse NVIDIA XID reports out of the kernel log. Pure: lines in, events out.

The driver writes lines like
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
read through /dev/kmsg ("6,1234,5678901,-;NVRM: ...") or dmesg ("[ 12.345] NVRM: ...").
A line that mentions an Xid but does not parse is reported as malformed, never raised.
A /dev/kmsg record also carries its sequence number (`record_seq`), which the agent uses to
remember how far it has reported.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_KMSG_HEADER = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?$")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str
    detail: str

    @property
    def message(self) -> str:
        return f"Xid {self.xid} on {self.pci}: {self.detail}".rstrip(": ")


@dataclass(frozen=True)
class Malformed:
    line: str


def parse_line(line: str) -> XidEvent | Malformed | None:
    """An XidEvent, Malformed for an Xid line that does not parse, None for any other line."""
    if "NVRM: Xid" not in line:
        return None
    text = line.rstrip("\n")
    if ";" in text.split("NVRM:", 1)[0]:  # /dev/kmsg record header
        text = text.split(";", 1)[1]
    m = _XID.search(text)
    if not m:
        return Malformed(line.rstrip("\n"))
    detail = (m.group("rest") or "").strip()
    detail = re.sub(r"^pid=('?[^,]*'?),\s*", "", detail)
    detail = re.sub(r"^name=[^,]*,\s*", "", detail)
    return XidEvent(int(m.group("xid")), m.group("pci"), detail)


def record_seq(line: str) -> int | None:
    """The sequence number of a /dev/kmsg record ("prio,seq,usec,flags;text"); None for other lines."""
    m = _KMSG_HEADER.match(line)
    return int(m.group("seq")) if m else None
