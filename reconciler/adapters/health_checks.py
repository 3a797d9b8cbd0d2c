"""Health-check Jobs (issue 25): one Job per node and attempt, in the reconciler's namespace, pinned
to the node; its verdict read from the Job's status and its pod's termination message, never a log.

The pod lands on that node whatever holds it out of service (and only if it is a pool's node: the pool label
in its nodeSelector): it is pinned by `matchFields metadata.name`
(as the DaemonSet controller pins its pods: kubernetes v1.34 pkg/controller/daemon/util
ReplaceDaemonSetPodNodeNameNodeAffinity) and tolerates every taint, `node.kubernetes.io/unschedulable`
(the cordon) included (kube-scheduler's NodeUnschedulable plugin admits a pod that tolerates it:
pkg/scheduler/framework/plugins/nodeunschedulable). It asks for every GPU of the node, so the device
plugin gives it all of them and nothing else runs there. It runs unprivileged and passes Pod Security
`restricted` (non-root, RuntimeDefault seccomp, no capability); `activeDeadlineSeconds`
is the check's timeout, and the TTL controller deletes the Job a day after it ended (no delete grant).
"""
from __future__ import annotations

from typing import Any

from kubernetes import client

from gpufleet.fleetspec import health_report, labels
from gpufleet.fleetspec.models import FleetSpec, NodePool

from gpufleet.reconciler.adapters.kube import _call, _json
from gpufleet.reconciler.core.validation import INCONCLUSIVE, MISSING, Verdict, read_report
from gpufleet.reconciler.errors import AlreadyExists, NotFound

TTL_SECONDS = 86400
JOB_NAME = "batch.kubernetes.io/job-name"  # the label the Job controller puts on its pods (batch/v1, 1.27+)


def job_manifest(spec: FleetSpec, pool: NodePool, node: str, name: str, namespace: str) -> dict[str, Any]:
    check = spec.healing.repair.health_check
    image = spec.healing.health_check_image()
    gpus = str(pool.gpus_per_node)
    meta_labels = {labels.HEALTH_CHECK_NODE: node, labels.POOL: pool.name, labels.APP_PART_OF: labels.PART_OF}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": check.timeout_seconds,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {
                "metadata": {"labels": meta_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    # Pod Security `restricted`, which the reconciler's namespace enforces outside the local
                    # environment: without these the Job controller's pods are refused, the Job fails at its
                    # deadline and every node it checks fails validation. 65532: the images' own user.
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "nodeSelector": {labels.NODE_POOL: pool.name},  # a pool's node (the admission policy)
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": "check",
                        "image": image,
                        "command": check.argv(),
                        "env": [{"name": health_report.EXPECTED_GPUS, "value": gpus}],
                        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    }


class HealthChecks:
    """Creates the Jobs and reads their verdicts (the reconciler's namespace only)."""

    def __init__(self, api: client.ApiClient, spec: FleetSpec):
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.spec = spec
        self.namespace = spec.healing.reconciler.namespace

    def start(self, node: str, pool: str, name: str) -> None:
        """Create the Job; one of that name made already (a replay) is the same check."""
        body = job_manifest(self.spec, self.spec.pool(pool), node, name, self.namespace)
        try:
            _call(f"create health check {name}", self.batch.create_namespaced_job, self.namespace, body,
                  _preload_content=False)
        except AlreadyExists:
            pass

    def verdict(self, name: str) -> Verdict:
        """What the Job says now: its conditions (Complete, Failed) and its pod's termination message."""
        try:
            job = _json(_call(f"get health check {name}", self.batch.read_namespaced_job, name, self.namespace,
                              _preload_content=False))
        except NotFound:
            return Verdict(MISSING)
        conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                      if c.get("status") == "True"}
        if "Complete" not in conditions and "Failed" not in conditions:
            return Verdict("running")
        passed_job = "Complete" in conditions
        message, exit_code = self._termination(name)
        if message:
            return read_report(message, passed_job)
        if passed_job:
            return Verdict("passed", "exit 0 (no report)")
        # No report: the check never gave a verdict (its deadline passed: "all of its running Pods are terminated
        # and the Job status will become type: Failed with reason: DeadlineExceeded", Kubernetes' Jobs page, "Job
        # termination and cleanup"; or its pod was evicted or died before writing one). That says nothing about
        # the node: inconclusive (the check runs again once, on a fresh pod).
        failed = conditions["Failed"]
        why = failed.get("reason") or "Failed"
        detail = f"exit {exit_code}" if exit_code is not None else (failed.get("message") or "")
        return Verdict(INCONCLUSIVE, f"the Job ended without a report: {why}: {detail}".rstrip(": "))

    def _termination(self, name: str) -> tuple[str, int | None]:
        """The check container's termination message and exit code, from the Job's pod."""
        pods = _json(_call(f"list pods of {name}", self.core.list_namespaced_pod, self.namespace,
                           label_selector=f"{JOB_NAME}={name}", _preload_content=False)).get("items") or []
        for pod in pods:
            for st in (pod.get("status") or {}).get("containerStatuses") or []:
                done = (st.get("state") or {}).get("terminated")
                if st.get("name") == "check" and done:
                    return str(done.get("message") or "").strip(), done.get("exitCode")
        return "", None

