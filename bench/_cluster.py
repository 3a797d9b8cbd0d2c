"""A benchmark's own control plane and what it does with it: nodes made in bulk, waits on them, the API
server's request counters, and the teardown."""
from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from _repo import REPO  # noqa: F401  (the checkout on the import path)
from _output import say

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.waiting import wait_for


def new_kube(workdir: Path, progress: Callable[[str], None] | None = None):
    from localenv.control_plane import DEFAULT_PORTS, LocalKube
    from localenv.paths import TOOLS_BIN
    from localenv.ports import free_ports

    ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS))))
    return LocalKube(workdir, TOOLS_BIN, **{f"{k}_port": v for k, v in ports.items()},
                     etcd_unsafe_no_fsync=True, progress=progress)


def install_crd_and_namespace(api, namespace: str = "gpufleet-system", timeout: float = 60) -> None:
    """What `pulumi up` installs that the reconciler needs: the Remediation CRD and its namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(remediation_crd.manifest())
    except ApiException as e:
        if e.status != 409:
            raise
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise

    def served() -> bool:
        try:
            client.CustomObjectsApi(api).list_cluster_custom_object(labels.GROUP, remediation_crd.VERSION,
                                                                    remediation_crd.PLURAL)
            return True
        except ApiException:
            return False

    wait_for("the Remediation kind served", served, timeout, interval=0.3)


def create_nodes(kubeconfig: Path, manifests: list[dict], concurrency: int = 8, timeout: float = 1800,
                 progress: Callable[[str], None] = say) -> float:
    """Create Node objects in parallel (one API client per worker thread). Returns seconds taken."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    local = threading.local()

    def core():
        if not hasattr(local, "core"):
            local.core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        return local.core

    done = [0]
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(m: dict) -> None:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("node creation took too long")
        for attempt in range(5):
            try:
                core().create_node(m, _preload_content=False, _request_timeout=30)
                break
            except ApiException as e:
                if e.status == 409:
                    break
                if attempt == 4 or e.status not in (429, 500, 503, 504):
                    raise
                time.sleep(0.5 * (attempt + 1))  # back off before the retry
        with lock:
            done[0] += 1
            if done[0] % 500 == 0:
                progress(f"  created {done[0]}/{len(manifests)} nodes ({time.monotonic() - t0:.0f}s)")

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for f in [ex.submit(one, m) for m in manifests]:
            f.result()
    return time.monotonic() - t0


def list_nodes_raw(api) -> list[dict]:
    from kubernetes import client

    resp = client.CoreV1Api(api).list_node(_preload_content=False, _request_timeout=60)
    return json.loads(resp.data)["items"]


def is_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def wait_all_ready(api, expected: int, timeout: float = 600, progress: Callable[[str], None] = say,
                   min_fraction: float = 1.0) -> int:
    """Wait until `expected` nodes are Ready, or at least `min_fraction` of them on two checks in a row
    (at 10,000 kwok nodes on 2 cores a few leases expire now and then, and those nodes flap). Returns
    how many were Ready."""
    seen = {"last": -1, "enough_before": False}

    def ready() -> int | None:
        n = sum(1 for node in list_nodes_raw(api) if is_ready(node))
        if n >= expected:
            return n
        enough = n >= expected * min_fraction
        if enough and seen["enough_before"]:
            progress(f"  {n}/{expected} nodes Ready: going on (at least {min_fraction:.1%})")
            return n
        seen["enough_before"] = enough
        if n != seen["last"] and n // 500 != seen["last"] // 500:
            progress(f"  {n}/{expected} nodes Ready")
        seen["last"] = n
        return None

    return wait_for(f"{expected} nodes Ready", ready, timeout, interval=2,
                    explain=lambda: f"{seen['last']}/{expected} Ready")


def release_lease(api, namespace: str = "gpufleet-system", name: str = "gpufleet-reconciler") -> None:
    """Delete the leader Lease a stopped reconciler left behind (it does not release it on exit),
    so the next one leads at once instead of after the lease expires (15 s)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoordinationV1Api(api).delete_namespaced_lease(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise


def apiserver_requests(api) -> dict[tuple[str, str, str], float]:
    """The API server's own request counters (apiserver_request_total), summed by (verb, resource,
    subresource): the calls every client made, to count the reconciler's per remediation."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
                        _request_timeout=30)
    data = resp[0].data.decode() if isinstance(resp, tuple) else resp.data.decode()
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(data):
        for s in family.samples:
            if s.name == "apiserver_request_total":
                key = (s.labels.get("verb", ""), s.labels.get("resource", ""), s.labels.get("subresource", ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


def request_delta(before: dict, after: dict) -> dict[str, float]:
    """Requests between two `apiserver_requests` samples, as "VERB resource[/sub]" -> count."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d > 0:
            out[f"{k[0]} {k[1]}" + (f"/{k[2]}" if k[2] else "")] = d
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def start_standin_for_the_spec(env) -> None:
    """The Slinky stand-in, acting on the spec's NodeSets (there is no stack here to declare the
    NodeSet resources it would otherwise wait for), as a process of its own like the operator."""
    env.stop_standin()
    env.start_standin(env.nodesets())


def teardown(stop: Callable[[], None], root: Path, keep: bool, own_root: bool, watcher: Any = None) -> None:
    """Close the watcher, stop the environment, and remove the run's folder unless it is to be kept."""
    say("tearing down")
    try:
        if watcher:
            watcher.close()
        stop()
    finally:
        if own_root and not keep:
            shutil.rmtree(root, ignore_errors=True)
