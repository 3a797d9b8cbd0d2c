"""NetworkPolicies: what the reconciler, the node agent and slurmrestd may reach, and who may reach them.

- The reconciler's and the agent's namespaces deny everything not allowed below (a policy selecting
  every pod, with no rule).
- The reconciler: DNS, the API server, slurmrestd, HTTPS for webhooks and AWS (only where a notification or an
  aws-asg pool needs it); its metrics from the monitoring namespaces. Its probes need no rule: traffic between a pod and its own node is always
  allowed (kubernetes.io docs, concepts/services-networking/network-policies).
- The agent: DNS and the API server, nothing in.
- slurmrestd (the RestApi's pods, labelled `app.kubernetes.io/name: slurmrestd` by slurm-operator v1.0.1
  internal/builder/labels/labels.go, port 6820 by internal/builder/restapi_app.go): reached only by the
  reconciler; reaches only slurmctld (6817), slurmdbd (6819) and DNS.

A NetworkPolicy names pods and namespaces, not Services outside the pod network: the API server is
`network.api_server_cidrs` (its endpoints' addresses; most network plugins judge a Service's traffic
after it is translated to them). Enforced only where the cluster's network plugin enforces
NetworkPolicies; the local environment's pods use the host's network, which no policy covers.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec

from .agent import AGENT
from .meta import metadata
from .reconciler import METRICS_PORT, NAME as RECONCILER
from .slinky import RESTAPI_PORT

SLURMCTLD_PORT, SLURMDBD_PORT = 6817, 6819  # slurm-operator v1.0.1 internal/builder/{controller,accounting}_app.go
NAME_LABEL = labels.APP_NAME
NS_LABEL = "kubernetes.io/metadata.name"  # every namespace carries its name here (since Kubernetes 1.22)


def _ns(*names: str) -> dict:
    return {"namespaceSelector": {"matchExpressions": [{"key": NS_LABEL, "operator": "In", "values": sorted(names)}]}}


def _tcp(*ports: int) -> list[dict]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def dns_egress() -> dict:
    return {"to": [{**_ns("kube-system"), "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def api_server_egress(spec: FleetSpec) -> dict:
    net = spec.network
    return {"to": [{"ipBlock": {"cidr": c}} for c in net.api_server_cidrs], "ports": _tcp(*net.api_server_ports)}


def deny_all(namespace: str) -> dict:
    return {"metadata": {"name": "gpufleet-default-deny", "namespace": namespace},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}


def https_needed(spec: FleetSpec) -> bool:
    """Whether the reconciler opens HTTPS beyond the API server: to AWS (an aws-asg pool's Auto Scaling group and
    EC2; an SNS notification) or to a webhook. Without any of them it gets no HTTPS egress at all."""
    return any(p.provider == "aws-asg" for p in spec.pools) or bool(spec.healing.notifications)


def telemetry_egress(spec: FleetSpec) -> dict | None:
    """The ports of the GPU telemetry the reconciler reads (`healing.telemetry`: Prometheus' or the dcgm-exporters'
    URLs; their hosts are Services or node addresses the spec does not pin, so the rule names the ports only)."""
    t = spec.healing.telemetry
    urls = [t.prometheus_url] if t.source == "prometheus" else list(t.exporter_urls) if t.source == "exporter" else []
    ports = sorted({u.port or (443 if u.scheme == "https" else 80) for u in map(urlsplit, filter(None, urls))})
    return {"ports": _tcp(*ports)} if ports else None


def reconciler_policy(spec: FleetSpec) -> dict:
    dep, net = spec.healing.reconciler, spec.network
    egress = [dns_egress(), api_server_egress(spec),
              {"to": [{**_ns(spec.slurm.namespace), "podSelector": {"matchLabels": {NAME_LABEL: "slurmrestd"}}}],
               "ports": _tcp(RESTAPI_PORT)}]
    if net.https_egress_cidrs and https_needed(spec):
        egress.append({"to": [{"ipBlock": {"cidr": c}} for c in net.https_egress_cidrs], "ports": _tcp(443)})
    if (telemetry := telemetry_egress(spec)) is not None:
        egress.append(telemetry)
    ingress = [{"from": [_ns(*net.metrics_namespaces)], "ports": _tcp(METRICS_PORT)}] if net.metrics_namespaces else []
    return {"metadata": {"name": RECONCILER, "namespace": dep.namespace},
            "spec": {"podSelector": {"matchLabels": {NAME_LABEL: RECONCILER}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": ingress, "egress": egress}}


def agent_policy(spec: FleetSpec) -> dict:
    return {"metadata": {"name": AGENT, "namespace": spec.healing.reconciler.agent_namespace},
            "spec": {"podSelector": {"matchLabels": {NAME_LABEL: AGENT}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [], "egress": [dns_egress(), api_server_egress(spec)]}}


def slurmrestd_policy(spec: FleetSpec) -> dict:
    dep, slurm = spec.healing.reconciler, spec.slurm
    egress = [dns_egress(), {"to": [{"podSelector": {"matchLabels": {NAME_LABEL: "slurmctld"}}}],
                             "ports": _tcp(SLURMCTLD_PORT)}]
    if slurm.accounting.enabled:
        egress.append({"to": [{"podSelector": {"matchLabels": {NAME_LABEL: "slurmdbd"}}}], "ports": _tcp(SLURMDBD_PORT)})
    return {"metadata": {"name": "slurmrestd", "namespace": slurm.namespace},
            "spec": {"podSelector": {"matchLabels": {NAME_LABEL: "slurmrestd"}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [{**_ns(dep.namespace), "podSelector": {"matchLabels": {NAME_LABEL: RECONCILER}}}],
                                  "ports": _tcp(RESTAPI_PORT)}],
                     "egress": egress}}


def network_policies(spec: FleetSpec) -> list[dict]:
    """Every NetworkPolicy of the stack (none when `network.policies` is off)."""
    if not spec.network.policies:
        return []
    dep = spec.healing.reconciler
    out = [deny_all(dep.namespace), reconciler_policy(spec), deny_all(dep.agent_namespace), agent_policy(spec)]
    if spec.slurm.restapi:
        out.append(slurmrestd_policy(spec))
    return out


def declare_network_policies(name: str, spec: FleetSpec,
                             opts: pulumi.ResourceOptions) -> list[k8s.networking.v1.NetworkPolicy]:
    """The policies, with `opts` (their parent and provider, and `depends_on` the namespaces they live in)."""
    env = spec.environment
    return [k8s.networking.v1.NetworkPolicy(
        f"{name}-netpol-{p['metadata']['namespace']}-{p['metadata']['name']}",
        metadata=metadata(p["metadata"]["name"], "network", env, p["metadata"]["namespace"]), spec=p["spec"],
        opts=opts) for p in network_policies(spec)]
