"""When the Slinky Token has stopped refreshing the reconciler's token (slurm-operator v1.2.1, fixed after
it: reconciler/core/slurm_token.py), and that it is said once: a gauge, one page per episode."""
from __future__ import annotations

import jwt
from prometheus_client import CollectorRegistry

from gpufleet.reconciler.adapters.notify import Message
from gpufleet.reconciler.adapters.slurm.rest import KeptToken
from gpufleet.reconciler.core.slurm_token import TokenState, TokenWatch, assess
from gpufleet.reconciler.runtime.metrics import Metrics
from gpufleet.reconciler.runtime.token_alarm import TokenAlarm

KEY = b"k" * 32
T0 = 1_000_000.0


def tok(iat: float, lifetime: float = 900) -> str:
    return jwt.encode({"sun": "slurm", "iat": int(iat), "exp": int(iat + lifetime)}, KEY, algorithm="HS256")


def test_fresh_until_the_operators_refresh_point_then_overdue_then_expired() -> None:
    # lifetime 900 s: the operator re-mints at exp - 180 s; 30 s of slack for a slow pass.
    exp, iat = T0 + 900, T0
    assert assess(exp, iat, T0).state is TokenState.FRESH
    assert assess(exp, iat, exp - 170).state is TokenState.FRESH  # within the slack
    assert assess(exp, iat, exp - 149).state is TokenState.OVERDUE
    assert assess(exp, iat, exp).state is TokenState.EXPIRED
    assert assess(exp, iat, exp + 5).seconds_left == -5
    # An hour's token: re-minted at 12 min before exp, so 11 min left is overdue.
    assert assess(T0 + 3600, T0, T0 + 3600 - 660).state is TokenState.OVERDUE
    assert assess(None, None, T0).state is TokenState.UNKNOWN and not assess(None, None, T0).stopped


def test_one_page_per_episode() -> None:
    w = TokenWatch()
    stale, fresh = assess(T0 + 60, T0 - 840, T0), assess(T0 + 900, T0, T0)
    w, s1 = w.step(stale)
    w, s2 = w.step(stale)
    w, s3 = w.step(assess(T0 - 1, T0 - 901, T0))  # now expired: still the same episode
    assert (s1.page, s2.page, s3.page) == (True, False, False)
    w, s4 = w.step(fresh)
    assert s4.recovered and not s4.page
    w, s5 = w.step(stale)
    assert s5.page  # a new episode


class Source(KeptToken):
    def __init__(self, clock):
        super().__init__(clock)
        self.value, self.reads = "", 0

    def describe(self) -> str:
        return "Secret slurm/t"

    def _fetch(self) -> str:
        self.reads += 1
        return self.value


def test_the_alarm_pages_once_and_reads_a_reminted_token_at_once() -> None:
    now = [T0]
    clock = lambda: now[0]  # noqa: E731
    sent: list[Message] = []
    metrics = Metrics(CollectorRegistry())
    src = Source(clock)
    src.observer = TokenAlarm(metrics, sent.append, src.describe(), clock, token_ref=("slurm", "tok")).observe
    src.value = tok(T0)
    src.token()
    assert metrics.registry.get_sample_value("gpufleet_slurm_token_seconds_left") == 900
    assert metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 0
    now[0] = T0 + 800  # 100 s left: the operator should have re-minted 80 s ago; it did not
    for _ in range(5):
        src.token()
        now[0] += 10
    assert [m.event for m in sent] == ["slurm-token-stale"]
    assert "kubectl -n slurm annotate token tok" in sent[0].text and sent[0].severity == "critical"
    assert metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 1
    src.value = tok(now[0])  # minted again (someone nudged the Token)
    now[0] += 30
    assert src.token() == src.value  # a stale token's Secret is read again, not only near expiry
    assert metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 0
    assert len(sent) == 1
