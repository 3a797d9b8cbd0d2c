"""The reconciler's pure core, table by table: no cluster, a fake clock."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core.actions import (
    CarryDrain, DeletePods, DrainSlurm, EvictPods, NoteSignals, Notify, PromoteSpare, Quarantine, ReleaseJobs,
    RequestCapacity, RequeueJobs, ResumeSlurm, ReturnToSpares, SignalJobs,
)
from gpufleet.reconciler.core.admission import admission_facts
from gpufleet.reconciler.core.decide import detect, fail, needs, next_look, plan_step, retry
from gpufleet.reconciler.core.model import (
    Admission, Fault, JobView, NodeView, PodView, Remediation, ReplacementFailure, SlurmNodeView, StepFacts,
    remediation_name,
)
from gpufleet.reconciler.core.observe import node_view
from gpufleet.reconciler.core.phases import InvalidTransition, Phase, check_transition
from gpufleet.reconciler.core.repair_phases import RepairPhase, begin
from tests.unit.fakes import PROVEN

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
FREE = Admission(pool_size=10, unhealthy=frozenset({"h100-0"}), in_flight=0, attempts=0)


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
    """A node; a spare has passed its health check on its boot unless `check` says otherwise."""
    fault = Fault(xid, f"Xid {xid}", since) if xid is not None else None
    if role == labels.ROLE_SPARE:
        kw.setdefault("check", PROVEN)
        kw.setdefault("boot_id", PROVEN.boot)
    return NodeView(name=name, pool=pool, role=role, fault=fault, **kw)


def rec(n: NodeView, phase=Phase.DETECTED, created=T0, **kw):
    return Remediation(
        name=remediation_name(n.name, n.fault), node=n.name, pool=n.pool, xid=n.fault.xid, message="m", phase=phase,
        created=created, phase_times=((phase.value, created),), **kw,
    )


def slurm(name, *states, reason=""):
    return SlurmNodeView(name, frozenset(states or ("IDLE",)), reason)


def spares(*names, pool="h100", **kw):
    """Ready spares of a pool, as the facts show the pool's nodes."""
    return tuple(node(n, pool=pool, role=labels.ROLE_SPARE, ready=True, **kw) for n in names)


def pod(key, node="h100-0", **labels_):
    namespace, name = key.split("/")
    return PodView(namespace, name, node, labels=tuple(labels_.items()))


def nodeset_pod(slurm_name, node=None, unschedulable=""):
    """The NodeSet pod of a Slurm node (its hostname label), on `node` or not placed."""
    return PodView("slurm", f"slurm-worker-{slurm_name}", node, phase="Running" if node else "Pending",
                   labels=((labels.SLINKY_POD_HOSTNAME, slurm_name),), unschedulable=unschedulable)


# --- detect ------------------------------------------------------------------------------------

def test_critical_xid_starts_one_remediation():
    d = detect(node("h100-0", xid=79), [], spec(), T0)
    r = d.remediation
    assert (r.phase, r.xid, r.pool, r.name) == (Phase.DETECTED, 79, "h100", f"h100-0-xid79-{int(T0.timestamp())}")
    assert detect(node("h100-1"), [], spec(), T0).remediation is None


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 999])
def test_application_or_unknown_xid_never_remediates(xid):
    assert detect(node("h100-0", xid=xid), [], spec(), T0).remediation is None


@pytest.mark.parametrize("raw, needs", [
    ({"reason": "Xid13", "message": "[action=diagnose pci=0000:cb:00] XID 13 repeated on one GPU"},
     ("Diagnosing", "diagnose")),
    ({"reason": "Xid94", "message": "[action=restart-app pci=0000:01:00] XID 94"}, None),
    ({"reason": "Xid61", "message": "XID 61, no header: the catalogue's CONTACT_SUPPORT"}, ("Detected", "contact-support")),
    ({"reason": "Xid54", "message": "XID 54: CHECK_MECHANICALS"}, ("Detected", "contact-support")),
    ({"reason": "Xid78", "message": "XID 78: UPDATE_SWFW"}, ("Detected", "contact-support")),
    ({"reason": "Xid74", "message": "[action=contact-support pci=0000:b9:00] XID 74: XID74Reg0HardwareIssue"},
     ("Detected", "contact-support")),
])
def test_diagnostics_leave_the_node_in_service_and_a_case_for_a_person_is_contained_not_replaced(raw, needs):
    """`restart-app` starts nothing (the node serves on); `diagnose` starts a diagnosis, not a heal (the node is
    checked while it serves: core/diagnosis.py); what NVIDIA sends to a person is contained and healed like any
    fault, with `contact-support` on its record (the repair loop holds it: no retirement)."""
    cond = {"type": "GpuHealthy", "status": "False", "lastTransitionTime": T0.isoformat(), **raw}
    n = node_view({"metadata": {"name": "h100-0", "labels": {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_ACTIVE}},
                   "status": {"conditions": [cond]}}, ["GpuHealthy"])
    r = detect(n, [], spec(), T0).remediation
    assert ((r.phase.value, r.action.value) if r else None) == needs


def test_repeated_signal_while_in_progress_is_one_record():
    n = node("h100-0", xid=79)
    live = rec(n, Phase.CHECKPOINTING)
    again = replace(n, fault=Fault(48, "second fault", T0 + timedelta(seconds=30)))
    assert detect(n, [live], spec(), T0 + timedelta(minutes=1)).remediation is None
    assert detect(again, [live], spec(), T0 + timedelta(minutes=1)).remediation is None


def test_stale_condition_after_success_does_not_start_again():
    n = node("h100-0", xid=79)
    assert detect(n, [rec(n, Phase.SUCCEEDED)], spec(), T0 + timedelta(hours=1)).remediation is None


def test_a_condition_without_transition_time_names_one_record_however_often_it_is_read():
    raw = {"metadata": {"name": "h100-0", "labels": {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_ACTIVE}},
           "status": {"conditions": [{"type": "GpuHealthy", "status": "False", "reason": "Xid79", "message": "m"}]}}
    a = detect(node_view(raw, ["GpuHealthy"]), [], spec(), T0).remediation
    b = detect(node_view(raw, ["GpuHealthy"]), [], spec(), T0 + timedelta(seconds=30)).remediation
    assert a.name == b.name


def test_occurrences_threshold_counts_distinct_signals_in_window():
    s = spec(occurrences=2, occurrence_window_seconds=600)
    n = node("h100-0", xid=79, since=T0 + timedelta(seconds=100))
    assert detect(n, [], s, T0 + timedelta(seconds=100)).remediation is None
    assert detect(replace(n, signals=(T0,)), [], s, T0 + timedelta(seconds=100)).remediation is not None
    assert detect(replace(n, signals=(T0 - timedelta(hours=1),)), [], s, T0 + timedelta(seconds=100)).remediation is None


def test_healing_disabled_starts_nothing_and_says_so():
    d = detect(node("h100-0", xid=79), [], spec(enabled=False), T0)
    assert d.remediation is None and d.gate.reason == "HealingDisabled"


