"""Wire the reconciler from its configuration: one client, built once, passed to everything."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config

from fleetspec import FleetSpec, parse_fleet

from .kube import Kube
from .leader import LeaseElector
from .metrics import Metrics, serve
from .notify import Notifier, channels_from_spec
from .providers import provider_for
from .records import KubeRecordStore, MemoryRecordStore
from .runtime import NodeCache, Runtime
from .slurm import SlurmClient

log = logging.getLogger(__name__)


def load_policy(path: str | Path) -> FleetSpec:
    """The fleet spec as the stack rendered it into the policy ConfigMap (fleet.json)."""
    return parse_fleet(json.loads(Path(path).read_text()), source=str(path))


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    if kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    config.load_incluster_config()
    return client.ApiClient()


def slurm_client(kind: str, env: dict[str, str] | None = None, **rest) -> SlurmClient | None:
    """See reconciler.slurm.make_client (rest: url, token_file, jwt_key_file, user)."""
    from .slurm import make_client

    return make_client(kind, env=env, **rest)


@dataclass
class Reconciler:
    runtime: Runtime
    cache: NodeCache
    elector: LeaseElector | None
    metrics: Metrics
    stop: threading.Event

    def run(self, metrics_port: int | None = None) -> None:
        server = None
        if metrics_port:
            stale = lambda: (self.cache.version != "")  # noqa: E731 - healthy once the node cache has synced
            server = serve(self.metrics, metrics_port, healthy=stale)
        self.cache.start(self.stop)
        leading = None
        if self.elector is not None:
            self.elector.start()
            leading = self.elector.leading
        try:
            self.runtime.run(self.stop, leading)
        finally:
            if self.elector:
                self.elector.stop()
            if server:
                server.shutdown()


def build(spec: FleetSpec, api: client.ApiClient, *, slurm: SlurmClient | None, namespace: str | None = None,
          leader_elect: bool = False, dry_run: bool = False, aws_session=None) -> Reconciler:
    kube = Kube(api)
    metrics = Metrics()
    stop = threading.Event()
    cache = NodeCache(kube, list(spec.healing.condition_types))
    namespace = namespace or spec.healing.reconciler.namespace
    store = MemoryRecordStore() if dry_run else KubeRecordStore(api)
    notifier = Notifier(channels_from_spec(spec), kube, namespace,
                        on_failure=lambda ch: metrics.notify_failures.labels(ch).inc())
    kw = {"session": aws_session} if aws_session is not None else {}
    providers = {p.name: provider_for(p, kube, spec, slurm, **(kw if p.provider == "aws-asg" else {})) for p in spec.pools}
    runtime = Runtime(spec, kube, cache, store, slurm, providers, notifier, metrics, dry_run=dry_run)
    elector = None
    if leader_elect:
        identity = f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaseElector(api, namespace, "gpufleet-reconciler", identity)
    return Reconciler(runtime, cache, elector, metrics, stop)
