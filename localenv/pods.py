"""The reconciler's pods on the local kubelet nodes: what `gpufleet local status` shows and what the
tests wait for (Ready replicas, the one holding the Lease)."""
from __future__ import annotations


from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.waiting import wait_for

SELECTOR = "app.kubernetes.io/name=gpufleet-reconciler"
LEASE = "gpufleet-reconciler"


def lease_holder(api: client.ApiClient, namespace: str) -> str | None:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace).spec.holder_identity
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def reconciler_pods(core: client.CoreV1Api, namespace: str) -> list[dict]:
    """Name, node, phase, readiness, restarts, image and whether it holds the Lease, per pod."""
    holder = lease_holder(core.api_client, namespace)
    out = []
    for p in core.list_namespaced_pod(namespace, label_selector=SELECTOR).items:
        statuses = p.status.container_statuses or []
        ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        out.append({
            "name": p.metadata.name, "node": p.spec.node_name, "phase": p.status.phase, "ready": ready,
            "restarts": sum(c.restart_count for c in statuses),
            "image": statuses[0].image_id if statuses else p.spec.containers[0].image,
            "leader": holder is not None and holder == p.metadata.name,
            "deleting": p.metadata.deletion_timestamp is not None,
        })
    return sorted(out, key=lambda d: d["name"])


def wait_reconciler_pods_ready(core: client.CoreV1Api, namespace: str, replicas: int,
                               timeout: float = 180.0) -> list[dict]:
    """Wait until ``replicas`` pods are Ready and one of them holds the Lease; return the pods."""
    def ready() -> list[dict] | None:
        pods = [p for p in reconciler_pods(core, namespace) if not p["deleting"]]
        return pods if sum(p["ready"] for p in pods) >= replicas and any(p["leader"] for p in pods) else None

    return wait_for("reconciler pods Ready with a Lease holder", ready, timeout, interval=0.5,
                    explain=lambda: f"pods: {reconciler_pods(core, namespace)}; "
                                    f"Lease holder: {lease_holder(core.api_client, namespace)}")
