"""`nvidia-smi nvlink --status` (`-s`), read for each GPU's NVLinks: active at their speed, or `<inactive>`.

What nvidia-smi prints, one block per GPU (the published outputs in tests/fixtures/gpu/SOURCES.md):

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a10e6e5-...)
             Link 0: 26.562 GB/s
             Link 3: <inactive>

A GPU without NVLink prints no link lines (or nothing at all); one whose links are all down may print NVML's
"Unable to retrieve NVLink information as all links are inActive" (NVIDIA/open-gpu-kernel-modules issue
#1150; Azure's azurehpc-health-checks reads it as every link down). What a node must have is its model's (floors.py):
every link active at the model's speed. For a model gpufleet has no figures for, a GPU whose links are
partly inactive, or active at different speeds, is degraded (Azure's azurehpc-health-checks fails a GPU with
any `<inactive>` link, NHC2016; the slow links of a degraded H200 read 1.562 GB/s where the rest read 26.562).
A degraded NVLink is first worth a reboot: the links are trained again at boot (with the fabric manager on
NVSwitch systems); one that stays down after it climbs the repair ladder.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.reconciler.healthcheck.floors import ModelFloor

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK = re.compile(r"^\s+Link (\d+): (?:<inactive>|([0-9.]+) GB/s)\s*$")
_ALL_INACTIVE = re.compile(r"all links are inactive", re.I)


@dataclass(frozen=True)
class GpuLinks:
    index: int
    name: str
    links: tuple[tuple[int, float | None], ...]  # (link, GB/s); None: inactive

    @property
    def active(self) -> tuple[tuple[int, float], ...]:
        return tuple((n, s) for n, s in self.links if s is not None)

    @property
    def inactive(self) -> tuple[int, ...]:
        return tuple(n for n, s in self.links if s is None)


class Unreadable(ValueError):
    pass


def parse(text: str) -> tuple[GpuLinks, ...]:
    gpus: list[GpuLinks] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _GPU.match(line)
        if m:
            gpus.append(GpuLinks(int(m.group(1)), m.group(2).strip(), ()))
            continue
        if _ALL_INACTIVE.search(line):  # NVML's answer for a GPU with no link up (as Azure's NHC reads it)
            continue
        m = _LINK.match(line)
        if m and gpus:
            speed = float(m.group(2)) if m.group(2) else None
            last = gpus[-1]
            gpus[-1] = GpuLinks(last.index, last.name, last.links + ((int(m.group(1)), speed),))
            continue
        raise Unreadable(f"not a line of `nvidia-smi nvlink --status`: {line[:120]!r}")
    return tuple(gpus)


def findings(gpus: tuple[GpuLinks, ...], floor: ModelFloor | None) -> list[str]:
    """What is wrong with the links ([] when nothing is)."""
    out: list[str] = []
    for g in gpus:
        if floor is not None and floor.nvlinks:
            slow = [n for n, s in g.active if s < floor.nvlink_gbps * 0.99]
            if len(g.active) < floor.nvlinks or slow:
                out.append(f"GPU {g.index}: {len(g.active)} of {floor.nvlinks} NVLinks active"
                           + (f" (inactive: {list(g.inactive)})" if g.inactive else "")
                           + (f", links {slow} below {floor.nvlink_gbps} GB/s" if slow else ""))
            continue
        if g.active and g.inactive:
            out.append(f"GPU {g.index}: NVLinks {list(g.inactive)} inactive, {len(g.active)} active")
        speeds = {s for _, s in g.active}
        if len(speeds) > 1:
            slow = [n for n, s in g.active if s < max(speeds) * 0.99]
            out.append(f"GPU {g.index}: links {slow} below the others' {max(speeds)} GB/s")
    if floor is not None and floor.nvlinks and not gpus:
        out.append(f"no NVLink reported where {floor.product} has {floor.nvlinks} per GPU")
    return out
