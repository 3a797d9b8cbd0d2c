"""Active checks of idle capacity (reconciler/core/active_checks.py, fleetspec/active_checks.py): which nodes
are due, how many at once, never a node that runs a job or one a waiting job could use, the check's verdicts,
and a restart that finds a reservation."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.load import SpecError
from gpufleet.fleetspec.node_repair import FAILED, PASSED, RUNNING, HealthCheckRecord
from gpufleet.reconciler.core import active_checks as ac
from gpufleet.reconciler.core.actions import EvictPods
from gpufleet.reconciler.core.lending import PoolFacts, plan_lending
from gpufleet.reconciler.core.model import NodeView, PendingJob, PodView, SlurmNodeView
from gpufleet.reconciler.core.repair_actions import RecordCheck, StartHealthCheck
from gpufleet.reconciler.core.validation import Verdict
from gpufleet.fleetspec.faults import FaultAction

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
BOOT = "boot-1"


def spec(max_at_once=1, period=3600, before_service=True, **pool):
    return parse_fleet({
        "environment": "test", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 2,
                   "active_checks": {"period_seconds": period, "max_at_once": max_at_once}, **pool}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
        "healing": {"repair": {"health_check": {"timeout_seconds": 600, "before_service": before_service}}},
    })


def checked(ago: timedelta) -> HealthCheckRecord:
    return HealthCheckRecord("gpufleet-check-old", BOOT, PASSED, T0 - ago, "ok")


def active(i, ago=timedelta(hours=2), **kw):
    kw.setdefault("check", checked(ago) if ago is not None else None)
    return NodeView(f"kwok-h100-{i}", "h100", labels.ROLE_ACTIVE, ready=True, gpus=8, boot_id=BOOT, **kw)


def spare(i, ago=timedelta(hours=2), **kw):
    return NodeView(f"kwok-h100-spare-{i}", "h100", labels.ROLE_SPARE, ready=True, gpus=8, boot_id=BOOT,
                    check=checked(ago), taints=(labels.SPARE_TAINT,), **kw)


def sl(name, *states):
    return SlurmNodeView(name, frozenset(states or ("IDLE",)))


def pool(nodes, slurm_on=None, pods=(), pending=(), **kw):
    if slurm_on is None:
        slurm_on = [(n.name, (sl(n.name.replace("kwok-", "")),)) for n in nodes if n.is_active]
    return PoolFacts("h100", tuple(nodes), tuple(slurm_on), tuple(pods), tuple(pending), **kw)


def kinds(plan):
    return [(a.kind, getattr(a, "node", None)) for a in plan.actions]


def reserved(plan):
    return [a.node for a in plan.actions if isinstance(a, ac.ReserveForCheck)]


# --- the spec ---------------------------------------------------------------------------------------------------

def test_the_default_period_is_hourly_and_errors_name_the_field():
    s = parse_fleet({
        "environment": "test", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 2,
                   "active_checks": {}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })
    assert s.pools[0].active_checks.period_seconds == 3600 and s.pools[0].active_checks.max_at_once == 1
    with pytest.raises(SpecError, match=r"pools\[0\]\.active_checks\.period_seconds: 600s is not longer than"):
        spec(period=600)
    with pytest.raises(SpecError, match=r"pools\[0\]\.active_checks\.max_at_once: 6 at once would take all 6"):
        spec(max_at_once=6)
    with pytest.raises(SpecError, match=r"pools\[0\]\.active_checks\.period_seconds: .*greater than or equal to 300"):
        spec(period=10)
    with pytest.raises(SpecError, match=r"pools\[0\]\.active_checks: active checks run the repair loop"):
        parse_fleet({
            "environment": "test", "cluster": {"kind": "local"},
            "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 2,
                       "active_checks": {}}],
            "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
            "healing": {"repair": {"enabled": False}},
        })


# --- which nodes, how many --------------------------------------------------------------------------------------

def test_an_idle_node_checked_longer_ago_than_the_period_is_due_and_a_recent_one_is_not():
    s = spec(max_at_once=3)
    nodes = [active(0, timedelta(minutes=59)), active(1, timedelta(minutes=61)), active(2, None)]
    plan = ac.plan_active_checks(pool(nodes), [], {}, s, T0)
    assert reserved(plan) == ["kwok-h100-2", "kwok-h100-1"]  # never checked first, then the oldest
    r = next(a for a in plan.actions if isinstance(a, ac.ReserveForCheck))
    assert r.reservation == f"gpufleet-check-kwok-h100-2-{int(T0.timestamp())}" and r.slurm_nodes == ("h100-2",)
    assert r.minutes >= 10 + 2  # the check's deadline and some: Slurm ends it if the reconciler never returns


def test_a_reboot_makes_a_node_due_again():
    n = active(0, timedelta(minutes=1))
    assert not ac.due(n, spec().pools[0].active_checks, T0)
    assert ac.due(replace(n, boot_id="boot-2"), spec().pools[0].active_checks, T0)


@pytest.mark.parametrize("states", [("ALLOCATED",), ("MIXED",), ("IDLE", "DRAIN"), ("DOWN",), ("COMPLETING",),
                                    ("IDLE", "RESERVED"), ("IDLE", "MAINTENANCE"), ("IDLE", "NOT_RESPONDING")])
def test_a_node_that_runs_a_job_or_is_not_idle_in_slurm_is_never_checked(states):
    n = active(0)
    plan = ac.plan_active_checks(pool([n], [(n.name, (sl("h100-0", *states),))]), [], {}, spec(), T0)
    assert plan.actions == ()


def test_a_node_with_one_busy_slurm_node_of_two_is_not_checked():
    n = active(0)
    plan = ac.plan_active_checks(pool([n], [(n.name, (sl("a"), sl("b", "ALLOCATED")))]), [], {}, spec(), T0)
    assert plan.actions == ()


def test_no_idle_node_a_waiting_job_could_have_is_taken():
    nodes = [active(0), active(1)]
    two = [PendingJob(7, ("train",), 2, "Resources")]
    assert reserved(ac.plan_active_checks(pool(nodes, pending=two), [], {}, spec(max_at_once=2), T0)) == []
    # a job that waits for one node leaves one idle node to check
    one = [PendingJob(7, ("train",), 1, "Resources")]
    assert reserved(ac.plan_active_checks(pool(nodes, pending=one), [], {}, spec(max_at_once=2), T0)) == ["kwok-h100-0"]
    # a job that waits for something else (a dependency) wants no node
    dep = [PendingJob(7, ("train",), 2, "Dependency")]
    assert reserved(ac.plan_active_checks(pool(nodes, pending=dep), [], {}, spec(max_at_once=2), T0)) == \
        ["kwok-h100-0", "kwok-h100-1"]


def test_at_most_max_at_once_counting_the_checks_under_way():
    s = spec(max_at_once=2)
    nodes = [active(i) for i in range(4)]
    under = ac.Reservation(ac.reservation_name("kwok-h100-3", T0 - timedelta(minutes=1)), ("h100-3",))
    plan = ac.plan_active_checks(pool(nodes), [under], {}, s, T0)
    assert reserved(plan) == ["kwok-h100-0"]  # one slot left of two
    assert plan.under_way == 2
    plan = ac.plan_active_checks(pool(nodes), [under], {}, spec(max_at_once=1), T0)
    assert reserved(plan) == []


def test_lent_claimed_faulted_or_remediated_nodes_are_not_checked():
    nodes = [active(0, lent="idle"), active(1, remediation="r"), active(2, unschedulable=True), active(3)]
    plan = ac.plan_active_checks(pool(nodes, claimed=frozenset({"kwok-h100-3"})), [], {}, spec(max_at_once=3), T0)
    assert reserved(plan) == []


def test_a_due_spare_is_checked_through_validation_and_counts_in_the_cap():
    s = spec(max_at_once=1)
    plan = ac.plan_active_checks(pool([spare(0), spare(1, timedelta(minutes=5))]), [], {}, s, T0)
    rec = [a for a in plan.actions if isinstance(a, RecordCheck)]
    assert [a.node for a in rec] == ["kwok-h100-spare-0"] and rec[0].record.state == RUNNING
    assert ("StartHealthCheck", "kwok-h100-spare-0") in kinds(plan)
    # its check running: the pool's one slot is taken
    running = replace(spare(0), check=HealthCheckRecord("j", BOOT, RUNNING, T0))
    plan = ac.plan_active_checks(pool([running, active(0)]), [], {}, s, T0)
    assert reserved(plan) == []


def test_spares_are_left_to_validation_when_it_does_not_run():
    plan = ac.plan_active_checks(pool([spare(0)]), [], {}, spec(before_service=False), T0)
    assert plan.actions == ()


# --- a check under way ------------------------------------------------------------------------------------------

def under_way(node="kwok-h100-0", made=T0 - timedelta(minutes=2)):
    return ac.Reservation(ac.reservation_name(node, made), ("h100-0",))


def test_reserved_the_nodeset_pod_leaves_under_the_taint_and_the_job_starts():
    n = active(0)
    r = under_way()
    pods = [(n.name, (PodView("slurm", "slurm-worker-h100-0", n.name, labels=((labels.SLINKY_POD_HOSTNAME, "h100-0"),)),
                      PodView("gpufleet", "check", n.name)))]
    plan = ac.plan_active_checks(pool([n], pods=pods), [r], {}, spec(), T0)
    assert kinds(plan) == [("TakeForCheck", n.name), ("EvictPods", n.name), ("StartHealthCheck", n.name)]
    assert next(a for a in plan.actions if isinstance(a, EvictPods)).pods == ("slurm/slurm-worker-h100-0",)
    assert next(a for a in plan.actions if isinstance(a, StartHealthCheck)).job == ac.job_of(r)
    assert plan.recheck_after == ac.RECHECK


def test_passed_is_recorded_then_the_node_is_given_back_at_once():
    n = replace(active(0), taints=(labels.CHECK_TAINT,))
    r = under_way()
    plan = ac.plan_active_checks(pool([n]), [r], {ac.job_of(r): Verdict("passed", "5/5")}, spec(), T0)
    assert kinds(plan)[:2] == [("RecordCheck", n.name), ("GiveBackFromCheck", n.name)]
    assert plan.actions[0].record == HealthCheckRecord(ac.job_of(r), BOOT, PASSED, T0, "5/5")
    assert plan.actions[1].reservation == r.name and plan.results == ((n.name, "passed"),)


def test_failed_enters_the_repair_loop_with_the_checks_action_and_keeps_the_node_until_it_holds_it():
    n = replace(active(0), taints=(labels.CHECK_TAINT,))
    r = under_way()
    v = Verdict("failed", "dcgm: 2 GPUs failed", "reboot")
    plan = ac.plan_active_checks(pool([n]), [r], {ac.job_of(r): v}, spec(), T0)
    assert not any(isinstance(a, ac.GiveBackFromCheck) for a in plan.actions)  # no job lands on a failed node
    [rem] = plan.failed
    assert rem.node == n.name and rem.action is FaultAction.REBOOT and not rem.was_spare
    assert rem.slurm_nodes == ("h100-0",)  # drained by the heal, though its NodeSet pod left for the check
    assert rem.name == f"kwok-h100-0-check-{int(T0.timestamp())}"  # made again: found made
    # a restart before the remediation was made: it is made (same name), the node still held
    noted = replace(n, check=HealthCheckRecord(ac.job_of(r), BOOT, FAILED, T0, v.message, "reboot"))
    again = ac.plan_active_checks(pool([noted]), [r], {ac.job_of(r): v}, spec(), T0 + timedelta(seconds=5))
    assert [x.name for x in again.failed] == [rem.name] and not again.actions
    # cordoned by its remediation, its Slurm node not yet drained: still held
    held = replace(noted, remediation=rem.name)
    wait = ac.plan_active_checks(pool([held]), [r], {ac.job_of(r): v}, spec(), T0 + timedelta(seconds=9))
    assert not any(isinstance(a, ac.GiveBackFromCheck) for a in wait.actions)
    # the remediation holds it and Slurm has it drained: given back (its own drain keeps jobs off)
    drained = [(held.name, (sl("h100-0", "IDLE", "DRAIN"),))]
    done = ac.plan_active_checks(pool([held], drained), [r], {ac.job_of(r): v}, spec(), T0 + timedelta(seconds=9))
    assert ("GiveBackFromCheck", n.name) in kinds(done) and not done.failed


def test_a_job_on_the_node_abandons_the_check_and_gives_the_node_back():
    n = replace(active(0), taints=(labels.CHECK_TAINT,))
    r = under_way()
    plan = ac.plan_active_checks(pool([n], [(n.name, (sl("h100-0", "ALLOCATED"),))]), [r],
                                 {ac.job_of(r): Verdict("running")}, spec(), T0)
    assert kinds(plan)[0] == ("GiveBackFromCheck", n.name) and plan.results == ((n.name, "abandoned"),)
    assert not any(isinstance(a, (StartHealthCheck, RecordCheck)) for a in plan.actions)


def test_a_job_that_waits_for_the_pool_with_no_other_idle_node_ends_the_check_under_way():
    n = replace(active(0), taints=(labels.CHECK_TAINT,))
    r = under_way()
    wants = [PendingJob(9, ("train",), 1, "ReqNodeNotAvail")]
    plan = ac.plan_active_checks(pool([n], pending=wants), [r], {ac.job_of(r): Verdict("running")}, spec(), T0)
    assert kinds(plan)[0] == ("GiveBackFromCheck", n.name) and plan.results == ((n.name, "abandoned"),)
    # another idle node is free for it: the check goes on
    plan = ac.plan_active_checks(pool([n, active(1, timedelta(minutes=1))], pending=wants), [r],
                                 {ac.job_of(r): Verdict("running")}, spec(max_at_once=2), T0)
    assert not plan.results and not any(isinstance(a, ac.GiveBackFromCheck) for a in plan.actions)


def test_no_verdict_by_the_deadline_gives_the_node_back():
    n = active(0)
    r = under_way(made=T0 - timedelta(seconds=600 + 121))
    plan = ac.plan_active_checks(pool([n]), [r], {ac.job_of(r): Verdict("running")}, spec(), T0)
    assert plan.results == ((n.name, "inconclusive"),)


def test_a_restart_finds_what_it_left():
    # a reservation whose node is gone, and a check taint with no reservation: both given back
    assert ac.plan_strays([under_way("gone-node")], frozenset({"kwok-h100-0"})) == (
        ac.GiveBackFromCheck("", under_way("gone-node").name, "node gone-node is no pool's node any more"),)
    tainted = replace(active(0, timedelta(minutes=1)), taints=(labels.CHECK_TAINT,))
    plan = ac.plan_active_checks(pool([tainted]), [], {}, spec(), T0)
    assert kinds(plan) == [("GiveBackFromCheck", tainted.name), ("NodeEvent", tainted.name)]
    assert plan.actions[0].reservation == ""
    # a reservation made, then killed before the taint: the next pass goes on from there
    plan = ac.plan_active_checks(pool([active(0)]), [under_way()], {}, spec(), T0)
    assert ("TakeForCheck", "kwok-h100-0") in kinds(plan)


def test_reservation_names_round_trip():
    name = ac.reservation_name("kwok-h100-0", T0)
    assert ac.is_ours(name) and not ac.is_ours("maint-2026") and not ac.is_ours("gpufleet-check-x")
    r = ac.Reservation(name)
    assert r.node == "kwok-h100-0" and r.made == T0


def test_a_node_under_a_check_is_never_lent():
    s = parse_fleet({
        "environment": "test", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 0,
                   "lending": {"idle_nodes": True, "idle_after_seconds": 60,
                               "borrowers": {"selector": {"app": "inference"}}}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })
    n = replace(active(0), taints=(labels.CHECK_TAINT,))
    idle = SlurmNodeView("h100-0", frozenset({"IDLE"}), last_busy=T0 - timedelta(hours=1))
    plan = plan_lending(PoolFacts("h100", (n,), ((n.name, (idle,)),)), s, T0)
    assert not [a for a in plan.actions if getattr(a, "node", "") in (n.name, "h100-0")]


def test_the_oldest_check_age():
    assert ac.oldest_check_age([active(0, timedelta(minutes=5)), active(1, timedelta(minutes=50))], T0) == 3000
    assert ac.oldest_check_age([active(0, None)], T0) == float("inf")


# --- the pass, through the reconciler's runtime (tests/unit/fakes.py: the API server, Slurm, the check Jobs) -----

def _world(max_at_once=1):
    from tests.unit.fakes import FakeNodes, World, fleet
    from gpufleet.fleetspec.active_checks import ActiveChecks
    from gpufleet.reconciler.adapters.slurm import SlurmNode

    s = fleet(nodes=3, spares=1, grace_period_seconds=0)
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={
        "active_checks": ActiveChecks(period_seconds=3600, max_at_once=max_at_once)})]})
    w = World(s)
    w.slurm.table["h100-w0"] = SlurmNode("h100-w0", frozenset({"IDLE"}), "")  # idle; h100-w1 and w2 run jobs
    return w, FakeNodes


def test_the_pass_checks_an_idle_node_that_fails_into_the_repair_loop_and_never_a_busy_one():
    w, nodes = _world()
    w.hardware.state["h100-0"] = nodes.BROKEN
    w.run(seconds=240)
    [r] = [r for r in w.store.list() if r.node == "h100-0"]
    assert "failed its active health check" in r.reason and r.slurm_nodes == ("h100-w0",)
    checked = {node for node, _ in w.checks.jobs.values()}
    assert "h100-0" in checked and not checked & {"h100-1", "h100-2"}  # busy nodes: never a check Job
    assert not any(c[0] == "reserve" and "h100-1" in c[1] for c in w.slurm.calls)
    # given back once its remediation holds it: no reservation left, no check taint
    assert w.slurm.reservations() == [] and ("unreserve", next(c[1] for c in w.slurm.calls if c[0] == "reserve")) \
        in w.slurm.calls
    assert not any(t["key"] == labels.CHECK_TAINT for t in w.kube.nodes["h100-0"]["spec"].get("taints") or [])
    assert ("drain", "h100-w0") in w.slurm.calls  # the heal drained its Slurm node, though its pod had left


def test_a_passed_check_gives_the_node_back_and_a_restart_finds_its_reservation():
    w, _ = _world()
    w.run(seconds=2)
    made = [c[1] for c in w.slurm.calls if c[0] == "reserve"]
    assert len(made) == 1 and w.slurm.reservations()
    w.restart()  # killed mid-check: a new reconciler finds the reservation and finishes the check
    w.run(seconds=120)
    assert w.slurm.reservations() == []
    n = w.kube.nodes["h100-0"]
    assert "passed" in n["metadata"]["annotations"][labels.HEALTH_CHECK]
    assert not any(t["key"] == labels.CHECK_TAINT for t in n["spec"].get("taints") or [])
    assert not w.store.list()
