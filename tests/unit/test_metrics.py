"""/metrics and /healthz: one port, or a port of its own for /healthz; threaded, with timeouts."""
import socket

import httpx

from gpufleet.reconciler.runtime.metrics import Metrics, serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_and_healthz():
    m = Metrics()
    m.remediations.labels("79", "succeeded").inc()
    m.time_to_healthy.observe(2.7)
    state = {"ok": False}
    port = free_port()
    server = serve(m, port, healthy=lambda: state["ok"], host="127.0.0.1")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 503
        state["ok"] = True
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'gpufleet_remediations_total{outcome="succeeded",xid="79"} 1.0' in text
        assert "gpufleet_time_to_healthy_seconds_bucket" in text
    finally:
        server.shutdown()


def idle_connection(port: int) -> socket.socket:
    """A client that connects and never sends its request."""
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def test_healthz_answers_while_an_idle_connection_is_held_open():
    """One idle TCP connection stopped the single-threaded server's /healthz (issue 24): the kubelet then
    restarted the replicas. Idle connections on both ports, and /healthz still answers on both."""
    port, health = free_port(), free_port()
    server = serve(Metrics(), port, healthy=lambda: True, host="127.0.0.1", health_port=health)
    held = [idle_connection(port), idle_connection(health), idle_connection(health)]
    try:
        for p in (health, port):
            r = httpx.get(f"http://127.0.0.1:{p}/healthz", timeout=3)
            assert (r.status_code, r.text) == (200, "ok\n")
        assert "gpufleet_remediations_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=3).text
    finally:
        for s in held:
            s.close()
        server.shutdown()


def test_the_probe_port_serves_only_healthz():
    port, health = free_port(), free_port()
    server = serve(Metrics(), port, healthy=lambda: False, host="127.0.0.1", health_port=health)
    try:
        assert httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=3).status_code == 503
        assert httpx.get(f"http://127.0.0.1:{health}/metrics", timeout=3).status_code == 404
    finally:
        server.shutdown()


def test_an_idle_connection_is_closed_after_the_request_timeout():
    port = free_port()
    server = serve(Metrics(), port, host="127.0.0.1", timeout=0.3)
    s = idle_connection(port)
    try:
        s.settimeout(10)  # an upper bound: the server closes it after 0.3 s
        assert s.recv(1024) == b""  # closed by the server, unanswered
    finally:
        s.close()
        server.shutdown()


def test_connections_beyond_the_limit_are_closed_and_the_server_stays_up():
    port = free_port()
    server = serve(Metrics(), port, host="127.0.0.1", timeout=30, max_connections=2)
    held = [idle_connection(port), idle_connection(port)]
    try:
        extra = idle_connection(port)
        extra.settimeout(10)
        assert extra.recv(1024) == b""  # over the limit: closed at once, not queued
        extra.close()
        held.pop().close()  # a slot frees up: the next request is served
        from gpufleet.waiting import wait_for

        wait_for("a freed slot to serve /healthz", lambda: _healthz(port) == 200, timeout=10)
    finally:
        for s in held:
            s.close()
        server.shutdown()


def _healthz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_every_alert_rule_reads_a_metric_the_reconciler_exports():
    """The shipped PrometheusRule fires on metrics that exist, with the labels they carry."""
    import re

    from gpufleet.components.alerts import alert_rules
    from gpufleet.reconciler.runtime.metrics import Metrics

    m = Metrics()
    m.notify_failures.labels("pager").inc()
    m.remediations.labels("79", "failed").inc()
    m.held.labels("TooManyUnhealthy").set(1)
    exported = {s.name for fam in m.registry.collect() for s in fam.samples}
    for rule in alert_rules():
        for name in re.findall(r"\b(gpufleet_[a-z_]+)", rule["expr"]):
            assert name in exported, (rule["alert"], name)
    assert "channel" in next(r for r in alert_rules() if r["alert"] == "GpuFleetNotificationFailed")["expr"]


def test_a_port_still_held_by_an_ending_process_is_waited_for_not_a_crash(monkeypatch):
    """A pod that replaced a force-deleted one on the host network found the old process still listening and
    crashed with 'Address already in use'; now it waits for the port (within BIND_WAIT) and serves."""
    import threading

    port = free_port()
    old = socket.socket()
    old.bind(("127.0.0.1", port))
    old.listen()
    freed = threading.Event()

    def end_the_old_process():  # once the new server has tried and been refused at least once
        freed.wait(30)
        old.close()

    threading.Thread(target=end_the_old_process, daemon=True).start()
    import gpufleet.reconciler.runtime.metrics as metrics_module

    real = metrics_module.make_server

    def refused_then_retried(*a, **k):
        try:
            return real(*a, **k)
        except OSError:
            freed.set()
            raise

    monkeypatch.setattr(metrics_module, "make_server", refused_then_retried)
    server = serve(Metrics(), port, host="127.0.0.1")
    try:
        assert freed.is_set()  # it was refused first
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        server.shutdown()
