"""When the Slinky Token has stopped refreshing the reconciler's token (slurm-operator v1.2.1, fixed after
it: reconciler/core/slurm_token.py), and that it is said once: a gauge, one page per episode."""
from __future__ import annotations

import jwt
from prometheus_client import CollectorRegistry

from gpufleet.reconciler.adapters.notify import Message
from gpufleet.reconciler.adapters.slurm.rest import KeptToken
from gpufleet.reconciler.core.slurm_token import NUDGE_EVERY_S, NUDGE_GRACE_S, TokenState, TokenWatch, assess, condition
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


def test_an_episode_nudges_at_once_and_again_and_pages_once_only_when_the_nudge_cannot_help() -> None:
    w = TokenWatch()
    stale, fresh = assess(T0 + 60, T0 - 840, T0), assess(T0 + 900, T0, T0)
    w, s1 = w.step(stale, T0)
    w, s2 = w.step(stale, T0 + 10)
    w, s3 = w.step(stale, T0 + NUDGE_EVERY_S)  # not answered: nudged again
    assert (s1.nudge, s2.nudge, s3.nudge) == (True, False, True)
    assert not (s1.page or s2.page or s3.page)  # the nudge may still help
    w, s4 = w.step(assess(T0 - 1, T0 - 901, T0 + NUDGE_GRACE_S), T0 + NUDGE_GRACE_S)  # expired, still stale
    w, s5 = w.step(stale, T0 + NUDGE_GRACE_S + 1)
    assert (s4.page, s5.page) == (True, False)  # one page per episode
    w, s6 = w.step(fresh, T0 + 200)
    assert s6.recovered and not s6.page and not s6.nudge
    w, s7 = w.step(stale, T0 + 300)
    assert s7.nudge and not s7.page  # a new episode
    # No Token to nudge (or the nudge was refused): nothing here can help, the page goes out at once.
    _, s8 = TokenWatch().step(stale, T0, can_nudge=False)
    assert s8.page and not s8.nudge


def test_the_condition_says_what_was_done_and_differs_with_each_nudge() -> None:
    stale = assess(T0 + 60, T0 - 840, T0)
    c1, c2 = condition(stale, "t1", "t0", 1), condition(stale, "t2", "t0", 2)
    assert c1["type"] == "SlurmTokenFresh" and c1["status"] == "False" and c1["reason"] == "Overdue"
    assert c1["lastTransitionTime"] == "t0" and c1 != c2  # each nudge is a change of the object
    assert condition(assess(T0 - 5, T0 - 905, T0), "t", "t", 1)["reason"] == "Expired"
    assert condition(assess(T0 + 900, T0, T0), "t", "t", 0)["status"] == "True"


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


def _alarm_world(nudge):
    now = [T0]
    clock = lambda: now[0]  # noqa: E731
    sent: list[Message] = []
    metrics = Metrics(CollectorRegistry())
    src = Source(clock)
    src.observer = TokenAlarm(metrics, sent.append, src.describe(), clock, token_ref=("slurm", "tok"),
                              nudge=nudge).observe
    src.value = tok(T0)
    src.token()
    return now, sent, metrics, src


def test_a_stale_token_is_nudged_and_recovers_without_a_page() -> None:
    written: list[dict] = []
    now, sent, metrics, src = _alarm_world(written.append)
    now[0] = T0 + 800
    src.token()
    assert [c["status"] for c in written] == ["False"] and written[0]["nudges"] == 1
    assert metrics.registry.get_sample_value("gpufleet_slurm_token_nudges_total") == 1
    src.value = tok(now[0])  # the operator reconciled the Token and minted again
    now[0] += 30
    src.token()
    assert [c["status"] for c in written] == ["False", "True"]  # the condition lowered
    assert sent == [] and metrics.registry.get_sample_value("gpufleet_slurm_token_stale") == 0


def test_a_nudge_that_cannot_help_pages_once_saying_what_was_done() -> None:
    written: list[dict] = []
    now, sent, metrics, src = _alarm_world(written.append)
    now[0] = T0 + 800
    for _ in range(20):  # the operator is down: never minted again
        src.token()
        now[0] += 10
    assert len(sent) == 1 and "nudged Token slurm/tok" in sent[0].text and "is the operator running" in sent[0].text
    assert len(written) == 4  # at +0, +60, +120 and +180 s of the episode (NUDGE_EVERY_S), all unanswered


def test_a_refused_nudge_pages_at_once() -> None:
    def refused(_: dict) -> None:
        raise RuntimeError("HTTP 403 Forbidden")
    now, sent, metrics, src = _alarm_world(refused)
    now[0] = T0 + 800
    src.token()
    src.token()
    assert len(sent) == 1 and "could not nudge Token slurm/tok (HTTP 403 Forbidden)" in sent[0].text
