"""A stop signal (SIGTERM) as a `threading.Event`, set without a lock in the signal handler.

A Python signal handler runs in the main thread between two bytecodes of whatever it was doing, and a second
signal runs it again inside the first. A handler that calls `Event.set()` takes the Event's lock (a plain
`threading.Lock` in its Condition), so the main thread deadlocks on a lock it holds itself when the signal comes
while it is inside `Event.set()` (the first handler, interrupted by the second: the supervisor of the local
environment sends SIGTERM to the process group and then to the process) or inside its own `Event.wait()`.
Nothing then ends the process but SIGKILL. Python's own documentation says as much (Doc/library/signal.rst:
"Synchronization primitives such as threading.Lock should not be used within signal handlers. Doing so can lead
to unexpected deadlocks."; CPython gh-144706).

So the Python handler here only notes the time, and `signal.set_wakeup_fd` hands the signal to a thread of its
own: the C-level handler writes the signal's number to a pipe (Doc/library/signal.rst, set_wakeup_fd), the thread
reads it and sets the Event like any other thread. The thread blocks the signals it relays, so they keep going
to the main thread, whose blocking calls they interrupt as before.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable


def set_on_signals(stop: threading.Event, signals: Iterable[int] = (signal.SIGTERM,)) -> list[float]:
    """Set `stop` when one of `signals` arrives, however many arrive and wherever the main thread is. Call it from
    the main thread (as `signal.signal`), once per process: it takes the process's wakeup fd. Returns the list that
    each signal's time (time.monotonic) is appended to, for a log line on how long the stop took."""
    wanted = set(signals)
    received: list[float] = []
    r, w = os.pipe()  # not inherited by the commands the process runs (PEP 446)
    os.set_blocking(w, False)  # the C-level handler must never block on it
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        raise RuntimeError("the process's signal wakeup fd is taken already (asyncio?); cannot relay stop signals")

    def noted(signum: int, frame: object) -> None:  # no lock here: list.append is one C call
        received.append(time.monotonic())

    def relay() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, wanted)  # delivered to the main thread, as without this thread
        while True:
            data = os.read(r, 64)
            if not data:
                return
            if wanted.intersection(data):
                stop.set()

    for s in wanted:
        signal.signal(s, noted)
    threading.Thread(target=relay, name="stop-signal", daemon=True).start()
    return received
