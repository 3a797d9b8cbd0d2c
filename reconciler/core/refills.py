"""The node a remediation asks for to refill its pool's spares, and what became of it. Pure.

A remediation asks for a node (`RequestCapacity`, once-only per attempt) for the spare it promoted, for a
spare that faulted, for the node it has no spare for, or for a node retired with nothing in its place;
but only while the pool lacks one (`Stock`: its declared spares, and a node for each remediation that
waits for a spare, less the spares it has and the requests outstanding), so requests do not pile up: a
record whose pool has what it declares asks for nothing and says so. The record says what it asked
(`Remediation.refill`: Requested, with the time and the attempt), then what became of it:
- Answered: a node of the pool settled the request (kubernetes-spares: membership marks the node that
  answered a placeholder, `labels.FULFILS`), or the pool had its spares again when it was due to be asked
  again;
- Failed, at once, when the provider said no: the cluster autoscaler's `NotTriggerScaleUp` Event on the
  placeholder ("pod didn't trigger scale-up: 1 max node group size reached"), or the node group's own
  answer (aws-asg: at its MaxSize); else when nobody answered within `healing.refill_timeout_seconds`
  (kubernetes-spares: the placeholder is withdrawn). The record says who said what; the first failure
  pages (once per record, with the answer), each is counted (`gpufleet_refills_total{outcome="failed"}`).

A failed refill is asked again (under a new key, so the provider sees a new request) at `retry_at`, the
backoff written in the record: `RETRY_FIRST`, doubling to `RETRY_MAX`. The runtime writes the record with
the request's intent before it sends it, so a reconciler killed mid-step neither asks twice nor forgets.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from gpufleet.fleetspec import FleetSpec
from gpufleet.fleetspec.models import NodePool

from gpufleet.reconciler.core.actions import Action, Notify, RequestCapacity, SettleRefill
from gpufleet.reconciler.core.model import NodeView, Refill, RefillState, Remediation, Step, Stock
from gpufleet.reconciler.core.phases import Phase

SETTLED_BY_NODES = frozenset({"kubernetes-spares"})  # providers whose requests a joining node settles
RETRY_FIRST = timedelta(minutes=5)  # a failed refill is asked again after this long, doubling each time ...
RETRY_MAX = timedelta(hours=1)  # ... up to this
ANSWER_LOOK = 10.0  # seconds between looks for the provider's answer while a request is outstanding
NOT_TRIGGER_SCALE_UP = "NotTriggerScaleUp"  # the cluster autoscaler's Event reason (pool_refusals)
REQUEST_PREFIX = "gpufleet-refill-"  # every capacity request's name (request_name)


def request_name(pool: str, key: str) -> str:
    """A capacity request's name (kubernetes-spares: its placeholder pod): one per pool and key, so asking
    again is harmless, and the node that answers it carries this name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{REQUEST_PREFIX}{pool}"[:52] + f"-{digest}"


def attempt_key(key: str, attempt: int) -> str:
    """The key of a refill's `attempt`th ask: the first keeps the record's key; each later one is new."""
    return key if attempt <= 1 else f"{key}/{attempt}"


def backoff(attempt: int) -> timedelta:
    """How long after its `attempt`th failure a refill is asked again."""
    return min(RETRY_MAX, RETRY_FIRST * (2 ** max(0, attempt - 1)))


# --- what the pool lacks --------------------------------------------------------------------------------

def stock(pool: NodePool, nodes: Iterable[NodeView], records: Iterable[Remediation], me: Remediation,
          spec: FleetSpec, now: datetime) -> Stock:
    """The pool's stock as `me` weighs it: `nodes` the pool's, `records` the pool's remediations (with those
    being applied). Its own node and its chosen spare are not counted as spares. A request nothing settles
    (aws-asg: the group's desired capacity, raised at once) counts as outstanding only while its node may
    still be joining (`healing.refill_timeout_seconds`); after that its node is among the spares, or lost."""
    records = [x for x in records if x.pool == pool.name and x.name != me.name]
    taken = {x.replacement for x in records if x.active and x.replacement} | {me.node, me.replacement}
    spares = sum(1 for n in nodes if n.is_spare and n.fault is None and n.name not in taken)
    joining = timedelta(seconds=spec.healing.refill_timeout_seconds)
    requested = sum(1 for x in records if outstanding(x)
                    and (pool.provider in SETTLED_BY_NODES or now - x.refill.at < joining))
    waiting = sum(1 for x in records if x.phase is Phase.WAITING_FOR_SPARE)
    return Stock(pool.spares, spares, requested, waiting)


