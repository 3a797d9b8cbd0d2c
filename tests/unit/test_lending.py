"""Lending, table by table: which nodes lend, when they are taken back, and how a fault meets a loan.
Pure core, a fake clock."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core.actions import (
    DrainSlurm, EndLoan, EvictBorrowers, EvictPods, Lend, PromoteSpare, ResumeSlurm, StartReclaim,
)
from gpufleet.reconciler.core.decide import plan_step, replacement_ready
from gpufleet.reconciler.core.drains import drained_by_person, lending_reason
from gpufleet.reconciler.core.lending import RECHECK, PoolFacts, capacity, demand_nodes, plan_lending
from gpufleet.reconciler.core.model import (
    Fault, NodeView, PendingJob, PodView, Remediation, SlurmNodeView, StepFacts, remediation_name,
)
from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import PROVEN

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
LONG_AGO = T0 - timedelta(hours=1)


def spec(n_spares=3, **lending):
    lend = {"spares": True, "idle_nodes": True, "idle_after_seconds": 600, "spare_floor": 1,
            "reclaim_grace_seconds": 30, "max_lent_fraction": 0.5,
            "borrowers": {"selector": {"app.kubernetes.io/name": "inference"}}, **lending}
    return parse_fleet({
        "environment": "test", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": n_spares,
                   "lending": lend}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    })


def active(i, **kw):
    return NodeView(f"kwok-h100-{i}", "h100", labels.ROLE_ACTIVE, ready=True, gpus=8, **kw)


def spare(i, **kw):
    """A spare that passed its health check on its boot (an unproven one is never lent: issue 25)."""
    kw.setdefault("check", PROVEN)
    kw.setdefault("boot_id", PROVEN.boot)
    return NodeView(f"kwok-h100-spare-{i}", "h100", labels.ROLE_SPARE, ready=True, gpus=8,
                    taints=kw.pop("taints", (labels.SPARE_TAINT,)), **kw)


def lent(n: NodeView, kind, reclaiming=None) -> NodeView:
    taints = tuple(t for t in n.taints if t != labels.SPARE_TAINT) + (labels.LENDING_TAINT,)
    return replace(n, lent="" if reclaiming else kind, lent_since=LONG_AGO, reclaiming=reclaiming, taints=taints)


def sl(name, *states, reason="", busy_at=LONG_AGO):
    return SlurmNodeView(name, frozenset(states or ("IDLE",)), reason, last_busy=busy_at)


def pool(nodes, slurm_on=(), pods=(), pending=(), **kw):
    return PoolFacts("h100", tuple(nodes), tuple(slurm_on), tuple(pods), tuple(pending), **kw)


def borrower(key, node, **kw):
    namespace, name = key.split("/")
    return PodView(namespace, name, node, **kw)


def nodeset_pod(host, node):
    return PodView("slurm", f"slurm-worker-{host}", node, labels=((labels.SLINKY_POD_HOSTNAME, host),))


def kinds(plan):
    return [(a.kind, getattr(a, "node", None)) for a in plan.actions]


def busy_fleet(idle=()):
    """Four active nodes, each with its NodeSet pod's Slurm node; `idle` ones idle for an hour."""
    nodes = [active(i) for i in range(4)]
    on = [(f"kwok-h100-{i}", (sl(f"h100-{i}") if i in idle else sl(f"h100-{i}", "ALLOCATED", busy_at=T0),))
          for i in range(4)]
    return nodes, on


# --- spares ----------------------------------------------------------------------------------------

def test_spares_beyond_the_floor_lend_and_the_first_stays_free():
    nodes, on = busy_fleet()
    plan = plan_lending(pool(nodes + [spare(0), spare(1), spare(2)], on), spec(), T0)
    assert plan.actions == (Lend("kwok-h100-spare-2", "h100", labels.LENT_SPARE),
                            Lend("kwok-h100-spare-1", "h100", labels.LENT_SPARE))


def test_never_below_the_floor():
    nodes, on = busy_fleet()
    assert plan_lending(pool(nodes + [spare(0)], on), spec(n_spares=3, spare_floor=1), T0).actions == ()
    two = plan_lending(pool(nodes + [spare(0), spare(1)], on), spec(spare_floor=2), T0)
    assert two.actions == ()


def test_a_spare_a_remediation_chose_is_never_lent_and_not_counted_free():
    nodes, on = busy_fleet()
    plan = plan_lending(pool(nodes + [spare(0), spare(1)], on, claimed=frozenset({"kwok-h100-spare-0"})), spec(), T0)
    assert plan.actions == ()  # spare-1 is the only free one: it is the floor


