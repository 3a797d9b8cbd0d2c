"""The Kubernetes adapter's plumbing that needs no API server: the connection pool, raw responses
read to their end, Events sent from their own thread."""
from __future__ import annotations

import threading

from kubernetes import client

from gpufleet.reconciler.adapters.kube import CONNECTIONS, Kube, _call


class Raw:
    def __init__(self):
        self.read = 0

    @property
    def data(self):
        self.read += 1
        return b"{}"


def test_the_pool_keeps_a_connection_for_every_worker_and_watch():
    api = client.ApiClient()
    Kube(api)
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == CONNECTIONS


def test_a_raw_response_is_read_to_its_end_even_when_the_caller_does_not_look():
    raw = Raw()
    assert _call("x", lambda **kw: raw, _preload_content=False) is raw
    assert raw.read == 1


class Events:
    def __init__(self, block: threading.Event | None = None):
        self.sent, self.block = [], block

    def create_namespaced_event(self, namespace, body, **kw):
        if self.block is not None:
            self.block.wait(5)
        self.sent.append((namespace, body["reason"]))
        return Raw()


def test_events_in_the_background_are_sent_in_order_and_flushed():
    gate = threading.Event()
    kube = Kube(client.ApiClient(), background_events=True)
    kube.core = Events(gate)
    for reason in ("A", "B", "C"):
        kube.event({"kind": "Node", "name": "n"}, reason, "m")  # returns at once: the sender waits
    assert kube.core.sent == []
    gate.set()
    assert kube.flush_events(5)
    assert kube.core.sent == [("default", "A"), ("default", "B"), ("default", "C")]


def test_events_inline_by_default():
    kube = Kube(client.ApiClient())
    kube.core = Events()
    kube.event({"kind": "Node", "name": "n"}, "A", "m")
    assert kube.core.sent == [("default", "A")]
