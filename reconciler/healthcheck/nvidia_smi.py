"""`nvidia-smi -q`, read for what says a GPU cannot serve: its memory errors and what NVIDIA's memory
error management says to do about them (NVIDIA's "GPU Memory Error Management" guide,
docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt):

- Remapped Rows, `Remapping Failure Occurred: Yes`: the row remapper ran out; the GPU needs the vendor.
- Remapped Rows, `Pending: Yes`: a row waits to be remapped, which takes a GPU reset.
- GPU Reset Status, `Reset Required` or `Drain and Reset Recommended: Yes`: a reset.
- ECC Errors, Volatile, any `Uncorrectable` count above 0 since the driver loaded: a reset (which clears
  the volatile counts and lets the row remapper act).
- Retired Pages, `Pending Page Blacklist: Yes` (pre-Ampere page retirement): a reboot.
- fewer GPUs than the node should have: a GPU is gone (off the bus): a reboot.

`pcie` reads each GPU's PCIe link ("GPU Link Info": "PCIe Generation" and "Link Width", each "Max" and
"Current"): a link trained below what the GPU and its slot can do is a reboot (the link is trained again at
boot). NVIDIA says of both current values "These may be reduced when the GPU is not in use" (`nvidia-smi
--help-query-gpu`, pcie.link.gen.current and pcie.link.width.current), so they are judged only from an
output taken right after the all-reduce kept the GPUs busy; before it, a lower link is noted, not failed.

Fields a GPU does not have read `N/A` and say nothing. Tested on published real outputs
(tests/fixtures/gpu/SOURCES.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FIELD = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
_SECTION = re.compile(r"^(\s*)(\S.*?)\s*$")

RESET, REBOOT, REPLACE = "reset-gpu", "reboot", "replace"


@dataclass
class Gpu:
    bus_id: str
    fields: dict[str, str] = field(default_factory=dict)  # "Section/Sub/Field" -> value

    def get(self, path: str) -> str | None:
        return self.fields.get(path)


@dataclass(frozen=True)
class Finding:
    gpu: str  # the PCI address as nvidia-smi prints it
    what: str
    action: str  # reset-gpu | reboot | replace


@dataclass(frozen=True)
class Report:
    driver: str
    gpus: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def healthy(self) -> bool:
        return not self.findings


def parse(text: str) -> tuple[str, list[Gpu]]:
    """(driver version, GPUs with their fields by path) from `nvidia-smi -q`."""
    driver, gpus = "", []
    gpu: Gpu | None = None
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith("="):
            continue
        m = _GPU.match(line)
        if m:
            gpu, stack = Gpu(m.group(1)), []
            gpus.append(gpu)
            continue
        f = _FIELD.match(line)
        if gpu is None:
            if f and f.group(2) == "Driver Version":
                driver = f.group(3)
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if f and f.group(3) != "":
            gpu.fields["/".join([s for _, s in stack] + [f.group(2)])] = f.group(3)
        else:
            name = (f.group(2) if f else _SECTION.match(line).group(2)).rstrip(":").strip()
            stack.append((indent, name))
    return driver, gpus


def _count(value: str | None) -> int:
    try:
        return int(value) if value not in (None, "N/A") else 0
    except ValueError:
        return 0


def check(text: str, expected_gpus: int | None = None) -> Report:
    """What the output says each GPU needs (nothing, for a healthy one)."""
    driver, gpus = parse(text)
    findings: list[Finding] = []
    for g in gpus:
        if g.get("Remapped Rows/Remapping Failure Occurred") == "Yes":
            findings.append(Finding(g.bus_id, "row remapping failed", REPLACE))
        if g.get("Remapped Rows/Pending") == "Yes":
            n = g.get("Remapped Rows/Uncorrectable Error") or "?"
            findings.append(Finding(g.bus_id, f"row remapping pending ({n} uncorrectable rows)", RESET))
        if g.get("GPU Reset Status/Reset Required") == "Yes" or \
                g.get("GPU Reset Status/Drain and Reset Recommended") == "Yes":
            findings.append(Finding(g.bus_id, "the driver asks for a reset", RESET))
        volatile = {k.rsplit("/", 1)[1]: _count(v) for k, v in g.fields.items()
                    if k.startswith("ECC Errors/Volatile/") and "Uncorrectable" in k}
        bad = {k: v for k, v in volatile.items() if v > 0}
        if bad:
            findings.append(Finding(g.bus_id, "uncorrectable ECC errors since the driver loaded: "
                                    + ", ".join(f"{k} {v}" for k, v in sorted(bad.items())), RESET))
        if g.get("Retired Pages/Pending Page Blacklist") == "Yes" or g.get("Retired Pages/Pending") == "Yes":
            findings.append(Finding(g.bus_id, "retired pages pending", REBOOT))
    if expected_gpus is not None and len(gpus) < expected_gpus:
        findings.append(Finding("", f"{len(gpus)} of {expected_gpus} GPUs seen", REBOOT))
    return Report(driver, tuple(g.bus_id for g in gpus), tuple(findings))


def product(text: str) -> str:
    """The first GPU's product name ("NVIDIA H100 80GB HBM3"); '' when none is printed."""
    _, gpus = parse(text)
    return next((g.get("Product Name") or "" for g in gpus), "")


def _link(g: Gpu, what: str, which: str) -> int | None:
    for key, value in g.fields.items():
        if key.endswith(f"Link Info/{what}/{which}"):
            m = re.match(r"^(\d+)x?$", value.strip())
            return int(m.group(1)) if m else None
    return None


def pcie(text: str) -> list[Finding]:
    """Each GPU whose PCIe link runs below its maximum generation or width (fields N/A say nothing)."""
    _, gpus = parse(text)
    out: list[Finding] = []
    for g in gpus:
        for what, unit in (("PCIe Generation", "Gen "), ("Link Width", "x")):
            cur, top = _link(g, what, "Current"), _link(g, what, "Max")
            if cur is not None and top is not None and cur < top:
                shown = (f"{unit}{cur} of {unit}{top}" if unit == "Gen " else f"x{cur} of x{top}")
                out.append(Finding(g.bus_id, f"PCIe link at {shown}", REBOOT))
    return out
