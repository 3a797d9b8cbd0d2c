"""The phases of one remediation, and the only moves allowed between them.

    Detected ──► SlurmDraining ──► Checkpointing ──► Requeued ──┬──► OptedOut (holds; a person decides)
        │                                                       └──► Evicting ──► Replacing ──► Resuming ──► Succeeded
        │                                                                            │  ▲
        │                                                                            ▼  │
        │                                                                    WaitingForSpare
        └──► (a fault on a spare) Replacing: quarantine it and refill
    Escalated: too many attempts on one node, or a storm; a human is paged, nothing else is done.
    Any non-terminal phase ──► Failed, with the reason.

Each phase is persisted on the Remediation record before the next step runs, so a
reconciler killed anywhere resumes from the phase it last wrote.
"""
from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    DETECTED = "Detected"
    SLURM_DRAINING = "SlurmDraining"
    CHECKPOINTING = "Checkpointing"
    REQUEUED = "Requeued"
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
        """Counts against max_concurrent: the remediation is still moving."""
        return self not in TERMINAL and self is not Phase.OPTED_OUT


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.ESCALATED, Phase.FAILED})

_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.DETECTED: frozenset({Phase.SLURM_DRAINING, Phase.REPLACING, Phase.ESCALATED}),
    Phase.SLURM_DRAINING: frozenset({Phase.CHECKPOINTING}),
    Phase.CHECKPOINTING: frozenset({Phase.REQUEUED}),
    Phase.REQUEUED: frozenset({Phase.OPTED_OUT, Phase.EVICTING}),
    Phase.OPTED_OUT: frozenset(),
    Phase.EVICTING: frozenset({Phase.REPLACING}),
    Phase.REPLACING: frozenset({Phase.RESUMING, Phase.WAITING_FOR_SPARE, Phase.SUCCEEDED}),
    Phase.WAITING_FOR_SPARE: frozenset({Phase.REPLACING}),
    Phase.RESUMING: frozenset({Phase.SUCCEEDED}),
}


class InvalidTransition(ValueError):
    pass


def check_transition(src: Phase, dst: Phase) -> None:
    """Raise unless src -> dst is drawn above. Failed is reachable from any live phase."""
    if src.terminal:
        raise InvalidTransition(f"{src.value} is terminal; cannot move to {dst.value}")
    if dst is Phase.FAILED or dst in _ALLOWED[src]:
        return
    raise InvalidTransition(f"{src.value} -> {dst.value} is not an allowed transition")
