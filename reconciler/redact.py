"""Secrets out of everything the reconciler and the agent write for people: log lines, Events, records and
notifications.

The leak that made this module: a webhook that failed put its URL, token included, into the log and a
Warning Event (httpx names the URL in its error text). So every URL keeps its scheme and host (what a
reader needs to know where it went) and loses its user, path and query; bearer tokens, JWTs, Slack and
AWS keys and `token=`-style pairs are replaced; and a value registered as a secret (a webhook URL read
from its Secret) is replaced wherever it appears, whatever its shape.
"""
from __future__ import annotations

import re
import threading

REDACTED = "<redacted>"

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]{1,15}://)(?:[^\s/@'\"<>]*@)?([^\s/?#'\"<>]+)([^\s'\"<>]*)")
_PATTERNS = [
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I), rf"\1 {REDACTED}"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),         # a JWT
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}"), REDACTED),                                   # Slack tokens
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),                                      # AWS access key ids
    (re.compile(r"(?i)\b((?:[a-z0-9_-]*[_-])?(?:token|secret|password|passwd|api[_-]?key|access[_-]?key|signature|"
                r"sig|auth|credentials?|jwt))(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s&,;]+)"), rf"\1\2{REDACTED}"),
]

_secrets: set[str] = set()
_lock = threading.Lock()


def register(*values: str | None) -> None:
    """Values to replace wherever they appear (a webhook URL, a token read from a file). Short values are
    not registered: replacing them would garble ordinary text."""
    with _lock:
        _secrets.update(v for v in values if v and len(v) >= 8)


def _url(m: re.Match) -> str:
    scheme, host, rest = m.group(1), m.group(2), m.group(3)
    return f"{scheme}{host}/{REDACTED}" if rest.strip("/") else f"{scheme}{host}{rest}"


def redact(text: str) -> str:
    """`text` without secrets (see the module doc); anything but a str is returned as it is."""
    if not isinstance(text, str) or not text:
        return text
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for s in known:
        if s in text:
            text = text.replace(s, REDACTED)
    text = _URL.sub(_url, text)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text