# --- asking ---------------------------------------------------------------------------------------------

def ask(r: Remediation, reason: str, key: str, can_refill: bool, now: datetime, stock_now: Stock | None = None,
        refusal: str = "", waits: bool = False) -> tuple[tuple[Action, ...], Remediation]:
    """Ask for one node (or say that the provider has no room, or that the pool lacks none): the actions,
    and the record saying so. `refusal`: the provider's own words when it has no room; `waits`: the
    remediation waits for a spare itself (its job needs the node)."""
    if r.refill is not None and r.refill.key == key:
        return (), r  # asked already (a retried step)
    return _ask(r, reason, key, 1, can_refill, now, stock_now, refusal, waits)


def _ask(r: Remediation, reason: str, key: str, attempt: int, can_refill: bool, now: datetime,
         stock_now: Stock | None, refusal: str, waits: bool) -> tuple[tuple[Action, ...], Remediation]:
    if stock_now is not None and stock_now.lacks(waits) <= 0:
        msg = f"not asked: pool {r.pool} lacks no node ({stock_now.says()})"
        return (), replace(r, refill=Refill(key, RefillState.ANSWERED, now, msg, attempt))
    if can_refill:
        return (RequestCapacity(r.pool, reason, key),), replace(r, refill=Refill(key, RefillState.REQUESTED, now, reason,
                                                                                  attempt))
    why = f"pool {r.pool}: the node provider has no room for another node ({refusal or reason})"
    return failed(r, Refill(key, RefillState.REQUESTED, now, reason, attempt), why, now)


def failed(r: Remediation, f: Refill, why: str, now: datetime) -> tuple[tuple[Action, ...], Remediation]:
    """The refill `f` failed: the record says why and when it is asked again; the first failure pages."""
    again = now + backoff(f.attempt)
    msg = f"{why}; asked again at {again:%Y-%m-%d %H:%M:%S}Z (attempt {f.attempt + 1}) if the pool still lacks a node"
    page = Notify("refill-failed", "warning", f"{why}: the pool runs a spare short. gpufleet asks again with backoff "
                  f"(next at {again:%H:%M:%S}Z) while the pool lacks a node, and does not page again for it. Action "
                  f"needed: add capacity to pool {r.pool} (the node group's maximum size, a quota, the cluster "
                  f"autoscaler's events on pod {request_name(r.pool, f.key)}); remediation {r.name}.")
    actions: tuple[Action, ...] = (SettleRefill(r.pool, f.key, RefillState.FAILED, why),)
    if page.once not in r.intents:
        actions += (page,)
    return actions, replace(r, refill=Refill(f.key, RefillState.FAILED, now, msg, f.attempt, again))


def outstanding(r: Remediation) -> bool:
    return r.refill is not None and r.refill.state == RefillState.REQUESTED


def to_retry(r: Remediation) -> bool:
    return r.refill is not None and r.refill.state == RefillState.FAILED and r.refill.retry_at is not None


def due(r: Remediation, spec: FleetSpec) -> datetime | None:
    """When a refill is looked at at the latest: an outstanding one's deadline, a failed one's next ask;
    None when there is nothing to look at."""
    pool = next((p for p in spec.pools if p.name == r.pool), None)
    if pool is None:
        return None
    if to_retry(r):
        return r.refill.retry_at
    if not outstanding(r) or pool.provider not in SETTLED_BY_NODES:
        return None
    return r.refill.at + timedelta(seconds=spec.healing.refill_timeout_seconds)


