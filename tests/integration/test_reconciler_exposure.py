"""What the reconciler exposes, as the process runs against a real API server (issue 24, "Tests"): its
/healthz answers while idle connections are held open to it, and a webhook that fails leaves its URL in
no log line, Event or record.

One `gpufleet reconcile` process for the module, started as the local environment starts it on the host
(localenv/host_reconciler.py, under its supervisor) with the pod's ports (`--metrics-port`, and
`--health-port` the probes'), leader-elected, and one on-call webhook whose URL (its token in the path,
as Slack's `https://hooks.slack.com/services/T…/B…/<token>`) points at a local server that answers 500.
"""
from __future__ import annotations

import json
import secrets
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.waiting import wait_for
from localenv.host_reconciler import reconciler_proc
from localenv.ports import free_ports
from localenv.supervisor import Supervisor
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.runtime.metrics import REQUEST_TIMEOUT
from tests.fixtures.reconciler_kube import fleet, make_nodes

pytestmark = pytest.mark.integration

POOL = "exp"
CHANNEL = "oncall"  # the webhook target's name: its URL comes from GPUFLEET_WEBHOOK_ONCALL
PROBE_TIMEOUT = 1.0  # the kubelet's default probe timeoutSeconds (the stack's probes set none)
IDLE = 4  # idle connections held to each port (with the one sending a request never finished)


class FailingHook:
    """A webhook receiver that answers every POST 500 (Slack's answer to a revoked or wrong token is a
    4xx; a 500 makes the notifier retry, so each page is tried `attempts` times), noting the paths."""

    def __init__(self):
        self.paths: list[str] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.paths.append(self.path)
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="failing-hook", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Running:
    log: Path
    metrics_port: int
    health_port: int
    token: str
    path: str  # the URL's path: /services/T…/B…/<token>
    hook: FailingHook
    supervisor: Supervisor

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def get(port: int, path: str, timeout: float) -> tuple[int, str]:
    """One GET on loopback, as the kubelet's probe makes it: a fresh connection, a bounded wait."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:  # noqa: S310
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def probe(port: int) -> tuple[int, str] | str:
    """The kubelet's probe of /healthz: its answer, or why none came within PROBE_TIMEOUT."""
    try:
        return get(port, "/healthz", PROBE_TIMEOUT)
    except OSError as e:
        return f"no answer within {PROBE_TIMEOUT}s: {e}"


def answers(port: int) -> bool:
    return probe(port) == (200, "ok\n")


@pytest.fixture(scope="module")
def running(kube_cluster, api, tmp_path_factory):
    """The reconciler process, its caches synced (its /healthz answers 200), and the failing webhook."""
    spec = fleet(POOL, nodes=2, spares=1,
                 notifications=[{"type": "webhook", "name": CHANNEL, "url_secret": "oncallWebhookUrl"}])
    make_nodes(kube_cluster, spec)
    root = tmp_path_factory.mktemp("exposure")
    policy = root / "fleet.json"
    policy.write_text(spec.model_dump_json(indent=2))  # as the stack renders it into the policy ConfigMap
    hook = FailingHook()
    token = secrets.token_urlsafe(24)
    path = f"/services/T0EXPOSURE/B0EXPOSURE/{token}"
    metrics_port, health_port = free_ports(2)
    supervisor = Supervisor(root, root, start_timeout=30.0, stop_timeout=15.0, prefix="[itest]")
    proc = reconciler_proc("reconciler", kube_cluster.kubeconfig_path, policy, root / "env.json", slurm="none",
                           metrics_port=metrics_port, extra_args=["--health-port", str(health_port)],
                           env={"GPUFLEET_WEBHOOK_ONCALL": f"http://127.0.0.1:{hook.port}{path}"})
    supervisor.ensure([proc])
    r = Running(root / "reconciler.log", metrics_port, health_port, token, path, hook, supervisor)
    try:
        wait_for("the reconciler's /healthz (its caches synced)", lambda: answers(health_port), timeout=60,
                 explain=lambda: supervisor.tail("reconciler"))
        yield r
    finally:
        supervisor.stop(["reconciler"])
        hook.close()


