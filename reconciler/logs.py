"""Structured JSON logs; records carry the remediation id, node and phase when known.

Records go through a queue to one writer thread (the standard library's QueueHandler and
QueueListener): a worker that logs never waits for stderr, or for another worker writing to it.
The time of a line is when it was logged, not when it was written.
"""
from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys

from pythonjsonlogger.json import JsonFormatter

_listener: logging.handlers.QueueListener | None = None


def setup(level: str = "INFO", json_logs: bool = True) -> None:
    global _listener
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"asctime": "time", "levelname": "level"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if _listener is not None:
        _listener.stop()
    records: queue.SimpleQueue = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, handler)
    _listener.start()
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level)
    for noisy in ("urllib3", "kubernetes", "botocore", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@atexit.register
def flush() -> None:
    """Write what is queued (at exit, and before a process ends on a signal)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None
