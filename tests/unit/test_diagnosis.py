"""Diagnostics asked (a repeated Xid 13/31 on one GPU: NVIDIA's RUN_DCGMEUD) while the node stays in service:
drained in Slurm only, checked once idle, back if it passes, healed if it fails (core/diagnosis.py), through the
runtime with fakes and a fake clock, and its decisions as tables."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message
from gpufleet.reconciler.adapters.slurm import SlurmJob, SlurmNode
from gpufleet.reconciler.core import decide, diagnosis
from gpufleet.reconciler.core.actions import DrainSlurm, Notify, ResumeSlurm
from gpufleet.reconciler.core.diagnosis_stages import Stage, begin
from gpufleet.reconciler.core.model import Fault, NodeView, SlurmNodeView, Setter
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_actions import BackInService, MarkHealthy, StartHealthCheck
from gpufleet.reconciler.core.repair_phases import RepairPhase
from gpufleet.reconciler.core.validation import Verdict
from tests.unit.fakes import T0, FakeNodes, World, fleet

PCI = "0000:cb:00"
LINE = "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"


def world(**healing) -> World:
    return World(fleet(nodes=4, spares=2, grace_period_seconds=0, **healing), operator=True)


def diagnose_fault(w: World, node: str) -> None:
    """What the node agent writes after three Xid 13 bursts on one GPU (tests/unit/test_agent.py: the second
    burst asks for diagnostics; the third finds the condition set)."""
    msg = format_message(FaultSignal(Kind.XID, 13, FaultAction.DIAGNOSE, PCI), LINE)
    w.kube.nodes[node]["status"]["conditions"].append(
        {"type": "GpuHealthy", "status": "False", "reason": "Xid13", "message": msg,
         "lastTransitionTime": w.clock.now.isoformat()})


def gpu_condition(w: World, name: str) -> dict:
    return next(c for c in w.kube.nodes[name]["status"]["conditions"] if c["type"] == "GpuHealthy")


def role(w: World, name: str) -> str:
    return w.kube.nodes[name]["metadata"]["labels"][labels.ROLE]


def cordoned(w: World, name: str) -> bool:
    return bool(w.kube.nodes[name]["spec"].get("unschedulable"))


def end_job(w: World, job: int) -> None:
    w.slurm.jobs[job] = replace(w.slurm.jobs[job], state="COMPLETED")


def test_three_xid_13_bursts_leave_the_node_in_service_drained_once_idle_checked_and_back():
    w = world()
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    diagnose_fault(w, "h100-0")
    w.run(seconds=120)
    r = w.remediation("h100-0")
    assert r.phase is Phase.DIAGNOSING and r.diagnosis.stage is Stage.DRAINING
    # drained in Slurm with gpufleet's reason, so no new job lands; the running job runs on: no SIGTERM, no requeue
    assert ("drain", "h100-w0") in w.slurm.calls
    assert w.slurm.table["h100-w0"].reason.startswith(labels.SLURM_REASON_PREFIX)
    assert not any(c[0] in ("signal", "requeue") for c in w.slurm.calls)
    assert role(w, "h100-0") == labels.ROLE_ACTIVE and not cordoned(w, "h100-0") and w.checks.started == []
    assert w.provider.calls == []  # nothing promoted, quarantined, retired or terminated
    assert "diagnose: GPU 0000:cb:00 on h100-w0: Graphics Engine Exception (Xid 13); repeated: diagnostics asked " \
           "while the job runs on" in w.slurm.comments.get(7, "")
    end_job(w, 7)
    w.run(seconds=40)
    r = w.remediation("h100-0")
    assert r.diagnosis.stage in (Stage.CHECKING, Stage.RETURNING, Stage.PASSED) and len(w.checks.started) >= 1
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.diagnosis.stage is Stage.PASSED, r
    assert [s for s, _ in r.diagnosis.stage_times] == ["Draining", "Clearing", "Checking", "Returning", "Passed"]
    assert role(w, "h100-0") == labels.ROLE_ACTIVE and not cordoned(w, "h100-0")
    assert (gpu_condition(w, "h100-0")["status"], gpu_condition(w, "h100-0")["reason"]) == ("True", "HealthCheckPassed")
    assert ("resume", "h100-w0") in w.slurm.calls and w.slurm.table["h100-w0"].reason == ""
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-0"  # its Slurm node came back
    assert {c[0] for c in w.provider.calls} <= {"back"}  # uncordoned where it is; no spare, no retirement
    assert "detected" not in w.notifier.sent and "retired" not in w.notifier.sent
    assert w.notifier.sent == ["diagnosis-passed"]
    w.run(seconds=60)
    assert len(w.store.list()) == 1  # the cleared condition starts nothing more


def test_a_failed_diagnosis_heals_the_node_and_repairs_it_from_what_the_check_says():
    w = world()
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES  # the check fails saying: reboot
    diagnose_fault(w, "h100-0")
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert r.diagnosis.stage is Stage.FAILED and r.diagnosis.needs == "reboot"
    assert r.replacement == "h100-spare-0" and "detected" in w.notifier.sent  # the heal: a spare took its place
    (page,) = w.notifier.texts["detected"]
    assert "Diagnosed while it served: failed its health check" in page and "it needs reboot" in page
    w.run(seconds=300)
    r = w.remediation("h100-0")
    assert r.repair is not None and r.repair.rungs == ("reboot",) and r.repair.phase is RepairPhase.RETURNED
    assert [x[0] for x in w.hardware.reboots] == ["h100-0"]


def test_a_job_that_outlasts_the_wait_pages_once_and_the_node_stays_drained():
    w = world(faults={"repeats": {"diagnose_wait_seconds": 600}})
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    diagnose_fault(w, "h100-0")
    w.run(seconds=1900, step=10)
    assert w.notifier.sent == ["diagnosis-waiting"]
    assert w.slurm.table["h100-w0"].reason.startswith(labels.SLURM_REASON_PREFIX) and not cordoned(w, "h100-0")
    assert w.remediation("h100-0").diagnosis.stage is Stage.DRAINING
    end_job(w, 7)
    w.run(seconds=100)
    assert w.remediation("h100-0").phase is Phase.SUCCEEDED


def test_a_persons_drain_holds_the_diagnosis_until_it_is_lifted():
    w = world()
    w.slurm.table["h100-w0"] = SlurmNode("h100-w0", frozenset({"IDLE", "DRAIN"}), "bad cable, ticket 4711",
                                         reason_set_by="alice")
    diagnose_fault(w, "h100-0")
    w.run(seconds=120)
    r = w.remediation("h100-0")
    assert r.diagnosis.stage is Stage.DRAINING and "drained by a person" in r.diagnosis.held
    assert ("drain", "h100-w0") not in w.slurm.calls and w.checks.started == [] and not cordoned(w, "h100-0")
    w.slurm.table["h100-w0"] = SlurmNode("h100-w0", frozenset({"IDLE"}), "")  # the person resumed it
    w.run(seconds=120)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.diagnosis.stage is Stage.PASSED and not r.diagnosis.held


def test_a_diagnosis_is_not_an_unhealthy_node_nor_an_attempt():
    """Diagnosing (or diagnosed and passed) nodes hold no admission: a real fault elsewhere heals at once."""
    w = world(max_unhealthy_fraction=0.3)
    for n in ("h100-0", "h100-1"):
        w.slurm.jobs[int(n[-1]) + 7] = SlurmJob(int(n[-1]) + 7, "t", "RUNNING", nodes=(f"h100-w{n[-1]}",))
        diagnose_fault(w, n)
    w.run(seconds=5)
    w.fault("h100-2")
    w.run(seconds=10)
    r = w.remediation("h100-2")
    assert r.phase in (Phase.RESUMING, Phase.SUCCEEDED) and r.replacement, r


# --- the decisions --------------------------------------------------------------------------------------

SPEC = fleet(nodes=4, spares=2)


def view(fault: Fault | None = None, role: str = labels.ROLE_ACTIVE, **kw) -> NodeView:
    return NodeView("h100-0", "h100", role, fault=fault, **kw)


DIAG = Fault(13, "m", T0, action=FaultAction.DIAGNOSE, pci=PCI)


@pytest.mark.parametrize("fault, role, phase", [
    (DIAG, labels.ROLE_ACTIVE, Phase.DIAGNOSING),
    (Fault(79, "m", T0), labels.ROLE_ACTIVE, Phase.DETECTED),
    (DIAG, labels.ROLE_SPARE, None),  # a spare runs no job: the notice is all
    (Fault(13, "m", T0, action=FaultAction.RESTART_APP), labels.ROLE_ACTIVE, None),
])
def test_detect_starts_a_diagnosis_only_for_a_diagnose_fault_on_an_active_node(fault, role, phase):
    d = decide.detect(view(fault, role), [], SPEC, T0)
    assert (d.remediation.phase if d.remediation else None) is phase


def test_detect_starts_no_diagnosis_where_no_check_can_run():
    spec = fleet(nodes=4, spares=2, repair={"enabled": False})
    assert decide.detect(view(DIAG), [], spec, T0).remediation is None


def diagnosing(stage: Stage = Stage.DRAINING, **kw):
    r = decide.detect(view(DIAG), [], SPEC, T0).remediation
    d = begin(T0)
    if stage is not Stage.DRAINING:
        d = d.moved(Stage.CLEARING, T0)
    if stage in (Stage.CHECKING, Stage.RETURNING):
        d = d.moved(Stage.CHECKING, T0, job="job-1", deadline=T0 + timedelta(seconds=1320))
    return replace(r, slurm_nodes=("h100-w0",), diagnosis=replace(d, **kw))


def facts(fault=DIAG, slurm=(), jobs=(), verdict=None, **kw):
    return diagnosis.DiagnosisFacts(node=view(fault, **kw), slurm=tuple(slurm), jobs=tuple(jobs), verdict=verdict)


IDLE = SlurmNodeView("h100-w0", frozenset({"IDLE"}))
OURS = SlurmNodeView("h100-w0", frozenset({"IDLE", "DRAIN"}), "gpufleet: XID 13 [h100-0-xid13-x]",
                     set_by=Setter("gpufleet", gpufleet=True))


def test_draining_drains_in_slurm_and_notes_it_first():
    step = diagnosis.plan(diagnosing(), facts(slurm=[IDLE]), SPEC, T0)
    assert [type(a) for a in step.actions] == [DrainSlurm] and step.remediation.diagnosis.drained == ("h100-w0",)


def test_a_fault_that_takes_the_node_out_during_the_diagnosis_hands_it_to_the_heal():
    step = diagnosis.plan(diagnosing(Stage.CHECKING), facts(Fault(79, "m", T0 + timedelta(seconds=9))), SPEC, T0)
    r = step.remediation
    assert r.phase is Phase.DETECTED and r.diagnosis.stage is Stage.FAILED and r.diagnosis.needs == "reboot"


@pytest.mark.parametrize("verdict, at", [(Verdict("running"), 2000), (Verdict("inconclusive", "pod gone"), 10)])
def test_a_check_without_a_verdict_is_run_again_once_then_a_heal_with_a_reboot(verdict, at):
    late = T0 + timedelta(seconds=at)
    step = diagnosis.plan(diagnosing(Stage.CHECKING), facts(verdict=verdict), SPEC, late)
    (job,) = [a.job for a in step.actions if isinstance(a, StartHealthCheck)]
    r = step.remediation
    assert r.phase is Phase.DIAGNOSING and r.diagnosis.job == job != "job-1" and r.diagnosis.stage is Stage.CHECKING
    later = late + timedelta(seconds=at if verdict.state == "inconclusive" else 2000)
    step = diagnosis.plan(r, facts(verdict=verdict), SPEC, later)
    assert step.remediation.phase is Phase.DETECTED and step.remediation.diagnosis.needs == "reboot"


def test_a_check_that_cannot_prove_the_node_keeps_it_out_and_pages_once():
    unproven = Verdict("unproven", "dcgmi: not in the image")
    step = diagnosis.plan(diagnosing(Stage.CHECKING), facts(verdict=unproven), SPEC, T0 + timedelta(seconds=5000))
    (page,) = step.actions
    assert isinstance(page, Notify) and page.event == "diagnosis-unproven" and "mark-healthy h100-0" in page.text
    assert step.remediation.phase is Phase.DIAGNOSING and step.remediation.diagnosis.stage is Stage.CHECKING
    again = diagnosis.plan(replace(step.remediation, intents=(page.once,)), facts(verdict=unproven), SPEC,
                           T0 + timedelta(seconds=9000))
    assert again.actions == () and again.remediation is None


def test_a_passed_check_clears_the_condition_and_uncordons():
    step = diagnosis.plan(diagnosing(Stage.CHECKING), facts(verdict=Verdict("passed", "ok")), SPEC, T0)
    kinds = {type(a) for a in step.actions}
    assert {MarkHealthy, BackInService} <= kinds and StartHealthCheck not in kinds
    assert step.remediation.diagnosis.stage is Stage.RETURNING and step.remediation.phase is Phase.DIAGNOSING


def test_a_condition_cleared_by_someone_else_undoes_gpufleets_drain_and_ends():
    r = diagnosing(drained=("h100-w0",))
    step = diagnosis.plan(r, facts(None, slurm=[OURS]), SPEC, T0)
    assert ResumeSlurm("h100-w0") in step.actions and step.remediation.phase is Phase.SUCCEEDED
    assert step.remediation.diagnosis.stage is Stage.CLEARED


def test_the_wait_page_goes_once():
    r = diagnosing(drained=("h100-w0",))
    late = T0 + timedelta(seconds=SPEC.healing.faults.repeats.diagnose_wait_seconds)
    busy = [replace(OURS, states=frozenset({"ALLOCATED", "DRAIN"}))]
    step = diagnosis.plan(r, facts(slurm=busy), SPEC, late)
    (page,) = step.actions
    assert isinstance(page, Notify) and page.event == "diagnosis-waiting"
    again = diagnosis.plan(replace(step.remediation, intents=(page.once,)), facts(slurm=busy), SPEC, late)
    assert again.actions == () and again.remediation is None
