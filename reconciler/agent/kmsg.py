"""Read NVIDIA's GPU and NVSwitch reports out of a kernel log. Pure: lines in, events out.

The kernel log comes in several forms, all read here (one line at a time):
    6,2041,5678901234,-;NVRM: Xid (PCI:0000:18:00): 94, ...          /dev/kmsg (prio,seq,usec,flags;text)
    [ 1843.451234] NVRM: Xid (PCI:0000:b7:00): 48, ...               dmesg
    [Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, ...   dmesg -T
    Aug 10 15:36:05 gpu-node-a kernel: NVRM: Xid (...): 63, ...       journalctl -k, syslog (also ISO times)

Only the kernel is believed: a /dev/kmsg record of facility 0 (user space may write /dev/kmsg too,
with its own facility), a dmesg line (the kernel's ring buffer), or a syslog/journal line tagged
`kernel:`. The driver's text must start the message: `NVRM: Xid`, `nvidia-nvswitchN: SXid` or
`NVRM: The NVIDIA GPU` (a GPU lost at probe time, reported without an Xid over three lines; dmesg
indents the two continuation lines, /dev/kmsg escapes their newlines as \\x0a, rsyslog as #012).

The formats follow NVIDIA's open-gpu-kernel-modules: src/nvidia/src/kernel/gpu/rc/kernel_rc.c
(`NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, [pid=%s, name=%s, ]%s`; R515-R560
always print pid/name, `pid='<unknown>', name=<unknown>` when unknown, R570 on only when known;
R575 on append " caused by previous Xid N" to Xid 45), src/common/nvswitch/kernel/inc/common_nvswitch.h
(`nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, Fatal|Non-fatal, ...`), and
src/nvidia/arch/nvalloc/unix/src/osapi.c (the probe-time loss); drivers before the open modules print
`NVRM: Xid (0000:03:00): 14, ...` without `PCI:` (NVIDIA's Xid catalogue, step 1). Xid 144-150 carry
`<unit> Fatal|Nonfatal XC<n> i<n> Link <n> (<intrInfo> <errorStatus> ...)` (the catalogue's
WORKFLOW_NVLINK5_ERR).

Hostile lines never raise and never fault: every length is bounded, digits are ASCII only (str.isdigit
would read '٧٩' as 79), and the patterns are anchored with bounded repeats, so none can backtrack for
long. A line that starts like the driver's but does not parse is `Unreadable`, to be counted and logged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from fleetspec.faults import Kind

MAX_LINE = 4096    # characters of a line that are looked at (printk's records are under 1 KiB)
MAX_DETAIL = 512   # characters of the driver's text that are kept
_A = re.ASCII

_KMSG = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;]{0,64});", _A)
_DMESG = re.compile(r"\[ {0,12}(\d{1,12})\.(\d{1,9})\] ?", _A)
_DMESG_T = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4})\] ?", _A)
_SYSLOG = re.compile(r"([A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d)(?:\.\d{1,9})? ([^ ]{1,255}) ([^ ]{1,64}): ", _A)
_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?) ([^ ]{1,255}) "
                  r"([^ ]{1,64}): ", _A)
_GPU = re.compile(r"(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
                  r"(?: GPU-I:(\d{1,3}))?(?: GPU-CI:(\d{1,3}))?", _A)
_CODE = re.compile(r"(\d{1,6})(?:, |,$|$)", _A)
_SWITCH = re.compile(r"nvidia-(nvswitch\d{1,3}): SXid \(", _A)
_LOST = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?:$| )", _A)
_HEX = re.compile(r"0x([0-9a-fA-F]{1,8})", _A)
_SUBUNIT = re.compile(r"([A-Z0-9_/]{1,48}) (Fatal|Nonfatal|Non-fatal)(?: |$)", _A)

XID = "NVRM: Xid ("
LOST_END = "NVRM: fallen off the bus and is not responding to commands"
LOST_MIDDLE = "NVRM: (PCI ID: "
_MARKERS = ("NVRM: Xid", "SXid (", "NVRM: The NVIDIA GPU")
_SEVERITY = {"Fatal": True, "Nonfatal": False, "Non-fatal": False}
NVLINK5 = range(144, 151)


@dataclass(frozen=True)
class LogLine:
    """One line of a kernel log with its prefix taken apart."""

    form: str             # kmsg | dmesg | dmesg-T | syslog | continuation | other
    kernel: bool          # the kernel wrote it (see the module's docstring)
    message: str
    seq: int | None = None     # a /dev/kmsg record's number
    time: float | None = None  # seconds, comparable within one log


@dataclass(frozen=True)
class GpuEvent:
    """An Xid, an SXid or a GPU lost at probe time, as the driver reported it."""

    kind: Kind
    code: int                   # 0 for gpu-lost
    pci: str                    # as printed: 0000:3b:00 (Xid), 0000:05:00.0 (SXid, gpu-lost)
    text: str = ""              # the driver's words after the code (pid= and name= dropped)
    gpu_instance: int | None = None
    compute_instance: int | None = None
    fatal: bool | None = None   # SXid, Xid 144-150: the line's own word
    unit: str = ""              # Xid 144-150: the NVLink unit (NETIR_LINK_EVT, RLW_REMAP, ...)
    registers: tuple[int, ...] = ()  # Xid 144-150: intrInfo, errorStatus, ...
    seq: int | None = None
    time: float | None = None

    @property
    def gpu(self) -> str:
        """The GPU (or MIG instance) it happened on, for counting repeats."""
        return self.pci if self.gpu_instance is None else f"{self.pci}/{self.gpu_instance}"

    @property
    def message(self) -> str:
        where = self.pci
        if self.gpu_instance is not None:
            where += f" GPU-I:{self.gpu_instance:02d}"
        if self.compute_instance is not None:
            where += f" GPU-CI:{self.compute_instance:02d}"
        name = {Kind.XID: f"Xid {self.code}", Kind.SXID: f"SXid {self.code}", Kind.GPU_LOST: "GPU lost"}[self.kind]
        return f"{name} on PCI:{where}: {self.text}".rstrip(": ")


@dataclass(frozen=True)
class Unreadable:
    """A line that starts like the driver's but does not parse: counted and logged, never raised."""

    line: str
    why: str


