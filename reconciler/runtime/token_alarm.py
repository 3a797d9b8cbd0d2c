"""Says when the Slinky Token stopped refreshing the reconciler's Slurm token, and nudges it: a gauge of the
seconds left, a gauge that is 1 while it is stale, a count of nudges, a warning log line, the condition
written onto the Token (the nudge itself), and ONE page per episode when the nudge cannot help (the
decisions are the core's: reconciler/core/slurm_token.py, which also cites the operator's code path and why
an annotation wakes it). Without it an expired token reads as a temporary Slurm error and every Slurm action
waits, fleet-wide, with nobody told.
"""
from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Callable

from gpufleet.reconciler.adapters.notify import Message
from gpufleet.reconciler.adapters.slurm.rest import token_claims
from gpufleet.reconciler.core.slurm_token import TokenHealth, TokenWatch, assess, condition
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)

WHAT_TO_DO = ("slurm-operator v1.2.1 stops re-minting a Token after a pass that re-mints it (its requeue is "
              "computed from the old token and comes out <= 0, and the new Secret does not wake it). To "
              "make it mint again, change the Token object (e.g. `kubectl -n {ns} annotate token {name} "
              "gpufleet.io/nudge=$(date +%s) --overwrite`) or restart the slurm-operator pod; upgrade the "
              "operator past v1.2.1 to end it.")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class TokenAlarm:
    """Observer of a KeptToken (`tokens.observer = alarm.observe`). `nudge`: writes a condition onto the
    Token (reconciler/adapters/slurm/token_secret.py TokenNudge), None where there is no Token to nudge."""

    def __init__(self, metrics: Metrics, send: Callable[[Message], None], source: str, clock: Callable[[], float],
                 token_ref: tuple[str, str] = ("slurm", "gpufleet-reconciler"),
                 nudge: Callable[[dict], None] | None = None):
        self.metrics, self.send, self.source, self.clock = metrics, send, source, clock
        self.token_ref = token_ref  # the Token object (namespace, name) named in the page
        self.nudge = nudge
        self._watch = TokenWatch()
        self._nudges = 0  # this episode's
        self._nudge_error: str | None = None  # this episode's last failed nudge
        self._lock = threading.Lock()

    def observe(self, token: str) -> None:
        exp, iat = token_claims(token)
        now = self.clock()
        health = assess(exp, iat, now)
        if health.seconds_left is not None:
            self.metrics.slurm_token_seconds_left.set(health.seconds_left)
        self.metrics.slurm_token_stale.set(1 if health.stopped else 0)
        with self._lock:  # one observer at a time decides and nudges: no two nudges for one step
            watch, step = self._watch.step(health, now, can_nudge=self.nudge is not None and self._nudge_error is None)
            since, nudged = watch.since, self._nudges > 0
            if step.nudge:
                try:
                    self.nudge(condition(health, _iso(now), _iso(since or now), self._nudges + 1))  # type: ignore[misc]
                    self._nudges += 1
                    self.metrics.slurm_token_nudges.inc()
                    log.warning("the Slurm token from %s is stale (%s): annotated Token %s/%s so the operator "
                                "reconciles it again (nudge %d)", self.source, self._when(health),
                                *self.token_ref, self._nudges)
                except Exception as e:  # noqa: BLE001 - a nudge that cannot be written: page instead
                    self._nudge_error = str(e)
                    log.warning("the Slurm token from %s is stale and the Token cannot be nudged: %s", self.source, e)
                    watch, step = self._watch.step(health, now, can_nudge=False)
            if step.recovered:
                self._nudges, self._nudge_error = 0, None
            self._watch = watch
        if step.recovered:
            log.warning("the Slurm token from %s is fresh again (%.0fs left)", self.source, health.seconds_left or 0)
            if nudged:  # the condition it wrote goes back to True
                self._lower(health, now)
        if step.page:
            self._page(health)

    def _lower(self, health: TokenHealth, now: float) -> None:
        """The condition back to True on the Token (one more change of it, as harmless as the nudge)."""
        try:
            self.nudge(condition(health, _iso(now), _iso(now), 0))  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 - the condition stays False until the next write; the token is fine
            log.warning("could not lower the stale-token condition on Token %s/%s: %s", *self.token_ref, e)

    @staticmethod
    def _when(health: TokenHealth) -> str:
        left = health.seconds_left
        return f"expired {-left:.0f}s ago" if left is not None and left <= 0 else f"expires in {left or 0:.0f}s"

    def _page(self, health: TokenHealth) -> None:
        ns, name = self.token_ref
        with self._lock:
            nudges, error = self._nudges, self._nudge_error
        if self.nudge is None:
            did = "There is no Token object to nudge from here. "
        elif error is not None:
            did = f"The reconciler could not nudge Token {ns}/{name} ({error}). "
        else:
            did = (f"The reconciler nudged Token {ns}/{name} {nudges} time(s) (annotation "
                   "gpufleet.io/slurm-token-condition) and it was not re-minted: is the operator running? ")
        text = (f"The Slinky Token stopped refreshing the reconciler's Slurm token ({self.source}: "
                f"{self._when(health)}, past the point it should have been re-minted); Slurm actions stop when it "
                f"expires. {did}" + WHAT_TO_DO.format(ns=ns, name=name))
        log.warning("%s", text)
        self.send(Message("slurm-token-stale", "critical", text))