def test_detect_never_returns_a_quarantined_node_the_repair_loop_does():
    """Issue 23 item 6: a node goes back to the spares only when nothing of the pool runs on it, which
    detect cannot see; returning is the repair loop's and the on-call commands' (tests/unit/test_repair.py)."""
    q = node("h100-9", role=labels.ROLE_QUARANTINED)
    assert detect(q, [], spec(), T0).actions == ()
    assert detect(replace(q, health_check_passed=True), [], spec(), T0).actions == ()
    assert detect(node("h100-8", role=labels.ROLE_QUARANTINED, xid=79), [], spec(), T0).remediation is None


def test_nodes_outside_any_pool_are_ignored():
    assert detect(node("cpu-0", pool=None, xid=79), [], spec(), T0).remediation is None


# --- containment: never gated -------------------------------------------------------------------

def test_full_remediation_walks_every_phase_and_notifies_once():
    s = spec()
    r = rec(node("h100-0", xid=79))
    now = T0
    # Slurm names are the NodeSet pods' hostnames, not the Kubernetes node's
    st = plan_step(r, StepFacts(slurm_names=("gpu-3",)), s, now)
    assert [a.kind for a in st.actions] == ["Notify", "Cordon"] and st.remediation.phase is Phase.SLURM_DRAINING
    assert st.remediation.slurm_nodes == ("gpu-3",)
    noted = replace(r, intents=("notify:detected",))  # begun before a crash: not sent again
    assert [a.kind for a in plan_step(noted, StepFacts(), s, now).actions] == ["Cordon"]
    r = st.remediation

    jobs = (JobView(41, "RUNNING", ("gpu-3", "gpu-4")), JobView(42, "PENDING"), JobView(43, "COMPLETING", ("gpu-3",)))
    st = plan_step(r, StepFacts(slurm=(slurm("gpu-3", "MIXED"),), jobs_on_node=jobs), s, now)
    assert st.actions == (DrainSlurm("gpu-3", st.actions[0].reason), SignalJobs((41,), "TERM"))
    assert st.actions[0].reason.startswith("gpufleet: XID 79") and r.name in st.actions[0].reason
    r = st.remediation
    assert r.phase is Phase.CHECKPOINTING and r.jobs == (41, 43) and r.grace_deadline == now + timedelta(seconds=120)
    assert r.job_nodes == ("gpu-3", "gpu-4")  # every node of its jobs, for `gpufleet why` once they are requeued

    st = plan_step(r, StepFacts(jobs_on_node=(JobView(41, "RUNNING"),)), s, now + timedelta(seconds=5))
    assert st.remediation is None and st.actions == () and st.recheck_after == 1.0
    st = plan_step(r, StepFacts(), s, now + timedelta(seconds=6))
    assert st.actions == (RequeueJobs((41, 43)),)  # DRAIN keeps jobs off; no DOWN (Slurm would undo it)
    r = st.remediation
    assert r.phase is Phase.REQUEUED

    worker = pod("slurm/worker-0")
    st = plan_step(r, StepFacts(admission=FREE, pods=(worker,)), s, now)
    assert st.actions == (EvictPods("h100-0", ("slurm/worker-0",)),) and st.remediation.phase is Phase.EVICTING
    r = st.remediation
    st = plan_step(r, StepFacts(pods=(worker,)), s, now + timedelta(seconds=1))
    assert st.remediation is None and st.actions == (EvictPods("h100-0", ("slurm/worker-0",)),)
    leaving = replace(worker, deleting=True)  # evicted: waited for, not asked again
    st = plan_step(r, StepFacts(pods=(leaving,)), s, now + timedelta(seconds=1))
    assert st.remediation is None and st.actions == () and st.recheck_after == 2.0
    r = plan_step(r, StepFacts(), s, now + timedelta(seconds=2)).remediation
    assert r.phase is Phase.REPLACING

    st = plan_step(r, StepFacts(pool_nodes=spares("h100-spare-0", "h100-spare-1")), s, now)
    assert st.actions == () and st.remediation.replacement == "h100-spare-0"
    r = st.remediation
    st = plan_step(r, StepFacts(pool_nodes=spares("h100-spare-1")), s, now)  # the recorded choice wins
    # quarantined for the repair loop that takes the node next (issue 25)
    assert st.actions[:2] == (PromoteSpare("h100-spare-0", "h100-0", "h100"), Quarantine("h100-0", 79, "h100", True))
    assert st.actions[2] == RequestCapacity("h100", "refill the spare used for h100-0", f"{r.name}/refill")
    r = st.remediation
    assert r.phase is Phase.RESUMING

    spare = node("h100-spare-0", role=labels.ROLE_ACTIVE, ready=True)
    # the pod moved with its Slurm name onto the spare, still drained by gpufleet: resume it
    drained = StepFacts(replacement=spare, replacement_slurm=("gpu-3",), slurm_pods=(nodeset_pod("gpu-3", spare.name),),
                        slurm=(slurm("gpu-3", "IDLE", "DRAIN", reason=f"gpufleet: XID 79 [{r.name}]"),))
    st = plan_step(r, drained, s, now)
    assert st.actions == (ResumeSlurm("gpu-3"),) and st.remediation is None
    up = replace(drained, slurm=(slurm("gpu-3"),))
    st = plan_step(r, up, s, now + timedelta(seconds=30))
    assert st.actions[0] == ReleaseJobs((41, 43)) and st.actions[1].event == "succeeded"
    assert [p for p, _ in st.remediation.phase_times] == [
        "Detected", "SlurmDraining", "Checkpointing", "Requeued", "Evicting", "Replacing", "Resuming", "Succeeded"]


def test_a_persons_drain_is_never_overwritten_and_goes_with_the_faulted_machine():
    """slurm-operator 1.2.1 clears a drain when the NodeSet pod moves (preStop DOWN, then IDLE on the new
    node: nodeset/slurmcontrol UpdateNodeWithPodInfo; Slurm 26.05 node_mgr.c update_node clears DRAIN):
    gpufleet never overwrites the person's drain, notes it on the faulted machine before the pod leaves,
    reports it, and that machine never returns to the spares while it carries it."""
    person = slurm("gpu-3", "IDLE", "DRAIN", reason="hardware check by ops")
    r = rec(node("h100-0", xid=79))
    st = plan_step(r, StepFacts(slurm_names=("gpu-3",)), spec(), T0)
    st = plan_step(st.remediation, StepFacts(slurm=(person,)), spec(), T0)
    assert st.remediation.kept_drains == ("gpu-3",)
    assert not any(isinstance(a, DrainSlurm) for a in st.actions)  # its reason is never overwritten
    assert CarryDrain("h100-0", (("gpu-3", "hardware check by ops"),)) in st.actions
    (told,) = [a for a in st.actions if isinstance(a, Notify)]
    assert told.event == "person-drain-carried" and "hardware check by ops" in told.text
    again = plan_step(replace(st.remediation, phase=Phase.SLURM_DRAINING,
                              intents=st.remediation.intents + ("notify:person-drain-carried",)),
                      StepFacts(slurm=(person,)), spec(), T0)
    assert not any(isinstance(a, Notify) for a in again.actions)  # told once
    # On the replacement the operator's IDLE made the Slurm node usable: the heal ends there.
    resuming = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0"),
                       slurm_nodes=("gpu-3",), kept_drains=("gpu-3",))
    moved = StepFacts(replacement=node("h100-spare-0", ready=True), replacement_slurm=("gpu-3",),
                      slurm=(slurm("gpu-3"),), slurm_pods=(nodeset_pod("gpu-3", "h100-spare-0"),))
    st = plan_step(resuming, moved, spec(), T0)
    assert not any(isinstance(a, ResumeSlurm) for a in st.actions) and st.remediation.phase is Phase.SUCCEEDED
    # ... and not before: drained (the preStop's DOWN and the person's DRAIN) until the operator's IDLE.
    waiting = replace(moved, slurm=(slurm("gpu-3", "DOWN", "DRAIN", reason="slurm-operator: Pod is terminating"),))
    st = plan_step(resuming, waiting, spec(), T0)
    assert st.actions == () and st.remediation is None
    # The quarantined machine that carries the drain: its repair stops for a person (it never returns to
    # the spares while it carries the drain), and goes on once the person removed it.
    from gpufleet.reconciler.core.repair import RepairFacts, stop_reason

    quarantined = node("h100-0", role=labels.ROLE_QUARANTINED)
    carrying = replace(quarantined, carried_drain='{"gpu-3": "hardware check by ops"}')
    assert "hardware check by ops" in stop_reason(r, RepairFacts(node=carrying), spec())
    assert stop_reason(r, RepairFacts(node=quarantined), spec()) == ""


