"""An idle observer for storms.py --observer: a process of its own that watches every node and notes,
on this host's clock, when it first saw each node with a fault condition and when cordoned. It has
nothing else to do, so what it sees late the API server delivered late (not a busy client).

    python bench/_observe_nodes.py KUBECONFIG OUT.json     # until SIGTERM; then writes OUT.json
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(kubeconfig: str, out: str) -> int:
    from kubernetes import config

    from _watch import node_informer
    from gpufleet.stop_signal import set_on_signals

    fault: dict[str, float] = {}
    cordon: dict[str, float] = {}
    before: set[str] = set()
    stop = threading.Event()
    set_on_signals(stop)  # SIGTERM sets it (never from inside the handler: gpufleet/stop_signal.py)

    def view(node: dict) -> tuple[bool, bool]:  # (GPU fault condition, cordoned)
        return (any(c.get("type") == "GpuHealthy" and c.get("status") == "False"
                    for c in (node.get("status") or {}).get("conditions") or []),
                bool((node.get("spec") or {}).get("unschedulable")))

    def changed(name, old, new) -> None:
        if new is None:
            return
        faulted, cordoned = new
        if not informer.synced.is_set():  # the first list: what was cordoned before
            if cordoned:
                before.add(name)
            return
        now = time.time()
        if faulted and name not in fault:
            fault[name] = now
        if cordoned and name not in cordon and name not in before:
            cordon[name] = now

    informer = node_informer(config.new_client_from_config(config_file=kubeconfig), "observer", view, changed)
    informer.start(stop)
    informer.synced.wait()
    print("synced", flush=True)
    stop.wait()
    with open(out, "w") as f:
        json.dump({"fault": fault, "cordon": cordon}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
