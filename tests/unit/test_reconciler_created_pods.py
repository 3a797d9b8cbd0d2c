"""Every pod the reconciler creates in its namespace passes Pod Security `restricted`, which that namespace
enforces outside the local environment (components/reconciler.py pod_security_level; issue 24, item 1).

The checks are those of the `restricted` profile at v1.34 (kubernetes.io/docs/concepts/security/pod-security-standards,
k8s.io/pod-security-admission policy/check_*.go): no host namespace, hostPath, privilege or escalation;
non-root and not uid 0; RuntimeDefault or Localhost seccomp; every capability dropped, none added but
NET_BIND_SERVICE. A pod the profile refuses is never created: for a Job, its controller retries until the
Job's deadline, and the Job fails.
"""
from __future__ import annotations

from gpufleet.reconciler.adapters.health_checks import job_manifest
from gpufleet.reconciler.adapters.providers import placeholder_pod
from tests.unit.fakes import fleet


def restricted_violations(pod_spec: dict) -> list[str]:
    out = []
    pod_sc = pod_spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(host):
            out.append(host)
    if any("hostPath" in v for v in pod_spec.get("volumes") or []):
        out.append("hostPath volume")
    containers = [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]
    for c in containers:
        sc = {**pod_sc, **(c.get("securityContext") or {})}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: no RuntimeDefault/Localhost seccomp profile")
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities not dropped (ALL)")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    return out


def test_the_check_itself_catches_what_restricted_refuses():
    spec = {"containers": [{"name": "c", "securityContext": {"capabilities": {"drop": ["ALL"]}}}]}
    assert restricted_violations(spec) == ["c: allowPrivilegeEscalation not false", "c: runAsNonRoot not true",
                                           "c: no RuntimeDefault/Localhost seccomp profile"]


def test_health_check_job_pods_pass_pod_security_restricted():
    spec = fleet()
    pool = spec.pools[0]
    job = job_manifest(spec, pool, "h100-0", "check-h100-0-1", spec.healing.reconciler.namespace)
    assert restricted_violations(job["spec"]["template"]["spec"]) == []


def test_capacity_request_placeholders_pass_pod_security_restricted():
    spec = fleet()
    pod = placeholder_pod(spec.pools[0], "k-1/refill", "refill", spec.healing.reconciler.namespace, ["h100-0"],
                          spec.healing.reconciler.placeholder_image)
    assert restricted_violations(pod["spec"]) == []