def test_a_stale_pod_protection_delays_eviction_until_the_drain_timeout_then_the_pod_is_deleted():
    """slurm-operator 1.2.1 protects a NodeSet pod whose Slurm node is busy with a PDB (maxUnavailable 0,
    workerbuilder/worker_pdb.go) and relabels it at its next NodeSet sync (nodeset_sync.go): evictions
    get 429 until then. Bounded: at the drain timeout, NodeSet pods left with no job on their Slurm
    nodes are deleted and the heal goes on; pods of other kinds are left, as before."""
    s = spec(drain_timeout_seconds=60)
    r = replace(rec(node("h100-0", xid=79), Phase.EVICTING), slurm_nodes=("gpu-3",),
                drain_deadline=T0 + timedelta(seconds=60))
    # The jobs on its Slurm nodes are read only once the drain timeout passed.
    assert needs(r, T0 + timedelta(seconds=30)).jobs_on == () and needs(r, T0 + timedelta(seconds=30)).pods
    assert needs(r, T0 + timedelta(seconds=60)).jobs_on == ("gpu-3",)
    left = StepFacts(pods=(pod("slurm/h100-3", **{labels.SLINKY_POD_HOSTNAME: "gpu-3"}), pod("team/debug")))
    st = plan_step(r, left, s, T0 + timedelta(seconds=30))
    assert st.actions == (EvictPods("h100-0", ("slurm/h100-3", "team/debug")),) and st.remediation is None
    assert st.recheck_after == 2.0
    st = plan_step(r, left, s, T0 + timedelta(seconds=60))
    assert st.actions == (DeletePods("h100-0", ("slurm/h100-3",)),) and st.remediation.phase is Phase.REPLACING
    assert "still refused eviction after 60s" in st.remediation.reason and "['team/debug']" in st.remediation.reason
    assert not st.carry  # the deletion is written before it is forgotten
    # Only the Slurm namespace's: a pod elsewhere with the NodeSet label is no pod the reconciler may delete
    # (its one namespaced pod delete is in the Slurm namespace, components/reconciler.py slurm_namespace_rules).
    lookalike = replace(left, pods=left.pods + (pod("team/h100-4", **{labels.SLINKY_POD_HOSTNAME: "gpu-4"}),))
    st = plan_step(r, lookalike, s, T0 + timedelta(seconds=60))
    assert st.actions == (DeletePods("h100-0", ("slurm/h100-3",)),) and "team/h100-4" in st.remediation.reason
    busy = replace(left, jobs_on_node=(JobView(41, "RUNNING"),))
    st = plan_step(r, busy, s, T0 + timedelta(seconds=60))
    assert st.actions == () and "drain timed out after 60s" in st.remediation.reason
    assert plan_step(r, StepFacts(), s, T0 + timedelta(seconds=5)).remediation.phase is Phase.REPLACING


def test_the_operators_drain_is_left_to_the_operator():
    op = slurm("gpu-3", "IDLE", "DRAIN", reason="slurm-operator: gpufleet: XID 79")
    r = replace(rec(node("h100-0", xid=79), Phase.SLURM_DRAINING), slurm_nodes=("gpu-3",))
    assert not any(isinstance(a, DrainSlurm) for a in plan_step(r, StepFacts(slurm=(op,)), spec(), T0).actions)
    resuming = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0"), slurm_nodes=("gpu-3",))
    facts = StepFacts(replacement=node("h100-spare-0", ready=True), replacement_slurm=("gpu-3",), slurm=(op,),
                      slurm_pods=(nodeset_pod("gpu-3", "h100-spare-0"),))
    st = plan_step(resuming, facts, spec(), T0)
    assert st.actions == () and st.remediation is None  # waits until the operator undrains it
    st = plan_step(resuming, facts, spec(), T0 + timedelta(seconds=31))
    assert st.actions == () and st.remediation.phase is Phase.RESUMING  # and, after a while, says so
    assert st.remediation.waiting == "Slurm node gpu-3: it does not take jobs (DRAIN+IDLE: slurm-operator: gpufleet: XID 79)"


def test_a_node_with_no_slurm_pod_heals_on_kubernetes_alone():
    r = rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0")
    assert r.slurm_nodes == ()
    st = plan_step(r, StepFacts(replacement=node("h100-spare-0", ready=True)), spec(), T0)
    assert st.remediation.phase is Phase.SUCCEEDED
    tainted = node("h100-spare-0", ready=True, taints=(labels.SPARE_TAINT,))
    assert plan_step(r, StepFacts(replacement=tainted), spec(), T0).remediation is None


def test_grace_period_expires_then_requeue_kills():
    s = spec(grace_period_seconds=60)
    r = rec(node("h100-0", xid=79), Phase.CHECKPOINTING, jobs=(7,), grace_deadline=T0 + timedelta(seconds=60))
    running = StepFacts(jobs_on_node=(JobView(7, "RUNNING"), JobView(8, "RUNNING")))
    assert plan_step(r, running, s, T0 + timedelta(seconds=59)).remediation is None
    st = plan_step(r, running, s, T0 + timedelta(seconds=60))
    assert st.actions[0] == RequeueJobs((7, 8)) and st.remediation.jobs == (7, 8)


def test_grace_zero_sends_no_signal_and_a_delivered_signal_is_never_sent_twice():
    r = replace(rec(node("h100-0", xid=79), Phase.SLURM_DRAINING), slurm_nodes=("gpu-3",))
    jobs = StepFacts(jobs_on_node=(JobView(3, "RUNNING"),))
    st = plan_step(r, jobs, spec(grace_period_seconds=0), T0)
    assert [a.kind for a in st.actions] == ["DrainSlurm"] and st.remediation.grace_deadline == T0
    delivered = replace(r, intents=("signal:TERM",), delivered=("signal:TERM",))
    assert [a.kind for a in plan_step(delivered, jobs, spec(), T0).actions] == ["DrainSlurm"]
    begun = replace(r, intents=("signal:TERM",))  # noted, never marked sent: a crash fell in between
    assert [a.kind for a in plan_step(begun, jobs, spec(), T0).actions] == ["DrainSlurm", "SignalJobs"]


