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

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.node_repair import parse_check
from gpufleet.fleetspec.oncall import MARK_HEALTHY, RELEASE, RETIRE, RETURN, PersonRequest
from gpufleet.reconciler.adapters.records import to_object
from gpufleet.reconciler.core import repair
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import RepairFacts, plan_repair
from gpufleet.reconciler.core.repair_actions import RequestRepair, Retire
from gpufleet.reconciler.core.observe import node_view
from gpufleet.reconciler.core.repair_phases import RepairPhase, begin
from localenv.gpu_hardware_standin import HEALTHY, LOW_BANDWIDTH, NVLINK_DOWN
from localenv.gpu_hardware_standin import report as standin_report
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


def hung_check_world(hangs: int) -> World:
    w = world(repair={"health_check": {"timeout_seconds": 60}})
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.checks.hang["h100-0"] = hangs
    w.fault("h100-0", xid=79)
    w.run(seconds=600, step=5)
    return w


def test_a_hung_health_check_is_inconclusive_and_runs_again_once_on_a_fresh_pod():
    """The check hung, not the GPU: its Job outlived its deadline with no verdict. That says nothing about the
    node; the check runs again under a new Job (a fresh pod), which passes, and the node comes back."""
    w = hung_check_world(hangs=1)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED, r.repair.reason
    assert [(e.step, e.outcome) for e in r.repair.history] == [
        ("reboot", "asked"), ("reboot", "ok"), ("validate", "inconclusive"), ("return", "ok")]
    first, second = [j for j in w.checks.started if j.startswith("gpufleet-check-h100-0")][:2]
    assert first != second and first in w.checks.hanging and second not in w.checks.hanging
    assert "gave no verdict (no verdict within 60s)" in r.repair.history[2].message
    assert "retired" not in w.notifier.sent and role(w, "h100-0") == labels.ROLE_SPARE
    assert "HealthCheckInconclusive" in [c[1] for c in w.kube.calls if c[0] == "event"]


def test_two_hung_health_checks_in_a_row_are_a_failed_check_with_that_reason():
    w = hung_check_world(hangs=2)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED
    assert [(e.step, e.outcome) for e in r.repair.history] == [
        ("reboot", "asked"), ("reboot", "ok"), ("validate", "inconclusive"), ("validate", "failed"), ("retire", "ok")]
    assert "the second check in a row without one" in r.repair.reason
    assert len({j for j in w.checks.started if j.startswith("gpufleet-check-h100-0")}) == 2


@pytest.mark.parametrize("state, says", [
    (NVLINK_DOWN, "nvlink: fail (GPU 3: 17 of 18 NVLinks active (inactive: [5]))"),
    (LOW_BANDWIDTH, "bus bandwidth 142.735 GB/s on 8 GPUs, under the 350 GB/s floor of NVIDIA H100 80GB HBM3")])
def test_a_node_whose_nvlink_is_down_or_whose_all_reduce_is_under_its_floor_fails_validation_and_never_returns(
        state, says):
    """The real check on the outputs of a node that stays degraded (the local stand-in's): its reboot does not
    bring the link or the bandwidth back, its check fails each time, and it is retired, never a spare again."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN  # nothing fixes it
    w.checks.reports["h100-0"] = standin_report(state, 8, w.spec.healing.repair.health_check.argv())
    w.fault("h100-0", xid=74)  # an NVLink error: a reset, then a reboot
    w.run(seconds=400)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED
    assert ("validate", "failed") in [(e.step, e.outcome) for e in r.repair.history]
    assert says in r.repair.reason and "nothing left to try (reset-gpu -> reboot tried)" in r.repair.reason
    assert role(w, "h100-0") == labels.ROLE_RETIRED
    assert "NodeReturned" not in [c[1] for c in w.kube.calls if c[0] == "event"]


def test_a_node_its_check_cannot_prove_stops_for_a_person_with_the_image_it_needs():
    """The check's image has no dcgmi or all_reduce_perf and the spec allows no skip: not broken, not proven. The
    node neither returns nor climbs the ladder: its repair stops, and the page says which image to use."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.checks.reports["h100-0"] = standin_report(HEALTHY, 8, w.spec.healing.repair.health_check.argv(),
                                                missing={"dcgmi", "all_reduce_perf"})
    w.fault("h100-0", xid=79)
    w.run(seconds=400)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.STOPPED and "could not prove h100-0 healthy" in r.repair.error
    assert w.notifier.sent.count("repair-stopped") == 1 and "retired" not in w.notifier.sent
    (page,) = w.notifier.texts["repair-stopped"]
    assert "healing.repair.health_check.image" in page and "dcgmi" in page and "all_reduce_perf" in page
    assert role(w, "h100-0") == labels.ROLE_QUARANTINED


