"""The phases of a node's repair (issue 25), and the only moves allowed between them.

A repair begins once its node's heal is over (the job runs on a spare; the node is quarantined) and
is kept on the same Remediation, in `status.repair`:

    (heal over) ──┬──► Repairing (reset-gpu) ──► Validating ──► Returned (back among the spares)
                  ├──► Repairing (reboot) ──────►     │
                  ├──► Validating (a person's return) │ failed, or a step timed out: the next rung
                  │        ▲                          ▼
                  │        └──── Repairing (reboot) ◄─┘ ... ──► Retired (the ladder topped, a lemon,
                  └──► Retired (a fault that needs the vendor; a lemon)      or a fault that needs the vendor)

    Any live phase ──► Stopped (a person's drain, or the opt-out label), and back when it is lifted;
    any live phase ──► Returned (a person's mark-healthy) or Retired (a person's retire);
    Retired ──► Validating (a person's return: the vendor sent it back), or Returned (a person's mark-healthy).
    (heal over) ──► Waiting (the pool's or the fleet's cap on concurrent repairs is reached) ──► its first rung.
    Any live phase ──► Gone (the node's Node object disappeared: deleted, or its instance terminated).

Each phase is persisted before the step that depends on it runs (the request id of a reset or a
reboot, the health-check Job's name), so a reconciler killed anywhere resumes without repeating one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from gpufleet.reconciler.core.phases import last_entered


class RepairPhase(str, Enum):
    REPAIRING = "Repairing"  # a reset or a reboot was asked for; its outcome is awaited (`step` says which)
    VALIDATING = "Validating"  # the health-check Job runs on the node; its verdict is awaited
    RETURNED = "Returned"  # proven healthy (or a person said so): back among the spares
    RETIRED = "Retired"  # out for good: quarantined for the vendor, paged; the provider replaces it
    STOPPED = "Stopped"  # a person's drain or the opt-out label holds it; a person's command goes on
    WAITING = "Waiting"  # over the cap on concurrent repairs (the pool's or the fleet's): it waits its turn
    GONE = "Gone"  # its Node object disappeared mid-repair: ended, the provider's bookkeeping settled, paged

    @property
    def terminal(self) -> bool:
        return self in (RepairPhase.RETURNED, RepairPhase.RETIRED, RepairPhase.GONE)


START = "Start"  # no repair yet
_LIVE = (RepairPhase.REPAIRING, RepairPhase.VALIDATING, RepairPhase.STOPPED, RepairPhase.WAITING)
UNDER_WAY = (RepairPhase.REPAIRING, RepairPhase.VALIDATING)  # what the caps on concurrent repairs count
_ENDS = frozenset({RepairPhase.RETURNED, RepairPhase.RETIRED, RepairPhase.STOPPED})
_GONE = frozenset({RepairPhase.GONE})
_ALLOWED: dict[str, frozenset[RepairPhase]] = {
    START: frozenset({RepairPhase.REPAIRING, RepairPhase.VALIDATING, RepairPhase.WAITING}) | _ENDS,
    RepairPhase.WAITING.value: frozenset({RepairPhase.REPAIRING, RepairPhase.VALIDATING}) | _ENDS | _GONE,
    RepairPhase.REPAIRING.value: frozenset({RepairPhase.REPAIRING, RepairPhase.VALIDATING}) | _ENDS | _GONE,
    RepairPhase.VALIDATING.value: frozenset({RepairPhase.REPAIRING}) | _ENDS | _GONE,
    RepairPhase.STOPPED.value: frozenset({RepairPhase.REPAIRING, RepairPhase.VALIDATING, RepairPhase.RETURNED,
                                          RepairPhase.RETIRED}) | _GONE,
    # A retired node a person repaired (the vendor sent it back): checked before it serves again, or a
    # person's mark-healthy.
    RepairPhase.RETIRED.value: frozenset({RepairPhase.VALIDATING, RepairPhase.RETURNED}),
    # A node that was gone and registered again under its name: a person's return, mark-healthy or retire.
    RepairPhase.GONE.value: frozenset({RepairPhase.VALIDATING, RepairPhase.RETURNED, RepairPhase.RETIRED}),
}


class InvalidRepairTransition(ValueError):
    pass


def check_repair_transition(src: RepairPhase | None, dst: RepairPhase) -> None:
    key = START if src is None else src.value
    if key not in _ALLOWED:
        raise InvalidRepairTransition(f"repair {key} is over; cannot move to {dst.value}")
    if dst not in _ALLOWED[key]:
        raise InvalidRepairTransition(f"repair {key} -> {dst.value} is not an allowed transition")


@dataclass(frozen=True)
class RepairEvent:
    """One line of a repair's history: what was tried, how it went."""

    step: str  # reset-gpu | reboot | validate | retire | return | stop | a person's command
    outcome: str  # asked | ok | failed | timed-out | passed | ...
    at: datetime
    message: str = ""


@dataclass(frozen=True)
class Repair:
    """A node's repair, as the Remediation keeps it (`status.repair`)."""

    phase: RepairPhase
    started: datetime
    step: str = ""  # the rung being climbed (reset-gpu | reboot), or `validate`
    phase_times: tuple[tuple[str, datetime], ...] = ()
    attempt: int = 0  # steps begun: names each request and each health-check Job, so none is made twice
    request: str = ""  # the id of the reset or reboot asked for
    requested_at: datetime | None = None
    boot: str = ""  # the node's boot id when the step began (a reboot is over once it changes)
    deadline: datetime | None = None  # the step's timeout, from the spec
    job: str = ""  # the health-check Job of this attempt
    reason: str = ""  # what happened, for a person
    history: tuple[RepairEvent, ...] = ()
    stopped_from: str = ""  # the phase it was in when a person's drain or the opt-out label stopped it
    gpus: tuple[str, ...] = ()  # the GPUs a reset names (PCI addresses; () = all of the node's)
    rungs: tuple[str, ...] = ()  # the rungs tried so far, in order (reset-gpu, reboot)
    resent: bool = False  # this rung's request was asked again once (no sign of it: the first may never have gone)
    in_place: bool = False  # repaired while its remediation waits for a spare: the node takes its job back
    error: str = ""  # Stopped by an error retrying cannot fix: only a person's command goes on from there

    def moved(self, phase: RepairPhase, now: datetime, **changes) -> "Repair":
        check_repair_transition(self.phase, phase)
        return replace(self, phase=phase, phase_times=self.phase_times + ((phase.value, now),), **changes)

    def noted(self, event: RepairEvent, **changes) -> "Repair":
        return replace(self, history=self.history + (event,), **changes)

    def entered(self, phase: RepairPhase) -> datetime | None:
        return last_entered(self.phase_times, phase.value)

    @property
    def active(self) -> bool:
        return not self.phase.terminal

    @property
    def ended(self) -> datetime | None:
        return self.phase_times[-1][1] if self.phase.terminal and self.phase_times else None


def begin(phase: RepairPhase, now: datetime, **fields) -> Repair:
    """A new repair, entering its first phase (checked like any other move)."""
    check_repair_transition(None, phase)
    return Repair(phase=phase, started=now, phase_times=((phase.value, now),), **fields)
