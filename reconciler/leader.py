"""Leader election on a coordination.k8s.io Lease, so two replicas never both act."""
from __future__ import annotations

import logging
import threading

from datetime import datetime, timedelta, timezone

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class LeaseElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str,
                 lease_seconds: int = 15, renew_every: float = 5.0):
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_every = lease_seconds, renew_every
        self.leading = threading.Event()
        self._stop = threading.Event()

    def try_acquire(self) -> bool:
        """One attempt to take or renew the lease. True when we hold it afterwards."""
        now = _now()
        body = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": now.isoformat().replace("+00:00", "Z")}
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=10)
        except ApiException as e:
            if e.status != 404:
                return self._lost(f"read lease: {e.status}")
            try:
                self.coord.create_namespaced_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**body, "acquireTime": body["renewTime"], "leaseTransitions": 0}}, _request_timeout=10)
                return self._won()
            except ApiException:
                return self._lost("lease taken by another replica")
        except Exception as e:  # noqa: BLE001 - API server down: we no longer know, so we do not lead
            return self._lost(f"read lease: {e}")
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or now > renewed + timedelta(seconds=spec.lease_duration_seconds or self.lease_seconds)
        if holder not in (None, "", self.identity) and not expired:
            return self._lost(f"held by {holder}")
        lease.spec.holder_identity = self.identity
        lease.spec.lease_duration_seconds = self.lease_seconds
        lease.spec.renew_time = now
        if holder != self.identity:
            lease.spec.acquire_time = now
            lease.spec.lease_transitions = (spec.lease_transitions or 0) + 1
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=10)
        except Exception as e:  # noqa: BLE001 - a conflict means someone else renewed first
            return self._lost(f"renew lease: {e}")
        return self._won()

    def _won(self) -> bool:
        if not self.leading.is_set():
            log.info("leading (lease %s/%s)", self.namespace, self.name)
        self.leading.set()
        return True

    def _lost(self, why: str) -> bool:
        if self.leading.is_set():
            log.warning("lost leadership: %s", why)
        self.leading.clear()
        return False

    def run(self) -> None:
        while not self._stop.is_set():
            self.try_acquire()
            self._stop.wait(self.renew_every)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="leader-election", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self.leading.clear()


def wait_until_leading(elector: LeaseElector, stop: threading.Event) -> bool:
    while not stop.is_set():
        if elector.leading.wait(1.0):
            return True
    return False