def test_the_cap_bounds_what_is_lent():
    nodes, on = busy_fleet()
    # 4 nodes + 6 spares, 20 % at most: 2 nodes
    plan = plan_lending(pool(nodes + [spare(i) for i in range(6)], on), spec(n_spares=6, max_lent_fraction=0.2), T0)
    assert [a.node for a in plan.actions] == ["kwok-h100-spare-5", "kwok-h100-spare-4"]


def test_a_fault_that_takes_the_last_free_spare_reclaims_a_lent_one():
    nodes, on = busy_fleet()
    s1, s2 = lent(spare(1), labels.LENT_SPARE), lent(spare(2), labels.LENT_SPARE)
    # spare-0 was promoted (claimed): the floor of one free spare is short by one.
    plan = plan_lending(pool(nodes + [spare(0), s1, s2], on, claimed=frozenset({"kwok-h100-spare-0"})), spec(), T0)
    assert kinds(plan) == [("StartReclaim", "kwok-h100-spare-1")]


def test_no_spare_above_the_declared_count_lends_the_surplus_is_given_back_first():
    """A repaired node back among the spares while the refill that replaced it is lent: three spares of two
    declared. Lending the other free one would leave the repaired node the only free spare, which the surplus
    pass gives back, and the pool below its floor: a loan taken back a second later."""
    nodes, on = busy_fleet()
    fleet = [*nodes, spare(0), spare(1), lent(spare(2), labels.LENT_SPARE)]
    assert plan_lending(pool(fleet, on), spec(n_spares=2, spare_floor=1), T0).actions == ()
    # At the declared count again (one given back), it lends as before: here nothing, the floor is the free one.
    assert plan_lending(pool([*nodes, spare(0), lent(spare(2), labels.LENT_SPARE)], on),
                        spec(n_spares=2, spare_floor=1), T0).actions == ()
    assert kinds(plan_lending(pool([*nodes, spare(0), spare(1)], on), spec(n_spares=2, spare_floor=1), T0)) == [
        ("Lend", "kwok-h100-spare-1")]


def test_no_spare_lends_while_a_remediation_waits_for_one():
    nodes, on = busy_fleet()
    plan = plan_lending(pool(nodes + [spare(0), spare(1), spare(2)], on, waiting_for_spare=1), spec(), T0)
    assert plan.actions == ()


def test_reclaim_evicts_within_the_grace_then_forces_then_ends_the_loan():
    nodes, on = busy_fleet()
    back = lent(spare(2), labels.LENT_SPARE, reclaiming=T0)
    a = borrower("inf/a", "kwok-h100-spare-2")
    facts = pool(nodes + [spare(0), spare(1), back], on, pods=[("kwok-h100-spare-2", (a,))])
    s = spec(n_spares=3, spare_floor=2)  # nothing else to lend
    assert plan_lending(facts, s, T0 + timedelta(seconds=5)).actions == (
        EvictBorrowers("kwok-h100-spare-2", ("inf/a",), 30, force=False),)
    leaving = pool(nodes + [spare(0), spare(1), back], on, pods=[("kwok-h100-spare-2", (replace(a, deleting=True),))])
    assert plan_lending(leaving, s, T0 + timedelta(seconds=6)).actions == (
        EvictBorrowers("kwok-h100-spare-2", (), 30, force=False),)  # asked already: waited for
    assert plan_lending(leaving, s, T0 + timedelta(seconds=31)).actions == (
        EvictBorrowers("kwok-h100-spare-2", ("inf/a",), 30, force=True),)
    done = pool(nodes + [spare(0), spare(1), back], on)
    assert plan_lending(done, s, T0 + timedelta(seconds=31)).actions == (
        EndLoan("kwok-h100-spare-2", back_to_spare=True),)


def test_the_spec_lending_less_takes_loans_back():
    nodes, on = busy_fleet(idle={3})
    s1 = lent(spare(1), labels.LENT_SPARE)
    idle = lent(active(3), labels.LENT_IDLE)
    plan = plan_lending(pool(nodes[:3] + [idle, spare(0), s1], on[:3]), spec(n_spares=2, idle_nodes=False), T0)
    assert kinds(plan) == [("StartReclaim", "kwok-h100-3")]
    plan = plan_lending(pool(nodes[:3] + [idle, spare(0), s1], on[:3]), spec(n_spares=2, spares=False), T0)
    assert kinds(plan) == [("StartReclaim", "kwok-h100-spare-1")]


