"""Structured JSON logs; records carry the remediation id, node and phase when known.

Records go through a queue to one writer thread (the standard library's QueueHandler and
QueueListener): a worker that logs never waits for stderr, or for another worker writing to it.
The time of a line is when it was logged, not when it was written. On their way into the queue
every line, traceback and extra field loses its URLs' paths and its tokens (reconciler/redact.py).
"""
from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys

from pythonjsonlogger.json import JsonFormatter

from gpufleet.reconciler.redact import redact

_listener: logging.handlers.QueueListener | None = None
_STANDARD = set(vars(logging.makeLogRecord({})))  # a record's own attributes; the rest are `extra` fields


class RedactingQueueHandler(logging.handlers.QueueHandler):
    """The queue's entrance: prepare() has merged the message, its arguments and any traceback into one
    text; that text, and every extra field, leaves here redacted."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = super().prepare(record)
        record.msg = record.message = redact(record.msg)
        for k, v in vars(record).items():
            if k not in _STANDARD and isinstance(v, str):
                setattr(record, k, redact(v))
        return record


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
    root.handlers[:] = [RedactingQueueHandler(records)]
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