def test_a_node_that_reported_no_boot_id_before_its_reboot_is_told_so_not_with_a_question_mark():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    node(w, "h100-0")["status"]["nodeInfo"]["bootID"] = ""  # a node whose kubelet reported none yet
    w.fault("h100-0", xid=79)
    w.run(seconds=200)
    r = w.remediation("h100-0")
    ok = next(e for e in r.repair.history if e.step == "reboot" and e.outcome == "ok")
    assert "boot id ?" not in ok.message and "the node reported none before the reboot" in ok.message


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


def test_a_spare_its_check_cannot_prove_never_serves_and_is_paged_once():
    """A spare whose check could not run a required check: not broken (no remediation, nothing rebooted), not
    proven: never promoted, one page with the image it needs, checked again an hour later (the image may be
    fixed by then) without a second page."""
    w = world()
    for name in ("h100-spare-0", "h100-spare-1"):
        w.kube.nodes[name] = pool_node(w.spec.pool("h100"), name, labels.ROLE_SPARE, proven=False)
    w.hardware.state["h100-spare-0"] = FakeNodes.BROKEN  # "not healthy" to FakeChecks: its report is read
    w.checks.reports["h100-spare-0"] = standin_report(HEALTHY, 8, w.spec.healing.repair.health_check.argv(),
                                                      missing={"dcgmi"})
    w.fault("h100-0")
    w.run(seconds=60)
    assert [c[1] for c in w.provider.calls if c[0] == "promote"] == ["h100-spare-1"]
    check = parse_check(node(w, "h100-spare-0")["metadata"]["annotations"][labels.HEALTH_CHECK])
    assert check.state == "unproven" and "dcgm: unproven" in check.message
    assert not [r for r in w.store.list() if r.node == "h100-spare-0"] and role(w, "h100-spare-0") == labels.ROLE_SPARE
    (page,) = w.notifier.texts["health-check-unproven"]
    assert "h100-spare-0" in page and "healing.repair.health_check.image" in page
    def checks_of_spare() -> int:
        return len({j for j in w.checks.started if j.startswith("gpufleet-check-h100-spare-0")})
    started = checks_of_spare()
    w.run(seconds=3700, step=30)
    assert checks_of_spare() == started + 1  # looked at again once in the hour, not at every pass
    assert w.notifier.sent.count("health-check-unproven") == 1


def test_a_spares_hung_check_runs_again_once_then_fails():
    w = world(repair={"health_check": {"timeout_seconds": 60}})
    w.kube.nodes["h100-spare-0"] = pool_node(w.spec.pool("h100"), "h100-spare-0", labels.ROLE_SPARE, proven=False)
    w.checks.hang["h100-spare-0"] = 1
    w.run(seconds=400, step=5)
    check = parse_check(node(w, "h100-spare-0")["metadata"]["annotations"][labels.HEALTH_CHECK])
    assert check.passed and len([j for j in w.checks.started if "h100-spare-0" in j]) == 2
    assert "HealthCheckInconclusive" in [c[1] for c in w.kube.calls if c[0] == "event"]

    w2 = world(repair={"health_check": {"timeout_seconds": 60}})
    w2.kube.nodes["h100-spare-0"] = pool_node(w2.spec.pool("h100"), "h100-spare-0", labels.ROLE_SPARE, proven=False)
    w2.checks.hang["h100-spare-0"] = 2
    w2.run(seconds=400, step=5)
    bad = w2.remediation("h100-spare-0")
    assert bad is not None and "the second check in a row without a verdict" in bad.reason