@dataclass(frozen=True)
class Untrusted:
    """The driver's words where the kernel did not put them (user space, or inside other text)."""

    line: str
    why: str


Parsed = GpuEvent | Unreadable | Untrusted


def _int(digits: str | None) -> int | None:
    return int(digits) if digits else None


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
    for rx, fmt in ((_SYSLOG, "%b %d %H:%M:%S"), (_ISO, None)):
        if m := rx.match(line):
            text = line[m.end():]
            when = _wall(m.group(1), fmt) if fmt else _iso(m.group(1))
            if d := _DMESG.match(text):  # klogd keeps the kernel's own timestamp: "kernel: [ 12.3] NVRM: ..."
                text = text[d.end():]
            return LogLine("syslog", m.group(3) == "kernel", text, None, when)
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


def _detail(rest: str) -> str:
    """The driver's text after `N, `, without the pid= and name= fields (their values are bounded)."""
    for key, most in (("pid=", 24), ("name=", 110)):
        if rest.startswith(key):
            end = rest.find(", ", len(key), len(key) + most + 2)
            rest = rest[end + 2:] if end >= 0 else rest[len(key) + most:]
    return rest[:MAX_DETAIL]


def parse_xid(message: str, rec: LogLine) -> GpuEvent | Unreadable:
    """`NVRM: Xid (<gpu>): <code>[, <text>]`: the message already known to start with XID."""
    body = message[len(XID):]
    close = body.find("): ", 0, 64)
    if close < 0:
        return Unreadable(message[:200], "no '): ' after the GPU")
    gpu = _GPU.fullmatch(body[:close])
    if gpu is None:
        return Unreadable(message[:200], f"not a PCI address: {body[:close]!r}")
    rest = body[close + 3:]
    code = _CODE.match(rest)
    if code is None:
        return Unreadable(message[:200], "the code is not 1-6 ASCII digits")
    n = int(code.group(1))
    text = _detail(rest[code.end():])
    ev = GpuEvent(Kind.XID, n, gpu.group(1), text, _int(gpu.group(2)), _int(gpu.group(3)),
                  seq=rec.seq, time=rec.time)
    if n in NVLINK5:
        unit = _SUBUNIT.match(text)
        open_ = text.find("(", 0, 120)
        regs = tuple(int(h, 16) for h in _HEX.findall(text[open_ + 1:open_ + 100])[:8]) if open_ >= 0 else ()
        ev = GpuEvent(ev.kind, n, ev.pci, text, ev.gpu_instance, ev.compute_instance,
                      _SEVERITY[unit.group(2)] if unit else None, unit.group(1) if unit else "", regs,
                      rec.seq, rec.time)
    return ev


