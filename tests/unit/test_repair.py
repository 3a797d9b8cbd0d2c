"""The repair loop (issue 25) through the runtime with fakes and a fake clock: replace first, repair after;
the ladder; validation before service; the lemon rule; relapses; what stops the loop; a person's commands
(issue 23, item 7). FakeNodes stands in for each node's agent and GPUs (healthy, or broken in a way a reset,
a reboot or nothing fixes); FakeChecks for the health-check Jobs.
"""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from fleetspec import labels
from fleetspec.node_repair import parse_check
from fleetspec.oncall import MARK_HEALTHY, RELEASE, RETIRE, RETURN, PersonRequest
from reconciler.adapters.records import to_object
from reconciler.core import repair
from reconciler.core.model import Remediation
from reconciler.core.phases import Phase
from reconciler.core.repair import RepairFacts, plan_repair
from reconciler.core.repair_actions import RequestRepair, Retire
from reconciler.core.observe import node_view
from reconciler.core.repair_phases import RepairPhase, begin
from tests.unit.fakes import T0, FakeNodes, World, fleet, pool_node


def world(nodes=4, spares=2, **healing) -> World:
    return World(fleet(nodes=nodes, spares=spares, grace_period_seconds=0, **healing), operator=True)


def node(w: World, name: str) -> dict:
    return w.kube.nodes[name]


def role(w: World, name: str) -> str:
    return node(w, name)["metadata"]["labels"][labels.ROLE]


def gpu_condition(w: World, name: str) -> dict:
    return next(c for c in node(w, name)["status"]["conditions"] if c["type"] == "GpuHealthy")


def ask(w: World, rem: str, action: str, by: str = "oncall") -> None:
    """What `gpufleet <action>` writes: the request on the remediation (an annotation: the person's)."""
    obj = json.loads(w.store.objects[rem])
    req = PersonRequest(action, by, w.clock.now)
    obj["metadata"].setdefault("annotations", {})[labels.ONCALL_REQUEST] = req.dumps()
    w.store.objects[rem] = json.dumps(obj)


# --- replace first, repair after --------------------------------------------------------------------

def test_a_reboot_fixable_fault_heals_on_a_spare_then_the_node_comes_back_as_a_proven_spare():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0", xid=79)  # fallen off the bus: the catalogue's action is a reboot
    w.run(seconds=5)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0"  # the job's path is unchanged
    assert r.repair is not None and r.repair.phase is RepairPhase.REPAIRING and r.repair.step == "reboot"
    w.run(seconds=200)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED, r.repair
    assert [p for p, _ in r.repair.phase_times] == ["Repairing", "Validating", "Returned"]
    assert [x[0] for x in w.hardware.reboots] == ["h100-0"] and w.hardware.resets == []
    assert role(w, "h100-0") == labels.ROLE_SPARE and not node(w, "h100-0")["spec"].get("unschedulable")
    check = parse_check(node(w, "h100-0")["metadata"]["annotations"][labels.HEALTH_CHECK])
    assert check.passed and check.boot == node(w, "h100-0")["status"]["nodeInfo"]["bootID"] != "boot-1"
    assert (gpu_condition(w, "h100-0")["status"], gpu_condition(w, "h100-0")["reason"]) == ("True", "HealthCheckPassed")
    assert "retired" not in w.notifier.sent
    events = [c[1] for c in w.kube.calls if c[0] == "event"]
    assert {"RebootRequested", "HealthCheckStarted", "NodeReturned"} <= set(events)
    m = w.manager.metrics
    assert m.repairs.labels("h100", "returned")._value.get() == 1
    assert m.time_to_return._sum.get() > 0


def test_the_returned_node_takes_the_next_fault():
    """Back among the spares, proven: the next fault promotes it like any spare."""
    w = world(spares=1)
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=200)
    assert w.remediation("h100-0").repair.phase is RepairPhase.RETURNED
    w.fault("h100-1")
    w.run(seconds=10)
    assert w.remediation("h100-1").replacement == "h100-0"