# --- idle nodes -------------------------------------------------------------------------------------

def test_an_idle_node_is_drained_for_lending_then_lent_and_its_nodeset_pod_leaves():
    nodes, on = busy_fleet(idle={3})
    s = spec(n_spares=0, spare_floor=0)
    plan = plan_lending(pool(nodes, on), s, T0)
    assert plan.actions == (DrainSlurm("h100-3", lending_reason("kwok-h100-3")),)
    drained = on[:3] + [("kwok-h100-3", (sl("h100-3", "IDLE", "DRAIN", reason=lending_reason("kwok-h100-3")),))]
    pods = [("kwok-h100-3", (nodeset_pod("h100-3", "kwok-h100-3"),))]
    plan = plan_lending(pool(nodes, drained, pods), s, T0)
    assert plan.actions == (Lend("kwok-h100-3", "h100", labels.LENT_IDLE),
                            EvictPods("kwok-h100-3", ("slurm/slurm-worker-h100-3",)))


def test_not_idle_long_enough_waits_and_asks_to_look_again_in_time():
    nodes, on = busy_fleet()
    on[3] = ("kwok-h100-3", (sl("h100-3", busy_at=T0 - timedelta(seconds=500)),))
    plan = plan_lending(pool(nodes, on), spec(n_spares=0, spare_floor=0), T0)
    assert plan.actions == () and plan.recheck_after == pytest.approx(RECHECK)
    on[3] = ("kwok-h100-3", (sl("h100-3", busy_at=T0 - timedelta(seconds=599.7)),))
    assert plan_lending(pool(nodes, on), spec(n_spares=0, spare_floor=0), T0).recheck_after == pytest.approx(0.5)


@pytest.mark.parametrize("slurm_state", [
    sl("h100-3", "IDLE", "DRAIN", reason="hardware check - alice"),  # a person drained it
    sl("h100-3", "ALLOCATED", busy_at=LONG_AGO),  # a job runs (whatever last_busy says)
    sl("h100-3", "IDLE", "DRAIN", reason="slurm-operator: Node cordoned"),
    sl("h100-3", "DOWN", reason="Not responding"),
])
def test_never_lends_a_node_a_person_drained_or_one_with_a_job(slurm_state):
    nodes, on = busy_fleet()
    on[3] = ("kwok-h100-3", (slurm_state,))
    plan = plan_lending(pool(nodes, on), spec(n_spares=0, spare_floor=0), T0)
    assert plan.actions == ()


def test_a_job_that_lands_while_draining_for_lending_undoes_the_drain():
    nodes, on = busy_fleet()
    on[3] = ("kwok-h100-3", (sl("h100-3", "ALLOCATED", "DRAIN", reason=lending_reason("kwok-h100-3"), busy_at=T0),))
    assert plan_lending(pool(nodes, on), spec(n_spares=0, spare_floor=0), T0).actions == (ResumeSlurm("h100-3"),)


def test_a_pending_job_stops_lending_and_undoes_a_drain_for_lending():
    nodes, on = busy_fleet(idle={2, 3})
    on[3] = ("kwok-h100-3", (sl("h100-3", "IDLE", "DRAIN", reason=lending_reason("kwok-h100-3")),))
    job = PendingJob(7, ("train",), nodes=2, reason="Resources")
    assert plan_lending(pool(nodes, on, pending=[job]), spec(n_spares=0, spare_floor=0), T0).actions == (
        ResumeSlurm("h100-3"),)


def test_a_pending_job_reclaims_as_many_idle_loans_as_it_lacks():
    nodes, on = busy_fleet(idle={1})
    loans = [lent(active(2), labels.LENT_IDLE), lent(active(3), labels.LENT_IDLE)]
    facts = lambda n_job, reason="Resources": pool(  # noqa: E731
        nodes[:2] + loans, on[:2], pending=[PendingJob(9, ("train",), nodes=n_job, reason=reason)])
    s = spec(n_spares=0, spare_floor=0)
    assert plan_lending(facts(1), s, T0).actions == ()  # kwok-h100-1 is idle: it will run there
    assert kinds(plan_lending(facts(2), s, T0)) == [("StartReclaim", "kwok-h100-2")]
    assert kinds(plan_lending(facts(3), s, T0)) == [("StartReclaim", "kwok-h100-2"), ("StartReclaim", "kwok-h100-3")]
    assert plan_lending(facts(3, "Dependency"), s, T0).actions == ()  # waits for another job, not nodes
    assert plan_lending(facts(99), s, T0).actions == ()  # more than the pool has: nodes would not start it


