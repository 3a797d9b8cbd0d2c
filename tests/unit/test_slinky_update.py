"""The stand-in's NodeSet scale and update decisions against slurm-operator v1.2.1's own tests: the cases of
internal/controller/nodeset/utils/sort_test.go (TestSortingActivePods, Test_afterOrZero, TestSplitActivePods,
TestSplitUnhealthyPods), each sorted from 20 shuffles as upstream does, and splitUpdatePods' budget
(nodeset_sync.go) and syncNodeSetPods' lowest free ordinal."""
from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import pytest

from localenv.slinky_update import (
    POD_CORDON_ANNOTATION, POD_DEADLINE_ANNOTATION, POD_DELETION_COST_ANNOTATION, PodFacts, _after_or_zero,
    find_updated, free_ordinals, revision, sort_active, split_active, split_unhealthy, split_update,
)

NOW = time.time()
THEN = NOW - 31 * 86400  # now.AddDate(0, -1, 0)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(int(t), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(name: str, annotations: dict[str, str] | None = None, **kw) -> PodFacts:
    """newRunningPod: on node foo, Running, Ready (no transition time)."""
    return PodFacts(name, "foo", "Running", True, annotations=tuple((annotations or {}).items()), **kw)


def assert_order(pods: list[PodFacts], want: list[str]) -> None:
    for _ in range(20):
        shuffled = random.sample(pods, len(pods))
        assert [p.name for p in sort_active(shuffled)] == want


def test_sorts_by_active_pod() -> None:
    """sort_test.go TestSortingActivePods "Sorts by active pod"."""
    pods = [
        PodFacts("unscheduled", "", "Pending"),
        PodFacts("scheduledButPending", "bar", "Pending"),
        PodFacts("unknownPhase", "foo", "Unknown"),
        PodFacts("runningButNotReady", "foo", "Running"),
        PodFacts("runningNoLastTransitionTime", "foo", "Running", True),
        PodFacts("runningWithLastTransitionTime", "foo", "Running", True, ready_since=NOW),
        PodFacts("runningLongerTime", "foo", "Running", True, ready_since=THEN),
        PodFacts("oldest", "foo", "Running", True, ready_since=THEN, created=THEN),
        running("runningWithCost", {POD_DELETION_COST_ANNOTATION: "1"}),
        running("runningWithCordon", {POD_CORDON_ANNOTATION: "True"}),
        running("runningWithOrdinal-1"),
        running("runningWithDeadline", {POD_DEADLINE_ANNOTATION: rfc3339(NOW)}),
    ]
    assert_order(pods, ["unscheduled", "scheduledButPending", "unknownPhase", "runningButNotReady",
                        "runningWithCordon", "runningWithOrdinal-1", "runningNoLastTransitionTime",
                        "runningWithLastTransitionTime", "runningLongerTime", "oldest", "runningWithDeadline",
                        "runningWithCost"])


