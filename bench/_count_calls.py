"""Run `gpufleet` counting its API server and Slurm calls, for the benchmarks (`--count-calls`).

    python bench/_count_calls.py OUT.json reconcile --policy ...

Every request the kubernetes client sends (`RESTClientObject.request`) and every one httpx sends
(slurmrestd) is counted by verb and resource, names left out ("PUT remediations", "GET slurm
/node/{name}"). The counts are written to OUT.json every second and at exit, so a benchmark reads
them before and after what it measures. Nothing else changes: the reconciler is the same code.
"""
from __future__ import annotations

import atexit
import json
import re
import runpy
import sys
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlparse

COUNTS: Counter[str] = Counter()
LOCK = threading.Lock()


def kube_key(method: str, url: str, query: dict | None) -> str:
    u = urlparse(url)
    parts = [p for p in u.path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else parts
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] if parts else u.path
    sub = f"/{parts[2]}" if len(parts) > 2 else ""
    qs = parse_qs(u.query)
    for k, v in (query.items() if isinstance(query, dict) else query or []):
        qs[k] = [v]
    verb = method
    if method == "GET":
        verb = "WATCH" if str(qs.get("watch", [""])[0]).lower() in ("true", "1") else ("GET" if len(parts) > 1 else "LIST")
    return f"{verb} {resource}{sub}"


def slurm_key(method: str, path: str) -> str:
    path = re.sub(r"^/slurm/v[0-9.]+", "", path)
    path = re.sub(r"/(node|job)/[^/]+", r"/\1/{name}", path)
    return f"{method} slurm {path}"


def count(key: str) -> None:
    with LOCK:
        COUNTS[key] += 1


def dump(out: Path) -> None:
    with LOCK:
        data = dict(COUNTS)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(out)


def patch() -> None:
    import httpx
    from kubernetes.client import rest

    kube_request = rest.RESTClientObject.request

    def counted_request(self, method, url, query_params=None, *args, **kwargs):
        count(kube_key(method, url, query_params))
        return kube_request(self, method, url, query_params, *args, **kwargs)

    rest.RESTClientObject.request = counted_request
    send = httpx.Client.send

    def counted_send(self, request, *args, **kwargs):
        count(slurm_key(request.method, request.url.path))
        return send(self, request, *args, **kwargs)

    httpx.Client.send = counted_send


def main() -> None:
    out = Path(sys.argv[1])
    patch()
    atexit.register(dump, out)

    def every_second() -> None:
        stop = threading.Event()
        while not stop.wait(1.0):
            dump(out)

    threading.Thread(target=every_second, daemon=True, name="count-calls").start()
    sys.argv = ["gpufleet", *sys.argv[2:]]
    runpy.run_module("gpufleet", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
