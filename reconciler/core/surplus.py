"""A pool's spares kept at their declared count: the surplus given back, a node given back taken again
while it is still there and the pool runs short. Pure.

Every heal that takes a spare asks for a node, and every repaired node comes back among the spares, so
without this a pool that faults grows by one spare per repair. A spare above the pool's declared count
(`pools[].spares`, plus one for each heal on its way to a spare and without one yet) is given back (`GiveBack`): only a
free one (no fault, not lent or being taken back, not another remediation's chosen replacement, not held
by a lending pass), never a node that serves. Those not proven on their boot go first, then the newest
(the last name). The provider gives it back as it can (kubernetes-spares: role `surplus`, left to the
cluster autoscaler's scale-down; aws-asg: the group scaled in by it). A node given back that is still
there when the pool runs short is a spare again (`ReturnToSpares`) before anything is asked for.
"""
from __future__ import annotations

from typing import Iterable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import NodePool

from gpufleet.reconciler.core.actions import Action, GiveBack, ReturnToSpares
from gpufleet.reconciler.core.model import NodeView, Remediation
from gpufleet.reconciler.core.phases import Phase


ON_THE_WAY_TO_A_SPARE = frozenset({Phase.DETECTED, Phase.SLURM_DRAINING, Phase.CHECKPOINTING, Phase.REQUEUED,
                                   Phase.EVICTING, Phase.REPLACING, Phase.WAITING_FOR_SPARE})


def plan(pool: NodePool, nodes: Iterable[NodeView], records: Iterable[Remediation],
         held: frozenset[str] = frozenset()) -> tuple[Action, ...]:
    """What keeps `pool` at its declared spares now: the surplus given back, or nodes given back taken again.
    `records`: the pool's remediations (with those being applied); `held`: nodes a lending pass is changing."""
    nodes = sorted(nodes, key=lambda n: n.name)
    records = [r for r in records if r.pool == pool.name]
    # every heal on its way to a spare counts, not only one already waiting: a refill that joins while a heal is
    # still evicting or about to promote would otherwise be given back, and the promotion leave the pool short
    waiting = sum(1 for r in records if r.phase in ON_THE_WAY_TO_A_SPARE and not r.replacement)
    want = pool.spares + waiting
    chosen = {r.replacement for r in records if r.active and r.replacement}  # about to serve: no longer a spare
    spares = [n for n in nodes if n.is_spare and n.fault is None and n.name not in chosen]
    given = [n for n in nodes if n.role == labels.ROLE_SURPLUS]
    if len(spares) < want:
        back = [n for n in given if n.ready and n.fault is None][:want - len(spares)]
        return tuple(ReturnToSpares(n.name, pool.name) for n in back)
    taken = chosen | set(held)
    free = [n for n in spares if not n.on_loan and n.name not in taken and n.remediation is None]
    extra = len(spares) - want
    order = sorted(sorted(free, key=lambda n: (n.created, n.name), reverse=True), key=lambda n: n.proven)
    why = (f"pool {pool.name} has {len(spares)} spares, {want} wanted ({pool.spares} declared"
           + (f", {waiting} heal(s) on their way to a spare" if waiting else "") + ")")
    out: list[Action] = [GiveBack(n.name, pool.name, f"surplus: {why}") for n in order[:max(0, extra)]]
    if pool.provider == "aws-asg":  # a node given back whose instance may still be in its group (a crash between)
        out += [GiveBack(n.name, pool.name, "surplus: given back") for n in given]
    return tuple(out)
