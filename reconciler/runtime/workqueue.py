"""A work queue keyed by node name, as controller-runtime's: de-duplicated, one worker per key at a time,
delayed re-adds, and per-key exponential backoff for failures that the record cannot hold.

    add(key)            queue it (a key queued or being processed is queued once); front=True: before all but
                        the other front ones (a burst of faults is contained in the order it came);
                        soon=True: after the front ones, before the rest (a node's next containment step)
    add_after(key, s)   queue it in s seconds (the earliest wins)
    add_failed(key)     queue it after this key's own backoff (0.05 s doubling, capped)
    get() -> key        block until a key is due; it is then "processing" until done(key)
    done(key)           finished; if it was added meanwhile, it is queued again
"""
from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from typing import Callable, Hashable


class ShutDown(Exception):
    """The queue was shut down while waiting."""


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic, base_delay: float = 0.05, max_delay: float = 30.0):
        self.clock = clock
        self.base_delay, self.max_delay = base_delay, max_delay
        self._cond = threading.Condition()
        self._front: deque[Hashable] = deque()  # new faults, in the order they came
        self._soon: deque[Hashable] = deque()   # containment follow-ups, in order
        self._queue: deque[Hashable] = deque()  # everything else, in order
        self._tier: dict[Hashable, int] = {}    # dirty key -> 0 front, 1 soon, 2 the rest
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}  # key -> earliest delayed time
        self._failures: dict[Hashable, int] = {}
        self._seq = 0
        self._shutdown = False

    # --- adding ----------------------------------------------------------------------------------

    def add(self, key: Hashable, front: bool = False, soon: bool = False) -> None:
        with self._cond:
            self._add(key, 0 if front else 1 if soon else 2)

    def _lines(self) -> tuple[deque[Hashable], deque[Hashable], deque[Hashable]]:
        return self._front, self._soon, self._queue

    def _enqueue(self, key: Hashable, tier: int) -> None:
        self._lines()[tier].append(key)
        self._cond.notify()

    def _add(self, key: Hashable, tier: int = 2) -> None:
        if self._shutdown:
            return
        if key in self._dirty:
            was = self._tier.get(key, 2)
            if tier < was:
                self._tier[key] = tier
                if key not in self._processing:
                    self._lines()[was].remove(key)  # already waiting: move it up
                    self._enqueue(key, tier)
            return
        self._dirty.add(key)
        self._tier[key] = tier
        if key not in self._processing:
            self._enqueue(key, tier)

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            at = self.clock() + delay
            if key in self._due and self._due[key] <= at:
                return
            self._due[key] = at
            self._seq += 1
            heapq.heappush(self._delayed, (at, self._seq, key))
            self._cond.notify()

    def add_failed(self, key: Hashable) -> float:
        """Queue after the key's own backoff; returns the delay."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = min(self.max_delay, self.base_delay * 2 ** n)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """The key succeeded: its backoff starts again from the base."""
        with self._cond:
            self._failures.pop(key, None)

    # --- taking ------------------------------------------------------------------------------------

    def _promote_due(self) -> float | None:
        """Move delayed keys whose time has come to the queue; seconds until the next, or None."""
        now = self.clock()
        while self._delayed:
            at, _, key = self._delayed[0]
            if self._due.get(key) != at:
                heapq.heappop(self._delayed)  # superseded by an earlier add_after
                continue
            if at > now:
                return at - now
            heapq.heappop(self._delayed)
            del self._due[key]
            self._add(key)
        return None

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next due key, or None after `timeout` seconds without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    raise ShutDown()
                wait = self._promote_due()
                line = next((q for q in self._lines() if q), None)
                if line is not None:
                    key = line.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    self._tier.pop(key, None)
                    return key
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait if wait is None else min(wait, 1.0))

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._enqueue(key, self._tier.get(key, 2))

    def shut_down(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    # --- looking -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._cond:
            self._promote_due()
            return sum(len(q) for q in self._lines())
