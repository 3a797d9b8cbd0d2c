"""gpufleet's alert rules, shipped with the stack as a PrometheusRule (Prometheus operator).

The one that matters most: a page that could not be delivered. The reconciler retries it,
raises a Warning Event marked critical and counts it; this rule makes Alertmanager say so through
a channel that does not depend on the failed one.
"""
from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec.models import FleetSpec

from .meta import metadata

NAME = "gpufleet-alerts"


def alert_rules() -> list[dict]:
    return [
        {"alert": "GpuFleetNotificationFailed",
         "expr": "sum by (channel) (increase(gpufleet_notification_failures_total[15m])) > 0",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "gpufleet could not deliver a notification to {{ $labels.channel }}",
                         "description": "A page or message was retried and then given up; see the reconciler's "
                                        "NotificationFailed Events (kubectl get events --field-selector "
                                        "reason=NotificationFailed -A)."}},
        {"alert": "GpuFleetStormBrake",
         "expr": 'max(gpufleet_nodes_held{reason="TooManyUnhealthy"}) > 0',
         "labels": {"severity": "critical"},
         "annotations": {"summary": "gpufleet stopped healing: too many unhealthy nodes in a pool"}},
        {"alert": "GpuFleetRemediationFailed",
         "expr": 'sum(increase(gpufleet_remediations_total{outcome="failed"}[1h])) > 0',
         "labels": {"severity": "warning"},
         "annotations": {"summary": "a gpufleet remediation failed; the node waits for a human"}},
    ]


def prometheus_rule(name: str, spec: FleetSpec, namespace: pulumi.Input[str],
                    opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        name, api_version="monitoring.coreos.com/v1", kind="PrometheusRule",
        metadata=metadata(NAME, "alerts", spec.environment, namespace),
        spec={"groups": [{"name": "gpufleet", "rules": alert_rules()}]}, opts=opts)
