"""A node's repair as the Remediation object keeps it (`status.repair`, issue 25), and a person's
request (`metadata.annotations[gpufleet.io/request]`, issue 23), read and written for records.py."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.oncall import PersonRequest, parse

from gpufleet.reconciler.core.observe import parse_time
from gpufleet.reconciler.core.diagnosis_stages import Diagnosis, Stage
from gpufleet.reconciler.core.repair_phases import Repair, RepairEvent, RepairPhase
from gpufleet.reconciler.redact import redact  # no URL or token in a record (records.py)

KEEP_HISTORY = 40  # lines of a repair's history kept on the object


def _ts(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def repair_status(rep: Repair | None) -> dict[str, Any] | None:
    if rep is None:
        return None
    out = {
        "phase": rep.phase.value,
        "started": _ts(rep.started),
        "step": rep.step,
        "phases": [{"phase": p, "at": _ts(t)} for p, t in rep.phase_times],
        "attempt": rep.attempt,
        "request": rep.request,
        "requestedAt": _ts(rep.requested_at),
        "bootID": rep.boot,
        "deadline": _ts(rep.deadline),
        "job": rep.job,
        "reason": redact(rep.reason),
        "history": [{"step": e.step, "outcome": e.outcome, "at": _ts(e.at), "message": redact(e.message)[:500]}
                    for e in rep.history[-KEEP_HISTORY:]],
        "stoppedFrom": rep.stopped_from,
        "gpus": list(rep.gpus),
        "rungs": list(rep.rungs),
        "resent": rep.resent,
        "inPlace": rep.in_place,
        "error": redact(rep.error),
    }
    return {k: v for k, v in out.items() if v not in (None, "", [])}


def read_repair(st: dict[str, Any] | None) -> Repair | None:
    """The repair in a status (raises KeyError/ValueError/TypeError on a malformed one: records.py reports)."""
    if not st:
        return None
    opt = lambda k: parse_time(st[k]) if st.get(k) else None  # noqa: E731
    return Repair(
        phase=RepairPhase(st["phase"]), started=parse_time(st["started"]), step=st.get("step") or "",
        phase_times=tuple((p["phase"], parse_time(p["at"])) for p in st.get("phases") or []),
        attempt=int(st.get("attempt") or 0), request=st.get("request") or "", requested_at=opt("requestedAt"),
        boot=st.get("bootID") or "", deadline=opt("deadline"), job=st.get("job") or "", reason=st.get("reason") or "",
        history=tuple(RepairEvent(e["step"], e["outcome"], parse_time(e["at"]), e.get("message") or "")
                      for e in st.get("history") or []),
        stopped_from=st.get("stoppedFrom") or "", gpus=tuple(st.get("gpus") or ()), rungs=tuple(st.get("rungs") or ()),
        resent=bool(st.get("resent")), in_place=bool(st.get("inPlace")), error=st.get("error") or "",
    )


def diagnosis_status(d: Diagnosis | None) -> dict[str, Any] | None:
    if d is None:
        return None
    out = {
        "stage": d.stage.value, "started": _ts(d.started),
        "stages": [{"stage": s, "at": _ts(t)} for s, t in d.stage_times],
        "drained": list(d.drained), "job": d.job, "deadline": _ts(d.deadline), "held": redact(d.held),
        "needs": d.needs, "message": redact(d.message)[:2000],
    }
    return {k: v for k, v in out.items() if v not in (None, "", [])}


def read_diagnosis(st: dict[str, Any] | None) -> Diagnosis | None:
    """The diagnosis in a status (raises KeyError/ValueError/TypeError on a malformed one: records.py reports)."""
    if not st:
        return None
    return Diagnosis(
        stage=Stage(st["stage"]), started=parse_time(st["started"]),
        stage_times=tuple((s["stage"], parse_time(s["at"])) for s in st.get("stages") or []),
        drained=tuple(st.get("drained") or ()), job=st.get("job") or "",
        deadline=parse_time(st["deadline"]) if st.get("deadline") else None, held=st.get("held") or "",
        needs=st.get("needs") or "", message=st.get("message") or "",
    )


def read_request(meta: dict[str, Any]) -> PersonRequest | None:
    return parse((meta.get("annotations") or {}).get(labels.ONCALL_REQUEST))
