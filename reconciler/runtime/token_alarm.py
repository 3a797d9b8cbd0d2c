"""Says when the Slinky Token stopped refreshing the reconciler's Slurm token: a gauge of the seconds left,
a gauge that is 1 while it is stale, a warning log line and ONE page per episode (the decision is the
core's: reconciler/core/slurm_token.py, which also cites the operator's code path). Without it an expired
token reads as a temporary Slurm error and every Slurm action waits, fleet-wide, with nobody told.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from gpufleet.reconciler.adapters.notify import Message
from gpufleet.reconciler.adapters.slurm.rest import token_claims
from gpufleet.reconciler.core.slurm_token import TokenWatch, assess
from gpufleet.reconciler.runtime.metrics import Metrics

log = logging.getLogger(__name__)

WHAT_TO_DO = ("slurm-operator v1.2.1 stops re-minting a Token after a pass that re-mints it (its requeue is "
              "computed from the old token and comes out <= 0, and the new Secret does not wake it). To "
              "make it mint again, change the Token object (e.g. `kubectl -n {ns} annotate token {name} "
              "gpufleet.io/nudge=$(date +%s) --overwrite`) or restart the slurm-operator pod; upgrade the "
              "operator past v1.2.1 to end it.")


class TokenAlarm:
    """Observer of a KeptToken (`tokens.observer = alarm.observe`)."""

    def __init__(self, metrics: Metrics, send: Callable[[Message], None], source: str, clock: Callable[[], float],
                 token_ref: tuple[str, str] = ("slurm", "gpufleet-reconciler")):
        self.metrics, self.send, self.source, self.clock = metrics, send, source, clock
        self.token_ref = token_ref  # the Token object (namespace, name) named in the page
        self._watch = TokenWatch()
        self._lock = threading.Lock()

    def observe(self, token: str) -> None:
        exp, iat = token_claims(token)
        health = assess(exp, iat, self.clock())
        if health.seconds_left is not None:
            self.metrics.slurm_token_seconds_left.set(health.seconds_left)
        self.metrics.slurm_token_stale.set(1 if health.stopped else 0)
        with self._lock:
            self._watch, step = self._watch.step(health)
        if step.recovered:
            log.warning("the Slurm token from %s is fresh again (%.0fs left)", self.source, health.seconds_left or 0)
        if step.page:
            ns, name = self.token_ref
            when = (f"expired {-health.seconds_left:.0f}s ago" if health.seconds_left is not None
                    and health.seconds_left <= 0 else f"expires in {health.seconds_left:.0f}s")
            text = (f"The Slinky Token stopped refreshing the reconciler's Slurm token ({self.source}: {when}, past "
                    f"the point it should have been re-minted); Slurm actions stop when it expires. "
                    + WHAT_TO_DO.format(ns=ns, name=name))
            log.warning("%s", text)
            self.send(Message("slurm-token-stale", "critical", text))
