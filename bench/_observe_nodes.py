"""An idle observer for storms.py --observer: a process of its own that watches every node and notes,
on this host's clock, when it first saw each node with a fault condition and when cordoned. It has
nothing else to do, so what it sees late the API server delivered late (not a busy client).

    python bench/_observe_nodes.py KUBECONFIG OUT.json     # until SIGTERM; then writes OUT.json
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time


def main(kubeconfig: str, out: str) -> int:
    from kubernetes import client, config, watch

    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    fault: dict[str, float] = {}
    cordon: dict[str, float] = {}
    before: set[str] = set()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def see(node: dict) -> None:
        name, now = node["metadata"]["name"], time.time()
        if name not in fault and any(c.get("type") == "GpuHealthy" and c.get("status") == "False"
                                     for c in (node.get("status") or {}).get("conditions") or []):
            fault[name] = now
        if (node.get("spec") or {}).get("unschedulable") and name not in cordon and name not in before:
            cordon[name] = now

    def run() -> None:
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    data = json.loads(core.list_node(_preload_content=False, _request_timeout=60).data)
                    before.update(n["metadata"]["name"] for n in data["items"] if (n.get("spec") or {}).get("unschedulable"))
                    version = data["metadata"]["resourceVersion"]
                    print("synced", flush=True)
                for ev in watch.Watch().stream(core.list_node, resource_version=version, deserialize=False,
                                               timeout_seconds=30, allow_watch_bookmarks=True):
                    obj = ev.get("raw_object") or ev["object"]
                    if ev["type"] == "ERROR":
                        version = ""
                        break
                    version = obj["metadata"].get("resourceVersion", version)
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        see(obj)
                    if stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - relist
                version = ""
                stop.wait(0.5)

    threading.Thread(target=run, daemon=True).start()
    stop.wait()
    with open(out, "w") as f:
        json.dump({"fault": fault, "cordon": cordon}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
