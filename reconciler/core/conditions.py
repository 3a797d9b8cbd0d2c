"""A remediation's conditions (metav1.Condition, as Cluster API's health checks have them), derived
from its phase and phase times. Pure; written with every status, never read back.

Each condition's lastTransitionTime is when the remediation entered the phase that set it, so the
same remediation always gives the same conditions (status writes do not churn).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpufleet.fleetspec.remediation_crd import ConditionType as Type
from gpufleet.fleetspec.remediation_crd import Reason

from gpufleet.reconciler.core.model import RefillState, Remediation
from gpufleet.reconciler.core.phases import Phase

CONTAINING = frozenset({Phase.DETECTED, Phase.SLURM_DRAINING, Phase.CHECKPOINTING})
REPLACING = {Phase.EVICTING: Reason.REPLACING, Phase.REPLACING: Reason.REPLACING,
             Phase.WAITING_FOR_SPARE: Reason.WAITING_FOR_SPARE, Phase.RESUMING: Reason.RESUMING}


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # True | False | Unknown
    reason: str
    message: str
    at: datetime


def conditions(r: Remediation) -> tuple[Condition, ...]:
    seen = [Phase(p) for p, _ in r.phase_times] or [r.phase]
    at = r.entered(r.phase) or r.created
    failed = r.phase is Phase.FAILED
    out: list[Condition] = []

    contained = next((p for p in seen if p not in CONTAINING and p is not Phase.FAILED), None)
    if contained is not None:
        out.append(Condition(Type.CONTAINED, "True", Reason.CONTAINED, "cordoned, drained in Slurm, jobs requeued",
                             r.entered(contained) or r.created))
    elif failed:
        out.append(Condition(Type.CONTAINED, "False", Reason.FAILED, r.reason, at))
    else:
        out.append(Condition(Type.CONTAINED, "False", Reason.CONTAINING, r.phase.value, at))
    if r.was_spare:
        if r.phase is Phase.SUCCEEDED:
            out.append(Condition(Type.REPLACED, "True", Reason.SUCCEEDED, "the spare was quarantined", at))
        return tuple(out + _refilled(r))

    if r.phase is Phase.REQUEUED:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "Unknown", Reason.ADMISSION_PENDING,
                             "contained; admission weighs it", at))
    elif r.phase is Phase.HELD:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "False", r.held_reason or Reason.MAX_CONCURRENT,
                             r.held_message, at))
    elif r.phase is Phase.OPTED_OUT:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "False", Reason.OPTED_OUT, r.reason, at))
    elif r.phase is Phase.ESCALATED:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "False", Reason.ATTEMPTS_EXHAUSTED, r.reason, at))
    elif r.stands_in_for and Phase.EVICTING in seen:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "True", Reason.STOOD_IN,
                             f"stood in for {r.stands_in_for}, which takes another spare: quarantined, not replaced",
                             r.entered(Phase.EVICTING) or at))
    elif Phase.EVICTING in seen:
        out.append(Condition(Type.REMEDIATION_ALLOWED, "True", Reason.ADMITTED, "admitted for replacement",
                             r.entered(Phase.EVICTING) or at))
    if Phase.EVICTING in seen:
        broke = r.failed_replacements[-1] if r.failed_replacements else None
        if r.phase is Phase.SUCCEEDED:
            what = (f"quarantined: it stood in for {r.stands_in_for}, which takes another spare" if r.stands_in_for
                    else f"replaced by {r.replacement}")
            if broke is not None:
                what += f" (after {', '.join(f.node for f in r.failed_replacements)} broke)"
            out.append(Condition(Type.REPLACED, "True", Reason.SUCCEEDED, what, at))
        elif failed:
            out.append(Condition(Type.REPLACED, "False", Reason.FAILED, r.reason, at))
        elif r.phase in REPLACING and broke is not None:
            out.append(Condition(Type.REPLACED, "False", Reason.REPLACEMENT_FAILED,
                                 f"{broke.why}: taking another spare" + (f"; {r.waiting}" if r.waiting else ""),
                                 broke.at))
        elif r.phase in REPLACING:
            out.append(Condition(Type.REPLACED, "False", REPLACING[r.phase], r.waiting or r.phase.value, at))
    return tuple(out + _refilled(r))


def _refilled(r: Remediation) -> list[Condition]:
    f = r.refill
    if f is None:
        return []
    status, reason = {RefillState.REQUESTED: ("Unknown", Reason.REFILL_REQUESTED),
                      RefillState.ANSWERED: ("True", Reason.REFILL_ANSWERED),
                      RefillState.FAILED: ("False", Reason.REFILL_FAILED)}[f.state]
    return [Condition(Type.REFILLED, status, reason, f.message, f.at)]
