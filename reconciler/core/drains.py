"""Who owns a drain in Slurm, read from its reason's prefix (as Slinky's operator owns its own).

gpufleet's fault drains start with `gpufleet:`, its lending drains with `gpufleet-lending:`, the
operator's with `slurm-operator:`; any other drain is a person's and survives everything gpufleet does.
"""
from __future__ import annotations

from fleetspec import labels
from fleetspec.faults import describe

from reconciler.core.model import Remediation, SlurmNodeView


def slurm_reason(remediation: Remediation) -> str:
    return f"{labels.SLURM_REASON_PREFIX} {describe(remediation.xid, remediation.kind)} [{remediation.name}]"


def lending_reason(node: str) -> str:
    return f"{labels.SLURM_LENDING_PREFIX} idle, lent to preemptible work [{node}]"


def _out(n: SlurmNodeView) -> bool:
    return n.drained or n.down


def drained_by_gpufleet(n: SlurmNodeView) -> bool:
    return _out(n) and n.reason.startswith(labels.SLURM_REASON_PREFIX)


def drained_by_operator(n: SlurmNodeView) -> bool:
    return _out(n) and n.reason.startswith(labels.SLINKY_REASON_PREFIX)


def drained_for_lending(n: SlurmNodeView) -> bool:
    """An idle node gpufleet drained to lend it (reconciler/core/lending.py)."""
    return _out(n) and n.reason.startswith(labels.SLURM_LENDING_PREFIX)


def drained_by_person(n: SlurmNodeView) -> bool:
    """A drain that is neither gpufleet's nor Slinky's: a person's."""
    return n.drained and not (drained_by_gpufleet(n) or drained_by_operator(n) or drained_for_lending(n))
