"""gpufleet's metrics, alert rules and dashboard against the real Prometheus (Debian's 2.42 and its promtool,
installed by scripts/install-prometheus.sh): the reconciler's exposition passes `promtool check metrics`,
every alert fires on the series it is written for and stays quiet otherwise (`promtool test rules`), and a
Prometheus server scraping the reconciler's /metrics answers every dashboard panel's query with series."""
from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from gpufleet.components.alerts import alert_rules
from gpufleet.components.dashboard import queries
from gpufleet.waiting import wait_for
from gpufleet.reconciler.runtime.metrics import Metrics, serve

pytestmark = pytest.mark.integration

# A label value per label name that the dashboard's and the alerts' selectors match.
VALUES = {"state": "spares_unlent", "reason": "TooManyUnhealthy", "outcome": "failed", "xid": "79", "pool": "h100",
          "phase": "Resuming", "channel": "oncall", "action": "DrainSlurm", "error": "temporary", "event": "lent",
          "step": "reboot"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: scripts/install-prometheus.sh (run by scripts/bootstrap.sh)",
                    pytrace=False)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def every_metric_sampled() -> Metrics:
    """The reconciler's registry with one sample of every metric (and a second value, so rates are not empty)."""
    m = Metrics()
    for metric in list(m.registry._collector_to_names):
        child = metric.labels(*[VALUES.get(n, "x") for n in metric._labelnames]) if metric._labelnames else metric
        kind = type(metric).__name__
        if kind == "Counter":
            child.inc(3)
        elif kind == "Gauge":
            child.set(2)
        else:
            for v in (0.4, 3.0, 45.0):
                child.observe(v)
    return m


def test_the_reconcilers_exposition_passes_promtool():
    m = every_metric_sampled()
    port = free_port()
    server = serve(m, port, host="127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
    r = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpufleet-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gpufleet", "rules": alert_rules()}]}))
    return path


# Per alert: series that make it fire, series that do not, and the labels it fires with.
CASES = {
    "GpuFleetNotificationFailed": ('gpufleet_notification_failures_total{channel="oncall"}', "0 0 1 1 1", "0 0 0 0 0",
                                   {"channel": "oncall", "severity": "critical"}),
    "GpuFleetStormBrake": ('gpufleet_nodes_held{reason="TooManyUnhealthy"}', "0 2 2 2 2", "0 0 0 0 0",
                           {"severity": "critical"}),
    "GpuFleetRemediationFailed": ('gpufleet_remediations_total{outcome="failed",xid="79"}', "0 0 1 1 1", "0 0 0 0 0",
                                  {"severity": "warning"}),
}


def test_every_alert_fires_on_its_series_and_stays_quiet_otherwise(tmp_path):
    rules = rules_file(tmp_path)
    assert sorted(CASES) == sorted(r["alert"] for r in alert_rules())  # a new alert needs its case here
    r = subprocess.run([tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    tests = []
    for alert, (series, firing, quiet, fired_labels) in CASES.items():
        rule = next(r for r in alert_rules() if r["alert"] == alert)
        said = {k: v.replace("{{ $labels.channel }}", fired_labels.get("channel", ""))
                for k, v in rule.get("annotations", {}).items()}
        for values, fires in ((firing, True), (quiet, False)):
            expected = [{"exp_labels": fired_labels, "exp_annotations": said}] if fires else []
            tests.append({"interval": "1m", "input_series": [{"series": series, "values": values}],
                          "alert_rule_test": [{"eval_time": "5m", "alertname": alert, "exp_alerts": expected}]})
    unit = tmp_path / "alerts_test.yaml"
    unit.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}))
    r = subprocess.run([tool("promtool"), "test", "rules", str(unit)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # and the same tests fail when an alert would not fire: the test can tell
    broken = yaml.safe_load(unit.read_text())
    broken["tests"][0]["input_series"][0]["values"] = "0 0 0 0 0"
    unit.write_text(yaml.safe_dump(broken))
    r = subprocess.run([tool("promtool"), "test", "rules", str(unit)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode != 0


def test_a_prometheus_scraping_the_reconciler_answers_every_dashboard_query(tmp_path):
    m = every_metric_sampled()
    target, web = free_port(), free_port()
    server = serve(m, target, host="127.0.0.1")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_file(tmp_path))],
        "scrape_configs": [{"job_name": "gpufleet-reconciler", "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}],
    }))
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen([tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{web}/api/v1"

    def series(q: str) -> list:
        try:
            body = httpx.get(f"{api}/query", params={"query": q}, timeout=5).json()
        except (httpx.HTTPError, ValueError):  # not up yet, or still starting (its answer then is no JSON)
            return []
        assert body["status"] == "success", (q, body)
        return body["data"]["result"]

    try:
        wait_for("three scrapes of the reconciler", lambda: series('count_over_time(up{job="gpufleet-reconciler"}[1m]) >= 3'),
                 timeout=90, explain=lambda: (tmp_path / "prometheus.log").read_text()[-2000:])
        assert series('up{job="gpufleet-reconciler"}')[0]["value"][1] == "1"
        empty = [q for q in queries() if not series(q)]
        assert not empty, f"dashboard queries with no series: {empty}"
        rules = httpx.get(f"{api}/rules", timeout=5).json()["data"]["groups"][0]["rules"]
        assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()} and all(r["health"] == "ok" for r in rules)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
        server.shutdown()