# --- admission: only replacement waits ------------------------------------------------------------

def admit(phase=Phase.REQUEUED, **a):
    r = rec(node("h100-0", xid=79), phase)
    return r, StepFacts(admission=replace(FREE, **a))


def test_opt_out_stops_before_anything_is_replaced_and_says_what_is_true():
    r = rec(node("h100-0", xid=79), Phase.REQUEUED)
    opted = pod("ml/debug-0", **{labels.DEFAULT_OPT_OUT: "true"})
    st = plan_step(r, StepFacts(pods=(opted,), admission=FREE), spec(), T0)
    assert st.remediation.phase is Phase.OPTED_OUT and "ml/debug-0" in st.remediation.reason
    assert "drained in Slurm" in st.remediation.reason and "down in Slurm" not in st.remediation.reason
    assert [a.kind for a in st.actions] == ["Notify"]
    assert "Action needed: decide what becomes of h100-0 and those pods" in st.actions[0].text
    assert plan_step(st.remediation, StepFacts(pool_nodes=spares("h100-spare-0")), spec(), T0).actions == ()


def test_the_admission_hold_waits_from_detection_writes_nothing_and_then_admits():
    r, facts = admit()
    held = plan_step(r, facts, spec(admission_hold_seconds=10), T0 + timedelta(seconds=4))
    assert held.actions == () and held.remediation is None and held.recheck_after == 6.0
    st = plan_step(r, facts, spec(admission_hold_seconds=10), T0 + timedelta(seconds=10))
    assert st.remediation.phase is Phase.EVICTING
    opted = plan_step(r, replace(facts, pods=(pod("ml/debug-0", **{labels.DEFAULT_OPT_OUT: "yes"}),)),
                      spec(admission_hold_seconds=10), T0)
    assert opted.remediation.phase is Phase.OPTED_OUT  # a person's choice does not wait


@pytest.mark.parametrize("unhealthy,held", [(1, False), (3, False), (4, True), (8, True)])
def test_storm_brake_holds_replacement_after_containment(unhealthy, held):
    r, facts = admit(unhealthy=frozenset(f"h100-{i}" for i in range(unhealthy)))
    st = plan_step(r, facts, spec(max_concurrent=100), T0)
    if held:
        assert st.remediation.phase is Phase.HELD and st.gate.reason == "TooManyUnhealthy"
        assert f"{unhealthy} of 10" in st.remediation.held_message
        assert [a.event for a in st.actions] == ["storm"]  # the page, nothing else
    else:
        assert st.remediation.phase is Phase.EVICTING and st.gate is None


def test_max_concurrent_holds_then_admits_when_a_slot_frees():
    r, facts = admit(in_flight=2)
    st = plan_step(r, facts, spec(), T0)
    assert st.remediation.phase is Phase.HELD and st.gate.reason == "MaxConcurrent" and st.recheck_after
    held = st.remediation
    assert plan_step(held, facts, spec(), T0).remediation is None  # the same gate: nothing to write
    st = plan_step(held, replace(facts, admission=replace(FREE, in_flight=1)), spec(), T0)
    assert st.remediation.phase is Phase.EVICTING and st.remediation.held_message == ""


def test_attempt_cap_escalates_after_containment_and_pages():
    r, facts = admit(attempts=2)
    st = plan_step(r, facts, spec(max_attempts_per_node=2), T0)
    assert st.remediation.phase is Phase.ESCALATED and "quarantined for a human" in st.remediation.reason
    assert [a.kind for a in st.actions] == ["Quarantine", "Notify"] and st.actions[1].severity == "critical"


def test_admission_counts_nodes_unhealthy_now_never_opted_out_nodes():
    """Cluster API's maxUnhealthy counts the machines unhealthy now: a finished heal whose node is still out
    (quarantined, its repair under way) counts; a node repaired and returned, or retired, does not."""
    s = spec()
    pool = [node("h100-0", xid=79), node("h100-1", role=labels.ROLE_QUARANTINED), node("h100-2", xid=79),
            node("h100-3"), node("h100-4", role=labels.ROLE_RETIRED)]
    done = rec(node("h100-1", xid=48), Phase.SUCCEEDED, created=T0 - timedelta(minutes=5))
    out = rec(node("h100-2", xid=79), Phase.OPTED_OUT)
    old = rec(node("h100-3", xid=79), Phase.SUCCEEDED, created=T0 - timedelta(hours=2))
    retired = rec(node("h100-4", xid=79), Phase.SUCCEEDED, created=T0 - timedelta(minutes=1))
    me = rec(node("h100-0", xid=79), Phase.REQUEUED)
    a = admission_facts(me, pool, [done, out, old, retired, me], s, T0)
    assert a.unhealthy == {"h100-0", "h100-1"}  # still out counts; back in service, retired, opted out do not
    assert a.in_flight == 0 and a.attempts == 0


def test_the_brake_does_not_count_a_node_healed_repaired_and_returned_minutes_ago():
    """A 2-node pool, brake at 50 %: h100-1 faulted, was healed on a spare, repaired and returned to the spares
    four minutes ago; a fault on h100-0 now is one unhealthy node of two, not a storm, and is replaced."""
    s = spec(max_unhealthy_fraction=0.5)
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={"nodes": 2, "spares": 1})] + s.pools[1:]})
    earlier = T0 - timedelta(minutes=6)
    returned = replace(rec(node("h100-1", xid=79, since=earlier), Phase.SUCCEEDED, created=earlier),
                       replacement="h100-spare-0",
                       repair=begin(RepairPhase.RETURNED, T0 - timedelta(minutes=4)))
    pool = [node("h100-0", xid=79), node("h100-1", role=labels.ROLE_SPARE, ready=True),
            node("h100-spare-0", ready=True)]
    me = rec(node("h100-0", xid=79), Phase.REQUEUED)
    a = admission_facts(me, pool, [returned, me], s, T0)
    assert a.unhealthy == {"h100-0"} and a.pool_size == 2
    st = plan_step(me, StepFacts(admission=a), s, T0)
    assert st.remediation.phase is Phase.EVICTING and st.gate is None
    # the same node still quarantined (its repair not over) is unhealthy now: 2 of 2 is a storm, and says so
    still = [node("h100-0", xid=79), node("h100-1", role=labels.ROLE_QUARANTINED), node("h100-spare-0", ready=True)]
    a = admission_facts(me, still, [replace(returned, repair=None), me], s, T0)
    st = plan_step(me, StepFacts(admission=a), s, T0)
    assert st.remediation.phase is Phase.HELD and st.gate.reason == "TooManyUnhealthy"
    assert st.gate.message.startswith("2 of 2 nodes in pool h100 unhealthy now (> 50%; unhealthy: out for a fault "
                                      "and not healthy again; 2: the active nodes the pool declares, its spares not counted)")


def test_waiting_for_a_spare_holds_no_slot():
    waiting = rec(node("a100-0", pool="a100", xid=79), Phase.WAITING_FOR_SPARE)
    me = rec(node("h100-0", xid=79), Phase.REQUEUED)
    assert admission_facts(me, [], [waiting, waiting, me], spec(), T0).in_flight == 0
    assert not Phase.WAITING_FOR_SPARE.holds_capacity and Phase.REPLACING.holds_capacity


