"""Remediation records as `remediations.gpufleet.io` objects: the reconciler's memory.

Everything a restart needs is here (phase, chosen spare, jobs, deadlines, what was
notified), so the reconciler keeps no state of its own that matters.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client

from fleetspec import labels, remediation_crd

from .errors import PermanentError, TemporaryError
from .kube import _call, _json
from .model import Record
from .observe import parse_time
from .phases import Phase


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
        "spec": {"node": r.node, "pool": r.pool, "xid": r.xid, "message": r.message, "wasSpare": r.was_spare},
        "status": {
            "phase": r.phase.value,
            "created": _ts(r.created),
            "phases": [{"phase": p, "at": _ts(t)} for p, t in r.phase_times],
            "reason": r.reason,
            "replacement": r.replacement,
            "jobs": list(r.jobs),
            "graceDeadline": _ts(r.grace_deadline),
            "drainDeadline": _ts(r.drain_deadline),
            "notified": list(r.notified),
            "retries": r.retries,
        },
    }


class CorruptRecord(PermanentError):
    """A record the reconciler cannot read. It halts on it and reports, never guesses."""


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
            notified=tuple(st.get("notified") or ()), was_spare=bool(spec.get("wasSpare")),
            retries=int(st.get("retries") or 0),
        )
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptRecord(f"remediation {name} is unreadable ({e!r}): fix or delete it; the reconciler will not guess") from None


class RecordStore(Protocol):
    def list(self) -> list[Record]: ...
    def create(self, record: Record) -> bool: ...
    def update(self, record: Record) -> None: ...


class KubeRecordStore:
    """Records in the API server. Writes carry the last seen resourceVersion, so two writers
    (say, an old leader that has not noticed yet) cannot both win."""

    def __init__(self, api: client.ApiClient):
        self.custom = client.CustomObjectsApi(api)
        self._versions: dict[str, str] = {}
        self._args = (labels.GROUP, remediation_crd.VERSION, remediation_crd.PLURAL)

    def list(self) -> list[Record]:
        data = _json(_call("list remediations", self.custom.list_cluster_custom_object, *self._args,
                           _preload_content=False))
        out = []
        for obj in data["items"]:
            self._versions[obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]
            out.append(from_object(obj))
        return out

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

    def raw(self) -> list[dict[str, Any]]:
        return _json(_call("list remediations", self.custom.list_cluster_custom_object, *self._args,
                           _preload_content=False))["items"]


class MemoryRecordStore:
    """Records in memory, for dry runs and tests of the runtime without an API server."""

    def __init__(self):
        self.objects: dict[str, str] = {}

    def list(self) -> list[Record]:
        return [from_object(json.loads(v)) for v in self.objects.values()]

    def create(self, record: Record) -> bool:
        if record.name in self.objects:
            return False
        self.objects[record.name] = json.dumps(to_object(record))
        return True

    def update(self, record: Record) -> None:
        self.objects[record.name] = json.dumps(to_object(record))