def test_a_node_back_from_a_loan_with_its_slurm_node_drained_for_lending_is_undrained():
    nodes, on = busy_fleet()
    on[3] = ("kwok-h100-3", (sl("h100-3", "IDLE", "DRAIN", reason=lending_reason("kwok-h100-3")),))
    job = PendingJob(7, ("train",), nodes=1, reason="Resources")
    plan = plan_lending(pool(nodes, on, pending=[job]), spec(n_spares=0, spare_floor=0, idle_nodes=False), T0)
    assert plan.actions == (ResumeSlurm("h100-3"),)


def test_a_loan_on_a_faulted_or_quarantined_node_ends_at_once():
    nodes, on = busy_fleet()
    faulted = replace(lent(active(3), labels.LENT_IDLE), fault=Fault(79, "Xid 79", T0), unschedulable=True)
    q = replace(lent(spare(0), labels.LENT_SPARE), role=labels.ROLE_QUARANTINED)
    plan = plan_lending(pool(nodes[:3] + [faulted, q], on[:3], remediated=frozenset({"kwok-h100-3"})),
                        spec(n_spares=1, spare_floor=0), T0)
    assert set(plan.actions) >= {EndLoan("kwok-h100-3", back_to_spare=False), EndLoan("kwok-h100-spare-0", False)}


def test_capacity_counts_what_the_pool_is_doing():
    nodes, on = busy_fleet(idle={1})
    facts = pool(nodes[:3] + [lent(active(3), labels.LENT_IDLE), spare(0), lent(spare(1), labels.LENT_SPARE),
                              NodeView("kwok-h100-q", "h100", labels.ROLE_QUARANTINED)], on[:3])
    c = capacity(facts)
    assert (c.active_busy, c.active_idle, c.active_lent, c.spares_lent, c.spares_unlent, c.quarantined, c.gpus_lent) \
        == (2, 1, 1, 1, 1, 1, 16)


def test_demand_counts_only_jobs_that_wait_for_nodes():
    jobs = (PendingJob(1, ("t",), 2, "Resources"), PendingJob(2, ("t",), 1, "Priority"),
            PendingJob(3, ("t",), 5, "BeginTime"), PendingJob(4, ("t",), 1, "Resources", held=True),
            PendingJob(5, ("t",), 1, "AssocGrpGRESLimit"))
    assert demand_nodes(jobs, 4) == 3


# --- a fault meets a loan (decide.plan_step) ---------------------------------------------------------

def _record(**kw):
    f = Fault(79, "Xid 79", T0)
    return Remediation(remediation_name("kwok-h100-0", f), "kwok-h100-0", "h100", 79, "m", Phase.REPLACING, T0,
                       ((Phase.REPLACING.value, T0),), **kw)


def test_unlent_spares_are_chosen_first():
    f = StepFacts(pool_nodes=(lent(spare(0), labels.LENT_SPARE), spare(1)))
    assert plan_step(_record(), f, spec(), T0).remediation.replacement == "kwok-h100-spare-1"
    assert plan_step(_record(), replace(f, claimed=frozenset({"kwok-h100-spare-1"})), spec(),
                     T0).remediation.replacement == "kwok-h100-spare-0"


def test_a_lent_spare_is_reclaimed_before_it_is_promoted_and_the_record_says_how_long():
    s = spec()
    r = _record(replacement="kwok-h100-spare-1")
    on_loan = lent(spare(1), labels.LENT_SPARE)
    lent_facts = StepFacts(replacement=on_loan, replacement_pods=(borrower("inf/a", on_loan.name),
                                                                 borrower("inf/b", on_loan.name)))
    st = plan_step(r, lent_facts, s, T0)
    assert st.actions == (StartReclaim("kwok-h100-spare-1", "a fault on kwok-h100-0 needs it"),)
    r = st.remediation
    assert r.reclaim_started == T0 and r.phase is Phase.REPLACING
    st = plan_step(r, lent_facts, s, T0 + timedelta(seconds=3))
    assert st.actions == (EvictBorrowers("kwok-h100-spare-1", ("inf/a", "inf/b"), 30),) and st.remediation is None
    st = plan_step(r, lent_facts, s, T0 + timedelta(seconds=30))
    assert st.actions == (EvictBorrowers("kwok-h100-spare-1", ("inf/a", "inf/b"), 30, force=True),)
    assert "outlasted the 30s reclaim grace" in st.remediation.reason
    r = st.remediation
    st = plan_step(r, StepFacts(), s, T0 + timedelta(seconds=32))
    assert st.actions[:2] == (EndLoan("kwok-h100-spare-1", back_to_spare=False),
                              PromoteSpare("kwok-h100-spare-1", "kwok-h100-0", "h100"))
    assert st.remediation.phase is Phase.RESUMING and "waited 32s for the borrowers" in st.remediation.reason


