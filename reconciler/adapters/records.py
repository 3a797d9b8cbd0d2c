"""Remediations as `remediations.gpufleet.io` objects: the reconciler's memory.

Everything a restart needs is in the status (phase, chosen spare, jobs, deadlines, the once-only
actions begun), so the reconciler keeps no state of its own that matters. The spec is written once,
by the create; the status only through the status subresource (fleetspec/remediation_crd.py), which the
API server keeps apart: a create drops the status (apiextensions-apiserver v0.34
pkg/registry/customresource/strategy.go, PrepareForCreate), so a new remediation is created, then its
status written.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.fleetspec.faults import FaultAction, Kind

from gpufleet.reconciler.adapters.kube import _call, _json
from gpufleet.reconciler.adapters.repair_records import (
    diagnosis_status, read_diagnosis, read_repair, read_request, repair_status,
)
from gpufleet.reconciler.core.conditions import conditions
from gpufleet.reconciler.core.model import Refill, RefillState, Remediation, ReplacementFailure
from gpufleet.reconciler.core.observe import parse_time
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.errors import AlreadyExists, NotFound, PermanentError
from gpufleet.reconciler.redact import redact  # no URL or token in a record: its free texts leave through here


def _ts(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _status(r: Remediation) -> dict[str, Any]:
    st = {
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
        "jobNodes": list(r.job_nodes) or None,
        "keptDrains": list(r.kept_drains),
        "heldMessage": redact(r.held_message),
        "heldReason": r.held_reason,
        "reclaimStarted": _ts(r.reclaim_started),
        "delivered": list(r.delivered),
        "signalledJobs": list(r.signalled),
        "failedReplacements": [{"node": f.node, "at": _ts(f.at), "why": redact(f.why)} for f in r.failed_replacements],
        "standsInFor": r.stands_in_for or None,
        "refill": {"key": r.refill.key, "state": r.refill.state, "at": _ts(r.refill.at), "message": redact(r.refill.message),
                   "attempt": r.refill.attempt, **({"retryAt": _ts(r.refill.retry_at)} if r.refill.retry_at else {})}
        if r.refill else None,
        "waiting": r.waiting or None,
        "failingSince": _ts(r.failing_since),
        "nextAttempt": _ts(r.next_attempt),
        "lastError": redact(r.last_error),
        "revision": r.revision,
        "repair": repair_status(r.repair),
        "diagnosis": diagnosis_status(r.diagnosis),
        "requestsDone": list(r.requests_done) or None,
        "conditions": [{"type": c.type, "status": c.status, "reason": c.reason, "message": redact(c.message)[:32768],
                        "lastTransitionTime": _ts(c.at)} for c in conditions(r)],
    }
    return {k: v for k, v in st.items() if v is not None}


def to_object(r: Remediation, resource_version: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": r.name, "labels": {labels.POOL: r.pool, labels.REMEDIATION_NODE: r.node,
                                                       labels.APP_PART_OF: labels.PART_OF}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": labels.API_VERSION,
        "kind": remediation_crd.KIND,
        "metadata": meta,
        "spec": {"node": r.node, "pool": r.pool, "xid": r.xid, "message": redact(r.message), "wasSpare": r.was_spare,
                 "fault": _fault(r)},
        "status": _status(r),
    }


def _refill(f: dict[str, Any] | None) -> Refill | None:
    if not f:
        return None
    if f["state"] not in (RefillState.REQUESTED, RefillState.ANSWERED, RefillState.FAILED):
        raise ValueError(f"refill state {f['state']!r}")
    retry = f.get("retryAt")
    return Refill(f["key"], f["state"], parse_time(f["at"]), f.get("message", ""), int(f.get("attempt") or 1),
                  parse_time(retry) if retry else None)


def _fault(r: Remediation) -> dict[str, Any]:
    """What the fault needs and where, as the node said it (issue 21). In the spec: set once, by the create."""
    out: dict[str, Any] = {"kind": r.kind.value, "code": r.xid}
    if r.action is not None:
        out["action"] = r.action.value
    for key, value in (("pci", r.pci), ("source", r.source), ("reportedBy", r.reporter)):
        if value:
            out[key] = value
    for key, value in (("gpuInstance", r.gpu_instance), ("computeInstance", r.compute_instance)):
        if value is not None:
            out[key] = value
    return out


def _fault_fields(f: dict[str, Any]) -> dict[str, Any]:
    """The remediation's fault fields from spec.fault; absent in remediations made before it existed."""
    opt_int = lambda k: int(f[k]) if f.get(k) is not None else None  # noqa: E731
    return {"kind": Kind(f.get("kind", Kind.XID.value)),
            "action": FaultAction(f["action"]) if f.get("action") else None,
            "pci": str(f.get("pci") or ""), "gpu_instance": opt_int("gpuInstance"),
            "compute_instance": opt_int("computeInstance"), "source": str(f.get("source") or ""),
            "reporter": str(f.get("reportedBy") or "")}


