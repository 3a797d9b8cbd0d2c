"""A slow link to slurmrestd, for the benchmarks: a reverse proxy on loopback that forwards every
request to the real slurmrestd, but holds the ones whose path names a given Slurm node for a while.

It stands in for one thing only: a network path (or a slurmrestd worker) that hangs on one call,
so a benchmark can show that such a call delays its own node and no other. Slurm itself stays real.
"""
from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class SlowLink:
    """`hang_calls`: how many calls naming a hung node are held (None: every one); later ones pass."""

    def __init__(self, upstream: str, hang_nodes: set[str], hang_seconds: float, port: int = 0,
                 hang_calls: int | None = None):
        self.upstream, self.hang_nodes, self.hang_seconds = upstream.rstrip("/"), hang_nodes, hang_seconds
        self.hang_calls = hang_calls
        self.held: list[tuple[str, float, float]] = []  # (path, wall time the hold began, seconds held)
        self.holding: list[tuple[str, float]] = []  # (path, wall time) of every hold as it begins
        self.passed: list[tuple[str, float]] = []  # (path, wall time) of every call forwarded at once
        self._lock = threading.Lock()
        self._holding = 0
        link = self
        pattern = re.compile(r"/node/([^/?]+)")

        def hold(path: str) -> bool:
            m = pattern.search(path)
            if not (m and m.group(1) in link.hang_nodes):
                return False
            with link._lock:
                if link.hang_calls is not None and link._holding >= link.hang_calls:
                    return False
                link._holding += 1
            return True

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self):
                if hold(self.path):
                    t0, at = time.monotonic(), time.time()
                    link.holding.append((f"{self.command} {self.path}", at))
                    time.sleep(link.hang_seconds)
                    link.held.append((f"{self.command} {self.path}", at, time.monotonic() - t0))
                else:
                    link.passed.append((f"{self.command} {self.path}", time.time()))
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                try:
                    r = httpx.request(self.command, link.upstream + self.path, headers=headers, content=body,
                                      timeout=60)
                except httpx.HTTPError as e:
                    self.send_error(502, str(e))
                    return
                try:
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() not in ("transfer-encoding", "content-length", "connection", "content-encoding"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(r.content)))
                    self.end_headers()
                    self.wfile.write(r.content)
                except OSError:  # the caller gave up waiting (its own timeout) and closed the connection
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PUT = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "SlowLink":
        threading.Thread(target=self.server.serve_forever, name="slow-link", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
