"""The effective catalogue: NVIDIA's (catalogue.py) with a spec's overrides laid over it.

The reconciler and the node agent build it from the same policy (the fleet spec the stack renders
into the `gpufleet-policy` ConfigMap), so adding an override changes what the agent reports.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from .catalogue import FaultAction, Kind, default_action

if TYPE_CHECKING:
    from gpufleet.fleetspec.models import HealingSpec


@dataclass(frozen=True)
class Repeats:
    """Repeated application errors on one GPU that point at the hardware (WORKFLOW_XID_13/_31: RUN_DCGMEUD;
    NVSentinel's RepeatedXID31OnSameGPU and RepeatedXID13OnSameGPCAndTPC: twice within 24 h)."""

    xids: frozenset[int] = frozenset({13, 31})
    count: int = 2
    window_seconds: float = 86400.0
    action: FaultAction = FaultAction.DIAGNOSE


@dataclass(frozen=True)
class FaultPolicy:
    xid: Mapping[int, FaultAction] = field(default_factory=dict)
    sxid: Mapping[int, FaultAction] = field(default_factory=dict)
    gpu_lost: FaultAction | None = None
    repeats: Repeats = Repeats()

    @classmethod
    def from_spec(cls, healing: HealingSpec) -> FaultPolicy:
        f = healing.faults
        r = f.repeats
        return cls(dict(f.actions.xid), dict(f.actions.sxid), f.actions.gpu_lost,
                   Repeats(frozenset(r.xids), r.count, float(r.window_seconds), r.action))

    def override(self, kind: Kind, code: int) -> FaultAction | None:
        """The spec's action for this code, if it names one: final, over NVIDIA's rules."""
        if kind is Kind.XID:
            return self.xid.get(code)
        if kind is Kind.SXID:
            return self.sxid.get(code)
        if kind is Kind.DCGM:
            return None  # a threshold's action is its row's (fleetspec/faults/telemetry.py)
        if kind is Kind.NODE_LOST:
            return None  # a reboot, always: nothing on the machine can say more
        if kind is Kind.SLURM_DRAIN:
            return None  # the reason's row says (reconciler/core/slurm_reasons.py); healing.slurm_drains turns it off
        return self.gpu_lost

    def action(self, kind: Kind, code: int, fatal: bool | None = None) -> FaultAction:
        """The action for a code alone (no line text, no history): the override, else the catalogue's."""
        return self.override(kind, code) or default_action(kind, code, fatal)