def test_a_spare_that_rebooted_is_checked_again_before_it_serves():
    w = world()
    spare = node(w, "h100-spare-0")
    spare["status"]["nodeInfo"]["bootID"] = "boot-after-a-reboot"  # its passed check was on boot-1
    w.run(seconds=1)
    assert parse_check(spare["metadata"]["annotations"][labels.HEALTH_CHECK]).state == "running"
    w.run(seconds=40)
    check = parse_check(spare["metadata"]["annotations"][labels.HEALTH_CHECK])
    assert check.proves("boot-after-a-reboot")


def test_a_spare_that_fails_its_check_is_repaired_with_what_the_check_said_it_needs():
    """The check's verdict names what the node needs (here a GPU reset): the failed spare's repair starts
    there, not with a reboot whatever the check said."""
    w = world()
    w.kube.nodes["h100-spare-0"] = pool_node(w.spec.pool("h100"), "h100-spare-0", labels.ROLE_SPARE, proven=False)
    w.hardware.state["h100-spare-0"] = FakeNodes.RESET_FIXES
    w.run(seconds=200)
    bad = w.remediation("h100-spare-0")
    assert bad.was_spare and bad.action is not None and bad.action.value == "reset-gpu"
    assert bad.repair.rungs[0] == "reset-gpu", bad.repair
    assert [x[0] for x in w.hardware.resets] == ["h100-spare-0"] and w.hardware.reboots == []
    assert bad.repair.phase is RepairPhase.RETURNED and role(w, "h100-spare-0") == labels.ROLE_SPARE


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


def test_application_faults_never_count_toward_a_lemon():
    """Two records of a crashing job's XID 13 (a record of the old repeat rule says `replace`) and a reboot-fixable
    fault now: the node is repaired, not retired as a lemon."""
    from gpufleet.fleetspec.faults import FaultAction
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    for i, days in enumerate((3, 1)):
        r = replace(earlier(f"h100-0-app-{i}", "h100-0", days), xid=13, action=FaultAction.REPLACE)
        w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-0")
    w.run(seconds=10)
    r = max((x for x in w.store.list() if x.node == "h100-0"), key=lambda x: x.created)
    assert r.repair.phase is RepairPhase.REPAIRING and r.repair.step == "reboot", r.repair
    assert ("retire", "h100-0") not in w.provider.calls and "retired" not in w.notifier.sent