def parse_sxid(message: str, switch: re.Match, rec: LogLine) -> GpuEvent | Unreadable:
    body = message[switch.end():]
    close = body.find("): ", 0, 32)
    gpu = _GPU.fullmatch(body[:close]) if close >= 0 else None
    if gpu is None:
        return Unreadable(message[:200], "no PCI address after SXid")
    rest = body[close + 3:]
    code = _CODE.match(rest)
    if code is None:
        return Unreadable(message[:200], "the SXid code is not 1-6 ASCII digits")
    text = rest[code.end():][:MAX_DETAIL]
    word = text.split(",", 1)[0]
    return GpuEvent(Kind.SXID, int(code.group(1)), gpu.group(1), f"{switch.group(1)}: {text}",
                    fatal=_SEVERITY.get(word), seq=rec.seq, time=rec.time)


@dataclass
class _Pending:
    """The first line of a probe-time loss, waiting for its last (`LOST_END`)."""

    event: GpuEvent
    lines_left: int = 3


@dataclass
class KernelLogParser:
    """Lines in, events out. Keeps one thing between lines: the start of a three-line GPU loss."""

    pending: _Pending | None = field(default=None)

    def feed(self, line: str) -> list[Parsed]:
        rec = split_line(line)
        if rec.form == "continuation" or (rec.kernel and rec.message.startswith((LOST_MIDDLE, LOST_END))):
            return self._continue(_parts(rec.message))  # older kernels log each of the three lines alone
        self.pending = None
        if not rec.kernel:
            return [Untrusted(line[:200], f"not the kernel's ({rec.form})")] if _mentions(rec.message) else []
        parts = _parts(rec.message)
        out = self._message(parts[0], rec)
        return out + self._continue(parts[1:]) if len(parts) > 1 else out

    def feed_message(self, message: str) -> list[Parsed]:
        """A message already known to be the kernel's, without a prefix (as node-problem-detector
        copies /dev/kmsg messages into a condition)."""
        rec = LogLine("message", True, message[:MAX_LINE].strip())
        if self.pending is not None and rec.message.startswith((LOST_MIDDLE, LOST_END)):
            return self._continue([rec.message])
        self.pending = None
        return self._message(rec.message, rec)

    def _message(self, message: str, rec: LogLine) -> list[Parsed]:
        if message.startswith(XID):
            return [parse_xid(message, rec)]
        if switch := _SWITCH.match(message):
            return [parse_sxid(message, switch, rec)]
        if lost := _LOST.match(message):
            ev = GpuEvent(Kind.GPU_LOST, 0, lost.group(1), "fallen off the bus at probe time", seq=rec.seq,
                          time=rec.time)
            if LOST_END in message[lost.end():lost.end() + 200]:  # the three lines joined into one
                return [ev]
            self.pending = _Pending(ev)
            return []
        if _mentions(message):
            return [Untrusted(message[:200], "the driver's words inside another message")]
        return []

    def _continue(self, parts: list[str]) -> list[Parsed]:
        out: list[Parsed] = []
        for part in parts:
            p = self.pending
            if p is None:
                break
            if part.startswith(LOST_END):
                out.append(p.event)
                self.pending = None
            elif part.startswith(LOST_MIDDLE) and p.lines_left > 1:
                p.lines_left -= 1
            else:
                self.pending = None
        return out


def _mentions(text: str) -> bool:
    return any(m in text for m in _MARKERS)


def parse_line(line: str) -> list[Parsed]:
    """One line on its own (no continuation across lines)."""
    return KernelLogParser().feed(line)


def record_seq(line: str) -> int | None:
    """The sequence number of a /dev/kmsg record ("prio,seq,usec,flags;text"); None for other lines."""
    m = _KMSG.match(line[:128])
    return int(m.group(2)) if m else None
