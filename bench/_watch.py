"""The benchmarks' own node watches, on the product's informer (list, then watch from that version, list
again after an error or an expired version, changes reported as (old, new) views): when this process
saw each node cordoned, on this host's clock."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator

import _repo  # noqa: F401  (the checkout on the import path)

from gpufleet.reconciler.errors import TemporaryError
from gpufleet.reconciler.runtime.informers import Informer

CORDONED = "spec.unschedulable=true"


def node_informer(api, name: str, transform: Callable[[dict], Any],
                  on_change: Callable[[Hashable, Any, Any], None], field_selector: str | None = None) -> Informer:
    """An informer of the nodes (raw JSON, optionally filtered by the API server), for a benchmark."""
    from kubernetes import client, watch

    core = client.CoreV1Api(api)
    selector = {"field_selector": field_selector} if field_selector else {}

    def lister(cont: str | None) -> tuple[list[dict], str, str | None]:
        data = json.loads(core.list_node(**selector, limit=500, _continue=cont or None, _preload_content=False,
                                         _request_timeout=60).data)
        meta = data.get("metadata") or {}
        return data["items"], meta.get("resourceVersion", ""), meta.get("continue") or None

    def watcher(version: str) -> Iterator[tuple[str, dict]]:
        w = watch.Watch()
        try:
            for ev in w.stream(core.list_node, **selector, resource_version=version, deserialize=False,
                               timeout_seconds=30, allow_watch_bookmarks=True):
                obj = ev.get("raw_object") or ev["object"]
                if ev["type"] == "ERROR":
                    raise TemporaryError(f"watch nodes: {obj.get('message', obj)}")
                yield ev["type"], obj
        finally:
            w.stop()

    return Informer(name, lister, watcher, transform, on_change=on_change)


class NodeWatcher:
    """Watches the cordoned nodes (`fieldSelector=spec.unschedulable=true`) in a thread; records when each
    node was first seen cordoned after `arm()`, on this host's clock. The API server filters: kwok's
    heartbeats of every other node never reach this process, so its own lag stays out of the figures."""

    def __init__(self, kubeconfig: Path):
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.cordoned_at: dict[str, float] = {}  # first seen cordoned since arm()
        self.cordoned_before: set[str] = set()  # cordoned at arm() and not uncordoned since
        self.cordoned_now: set[str] = set()  # in the selector now
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.informer = node_informer(self.api, "bench-cordoned", lambda o: True, self._changed, CORDONED)

    def start(self) -> "NodeWatcher":
        self.informer.start(self.stop)
        if not self.informer.synced.wait(120):
            raise TimeoutError("bench node watch did not sync")
        return self

    def close(self) -> None:
        self.stop.set()

    def arm(self) -> None:
        """Forget what was cordoned so far: later cordons are recorded."""
        with self.lock:
            self.cordoned_before = set(self.cordoned_now)
            self.cordoned_at = {}

    def _changed(self, name: Hashable, old: Any, new: Any) -> None:
        """In the selector (cordoned), or out of it (uncordoned or deleted: a later cordon counts again)."""
        with self.lock:
            if new is not None:
                self.cordoned_now.add(name)
                if name not in self.cordoned_at and name not in self.cordoned_before:
                    self.cordoned_at[name] = time.time()
            else:
                self.cordoned_now.discard(name)
                self.cordoned_before.discard(name)