# --- replacement ------------------------------------------------------------------------------------

def test_drain_timeout_moves_on_and_says_so():
    r = rec(node("h100-0", xid=79), Phase.EVICTING, drain_deadline=T0 + timedelta(seconds=60), reason="XID 79")
    st = plan_step(r, StepFacts(pods=(pod("a/stuck"),)), spec(), T0 + timedelta(seconds=61))
    assert st.remediation.phase is Phase.REPLACING and "drain timed out" in st.remediation.reason


def test_a_spare_a_person_drained_is_never_promoted():
    r = rec(node("h100-0", xid=79), Phase.REPLACING)
    facts = StepFacts(pool_nodes=spares("h100-spare-0", "h100-spare-1"),
                        spare_slurm=(("h100-spare-0", (slurm("s0", "IDLE", "DRAIN", reason="hardware check by ops"),)),
                                     ("h100-spare-1", (slurm("s1", "IDLE", "DRAIN", reason="gpufleet: spare"),))))
    assert plan_step(r, facts, spec(), T0).remediation.replacement == "h100-spare-1"


def test_no_spare_waits_notifies_and_asks_for_capacity_once():
    r = rec(node("a100-0", pool="a100", xid=79), Phase.REPLACING)
    st = plan_step(r, StepFacts(pool_nodes=()), spec(), T0)
    assert st.remediation.phase is Phase.WAITING_FOR_SPARE
    assert [a.kind for a in st.actions] == ["Notify", "RequestCapacity"] and st.actions[1].pool == "a100"
    w = st.remediation
    assert plan_step(w, StepFacts(), spec(), T0).remediation is None
    assert plan_step(w, StepFacts(pool_nodes=spares("a100-spare-3", pool="a100")), spec(), T0).remediation.phase \
        is Phase.REPLACING


def test_no_room_to_refill_promotes_asks_for_nothing_and_says_the_refill_failed():
    r = rec(node("h100-0", xid=79), Phase.REPLACING, replacement="h100-spare-0")
    st = plan_step(r, StepFacts(can_refill=False), spec(), T0)
    assert [a.kind for a in st.actions] == ["PromoteSpare", "Quarantine", "SettleRefill", "Notify"]
    assert st.actions[2].outcome == "Failed" and st.actions[3].event == "refill-failed"
    assert "Action needed: add capacity to pool h100" in st.actions[3].text
    assert st.remediation.refill.state == "Failed" and "no room" in st.remediation.refill.message


def test_fault_on_spare_quarantines_and_refills():
    r = rec(node("h100-spare-0", role=labels.ROLE_SPARE, xid=79), was_spare=True)
    st = plan_step(r, StepFacts(), spec(), T0)
    assert [a.kind for a in st.actions] == ["Notify", "Cordon", "EvictPods", "Quarantine", "RequestCapacity"]  # borrowers go too
    st = plan_step(st.remediation, StepFacts(), spec(), T0)
    assert st.remediation.phase is Phase.SUCCEEDED and st.actions == ()


def test_a_step_carries_only_when_its_loss_replays_the_same():
    """Carried steps are written with the next one; these must be written before anything follows."""
    s = spec(grace_period_seconds=0)
    n = node("h100-0", xid=79)
    det = plan_step(rec(n), StepFacts(slurm_names=("gpu-3",)), s, T0)
    assert det.carry  # the cordon: a restart without the record detects the fault again and cordons again
    draining = det.remediation
    no_jobs = plan_step(draining, StepFacts(slurm=(slurm("gpu-3"),)), s, T0)
    with_jobs = plan_step(draining, StepFacts(slurm=(slurm("gpu-3", "MIXED"),), jobs_on_node=(JobView(7, "RUNNING"),)),
                          s, T0)
    assert no_jobs.carry and not with_jobs.carry  # requeued jobs are off the node: only the record knows them
    requeued = plan_step(no_jobs.remediation, StepFacts(), s, T0)
    assert requeued.remediation.phase is Phase.REQUEUED and not requeued.carry  # the end of containment is written
    evicting = plan_step(requeued.remediation, StepFacts(admission=FREE), s, T0)
    assert evicting.remediation.phase is Phase.EVICTING and evicting.carry
    replacing = plan_step(evicting.remediation, StepFacts(), s, T0)
    assert replacing.remediation.phase is Phase.REPLACING and replacing.carry
    chosen = plan_step(replacing.remediation, StepFacts(pool_nodes=spares("h100-spare-0")), s, T0)
    assert chosen.remediation.replacement == "h100-spare-0" and not chosen.carry  # a restart promotes the same spare
    promoted = plan_step(chosen.remediation, StepFacts(pool_nodes=spares("h100-spare-0")), s, T0)
    assert promoted.remediation.phase is Phase.RESUMING and promoted.carry
    on_spare = plan_step(rec(node("h100-spare-0", role=labels.ROLE_SPARE, xid=79), was_spare=True), StepFacts(), s, T0)
    assert not on_spare.carry  # quarantined, the node would be invisible to detect: the record goes first
    held = plan_step(requeued.remediation, StepFacts(admission=replace(FREE, in_flight=2)), s, T0)
    assert held.remediation.phase is Phase.HELD and not held.carry


def test_containment_needs_nothing_from_slurm():
    """Slurm down at the fault: the cordon still goes out first (the Detected step asks Slurm nothing)."""
    st = plan_step(rec(node("h100-0", xid=79)), StepFacts(slurm_names=("gpu-3",)), spec(), T0)
    assert any(a.kind == "Cordon" for a in st.actions) and st.remediation.slurm_nodes == ("gpu-3",)


def test_replacement_never_ready_fails_with_reason():
    r = rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0")
    st = plan_step(r, StepFacts(), spec(), T0 + timedelta(minutes=11))
    assert st.remediation.phase is Phase.FAILED and "not taking jobs" in st.remediation.reason
    assert st.actions[0].severity == "critical"


# --- failures -------------------------------------------------------------------------------------

def test_retry_backs_off_in_time_and_outlives_a_minute_long_outage():
    s = spec()  # retry budget 900 s by default
    r = rec(node("h100-0", xid=79), Phase.CHECKPOINTING)
    now = T0
    for i in range(8):
        st = retry(r, "Slurm: connection refused", s, now)
        r = st.remediation
        assert r.phase is Phase.CHECKPOINTING and r.failing_since == T0 and r.retries == i + 1
        assert r.next_attempt == now + timedelta(seconds=min(30, 0.5 * 2 ** i))
        now = r.next_attempt
    assert (now - T0).total_seconds() > 60
    st = retry(r, "Slurm: connection refused", s, T0 + timedelta(seconds=901))
    assert st.remediation.phase is Phase.FAILED and "over 901s" in st.remediation.reason
    ok = plan_step(r, StepFacts(), s, now)  # back in time: the next move clears the failure
    assert ok.remediation.failing_since is None and ok.remediation.retries == 0