@pytest.mark.parametrize("xid", [61, 54, 78])  # CONTACT_SUPPORT ("Unused"), CHECK_MECHANICALS, UPDATE_SWFW
def test_a_fault_that_needs_a_person_is_healed_then_held_with_a_vendor_case_never_retired(xid):
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"retire_after_faults": 2}), operator=True)
    w.kube.nodes["h100-0"]["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] = "570.158.01"
    r = earlier("h100-0-old", "h100-0", 1)  # with this fault, a lemon: the vendor case still comes first
    w.store.objects[r.name] = json.dumps(to_object(r))
    w.kube.nodes["h100-0"]["status"]["conditions"].append(
        {"type": "GpuHealthy", "status": "False", "reason": f"Xid{xid}",
         "message": f"[action=contact-support pci=0000:3b:00] XID {xid}: Xid {xid} on PCI:0000:3b:00: Ch 00000010",
         "lastTransitionTime": w.clock.now.isoformat()})
    w.run(seconds=20)
    r = max((x for x in w.store.list() if x.node == "h100-0"), key=lambda x: x.created)
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0"  # the job's heal is as always
    assert r.repair.phase is RepairPhase.STOPPED and r.repair.error.startswith("vendor case"), r.repair
    assert role(w, "h100-0") == labels.ROLE_QUARANTINED and node(w, "h100-0")["spec"]["unschedulable"]
    assert ("retire", "h100-0") not in w.provider.calls and "h100-0" in w.provider.kept  # the machine is kept
    assert w.hardware.reboots == [] and w.notifier.sent.count("vendor-case") == 1
    (page,) = w.notifier.texts["vendor-case"]
    for fact in ("0000:3b:00", "570.158.01", f"Xid {xid} on PCI:0000:3b:00: Ch 00000010", "nvidia-smi -q -i 0000:3b:00",
                 "gpufleet return h100-0"):
        assert fact in page, (fact, page)
    w.run(seconds=60)
    assert w.notifier.sent.count("vendor-case") == 1 and ("retire", "h100-0") not in w.provider.calls
    ask(w, r.name, RETURN)  # the vendor fixed it: a person's return checks it before it serves
    w.run(seconds=20)
    r = next(x for x in w.store.list() if x.name == r.name)
    assert r.repair.phase in (RepairPhase.VALIDATING, RepairPhase.RETURNED) and "returned by oncall" in r.repair.reason


def test_a_second_xid_48_on_the_same_gpu_within_a_day_is_a_vendor_case_from_the_records():
    """The agent's kernel log is gone after a reboot; the records are not. A second double-bit ECC error on the GPU
    that was reset for one two hours ago is escalation rule RepeatedXID48OnSameGPU: held for the vendor, not reset
    again. One on another GPU is reset as its row says."""
    from gpufleet.fleetspec.faults import FaultAction
    for pci, held in (("0000:3b:00", True), ("0000:3c:00", False)):
        w = world()
        w.hardware.state["h100-0"] = FakeNodes.RESET_FIXES
        prev = replace(earlier("h100-0-old", "h100-0", 2 / 24, rung="reset-gpu"), xid=48, pci="0000:3b:00",
                       action=FaultAction.RESET_GPU)
        w.store.objects[prev.name] = json.dumps(to_object(prev))
        w.kube.nodes["h100-0"]["status"]["conditions"].append(
            {"type": "GpuHealthy", "status": "False", "reason": "Xid48",
             "message": f"[action=reset-gpu pci={pci}] XID 48 (Double Bit ECC Error): Xid 48 on PCI:{pci}",
             "lastTransitionTime": w.clock.now.isoformat()})
        w.run(seconds=10)
        r = max((x for x in w.store.list() if x.node == "h100-0"), key=lambda x: x.created)
        if held:
            assert r.repair.phase is RepairPhase.STOPPED and "RepeatedXID48OnSameGPU" in r.repair.reason, r.repair
            assert w.notifier.sent.count("vendor-case") == 1 and "h100-0" in w.provider.kept
        else:
            assert r.repair.phase is not RepairPhase.STOPPED and r.repair.rungs[:1] == ("reset-gpu",), r.repair
            assert "vendor-case" not in w.notifier.sent


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
    assert "relapsed" not in rep.history[0].message  # the outcome says it; "relapsed: relapsed: ..." said it twice
    assert rep.reason.startswith("relapsed: prev's repair (reset-gpu) held 1200s")
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


def test_a_hold_lifted_on_a_request_not_carried_out_yet_waits_for_it_then_asks_again_as_the_same_rung():
    """The request is still on the node: lifting the hold waits for it (its whole timeout from now), not a
    second request at once; with no sign of it by half its timeout since it was asked, asked again, once, as the
    same rung (not a rung climbed)."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    lost = []
    w.provider.request_repair = lambda node, request: lost.append(request.id)  # never reaches the node
    w.fault("h100-0")
    w.run(seconds=5)
    r = _hold_then_lift(w, hold_seconds=30)
    assert r.repair.phase is RepairPhase.REPAIRING and len(lost) == 1
    assert "not answered yet: waited for" in r.repair.reason
    assert r.repair.deadline >= w.clock.now + timedelta(seconds=1100)  # the reboot's 1200 s from the lift
    w.run(seconds=700, step=5)
    r = w.remediation("h100-0")
    assert len(lost) == 2 and lost[0] != lost[1] and r.repair.rungs == ("reboot",)
    assert [e.outcome for e in r.repair.history if e.step == "reboot"] == ["asked", "waiting", "asked again"]


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


def test_a_repair_whose_node_disappears_ends_gone_with_one_page_and_the_provider_settles_it():
    """The Node object is deleted mid-reboot (a person, or its instance terminated): the repair does not stay
    Repairing for ever. It ends Gone with the reason, the provider settles what it kept for the repair (an
    aws-asg instance held out of its group: test_aws_asg), and one page says so."""
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.BROKEN
    w.hardware.reboot_seconds = 10_000
    w.fault("h100-0")
    w.run(seconds=10)
    assert w.remediation("h100-0").repair.phase is RepairPhase.REPAIRING
    del w.kube.nodes["h100-0"]
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.GONE and "Node object disappeared" in r.repair.reason, r.repair
    assert [(e.step, e.outcome) for e in r.repair.history][-1] == ("gone", "ended")
    assert w.notifier.sent.count("node-gone") == 1 and "retired" not in w.notifier.sent
    assert w.provider.calls.count(("forget", "h100-0")) == 1
    assert not [c for c in w.provider.calls if c == ("capacity", f"{r.name}/gone")]  # the heal refilled already
    w.run(seconds=60)
    assert w.notifier.sent.count("node-gone") == 1 and w.remediation("h100-0").repair.phase is RepairPhase.GONE


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
    w.kube.nodes["h100-spare-1"]["metadata"]["labels"][labels.ROLE] = labels.ROLE_RETIRED  # room for it
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


# --- one page per decision ------------------------------------------------------------------------------

def test_a_third_fault_within_a_day_is_one_decision_with_one_page():
    """The attempt cap (2 remediations within 24 h) and the lemon rule (3 faults within 7 days) both meet a
    third fault within a day: the lemon rule decides it (the node is retired for the vendor, the job healed on a
    spare, a refill asked), and the on-call gets that one page, not also an escalation telling them to repair
    and return it."""
    w = world()
    for i in range(2):
        r = replace(earlier(f"h100-1-old-{i}", "h100-1", 0.1 + i * 0.1), repair=None)
        w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-1")
    w.run(seconds=20)
    r = max((x for x in w.store.list() if x.node == "h100-1"), key=lambda x: x.created)
    assert (w.notifier.sent.count("escalated"), w.notifier.sent.count("retired")) == (0, 1), w.notifier.sent
    assert r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0"  # the job heals on a spare
    assert r.repair.phase is RepairPhase.RETIRED and "a lemon: 3 faults" in r.repair.reason
    assert "attempt cap" in r.reason and "lemon" in r.reason  # the record says why it was not escalated
    assert role(w, "h100-1") == labels.ROLE_RETIRED


def test_a_node_at_the_attempt_cap_that_is_no_lemon_is_escalated_with_one_page():
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0, repair={"retire_after_faults": 5}), operator=True)
    r = escalated(w)
    w.run(seconds=60)
    r = next(x for x in w.store.list() if x.name == r.name)
    assert r.phase is Phase.ESCALATED and r.repair is None
    assert (w.notifier.sent.count("escalated"), w.notifier.sent.count("retired")) == (1, 0)


def test_a_vendor_case_at_the_attempt_cap_is_one_decision_with_one_page():
    """A fault NVIDIA sends to support (CONTACT_SUPPORT) on a node at the attempt cap: the repair loop holds it
    for the vendor with its page; the attempt cap does not also escalate it with a second, different one."""
    w = world()
    for i in range(2):
        r = replace(earlier(f"h100-1-old-{i}", "h100-1", 0.1 + i * 0.1), repair=None)
        w.store.objects[r.name] = json.dumps(to_object(r))
    w.fault("h100-1", xid=1)  # an Xid NVIDIA's catalogue answers with CONTACT_SUPPORT
    w.run(seconds=20)
    r = max((x for x in w.store.list() if x.node == "h100-1"), key=lambda x: x.created)
    assert (w.notifier.sent.count("escalated"), w.notifier.sent.count("vendor-case")) == (0, 1), w.notifier.sent
    assert "retired" not in w.notifier.sent and r.replacement == "h100-spare-0"
    assert r.repair.phase is RepairPhase.STOPPED and "case for the vendor" in r.reason
