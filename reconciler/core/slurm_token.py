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
SLACK_S for a slow pass), OVERDUE after, EXPIRED at ``exp``. An episode starts when a token is first seen
overdue or expired and ends when a fresh token is read again. In it the reconciler NUDGES the Token (an
annotation on it, every NUDGE_EVERY_S at most): ``SetupWithManager`` watches ``For(&Token{})`` with no
predicate, so any change of the object, its metadata included, queues a reconcile (controller-runtime
v0.24 pkg/builder/controller.go ``For`` -> ``handler.EnqueueRequestForObject``, whose ``Update`` queues the
new object whatever changed: pkg/handler/enqueue.go), and that pass re-mints a token past its refresh point
(token_sync.go ``Refresh``: ``now.Before(refreshTime)`` is false). ONE page per episode, only when the nudge
cannot help: it could not be written (``can_nudge`` False), or the token is still stale NUDGE_GRACE_S after
the episode began (the operator is down, or something else is wrong).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["DEFAULT_LIFETIME_S", "NUDGE_EVERY_S", "NUDGE_GRACE_S", "SLACK_S", "TokenHealth", "TokenState", "TokenStep", "TokenWatch", "assess"]

DEFAULT_LIFETIME_S = 15 * 60.0  # api/v1beta1/token_keys.go Token.Lifetime
REFRESH_FRACTION = 1 / 5  # token_sync.go: refreshTime = expirationTime - lifetime * 1/5
SLACK_S = 30.0  # a pass that is merely slow is not a stopped one
NUDGE_EVERY_S = 60.0  # a nudge the operator has not answered is written again after this
NUDGE_GRACE_S = 120.0  # still stale this long into an episode: the nudge did not help, page


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
    """The episode: when it began, whether it was paged, when the Token was last nudged. Pure: `step`
    returns the next watch and what to do."""
    paged: bool = False
    since: float | None = None  # when this episode's first stale token was seen
    nudged_at: float | None = None

    def step(self, health: TokenHealth, now: float, can_nudge: bool = True) -> tuple["TokenWatch", "TokenStep"]:
        """`can_nudge` False: there is no Token to nudge, or writing to it failed (RBAC, admission, the
        API server): nothing done here can help, so the page goes out at once."""
        if not health.stopped:
            return TokenWatch(), TokenStep(page=False, recovered=self.since is not None, nudge=False)
        since = self.since if self.since is not None else now
        nudge = can_nudge and (self.nudged_at is None or now - self.nudged_at >= NUDGE_EVERY_S)
        page = not self.paged and (not can_nudge or now - since >= NUDGE_GRACE_S)
        return (TokenWatch(paged=self.paged or page, since=since, nudged_at=now if nudge else self.nudged_at),
                TokenStep(page=page, recovered=False, nudge=nudge))


@dataclass(frozen=True)
class TokenStep:
    page: bool  # the nudge cannot help (or there is none): one page per episode
    recovered: bool  # a fresh token after a stale episode: say so, lower the condition, no page
    nudge: bool = False  # write the nudge (the condition, with the time) onto the Token now


def condition(health: TokenHealth, now_iso: str, since_iso: str, nudges: int) -> dict:
    """What the nudge writes on the Token (annotation NUDGE_ANNOTATION, a metav1.Condition as JSON plus
    the nudge's time and count): `kubectl describe token` shows it. Each nudge's value differs (its
    time), so each is a change of the object."""
    if not health.stopped:
        return {"type": CONDITION_TYPE, "status": "True", "reason": "Fresh", "lastTransitionTime": now_iso,
                "message": "the reconciler's Slurm token was re-minted"}
    reason = "Expired" if health.state is TokenState.EXPIRED else "Overdue"
    left = health.seconds_left or 0.0
    return {"type": CONDITION_TYPE, "status": "False", "reason": reason, "lastTransitionTime": since_iso,
            "message": (f"the Slurm token {'expired' if left <= 0 else 'expires'} "
                        f"{'%.0fs ago' % -left if left <= 0 else 'in %.0fs' % left}, past the point this "
                        "Token should have re-minted it; the reconciler changed this annotation so the "
                        "operator reconciles the Token again"),
            "nudgedAt": now_iso, "nudges": nudges}


CONDITION_TYPE = "SlurmTokenFresh"  # on the Token, under fleetspec/labels.py TOKEN_NUDGE
