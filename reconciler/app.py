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

from reconciler.adapters.kube import Kube
from reconciler.runtime.leader import LeaseElector
from reconciler.runtime.metrics import Metrics, serve
from reconciler.adapters.notify import Notifier, channels_from_spec
from reconciler.adapters.providers import provider_for
from reconciler.adapters.records import KubeRecordStore, MemoryRecordStore
from reconciler.runtime.controller import Runtime
from reconciler.adapters.slurm import SlurmClient

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
    """See reconciler.adapters.slurm.make_client (rest: url, token_file, jwt_key_file, user)."""
    from reconciler.adapters.slurm import make_client

    return make_client(kind, env=env, **rest)


@dataclass
class Manager:
    """The reconciler process: informers and workers (the runtime), the Lease, metrics and /healthz."""

    runtime: Runtime
    elector: LeaseElector | None
    metrics: Metrics
    stop: threading.Event

    def sync(self) -> None:
        """List every informer now and queue what needs a look (tests, `--once`)."""
        for i in self.runtime.informers:
            i.relist()
        self.runtime.resync()

    def run(self, metrics_port: int | None = None, health_port: int | None = None) -> None:
        server = serve(self.metrics, metrics_port, healthy=self.runtime.synced, health_port=health_port) \
            if metrics_port else None
        leading = None
        if self.elector is not None:
            self.elector.start()
            leading = self.elector.leading
        try:
            self.runtime.run(self.stop, leading)
        finally:
            self.runtime.kube.flush_events(10.0)  # the Events still queued (best effort, bounded)
            if self.elector:
                self.elector.stop()  # releases the Lease: the next leader starts at once
            if server:
                server.shutdown()


def build(spec: FleetSpec, api: client.ApiClient, *, slurm: SlurmClient | None, namespace: str | None = None,
          leader_elect: bool = False, dry_run: bool = False, aws_session=None) -> Manager:
    kube = Kube(api, background_events=True)  # a worker does not wait for an Event
    metrics = Metrics()
    stop = threading.Event()
    namespace = namespace or spec.healing.reconciler.namespace
    store = MemoryRecordStore() if dry_run else KubeRecordStore(api)
    notifier = Notifier(channels_from_spec(spec), kube, namespace,
                        on_failure=lambda ch: metrics.notify_failures.labels(ch).inc())
    kw = {"session": aws_session} if aws_session is not None else {}
    providers = {p.name: provider_for(p, kube, spec, slurm, **(kw if p.provider == "aws-asg" else {})) for p in spec.pools}
    elector = None
    if leader_elect:
        # A replica is its pod (POD_NAME, from the Deployment): pods on the host's network share the node's
        # hostname, and each container's process is pid 1, so hostname-pid would name two replicas alike.
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaseElector(api, namespace, "gpufleet-reconciler", identity)
    fence = elector.holds if elector else (lambda: True)
    runtime = Runtime(spec, kube, store, slurm, providers, notifier, metrics, dry_run=dry_run, fence=fence)
    return Manager(runtime, elector, metrics, stop)
