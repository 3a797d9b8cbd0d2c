"""Timed runnables: a periodic pass (membership, lending, retention) with a loop of its own, apart from
the node queue. Each runs one at a time, says when it wants to run again, can be poked sooner, and
backs off on its own when it fails (as kopf's timers and controller-runtime's runnables do).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.runtime.executor import NotLeader

log = logging.getLogger(__name__)
NOT_LEADING_RECHECK = 1.0


class Timer:
    def __init__(self, name: str, run: Callable[[], float], monotonic: Callable[[], float] = time.monotonic,
                 base_delay: float = 0.05, max_delay: float = 30.0):
        self.name, self._run, self.monotonic = name, run, monotonic
        self.base_delay, self.max_delay = base_delay, max_delay
        self._cond = threading.Condition()
        self._due = monotonic()
        self._failures = 0

    def poke(self, after: float = 0.0) -> None:
        """Run within `after` seconds (sooner than planned, never later)."""
        with self._cond:
            self._due = min(self._due, self.monotonic() + after)
            self._cond.notify()

    def due(self) -> bool:
        with self._cond:
            return self.monotonic() >= self._due

    def fire(self) -> None:
        """Run the pass once and plan the next run."""
        try:
            delay = self._run()
        except NotLeader:
            delay = NOT_LEADING_RECHECK
        except (TemporaryError, PermanentError) as e:
            delay = self._backoff()
            log.warning("%s pass: %s (backing off %.2fs)", self.name, e, delay)
        except Exception:  # noqa: BLE001 - one pass's surprise must not stop the others
            delay = self._backoff()
            log.exception("%s pass failed (backing off %.2fs)", self.name, delay)
        else:
            self._failures = 0
        with self._cond:
            self._due = self.monotonic() + delay

    def _backoff(self) -> float:
        delay = min(self.max_delay, self.base_delay * 2 ** self._failures)
        self._failures += 1
        return delay

    def loop(self, stop: threading.Event, leading: threading.Event | None = None) -> None:
        """Run the pass whenever it is due, until `stop`."""
        while not stop.is_set():
            with self._cond:
                left = self._due - self.monotonic()
                if left > 0:
                    self._cond.wait(min(left, 1.0))  # wakes on a poke; checks `stop` at least every second
                    continue
            if leading is not None and not leading.is_set():
                stop.wait(0.2)
                continue
            self.fire()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def start(self, stop: threading.Event, leading: threading.Event | None = None) -> threading.Thread:
        t = threading.Thread(target=self.loop, args=(stop, leading), name=f"timer-{self.name}", daemon=True)
        t.start()
        return t