def test_a_spare_lent_without_borrowers_yet_is_still_taken_back_first():
    r = _record(replacement="kwok-h100-spare-1")
    on_loan = StepFacts(replacement=lent(spare(1), labels.LENT_SPARE))
    st = plan_step(r, on_loan, spec(), T0)
    assert [a.kind for a in st.actions] == ["StartReclaim"]
    st = plan_step(st.remediation, on_loan, spec(), T0)
    assert [a.kind for a in st.actions][:2] == ["EndLoan", "PromoteSpare"]


def test_a_replacement_still_on_loan_is_not_ready():
    r = _record(replacement="s")
    n = NodeView("s", "h100", labels.ROLE_ACTIVE, ready=True, taints=(labels.LENDING_TAINT,))
    assert not replacement_ready(r, StepFacts(replacement=n))


def test_a_drain_for_lending_is_not_a_persons():
    assert not drained_by_person(sl("h100-3", "IDLE", "DRAIN", reason=lending_reason("x")))
    assert drained_by_person(sl("h100-3", "IDLE", "DRAIN", reason="bad fan"))


@pytest.mark.parametrize("back_as", ["drained for lending", "no NodeSet pod yet"])
def test_a_pending_job_takes_back_no_second_loan_while_the_first_comes_back(back_as):
    """Found by bench/lending.py: a loan just ended counted neither as capacity nor as being reclaimed."""
    s = spec(n_spares=0, spare_floor=0)
    job = PendingJob(9, ("train",), nodes=1, reason="Resources")
    busy = [active(0), active(1)]
    on = [(f"kwok-h100-{i}", (sl(f"h100-{i}", "ALLOCATED", busy_at=T0),)) for i in (0, 1)]
    first = plan_lending(pool(busy + [lent(active(2), labels.LENT_IDLE), lent(active(3), labels.LENT_IDLE)], on,
                              pending=[job]), s, T0)
    assert kinds(first) == [("StartReclaim", "kwok-h100-2")]
    back = on + ([("kwok-h100-2", (sl("h100-2", "IDLE", "DRAIN", reason=lending_reason("kwok-h100-2")),))]
                 if back_as == "drained for lending" else [])
    later = plan_lending(pool(busy + [active(2), lent(active(3), labels.LENT_IDLE)], back, pending=[job]), s,
                         T0 + timedelta(seconds=31))
    assert ("StartReclaim", "kwok-h100-3") not in kinds(later)
    if back_as == "drained for lending":
        assert later.actions == (ResumeSlurm("h100-2"),)


def test_a_node_back_from_its_loan_whose_slurmd_is_still_starting_counts_for_the_waiting_job():
    """Its Slurm node is DOWN by the operator's preStop until its slurmd registers again: still on its way back."""
    s = spec(n_spares=0, spare_floor=0)
    job = PendingJob(9, ("train",), nodes=1, reason="Resources")
    busy = [active(0), active(1)]
    on = [(f"kwok-h100-{i}", (sl(f"h100-{i}", "ALLOCATED", busy_at=T0),)) for i in (0, 1)]
    on.append(("kwok-h100-2", (sl("h100-3", "DOWN", reason="slurm-operator: Pod is terminating"),)))
    plan = plan_lending(pool(busy + [active(2), lent(active(3), labels.LENT_IDLE)], on, pending=[job]), s, T0)
    assert ("StartReclaim", "kwok-h100-3") not in kinds(plan)


def test_a_slurmd_registering_again_after_a_loan_counts_for_the_waiting_job():
    s = spec(n_spares=0, spare_floor=0)
    job = PendingJob(9, ("train",), nodes=1, reason="Resources")
    busy = [active(0), active(1)]
    on = [(f"kwok-h100-{i}", (sl(f"h100-{i}", "ALLOCATED", busy_at=T0),)) for i in (0, 1)]
    on.append(("kwok-h100-2", (sl("h100-3", "IDLE", "NOT_RESPONDING", "DYNAMIC_NORM"),)))
    plan = plan_lending(pool(busy + [active(2), lent(active(3), labels.LENT_IDLE)], on, pending=[job]), s, T0)
    assert ("StartReclaim", "kwok-h100-3") not in kinds(plan)


