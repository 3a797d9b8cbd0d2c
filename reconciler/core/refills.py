"""The node a remediation asks for to refill its pool's spares, and what became of it. Pure.

A refill is asked for once per remediation (`RequestCapacity`, once-only): for the spare it promoted, for a
spare that faulted, or for the node it has no spare for. The record says so (`Remediation.refill`:
Requested, with the time), then what became of it, on its node's next look at or after the deadline:
- Answered: a node of the pool settled the request (kubernetes-spares: membership marks the node that
  answered a placeholder, `labels.FULFILS`);
- Failed: the provider said it has no room (`can_refill`), or nobody answered within
  `healing.refill_timeout_seconds` (kubernetes-spares: the placeholder is withdrawn). A failure pages (with
  its Events on the node and the record) and is counted (`gpufleet_refills_total{outcome="failed"}`): the
  pool runs a spare short until a person adds one.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Iterable

from fleetspec import FleetSpec

from reconciler.core.actions import Action, Notify, RequestCapacity, SettleRefill
from reconciler.core.model import Refill, RefillState, Remediation, Step

SETTLED_BY_NODES = frozenset({"kubernetes-spares"})  # providers whose requests a joining node settles


def request_name(pool: str, key: str) -> str:
    """A capacity request's name (kubernetes-spares: its placeholder pod): one per pool and key, so asking
    again is harmless, and the node that answers it carries this name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"gpufleet-refill-{pool}"[:52] + f"-{digest}"


def ask(r: Remediation, reason: str, key: str, can_refill: bool, now: datetime) -> tuple[tuple[Action, ...], Remediation]:
    """Ask for one node (or say that the provider has no room): the actions, and the record saying so."""
    if r.refill is not None and r.refill.key == key:
        return (), r  # asked already (a retried step)
    if can_refill:
        return (RequestCapacity(r.pool, reason, key),), replace(r, refill=Refill(key, RefillState.REQUESTED, now, reason))
    why = f"pool {r.pool}: the node provider has no room for another node ({reason})"
    return ((SettleRefill(r.pool, key, RefillState.FAILED, why), Notify("refill-blocked", "warning", why + ". "
             f"The pool runs a spare short. Action needed: add capacity to pool {r.pool} (remediation {r.name}).")),
            replace(r, refill=Refill(key, RefillState.FAILED, now, why)))


def outstanding(r: Remediation) -> bool:
    return r.refill is not None and r.refill.state == RefillState.REQUESTED


def due(r: Remediation, spec: FleetSpec) -> datetime | None:
    """When an outstanding refill is looked at at the latest (its deadline); None when none is outstanding."""
    pool = next((p for p in spec.pools if p.name == r.pool), None)
    if not outstanding(r) or pool is None or pool.provider not in SETTLED_BY_NODES:
        return None
    return r.refill.at + timedelta(seconds=spec.healing.refill_timeout_seconds)


def settle(r: Remediation, answered: Iterable[str], spec: FleetSpec, now: datetime) -> Step | None:
    """What became of `r`'s outstanding refill: `answered` are the requests the pool's nodes answered.
    None while it is outstanding and not due."""
    deadline = due(r, spec)
    if deadline is None:
        return None
    f = r.refill
    if request_name(r.pool, f.key) in set(answered):
        msg = f"a node joined pool {r.pool} for it"
        return Step((SettleRefill(r.pool, f.key, RefillState.ANSWERED, msg),),
                    replace(r, refill=Refill(f.key, RefillState.ANSWERED, now, msg)))
    if now < deadline:
        return None
    msg = (f"nobody answered the capacity request for pool {r.pool} within {spec.healing.refill_timeout_seconds}s "
           f"({f.message}): the pool runs a spare short")
    page = Notify("refill-failed", "warning", f"{msg}. Action needed: add a node to pool {r.pool} (the node group's "
                  f"maximum size, a quota, the cluster autoscaler's events on pod {request_name(r.pool, f.key)}); "
                  f"remediation {r.name}.")
    return Step((SettleRefill(r.pool, f.key, RefillState.FAILED, msg),)
                + ((page,) if page.once not in r.intents else ()),
                replace(r, refill=Refill(f.key, RefillState.FAILED, now, msg)))
