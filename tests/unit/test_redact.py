"""Secrets out of log lines, Events, records and notifications (reconciler/redact.py)."""
from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timezone

from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpufleet.reconciler import logs
from gpufleet.reconciler.adapters.notify import Message, Notifier, Webhook
from gpufleet.reconciler.adapters.records import to_object
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.redact import REDACTED, redact, register

TOKEN = "T0AAAAAAA/B0BBBBBBB/c2VjcmV0LXNsYWNrLXRva2Vu"


@pytest.mark.parametrize("text,gone,kept", [
    (f"Client error '404 Not Found' for url 'https://hooks.slack.com/services/{TOKEN}'", TOKEN, "https://hooks.slack.com/"),
    ("POST https://bot:hunter22@example.com:8443/hook?x=1 failed", "hunter22", "https://example.com:8443/"),
    ("GET https://api.example.com/v1?token=abc123def456", "abc123def456", "https://api.example.com/"),
    ("Authorization: Bearer abcdefghijklmnop0123", "abcdefghijklmnop0123", "Authorization: Bearer"),
    ("X-SLURM-USER-TOKEN: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzbHVybSJ9.c2lnbmF0dXJl", "eyJzdWIiOiJzbHVybSJ9", "X-SLURM"),
    ("slack said xoxb-123456789012-abcdefghijkl", "xoxb-123456789012", "slack said"),
    ("key AKIAABCDEFGHIJKLMNOP in the error", "AKIAABCDEFGHIJKLMNOP", "in the error"),
    ("password=hunter2x&user=slurm", "hunter2x", "user=slurm"),
])
def test_urls_and_tokens_are_redacted(text, gone, kept):
    out = redact(text)
    assert gone not in out and kept in out and REDACTED in out


@pytest.mark.parametrize("text", [
    "cordoned kwok-h100-0: gpufleet: Xid 79 (GPU has fallen off the bus)",
    "slurmrestd at http://slurm-restapi.slurm:6820 answered 503",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    "",
])
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


def test_a_registered_secret_is_redacted_whatever_its_shape():
    register("opaque-value-0123456789")
    assert redact("the key opaque-value-0123456789 leaked") == f"the key {REDACTED} leaked"
    register("short")  # too short to register: it would garble ordinary text
    assert redact("short text") == "short text"


REC = Remediation(name="h100-0-xid79-1", node="h100-0", pool="h100", xid=79, message="off the bus",
             phase=Phase.FAILED, created=datetime(2026, 1, 1, tzinfo=timezone.utc),
             reason=f"notify: https://hooks.slack.com/services/{TOKEN} refused",
             last_error="slurmrestd: 401 for X-SLURM-USER-TOKEN=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzbHVybSJ9.c2lnbmF0dXJl")


def test_a_record_carries_no_url_or_token():
    obj = json.dumps(to_object(REC))
    assert TOKEN not in obj and "hooks.slack.com/<redacted>" in obj
    assert "eyJzdWIiOiJzbHVybSJ9" not in obj and "X-SLURM-USER-TOKEN=<redacted>" in obj



def test_every_free_text_of_a_record_is_redacted():
    """Not only the reason and the last error: a broken replacement's why, a refill's message and a repair's
    reason, history and error are texts other code wrote too (a provider's, a node's, an API's error)."""
    from dataclasses import replace

    from gpufleet.reconciler.core.model import Refill, RefillState, ReplacementFailure
    from gpufleet.reconciler.core.repair_phases import Repair, RepairEvent, RepairPhase

    leak = f"POST https://hooks.slack.com/services/{TOKEN} refused"
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rec = replace(REC, failed_replacements=(ReplacementFailure("h100-9", at, leak),),
                  refill=Refill("k", RefillState.FAILED, at, leak),
                  repair=Repair(RepairPhase.STOPPED, at, reason=leak, error=leak,
                                history=(RepairEvent("reboot", "failed", at, leak),)))
    obj = json.dumps(to_object(rec))
    assert TOKEN not in obj and obj.count("hooks.slack.com/<redacted>") >= 6

class Events:
    def __init__(self):
        self.got: list[str] = []

    def event(self, involved, reason, message, type_="Normal", namespace="default"):
        self.got.append(message)


class Refuses(BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(403)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def refusing_hook():
    server = HTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


def test_a_failed_webhook_leaves_no_url_or_token_in_logs_or_events(capfd, refusing_hook):
    """The leak issue 24 found: httpx names the URL, token included, in its error text ("Client error '403
    Forbidden' for url ..."); the notifier logged it and raised it as a Warning Event. Here a webhook that
    answers 403, with the JSON logs the reconciler writes."""
    url = f"http://127.0.0.1:{refusing_hook}/services/{TOKEN}?token=second-secret-0123"
    logs.setup(json_logs=True)
    try:
        events = Events()
        Notifier([Webhook("slack", url, timeout=1, attempts=2)], kube=events, namespace="gpufleet-system").send(
            Message("no-spare", "critical", "no spare left in pool h100", REC))
        logging.getLogger("test").error("and the url once more: %s", url)
    finally:
        logs.flush()
    err = capfd.readouterr().err
    assert "notification to slack failed" in err  # the failure is logged ...
    failed = [m for m in events.got if m.startswith("critical:")]
    assert failed and "403 Forbidden" in failed[0]  # ... and raised, saying why
    for text in [err, *events.got]:
        assert TOKEN not in text and "second-secret-0123" not in text and "/services/" not in text, text
