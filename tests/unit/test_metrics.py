"""/metrics and /healthz on one port."""
import socket

import httpx

from reconciler.runtime.metrics import Metrics, serve


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


def test_every_alert_rule_reads_a_metric_the_reconciler_exports():
    """The shipped PrometheusRule fires on metrics that exist, with the labels they carry."""
    import re

    from components.alerts import alert_rules
    from reconciler.runtime.metrics import Metrics

    m = Metrics()
    m.notify_failures.labels("pager").inc()
    m.remediations.labels("79", "failed").inc()
    m.held.labels("TooManyUnhealthy").set(1)
    exported = {s.name for fam in m.registry.collect() for s in fam.samples}
    for rule in alert_rules():
        for name in re.findall(r"\b(gpufleet_[a-z_]+)", rule["expr"]):
            assert name in exported, (rule["alert"], name)
    assert "channel" in next(r for r in alert_rules() if r["alert"] == "GpuFleetNotificationFailed")["expr"]
