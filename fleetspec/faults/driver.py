"""NVIDIA's driver messages read into events: an Xid, an NVSwitch SXid, a GPU lost at probe time. Pure.

A message here is the driver's text with the kernel log's prefix already taken off: the node agent
(reconciler/agent/kmsg.py) takes the prefix apart and decides whether the kernel wrote the line; the
reconciler reads the same messages where another detector copies them into a node condition
(node-problem-detector's kmsg monitor; reconciler/core/faults.py). One reader serves both, so a line
means the same thing wherever it is read.

The driver's text must start the message: `NVRM: Xid`, `nvidia-nvswitchN: SXid` or `NVRM: The NVIDIA
GPU` (a GPU lost at probe time, reported without an Xid over three lines).

The formats follow NVIDIA's open-gpu-kernel-modules: src/nvidia/src/kernel/gpu/rc/kernel_rc.c
(`NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, [pid=%s, name=%s, ]%s`; R515-R560
always print pid/name, `pid='<unknown>', name=<unknown>` when unknown, R570 on only when known;
R575 on append " caused by previous Xid N" to Xid 45), src/common/nvswitch/kernel/inc/common_nvswitch.h
(`nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, Fatal|Non-fatal, ...`), and
src/nvidia/arch/nvalloc/unix/src/osapi.c (the probe-time loss); drivers before the open modules print
`NVRM: Xid (0000:03:00): 14, ...` without `PCI:` (NVIDIA's Xid catalogue, step 1). Xid 144-150 carry
`<unit> Fatal|Nonfatal XC<n> i<n> Link <n> (<intrInfo> <errorStatus> ...)` (the catalogue's
WORKFLOW_NVLINK5_ERR). Xid 74 carries seven registers after its link, `NVLink: fatal error detected on link
14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)` (the catalogue's WORKFLOW_NVLINK_ERR: "there should be seven
fields"; NVSentinel's syslog-health-monitor reads the same, docs/designs/024-workflow-nvlink-err.md); Xid 13
names the SM it trapped in, `... Exception on (GPC 7, TPC 7, SM 0): ...` (NVSentinel's reXid13Pattern,
same design), which its repeat rule compares.

One line comes apart from its Xid: when the driver finds a GPU gone (osinit.c, the PMC_BOOT_0 check), it
logs Xid 79 through nvErrorLog_va and then `NV_DEV_PRINTF(NV_DBG_ERRORS, nv, "GPU has fallen off the
bus.\n")`, which prints `NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.`. That line is read as the
Xid 79 it belongs to (same code, the GPU's address without its function), so it needs what 79 needs even
when the Xid line itself was lost or rate-limited, and a sighting of both is one report.

Hostile text never raises: every length is bounded, digits are ASCII only (str.isdigit would read
'٧٩' as 79), and the patterns are anchored with bounded repeats, so none can backtrack for long. A
message that starts like the driver's but does not parse is `Unreadable`, to be counted and logged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .catalogue import Kind

MAX_MESSAGE = 4096  # characters of a message that are looked at (printk's records are under 1 KiB)
MAX_DETAIL = 512    # characters of the driver's text that are kept
_A = re.ASCII

_GPU = re.compile(r"(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
                  r"(?: GPU-I:(\d{1,3}))?(?: GPU-CI:(\d{1,3}))?", _A)
_CODE = re.compile(r"(\d{1,6})(?:, |,$|$)", _A)
_SWITCH = re.compile(r"nvidia-(nvswitch\d{1,3}): SXid \(", _A)
_LOST = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?:$| )", _A)
_HEX = re.compile(r"0x([0-9a-fA-F]{1,8})", _A)
_SUBUNIT = re.compile(r"([A-Z0-9_/]{1,48}) (Fatal|Nonfatal|Non-fatal)(?: |$)", _A)
_LINK74 = re.compile(r"link (\d{1,3}) ?\(((?:0x[0-9a-fA-F]{1,8}, ?){6}0x[0-9a-fA-F]{1,8})\)", _A)
_SM13 = re.compile(r"\(GPC (\d{1,3}), TPC (\d{1,3})(?:, SM \d{1,3})?\)", _A)
_FELL_OFF = re.compile(r"NVRM: GPU ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\.[0-7]: GPU has fallen off the bus\.?$",
                       _A)

XID = "NVRM: Xid ("
LOST_END = "NVRM: fallen off the bus and is not responding to commands"
LOST_MIDDLE = "NVRM: (PCI ID: "
_MARKERS = ("NVRM: Xid", "SXid (", "NVRM: The NVIDIA GPU", "GPU has fallen off the bus")
_SEVERITY = {"Fatal": True, "Nonfatal": False, "Non-fatal": False}
NVLINK5 = range(144, 151)


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
    link: int | None = None     # Xid 74: the NVLink its registers are of
    gpc_tpc: tuple[int, int] | None = None  # Xid 13: the GPC and TPC the exception trapped in, when the line says

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


def _detail(rest: str) -> str:
    """The driver's text after `N, `, without the pid= and name= fields (their values are bounded)."""
    for key, most in (("pid=", 24), ("name=", 110)):
        if rest.startswith(key):
            end = rest.find(", ", len(key), len(key) + most + 2)
            rest = rest[end + 2:] if end >= 0 else rest[len(key) + most:]
    return rest[:MAX_DETAIL]