def test_fail_from_live_phase_and_transitions_are_enforced():
    r = rec(node("h100-0", xid=79), Phase.EVICTING)
    assert fail(r, "API server gone", T0).remediation.phase is Phase.FAILED
    with pytest.raises(InvalidTransition):
        r.moved(Phase.SUCCEEDED, T0)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.SUCCEEDED, Phase.FAILED)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.OPTED_OUT, Phase.REPLACING)  # only a person moves it on, to Evicting
    with pytest.raises(InvalidTransition):
        check_transition(Phase.DETECTED, Phase.ESCALATED)  # containment first, always


# --- what a step reads, and when it is looked at again ----------------------------------------------

def test_the_core_says_what_each_step_reads_and_containment_asks_slurm_nothing():
    r = rec(node("h100-0", xid=79))
    assert needs(r, T0).slurm_names and not needs(r, T0).asks_slurm and not needs(r, T0).shared
    draining = replace(r, phase=Phase.SLURM_DRAINING, slurm_nodes=("gpu-3",))
    assert needs(draining, T0).slurm_nodes == ("gpu-3",) and needs(draining, T0).jobs_on == ("gpu-3",)
    assert needs(replace(r, phase=Phase.REQUEUED), T0).admission and needs(replace(r, phase=Phase.HELD), T0).pods
    replacing = replace(r, phase=Phase.REPLACING)
    assert needs(replacing, T0).spares and needs(replacing, T0).shared and needs(replacing, T0).asks_slurm
    assert not needs(replace(r, phase=Phase.WAITING_FOR_SPARE), T0).can_refill  # no provider call while waiting
    assert needs(replace(r, phase=Phase.RESUMING, replacement="s"), T0).replacement_slurm
    assert needs(replace(r, phase=Phase.SUCCEEDED), T0) == needs(replace(r, phase=Phase.OPTED_OUT), T0)


def test_one_function_says_when_a_remediation_is_looked_at_again():
    r = rec(node("h100-0", xid=79), Phase.CHECKPOINTING, grace_deadline=T0)
    assert next_look(None, None, False, T0) is None
    assert next_look(replace(r, phase=Phase.SUCCEEDED), None, True, T0) is None
    assert next_look(replace(r, next_attempt=T0 + timedelta(seconds=4)), None, False, T0) == 4.0
    waits = plan_step(r, StepFacts(jobs_on_node=(JobView(1, "RUNNING"),)), spec(), T0 - timedelta(seconds=5))
    assert next_look(r, waits, False, T0) == waits.recheck_after == 1.0
    moved = plan_step(r, StepFacts(), spec(), T0)
    assert next_look(moved.remediation, moved, True, T0) == 0.0  # its next step follows at once


def test_a_new_signal_is_noted_on_the_node_for_occurrences():
    s = spec(occurrences=3, occurrence_window_seconds=600)
    n = node("h100-0", xid=79, since=T0, signals=tuple(T0 - timedelta(seconds=i) for i in range(12, 0, -1)))
    d = detect(n, [], s, T0)
    (note,) = [a for a in d.actions if isinstance(a, NoteSignals)]
    assert note.signals[-1] == T0 and len(note.signals) == 10  # the newest ten
    assert detect(replace(n, signals=note.signals), [], s, T0).actions == ()  # noted: not again
    assert detect(node("h100-0", xid=79), [], spec(), T0).actions == ()  # one occurrence is enough: nothing noted


# --- the choice of a spare --------------------------------------------------------------------------

def test_one_function_chooses_the_spare_from_the_pools_nodes():
    r = rec(node("h100-0", xid=79), Phase.REPLACING)
    pool = (node("h100-spare-0", role=labels.ROLE_SPARE, ready=False),  # not Ready
            node("h100-spare-1", role=labels.ROLE_SPARE, xid=48),  # faulted itself
            node("h100-spare-2", role=labels.ROLE_SPARE, unschedulable=True),  # cordoned
            node("h100-spare-3", role=labels.ROLE_SPARE),  # another remediation's
            node("h100-spare-4", role=labels.ROLE_SPARE, lent="spare"),  # lent: taken last
            node("h100-spare-5", role=labels.ROLE_SPARE),
            node("h100-1"))  # active
    st = plan_step(r, StepFacts(pool_nodes=pool, claimed=frozenset({"h100-spare-3"})), spec(), T0)
    assert st.remediation.replacement == "h100-spare-5"
    st = plan_step(r, StepFacts(pool_nodes=pool, claimed=frozenset({"h100-spare-3", "h100-spare-5"})), spec(), T0)
    assert st.remediation.replacement == "h100-spare-4"
    st = plan_step(r, StepFacts(pool_nodes=pool, claimed=frozenset({"h100-spare-3", "h100-spare-4", "h100-spare-5"})),
                   spec(), T0)
    assert st.remediation.phase is Phase.WAITING_FOR_SPARE


# --- the storm page: once per pool, kept on a remediation -------------------------------------------

def test_the_storm_page_is_sent_by_one_held_remediation_and_noted_on_it():
    storm = frozenset(f"h100-{i}" for i in range(4))
    r, facts = admit(unhealthy=storm)
    st = plan_step(r, facts, spec(max_concurrent=100), T0)
    (page,) = [a for a in st.actions if a.kind == "Notify"]
    assert page.event == "storm" and page.once == "notify:storm" and "4 of 10" in page.text
    assert plan_step(r, replace(facts, admission=replace(facts.admission, storm_paged=True)), spec(max_concurrent=100),
                     T0).actions == ()  # another remediation of the pool sent it
    paged = replace(st.remediation, intents=("notify:storm",))
    a = admission_facts(rec(node("h100-5", xid=79), Phase.REQUEUED), [], [paged], spec(), T0)
    assert a.storm_paged
    done = replace(paged, phase=Phase.SUCCEEDED)
    assert not admission_facts(rec(node("h100-5", xid=79), Phase.REQUEUED), [], [done], spec(), T0).storm_paged
    held_again = plan_step(st.remediation, facts, spec(max_concurrent=100), T0)  # held, its page not noted: it pages
    assert [a.event for a in held_again.actions] == ["storm"] and held_again.remediation is not None


# --- a replacement that breaks before its remediation succeeds (issue 23) -----------------------------

def test_a_chosen_spare_that_faults_before_its_promotion_is_given_up_and_another_chosen():
    r = rec(node("h100-0", xid=79), Phase.REPLACING, replacement="h100-spare-0")
    faulted = node("h100-spare-0", role=labels.ROLE_SPARE, xid=79, ready=True)
    st = plan_step(r, StepFacts(pool_nodes=(faulted,) + spares("h100-spare-1")), spec(), T0)
    assert not any(isinstance(a, PromoteSpare) for a in st.actions)
    assert [(a.kind, a.event) for a in st.actions] == [("Notify", "replacement-failed")]
    given_up = st.remediation
    assert given_up.phase is Phase.REPLACING and given_up.replacement is None and st.carry
    assert [f.node for f in given_up.failed_replacements] == ["h100-spare-0"]
    st = plan_step(given_up, StepFacts(pool_nodes=(faulted,) + spares("h100-spare-1")), spec(), T0)
    assert st.remediation.replacement == "h100-spare-1"


