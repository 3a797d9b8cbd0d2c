"""The node agent: follow the kernel log, and set the GPU condition on an XID.

Runs as a DaemonSet (reading /dev/kmsg); in drills, `gpufleet inject-fault` sets the same
condition directly. Critical XIDs set the condition False; application XIDs are only logged.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from fleetspec import labels, xids

from .kmsg import Malformed, XidEvent, parse_line

log = logging.getLogger(__name__)


def follow(path: Path, stop: Callable[[], bool] = lambda: False, from_start: bool = False,
           poll: float = 0.2) -> Iterator[str]:
    """Lines of a log as they arrive (/dev/kmsg yields one record per read)."""
    with open(path, "r", errors="replace") as f:
        if not from_start and path != Path("/dev/kmsg"):
            f.seek(0, os.SEEK_END)
        while not stop():
            line = f.readline()
            if line:
                yield line
            else:
                time.sleep(poll)


def report_fault(kube, node: str, event: XidEvent, condition: str = labels.GPU_CONDITION) -> None:
    kube.set_condition(node, condition, "False", f"Xid{event.xid}", event.message)


def handle_lines(lines: Iterable[str], on_fault: Callable[[XidEvent], None], critical: set[int]) -> dict[str, int]:
    """Feed kernel-log lines; call on_fault for critical XIDs. Returns counts, for tests and logs."""
    counts = {"critical": 0, "other": 0, "malformed": 0}
    for line in lines:
        ev = parse_line(line)
        if ev is None:
            continue
        if isinstance(ev, Malformed):
            counts["malformed"] += 1
            log.warning("unparsable Xid line ignored: %r", ev.line[:200])
        elif ev.xid in critical:
            counts["critical"] += 1
            log.error("critical %s: %s", xids.describe(ev.xid), ev.message)
            on_fault(ev)
        else:
            counts["other"] += 1
            log.info("%s (not critical): %s", xids.describe(ev.xid), ev.message)
    return counts