def parse_xid(message: str, seq: int | None = None, time: float | None = None) -> GpuEvent | Unreadable:
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
    ev = GpuEvent(Kind.XID, n, gpu.group(1), text, _int(gpu.group(2)), _int(gpu.group(3)), seq=seq, time=time)
    if n in NVLINK5:
        unit = _SUBUNIT.match(text)
        open_ = text.find("(", 0, 120)
        regs = tuple(int(h, 16) for h in _HEX.findall(text[open_ + 1:open_ + 100])[:8]) if open_ >= 0 else ()
        ev = GpuEvent(ev.kind, n, ev.pci, text, ev.gpu_instance, ev.compute_instance,
                      _SEVERITY[unit.group(2)] if unit else None, unit.group(1) if unit else "", regs, seq, time)
    elif n == 74 and (link := _LINK74.search(text[:200])):
        regs = tuple(int(h, 16) for h in _HEX.findall(link.group(2)))
        ev = replace(ev, registers=regs, link=int(link.group(1)))
    elif n == 13 and (sm := _SM13.search(text[:200])):
        ev = replace(ev, gpc_tpc=(int(sm.group(1)), int(sm.group(2))))
    return ev


def parse_sxid(message: str, switch: re.Match, seq: int | None = None,
               time: float | None = None) -> GpuEvent | Unreadable:
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
                    fatal=_SEVERITY.get(word), seq=seq, time=time)


def mentions(text: str) -> bool:
    """The driver's words anywhere in `text` (to count them where they are not believed)."""
    return any(m in text for m in _MARKERS)


@dataclass
class PendingLoss:
    """The first line of a probe-time loss, waiting for its last (`LOST_END`)."""

    event: GpuEvent
    lines_left: int = 3


@dataclass
class DriverMessages:
    """The driver's messages in, events out. Keeps one thing between messages: the start of a
    three-line GPU loss."""

    pending: PendingLoss | None = field(default=None)

    def message(self, message: str, seq: int | None = None, time: float | None = None) -> list[Parsed]:
        """One message known to be the kernel's (its first line, for a record of several)."""
        if message.startswith(XID):
            return [parse_xid(message, seq, time)]
        if switch := _SWITCH.match(message):
            return [parse_sxid(message, switch, seq, time)]
        if fell := _FELL_OFF.match(message[:120]):
            return [GpuEvent(Kind.XID, 79, fell.group(1), "GPU has fallen off the bus (the driver's line after "
                             "its Xid 79)", seq=seq, time=time)]
        if lost := _LOST.match(message):
            ev = GpuEvent(Kind.GPU_LOST, 0, lost.group(1), "fallen off the bus at probe time", seq=seq, time=time)
            if LOST_END in message[lost.end():lost.end() + 200]:  # the three lines joined into one
                return [ev]
            self.pending = PendingLoss(ev)
            return []
        if mentions(message):
            return [Untrusted(message[:200], "the driver's words inside another message")]
        return []

    def continued(self, parts: list[str]) -> list[Parsed]:
        """The lines that follow a loss's first: its event once the last of them is seen."""
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

    def feed_message(self, message: str) -> list[Parsed]:
        """A message already known to be the kernel's, without a prefix (as node-problem-detector
        copies /dev/kmsg messages into a condition), one line of it at a time."""
        message = message[:MAX_MESSAGE].strip()
        if self.pending is not None and message.startswith((LOST_MIDDLE, LOST_END)):
            return self.continued([message])
        self.pending = None
        return self.message(message)
