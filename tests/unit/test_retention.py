"""The retention rule (reconciler/core/retention.py): which finished records may be deleted."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import HealingSpec
from gpufleet.reconciler.core.model import Fault, NodeView, Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.retention import expired_records, keep_for

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
POLICY = HealingSpec(record_retention_days=30)  # attempts window 1 day, unhealthy window 15 min
POOLS = {"h100"}


def rec(name: str, node: str, phase: Phase, ended_days_ago: float, *, took: timedelta = timedelta(minutes=5),
        pool: str = "h100") -> Remediation:
    end = NOW - ended_days_ago * DAY
    return Remediation(name=name, node=node, pool=pool, xid=79, message="m", phase=phase, created=end - took,
                  phase_times=((Phase.DETECTED.value, end - took), (phase.value, end)))


def active(name: str, **kw) -> NodeView:
    return NodeView(name, "h100", labels.ROLE_ACTIVE, **kw)


def names(records) -> list[str]:
    return [r.name for r in records]


def test_spec_default_and_lower_bound():
    assert HealingSpec().record_retention_days == 30
    with pytest.raises(ValidationError, match="record_retention_days"):
        HealingSpec(record_retention_days=0)


def test_finished_records_older_than_the_retention_go_oldest_first_and_recent_ones_stay():
    records = [rec("b", "n1", Phase.SUCCEEDED, 40), rec("a", "n2", Phase.FAILED, 31), rec("c", "n3", Phase.SUCCEEDED, 29),
               rec("d", "n4", Phase.SUCCEEDED, 1)]
    assert names(expired_records(records, [active("n1"), active("n2"), active("n3"), active("n4")], POLICY, POOLS, NOW)) \
        == ["b", "a"]


def test_a_live_record_is_never_deleted_however_old():
    records = [rec(f"r-{p.value}", f"n-{p.value}", p, 400) for p in Phase if not p.terminal]
    assert expired_records(records, [], POLICY, POOLS, NOW) == ()


def test_age_counts_from_the_end_not_the_start():
    long_one = rec("long", "n1", Phase.SUCCEEDED, 29, took=timedelta(days=5))  # created 34 days ago, ended 29
    assert expired_records([long_one], [active("n1")], POLICY, POOLS, NOW) == ()


def test_a_window_longer_than_the_retention_keeps_what_it_counts():
    """The attempt cap, the storm brake and the lemon rule count records within their windows: none of those
    goes."""
    short_lemons = {"retire_window_seconds": 3600}
    policy = HealingSpec(record_retention_days=1, attempts_window_seconds=10 * 86400, unhealthy_window_seconds=900,
                         repair=short_lemons)
    assert keep_for(policy) == timedelta(days=10)
    records = [rec("counted", "n1", Phase.SUCCEEDED, 9), rec("old", "n2", Phase.SUCCEEDED, 11)]
    assert names(expired_records(records, [active("n1"), active("n2")], policy, POOLS, NOW)) == ["old"]
    policy = HealingSpec(record_retention_days=1, attempts_window_seconds=3600, unhealthy_window_seconds=3 * 86400,
                         repair=short_lemons)
    assert keep_for(policy) == timedelta(days=3)
    policy = HealingSpec(record_retention_days=1, attempts_window_seconds=3600, unhealthy_window_seconds=900,
                         repair={"retire_window_seconds": 14 * 86400})
    assert keep_for(policy) == timedelta(days=14)


def test_the_newest_record_of_a_quarantined_or_escalated_node_stays():
    records = [rec("q-old", "q", Phase.SUCCEEDED, 90), rec("q-new", "q", Phase.SUCCEEDED, 60),
               rec("e-old", "e", Phase.SUCCEEDED, 90), rec("e-new", "e", Phase.ESCALATED, 60),
               rec("x-old", "x", Phase.SUCCEEDED, 90), rec("x-new", "x", Phase.SUCCEEDED, 60)]
    nodes = [NodeView("q", "h100", labels.ROLE_QUARANTINED), active("e"), active("x")]
    assert sorted(names(expired_records(records, nodes, POLICY, POOLS, NOW))) == ["e-old", "q-old", "x-new", "x-old"]


def test_an_escalated_node_keeps_its_newest_record_even_when_the_node_is_gone():
    records = [rec("e-new", "gone", Phase.ESCALATED, 60), rec("e-old", "gone", Phase.FAILED, 90)]
    assert names(expired_records(records, [], POLICY, POOLS, NOW)) == ["e-old"]


def test_the_record_of_a_signal_still_on_its_node_stays():
    """Its name is the node and the signal: deleting it would let a stale condition start it again."""
    since = NOW - 60 * DAY
    stale = Remediation(name=f"n1-xid79-{int(since.timestamp())}", node="n1", pool="h100", xid=79, message="m",
                   phase=Phase.SUCCEEDED, created=since, phase_times=((Phase.SUCCEEDED.value, since),))
    other = rec("n1-older", "n1", Phase.SUCCEEDED, 90)
    node = active("n1", fault=Fault(79, "off the bus", since))
    assert names(expired_records([stale, other], [node], POLICY, POOLS, NOW)) == ["n1-older"]
    assert names(expired_records([stale, other], [active("n1")], POLICY, POOLS, NOW)) == ["n1-older", stale.name]


def test_records_of_another_fleets_pools_are_not_touched():
    assert expired_records([rec("theirs", "n1", Phase.SUCCEEDED, 400, pool="a100")], [], POLICY, POOLS, NOW) == ()
