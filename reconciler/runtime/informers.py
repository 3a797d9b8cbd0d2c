"""Informers: list + watch one kind into a cache of small views, with indexes and change callbacks.

Client-go's shape, kept to what the reconciler reads: a paged list, then a watch from its
resourceVersion; a broken or expired watch (410 Gone) lists again and reports only what changed.
The cache holds views (a few fields), never whole objects with managedFields, so 10,000 nodes fit
in a few MiB. `synced` is set once the first list is in: no decision is taken before it.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Generic, Hashable, Iterable, Iterator, TypeVar

from gpufleet.reconciler.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)
V = TypeVar("V")

Lister = Callable[[str | None], tuple[list[dict], str, str | None]]  # continue token -> (items, rv, continue)
Watcher = Callable[[str], Iterator[tuple[str, dict]]]  # resourceVersion -> (type, object) events
OnChange = Callable[[Hashable, "V | None", "V | None"], None]  # key, old view, new view


class Informer(Generic[V]):
    def __init__(self, name: str, lister: Lister, watcher: Watcher, transform: Callable[[dict], V],
                 key: Callable[[dict], Hashable] = lambda o: o["metadata"]["name"],
                 indexers: dict[str, Callable[[V], Iterable[Hashable]]] | None = None,
                 on_change: OnChange | None = None, accept: Callable[[V, V], bool] | None = None):
        self.name, self.lister, self.watcher, self.transform, self.key = name, lister, watcher, transform, key
        self.indexers = indexers or {}
        self.on_change = on_change
        self.accept = accept  # (cached, incoming) -> take it? e.g. refuse a copy older than our own write
        self.synced = threading.Event()
        self.version = ""
        self._lock = threading.RLock()
        self._items: dict[Hashable, V] = {}
        self._index: dict[str, dict[Hashable, set[Hashable]]] = {n: {} for n in self.indexers}

    # --- reading ---------------------------------------------------------------------------------

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[V]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._items)

    def by_index(self, index: str, value: Hashable) -> list[V]:
        with self._lock:
            return [self._items[k] for k in self._index[index].get(value, ()) if k in self._items]

    def __len__(self) -> int:
        return len(self._items)

    # --- writing -----------------------------------------------------------------------------------

    def _set(self, key: Hashable, view: V | None) -> None:
        with self._lock:
            old = self._items.get(key)
            if old is not None and view is not None and self.accept is not None and not self.accept(old, view):
                return
            if old is not None:
                for name, fn in self.indexers.items():
                    for v in fn(old):
                        self._index[name].get(v, set()).discard(key)
            if view is None:
                self._items.pop(key, None)
            else:
                self._items[key] = view
                for name, fn in self.indexers.items():
                    for v in fn(view):
                        self._index[name].setdefault(v, set()).add(key)
        if old != view and self.on_change is not None:
            self.on_change(key, old, view)

    def put(self, key: Hashable, view: V | None) -> None:
        """Write-through: the reconciler's own writes show at once, before their watch event."""
        self._set(key, view)

    def update(self, key: Hashable, change: Callable[[V], V]) -> None:
        """Write-through of a change to a cached item; nothing when the item is gone (its DELETED event
        came first: a ghost must not come back)."""
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._set(key, change(old))

    def apply(self, kind: str, obj: dict) -> None:
        """One watch event."""
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.version = rv
        if kind == "BOOKMARK":
            return
        self._set(self.key(obj), None if kind == "DELETED" else self.transform(obj))

    def relist(self) -> None:
        """A full, paged list; replaces the cache and reports the differences."""
        seen: dict[Hashable, V] = {}
        cont, version = None, ""
        while True:
            items, version, cont = self.lister(cont)
            for obj in items:
                seen[self.key(obj)] = self.transform(obj)
            if not cont:
                break
        for key in [k for k in self.keys() if k not in seen]:
            self._set(key, None)
        for key, view in seen.items():
            self._set(key, view)
        self.version = version
        self.synced.set()

    # --- running -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if not self.version:
                    self.relist()
                for kind, obj in self.watcher(self.version):
                    self.apply(kind, obj)
                    if stop.is_set():
                        return
            except (TemporaryError, PermanentError) as e:
                log.warning("%s watch interrupted (%s); listing again", self.name, e)
                self.version = ""
                stop.wait(1.0)
            except Exception:  # noqa: BLE001 - the watch must outlive any surprise; a relist heals it
                log.exception("%s watch failed; listing again", self.name)
                self.version = ""
                stop.wait(1.0)

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name=f"informer-{self.name}", daemon=True)
        t.start()
        return t
