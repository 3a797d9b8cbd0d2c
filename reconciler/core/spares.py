"""Which spare replaces a faulted node. Pure: one function, from the pool's nodes as they are seen.

A spare may replace a node when it is Ready, schedulable and fault-free, no other remediation or
lending pass has claimed it, no Slurm node on it was drained by a person or by Slurm itself (a node
to check, or gone: core/slurm_reasons.py), and (when the spec asks for
proof, issue 25) it passed a health check on its current boot: a bad spare is never promoted. Unlent spares go first
(a lent one heals only when nothing else is free: its borrowers must leave first); then by name.
"""
from __future__ import annotations

from gpufleet.reconciler.core.drains import drained_by_person, drained_by_slurm
from gpufleet.reconciler.core.model import NodeView, StepFacts


def free_spares(facts: StepFacts, proven_only: bool = False) -> tuple[str, ...]:
    """The spares that may replace a node now, in the order they are taken."""
    on_spare = dict(facts.spare_slurm)
    ok = [n for n in facts.pool_nodes
          if n.is_spare and n.ready and n.fault is None and not n.unschedulable and n.name not in facts.claimed
          and (n.proven or not proven_only)
          and not any(drained_by_person(s) or drained_by_slurm(s) for s in on_spare.get(n.name, ()))]
    return tuple(n.name for n in sorted(ok, key=lambda n: (n.on_loan, n.name)))


def replacement_view(name: str | None, facts: StepFacts) -> NodeView | None:
    """The chosen spare as it is seen now."""
    if name is None:
        return None
    if facts.replacement is not None and facts.replacement.name == name:
        return facts.replacement
    return next((n for n in facts.pool_nodes if n.name == name), None)
