"""Wire the reconciler from its configuration: one client, built once, passed to everything."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from kubernetes import client, config

from gpufleet.fleetspec import FleetSpec, labels, parse_fleet

from gpufleet.reconciler.adapters.health_checks import HealthChecks
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.notify import Notifier, channels_from_spec, owner_routes_from_spec
from gpufleet.reconciler.adapters.providers import provider_for
from gpufleet.reconciler.adapters.records import KubeRemediationStore
from gpufleet.reconciler.adapters.slurm import SlurmClient
from gpufleet.reconciler.runtime.leader import LeaseElector
from gpufleet.reconciler.runtime.manager import Manager
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)
LEASE = "gpufleet-reconciler"


def load_policy(path: str | Path) -> FleetSpec:
    """The fleet spec as the stack rendered it into the policy ConfigMap (fleet.json)."""
    return parse_fleet(json.loads(Path(path).read_text()), source=str(path))


USER_AGENT = "gpufleet"  # not the client library's "OpenAPI-Generator/...": a write without a field manager is
# named after its user agent in managedFields, which is where a page reads who reported a fault


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    if kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
    else:
        config.load_incluster_config()
        api = client.ApiClient()
    api.user_agent = USER_AGENT
    return api


def slurm_client(kind: str, env: dict[str, str] | None = None, **rest) -> SlurmClient | None:
    """See gpufleet.reconciler.adapters.slurm.make_client (rest: url, token_file, token_secret and api, jwt_key_file, user)."""
    from gpufleet.reconciler.adapters.slurm import make_client

    return make_client(kind, env=env, **rest)


def watch_slurm_token(slurm: SlurmClient | None, metrics: Metrics, notifier: Notifier) -> None:
    """A token kept by someone else (a Slinky Token's Secret) is watched for going stale: gauges, a nudge of the
    Token it reads from the API server (its Secret's Token, components/slinky.py TOKEN_NAME, beside it) and one
    page when that cannot help (reconciler/runtime/token_alarm.py); a token the reconciler signs itself cannot
    go stale."""
    from gpufleet.reconciler.adapters.slurm.rest import KeptToken, SlurmREST
    from gpufleet.reconciler.adapters.slurm.token_secret import SecretToken, TokenNudge
    from gpufleet.reconciler.runtime.token_alarm import TokenAlarm

    tokens = slurm.tokens if isinstance(slurm, SlurmREST) else None
    if isinstance(tokens, KeptToken):
        ns = tokens.ref.namespace if isinstance(tokens, SecretToken) else "slurm"
        name = "gpufleet-reconciler"  # components/slinky.py TOKEN_NAME
        nudge = TokenNudge(tokens.core.api_client, ns, name) if isinstance(tokens, SecretToken) else None
        tokens.observer = TokenAlarm(metrics, notifier.send, tokens.describe(), time.time,
                                     token_ref=(ns, name), nudge=nudge).observe


def build(spec: FleetSpec, api: client.ApiClient, *, slurm: SlurmClient | None, namespace: str | None = None,
          leader_elect: bool = False, dry_run: bool = False, aws_session=None) -> Manager:
    """The reconciler process. A dry run takes no Lease: it must never keep the real reconciler from leading."""
    kube = Kube(api, background_events=True, manager=labels.MANAGER_RECONCILER)  # a worker does not wait for an Event
    metrics = Metrics()
    namespace = namespace or spec.healing.reconciler.namespace
    notifier = Notifier(channels_from_spec(spec), kube, namespace,
                        on_failure=lambda ch: metrics.notify_failures.labels(ch).inc(), routes=owner_routes_from_spec(spec))
    watch_slurm_token(slurm, metrics, notifier)
    kw = {"session": aws_session} if aws_session is not None else {}
    providers = {p.name: provider_for(p, kube, spec, slurm, **(kw if p.provider == "aws-asg" else {})) for p in spec.pools}
    elector = None
    if leader_elect and (dry_run or spec.healing.dry_run):
        log.warning("dry run: the Lease is not taken (the reconciler that acts keeps it)")
    elif leader_elect:
        # A replica is its pod (POD_NAME, from the Deployment): pods on the host's network share the node's
        # hostname, and each container's process is pid 1, so hostname-pid would name two replicas alike.
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaseElector(api, namespace, LEASE, identity)
    fence = elector.holds if elector else (lambda: True)
    return Manager(spec, kube, KubeRemediationStore(api), slurm, providers, notifier, metrics, dry_run=dry_run,
                   fence=fence, elector=elector, checks=HealthChecks(api, spec))