def test_a_heal_waiting_for_a_spare_takes_the_node_the_loop_returns():
    """No spare and no refill: the second fault's job waits; the first node, repaired and proven, is the spare
    it takes: a spare the repair loop returns serves a waiting heal like any proven spare (bench/repair_month.py's
    week at 10.5x asked whether it did; there l40s's waits had no returned node to take)."""
    w = world(spares=1)
    w.hardware.state["h100-0"] = FakeNodes.RESET_FIXES
    w.fault("h100-0", xid=48)  # double-bit ECC: a reset
    w.run(seconds=5)
    w.fault("h100-1", xid=79)
    w.run(seconds=5)
    assert w.remediation("h100-1").phase is Phase.WAITING_FOR_SPARE
    w.run(seconds=120, step=5)
    assert w.remediation("h100-0").repair.phase is RepairPhase.RETURNED
    r = w.remediation("h100-1")
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-0", r
    assert role(w, "h100-0") == labels.ROLE_ACTIVE

def test_a_node_nothing_fixes_climbs_the_ladder_and_is_retired_with_its_history_and_a_page():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.fault("h100-0")
    w.run(seconds=400)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED
    assert [(e.step, e.outcome) for e in r.repair.history] == [
        ("reboot", "asked"), ("reboot", "ok"), ("validate", "failed"), ("retire", "ok")]
    assert "failed its health check" in r.repair.reason and "needs the vendor" in r.repair.reason
    assert role(w, "h100-0") == labels.ROLE_RETIRED and ("retire", "h100-0") in w.provider.calls
    assert w.notifier.sent.count("retired") == 1
    assert not [c for c in w.provider.calls if c == ("capacity", f"{r.name}/retire")]  # the heal refilled already
    w.run(seconds=60)
    assert w.notifier.sent.count("retired") == 1 and len(w.hardware.reboots) == 1


def test_a_reboot_that_never_comes_back_times_out_and_retires():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.hardware.reboot_seconds = 10_000  # never Ready again within the pool's reboot timeout
    w.fault("h100-0")
    w.run(seconds=1300, step=5)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED and "gave no sign of success within 1200s" in r.repair.reason


def test_a_pool_that_allows_no_rung_retires_what_it_cannot_repair():
    spec = fleet(nodes=4, spares=2, grace_period_seconds=0)
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(
        update={"repair": spec.pools[0].repair.model_copy(update={"actions": ["reset-gpu"]})})]})
    w = World(spec, operator=True)
    w.fault("h100-0")  # needs a reboot; the pool allows only resets
    w.run(seconds=20)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED and "allows ['reset-gpu']" in r.repair.reason
    assert w.hardware.reboots == [] and w.hardware.resets == []


def test_the_loop_off_leaves_the_node_quarantined_as_before():
    w = world(repair={"enabled": False})
    w.fault("h100-0")
    w.run(seconds=100)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.repair is None and role(w, "h100-0") == labels.ROLE_QUARANTINED


# --- validation before service ------------------------------------------------------------------------

def test_a_bad_spare_is_never_promoted():
    """Fresh spares are unproven: each is health-checked first. The one whose GPUs are broken fails, is
    quarantined as a remediation of its own (refilled, then repaired), and the fault takes the good one."""
    w = world()
    for name in ("h100-spare-0", "h100-spare-1"):
        w.kube.nodes[name] = pool_node(w.spec.pool("h100"), name, labels.ROLE_SPARE, proven=False)
    w.hardware.state["h100-spare-0"] = FakeNodes.BROKEN
    w.fault("h100-0")
    w.run(seconds=60)
    promoted = [c[1] for c in w.provider.calls if c[0] == "promote"]
    assert promoted == ["h100-spare-1"]
    assert w.remediation("h100-0").replacement == "h100-spare-1"
    bad = w.remediation("h100-spare-0")
    assert bad.was_spare and "failed its health check" in bad.reason
    assert role(w, "h100-spare-0") in (labels.ROLE_QUARANTINED, labels.ROLE_RETIRED)
    assert "no-spare" not in w.notifier.sent  # it waited for the checks, not paged for a spare
    assert w.manager.metrics.health_checks.labels("h100", "failed")._value.get() == 1


