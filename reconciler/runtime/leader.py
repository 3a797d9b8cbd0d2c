"""Leader election on a coordination.k8s.io Lease, with fencing, so two replicas never both act.

As client-go does it: another replica's Lease counts as expired only when this replica has seen it
unchanged for the Lease's own duration on its own monotonic clock (never by comparing the holder's
`renewTime` with the local wall clock: clocks of two machines disagree). A holder trusts its
leadership until `lease_seconds` after the start of its last successful renewal (`holds()`); workers
check it before every action, so a replica cut off from the API server stops acting before another
can take over. On a clean exit the Lease is released, so the next leader starts at once.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class LeaseElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str,
                 lease_seconds: int = 15, renew_every: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[], None] | None = None):
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_every, self.clock = lease_seconds, renew_every, clock
        self.on_lost = on_lost
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._valid_until = 0.0
        self._observed: tuple | None = None  # (holder, renewTime, resourceVersion) last seen
        self._observed_at = 0.0

    def holds(self) -> bool:
        """Whether this replica may act now (fencing)."""
        return self.leading.is_set() and self.clock() < self._valid_until

    def try_acquire(self) -> bool:
        """One attempt to take or renew the lease. True when we hold it afterwards."""
        started = self.clock()
        stamp = _now()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
        except ApiException as e:
            if e.status != 404:
                return self._failed(f"read lease: {e.status}")
            try:
                self.coord.create_namespaced_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                             "acquireTime": stamp.isoformat().replace("+00:00", "Z"),
                             "renewTime": stamp.isoformat().replace("+00:00", "Z"), "leaseTransitions": 0}},
                    _request_timeout=5)
                return self._won(started)
            except Exception:  # noqa: BLE001 - someone else created it first, or the API is gone
                return self._drop("lease taken by another replica")
        except Exception as e:  # noqa: BLE001 - API server unreachable: lead on only while the lease is valid
            return self._failed(f"read lease: {e}")
        spec = lease.spec
        holder = spec.holder_identity
        observed = (holder, spec.renew_time, lease.metadata.resource_version)
        if observed != self._observed:
            self._observed, self._observed_at = observed, started
        duration = spec.lease_duration_seconds or self.lease_seconds
        if holder not in (None, "", self.identity) and started - self._observed_at < duration:
            return self._drop(f"held by {holder}")
        if holder != self.identity:
            spec.acquire_time = stamp
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = self.lease_seconds
        spec.renew_time = stamp
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)
        except Exception as e:  # noqa: BLE001 - a conflict means someone else renewed first
            return self._drop(f"renew lease: {e}")
        return self._won(started)

    def release(self) -> None:
        """Give the Lease up (clean exit): the next replica need not wait for it to expire."""
        was = self.holds()
        self.leading.clear()
        self._valid_until = 0.0
        if not was:
            return
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = _now()
                self.coord.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)
                log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as e:  # noqa: BLE001 - best effort: it expires on its own
            log.warning("lease not released: %s", e)

    def _won(self, started: float) -> bool:
        self._valid_until = started + self.lease_seconds
        if not self.leading.is_set():
            log.info("leading (lease %s/%s)", self.namespace, self.name)
        self.leading.set()
        return True

    def _drop(self, why: str) -> bool:
        """Another replica holds the Lease (or won the race): stop acting at once."""
        self._valid_until = 0.0
        if self.leading.is_set():
            self.leading.clear()
            log.warning("lost leadership: %s", why)
            if self.on_lost:
                self.on_lost()
        return False

    def _failed(self, why: str) -> bool:
        """The API server did not answer: lead on only until the lease we hold runs out."""
        if self.leading.is_set():
            log.warning("lease not renewed (%s); valid for %.1fs more", why, self._valid_until - self.clock())
        return self.holds()

    def run(self) -> None:
        while not self._stop.is_set():
            self.try_acquire()
            # Renew well before expiry; while not leading, try again at the same pace.
            self._stop.wait(self.renew_every if self.leading.is_set() else min(self.renew_every, 2.0))
            if self.leading.is_set() and not self.holds():
                self._drop("lease expired before it could be renewed")

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="leader-election", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self.release()