# --- a lent machine that stops answering -------------------------------------------------------------------

def dead(n: NodeView, since=T0) -> NodeView:
    """Its kubelet dead: the node controller set Ready Unknown at `since`."""
    return replace(n, ready=False, not_ready_since=since, ready_status="Unknown")


@pytest.mark.parametrize("loan", ["idle", "spare", "idle being reclaimed"])
def test_a_lent_machine_that_stops_answering_is_neither_reclaimed_nor_evicted_until_its_heal_ends_the_loan_as_lost(loan):
    """No eviction there can finish on a dead kubelet, so the take-back never waits on one: the loan stands until
    the loss is read (healing.node_lost_after_seconds, 300 s), then the heal takes the node and the loan ends, lost."""
    nodes, on = busy_fleet(idle=(3,))
    if loan == "spare":
        gone, rest = lent(spare(2), labels.LENT_SPARE), [spare(0), spare(1)]
        s = spec(n_spares=3, spare_floor=1)
    else:
        gone, rest = lent(active(3), labels.LENT_IDLE, reclaiming=T0 if "reclaimed" in loan else None), [spare(0)]
        s = spec(n_spares=1, spare_floor=1)
    gone = dead(gone)
    pods = [(gone.name, (borrower("inf/a", gone.name),))]
    wants = (PendingJob(9, ("train",), 1, "Resources"),)  # a job that would take an idle loan back
    for seconds in (5, 299, 600):  # a blip, the threshold not reached, lost but not yet taken by a heal
        plan = plan_lending(pool(nodes[:3] + [gone] + rest, on[:3], pods=pods, pending=wants), s,
                            T0 + timedelta(seconds=seconds))
        assert not [a for a in plan.actions if getattr(a, "node", "") == gone.name], (seconds, plan.actions)
    taken = pool(nodes[:3] + [gone] + rest, on[:3], pods=pods, remediated=frozenset({gone.name}))
    plan = plan_lending(taken, s, T0 + timedelta(seconds=301))
    assert EndLoan(gone.name, back_to_spare=gone.is_spare, lost=True) in plan.actions
    assert not [a for a in plan.actions if isinstance(a, EvictBorrowers)]
    # Ready again before then: a blip, and the loan goes on as any other
    back = replace(gone, ready=True, not_ready_since=None)
    plan = plan_lending(pool(nodes[:3] + [back] + rest, on[:3], pods=pods), s, T0 + timedelta(seconds=30))
    assert EndLoan(back.name, back_to_spare=back.is_spare) not in plan.actions


def test_a_lost_loan_ends_all_the_same_when_healing_is_off():
    nodes, on = busy_fleet(idle=(3,))
    s = spec(n_spares=1, spare_floor=1)
    off = s.model_copy(update={"healing": s.healing.model_copy(update={"enabled": False})})
    gone = dead(lent(active(3), labels.LENT_IDLE))
    facts = pool(nodes[:3] + [gone, spare(0)], on[:3])
    assert EndLoan(gone.name, False, lost=True) not in plan_lending(facts, off, T0 + timedelta(seconds=299)).actions
    assert EndLoan(gone.name, False, lost=True) in plan_lending(facts, off, T0 + timedelta(seconds=300)).actions


def test_a_heal_taking_back_a_lent_spare_whose_machine_dies_gives_it_up_and_takes_another():
    """The heal's own take-back of a chosen lent spare waits on its borrowers; once that spare's machine is lost,
    it never will: the spare is given up (a page says why) and another chosen."""
    s = spec()
    r = _record(replacement="kwok-h100-spare-1", reclaim_started=T0)
    gone = dead(lent(spare(1), labels.LENT_SPARE))
    facts = StepFacts(replacement=gone, replacement_pods=(borrower("inf/a", gone.name),),
                      pool_nodes=(gone, spare(2)))
    st = plan_step(r, facts, s, T0 + timedelta(seconds=299))
    assert [a.kind for a in st.actions] == ["EvictBorrowers"]  # not lost yet: its take-back goes on
    assert st.remediation is None or st.remediation.replacement == "kwok-h100-spare-1"
    st = plan_step(r, facts, s, T0 + timedelta(seconds=300))
    assert st.remediation.replacement is None
    assert st.remediation.failed_replacements[-1].why == "kwok-h100-spare-1 stopped answering (not Ready for 300s)"
    assert "stopped answering" in st.remediation.reason
