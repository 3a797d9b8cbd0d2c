"""nccl-tests' `all_reduce_perf` output, read for what it verified. Its trailer (nccl-tests src/util.cu):

    # Out of bounds values : <errors> OK|FAILED
    # Avg bus bandwidth    : <GB/s> [OK|FAILED]     (OK/FAILED only with a bandwidth target, -a)

and a `#wrong` column per size, out-of-place and in-place. Any wrong value or a FAILED trailer is a
failure: the GPUs or the links between them corrupt data; a reboot first (NVLink and the fabric are
retrained at boot). So is an average bus bandwidth under the GPU model's floor (floors.py), judged by the
check (run.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\s*$", re.M)
_BW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)\s*(OK|FAILED)?\s*$", re.M)
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s+(.*)$")
_LABEL = re.compile(r"^\s*\d+: ?", re.M)  # `srun -l` puts the task's number before each line ("0: # Avg ...")


@dataclass(frozen=True)
class Report:
    found: bool  # the trailer was there (the run ended)
    errors: int
    bus_bandwidth: float | None
    bandwidth_ok: bool
    wrong_rows: int

    @property
    def healthy(self) -> bool:
        return self.found and self.errors == 0 and self.bandwidth_ok and self.wrong_rows == 0


def parse(text: str) -> Report:
    text = _LABEL.sub("", text)
    bounds = _BOUNDS.search(text)
    bw = _BW.search(text)
    wrong = 0
    for m in map(_ROW.match, text.splitlines()):
        if m is None:
            continue
        cols = m.group(1).split()
        # time algbw busbw #wrong, twice: the 4th and 8th columns count wrong values (N/A when not checked)
        for i in (3, 7):
            if i < len(cols) and cols[i].isdigit() and int(cols[i]) > 0:
                wrong += 1
    return Report(found=bounds is not None, errors=int(bounds.group(1)) if bounds else 0,
                  bus_bandwidth=float(bw.group(1)) if bw else None,
                  bandwidth_ok=not (bw and bw.group(2) == "FAILED"), wrong_rows=wrong)
