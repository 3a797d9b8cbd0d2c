"""gpufleet's Grafana dashboard as code: the panels on-call needs, over the metrics the reconciler exports
(reconciler/runtime/metrics.py; a unit test parses every query and checks each metric and label against it).

Shipped as a ConfigMap labelled `grafana_dashboard: "1"`, the label and value the Grafana sidecar of
kube-prometheus-stack loads by default (prometheus-community/helm-charts kube-prometheus-stack-88.5.3,
charts/kube-prometheus-stack/values.yaml: grafana.sidecar.dashboards.label/labelValue), when the spec's
`healing.grafana_dashboard` asks for it.
"""
from __future__ import annotations

import json

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec

from .meta import metadata

NAME = "gpufleet-dashboard"
UID = "gpufleet-fleet-health"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# (title, unit, panel type, [(query, legend)]), in the order on-call reads them.
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Faults by XID (remediations started)", "short", "timeseries",
     [("sum by (pool, xid) (increase(gpufleet_remediations_started_total[1h]))", "{{pool}} XID {{xid}}")]),
    ("Remediations in progress", "short", "stat", [("max(gpufleet_remediations_in_progress)", "in progress")]),
    ("Remediations ended, by outcome", "short", "timeseries",
     [("sum by (outcome, xid) (increase(gpufleet_remediations_total[1h]))", "{{outcome}} (XID {{xid}})")]),
    ("Time in each phase (p90)", "s", "timeseries",
     [("histogram_quantile(0.9, sum by (le, phase) (rate(gpufleet_phase_seconds_bucket[30m])))", "{{phase}}")]),
    ("Fault to healthy replacement (p50, p90)", "s", "timeseries",
     [("histogram_quantile(0.5, sum by (le) (rate(gpufleet_time_to_healthy_seconds_bucket[1h])))", "p50"),
      ("histogram_quantile(0.9, sum by (le) (rate(gpufleet_time_to_healthy_seconds_bucket[1h])))", "p90")]),
    ("Fault to the job running again (p50, p90)", "s", "timeseries",
     [("histogram_quantile(0.5, sum by (le) (rate(gpufleet_job_back_seconds_bucket[1h])))", "p50"),
      ("histogram_quantile(0.9, sum by (le) (rate(gpufleet_job_back_seconds_bucket[1h])))", "p90")]),
    ("Spares free and lent, nodes quarantined, per pool", "short", "timeseries",
     [('sum by (pool, state) (gpufleet_lending_nodes{state=~"spares_unlent|spares_lent|quarantined"})',
       "{{pool}} {{state}}")]),
    ("GPUs lent", "short", "timeseries", [("sum by (pool) (gpufleet_gpus_lent)", "{{pool}}")]),
    ("Loans, reclaims and forced reclaims", "short", "timeseries",
     [("sum by (pool, event) (increase(gpufleet_lending_events_total[1h]))", "{{pool}} {{event}}")]),
    ("Reclaim time (p90) and what lent spares added to heals", "s", "timeseries",
     [("histogram_quantile(0.9, sum by (le, pool) (rate(gpufleet_reclaim_seconds_bucket[1h])))", "reclaim {{pool}}"),
      ("histogram_quantile(0.9, sum by (le) (rate(gpufleet_heal_reclaim_wait_seconds_bucket[1h])))", "heal waited")]),
    ("Nodes repairing and retired, per pool", "short", "timeseries",
     [("sum by (pool, phase) (gpufleet_nodes_repairing)", "{{pool}} {{phase}}")]),
    ("Repairs ended, by outcome; fault to the node back among the spares (p90)", "short", "timeseries",
     [("sum by (pool, outcome) (increase(gpufleet_repairs_total[1h]))", "{{pool}} {{outcome}}"),
      ("histogram_quantile(0.9, sum by (le) (rate(gpufleet_time_to_return_seconds_bucket[6h])))", "back p90 (s)")]),
    ("Refills asked for, answered and failed", "short", "timeseries",
     [("sum by (pool, outcome) (increase(gpufleet_refills_total[1h]))", "{{pool}} {{outcome}}")]),
    ("Held by a gate (the brake, max concurrent)", "short", "timeseries",
     [("max by (reason) (gpufleet_nodes_held)", "{{reason}}")]),
    ("Failed actions and undelivered notifications", "short", "timeseries",
     [("sum by (action, error) (increase(gpufleet_action_errors_total[1h]))", "{{action}} {{error}}"),
      ("sum by (channel) (increase(gpufleet_notification_failures_total[1h]))", "undelivered {{channel}}")]),
    ("GPU nodes of no pool", "short", "stat", [("max(gpufleet_unlabelled_gpu_nodes)", "unlabelled")]),
]


def queries() -> list[str]:
    return [q for _, _, _, targets in PANELS for q, _ in targets]


def dashboard() -> dict:
    """The dashboard's JSON model (Grafana's dashboard schema): a datasource variable, then the panels two by row."""
    panels = []
    for i, (title, unit, kind, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": kind, "title": title, "datasource": DATASOURCE,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + j), "datasource": DATASOURCE, "expr": q, "legendFormat": legend}
                        for j, (q, legend) in enumerate(targets)],
        })
    return {
        "uid": UID, "title": "gpufleet: fleet health", "tags": ["gpufleet"], "timezone": "utc", "editable": False,
        "schemaVersion": 39, "time": {"from": "now-24h", "to": "now"}, "refresh": "1m",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_config_map(name: str, spec: FleetSpec, namespace: pulumi.Input[str],
                         opts: pulumi.ResourceOptions) -> k8s.core.v1.ConfigMap:
    return k8s.core.v1.ConfigMap(
        name, metadata=metadata(NAME, "dashboard", spec.environment, namespace,
                                extra_labels={labels.GRAFANA_DASHBOARD: labels.GRAFANA_DASHBOARD_VALUE}),
        data={"gpufleet.json": json.dumps(dashboard(), indent=1)}, opts=opts)