def test_healthz_answers_while_idle_connections_are_held(running):
    """Connections that send nothing, or a request never finished, hold up neither port's /healthz, and
    the server closes them after REQUEST_TIMEOUT. The server this replaced (the standard library's
    wsgiref WSGIServer: one connection at a time, no timeout) read the first idle connection's request
    line forever, so the probe below waited in the accept queue until its timeout and the kubelet
    restarted both replicas (checked: with metrics._server making that server, this test fails at the
    probe, "no answer within 1.0s")."""
    held: list[socket.socket] = []
    try:
        for port in (running.health_port, running.metrics_port):
            for _ in range(IDLE):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            slow = socket.create_connection(("127.0.0.1", port), timeout=5)
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: reconciler\r\n")  # the headers' end never comes
            held.append(slow)

        for port in (running.health_port, running.metrics_port):
            assert probe(port) == (200, "ok\n"), f"port {port}, {IDLE + 1} connections held"
        status, text = get(running.metrics_port, "/metrics", 5.0)
        assert status == 200 and "gpufleet_nodes_watched" in text
        status, _ = get(running.health_port, "/metrics", PROBE_TIMEOUT)
        assert status == 404  # the probes' port serves /healthz alone: no scrape holds it up

        # ... and the held connections do not stay: each is closed once it has idled REQUEST_TIMEOUT.
        for s in held:
            s.settimeout(REQUEST_TIMEOUT + 10)
            try:
                assert s.recv(1024) == b"", "an idle connection got an answer"
            except ConnectionResetError:
                pass  # closed with our unread bytes: closed all the same
    finally:
        for s in held:
            s.close()
    assert answers(running.health_port)


def test_a_failed_webhook_leaves_its_url_in_no_log_event_or_record(running, api):
    """A fault pages the on-call webhook; every delivery fails (500). The failure is told (a log line and
    a Warning Event `NotificationFailed` naming the channel, a counted metric) and the URL's token and
    path are nowhere: not in the reconciler's log, not in any Event of any namespace, not in the
    Remediation records. Before the fix, httpx's error text (`Server error '500 ...' for url
    'http://…/services/T…/B…/<token>'`) went into both the log line and the Event (checked: with redact()
    returning its text as it is, this test finds the token in the log)."""
    core = client.CoreV1Api(api)
    Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")

    def failure_events():
        return [e for e in core.list_namespaced_event("default").items
                if e.reason == "NotificationFailed" and e.involved_object.kind == remediation_crd.KIND
                and e.involved_object.name.startswith(f"{POOL}-0-")]

    (first, *_) = wait_for("a NotificationFailed Event on the remediation", failure_events, timeout=60,
                           explain=lambda: running.supervisor.tail("reconciler"))
    assert first.type == "Warning" and first.source.component == "gpufleet-reconciler"
    assert first.message.startswith("critical: ") and f"to {CHANNEL} failed after retries" in first.message
    assert "500 Internal Server Error" in first.message  # what went wrong is still said
    assert running.path in running.hook.paths  # the URL was really used: its absence below means something
    wait_for("the failure's log line", lambda: f"notification to {CHANNEL} failed" in running.log_text(),
             timeout=30)
    wait_for("the failure counted", lambda: "gpufleet_notification_failures_total{channel=\"oncall\"}" in
             get(running.metrics_port, "/metrics", 5.0)[1], timeout=30)

    events = api.sanitize_for_serialization(core.list_event_for_all_namespaces().items)
    records = client.CustomObjectsApi(api).list_cluster_custom_object(
        labels.GROUP, remediation_crd.VERSION, "remediations", label_selector=f"{labels.POOL}={POOL}")["items"]
    assert records, "no Remediation for the fault"
    for what, text in (("the reconciler's log", running.log_text()), ("the Events", json.dumps(events)),
                       ("the Remediations", json.dumps(records)),
                       ("/metrics", get(running.metrics_port, "/metrics", 5.0)[1])):
        for secret in (running.token, running.path, "T0EXPOSURE"):
            assert secret not in text, f"{secret!r} in {what}"
