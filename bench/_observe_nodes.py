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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(kubeconfig: str, out: str) -> int:
    from kubernetes import config

    from _common import follow_nodes

    fault: dict[str, float] = {}
    cordon: dict[str, float] = {}
    before: set[str] = set()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def listed(items: list[dict]) -> None:
        before.update(n["metadata"]["name"] for n in items if (n.get("spec") or {}).get("unschedulable"))
        print("synced", flush=True)

    def see(kind: str, node: dict) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        name, now = node["metadata"]["name"], time.time()
        if name not in fault and any(c.get("type") == "GpuHealthy" and c.get("status") == "False"
                                     for c in (node.get("status") or {}).get("conditions") or []):
            fault[name] = now
        if (node.get("spec") or {}).get("unschedulable") and name not in cordon and name not in before:
            cordon[name] = now

    api = config.new_client_from_config(config_file=kubeconfig)
    threading.Thread(target=follow_nodes, args=(api, stop, listed, see), daemon=True).start()
    stop.wait()
    with open(out, "w") as f:
        json.dump({"fault": fault, "cordon": cordon}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
