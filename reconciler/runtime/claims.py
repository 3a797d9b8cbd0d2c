"""What workers and the lending pass have taken and not written yet, counted under one lock, so no
admission slot and no spare is given twice.

Admission and the choice of a spare are decided under `lock`, counting the steps being applied (planned,
not yet persisted) with the cached remediations; a lending pass marks the nodes it is changing, so a
remediation does not choose a spare whose loan is being opened or closed at that moment.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

from gpufleet.reconciler.core.model import Remediation, Step

LENDING_HOLD = 2.0  # a node a lending pass just changed is not chosen as a spare for this long (cache lag)
LENDING_BUSY = 60.0  # while the pass acts on it


class Claims:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self.lock = threading.Lock()
        self.monotonic = monotonic
        self._applying: dict[str, Remediation] = {}
        self._lending: dict[str, float] = {}  # node -> until (monotonic)

    # --- under `lock` -------------------------------------------------------------------------------

    def applying(self) -> list[Remediation]:
        return list(self._applying.values())

    def take(self, r: Remediation, step: Step | None = None) -> None:
        """`r` is being applied; with the once-only actions of `step` already counted as begun (so the
        storm page is sent by one remediation of a pool, not by each one planned before the first is written)."""
        once = tuple(a.once for a in (step.actions if step else ()) if a.once)
        self._applying[r.name] = replace(r, intents=tuple(dict.fromkeys(r.intents + once))) if once else r

    def lending_nodes(self) -> frozenset[str]:
        now = self.monotonic()
        return frozenset(n for n, until in self._lending.items() if until > now)

    def hold_for_lending(self, nodes: Iterable[str], seconds: float) -> None:
        now = self.monotonic()
        for n in nodes:
            self._lending[n] = now + seconds
        self._lending = {k: v for k, v in self._lending.items() if v > now}

    # --- taking the lock itself ---------------------------------------------------------------------

    def release(self, name: str) -> None:
        with self.lock:
            self._applying.pop(name, None)

    def hold(self, r: Remediation, step: Step | None = None) -> None:
        with self.lock:
            self.take(r, step)