def test_a_spare_that_rebooted_is_checked_again_before_it_serves():
    w = world()
    spare = node(w, "h100-spare-0")
    spare["status"]["nodeInfo"]["bootID"] = "boot-after-a-reboot"  # its passed check was on boot-1
    w.run(seconds=1)
    assert parse_check(spare["metadata"]["annotations"][labels.HEALTH_CHECK]).state == "running"
    w.run(seconds=40)
    check = parse_check(spare["metadata"]["annotations"][labels.HEALTH_CHECK])
    assert check.proves("boot-after-a-reboot")


# --- the lemon rule, relapses, what stops the loop ---------------------------------------------------------

def earlier(name: str, node: str, days_ago: float, returned_after: float = 300, rung: str = "reboot") -> Remediation:
    at = T0 - timedelta(days=days_ago)
    back = at + timedelta(seconds=returned_after)
    rep = begin(RepairPhase.REPAIRING, at, step=rung, rungs=(rung,))
    rep = rep.moved(RepairPhase.VALIDATING, at + timedelta(seconds=60)).moved(RepairPhase.RETURNED, back)
    return Remediation(name=name, node=node, pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED, created=at,
                       phase_times=(("Succeeded", at),), repair=rep)


def test_a_node_that_faults_three_times_in_the_window_is_retired_with_its_history():
    w = world()
    for i, days in enumerate((6, 2)):
        r = earlier(f"h100-0-old-{i}", "h100-0", days)
        w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-0")
    w.run(seconds=20)
    r = max((x for x in w.store.list() if x.node == "h100-0"), key=lambda x: x.created)
    assert r.phase is Phase.SUCCEEDED  # the job was healed first, as always
    assert r.repair.phase is RepairPhase.RETIRED and "a lemon: 3 faults within 7 days" in r.repair.reason
    assert w.hardware.reboots == [] and w.notifier.sent.count("retired") == 1


def test_two_faults_in_the_window_are_repaired_not_retired():
    w = world()
    r = earlier("h100-0-old", "h100-0", 6)
    w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-0")
    w.run(seconds=10)
    newest = max((x for x in w.store.list() if x.node == "h100-0"), key=lambda x: x.created)
    assert newest.repair.phase is RepairPhase.REPAIRING


def facts_for(r: Remediation, w_node: dict, history=(), promotions=()) -> RepairFacts:
    return RepairFacts(node=node_view(w_node, ["GpuHealthy"]), history=tuple(history) + (r,),
                       promotions=tuple(promotions))


def test_a_relapse_within_min_healthy_seconds_counts_against_the_node_and_starts_a_rung_higher():
    spec = fleet(nodes=4, spares=2)
    n = pool_node(spec.pool("h100"), "h100-0", labels.ROLE_QUARANTINED)
    prev = earlier("prev", "h100-0", 1, rung="reset-gpu")  # returned after a reset, a day ago
    promoted = prev.repair.ended + timedelta(hours=5)
    now = promoted + timedelta(minutes=20)  # faulted 20 minutes after it took a job (< 3600 s)
    r = Remediation(name="now", node="h100-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED,
                    created=now)
    step = plan_repair(r, facts_for(r, n, [prev], [promoted]), spec, now)
    rep = step.remediation.repair
    assert rep.step == "reboot" and rep.history[0].outcome == "relapsed" and "held 1200s" in rep.history[0].message
    held = Remediation(name="later", node="h100-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED,
                       created=promoted + timedelta(hours=2))  # held two hours: a new fault, not a relapse
    assert repair.relapse(held, facts_for(held, n, [prev], [promoted]), spec) is None


def test_a_relapse_after_a_reboot_retires():
    spec = fleet(nodes=4, spares=2)
    n = pool_node(spec.pool("h100"), "h100-0", labels.ROLE_QUARANTINED)
    prev = earlier("prev", "h100-0", 1, rung="reboot")
    now = prev.repair.ended + timedelta(minutes=5)
    r = Remediation(name="now", node="h100-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED, created=now)
    step = plan_repair(r, facts_for(r, n, [prev]), spec, now)
    assert step.remediation.repair.phase is RepairPhase.RETIRED
    assert any(isinstance(a, Retire) for a in step.actions)


def test_the_opt_out_label_on_the_node_stops_the_loop_and_lifting_it_goes_on():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=5)
    assert w.remediation("h100-0").repair.phase is RepairPhase.REPAIRING
    node(w, "h100-0")["metadata"]["labels"][labels.DEFAULT_OPT_OUT] = "true"  # a person looks at it
    w.run(seconds=200)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.STOPPED and labels.DEFAULT_OPT_OUT in r.repair.reason
    del node(w, "h100-0")["metadata"]["labels"][labels.DEFAULT_OPT_OUT]
    w.run(seconds=200)
    assert w.remediation("h100-0").repair.phase is RepairPhase.RETURNED


