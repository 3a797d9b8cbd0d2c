"""Read NVIDIA's GPU and NVSwitch reports out of a kernel log. Pure: lines in, events out.

The kernel log comes in several forms, all read here (one line at a time):
    6,2041,5678901234,-;NVRM: Xid (PCI:0000:18:00): 94, ...          /dev/kmsg (prio,seq,usec,flags;text)
    [ 1843.451234] NVRM: Xid (PCI:0000:b7:00): 48, ...               dmesg
    [Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, ...   dmesg -T
    Aug 10 15:36:05 gpu-node-a kernel: NVRM: Xid (...): 63, ...       journalctl -k, syslog (also ISO times)
    May 18 19:02:39 kernel: NVRM: Xid (...): 79, ...                  syslog without a host name
    Mär 10 15:36:05 gpu-node-a kernel: NVRM: Xid (...): 63, ...       journalctl -k in another locale (no time)

Only the kernel is believed: a /dev/kmsg record of facility 0 (user space may write /dev/kmsg too,
with its own facility), a dmesg line (the kernel's ring buffer), or a syslog/journal line tagged
`kernel:`. This module takes a line's prefix apart and decides whether to believe it; the driver's
message after the prefix is read by fleetspec/faults/driver.py (the formats and their sources are
named there), which the reconciler also uses for messages other detectors copy into a condition.
A GPU lost at probe time is reported over three lines: dmesg indents the two continuation lines,
/dev/kmsg escapes their newlines as \\x0a, rsyslog as #012.

Hostile lines never raise and never fault: every length is bounded and the prefix patterns are
anchored with bounded repeats, so none can backtrack for long.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpufleet.fleetspec.faults.driver import LOST_END, LOST_MIDDLE, DriverMessages, Parsed, PendingLoss, Untrusted, mentions

MAX_LINE = 4096    # characters of a line that are looked at (printk's records are under 1 KiB)
_A = re.ASCII

_KMSG = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;]{0,64});", _A)
_DMESG = re.compile(r"\[ {0,12}(\d{1,12})\.(\d{1,9})\] ?", _A)
_DMESG_T = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4})\] ?", _A)
# journalctl's short form writes the month in the reader's locale ("Mär", "déc."), so the month is any
# word of 2-5 letters (an English one also gives the time); the host is left out by some senders
# ("May 18 19:02:39 kernel: ..."): a tag then follows the time directly.
_STAMP = r"([^\W\d_]{2,5}\.? {1,2}[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.[0-9]{1,9})? "
_SYSLOG_NO_HOST = re.compile(_STAMP + r"([^ :]{1,64}): ")
_SYSLOG = re.compile(_STAMP + r"([^ ]{1,255}) ([^ ]{1,64}): ")
_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?) ([^ ]{1,255}) "
                  r"([^ ]{1,64}): ", _A)


@dataclass(frozen=True)
class LogLine:
    """One line of a kernel log with its prefix taken apart."""

    form: str             # kmsg | dmesg | dmesg-T | syslog | continuation | other
    kernel: bool          # the kernel wrote it (see the module's docstring)
    message: str
    seq: int | None = None     # a /dev/kmsg record's number
    time: float | None = None  # seconds, comparable within one log


def _wall(text: str, fmt: str) -> float | None:
    try:
        t = datetime.strptime(text, fmt)
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def split_line(line: str) -> LogLine:
    """Take a line's prefix apart: which form, whether the kernel wrote it, its text and time."""
    line = line[:MAX_LINE].rstrip("\r\n")
    if m := _KMSG.match(line):
        prio, seq, usec = int(m.group(1)), int(m.group(2)), int(m.group(3))
        return LogLine("kmsg", prio >> 3 == 0, line[m.end():], seq, usec / 1e6)
    if m := _DMESG.match(line):
        return LogLine("dmesg", True, line[m.end():], None, int(m.group(1)) + float("0." + m.group(2)))
    if m := _DMESG_T.match(line):
        return LogLine("dmesg-T", True, line[m.end():], None, _wall(m.group(1), "%a %b %d %H:%M:%S %Y"))
    for rx, fmt in ((_SYSLOG_NO_HOST, "%b %d %H:%M:%S"), (_SYSLOG, "%b %d %H:%M:%S"), (_ISO, None)):
        if m := rx.match(line):
            text = line[m.end():]
            when = _wall(" ".join(m.group(1).split()), fmt) if fmt else _iso(m.group(1))
            if d := _DMESG.match(text):  # klogd keeps the kernel's own timestamp: "kernel: [ 12.3] NVRM: ..."
                text = text[d.end():]
            return LogLine("syslog", m.group(m.lastindex) == "kernel", text, None, when)
    if line[:1] in (" ", "\t"):
        return LogLine("continuation", True, line.lstrip(" \t"))
    return LogLine("other", False, line)


def _iso(text: str) -> float | None:
    try:
        t = datetime.fromisoformat(text.replace(",", ".").replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _parts(message: str) -> list[str]:
    """A record's lines: /dev/kmsg escapes a newline inside a record as \\x0a, rsyslog as #012."""
    for sep in ("\\x0a", "#012"):
        if sep in message:
            return [p.strip() for p in message.split(sep)]
    return [message]


@dataclass
class KernelLogParser:
    """Lines in, events out: the prefix taken apart here, the kernel's messages read by the driver's
    reader (which keeps the start of a three-line GPU loss between lines)."""

    driver: DriverMessages = field(default_factory=DriverMessages)

    @property
    def pending(self) -> PendingLoss | None:
        """The start of a GPU loss whose last line has not come yet (None when there is none)."""
        return self.driver.pending

    def feed(self, line: str) -> list[Parsed]:
        rec = split_line(line)
        if rec.form == "continuation" or (rec.kernel and rec.message.startswith((LOST_MIDDLE, LOST_END))):
            return self.driver.continued(_parts(rec.message))  # older kernels log each of the three lines alone
        self.driver.pending = None
        if not rec.kernel:
            return [Untrusted(line[:200], f"not the kernel's ({rec.form})")] if mentions(rec.message) else []
        parts = _parts(rec.message)
        out = self.driver.message(parts[0], rec.seq, rec.time)
        return out + self.driver.continued(parts[1:]) if len(parts) > 1 else out

    def feed_message(self, message: str) -> list[Parsed]:
        """A message already known to be the kernel's, without a prefix."""
        return self.driver.feed_message(message)


def parse_line(line: str) -> list[Parsed]:
    """One line on its own (no continuation across lines)."""
    return KernelLogParser().feed(line)


def record_seq(line: str) -> int | None:
    """The sequence number of a /dev/kmsg record ("prio,seq,usec,flags;text"); None for other lines."""
    m = _KMSG.match(line[:128])
    return int(m.group(2)) if m else None
