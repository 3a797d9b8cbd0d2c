"""Structured JSON logs; records carry the remediation id, node and phase when known."""
from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def setup(level: str = "INFO", json_logs: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"asctime": "time", "levelname": "level"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("urllib3", "kubernetes", "botocore", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