def _hold_then_lift(w: World, hold_seconds: float = 200) -> Remediation:
    node(w, "h100-0")["metadata"]["labels"][labels.DEFAULT_OPT_OUT] = "true"  # a person looks at it
    w.run(seconds=hold_seconds)
    assert w.remediation("h100-0").repair.phase is RepairPhase.STOPPED
    del node(w, "h100-0")["metadata"]["labels"][labels.DEFAULT_OPT_OUT]
    w.run(seconds=5)
    return w.remediation("h100-0")


def test_a_hold_lifted_after_the_reboot_happened_goes_on_to_the_check_not_a_second_reboot():
    """The reboot was asked for, then a person held the repair; the node's agent carried the request out
    meanwhile (it stays on the node). Lifting the hold goes on where the repair stood: the check."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=5)
    assert w.remediation("h100-0").repair.step == "reboot" and len(w.hardware.reboots) == 1
    r = _hold_then_lift(w)
    assert r.repair.phase is RepairPhase.VALIDATING, r.repair
    assert "rebooted while it was held" in r.repair.reason and "no second reboot" in r.repair.reason
    assert r.repair.rungs == ("reboot",)
    w.run(seconds=200)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED
    assert len(w.hardware.reboots) == 1  # one reboot, not two
    assert [(e.step, e.outcome) for e in r.repair.history if e.step in ("reboot", "stop")] == [
        ("reboot", "asked"), ("stop", "stopped"), ("stop", "lifted"), ("reboot", "ok")]


def test_a_hold_lifted_after_the_reset_was_done_goes_on_to_the_check_not_a_second_reset():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.RESET_FIXES
    send = w.provider.request_repair

    def held_as_it_is_sent(node_name, request):  # a person holds the node as the reset goes out
        send(node_name, request)
        node(w, node_name)["metadata"]["labels"][labels.DEFAULT_OPT_OUT] = "true"

    w.provider.request_repair = held_as_it_is_sent
    w.fault("h100-0", xid=48)  # a double-bit ECC error: the catalogue's action is a GPU reset
    w.run(seconds=5)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.STOPPED and r.repair.stopped_from == "Repairing", r.repair
    assert r.repair.step == "reset-gpu" and len(w.hardware.resets) == 1  # the agent did it meanwhile
    w.provider.request_repair = send
    r = _hold_then_lift(w, hold_seconds=60)
    assert r.repair.phase is RepairPhase.VALIDATING and "GPU reset asked before it was done" in r.repair.reason
    w.run(seconds=200)
    assert w.remediation("h100-0").repair.phase is RepairPhase.RETURNED
    assert len(w.hardware.resets) == 1 and w.hardware.reboots == []


def test_a_hold_lifted_on_a_request_never_carried_out_asks_it_again_as_the_same_rung():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    lost = []
    w.provider.request_repair = lambda node, request: lost.append(request.id)  # never reaches the node
    w.fault("h100-0")
    w.run(seconds=5)
    r = _hold_then_lift(w, hold_seconds=30)
    assert r.repair.phase is RepairPhase.REPAIRING and len(lost) == 2 and lost[0] != lost[1]
    assert "shows no sign of being done: asked again" in r.repair.reason
    assert r.repair.rungs == ("reboot",)  # the same rung, not a second one climbed


def test_a_request_with_no_sign_of_it_is_asked_again_once_under_a_new_id():
    """The request was noted on the remediation, and the reconciler died before it went out: half the
    step's timeout later, nothing shows it was done, so it is asked again (a new id) once."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    lost = []
    w.provider.request_repair = lambda node, request: lost.append(request.id)  # never reaches the node
    w.fault("h100-0")
    w.run(seconds=5)
    assert len(lost) == 1
    w.run(seconds=700, step=5)  # reboot timeout 1200 s: asked again at 600 s
    assert len(lost) == 2 and lost[0] != lost[1]
    r = w.remediation("h100-0")
    assert [e.outcome for e in r.repair.history if e.step == "reboot"] == ["asked", "asked again"]


