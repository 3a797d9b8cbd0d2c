"""The node condition gpufleet's agent writes for a GPU fault, and how it is read back.

One write carries everything, so a reader never sees half of it:

    type: GpuHealthy   status: "False"   reason: Xid46 | SXid24007 | GpuLost
    message: [action=reset-gpu pci=0000:3b:00 gi=5 ci=0] XID 46 (GPU stopped processing): <the driver's text>

The bracketed header says what the fault needs and which GPU (PCI address as the driver printed it;
`gi`/`ci` the MIG GPU and compute instance when the driver named them) and, for NVIDIA's DRAIN_AND_RESET,
when: `when=job-boundary` (catalogue.When: the node is drained and healed once its running job ended; a header
without it, as every header before it, means now); the rest is for people. A
condition without the header (written by hand, by `gpufleet inject-fault` before this format, or by an
older agent) is still read: its code from the reason, its action from the effective catalogue.
"""
from __future__ import annotations

from dataclasses import dataclass

from .catalogue import FaultAction, Kind, When, describe

REASON_PREFIXES = (("SXid", Kind.SXID), ("Xid", Kind.XID), ("Dcgm", Kind.DCGM),  # Dcgm: a DCGM field id
                   ("SlurmDrain", Kind.SLURM_DRAIN))  # SlurmDrain: the row of Slurm's own reason (slurm_reasons.py)
GPU_LOST_REASON = "GpuLost"
_HEADER_MAX = 160
_PCI_CHARS = frozenset("0123456789abcdefABCDEF:.")


@dataclass(frozen=True)
class FaultSignal:
    """What a condition in gpufleet's format says."""

    kind: Kind
    code: int
    action: FaultAction | None = None  # None: the writer did not say (read the catalogue)
    pci: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    gpu: int | None = None  # the GPU's index on its node (nvidia-smi's `index`, what CUDA_VISIBLE_DEVICES counts)
    when: When = When.CHECKPOINT  # JOB_BOUNDARY: NVIDIA's DRAIN_AND_RESET, written as `when=job-boundary`


def reason_for(kind: Kind, code: int) -> str:
    if kind is Kind.GPU_LOST:
        return GPU_LOST_REASON
    if kind is Kind.DCGM:
        return f"Dcgm{code}"
    if kind is Kind.SLURM_DRAIN:
        return f"SlurmDrain{code}"
    return f"{'SXid' if kind is Kind.SXID else 'Xid'}{code}"


def format_message(s: FaultSignal, text: str, limit: int = 1024) -> str:
    head = [f"action={(s.action or FaultAction.REPLACE).value}"]
    if s.pci:
        head.append(f"pci={s.pci}")
    if s.gpu_instance is not None:
        head.append(f"gi={s.gpu_instance}")
    if s.compute_instance is not None:
        head.append(f"ci={s.compute_instance}")
    if s.gpu is not None:
        head.append(f"gpu={s.gpu}")
    if s.when is When.JOB_BOUNDARY:
        head.append(f"when={s.when.value}")  # only then: every older reader and header means "now"
    return f"[{' '.join(head)}] {describe(s.code, s.kind)}: {text}"[:limit]


def _digits(text: str, most: int) -> int | None:
    """ASCII digits only (str.isdigit() takes '٧' too), at most `most` of them."""
    if not text or len(text) > most or not all("0" <= c <= "9" for c in text):
        return None
    return int(text)


def parse_reason(reason: str) -> tuple[Kind, int] | None:
    """`Xid79` -> (xid, 79); `SXid24007` -> (sxid, 24007); `GpuLost` -> (gpu-lost, 0); else None."""
    if reason == GPU_LOST_REASON:
        return Kind.GPU_LOST, 0
    for prefix, kind in REASON_PREFIXES:
        if reason.startswith(prefix):
            code = _digits(reason[len(prefix):], 6)
            return (kind, code) if code is not None else None
    return None


def parse_header(message: str) -> dict[str, str]:
    """The `[key=value ...]` header at the start of the message; {} when there is none."""
    if not message.startswith("["):
        return {}
    end = message.find("]", 1, _HEADER_MAX)
    if end < 0:
        return {}
    out = {}
    for token in message[1:end].split(" "):
        key, eq, value = token.partition("=")
        if eq and key and key not in out:
            out[key] = value
    return out


def parse_condition(reason: str, message: str) -> FaultSignal | None:
    """A condition written in gpufleet's format, or None when its reason names no fault."""
    rk = parse_reason(reason or "")
    if rk is None:
        return None
    head = parse_header(message or "")
    try:
        action = FaultAction(head["action"]) if "action" in head else None
    except ValueError:
        action = None  # an unknown word: the catalogue decides
    pci = head.get("pci", "")
    if len(pci) > 16 or not set(pci) <= _PCI_CHARS:
        pci = ""
    when = When.JOB_BOUNDARY if head.get("when") == When.JOB_BOUNDARY.value else When.CHECKPOINT  # else: now
    return FaultSignal(rk[0], rk[1], action, pci, _digits(head.get("gi", ""), 3), _digits(head.get("ci", ""), 3),
                       when=when)