def test_a_promoted_spare_that_breaks_while_resuming_sends_the_remediation_back_to_replacing():
    r = rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0")
    broke = node("h100-spare-0", xid=48, ready=True)  # promoted: active now
    st = plan_step(r, StepFacts(replacement=broke), spec(), T0 + timedelta(seconds=20))
    assert st.remediation.phase is Phase.REPLACING and st.remediation.replacement is None
    assert st.remediation.failed_replacements[0].at == T0 + timedelta(seconds=20)
    assert st.actions[0].once == "notify:replacement-failed:h100-spare-0"  # one page per broken replacement
    # the third broken replacement: something other than the spares is wrong
    third = replace(r, failed_replacements=st.remediation.failed_replacements * 2)
    st = plan_step(third, StepFacts(replacement=broke), spec(), T0)
    assert st.remediation.phase is Phase.FAILED and "3 replacements broke" in st.remediation.reason
    assert st.actions[0].severity == "critical"


def test_a_spare_that_broke_standing_in_is_counted_once_by_the_brake_and_replaces_nothing():
    """Pool of 4, brake at 25 %: h100-0 and the spare promoted for it are one position, not two."""
    s = spec(max_unhealthy_fraction=0.25)
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={"nodes": 4})] + s.pools[1:]})
    r = rec(node("h100-0", xid=79), Phase.REPLACING,
            failed_replacements=(ReplacementFailure("h100-spare-0", T0, "h100-spare-0 reported XID 79"),))
    x = rec(node("h100-spare-0", xid=79), Phase.REQUEUED)
    a = admission_facts(x, [node("h100-spare-0", xid=79, ready=True)], [r, x], s, T0)
    assert a.unhealthy == frozenset({"h100-0"}) and a.stands_in_for == r.name
    st = plan_step(x, StepFacts(admission=a, pods=(pod("slurm/worker-0", "h100-spare-0"),)), s, T0)
    assert st.remediation.phase is Phase.EVICTING and st.remediation.stands_in_for == r.name and st.gate is None
    assert admission_facts(r, [], [r, st.remediation], s, T0).in_flight == 0  # it holds no slot
    evicted = plan_step(st.remediation, StepFacts(), s, T0 + timedelta(seconds=1)).remediation
    st = plan_step(evicted, StepFacts(), s, T0 + timedelta(seconds=1))
    assert [a.kind for a in st.actions] == ["Quarantine", "RequestCapacity"] and st.remediation.phase is Phase.SUCCEEDED
    assert not any(isinstance(a, PromoteSpare) for a in st.actions)
    # without the stand-in, the same two nodes are a storm in a pool of 4
    other = rec(node("h100-1", xid=79), Phase.REQUEUED)
    assert len(admission_facts(other, [], [replace(r, failed_replacements=()), x, other], s, T0).unhealthy) == 3


# --- success only when the Slurm nodes the remediation moved are back (issue 23) ------------------------

def test_a_heal_is_not_a_success_while_its_own_slurm_nodes_pod_can_be_placed_nowhere():
    """The replacement is ready, the remediation's own Slurm node waits Pending with nowhere to go. Not
    Succeeded: the record says why at once, and the timeout fails it with that. (Another Slurm node's pod on the
    replacement instead: the spare is given up and another taken, see the two-heals tests below.)"""
    r = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0"), slurm_nodes=("gpu-3",))
    why = "0/12 nodes are available: 11 node(s) had untolerated taint {gpufleet.io/spare: true}, 1 node(s) were unschedulable."
    facts = StepFacts(replacement=node("h100-spare-0", ready=True), replacement_slurm=(),
                      slurm=(), slurm_pods=(nodeset_pod("gpu-3", unschedulable=why),))
    st = plan_step(r, facts, spec(), T0)
    assert st.remediation.phase is Phase.RESUMING and not any(a.kind == "ReleaseJobs" for a in st.actions)
    assert st.remediation.waiting == f"Slurm node gpu-3: pod slurm/slurm-worker-gpu-3 cannot be scheduled: {why}"
    st = plan_step(st.remediation, facts, spec(), T0 + timedelta(minutes=11))
    assert st.remediation.phase is Phase.FAILED and why in st.remediation.reason
    # once its pod runs on the replacement and Slurm takes jobs there, it succeeds
    back = replace(facts, replacement_slurm=("gpu-3", "gpu-9"), slurm=(slurm("gpu-3"), slurm("gpu-9")),
                   slurm_pods=(nodeset_pod("gpu-3", "h100-spare-0"),))
    assert plan_step(r, back, spec(), T0).remediation.phase is Phase.SUCCEEDED
    still_drained = replace(back, slurm=(slurm("gpu-3", "IDLE", "DRAIN", reason="slurm-operator: x"), slurm("gpu-9")))
    assert plan_step(r, still_drained, spec(), T0).remediation is None


def test_a_slurm_node_still_on_a_broken_replacement_is_not_resumed_there():
    """The pod of h100-0's Slurm node is still on the replacement that broke (its own remediation drained it
    there and contains it): the remediation waits for the pod to land on the new replacement, then resumes."""
    r = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-1"), slurm_nodes=("gpu-3",),
                failed_replacements=(ReplacementFailure("h100-spare-0", T0, "h100-spare-0 reported XID 79"),))
    drained = slurm("gpu-3", "IDLE", "DRAIN", reason="gpufleet: XID 79 [h100-spare-0-xid79-1]")
    on_broken = StepFacts(replacement=node("h100-spare-1", ready=True), slurm=(drained,),
                          slurm_pods=(nodeset_pod("gpu-3", "h100-spare-0"),))
    st = plan_step(r, on_broken, spec(), T0)
    assert not any(isinstance(a, ResumeSlurm) for a in st.actions) and st.remediation is None
    moved = replace(on_broken, replacement_slurm=("gpu-3",), slurm_pods=(nodeset_pod("gpu-3", "h100-spare-1"),))
    assert plan_step(r, moved, spec(), T0).actions == (ResumeSlurm("gpu-3"),)


# --- two heals, one spare: the scheduler decides which Slurm node the promoted spare takes ----------------

WHY_PENDING = "0/4 nodes are available: 1 node(s) had untolerated taint {gpufleet.io/quarantined: true}, 3 node(s) didn't match pod anti-affinity rules."