class CorruptRemediation(PermanentError):
    """A remediation the reconciler cannot read. It halts on its node and reports, never guesses."""


@dataclass(frozen=True)
class Unreadable:
    """What the remediation cache holds for a corrupt object: its node (from the label) and why."""

    name: str
    node: str | None
    error: str


def _first_phase(spec: dict[str, Any]) -> str:
    """The phase a record starts in (decide.detect): Diagnosing for a fault that asks for diagnostics, else Detected."""
    return Phase.DIAGNOSING.value if (spec.get("fault") or {}).get("action") == FaultAction.DIAGNOSE.value \
        else Phase.DETECTED.value


def from_object(obj: dict[str, Any]) -> Remediation:
    """The remediation in an object. A status the reconciler has not written yet (a crash between the
    create and the first status write) reads as the phase it was made in (Detected, or Diagnosing)."""
    name = obj.get("metadata", {}).get("name", "?")
    try:
        spec, st = obj["spec"], obj.get("status") or {}
        opt = lambda k: parse_time(st[k]) if st.get(k) else None  # noqa: E731
        return Remediation(
            name=name, node=spec["node"], pool=spec["pool"], xid=int(spec["xid"]), message=spec.get("message", ""),
            phase=Phase(st.get("phase", _first_phase(spec))),
            created=parse_time(st.get("created") or obj["metadata"].get("creationTimestamp")),
            phase_times=tuple((p["phase"], parse_time(p["at"])) for p in st.get("phases") or []),
            reason=st.get("reason", ""), replacement=st.get("replacement"), jobs=tuple(st.get("jobs") or ()),
            grace_deadline=opt("graceDeadline"), drain_deadline=opt("drainDeadline"),
            intents=tuple(st.get("intents") or ()) + tuple(f"notify:{e}" for e in st.get("notified") or ()),
            was_spare=bool(spec.get("wasSpare")), retries=int(st.get("retries") or 0),
            slurm_nodes=tuple(st.get("slurmNodes") or ()), job_nodes=tuple(st.get("jobNodes") or ()), kept_drains=tuple(st.get("keptDrains") or ()),
            held_message=st.get("heldMessage") or st.get("held") or "", held_reason=st.get("heldReason") or "",
            reclaim_started=opt("reclaimStarted"), failing_since=opt("failingSince"), next_attempt=opt("nextAttempt"),
            last_error=st.get("lastError") or "", revision=int(st.get("revision") or 0),
            delivered=tuple(st.get("delivered") or ()), signalled=tuple(int(j) for j in st.get("signalledJobs") or ()),
            failed_replacements=tuple(ReplacementFailure(f["node"], parse_time(f["at"]), f.get("why", ""))
                                      for f in st.get("failedReplacements") or ()),
            stands_in_for=st.get("standsInFor") or "", refill=_refill(st.get("refill")), waiting=st.get("waiting") or "",
            **_fault_fields(spec.get("fault") or {}),
            repair=read_repair(st.get("repair")), diagnosis=read_diagnosis(st.get("diagnosis")), request=read_request(obj.get("metadata") or {}),
            requests_done=tuple(st.get("requestsDone") or ()),
        )
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptRemediation(f"remediation {name} is unreadable ({e!r}): fix or delete it; the reconciler will "
                                 "not guess") from None


def read(obj: dict[str, Any]) -> Remediation | Unreadable:
    """A remediation, or what is known of an unreadable one (so only its own node halts)."""
    try:
        return from_object(obj)
    except CorruptRemediation as e:
        meta = obj.get("metadata") or {}
        return Unreadable(meta.get("name", "?"), (meta.get("labels") or {}).get(labels.REMEDIATION_NODE), str(e))