# --- repair in place ----------------------------------------------------------------------------------

def test_with_no_spare_free_the_pool_may_repair_in_place_and_the_node_takes_its_job_back():
    spec = fleet(nodes=4, spares=0, grace_period_seconds=0)
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(
        update={"repair": spec.pools[0].repair.model_copy(update={"in_place": True})})]})
    w = World(spec, operator=True)
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=10)
    r = w.remediation("h100-0")
    assert r.phase is Phase.WAITING_FOR_SPARE and r.repair.in_place and r.repair.phase is RepairPhase.REPAIRING
    w.run(seconds=200)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-0", r
    assert r.repair.phase is RepairPhase.RETURNED and role(w, "h100-0") == labels.ROLE_ACTIVE
    assert ("quarantine", "h100-0") not in w.provider.calls  # it never left its pool's service for good
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-0"  # its Slurm node came back to it



def test_a_job_waiting_for_a_spare_in_one_pool_takes_no_node_of_another_and_the_other_pool_heals():
    """bench/repair_month.py's week at 10.5x: an l40s job waited for a spare (its pool had none) while faults in
    the h100 pools healed. Its NodeSet pod selects its own pool's nodes (components/slinky.py: the template's
    nodeSelector), so it stays pending; it must not take the spare promoted for another pool's node, whose own pod
    would then have nowhere to run (14 heals Failed that way in the bench, each after RESUME_TIMEOUT)."""
    spec = fleet(nodes=4, spares=1, pools=("h100", "l40s"), grace_period_seconds=0)
    spec = spec.model_copy(update={"pools": [spec.pools[0], spec.pools[1].model_copy(update={"spares": 0})]})
    w = World(spec, operator=True)
    w.fault("l40s-0", xid=48)
    w.run(seconds=10)
    assert w.remediation("l40s-0").phase is Phase.WAITING_FOR_SPARE
    assert "slurm/slurm-worker-l40s-w0" not in w.kube.pods  # evicted, pending: no l40s node takes it
    w.fault("h100-0", xid=48)
    w.run(seconds=10)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0", r
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-spare-0"
    assert "slurm/slurm-worker-l40s-w0" not in w.kube.pods
    assert w.remediation("l40s-0").phase is Phase.WAITING_FOR_SPARE

# --- a person's commands (issue 23, item 7) -------------------------------------------------------------

def test_release_admits_a_pool_held_by_the_brake():
    w = world(nodes=10, spares=3, max_unhealthy_fraction=0.2)
    for i in range(3):
        w.fault(f"h100-{i}")
    w.run(seconds=3)
    held = [r for r in w.store.list() if r.phase is Phase.HELD]
    assert len(held) == 3
    for r in held:
        ask(w, r.name, RELEASE)
    w.run(seconds=10)
    for r in held:
        done = w.store.list()
        x = next(y for y in done if y.name == r.name)
        assert x.phase in (Phase.RESUMING, Phase.SUCCEEDED) and "release by oncall" in x.reason
        assert len(x.requests_done) == 1


def escalated(w: World) -> Remediation:
    """h100-1 escalated by the attempt cap: two remediations within the attempts window before this one."""
    for i in range(2):
        r = replace(earlier(f"h100-1-old-{i}", "h100-1", 0.1 + i * 0.1), repair=None)
        w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-1")
    w.run(seconds=3)
    return max((x for x in w.store.list() if x.node == "h100-1"), key=lambda x: x.created)