def test_a_spare_the_scheduler_gave_to_another_slurm_node_is_given_up_and_counted_by_that_ones_heal():
    """h100-0 and h100-1 (Slurm nodes gpu-0, gpu-1) fault together; one spare. h100-0's remediation promoted
    h100-spare-0, h100-1's waits for a spare; the scheduler put gpu-1 on h100-spare-0 and gpu-0 can go nowhere.
    Neither waits on the other: h100-0's gives the spare up (the record says why) and waits for another,
    h100-1's counts it as its replacement, quarantines its node (for its repair) and succeeds."""
    s = spec()
    a = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0"), slurm_nodes=("gpu-0",))
    b = replace(rec(node("h100-1", xid=79), Phase.WAITING_FOR_SPARE), slurm_nodes=("gpu-1",))
    promoted = node("h100-spare-0", ready=True)  # promoted: active, untainted
    pods = (nodeset_pod("gpu-0", unschedulable=WHY_PENDING), nodeset_pod("gpu-1", "h100-spare-0"))
    on_spare = StepFacts(replacement=promoted, replacement_slurm=("gpu-1",), slurm=(slurm("gpu-1"),), slurm_pods=pods)
    st = plan_step(a, on_spare, s, T0)
    assert st.remediation.phase is Phase.REPLACING and st.remediation.replacement is None and not st.carry
    assert "h100-spare-0 took Slurm node(s) gpu-1 instead of gpu-0" in st.remediation.reason
    assert st.remediation.failed_replacements == ()  # the spare did not break
    pool = (node("h100-0", xid=79, unschedulable=True), node("h100-1", xid=79, unschedulable=True), promoted)
    nothing_free = StepFacts(pool_nodes=pool, claimed=frozenset({"h100-spare-0"}), slurm_pods=pods)
    st = plan_step(st.remediation, nothing_free, s, T0)
    assert st.remediation.phase is Phase.WAITING_FOR_SPARE and st.remediation.replacement is None
    # h100-1's remediation: its Slurm node runs on a healthy node of the pool: that node is its replacement
    st = plan_step(b, nothing_free, s, T0)
    assert st.remediation.phase is Phase.REPLACING and st.carry
    st = plan_step(st.remediation, nothing_free, s, T0)
    assert st.remediation.phase is Phase.RESUMING and st.remediation.replacement == "h100-spare-0"
    assert st.actions == (Quarantine("h100-1", 79, "h100", True),) and "came back on h100-spare-0" in st.remediation.reason
    assert not any(isinstance(x, (PromoteSpare, RequestCapacity)) for x in st.actions)
    st = plan_step(st.remediation, on_spare, s, T0)
    assert st.remediation.phase is Phase.SUCCEEDED


def test_a_slurm_node_still_on_its_faulted_node_or_a_pod_merely_pending_changes_no_spare():
    """Nothing is given up or adopted on a guess: a pod still on the faulted node is not back; a replacement whose
    own Slurm node's pod is not placed yet (no word from the scheduler) is waited on."""
    s = spec()
    b = replace(rec(node("h100-1", xid=79), Phase.WAITING_FOR_SPARE), slurm_nodes=("gpu-1",))
    pool = (node("h100-1", xid=79, unschedulable=True), node("h100-spare-0", ready=True))
    assert plan_step(b, StepFacts(pool_nodes=pool, slurm_pods=(nodeset_pod("gpu-1", "h100-1"),)), s, T0).remediation is None
    a = replace(rec(node("h100-0", xid=79), Phase.RESUMING, replacement="h100-spare-0"), slurm_nodes=("gpu-0",))
    pending = StepFacts(replacement=node("h100-spare-0", ready=True), replacement_slurm=("gpu-1",),
                        slurm=(slurm("gpu-1"),), slurm_pods=(nodeset_pod("gpu-0"),))
    st = plan_step(a, pending, s, T0)
    assert st.remediation is None or st.remediation.phase is Phase.RESUMING


# --- who reported the faults (issue 24): a burst one writer could forge is contained, and named -----------

def _node_written_by(name: str, *managers: tuple[str, str]) -> dict:
    """A node whose GPU condition is False (XID 79), with the managedFields entries (manager, operation) of
    the API server: each later update takes the fields it changed (here: the whole condition)."""
    key = 'k:{"type":"GpuHealthy"}'
    fields = {".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {},
              "f:status": {}, "f:type": {}}
    return {"metadata": {"name": name, "labels": {labels.NODE_POOL: "h100", labels.ROLE: labels.ROLE_ACTIVE},
                         "managedFields": [
                             {"manager": "kubelet", "operation": "Update", "subresource": "status",
                              "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {"f:status": {}}}}}},
                             *({"manager": m, "operation": op, "subresource": "status",
                                "fieldsV1": {"f:status": {"f:conditions": {key: fields}}}} for m, op in managers)]},
            "status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "GpuHealthy", "status": "False", "reason": "Xid79", "message": "off the bus",
                                       "lastTransitionTime": "2026-11-29T12:00:00Z"}]}}


def test_a_fault_names_who_wrote_its_condition_from_the_nodes_managed_fields():
    v = node_view(_node_written_by("h100-0", (labels.MANAGER_AGENT, "Update")), ["GpuHealthy"])
    assert v.fault.xid == 79 and v.fault.reporter == labels.MANAGER_AGENT
    # a later writer of the condition (a person's kubectl) owns it now; the kubelet's Ready is not the fault's
    v = node_view(_node_written_by("h100-0", (labels.MANAGER_AGENT, "Update"), ("kubectl-patch", "Update")),
                  ["GpuHealthy"])
    assert v.fault.reporter == "kubectl-patch"
    bare = _node_written_by("h100-0")
    bare["metadata"].pop("managedFields")
    assert node_view(bare, ["GpuHealthy"]).fault.reporter == ""  # unknown: said so, never guessed
    # the remediation keeps it (the record's spec.fault.reportedBy)
    d = detect(node_view(_node_written_by("h100-0", ("kubectl-patch", "Update")), ["GpuHealthy"]), [], spec(), T0)
    assert d.remediation.reporter == "kubectl-patch"


def _storm_of(writer) -> tuple:
    """Four faulted nodes of pool h100 (10 nodes, brake at 30%), node i's fault reported by writer(i)."""
    faulted = [replace(node(f"h100-{i}", xid=79), fault=replace(node(f"h100-{i}", xid=79).fault, reporter=writer(i)))
               for i in range(4)]
    r = replace(rec(faulted[0], Phase.REQUEUED), reporter=writer(0))
    a = admission_facts(r, faulted, [r], spec(max_concurrent=100), T0)
    return r, a, plan_step(r, StepFacts(admission=a), spec(max_concurrent=100), T0)


def test_a_storm_one_writer_reported_is_still_contained_and_the_record_and_page_name_it():
    r, a, st = _storm_of(lambda i: "kubectl-patch")
    assert a.reporters == tuple((f"h100-{i}", "kubectl-patch") for i in range(4))
    assert st.remediation.phase is Phase.HELD and st.gate.reason == "TooManyUnhealthy"  # contained, held
    (page,) = [x for x in st.actions if x.kind == "Notify"]
    for text in (st.remediation.held_message, page.text):
        assert "reported by kubectl-patch on h100-0, h100-1, h100-2, h100-3" in text
        assert "kubectl-patch alone reported faults on several nodes" in text and "forged" in text


def test_a_storm_each_nodes_own_agent_reported_names_them_without_the_warning():
    r, a, st = _storm_of(lambda i: labels.MANAGER_AGENT if i < 3 else "node-problem-detector")
    (page,) = [x for x in st.actions if x.kind == "Notify"]
    assert (f"reported by the node agent ({labels.MANAGER_AGENT}) on h100-0, h100-1, h100-2; node-problem-detector on "
            "h100-3" in page.text)
    assert "alone reported" not in page.text
    _, _, unknown = _storm_of(lambda i: "")
    assert "reported by an unknown writer on h100-0, h100-1, h100-2, h100-3" in unknown.remediation.held_message
    assert "alone reported" not in unknown.remediation.held_message  # unknown is not one writer
    _, _, drill = _storm_of(lambda i: labels.MANAGER_INJECT_FAULT)
    assert f"reported by a person (gpufleet inject-fault) ({labels.MANAGER_INJECT_FAULT}) on h100-0" in \
        drill.remediation.held_message