class RemediationStore(Protocol):
    def create(self, remediation: Remediation) -> bool: ...
    def write_status(self, remediation: Remediation) -> None: ...
    def delete(self, remediation: Remediation) -> bool: ...
    def observe(self, obj: dict[str, Any]) -> Remediation | Unreadable: ...


class KubeRemediationStore:
    """Remediations in the API server. Status writes carry the last seen resourceVersion, so two writers
    (say, an old leader that has not noticed yet) cannot both win: the loser gets a Conflict."""

    def __init__(self, api: client.ApiClient):
        self.custom = client.CustomObjectsApi(api)
        self._versions: dict[str, str] = {}
        self._args = (labels.GROUP, remediation_crd.VERSION, remediation_crd.PLURAL)

    def _seen(self, obj: dict[str, Any]) -> None:
        self._versions[obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]

    def observe(self, obj: dict[str, Any]) -> Remediation | Unreadable:
        """The remediations informer's transform: remember the version, read the remediation."""
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._versions[meta.get("name", "?")] = meta["resourceVersion"]
        return read(obj)

    def list(self) -> list[Remediation]:
        data = _json(_call("list remediations", self.custom.list_cluster_custom_object, *self._args,
                           _preload_content=False))
        return [r for r in (self.observe(o) for o in data["items"]) if isinstance(r, Remediation)]

    def create(self, remediation: Remediation) -> bool:
        """Create the object (its spec; the API server drops the status). True when created; False when it
        exists already (the same signal, seen again)."""
        try:
            obj = _json(_call(f"create remediation {remediation.name}", self.custom.create_cluster_custom_object,
                              *self._args, to_object(remediation), _preload_content=False))
        except AlreadyExists:
            return False
        self._seen(obj)
        return True

    def write_status(self, remediation: Remediation) -> None:
        obj = _json(_call(f"write the status of remediation {remediation.name}",
                          self.custom.replace_cluster_custom_object_status, *self._args, remediation.name,
                          to_object(remediation, self._versions.get(remediation.name)), _preload_content=False))
        self._seen(obj)

    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        """A person's write (the on-call commands): annotations on the object, never its status."""
        _call(f"annotate remediation {name}", self.custom.patch_cluster_custom_object, *self._args, name,
              {"metadata": {"annotations": annotations}}, _preload_content=False)

    def delete(self, remediation: Remediation) -> bool:
        """Delete a finished remediation (retention). Preconditioned on the last seen resourceVersion, so one
        changed since it was judged is not deleted (Conflict). False when it was gone already."""
        version = self._versions.get(remediation.name)
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=version) if version else None)
        try:
            _call(f"delete remediation {remediation.name}", self.custom.delete_cluster_custom_object,
                  *self._args, remediation.name, body=body)
        except NotFound:
            self._versions.pop(remediation.name, None)
            return False
        self._versions.pop(remediation.name, None)
        return True


class MemoryRemediationStore:
    """Remediations in memory, kept as the API server keeps them (a create drops the status), for tests of
    the runtime without an API server."""

    def __init__(self):
        self.objects: dict[str, str] = {}

    def observe(self, obj: dict[str, Any]) -> Remediation | Unreadable:
        return read(obj)

    def list(self) -> list[Remediation]:
        return [r for r in (read(json.loads(v)) for v in self.objects.values()) if isinstance(r, Remediation)]

    def create(self, remediation: Remediation) -> bool:
        if remediation.name in self.objects:
            return False
        obj = to_object(remediation)
        del obj["status"]
        obj["metadata"]["creationTimestamp"] = remediation.created.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.objects[remediation.name] = json.dumps(obj)
        return True

    def write_status(self, remediation: Remediation) -> None:
        if remediation.name not in self.objects:
            raise NotFound(f"write the status of remediation {remediation.name}: 404 NotFound")
        obj = json.loads(self.objects[remediation.name])
        obj["status"] = to_object(remediation)["status"]
        self.objects[remediation.name] = json.dumps(obj)

    def delete(self, remediation: Remediation) -> bool:
        return self.objects.pop(remediation.name, None) is not None
