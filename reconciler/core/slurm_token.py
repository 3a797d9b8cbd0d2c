"""Whether the Slurm token the Slinky Token keeps has stopped being refreshed, and when to page about it.

slurm-operator v1.2.1 re-mints a Token's JWT at ``exp - lifetime/5`` (lifetime 15 min unless the Token
says otherwise: api/v1beta1/token_keys.go ``Lifetime``). Its reconcile computes the requeue from the
token it found, before minting (internal/controller/token/token_sync.go ``Sync``: ``durationStore.Push(key,
refreshTime.Sub(now))`` in the preamble and in the ``Refresh`` step), and ``Reconcile``
(token_controller.go) returns ``RequeueAfter: durationStore.Pop(req.String())``: the pass that re-mints
has ``now >= refreshTime``, so it returns ``RequeueAfter <= 0`` and controller-runtime never requeues it.
The new Secret does not wake it either: ``SetupWithManager`` watches ``Owns(&corev1.Secret{})``, but the
token Secret's controller owner is the JWT-key Secret. The Token is then visited only when its object
changes, the operator restarts, or the informers resync (controller-runtime's default, every 10 h): the
token expires in between. Fixed upstream after v1.2.1.

This module only decides: a token is FRESH until the point the operator should have re-minted it (plus
SLACK_S for a slow pass), OVERDUE after, EXPIRED at ``exp``. One page per episode: an episode starts when a
token is first seen overdue or expired and ends when a fresh token is read again.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["DEFAULT_LIFETIME_S", "SLACK_S", "TokenHealth", "TokenState", "TokenStep", "TokenWatch", "assess"]

DEFAULT_LIFETIME_S = 15 * 60.0  # api/v1beta1/token_keys.go Token.Lifetime
REFRESH_FRACTION = 1 / 5  # token_sync.go: refreshTime = expirationTime - lifetime * 1/5
SLACK_S = 30.0  # a pass that is merely slow is not a stopped one


class TokenState(str, Enum):
    FRESH = "fresh"
    OVERDUE = "overdue"  # past the operator's re-mint point: it stopped refreshing (or is about to expire)
    EXPIRED = "expired"
    UNKNOWN = "unknown"  # no `exp` to judge by


@dataclass(frozen=True)
class TokenHealth:
    state: TokenState
    seconds_left: float | None  # until exp; negative once expired

    @property
    def stopped(self) -> bool:
        return self.state in (TokenState.OVERDUE, TokenState.EXPIRED)


def assess(exp: float | None, iat: float | None, now: float, slack_s: float = SLACK_S) -> TokenHealth:
    """The token's health at `now` from its `exp` and `iat` claims (lifetime = exp - iat, as the operator
    mints it: slurmjwt/token.go sets IssuedAt=now, ExpiresAt=now+lifetime; without `iat`, upstream's
    default lifetime)."""
    if exp is None:
        return TokenHealth(TokenState.UNKNOWN, None)
    left = exp - now
    lifetime = exp - iat if iat is not None and exp > iat else DEFAULT_LIFETIME_S
    if left <= 0:
        return TokenHealth(TokenState.EXPIRED, left)
    if left < lifetime * REFRESH_FRACTION - slack_s:
        return TokenHealth(TokenState.OVERDUE, left)
    return TokenHealth(TokenState.FRESH, left)


@dataclass(frozen=True)
class TokenWatch:
    """Whether this episode has been paged. Pure: `step` returns the next watch and what to do."""
    paged: bool = False

    def step(self, health: TokenHealth) -> tuple["TokenWatch", "TokenStep"]:
        if not health.stopped:
            return TokenWatch(), TokenStep(page=False, recovered=self.paged)
        return TokenWatch(paged=True), TokenStep(page=not self.paged, recovered=False)


@dataclass(frozen=True)
class TokenStep:
    page: bool  # the first stale reading of an episode: one page
    recovered: bool  # a fresh token after a paged episode: say so (a log line), no page