@pytest.mark.parametrize("pods,want", [
    pytest.param([running("ordinal-0"), running("ordinal-1"), running("ordinal-2")],
                 ["ordinal-2", "ordinal-1", "ordinal-0"], id="Sort ordinals"),
    pytest.param([running("regular"), running("podCordon", {POD_CORDON_ANNOTATION: "True"})],
                 ["podCordon", "regular"], id="Sort cordon"),
    pytest.param([running("cordon-0", {POD_CORDON_ANNOTATION: "True"}), running("cordon-1", {POD_CORDON_ANNOTATION: "True"})],
                 ["cordon-1", "cordon-0"], id="Sort cordon by ordinal"),
    pytest.param([running("noDeadline"),
                  running("deadlineBefore", {POD_DEADLINE_ANNOTATION: rfc3339(NOW - 3600)}),
                  running("deadlineNow", {POD_DEADLINE_ANNOTATION: rfc3339(NOW)}),
                  running("deadlineLater", {POD_DEADLINE_ANNOTATION: rfc3339(NOW + 3600)})],
                 ["noDeadline", "deadlineBefore", "deadlineNow", "deadlineLater"], id="Sort deadlines"),
    pytest.param([running("costNeg10", {POD_DELETION_COST_ANNOTATION: "-10"}), running("cost0"),
                  running("costPos10", {POD_DELETION_COST_ANNOTATION: "10"})],
                 ["costNeg10", "cost0", "costPos10"], id="Sort deletion cost"),
    pytest.param([
        running("ordinal-0"), running("ordinal-1"),
        running("deadlineNow", {POD_DEADLINE_ANNOTATION: rfc3339(NOW)}),
        running("deadlineLater", {POD_DEADLINE_ANNOTATION: rfc3339(NOW + 3600)}),
        running("podCordoned", {POD_CORDON_ANNOTATION: "True"}),
        running("podCordonedAndDeadlineNow", {POD_CORDON_ANNOTATION: "True", POD_DEADLINE_ANNOTATION: rfc3339(NOW)}),
        running("podCordonedAndDeadlineLater", {POD_CORDON_ANNOTATION: "True",
                                                POD_DEADLINE_ANNOTATION: rfc3339(NOW + 3600)}),
        running("deletionCostNeg10", {POD_DELETION_COST_ANNOTATION: "-10"}),
        running("deletionCostPos10", {POD_DELETION_COST_ANNOTATION: "1"}),
        running("cordonedDeadlineCost100", {POD_CORDON_ANNOTATION: "True", POD_DEADLINE_ANNOTATION: rfc3339(NOW),
                                            POD_DELETION_COST_ANNOTATION: "100"}),
    ], ["deletionCostNeg10", "podCordoned", "ordinal-1", "ordinal-0", "podCordonedAndDeadlineNow", "deadlineNow",
        "podCordonedAndDeadlineLater", "deadlineLater", "deletionCostPos10", "cordonedDeadlineCost100"], id="Sort mixed"),
])
def test_sorting_active_pods(pods, want) -> None:
    """sort_test.go TestSortingActivePods, the other cases."""
    assert_order(pods, want)


def test_invalid_annotations_read_as_upstream_reads_them() -> None:
    """structutils/map.go: '+10' and '008' are no number (cost 0), a bad time is the zero time (no deadline)."""
    assert_order([running("plus-1", {POD_DELETION_COST_ANNOTATION: "+10"}), running("zero-0")], ["plus-1", "zero-0"])
    assert_order([running("lead-0", {POD_DELETION_COST_ANNOTATION: "008"}), running("neg-1",
                                                                                   {POD_DELETION_COST_ANNOTATION: "-1"})],
                 ["neg-1", "lead-0"])
    assert_order([running("bad-0", {POD_DEADLINE_ANNOTATION: "soon"}),
                  running("later-1", {POD_DEADLINE_ANNOTATION: rfc3339(NOW)})], ["bad-0", "later-1"])


@pytest.mark.parametrize("t1,t2,want", [(None, None, True), (0.0, 0.0, False), (10.0, 0.0, True), (0.0, 10.0, False)],
                         ids=["unit time", "equal, not zero", "after", "before"])
def test_after_or_zero(t1, t2, want) -> None:
    """sort_test.go Test_afterOrZero (Go's zero time is None here; time.Unix(0, 0) is not zero)."""
    assert _after_or_zero(t1, t2) is want


@pytest.mark.parametrize("partition,first,rest", [(0, [], ["foo-1", "foo-0"]), (1, ["foo-1"], ["foo-0"]),
                                                  (2, ["foo-1", "foo-0"], [])])
def test_split_active_pods(partition, first, rest) -> None:
    """sort_test.go TestSplitActivePods (pods with no status: Pending, unassigned alike)."""
    a, b = split_active([PodFacts("foo-0"), PodFacts("foo-1")], partition)
    assert ([p.name for p in a], [p.name for p in b]) == (first, rest)
    assert split_active([], 0) == ([], [])


def test_split_unhealthy_partitions_by_health_not_age() -> None:
    """sort_test.go TestSplitUnhealthyPods "healthy pod older than unhealthy pod"."""
    unhealthy, healthy = split_unhealthy([PodFacts("pod-unhealthy", phase="Pending", created=NOW),
                                          PodFacts("pod-healthy", phase="Running", ready=True, created=THEN)])
    assert [p.name for p in unhealthy] == ["pod-unhealthy"] and [p.name for p in healthy] == ["pod-healthy"]


