"""The lending ledger's format: per pool, what its capacity is doing now and which loans it made.

It lives in the ConfigMap `gpufleet-lending` (gpufleet.fleetspec.labels.LENDING_LEDGER) in the reconciler's
namespace; `data[<pool>]` is one pool's ledger as compact JSON:

    {"at": "2026-12-01T12:00:00Z",
     "capacity": {"active_busy": 1, "active_idle": 0, "active_lent": 1, "spares_lent": 1,
                  "spares_unlent": 1, "quarantined": 0, "gpus_lent": 16},
     "loans": [{"node": "kwok-h100-spare-0", "kind": "spare", "gpus": 8,
                "start": "2026-12-01T11:58:00Z", "end": null, "reclaimed": null}]}

Shared like the Remediation CRD: the reconciler writes it (its bookkeeping is
`reconciler/core/ledger.py`), `gpufleet capacity` reads it; both go through `parse` and `dump`.
Times are UTC, to the second.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Annotated, Iterable, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

class LedgerError(ValueError):
    """A ledger that cannot be read; the message says which pool and which field."""


KEEP = timedelta(days=7)  # closed loans are kept this long


def _utc_second(t: datetime) -> datetime:
    return t.astimezone(timezone.utc).replace(microsecond=0)


Time = Annotated[AwareDatetime, AfterValidator(_utc_second)]
Count = Annotated[int, Field(ge=0, strict=True)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capacity(_Frozen):
    """A pool's nodes by what they do now, and the GPUs lent out."""

    active_busy: Count = 0      # active, its Slurm node runs a job (or is not idle long enough to lend)
    active_idle: Count = 0      # active, idle in Slurm, not lent
    active_lent: Count = 0      # active, lent to borrowers
    spares_lent: Count = 0
    spares_unlent: Count = 0
    quarantined: Count = 0
    gpus_lent: Count = 0


class Loan(_Frozen):
    """One node lent to borrowers from `start` until `end` (None: lent now). `reclaimed`: when gpufleet began
    to take it back (its borrowers evicted from then); None for a loan not taken back (yet), or one that ended
    otherwise (its node faulted). Kept here because the Events that say so expire within hours."""

    node: str = Field(min_length=1)
    kind: Literal["spare", "idle"]  # the lent label's values, gpufleet.fleetspec.labels.LENT_SPARE | LENT_IDLE
    gpus: Count
    start: Time
    end: Time | None = None
    reclaimed: Time | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> "Loan":
        if self.end is not None and self.end < self.start:
            raise ValueError(f"loan of {self.node} ends ({self.end.isoformat()}) before it starts "
                             f"({self.start.isoformat()})")
        return self

    @property
    def open(self) -> bool:
        return self.end is None


class PoolLedger(_Frozen):
    at: Time                     # when `capacity` was counted
    capacity: Capacity = Field(default_factory=Capacity)
    loans: tuple[Loan, ...] = ()

    @model_validator(mode="after")
    def _one_open_loan_per_node(self) -> "PoolLedger":
        open_nodes = [loan.node for loan in self.loans if loan.open]
        twice = sorted({n for n in open_nodes if open_nodes.count(n) > 1})
        if twice:
            raise ValueError(f"node(s) {twice} have more than one open loan")
        return self

    def open_loan_of(self, node: str) -> Loan | None:
        return next((loan for loan in self.loans if loan.open and loan.node == node), None)

    def lent_nodes(self) -> tuple[str, ...]:
        return tuple(loan.node for loan in self.loans if loan.open)


def empty(now: datetime) -> PoolLedger:
    """A pool's first ledger: nothing counted, nothing lent."""
    return PoolLedger(at=now)


def parse(text: str, pool: str = "") -> PoolLedger:
    """One pool's ledger from its JSON; LedgerError names the pool and the field that is wrong."""
    where = f"ledger data[{pool!r}]" if pool else "ledger"
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as e:
        raise LedgerError(f"{where}: not JSON ({e})") from None
    try:
        return PoolLedger.model_validate(doc)
    except ValidationError as err:
        problems = "; ".join(f"{_loc(e['loc']) or 'the document'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in err.errors())
        raise LedgerError(f"{where}: {problems}") from None


def parse_data(data: dict[str, str] | None) -> dict[str, PoolLedger]:
    """Every pool's ledger from the ConfigMap's `data`."""
    return {pool: parse(text, pool) for pool, text in sorted((data or {}).items())}


def _loc(loc: Iterable) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def dump(ledger: PoolLedger) -> str:
    """Compact JSON, keys in a fixed order: the same ledger always gives the same text (no churn)."""
    return json.dumps(ledger.model_dump(mode="json"), separators=(",", ":"))


def gpu_hours(loans: Iterable[Loan], since: datetime, until: datetime) -> float:
    """GPU-hours lent within [since, until]: each loan's overlap with the window times its GPUs; an open
    loan runs to `until`."""
    total = 0.0
    for loan in loans:
        start, end = max(loan.start, since), min(loan.end or until, until)
        if end > start:
            total += loan.gpus * (end - start).total_seconds() / 3600
    return total
