"""Stand-in for NVIDIA's dcgm-exporter on the local environment's kwok nodes: one /metrics endpoint serving the
exposition dcgm-exporter would serve for each of them, its values driven by the GPU hardware stand-in's state of
each node (annotation `localenv.gpufleet.io/gpu-state`, localenv/gpu_hardware_standin.py).

Followed at github.com/NVIDIA/dcgm-exporter tag 4.5.3-4.8.2 (commit 691c927):
- the lines are internal/pkg/rendermetrics/render_metrics.go's `gpuMetricsFormat`: `# HELP`/`# TYPE` per field,
  then `FIELD{gpu="0",UUID="GPU-...",pci_bus_id="00000000:19:00.0",device="nvidia0",modelName="...",
  Hostname="node"` then the label-type counters (`DCGM_FI_DRIVER_VERSION`, etc/default-counters.csv) and the
  attributes, each map in key order (Go templates range over maps sorted), `} value`;
- `Hostname` is the NODE_NAME the DaemonSet sets (internal/pkg/hostname/hostname.go getLocalHostname);
- with `--kubernetes` the pod using the GPU is added as `container`, `namespace`, `pod` and `pod_uid`
  (internal/pkg/transformation/const.go, kubernetes.go): here the Slinky NodeSet pod on the node, whose slurmd
  holds the node's GPUs;
- the metrics' names and types are the counters CSV's (fleetspec/faults/telemetry.py FIELDS: the default
  counters plus what a fleet adds to read the thresholds, REQUIRED_COUNTERS).
The GPUs are the published `nvidia-smi -q` of an HGX H100 the hardware stand-in prints (tests/fixtures/gpu): their
bus ids, model and driver; each node's UUIDs are derived from its name.

Run: ``python -m localenv.dcgm_exporter_standin --kubeconfig FILE --port 9400``; tests start `serve` in-process.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

from kubernetes import client, config

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults.telemetry import FIELDS, HW_THERMAL
from gpufleet.stop_signal import set_on_signals
from localenv.gpu_hardware_standin import (
    BROKEN, HUNG, IDLE, KWOK_ANNOTATION, REBOOT_FIXES, RESET_FIXES, ROW_REMAP_PENDING, THROTTLING, state_of,
)

log = logging.getLogger("dcgm-exporter-standin")
MODEL, DRIVER = "NVIDIA H100 80GB HBM3", "535.161.08"  # the published nvidia-smi -q (SOURCES.md)
BUS_IDS = ("00000000:19:00.0", "00000000:3B:00.0", "00000000:4C:00.0", "00000000:5D:00.0",
           "00000000:9B:00.0", "00000000:BB:00.0", "00000000:CB:00.0", "00000000:DB:00.0")
SLOW_GPU = 3  # the GPU a `throttling` node holds in a thermal slowdown
BUSY = {"DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0, "DCGM_FI_DEV_GPU_TEMP": 54.0,
        "DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_PROF_SM_ACTIVE": 0.83}
QUIET = {"DCGM_FI_DEV_GPU_UTIL": 0.0, "DCGM_FI_PROF_SM_ACTIVE": 0.0}
GPU_IDLE = 0x1  # DCGM_CLOCKS_EVENT_REASON_GPU_IDLE


def gpu_values(state: str, gpu: int) -> dict[str, float]:
    """What one GPU of a node in `state` reports. Counters (ECC, replays, remapped rows) stay at 0 but where the
    state says otherwise."""
    v = {name: 0.0 for name in FIELDS}
    v.update(BUSY)
    if state == IDLE:
        v.update(QUIET, DCGM_FI_DEV_SM_CLOCK=345.0, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=float(GPU_IDLE))
    elif state == HUNG:  # a collective that never returns: clocks up, nothing issued
        v.update(QUIET)
    elif state in (RESET_FIXES, ROW_REMAP_PENDING) and gpu == 0:  # as smi_q's first GPU: Pending Yes
        v.update(DCGM_FI_DEV_ROW_REMAP_PENDING=1.0, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS=1.0)
    elif state == BROKEN and gpu == 0:
        v.update(DCGM_FI_DEV_ROW_REMAP_FAILURE=1.0, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS=8.0)
    elif state == THROTTLING and gpu == SLOW_GPU:
        v.update(DCGM_FI_DEV_SM_CLOCK=990.0, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=float(HW_THERMAL),
                 DCGM_FI_DEV_GPU_TEMP=91.0)
    return v


def _uuid(node: str, gpu: int) -> str:
    h = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _value(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class NodeGpus:
    def __init__(self, name: str, state: str, gpus: int, pod: dict[str, str] | None = None):
        self.name, self.state, self.pod = name, state, pod or {}
        self.gpus = max(0, gpus - 1) if state == REBOOT_FIXES else gpus  # a GPU fell off the bus


def exposition(nodes: Iterable[NodeGpus]) -> str:
    """dcgm-exporter's text for these nodes' GPUs, field by field as gpuMetricsFormat renders it."""
    nodes = list(nodes)
    out = []
    for name, f in FIELDS.items():
        out.append(f"# HELP {name} {f.help}")
        out.append(f"# TYPE {name} {f.prom_type}")
        for n in nodes:
            for g in range(n.gpus):
                head = (f'gpu="{g}",UUID="{_uuid(n.name, g)}",pci_bus_id="{BUS_IDS[g % len(BUS_IDS)]}",'
                        f'device="nvidia{g}",modelName="{MODEL}",Hostname="{n.name}"')
                extra = {"DCGM_FI_DRIVER_VERSION": DRIVER}  # $metric.Labels: the CSV's label-type counters
                attrs = dict(sorted(n.pod.items()))  # $metric.Attributes: the pod using the GPU
                tail = "".join(f',{k}="{v}"' for k, v in sorted(extra.items())) + \
                    "".join(f',{k}="{v}"' for k, v in attrs.items())
                out.append(f"{name}{{{head}{tail}}} {_value(gpu_values(n.state, g)[name])}")
    return "\n".join(out) + "\n"


class KwokNodes:
    """The kwok nodes and the NodeSet pod on each, read from the API server at each scrape; with `label_selector`,
    only the nodes it selects (a test's pool on an API server that other tests fill with nodes of their own: each
    node's dcgm-exporter serves that node's GPUs, so the exporters of a pool's nodes serve the pool's alone)."""

    def __init__(self, api: client.ApiClient, label_selector: str = ""):
        self.core = client.CoreV1Api(api)
        self.label_selector = label_selector

    def __call__(self) -> list[NodeGpus]:
        nodes = json.loads(self.core.list_node(label_selector=self.label_selector, _preload_content=False).data)["items"]
        pods = json.loads(self.core.list_pod_for_all_namespaces(
            label_selector=labels.SLINKY_POD_HOSTNAME, _preload_content=False).data)["items"]
        on = {p["spec"].get("nodeName"): p for p in pods
              if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}
        out = []
        for n in nodes:
            meta = n["metadata"]
            if not (meta.get("annotations") or {}).get(KWOK_ANNOTATION):
                continue
            gpus = int(((n.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu") or 0)
            p = on.get(meta["name"])
            pod = {"pod": p["metadata"]["name"], "namespace": p["metadata"]["namespace"],
                   "container": p["spec"]["containers"][0]["name"], "pod_uid": p["metadata"].get("uid", "")} if p else {}
            out.append(NodeGpus(meta["name"], state_of(n), gpus, pod))
        return sorted(out, key=lambda x: x.name)


def serve(nodes: Callable[[], list[NodeGpus]], port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """An HTTP server on `port` (0: any free one) answering GET /metrics; started in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            try:
                body = exposition(nodes()).encode()
            except Exception as e:  # noqa: BLE001 - the API server away: the scrape fails, as the exporter's would
                self.send_error(503, str(e)[:200])
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # quiet: one line per scrape is noise
            log.debug(fmt, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="dcgm-exporter-standin", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--port", type=int, default=9400, help="dcgm-exporter's default port")
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = serve(KwokNodes(config.new_client_from_config(config_file=args.kubeconfig)), args.port, args.host)
    stop = threading.Event()
    set_on_signals(stop)  # SIGTERM sets it (never from inside the handler: gpufleet/stop_signal.py)
    log.info("serving http://%s:%d/metrics", args.host, server.server_address[1])
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