def test_mark_healthy_puts_an_escalated_node_back_in_service_and_ends_the_record():
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"retire_after_faults": 5}), operator=True)
    r = escalated(w)
    assert r.phase is Phase.ESCALATED and role(w, "h100-1") == labels.ROLE_QUARANTINED
    assert w.slurm.table["h100-w1"].reason.startswith("gpufleet:")  # gpufleet's drain
    ask(w, r.name, MARK_HEALTHY)
    w.run(seconds=3)
    r = next(x for x in w.store.list() if x.name == r.name)
    assert r.phase is Phase.SUCCEEDED and "mark-healthy by oncall: back in service" in r.reason
    assert role(w, "h100-1") == labels.ROLE_ACTIVE and not node(w, "h100-1")["spec"].get("unschedulable")
    assert ("resume", "h100-w1") in w.slurm.calls
    assert gpu_condition(w, "h100-1")["status"] == "True"
    w.run(seconds=3)
    assert ("resume", "h100-w1") in w.slurm.calls and w.slurm.calls.count(("resume", "h100-w1")) == 1


def test_release_lets_an_escalated_node_be_replaced_and_then_repaired():
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"retire_after_faults": 5}), operator=True)
    r = escalated(w)
    ask(w, r.name, RELEASE)
    w.run(seconds=10)
    r = next(x for x in w.store.list() if x.name == r.name)
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0"
    assert r.repair is not None and r.repair.phase is RepairPhase.REPAIRING


def test_return_is_refused_while_the_pools_pod_still_runs_there_and_says_so():
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"retire_after_faults": 5}), operator=True)
    r = escalated(w)
    ask(w, r.name, RETURN)
    w.run(seconds=3)
    r = next(x for x in w.store.list() if x.name == r.name)
    assert "return by oncall: refused: NodeSet pod(s) of Slurm node(s) ['h100-w1'] still run on h100-1" in r.reason
    assert role(w, "h100-1") == labels.ROLE_QUARANTINED and r.repair is None


def test_retire_by_a_person_retires_without_a_page_and_return_brings_it_back_through_a_check():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.fault("h100-0")
    w.run(seconds=5)
    r = w.remediation("h100-0")
    ask(w, r.name, RETIRE)
    w.run(seconds=3)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED and "retired by oncall" in r.repair.reason
    assert "retired" not in w.notifier.sent and role(w, "h100-0") == labels.ROLE_RETIRED
    w.hardware.state["h100-0"] = FakeNodes.HEALTHY  # the vendor sent it back repaired
    w.clock.advance(1)
    ask(w, r.name, RETURN)
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED and role(w, "h100-0") == labels.ROLE_SPARE


def test_a_person_marking_a_node_healthy_by_the_condition_alone_returns_it_only_once_its_pods_left():
    """Issue 23 item 6: a quarantined node with no remediation, marked healthy the old way (the condition),
    goes back to the spares only when nothing of the pool runs on it."""
    w = world()
    q = node(w, "h100-3")
    q["metadata"]["labels"][labels.ROLE] = labels.ROLE_QUARANTINED
    q["status"]["conditions"].append({"type": "GpuHealthy", "status": "True", "reason": "HealthCheckPassed"})
    w.run(seconds=3)
    assert role(w, "h100-3") == labels.ROLE_QUARANTINED  # its NodeSet pod (h100-w3) still runs there
    del w.kube.pods["slurm/slurm-worker-h100-w3"]
    w.run(seconds=15)
    assert role(w, "h100-3") == labels.ROLE_SPARE


def test_the_core_asks_for_a_reset_or_a_reboot_through_a_once_only_action():
    spec = fleet(nodes=4, spares=2)
    n = pool_node(spec.pool("h100"), "h100-0", labels.ROLE_QUARANTINED)
    r = Remediation(name="r", node="h100-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED, created=T0)
    step = plan_repair(r, facts_for(r, n), spec, T0)
    (req,) = [a for a in step.actions if isinstance(a, RequestRepair)]
    assert req.once == f"repair:{req.request.id}" and req.request.id == "r/1-reboot"
    assert step.remediation.repair.request == req.request.id  # written before it is sent


@pytest.mark.parametrize("action, step", [("reset-gpu", "reset-gpu"), ("reboot", "reboot"), ("replace", "replace"),
                                          ("restart-app", "reboot"), ("none", "reboot"), (None, "reboot"),
                                          ("", "reboot")])
def test_the_first_rung_follows_the_faults_action(action, step):
    """The fault catalogue's action (branch xid: spec.fault.action) picks the first rung; a node taken out for a
    fault whose action needs no repair of the machine is rebooted, the catalogue's commonest answer."""
    assert repair.first_step(action) == step
