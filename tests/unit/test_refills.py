"""Spares kept at their declared count: a failed refill asked again with backoff (paged once), the provider's
no read at once, no request asked for a node the pool does not lack, a retirement that asks for a
replacement when the heal's request failed, the surplus given back, and the waiting job's node repaired in
place by default. Core tables first, then the real runtime on the unit fakes."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core import refills, surplus
from gpufleet.reconciler.core.actions import GiveBack, Notify, RequestCapacity, ReturnToSpares, SettleRefill
from gpufleet.reconciler.core.decide import plan_step
from gpufleet.reconciler.core.model import Refill, RefillState, StepFacts, Stock
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import retire
from gpufleet.reconciler.core.repair_actions import Retire
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.unit.fakes import World, fleet, pool_node
from tests.unit.test_decide import T0, node, rec, spec

# What cluster-autoscaler 1.32.0 writes on a pod it cannot help (processors/status/eventing_scale_up_processor.go:
# "pod didn't trigger scale-up: %s", ReasonsMessage counting each reason over the node groups;
# core/scaleup/orchestrator/skippedreasons.go MaxLimitReachedReason).
MAX_SIZE = "pod didn't trigger scale-up: 1 max node group size reached"


def failed_refill(attempt=1, at=T0):
    r = rec(node("h100-0", xid=79), Phase.SUCCEEDED, replacement="h100-spare-0")
    f = Refill(refills.attempt_key(f"{r.name}/refill", attempt), RefillState.REQUESTED, at, "refill", attempt)
    return replace(r, refill=f)


# --- the provider's no, read at once ------------------------------------------------------------------

def test_the_autoscalers_no_fails_the_refill_at_once_with_its_words_in_the_record_and_the_page():
    r = failed_refill()
    name = refills.request_name("h100", r.refill.key)
    st = refills.settle(r, (), spec(), T0 + timedelta(seconds=12), refusals={name: MAX_SIZE})
    assert st is not None and st.remediation.refill.state == RefillState.FAILED
    assert MAX_SIZE in st.remediation.refill.message and st.remediation.refill.retry_at == T0 + timedelta(seconds=12) \
        + refills.RETRY_FIRST
    settle, page = st.actions
    assert isinstance(settle, SettleRefill) and settle.outcome == RefillState.FAILED
    assert isinstance(page, Notify) and page.event == "refill-failed" and MAX_SIZE in page.text


def test_an_outstanding_refill_is_looked_at_often_not_only_at_its_deadline():
    r = failed_refill()
    assert refills.next_look(r, spec(), T0) == refills.ANSWER_LOOK


def test_the_refusal_reader_takes_the_newest_not_trigger_scale_up_of_gpufleets_requests_only():
    name = refills.request_name("h100", "x/refill")
    events = [
        {"reason": "NotTriggerScaleUp", "involvedObject": {"kind": "Pod", "name": name},
         "lastTimestamp": "2026-12-06T01:00:00Z", "message": "pod didn't trigger scale-up: 1 in backoff after failed scale-up"},
        {"reason": "NotTriggerScaleUp", "involvedObject": {"kind": "Pod", "name": name},
         "lastTimestamp": "2026-12-06T01:00:10Z", "message": MAX_SIZE},
        {"reason": "TriggeredScaleUp", "involvedObject": {"kind": "Pod", "name": "gpufleet-refill-other"}, "message": "x"},
        {"reason": "NotTriggerScaleUp", "involvedObject": {"kind": "Pod", "name": "someone-elses"}, "message": "x"},
    ]
    assert refills.pool_refusals(events) == {name: MAX_SIZE}
    assert refills.pool_refusals(events, ["gpufleet-refill-none"]) == {}


# --- asked again with backoff, paged once ------------------------------------------------------------

def test_a_failed_refill_is_asked_again_under_a_new_key_at_its_backoff_while_the_pool_lacks_a_node():
    r = failed_refill()
    _, failed = refills.failed(r, r.refill, "no room", T0)
    assert failed.refill.retry_at == T0 + refills.RETRY_FIRST
    short = Stock(declared=2, spares=1, requested=0, waiting=0)
    assert refills.settle(failed, (), spec(), T0 + refills.RETRY_FIRST - timedelta(seconds=1), stock_now=short) is None
    st = refills.settle(failed, (), spec(), T0 + refills.RETRY_FIRST, stock_now=short)
    (ask,) = st.actions
    assert ask == RequestCapacity("h100", "asked again for pool h100 (attempt 2)", f"{r.name}/refill/2")
    assert st.remediation.refill.state == RefillState.REQUESTED and st.remediation.refill.attempt == 2


def test_a_refill_that_keeps_failing_backs_off_doubling_and_pages_only_once():
    r = failed_refill()
    actions, r = refills.failed(r, r.refill, "no room", T0)
    r = replace(r, intents=r.intents + tuple(a.once for a in actions if a.once))  # the runtime notes the page
    assert [a.event for a in actions if isinstance(a, Notify)] == ["refill-failed"]
    now = T0 + refills.RETRY_FIRST
    st = refills.settle(r, (), spec(), now, stock_now=Stock(2, 0, 0, 0), can_refill=False, refusal="at MaxSize 4")
    assert [a.kind for a in st.actions] == ["SettleRefill"]  # failed again: no second page
    assert st.remediation.refill.attempt == 2 and st.remediation.refill.retry_at == now + 2 * refills.RETRY_FIRST
    assert "at MaxSize 4" in st.remediation.refill.message
    assert refills.backoff(10) == refills.RETRY_MAX


def test_a_failed_refill_the_pool_no_longer_needs_is_not_asked_again():
    r = failed_refill()
    _, r = refills.failed(r, r.refill, "no room", T0)
    st = refills.settle(r, (), spec(), T0 + refills.RETRY_FIRST, stock_now=Stock(2, 2, 0, 0))
    assert st.actions == () and st.remediation.refill.state == RefillState.ANSWERED
    assert "not asked again" in st.remediation.refill.message and refills.due(st.remediation, spec()) is None


# --- no request for a node the pool does not lack ---------------------------------------------------

def test_a_heal_asks_for_no_node_when_the_pools_spares_and_outstanding_requests_cover_its_count():
    r = rec(node("h100-0", xid=79), Phase.REPLACING, replacement="h100-spare-0")
    full = Stock(declared=2, spares=1, requested=1, waiting=0)  # another record's request stands for the spare
    st = plan_step(r, StepFacts(stock=full), spec(), T0)
    assert "RequestCapacity" not in [a.kind for a in st.actions]
    assert st.remediation.refill.state == RefillState.ANSWERED and "lacks no node" in st.remediation.refill.message
    short = Stock(declared=2, spares=1, requested=0, waiting=0)
    st = plan_step(r, StepFacts(stock=short), spec(), T0)
    assert RequestCapacity("h100", "refill the spare used for h100-0", f"{r.name}/refill") in st.actions


def test_the_stock_counts_neither_the_records_chosen_spare_nor_anothers_nor_a_faulted_spare():
    me = rec(node("h100-0", xid=79), Phase.REPLACING, replacement="h100-spare-0")
    other = replace(rec(node("h100-1", xid=79), Phase.RESUMING, replacement="h100-spare-1"),
                    refill=Refill("k", RefillState.REQUESTED, T0))
    waiting = rec(node("h100-2", xid=79), Phase.WAITING_FOR_SPARE)
    nodes = [node(f"h100-spare-{i}", role=labels.ROLE_SPARE) for i in range(3)] + \
        [node("h100-spare-3", role=labels.ROLE_SPARE, xid=48)]
    s = refills.stock(spec().pool("h100"), nodes, [me, other, waiting], me, spec(), T0)
    assert s == Stock(declared=2, spares=1, requested=1, waiting=1)
    assert s.lacks() == 1


def test_an_aws_request_counts_as_outstanding_only_while_its_instance_may_be_joining():
    """aws-asg's requests are answered by the group at once and settled by nothing: one that stood for ever
    would make the pool look covered for good."""
    aws = parse_fleet({"environment": "t", "cluster": {"kind": "local"},
                       "pools": [{"name": "h100", "node_type": "p5.48xlarge", "gpu_model": "H100", "nodes": 4,
                                  "spares": 1, "provider": "aws-asg",
                                  "aws": {"asg_name": "g", "region": "us-east-1"}}],
                       "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]}})
    me = rec(node("h100-0", xid=79), Phase.REPLACING, replacement="h100-spare-0")
    old = replace(rec(node("h100-1", xid=79), Phase.SUCCEEDED), refill=Refill("k", RefillState.REQUESTED, T0))
    timeout = timedelta(seconds=aws.healing.refill_timeout_seconds)
    assert refills.stock(aws.pool("h100"), [], [me, old], me, aws, T0 + timeout / 2).requested == 1
    assert refills.stock(aws.pool("h100"), [], [me, old], me, aws, T0 + timeout).requested == 0


# --- a retirement asks for a replacement ------------------------------------------------------------

def test_a_retirement_asks_for_a_node_when_the_heals_request_failed():
    r = failed_refill()
    _, r = refills.failed(r, r.refill, "max node group size reached", T0)
    r = replace(r, intents=(f"capacity:{r.refill.key}",))  # the heal had asked
    st = retire(r, None, T0 + timedelta(hours=1), "a lemon")
    (act,) = [a for a in st.actions if isinstance(a, Retire)]
    assert act.refill == f"{r.name}/retire"
    assert st.remediation.refill.state == RefillState.REQUESTED and st.remediation.refill.key == f"{r.name}/retire"


def test_a_retirement_asks_for_nothing_while_the_heals_request_stands_or_was_answered():
    for state in (RefillState.REQUESTED, RefillState.ANSWERED):
        r = replace(failed_refill(), refill=Refill("k", state, T0))
        (act,) = [a for a in retire(r, None, T0, "a lemon").actions if isinstance(a, Retire)]
        assert act.refill is None


# --- the surplus given back ----------------------------------------------------------------------------

def pool_spec(provider="kubernetes-spares", spares=2):
    return parse_fleet({"environment": "t", "cluster": {"kind": "local"},
                        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": spares}],
                        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]}}).pool("h100")


def test_a_pool_above_its_declared_spares_gives_back_the_surplus_never_a_lent_claimed_or_serving_node():
    pool = pool_spec(spares=1)
    nodes = [node("h100-0"), node("h100-spare-0", role=labels.ROLE_SPARE, lent="spare"),
             node("h100-spare-1", role=labels.ROLE_SPARE), node("h100-spare-2", role=labels.ROLE_SPARE),
             node("h100-spare-3", role=labels.ROLE_SPARE)]
    claimed = rec(node("h100-1", xid=79), Phase.REPLACING, replacement="h100-spare-3")
    out = surplus.plan(pool, nodes, [claimed])
    assert out == (GiveBack("h100-spare-2", "h100", "surplus: pool h100 has 3 spares, 1 wanted (1 declared)"),
                   GiveBack("h100-spare-1", "h100", "surplus: pool h100 has 3 spares, 1 wanted (1 declared)"))


def test_no_surplus_while_remediations_wait_for_spares_and_a_node_given_back_comes_back_when_short():
    pool = pool_spec(spares=1)
    spares = [node("h100-spare-0", role=labels.ROLE_SPARE), node("h100-spare-1", role=labels.ROLE_SPARE)]
    waiting = rec(node("h100-1", xid=79), Phase.WAITING_FOR_SPARE)
    assert surplus.plan(pool, spares, [waiting]) == ()
    given = node("h100-spare-1", role=labels.ROLE_SURPLUS)
    assert surplus.plan(pool, [given], []) == (ReturnToSpares("h100-spare-1", "h100"),)
    assert surplus.plan(pool, [spares[0], given], []) == ()


def test_a_refill_that_joins_before_the_heal_promotes_a_spare_is_not_given_back():
    """The demo's order: the heal asked for a node while it was evicting; the node joined before the heal chose
    its spare. That heal is on its way to a spare, so the new node is wanted, not a surplus."""
    pool = pool_spec(spares=2)
    spares = [node(f"h100-spare-{i}", role=labels.ROLE_SPARE) for i in range(3)]
    for phase in (Phase.EVICTING, Phase.REPLACING):
        assert surplus.plan(pool, spares, [rec(node("h100-1", xid=79), phase)]) == (), phase
    chosen = rec(node("h100-1", xid=79), Phase.RESUMING, replacement="h100-spare-0")
    assert surplus.plan(pool, spares, [chosen]) == ()  # its replacement is not a free spare either
    assert len(surplus.plan(pool, spares, [])) == 1  # with no heal under way, one is a surplus


# --- the waiting job's node repaired in place, by default -------------------------------------------------

def test_with_no_spare_free_the_waiting_jobs_node_is_repaired_in_place_by_default():
    w = World(fleet(nodes=2, spares=0, grace_period_seconds=0), operator=True)
    w.hardware.state["h100-0"] = w.hardware.RESET_FIXES
    w.fault("h100-0", xid=48)
    w.run(seconds=30)
    r = w.remediation("h100-0")
    assert r.repair is not None and r.repair.in_place, (r.phase, r.repair)
    w.run(seconds=1200, step=5)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-0"


def test_the_spec_can_forbid_repairing_the_waiting_jobs_node_in_place():
    s = fleet(nodes=2, spares=0, grace_period_seconds=0)
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(
        update={"repair": s.pools[0].repair.model_copy(update={"in_place": False})})]})
    w = World(s, operator=True)
    w.fault("h100-0", xid=48)
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.phase is Phase.WAITING_FOR_SPARE and r.repair is None


# --- the real runtime ----------------------------------------------------------------------------------

def test_a_refill_the_autoscaler_refuses_is_failed_at_once_withdrawn_paged_once_and_asked_again_later():
    w = World(fleet(grace_period_seconds=0, refill_timeout_seconds=1800, repair={"enabled": False}))  # stays short
    said: dict[str, str] = {}
    w.provider.capacity_refusals = lambda pool, names: {n: said[n] for n in names if n in said}
    w.fault("h100-0")
    w.run(seconds=2)
    r = w.remediation("h100-0")
    assert r.refill.state == "Requested"
    said[refills.request_name("h100", r.refill.key)] = MAX_SIZE
    w.run(seconds=refills.ANSWER_LOOK + 1)
    r = w.remediation("h100-0")
    assert r.refill.state == "Failed" and MAX_SIZE in r.refill.message, r.refill
    assert ("withdraw", f"{r.name}/refill") in w.provider.calls
    assert w.notifier.sent.count("refill-failed") == 1 and MAX_SIZE in w.notifier.texts["refill-failed"][0]
    condition = {c["type"]: c for c in json.loads(w.store.objects[r.name])["status"]["conditions"]}["Refilled"]
    assert (condition["status"], condition["reason"]) == ("False", "RefillFailed") and MAX_SIZE in condition["message"]
    said[refills.request_name("h100", f"{r.name}/refill/2")] = MAX_SIZE
    w.restart()  # a reconciler that restarts neither asks twice nor forgets
    w.run(seconds=refills.RETRY_FIRST.total_seconds() + 30, step=5)
    asks = [c[1] for c in w.provider.calls if c[0] == "capacity"]
    assert asks == [f"{r.name}/refill", f"{r.name}/refill/2"], asks
    r = w.remediation("h100-0")
    assert r.refill.state == "Failed" and r.refill.attempt == 2
    assert w.notifier.sent.count("refill-failed") == 1


def test_a_repaired_node_that_makes_a_surplus_is_given_back_by_the_membership_pass():
    w = World(fleet(nodes=4, spares=1, grace_period_seconds=0))
    w.kube.nodes["h100-spare-9"] = pool_node(w.spec.pool("h100"), "h100-spare-9", labels.ROLE_SPARE)
    w.run(seconds=31)
    roles = {n: w.kube.nodes[n]["metadata"]["labels"][labels.ROLE] for n in ("h100-spare-0", "h100-spare-9")}
    assert sorted(roles.values()) == [labels.ROLE_SPARE, labels.ROLE_SURPLUS], roles
    assert [a for a in (w.kube.nodes[n]["metadata"]["labels"][labels.ROLE] for n in w.kube.nodes)
            ].count(labels.ROLE_ACTIVE) == 4



@pytest.mark.parametrize("crash_at", range(1, 7))  # 6: no crash (the run ends first)
def test_a_refill_asked_again_across_a_crash_at_every_point_is_asked_once_per_key_and_never_forgotten(crash_at):
    """The reconciler killed at its n-th call while a failed refill is asked again (a write, the request, its
    withdrawal, a page), restarted, run on: no key is asked twice, the failure paged at most once, and the
    record still knows its refill (asked, or failed with the time it is asked again)."""
    from tests.unit.test_crashes import crash_after

    w = World(fleet(grace_period_seconds=0, refill_timeout_seconds=60, repair={"enabled": False}))
    w.provider.capacity_refusals = lambda pool, names: {n: MAX_SIZE for n in names}  # every request refused
    w.fault("h100-0")
    w.run(seconds=refills.ANSWER_LOOK + 3)
    assert w.remediation("h100-0").refill.state == "Failed"
    calls = [(w.store, "write_status"), (w.provider, "request_capacity"), (w.provider, "withdraw_capacity_request"),
             (w.notifier, "send")]
    crash_after(w, crash_at, calls, refills.RETRY_FIRST.total_seconds() + 20, lambda: {})
    w.provider.capacity_refusals = lambda pool, names: {n: MAX_SIZE for n in names}
    w.run(seconds=3 * refills.RETRY_FIRST.total_seconds(), step=5)
    asks = [c[1] for c in w.provider.calls if c[0] == "capacity"]
    assert len(asks) == len(set(asks)) and len(asks) >= 2, asks
    assert w.notifier.sent.count("refill-failed") <= 1
    f = w.remediation("h100-0").refill
    assert f.attempt >= 2 and (f.state == "Requested" or (f.state == "Failed" and f.retry_at is not None)), f


def test_a_second_heal_asks_for_no_node_while_the_first_ones_request_covers_what_the_pool_lacks():
    """No pile-up: h100-0's heal took a spare and asked for one; a node joins meanwhile (a person, a late
    answer), so when h100-1's heal takes the other spare the pool lacks one node, which the standing request
    covers: the second record asks for nothing and says so."""
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"enabled": False}))
    w.fault("h100-0")
    w.run(seconds=2)
    w.kube.nodes["h100-spare-9"] = pool_node(w.spec.pool("h100"), "h100-spare-9", labels.ROLE_SPARE)
    w.fault("h100-1")
    w.run(seconds=3)
    first, second = w.remediation("h100-0"), w.remediation("h100-1")
    assert second.replacement is not None and second.phase in (Phase.RESUMING, Phase.SUCCEEDED)
    assert [c[1] for c in w.provider.calls if c[0] == "capacity"] == [f"{first.name}/refill"]
    assert second.refill.state == "Answered" and "lacks no node" in second.refill.message, second.refill


def test_the_no_spare_page_says_the_node_is_repaired_in_place_and_what_covers_the_pool():
    r = rec(node("h100-0", xid=79), Phase.REPLACING)
    covered = Stock(declared=1, spares=0, requested=2, waiting=0)
    st = plan_step(r, StepFacts(stock=covered), spec(), T0)
    (page,) = [a for a in st.actions if isinstance(a, Notify)]
    assert page.event == "no-spare" and "RequestCapacity" not in [a.kind for a in st.actions]
    assert "standing capacity requests cover it" in page.text
    assert "h100-0 itself is repaired in place meanwhile and takes its job back" in page.text
    assert page.text.endswith("No action needed now.")  # the last sentence says whether a person must act
    st = plan_step(r, StepFacts(stock=Stock(declared=1, spares=0, requested=0, waiting=0)), spec(), T0)
    (page,) = [a for a in st.actions if isinstance(a, Notify)]
    assert "capacity is requested" in page.text and "RequestCapacity" in [a.kind for a in st.actions]


def test_a_node_retired_after_its_heals_refill_was_refused_asks_for_its_replacement():
    """The heal's request was refused (the autoscaler's no): when the repair loop then retires the node, the
    retirement asks for the node the pool still lacks, and the record follows that request."""
    from tests.unit.fakes import FakeNodes

    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0), operator=True)
    w.provider.capacity_refusals = lambda pool, names: {n: MAX_SIZE for n in names if n.endswith(
        refills.request_name("h100", f"{w.store.list()[0].name}/refill")[-10:])}
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.fault("h100-0")
    w.run(seconds=400)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED
    assert ("capacity", f"{r.name}/retire") in w.provider.calls
    assert r.refill.key == f"{r.name}/retire" and r.refill.state == "Requested" and r.refill.attempt == 2
