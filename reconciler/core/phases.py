"""The phases of one remediation, and the only moves allowed between them.

    containment (never gated)                          admission           replacement
    Detected ──► SlurmDraining ──► Checkpointing ──► Requeued ──┬──► Evicting ──► Replacing ──► Resuming ──► Succeeded
        │                                              ▲        ├──► Held ──┘          │  ▲
        │                                              │        │   (brake, max_concurrent)
        │                                              │        ├──► OptedOut (a person decides)
        │                                              │        └──► Escalated (attempt cap: quarantined, paged)
        │                                                            WaitingForSpare ◄─┘   └──── Resuming ──► Replacing
        │                                                   (the replacement broke, or the scheduler gave it to another
        │                                                    Slurm node: another spare; a waiting remediation whose Slurm
        │                                                    node landed on a healthy node takes that one: Replacing ──► Resuming)
        └──► (a fault on a spare) Replacing: quarantine it and refill
    Any non-terminal phase ──► Failed, with the reason.

    (a diagnose fault: a repeated application fault on one GPU, NVIDIA's RUN_DCGMEUD; the node stays in service)
    Diagnosing ──► Succeeded (drained in Slurm once its job ends, health-checked, passed: serving again)
        └──────► Detected (the check failed: the heal above, then the repair with what the check says)
    (its stages: diagnosis_stages.py)

A person's decision (fleetspec/oncall.py, reconciler/core/oncall.py) goes past a gate: `release` moves
Held, OptedOut or Escalated on to Evicting; `mark-healthy` ends Held, OptedOut or Escalated as Succeeded
(the node back in service where it is). Escalated is terminal for the reconciler, not for a person.

Containment (cordon, drain in Slurm, checkpoint, requeue) happens for every critical fault at once;
only what follows (evicting, promoting a spare) waits for admission.

Each phase is persisted on the Remediation record before a step that depends on it runs, so a
reconciler killed anywhere resumes from the phase it last wrote; phases whose loss replays the same
idempotent actions are written together with the next (`Step.carry`, reconciler/core/decide.py).
"""
from __future__ import annotations

from datetime import datetime

from enum import Enum


class Phase(str, Enum):
    DIAGNOSING = "Diagnosing"
    DETECTED = "Detected"
    SLURM_DRAINING = "SlurmDraining"
    CHECKPOINTING = "Checkpointing"
    REQUEUED = "Requeued"
    HELD = "Held"
    OPTED_OUT = "OptedOut"
    EVICTING = "Evicting"
    REPLACING = "Replacing"
    WAITING_FOR_SPARE = "WaitingForSpare"
    RESUMING = "Resuming"
    SUCCEEDED = "Succeeded"
    ESCALATED = "Escalated"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_capacity(self) -> bool:
        """Counts against max_concurrent: admitted and replacing (waiting for a spare holds no slot)."""
        return self in ADMITTED


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.ESCALATED, Phase.FAILED})
ADMITTED = frozenset({Phase.EVICTING, Phase.REPLACING, Phase.RESUMING})

_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.DIAGNOSING: frozenset({Phase.DETECTED, Phase.SUCCEEDED}),
    Phase.DETECTED: frozenset({Phase.SLURM_DRAINING, Phase.REPLACING}),
    Phase.SLURM_DRAINING: frozenset({Phase.CHECKPOINTING}),
    Phase.CHECKPOINTING: frozenset({Phase.REQUEUED}),
    Phase.REQUEUED: frozenset({Phase.OPTED_OUT, Phase.EVICTING, Phase.HELD, Phase.ESCALATED}),
    Phase.HELD: frozenset({Phase.OPTED_OUT, Phase.EVICTING, Phase.ESCALATED, Phase.SUCCEEDED}),
    Phase.OPTED_OUT: frozenset({Phase.EVICTING, Phase.SUCCEEDED}),  # a person's release or mark-healthy
    Phase.ESCALATED: frozenset({Phase.EVICTING, Phase.SUCCEEDED}),  # likewise (terminal for the reconciler)
    Phase.EVICTING: frozenset({Phase.REPLACING}),
    Phase.REPLACING: frozenset({Phase.RESUMING, Phase.WAITING_FOR_SPARE, Phase.SUCCEEDED}),
    Phase.WAITING_FOR_SPARE: frozenset({Phase.REPLACING}),
    Phase.RESUMING: frozenset({Phase.SUCCEEDED, Phase.REPLACING}),
}


class InvalidTransition(ValueError):
    pass


def check_transition(src: Phase, dst: Phase) -> None:
    """Raise unless src -> dst is drawn above. Failed is reachable from any live phase; a terminal phase
    is left only where the table says (a person's decision)."""
    if src.terminal and dst in _ALLOWED.get(src, frozenset()):
        return
    if src.terminal:
        raise InvalidTransition(f"{src.value} is terminal; cannot move to {dst.value}")
    if dst is Phase.FAILED or dst in _ALLOWED[src]:
        return
    raise InvalidTransition(f"{src.value} -> {dst.value} is not an allowed transition")


def last_entered(phase_times: tuple[tuple[str, datetime], ...], value: str) -> datetime | None:
    """When a record last entered the phase named `value` (its phase_times, oldest first), or None."""
    for name, at in reversed(phase_times):
        if name == value:
            return at
    return None
