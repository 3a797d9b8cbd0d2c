"""NVIDIA's "drain at the next job boundary" (DRAIN_AND_RESET) for kernel-reported Xids: classified with its
'when', carried in the condition's header, and honoured by `detect` (drain in Slurm while a job runs, heal once
none does, or at a checkpoint past `healing.job_boundary_max_seconds`), with the record and `gpufleet why` saying so."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.catalogue import When
from gpufleet.fleetspec.faults.classify import Classification, Classifier
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, parse_condition
from gpufleet.fleetspec.faults.driver import GpuEvent
from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.models import ConditionSource
from gpufleet.reconciler.agent.sightings import Sighting, condition_message
from gpufleet.reconciler.core import job_boundary
from gpufleet.reconciler.core.actions import Cordon, DrainSlurm, SignalJobs
from gpufleet.reconciler.core.decide import boundary_facts_needed, detect, plan_step
from gpufleet.reconciler.core.faults import FaultReader
from gpufleet.reconciler.core.job_story import AT_BOUNDARY, NodeFault, render, story
from gpufleet.reconciler.core.model import Fault, JobView, NodeView, SlurmNodeView, StepFacts
from gpufleet.reconciler.core.phases import Phase
from tests.unit.test_decide import T0, spec
from tests.unit.test_job_story import KUBE, job

S = timedelta(seconds=1)
PAIRED = ("GPU recovery action changed from 0x3 (Drain P2P) to 0x4 (Drain and Reset)")


def xid(code, text="", t=None, pci="0000:3b:00"):
    return GpuEvent(Kind.XID, code, pci, text, time=t)


# --- the classification carries the 'when' ----------------------------------------------------------

def test_xid_48_with_63_64_and_xid_154_drain_and_reset_wait_for_the_jobs_boundary_others_do_not():
    c = Classifier()
    assert c.classify(xid(48, t=100.0)).when is When.CHECKPOINT  # solo: RESET_GPU, now
    c.classify(xid(63, t=200.0))
    paired = c.classify(xid(48, t=210.0))
    assert (paired.action, paired.when) == (FaultAction.RESET_GPU, When.JOB_BOUNDARY)
    assert "DRAIN_AND_RESET" in paired.nvidia
    drain = Classifier().classify(xid(154, PAIRED))
    assert (drain.action, drain.when) == (FaultAction.RESET_GPU, When.JOB_BOUNDARY)
    by_value = Classifier().classify(xid(154, "GPU recovery action changed from 0x0 (None) to 0x4 (Later Label)"))
    assert by_value.when is When.JOB_BOUNDARY  # a later driver's label: the value decides
    reset = Classifier().classify(xid(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"))
    assert (reset.action, reset.when) == (FaultAction.RESET_GPU, When.CHECKPOINT)
    assert Classifier().classify(xid(79)).when is When.CHECKPOINT


def test_a_spec_override_is_final_and_heals_now():
    c = Classifier(FaultPolicy(xid={154: FaultAction.REBOOT}))
    v = c.classify(xid(154, PAIRED))
    assert (v.action, v.when) == (FaultAction.REBOOT, When.CHECKPOINT)


def test_the_condition_header_carries_the_when_and_old_headers_still_read_as_now():
    s = Sighting(xid(48, "DBE (double bit error) ECC error detected."), None, None, T0, 1,
                 Classification(FaultAction.RESET_GPU, "WORKFLOW_XID_48: with 63/64, DRAIN_AND_RESET", "rule",
                                When.JOB_BOUNDARY))
    message = condition_message(s, T0)
    assert message.startswith("[action=reset-gpu pci=0000:3b:00 when=job-boundary] XID 48")
    sig = parse_condition("Xid48", message)
    assert (sig.action, sig.when) == (FaultAction.RESET_GPU, When.JOB_BOUNDARY)
    old = parse_condition("Xid48", "[action=reset-gpu pci=0000:3b:00] XID 48 (DBE)")
    assert old.when is When.CHECKPOINT and old.action is FaultAction.RESET_GPU
    assert "when=" not in format_message(FaultSignal(Kind.XID, 79, FaultAction.REBOOT), "x")  # unchanged for others
    odd = parse_condition("Xid48", "[action=reset-gpu when=someday] XID 48")
    assert odd.when is When.CHECKPOINT  # an unknown word: now, as before the field existed


def test_the_reconciler_reads_the_when_from_its_own_condition_and_from_the_drivers_lines():
    msg = "[action=reset-gpu pci=0000:3b:00 when=job-boundary] XID 48 (DBE): x"
    f = FaultReader().read({"type": labels.GPU_CONDITION, "status": "False", "reason": "Xid48", "message": msg}, T0)
    assert (f.needs, f.when) == (FaultAction.RESET_GPU, When.JOB_BOUNDARY)
    npd = ConditionSource(type="KernelGpu", read="kernel-log", fault_status="True")
    lines = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x3 (Drain P2P) to 0x4 (Drain and Reset)"
    f = FaultReader(sources=(npd,)).read({"type": "KernelGpu", "status": "True", "reason": "X", "message": lines}, T0)
    assert (f.xid, f.needs, f.when) == (154, FaultAction.RESET_GPU, When.JOB_BOUNDARY)


# --- detect honours the boundary -------------------------------------------------------------------

def boundary_node(since=T0, **kw) -> NodeView:
    fault = Fault(48, "[action=reset-gpu when=job-boundary] XID 48", since, Kind.XID, FaultAction.RESET_GPU,
                  "0000:3b:00", when=When.JOB_BOUNDARY)
    return NodeView(name="h100-0", pool="h100", role=labels.ROLE_ACTIVE, fault=fault, **kw)


BUSY = SlurmNodeView("gpu-0", frozenset({"ALLOCATED"}))


def test_a_drain_and_reset_fault_drains_a_busy_node_signals_nobody_and_starts_no_heal():
    n = boundary_node()
    assert boundary_facts_needed(n, [])
    d = detect(n, [], spec(), T0 + 60 * S, on_node=job_boundary.OnNode((BUSY,), (7,)))
    assert d.remediation is None
    (drain,) = d.actions
    assert isinstance(drain, DrainSlurm) and drain.node == "gpu-0"
    assert drain.reason.startswith(labels.SLURM_REASON_PREFIX) and "DRAIN_AND_RESET" in drain.reason
    assert "[xid48 h100-0]" in drain.reason and job_boundary.asked_by(drain.reason) == ("xid", 48)  # not telemetry's
    assert not any(isinstance(a, (SignalJobs, Cordon)) for a in d.actions)
    assert 0 < d.look_after <= job_boundary.LOOK_EVERY
    draining = SlurmNodeView("gpu-0", frozenset({"ALLOCATED", "DRAIN"}), drain.reason)
    again = detect(n, [], spec(), T0 + 75 * S, on_node=job_boundary.OnNode((draining,), (7,)))
    assert again.actions == () and again.remediation is None  # drained already: nothing twice


def test_once_its_slurm_nodes_run_no_job_the_heal_starts_and_its_record_says_it_waited_and_why():
    n = boundary_node()
    why = job_boundary.reason("XID 48 needs reset-gpu", Kind.XID, 48, "h100-0")
    drained = SlurmNodeView("gpu-0", frozenset({"IDLE", "DRAIN"}), why)
    d = detect(n, [], spec(), T0 + 3600 * S, on_node=job_boundary.OnNode((drained,), ()))
    r = d.remediation
    assert r is not None and r.phase is Phase.DETECTED
    assert "drained at its job's boundary" in r.reason and "DRAIN_AND_RESET" in r.reason and "gpu-0" in r.reason
    # the heal owns the drain: kept (not drained again), and nobody to signal
    r = plan_step(r, StepFacts(slurm_names=("gpu-0",)), spec(), T0 + 3600 * S).remediation
    step = plan_step(r, StepFacts(slurm=(drained,)), spec(), T0 + 3601 * S)
    assert not any(isinstance(a, (DrainSlurm, SignalJobs)) for a in step.actions)
    assert step.remediation.phase is Phase.CHECKPOINTING and step.remediation.jobs == ()


def test_an_idle_node_is_healed_at_once_and_a_node_without_slurm_too():
    d = detect(boundary_node(), [], spec(), T0, on_node=job_boundary.OnNode((SlurmNodeView("gpu-0"),), ()))
    assert d.remediation is not None and "no job ran on it, healed at once" in d.remediation.reason
    assert detect(boundary_node(), [], spec(), T0, on_node=job_boundary.OnNode()).remediation is not None


def test_past_the_bound_the_running_job_moves_at_a_checkpoint_and_the_record_says_so():
    n = boundary_node()
    on = job_boundary.OnNode((BUSY,), (7,))
    s = spec(job_boundary_max_seconds=3600)
    assert detect(n, [], s, T0 + 3599 * S, on_node=on).remediation is None
    r = detect(n, [], s, T0 + 3600 * S, on_node=on).remediation
    assert r is not None and "still ran 3600s after the fault" in r.reason and "job_boundary_max_seconds" in r.reason
    r = plan_step(r, StepFacts(slurm_names=("gpu-0",)), s, T0 + 3600 * S).remediation
    step = plan_step(r, StepFacts(slurm=(BUSY,), jobs_on_node=(JobView(7, "RUNNING", ("gpu-0",)),)), s,
                     T0 + 3601 * S)
    assert any(isinstance(a, SignalJobs) and a.job_ids == (7,) for a in step.actions)  # the checkpoint path
    now = detect(n, [], spec(job_boundary_max_seconds=0), T0, on_node=on).remediation
    assert now is not None and "is 0" in now.reason


def test_other_faults_heal_now_whatever_runs_and_a_handled_boundary_fault_reads_nothing_more():
    on = job_boundary.OnNode((BUSY,), (7,))
    plain = NodeView(name="h100-0", pool="h100", role=labels.ROLE_ACTIVE,
                     fault=Fault(79, "XID 79", T0, Kind.XID, FaultAction.REBOOT))
    assert not boundary_facts_needed(plain, [])
    assert detect(plain, [], spec(), T0, on_node=on).remediation is not None
    n = boundary_node()
    r = detect(n, [], spec(), T0, on_node=job_boundary.OnNode()).remediation
    assert not boundary_facts_needed(n, [r])  # its record exists: the runtime asks Slurm nothing more


def test_a_machine_that_stopped_answering_is_not_waited_for():
    """Its job ends only when slurmctld gives up on it: the heal starts now (and forces its pods out as any)."""
    dead = boundary_node(ready=False, not_ready_since=T0, ready_status="Unknown")
    later = T0 + timedelta(seconds=spec().healing.node_lost_after_seconds + 1)
    d = detect(dead, [], spec(), later, carries_nodeset_pod=True, on_node=job_boundary.OnNode((BUSY,), (7,)))
    assert d.remediation is not None and not any(isinstance(a, DrainSlurm) for a in d.actions)


def test_healing_disabled_drains_nothing():
    d = detect(boundary_node(), [], spec(enabled=False), T0, on_node=job_boundary.OnNode((BUSY,), (7,)))
    assert d.actions == () and d.gate is not None


# --- gpufleet why ------------------------------------------------------------------------------------

def test_why_says_the_node_was_drained_at_the_jobs_boundary_and_why():
    msg = ("[action=reset-gpu pci=0000:3b:00 when=job-boundary] XID 48 (DBE): ECC [NVIDIA: WORKFLOW_XID_48: with "
           "63/64, DRAIN_AND_RESET]")
    s = story(7, job("COMPLETED", ended=-10, nodes=("gpu-a-0",), started=-600, restarts=0), [],
              [NodeFault("kgpu-0", T0 - 120 * S, 48, msg)], KUBE, T0 + 1000 * S)
    text = render(s)
    assert s.verdict == AT_BOUNDARY, text
    assert "drained in Slurm at this job's boundary" in text and "DRAIN_AND_RESET" in text, text


@pytest.mark.parametrize("kind,tag", [(Kind.XID, "xid48"), (Kind.SXID, "sxid48"), (Kind.DCGM, "dcgm48")])
def test_the_drains_tag_names_the_code_that_asked(kind, tag):
    assert f"[{tag} n]" in job_boundary.reason("x", kind, 48, "n")
    assert job_boundary.TAG.search(job_boundary.reason("x", kind, 48, "n"))


# --- the runtime, with fakes ---------------------------------------------------------------------------

def test_the_node_queue_drains_a_drain_and_reset_node_while_its_job_runs_and_heals_it_once_the_job_ended():
    from dataclasses import replace

    from gpufleet.reconciler.adapters.slurm import SlurmJob
    from tests.unit.fakes import World, fleet

    w = World(fleet(nodes=3, spares=1, grace_period_seconds=60))
    w.slurm.jobs[4] = SlurmJob(4, "train", "RUNNING", ("h100-w0",))
    w.run(5)
    w.kube.nodes["h100-0"]["status"]["conditions"].append(
        {"type": "GpuHealthy", "status": "False", "reason": "Xid48", "lastTransitionTime": w.clock.now.isoformat(),
         "message": "[action=reset-gpu pci=0000:3b:00 when=job-boundary] XID 48 (DBE): ECC [NVIDIA: WORKFLOW_XID_48: "
                    "with 63/64, DRAIN_AND_RESET]"})
    w.run(60)
    assert w.store.list() == [] and not any(c[0] == "signal" for c in w.slurm.calls)
    drained = w.slurm.table["h100-w0"]
    assert "DRAIN" in drained.states and "[xid48 h100-0]" in drained.reason
    assert w.slurm.calls.count(("drain", "h100-w0")) == 1  # drained once, however often it is looked at
    assert not w.kube.nodes["h100-0"]["spec"].get("unschedulable")  # not cordoned: its job's pods stay
    w.slurm.jobs[4] = replace(w.slurm.jobs[4], state="COMPLETED")  # the job ends on its own
    w.run(30)
    r = w.remediation("h100-0")
    assert (r.xid, r.jobs) == (48, ()) and "drained at its job's boundary" in r.reason
    assert not any(c[0] == "signal" for c in w.slurm.calls)


# --- the bound, for the telemetry rows that wait for the job's boundary too --------------------------------

def test_a_telemetry_boundary_drain_whose_job_outlives_the_bound_moves_it_at_a_checkpoint():
    from gpufleet.fleetspec import parse_fleet
    from gpufleet.reconciler.core import telemetry as tm
    from gpufleet.reconciler.core.actions import MarkDegraded

    def fleet(**healing):
        return parse_fleet({"environment": "test", "cluster": {"kind": "local"},
                            "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 4, "spares": 1}],
                            "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]}, "healing": healing})

    d = tm.Degradation("h100-0", 311, FaultAction.RESET_GPU, When.JOB_BOUNDARY, "an uncorrectable ECC error",
                       tm.Evidence("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2", 1, "rose by >= 1"), "NVIDIA's doc")
    view = NodeView(name="h100-0", pool="h100", role=labels.ROLE_ACTIVE)
    drained = SlurmNodeView("h100-w0", frozenset({"ALLOCATED", "DRAIN"}), tm.boundary_reason(d), reason_at=T0)
    on = {"h100-0": tm.NodeJobs(view, (drained,), (7,))}
    s = fleet(job_boundary_max_seconds=3600)
    assert tm.plan([d], on, s, T0 + 3599 * S) == ()  # within the bound: it waits
    (m,) = tm.plan([d], on, s, T0 + 3600 * S)
    assert isinstance(m, MarkDegraded) and "still ran" in m.message and "job_boundary_max_seconds" in m.message
    (m2,) = tm.plan([], on, s, T0 + 3600 * S)  # the threshold no longer holds: the drain it asked for still ends
    assert isinstance(m2, MarkDegraded) and m2.reason == "Dcgm311"
    busy = {"h100-0": tm.NodeJobs(view, (BUSY,), (7,))}
    (now,) = tm.plan([d], busy, fleet(job_boundary_max_seconds=0), T0)  # 0: never wait
    assert isinstance(now, MarkDegraded)


# --- the job's own story (its admin comment: `gpufleet why` on the login node, and its owner told) -------------

def test_the_job_left_to_finish_is_told_in_its_admin_comment_and_its_owner_hears_why():
    from gpufleet.fleetspec import parse_fleet
    from gpufleet.reconciler.adapters.slurm import SlurmJob
    from gpufleet.reconciler.adapters.slurm.job_facts import job_facts
    from gpufleet.reconciler.core import engineer_story, job_notes, job_record
    from tests.unit.fakes import World, fleet

    doc = fleet(nodes=3, spares=1).model_dump(mode="json")
    doc["healing"]["notifications"] = [{"type": "webhook", "name": "ml-team", "url_secret": "ml",
                                        "job_owners": {"accounts": ["ml"]}}]
    w = World(parse_fleet(doc))
    started = (w.clock.now - timedelta(minutes=5)).timestamp()
    w.slurm.jobs[4] = SlurmJob(4, "train", "RUNNING", ("h100-w0",), start_time=started, user="alice", account="ml")
    w.kube.nodes["h100-0"]["status"]["conditions"].append(
        {"type": "GpuHealthy", "status": "False", "reason": "Xid48", "lastTransitionTime": w.clock.now.isoformat(),
         "message": "[action=reset-gpu pci=0000:3b:00 gpu=1 when=job-boundary] XID 48 (DBE): ECC"})
    w.run(20)
    comment = w.slurm.comments[4]
    assert ": drained at its end: GPU 1 on h100-w0: " in comment and "NVIDIA: drain, reset after the job" in comment
    (rec,) = job_record.records_in(comment, job_notes.SEPARATOR)
    assert rec.state == job_record.AT_BOUNDARY
    story = engineer_story.tell(4, job_facts(w.slurm.job(4)), [rec], w.clock.now)
    assert "drain and reset at the job's boundary" in story.paragraph and "left the job running" in story.paragraph
    assert "saw no GPU fault" not in story.paragraph
    told = [m for route, m in w.notifier.to_owners if route == "ml-team"]
    assert [(m.event, m.job["job_id"]) for m in told] == [("drained-at-boundary", 4)]
    writes = w.slurm.comment_writes
    w.run(20)
    assert w.slurm.comment_writes == writes  # once
