"""Remediation records as `remediations.gpufleet.io` objects: the reconciler's memory.

Everything a restart needs is here (phase, chosen spare, jobs, deadlines, what was
notified), so the reconciler keeps no state of its own that matters.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client

from fleetspec import labels, remediation_crd

from reconciler.errors import NotFound, PermanentError, TemporaryError
from reconciler.adapters.kube import _call, _json
from reconciler.core.model import Record
from reconciler.core.observe import parse_time
from reconciler.core.phases import Phase
from reconciler.redact import redact  # no URL or token in a record


def _ts(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def to_object(r: Record, resource_version: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": r.name, "labels": {labels.POOL: r.pool, "gpufleet.io/node": r.node,
                                                       "app.kubernetes.io/part-of": labels.PART_OF}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": labels.API_VERSION,
        "kind": remediation_crd.KIND,
        "metadata": meta,
        "spec": {"node": r.node, "pool": r.pool, "xid": r.xid, "message": redact(r.message), "wasSpare": r.was_spare},
        "status": {
            "phase": r.phase.value,
            "created": _ts(r.created),
            "phases": [{"phase": p, "at": _ts(t)} for p, t in r.phase_times],
            "reason": redact(r.reason),
            "replacement": r.replacement,
            "jobs": list(r.jobs),
            "graceDeadline": _ts(r.grace_deadline),
            "drainDeadline": _ts(r.drain_deadline),
            "intents": list(r.intents),
            "retries": r.retries,
            "slurmNodes": list(r.slurm_nodes),
            "keptDrains": list(r.kept_drains),
            "held": r.held,
            "heldReason": redact(r.held_reason),
            "reclaimStarted": _ts(r.reclaim_started),
            "failingSince": _ts(r.failing_since),
            "nextAttempt": _ts(r.next_attempt),
            "lastError": r.last_error,
            "revision": r.revision,
        },
    }


class CorruptRecord(PermanentError):
    """A record the reconciler cannot read. It halts on its node and reports, never guesses."""


@dataclass(frozen=True)
class Unreadable:
    """What the record cache holds for a corrupt object: its node (from the label) and why."""

    name: str
    node: str | None
    error: str


def from_object(obj: dict[str, Any]) -> Record:
    name = obj.get("metadata", {}).get("name", "?")
    try:
        spec, st = obj["spec"], obj.get("status") or {}
        opt = lambda k: parse_time(st[k]) if st.get(k) else None  # noqa: E731
        return Record(
            name=name, node=spec["node"], pool=spec["pool"], xid=int(spec["xid"]), message=spec.get("message", ""),
            phase=Phase(st.get("phase", Phase.DETECTED.value)),
            created=parse_time(st.get("created") or obj["metadata"].get("creationTimestamp")),
            phase_times=tuple((p["phase"], parse_time(p["at"])) for p in st.get("phases") or []),
            reason=st.get("reason", ""), replacement=st.get("replacement"), jobs=tuple(st.get("jobs") or ()),
            grace_deadline=opt("graceDeadline"), drain_deadline=opt("drainDeadline"),
            intents=tuple(st.get("intents") or ()) + tuple(f"notify:{e}" for e in st.get("notified") or ()),
            was_spare=bool(spec.get("wasSpare")), retries=int(st.get("retries") or 0),
            slurm_nodes=tuple(st.get("slurmNodes") or ()), kept_drains=tuple(st.get("keptDrains") or ()),
            held=st.get("held") or "", held_reason=st.get("heldReason") or "",
            reclaim_started=opt("reclaimStarted"), failing_since=opt("failingSince"), next_attempt=opt("nextAttempt"),
            last_error=st.get("lastError") or "", revision=int(st.get("revision") or 0),
        )
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptRecord(f"remediation {name} is unreadable ({e!r}): fix or delete it; the reconciler will not guess") from None


def read(obj: dict[str, Any]) -> Record | Unreadable:
    """A record, or what is known of an unreadable one (so only its own node halts)."""
    try:
        return from_object(obj)
    except CorruptRecord as e:
        meta = obj.get("metadata") or {}
        return Unreadable(meta.get("name", "?"), (meta.get("labels") or {}).get("gpufleet.io/node"), str(e))


class RecordStore(Protocol):
    def create(self, record: Record) -> bool: ...
    def update(self, record: Record) -> None: ...
    def delete(self, record: Record) -> bool: ...
    def observe(self, obj: dict[str, Any]) -> Record | Unreadable: ...


class KubeRecordStore:
    """Records in the API server. Writes carry the last seen resourceVersion, so two writers
    (say, an old leader that has not noticed yet) cannot both win: the loser gets a conflict."""

    def __init__(self, api: client.ApiClient):
        self.custom = client.CustomObjectsApi(api)
        self._versions: dict[str, str] = {}
        self._args = (labels.GROUP, remediation_crd.VERSION, remediation_crd.PLURAL)

    def observe(self, obj: dict[str, Any]) -> Record | Unreadable:
        """The records informer's transform: remember the version, read the record."""
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._versions[meta.get("name", "?")] = meta["resourceVersion"]
        return read(obj)

    def list(self) -> list[Record]:
        data = _json(_call("list remediations", self.custom.list_cluster_custom_object, *self._args,
                           _preload_content=False))
        return [r for r in (self.observe(o) for o in data["items"]) if isinstance(r, Record)]

    def create(self, record: Record) -> bool:
        """True when created; False when it already exists (the same signal, seen again)."""
        try:
            obj = _json(_call(f"create remediation {record.name}", self.custom.create_cluster_custom_object,
                              *self._args, to_object(record), _preload_content=False))
        except TemporaryError as e:
            if " 409 " in f" {e} ":
                return False
            raise
        self._versions[record.name] = obj["metadata"]["resourceVersion"]
        return True

    def update(self, record: Record) -> None:
        obj = _json(_call(f"update remediation {record.name}", self.custom.replace_cluster_custom_object,
                          *self._args, record.name, to_object(record, self._versions.get(record.name)),
                          _preload_content=False))
        self._versions[record.name] = obj["metadata"]["resourceVersion"]

    def delete(self, record: Record) -> bool:
        """Delete a finished record (retention). Preconditioned on the last seen resourceVersion, so a
        record changed since it was judged is not deleted (409). False when it was gone already."""
        version = self._versions.get(record.name)
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=version) if version else None)
        try:
            _call(f"delete remediation {record.name}", self.custom.delete_cluster_custom_object,
                  *self._args, record.name, body=body)
        except NotFound:
            self._versions.pop(record.name, None)
            return False
        self._versions.pop(record.name, None)
        return True

    def raw(self) -> list[dict[str, Any]]:
        return _json(_call("list remediations", self.custom.list_cluster_custom_object, *self._args,
                           _preload_content=False))["items"]


class MemoryRecordStore:
    """Records in memory, for dry runs and tests of the runtime without an API server."""

    def __init__(self):
        self.objects: dict[str, str] = {}

    def observe(self, obj: dict[str, Any]) -> Record | Unreadable:
        return read(obj)

    def list(self) -> list[Record]:
        return [r for r in (read(json.loads(v)) for v in self.objects.values()) if isinstance(r, Record)]

    def create(self, record: Record) -> bool:
        if record.name in self.objects:
            return False
        self.objects[record.name] = json.dumps(to_object(record))
        return True

    def update(self, record: Record) -> None:
        self.objects[record.name] = json.dumps(to_object(record))

    def delete(self, record: Record) -> bool:
        return self.objects.pop(record.name, None) is not None
