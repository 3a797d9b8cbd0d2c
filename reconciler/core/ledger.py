"""The lending ledger's bookkeeping: which loans open and close, when a pool's entry is written. Pure.

Level-based: loans open and close as the nodes show them, so a crash or a restart loses nothing and
a repeated pass writes the same ledger. The format is fleetspec/ledger.py's.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.ledger import KEEP, Capacity, Loan, PoolLedger, dump, empty

from gpufleet.reconciler.core.actions import WriteLedger
from gpufleet.reconciler.core.model import NodeView


def record_capacity(ledger: PoolLedger, capacity: Capacity, now: datetime) -> PoolLedger:
    return PoolLedger(at=now, capacity=capacity, loans=ledger.loans)


def open_loan(ledger: PoolLedger, node: str, kind: str, gpus: int, now: datetime) -> PoolLedger:
    """The ledger with `node` lent from `now`; unchanged when the node has an open loan already."""
    if ledger.open_loan_of(node) is not None:
        return ledger
    loan = Loan(node=node, kind=kind, gpus=gpus, start=now)
    return PoolLedger(at=ledger.at, capacity=ledger.capacity, loans=(*ledger.loans, loan))


def close_loan(ledger: PoolLedger, node: str, now: datetime) -> PoolLedger:
    """The ledger with `node`'s open loan ended at `now` (never before it began); unchanged when none is open."""
    loan = ledger.open_loan_of(node)
    if loan is None:
        return ledger
    closed = Loan(node=loan.node, kind=loan.kind, gpus=loan.gpus, start=loan.start, end=max(loan.start, now),
                  reclaimed=loan.reclaimed)
    return PoolLedger(at=ledger.at, capacity=ledger.capacity,
                      loans=tuple(closed if x is loan else x for x in ledger.loans))


def mark_reclaim(ledger: PoolLedger, node: str, since: datetime) -> PoolLedger:
    """The ledger with `node`'s open loan taken back since `since` (`gpufleet why` tells the delay it caused);
    unchanged when none is open or it is marked already."""
    loan = ledger.open_loan_of(node)
    if loan is None or loan.reclaimed is not None:
        return ledger
    marked = Loan(node=loan.node, kind=loan.kind, gpus=loan.gpus, start=loan.start, reclaimed=max(loan.start, since))
    return PoolLedger(at=ledger.at, capacity=ledger.capacity,
                      loans=tuple(marked if x is loan else x for x in ledger.loans))


def prune(ledger: PoolLedger, now: datetime, keep: timedelta = KEEP) -> PoolLedger:
    """Drop closed loans that ended before `now - keep` (the ConfigMap stays small); open loans stay."""
    cutoff = now - keep
    kept = tuple(x for x in ledger.loans if x.end is None or x.end >= cutoff)
    if len(kept) == len(ledger.loans):
        return ledger
    return PoolLedger(at=ledger.at, capacity=ledger.capacity, loans=kept)



def book(old: PoolLedger | None, pool: str, nodes: Iterable[NodeView], capacity: Capacity,
         now: datetime) -> WriteLedger | None:
    """The pool's entry as the nodes show it now, or None when it says what `old` says (no write).
    `old`: the entry as last read or written (None: the pool has none yet)."""
    was = old or empty(now)
    new = was
    on_loan = {n.name: n for n in nodes if n.on_loan}
    for n in on_loan.values():
        kind = labels.LENT_SPARE if n.is_spare or n.lent == labels.LENT_SPARE else labels.LENT_IDLE
        new = open_loan(new, n.name, kind, n.gpus, n.lent_since or now)
        if n.reclaiming is not None:
            new = mark_reclaim(new, n.name, n.reclaiming)
    for name in new.lent_nodes():
        if name not in on_loan:
            new = close_loan(new, name, now)
    new = prune(new, now)
    if old is not None and dump(record_capacity(new, capacity, was.at)) == dump(was):
        return None
    return WriteLedger(pool, dump(record_capacity(new, capacity, now)))
