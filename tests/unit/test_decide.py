"""The reconciler's pure core, table by table: no cluster, a fake clock."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from fleetspec import labels, parse_fleet
from reconciler.decide import detect, fail, plan_step
from reconciler.model import (
    DrainSlurm, EvictPods, Fault, JobView, NodeView, PromoteSpare, Quarantine, Record,
    RecordFacts, ReleaseJobs, RequestCapacity, RequeueJobs, ReturnToSpares, SignalJobs, record_name,
)
from reconciler.phases import InvalidTransition, Phase, check_transition

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def spec(**healing):
    return parse_fleet({
        "environment": "test",
        "cluster": {"kind": "local"},
        "pools": [
            {"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 10, "spares": 2},
            {"name": "a100", "node_type": "x", "gpu_model": "A100", "nodes": 4, "spares": 1},
        ],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100", "a100"]}]},
        "healing": {"max_concurrent": 2, "max_unhealthy_fraction": 0.3, **healing},
    })


def node(name, pool="h100", role=labels.ROLE_ACTIVE, xid=None, since=T0, **kw):
    fault = Fault(xid, f"Xid {xid}", since) if xid is not None else None
    return NodeView(name=name, pool=pool, role=role, fault=fault, **kw)


def rec(n: NodeView, phase=Phase.DETECTED, created=T0, **kw):
    return Record(
        name=record_name(n.name, n.fault), node=n.name, pool=n.pool, xid=n.fault.xid, message="m", phase=phase,
        created=created, phase_times=((phase.value, created),), **kw,
    )


# --- detect ------------------------------------------------------------------------------------

def test_critical_xid_starts_one_remediation():
    d = detect([node("h100-0", xid=79), node("h100-1")], [], spec(), T0)
    assert [s.record.node for s in d.started] == ["h100-0"]
    r = d.started[0].record
    assert (r.phase, r.xid, r.pool, r.name) == (Phase.DETECTED, 79, "h100", f"h100-0-xid79-{int(T0.timestamp())}")


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 999])
def test_application_or_unknown_xid_never_remediates(xid):
    assert detect([node("h100-0", xid=xid)], [], spec(), T0).started == ()


def test_repeated_signal_while_in_progress_is_one_record():
    n = node("h100-0", xid=79)
    live = rec(n, Phase.CHECKPOINTING)
    # the same signal, and a second fault on the same node, both collapse into the live record
    again = replace(n, fault=Fault(48, "second fault", T0 + timedelta(seconds=30)))
    assert detect([n], [live], spec(), T0 + timedelta(minutes=1)).started == ()
    assert detect([again], [live], spec(), T0 + timedelta(minutes=1)).started == ()


def test_stale_condition_after_success_does_not_start_again():
    n = node("h100-0", xid=79)
    done = rec(n, Phase.SUCCEEDED)
    assert detect([n], [done], spec(), T0 + timedelta(hours=1)).started == ()


def test_occurrences_threshold_counts_distinct_signals_in_window():
    s = spec(occurrences=2, occurrence_window_seconds=600)
    n = node("h100-0", xid=79, since=T0 + timedelta(seconds=100))
    assert detect([n], [], s, T0 + timedelta(seconds=100)).started == ()
    assert detect([n], [], s, T0 + timedelta(seconds=100), signals={"h100-0": (T0,)}).started != ()
    old = {"h100-0": (T0 - timedelta(hours=1),)}
    assert detect([n], [], s, T0 + timedelta(seconds=100), signals=old).started == ()


def test_healing_disabled_holds_everything():
    d = detect([node("h100-0", xid=79)], [], spec(enabled=False), T0)
    assert d.started == () and d.gates[0].reason == "HealingDisabled" and d.gates[0].held_nodes == ("h100-0",)


def test_max_concurrent_holds_the_rest_oldest_first():
    nodes = [node(f"h100-{i}", xid=79, since=T0 + timedelta(seconds=10 - i)) for i in range(3)]
    d = detect(nodes, [], spec(), T0 + timedelta(seconds=20))
    assert sorted(s.record.node for s in d.started) == ["h100-1", "h100-2"]  # the two oldest signals
    assert d.gates[0].reason == "MaxConcurrent" and d.gates[0].held_nodes == ("h100-0",)


def test_in_flight_remediations_count_against_max_concurrent_but_opted_out_do_not():
    a, b = node("h100-0", xid=79), node("h100-1", xid=79)
    c = node("h100-2", xid=79)
    d = detect([a, b, c], [rec(a, Phase.EVICTING), rec(b, Phase.OPTED_OUT)], spec(), T0)
    assert [s.record.node for s in d.started] == ["h100-2"]
    d = detect([a, b, c], [rec(a, Phase.EVICTING), rec(b, Phase.RESUMING)], spec(), T0)
    assert d.started == () and d.gates[0].reason == "MaxConcurrent"


@pytest.mark.parametrize("failing,expect_brake", [(1, False), (3, False), (4, True), (8, True)])
def test_storm_brake_engages_above_the_fraction(failing, expect_brake):
    # pool h100 has 10 active nodes, brake above 30%; max_concurrent high so only the brake matters
    nodes = [node(f"h100-{i}", xid=79) for i in range(failing)] + [node("a100-0", pool="a100", xid=79)]
    d = detect(nodes, [], spec(max_concurrent=100), T0)
    started = {s.record.node for s in d.started}
    assert "a100-0" in started  # another pool is not braked
    braked = [g for g in d.gates if g.reason == "TooManyUnhealthy"]
    if expect_brake:
        assert braked and braked[0].pool == "h100" and not any(n.startswith("h100") for n in started)
        assert f"{failing} of 10" in braked[0].message
    else:
        assert not braked and len(started) == failing + 1


def test_a_single_failure_in_a_small_pool_is_not_a_storm():
    s = parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "tiny", "node_type": "x", "gpu_model": "g", "nodes": 1, "spares": 1},
                  {"name": "pair", "node_type": "x", "gpu_model": "g", "nodes": 2, "spares": 1}],
        "slurm": {"partitions": [{"name": "p", "pools": ["tiny"]}]},
        "healing": {"max_unhealthy_fraction": 0.5, "max_concurrent": 10},
    })
    d = detect([node("tiny-0", pool="tiny", xid=79)], [], s, T0)
    assert [r.record.node for r in d.started] == ["tiny-0"] and d.gates == ()
    d = detect([node("pair-0", pool="pair", xid=79), node("pair-1", pool="pair", xid=79)], [], s, T0)
    assert d.started == () and d.gates[0].reason == "TooManyUnhealthy"


def test_attempt_cap_escalates_instead_of_looping():
    n = node("h100-0", xid=79, since=T0 + timedelta(hours=2))
    earlier = [
        rec(node("h100-0", xid=79, since=T0), Phase.SUCCEEDED, created=T0),
        rec(node("h100-0", xid=48, since=T0 + timedelta(hours=1)), Phase.SUCCEEDED, created=T0 + timedelta(hours=1)),
    ]
    d = detect([n], earlier, spec(max_attempts_per_node=2), T0 + timedelta(hours=2))
    (new,) = d.started
    assert new.record.phase is Phase.ESCALATED and "quarantined for a human" in new.record.reason
    kinds = [a.kind for a in new.actions]
    assert kinds == ["Cordon", "Quarantine", "Notify"] and new.actions[-1].severity == "critical"


def test_fault_on_spare_is_started_and_skips_concurrency():
    busy = [rec(node(f"h100-{i}", xid=79), Phase.EVICTING) for i in range(2)]
    spare = node("h100-spare-0", role=labels.ROLE_SPARE, xid=79)
    d = detect([spare], busy, spec(), T0)
    assert d.started[0].record.was_spare


def test_quarantined_node_returns_to_spares_only_after_health_check():
    q = node("h100-9", role=labels.ROLE_QUARANTINED)
    assert detect([q], [], spec(), T0).actions == ()
    healed = replace(q, health_check_passed=True)
    assert detect([healed], [], spec(), T0).actions == (ReturnToSpares("h100-9"),)
    faulted = node("h100-8", role=labels.ROLE_QUARANTINED, xid=79)
    assert detect([faulted], [], spec(), T0).started == ()  # quarantined nodes are not remediated again


def test_nodes_outside_any_pool_are_ignored():
    assert detect([node("cpu-0", pool=None, xid=79)], [], spec(), T0).started == ()


# --- plan_step: the happy path, phase by phase -------------------------------------------------

def test_full_remediation_walks_every_phase_and_notifies_once():
    s = spec()
    n = node("h100-0", xid=79)
    r = rec(n)
    now = T0

    st = plan_step(r, RecordFacts(), s, now)
    assert [a.kind for a in st.actions] == ["Notify", "Cordon"] and st.record.phase is Phase.SLURM_DRAINING
    r = st.record
    # retried after a crash: the notification is not sent again
    assert [a.kind for a in plan_step(replace(r, phase=Phase.DETECTED), RecordFacts(), s, now).actions] == ["Cordon"]

    jobs = (JobView(41, "RUNNING"), JobView(42, "PENDING"))
    st = plan_step(r, RecordFacts(jobs_on_node=jobs), s, now)
    assert st.actions == (DrainSlurm("h100-0", st.actions[0].reason), SignalJobs((41,), "TERM"))
    assert st.actions[0].reason.startswith("gpufleet: XID 79")
    r = st.record
    assert r.phase is Phase.CHECKPOINTING and r.jobs == (41,) and r.grace_deadline == now + timedelta(seconds=120)

    # the job is still checkpointing: wait
    st = plan_step(r, RecordFacts(jobs_on_node=(JobView(41, "RUNNING"),)), s, now + timedelta(seconds=5))
    assert st.record is None and st.actions == () and st.recheck_after
    # it exited after saving: requeue and mark the node down without waiting out the grace period
    st = plan_step(r, RecordFacts(), s, now + timedelta(seconds=6))
    assert [a.kind for a in st.actions] == ["RequeueJobs", "DownSlurm"] and st.actions[0] == RequeueJobs((41,))
    r = st.record
    assert r.phase is Phase.REQUEUED

    st = plan_step(r, RecordFacts(), s, now)
    assert st.actions == (EvictPods("h100-0"),) and st.record.phase is Phase.EVICTING
    r = st.record
    st = plan_step(r, RecordFacts(pods_left=("slurm/worker-0",)), s, now + timedelta(seconds=1))
    assert st.record is None and st.actions == (EvictPods("h100-0"),)
    st = plan_step(r, RecordFacts(), s, now + timedelta(seconds=2))
    r = st.record
    assert r.phase is Phase.REPLACING

    st = plan_step(r, RecordFacts(spares=("h100-spare-0", "h100-spare-1")), s, now)
    assert st.actions == () and st.record.replacement == "h100-spare-0" and st.record.phase is Phase.REPLACING
    r = st.record
    # a restart now sees other spares first: the recorded choice wins
    st = plan_step(r, RecordFacts(spares=("h100-spare-1",)), s, now)
    assert st.actions[0] == PromoteSpare("h100-spare-0", "h100-0")
    assert st.actions[1] == Quarantine("h100-0", 79) and isinstance(st.actions[2], RequestCapacity)
    r = st.record
    assert r.phase is Phase.RESUMING

    assert plan_step(r, RecordFacts(replacement_ready=False), s, now).record is None
    st = plan_step(r, RecordFacts(replacement_ready=True), s, now + timedelta(seconds=30))
    assert st.actions[0] == ReleaseJobs((41,)) and st.actions[1].event == "succeeded"
    assert st.record.phase is Phase.SUCCEEDED
    assert [p for p, _ in st.record.phase_times] == [
        "Detected", "SlurmDraining", "Checkpointing", "Requeued", "Evicting", "Replacing", "Resuming", "Succeeded"]


def test_grace_period_expires_then_requeue_kills():
    s = spec(grace_period_seconds=60)
    r = rec(node("h100-0", xid=79), Phase.CHECKPOINTING, jobs=(7,), grace_deadline=T0 + timedelta(seconds=60))
    running = RecordFacts(jobs_on_node=(JobView(7, "RUNNING"), JobView(8, "RUNNING")))
    assert plan_step(r, running, s, T0 + timedelta(seconds=59)).record is None
    st = plan_step(r, running, s, T0 + timedelta(seconds=60))
    assert st.actions[0] == RequeueJobs((7, 8)) and st.record.jobs == (7, 8)


def test_grace_zero_sends_no_signal():
    r = rec(node("h100-0", xid=79), Phase.SLURM_DRAINING)
    st = plan_step(r, RecordFacts(jobs_on_node=(JobView(3, "RUNNING"),)), spec(grace_period_seconds=0), T0)
    assert [a.kind for a in st.actions] == ["DrainSlurm"] and st.record.grace_deadline == T0


def test_opt_out_stops_before_anything_is_replaced():
    r = rec(node("h100-0", xid=79), Phase.REQUEUED)
    st = plan_step(r, RecordFacts(opted_out_pods=("ml/debug-0",)), spec(), T0)
    assert st.record.phase is Phase.OPTED_OUT and "ml/debug-0" in st.record.reason
    assert [a.kind for a in st.actions] == ["Notify"]
    # and it holds there: no eviction, no promotion, whatever is observed later
    assert plan_step(st.record, RecordFacts(spares=("h100-spare-0",)), spec(), T0).actions == ()


def test_drain_timeout_moves_on_and_says_so():
    r = rec(node("h100-0", xid=79), Phase.EVICTING, drain_deadline=T0 + timedelta(seconds=60), reason="XID 79")
    st = plan_step(r, RecordFacts(pods_left=("a/stuck",)), spec(), T0 + timedelta(seconds=61))
    assert st.record.phase is Phase.REPLACING and "drain timed out" in st.record.reason


def test_no_spare_waits_notifies_and_asks_for_capacity_never_another_pool():
    r = rec(node("a100-0", pool="a100", xid=79), Phase.REPLACING)
    st = plan_step(r, RecordFacts(spares=()), spec(), T0)
    assert st.record.phase is Phase.WAITING_FOR_SPARE
    assert [a.kind for a in st.actions] == ["Notify", "RequestCapacity"] and st.actions[1].pool == "a100"
    w = st.record
    assert plan_step(w, RecordFacts(), spec(), T0).record is None
    assert plan_step(w, RecordFacts(spares=("a100-spare-3",)), spec(), T0).record.phase is Phase.REPLACING


def test_fault_on_spare_quarantines_and_refills():
    r = rec(node("h100-spare-0", role=labels.ROLE_SPARE, xid=79), was_spare=True)
    st = plan_step(r, RecordFacts(), spec(), T0)
    assert [a.kind for a in st.actions] == ["Notify", "Cordon", "Quarantine", "RequestCapacity"]
    st = plan_step(st.record, RecordFacts(), spec(), T0)
    assert st.record.phase is Phase.SUCCEEDED and st.actions == ()


def test_replacement_never_ready_fails_with_reason():
    r = rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0")
    st = plan_step(r, RecordFacts(), spec(), T0 + timedelta(minutes=11))
    assert st.record.phase is Phase.FAILED and "not Ready" in st.record.reason
    assert st.actions[0].severity == "critical"


@pytest.mark.parametrize("phase", [p for p in Phase if not p.terminal and p is not Phase.OPTED_OUT])
def test_restart_in_any_phase_replans_the_same_step(phase):
    """Killed after acting but before persisting: the same step comes back, with the same
    actions, so executing it again is harmless (every action is idempotent)."""
    r = rec(node("h100-0", xid=79), phase, jobs=(5,), grace_deadline=T0, drain_deadline=T0, replacement="h100-spare-0")
    facts = RecordFacts(spares=("h100-spare-0",), replacement_ready=True)
    assert plan_step(r, facts, spec(), T0) == plan_step(r, facts, spec(), T0)


def test_fail_from_live_phase_and_transitions_are_enforced():
    r = rec(node("h100-0", xid=79), Phase.EVICTING)
    assert fail(r, "API server gone", T0).record.phase is Phase.FAILED
    with pytest.raises(InvalidTransition):
        r.moved(Phase.SUCCEEDED, T0)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.SUCCEEDED, Phase.FAILED)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.OPTED_OUT, Phase.EVICTING)