def test_scale_out_takes_the_lowest_free_ordinals() -> None:
    """syncNodeSetPods: usedOrdinals from every pod (a terminating one too), then the lowest free."""
    assert free_ordinals({0, 2, 3}, 3) == [1, 4, 5]
    assert free_ordinals(set(), 2) == [0, 1]


def ns_spec(replicas: int, **strategy) -> dict:
    return {"replicas": replicas, "updateStrategy": strategy} if strategy else {"replicas": replicas}


def old(name: str, **kw) -> PodFacts:
    return PodFacts(name, "n", "Running", True, revision="old", **kw)


def test_rolling_update_condemns_a_quarter_by_default_highest_ordinal_first() -> None:
    """splitUpdatePods: maxUnavailable 25 % of 8 replicas is 2; ActivePods order: the highest ordinals."""
    pods = [old(f"p-{i}") for i in range(8)]
    condemned, kept = split_update(ns_spec(8), pods, "new", NOW)
    assert [p.name for p in condemned] == ["p-7", "p-6"]
    assert {p.name for p in kept} == {f"p-{i}" for i in range(6)}
    # 25 % of 2 rounds up to 1
    assert [p.name for p in split_update(ns_spec(2), pods[:2], "new", NOW)[0]] == ["p-1"]


def test_rolling_update_counts_new_pods_not_ready_and_missing_slots_against_the_budget() -> None:
    """splitUpdatePods: a new pod not available, and a replica slot with no live pod, each use the budget."""
    pods = [old("p-0"), old("p-1"), old("p-2"), PodFacts("p-3", "n", "Running", False, revision="new")]
    assert split_update(ns_spec(4), pods, "new", NOW)[0] == []  # budget 1, one new pod not Ready
    missing = [old("p-0"), old("p-1"), old("p-2")]  # p-3 terminating: gone from the list
    assert split_update(ns_spec(4, type="RollingUpdate", rollingUpdate={"maxUnavailable": 2}), missing, "new",
                        NOW)[0] == [missing[2]]
    ready_new = PodFacts("p-3", "n", "Running", True, ready_since=NOW - 5, revision="new")
    assert split_update({**ns_spec(4), "minReadySeconds": 10}, pods[:3] + [ready_new], "new", NOW)[0] == []
    assert [p.name for p in split_update({**ns_spec(4), "minReadySeconds": 3}, pods[:3] + [ready_new], "new",
                                         NOW)[0]] == ["p-2"]


def test_rolling_update_leaves_unhealthy_old_pods_to_the_caller_and_on_delete_condemns_none() -> None:
    """splitUpdatePods: unhealthy old pods are neither budget nor candidates (syncRollingUpdate deletes them
    apart); OnDelete returns nothing; ScheduledUpdate is refused (not modelled)."""
    pods = [old("p-0"), PodFacts("p-1", "n", "Pending", revision="old")]
    assert [p.name for p in split_update(ns_spec(2), pods, "new", NOW)[0]] == ["p-0"]
    assert split_update(ns_spec(2, type="OnDelete"), pods, "new", NOW) == ([], [])
    with pytest.raises(ValueError, match="ScheduledUpdate"):
        split_update(ns_spec(2, type="ScheduledUpdate"), pods, "new", NOW)
    new, olds = find_updated([old("a-0"), PodFacts("a-1", revision="new"), old("a-2", terminating=True)], "new")
    assert [p.name for p in new] == ["a-1"] and [p.name for p in olds] == ["a-0"]


def test_revision_changes_with_what_getpatch_records_only() -> None:
    """nodeset_history.go getPatch: template, slurmd, extraConf make a revision; replicas do not."""
    base = {"spec": {"replicas": 2, "template": {"spec": {}}, "slurmd": {"image": "a"}, "extraConf": ""}}
    assert revision(base) == revision({"spec": {**base["spec"], "replicas": 5}})
    for change in ({"slurmd": {"image": "b"}}, {"extraConf": "Weight=2"}, {"template": {"spec": {"x": 1}}}):
        assert revision({"spec": {**base["spec"], **change}}) != revision(base)