def next_look(r: Remediation, spec: FleetSpec, now: datetime) -> float | None:
    """Seconds until `r`'s refill is looked at again: while outstanding, often (the provider's answer is
    read at once), at the latest at its deadline; a failed one at its next ask."""
    when = due(r, spec)
    if when is None:
        return None
    wait = max(0.0, (when - now).total_seconds())
    return min(wait, ANSWER_LOOK) if outstanding(r) else wait


def settle(r: Remediation, answered: Iterable[str], spec: FleetSpec, now: datetime,
           refusals: Mapping[str, str] | None = None, stock_now: Stock | None = None,
           can_refill: bool = True, refusal: str = "") -> Step | None:
    """What became of `r`'s refill: `answered` are the requests the pool's nodes answered, `refusals` the
    provider's no to a request (request name -> its words). A failed refill due again is asked again while
    the pool lacks a node (`stock_now`). None while nothing changed."""
    deadline = due(r, spec)
    if deadline is None:
        return None
    f = r.refill
    if to_retry(r):
        if now < deadline:
            return None
        reason = f"asked again for pool {r.pool} (attempt {f.attempt + 1})"
        actions, noted = _ask(r, reason, attempt_key(_base(f.key), f.attempt + 1), f.attempt + 1, can_refill, now,
                              stock_now, refusal, r.phase is Phase.WAITING_FOR_SPARE)
        if noted.refill is not None and noted.refill.state == RefillState.ANSWERED:
            noted = replace(noted, refill=replace(noted.refill, message=f"not asked again: pool {r.pool} lacks no node"
                                                  f" ({stock_now.says() if stock_now else ''})"))
        return Step(actions, noted)
    name = request_name(r.pool, f.key)
    if name in set(answered):
        msg = f"a node joined pool {r.pool} for it"
        return Step((SettleRefill(r.pool, f.key, RefillState.ANSWERED, msg),),
                    replace(r, refill=Refill(f.key, RefillState.ANSWERED, now, msg, f.attempt)))
    said = (refusals or {}).get(name)
    if said:
        actions, noted = failed(r, f, f"pool {r.pool}: the capacity request {name} was refused: {said}", now)
        return Step(actions, noted)
    if now < deadline:
        return None
    why = (f"nobody answered the capacity request for pool {r.pool} within {spec.healing.refill_timeout_seconds}s "
           f"({f.message})")
    actions, noted = failed(r, f, why, now)
    return Step(actions, noted)


def _base(key: str) -> str:
    """A refill's first key, from any attempt's."""
    head, _, tail = key.rpartition("/")
    return head if head and tail.isdigit() else key


def needs_refill_on_retire(r: Remediation) -> bool:
    """A retired node with nothing in its place: no refill asked, or the one asked failed (a request that
    stands or was answered already refills the pool)."""
    return r.refill is None or r.refill.state == RefillState.FAILED


def pool_refusals(events: Iterable[Mapping], names: Iterable[str] = ()) -> dict[str, str]:
    """The cluster autoscaler's no, read from its Events: request (placeholder pod) name -> the newest
    `NotTriggerScaleUp` message on it. Upstream emits that Event (type Normal) on each pod that stays
    unschedulable after a loop with no scale-up, "pod didn't trigger scale-up: " and its reasons counted per
    node group ("1 max node group size reached", "1 in backoff after failed scale-up", "1 node(s) didn't
    match Pod's node affinity/selector": cluster-autoscaler 1.32.0 processors/status/
    eventing_scale_up_processor.go, core/scaleup/orchestrator/skippedreasons.go). `names`: only these pods
    (empty: any of gpufleet's requests)."""
    want = set(names)
    out: dict[str, tuple[str, str]] = {}
    for e in events:
        obj = e.get("involvedObject") or e.get("regarding") or {}
        name = obj.get("name") or ""
        if e.get("reason") != NOT_TRIGGER_SCALE_UP or obj.get("kind") != "Pod":
            continue
        if (want and name not in want) or (not want and not name.startswith(REQUEST_PREFIX)):
            continue
        when = str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
        if name not in out or when >= out[name][0]:
            out[name] = (when, str(e.get("message") or e.get("note") or NOT_TRIGGER_SCALE_UP))
    return {k: v[1] for k, v in out.items()}

