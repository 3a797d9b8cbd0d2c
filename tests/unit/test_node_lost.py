"""A machine that stops answering (its kubelet dead): no agent reports from it, its NodeSet pod's eviction never
ends there, and the slurmd preStop never runs. The core reads the loss from the Node's Ready condition
(core/node_lost.py), heals it as any fault, force-deletes its NodeSet pod, and the repair loop reboots it."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.load import SpecError
from gpufleet.reconciler.adapters.slurm import SlurmJob
from gpufleet.reconciler.core import decide, node_lost, pages
from gpufleet.reconciler.core.actions import DeletePods, DownSlurm, EvictPods, SignalJobs
from gpufleet.reconciler.core.drains import slurm_reason
from gpufleet.reconciler.core.engineer_story import plain_fault
from gpufleet.reconciler.core.model import PodView, Remediation, StepFacts
from gpufleet.reconciler.core.observe import node_view
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.unit.fakes import T0, World, fleet, pool_node

SPEC = fleet()
POOL = SPEC.pools[0]


def _node(ready="Unknown", since=T0, role=labels.ROLE_ACTIVE):
    n = pool_node(POOL, "h100-0", role)
    n["status"]["conditions"] = [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
                                  "message": "Kubelet stopped posting node status.",
                                  "lastTransitionTime": since.isoformat()}]
    return node_view(n, [labels.GPU_CONDITION])


# --- detection (pure) --------------------------------------------------------------------------------

def test_a_node_not_ready_for_the_specs_time_is_a_node_lost_fault_that_needs_a_reboot():
    assert SPEC.healing.node_lost_after_seconds == 300  # Kubernetes' not-ready/unreachable toleration
    node = _node()
    early = decide.detect(node, [], SPEC, T0 + timedelta(seconds=299), carries_nodeset_pod=True)
    assert early.remediation is None
    r = decide.detect(node, [], SPEC, T0 + timedelta(seconds=300), carries_nodeset_pod=True).remediation
    assert r is not None and r.kind is Kind.NODE_LOST and r.action is FaultAction.REBOOT
    assert r.phase is Phase.DETECTED and r.name == f"h100-0-nodelost-{int(T0.timestamp())}"
    assert r.reason.startswith("the machine stopped answering needs reboot")
    assert "Kubelet stopped posting node status." in r.reason
    assert "stopped answering" in plain_fault(r.kind.value, 0)
    page = pages.detected(r, SPEC)
    assert "the machine stopped answering - Kubernetes has not seen it Ready for 300s" in page
    assert "SIGTERM" not in page and "cannot checkpoint" in page
    # read again later, the same loss names the same remediation: nothing new
    again = decide.detect(node, [r], SPEC, T0 + timedelta(seconds=900), carries_nodeset_pod=True)
    assert again.remediation is None


def test_a_not_ready_node_is_looked_at_again_when_its_time_passes_and_not_in_a_loop_after():
    node = _node()
    assert node_lost.look_again_after(node, SPEC, T0 + timedelta(seconds=100), True) == 201.0
    assert node_lost.look_again_after(node, SPEC, T0 + timedelta(seconds=301), True) is None  # seen: no spin
    assert node_lost.look_again_after(_node(ready="True"), SPEC, T0, True) is None
    assert node_lost.look_again_after(node, SPEC, T0, False) is None


@pytest.mark.parametrize("case", ["ready", "no nodeset pod", "spare", "no transition time", "False counts too"])
def test_only_an_active_node_with_a_nodeset_pod_not_ready_past_the_threshold_is_lost(case):
    late = T0 + timedelta(seconds=3600)
    node, carries = _node(), True
    if case == "ready":
        node = _node(ready="True")
    elif case == "no nodeset pod":
        carries = False
    elif case == "spare":
        node = _node(role=labels.ROLE_SPARE)
    elif case == "no transition time":
        n = pool_node(POOL, "h100-0", labels.ROLE_ACTIVE)
        n["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
        node = node_view(n, [labels.GPU_CONDITION])
    elif case == "False counts too":
        node = _node(ready="False")
    got = decide.detect(node, [], SPEC, late, carries_nodeset_pod=carries).remediation
    assert (got is not None) == (case == "False counts too")


@pytest.mark.parametrize("role", [labels.ROLE_ACTIVE, labels.ROLE_SPARE])
def test_a_node_on_loan_is_watched_without_a_nodeset_pod_and_its_loss_is_a_remediation(role):
    """A lent node's NodeSet pods left for the borrowers; its loss is read all the same (lending keeps the loan
    until then), and the heal takes it: a lent spare as a spare (nothing to move), an idle node as any."""
    n = pool_node(POOL, "h100-0", role)
    n["metadata"]["labels"][labels.LENT] = labels.LENT_SPARE if role == labels.ROLE_SPARE else labels.LENT_IDLE
    n["spec"]["taints"] = [{"key": labels.LENDING_TAINT, "effect": "NoSchedule"}]
    n["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "lastTransitionTime": T0.isoformat()}]
    node = node_view(n, [labels.GPU_CONDITION])
    assert node.on_loan
    assert decide.detect(node, [], SPEC, T0 + timedelta(seconds=299)).remediation is None
    r = decide.detect(node, [], SPEC, T0 + timedelta(seconds=300)).remediation
    assert r is not None and r.kind is Kind.NODE_LOST and r.was_spare is (role == labels.ROLE_SPARE)


def test_the_threshold_is_validated_and_its_error_names_the_field():
    assert fleet(node_lost_after_seconds=600).healing.node_lost_after_seconds == 600
    with pytest.raises(SpecError, match="healing.node_lost_after_seconds"):
        fleet(node_lost_after_seconds=5)
    with pytest.raises(SpecError, match=r"condition_sources\[0\].kind: node-lost is read from the node's Ready"):
        fleet(condition_sources=[{"type": "Broken", "kind": "node-lost", "action": "reboot"}])


# --- the heal's steps (pure) ----------------------------------------------------------------------------

def _lost_remediation(phase: Phase) -> Remediation:
    r = decide.detect(_node(), [], SPEC, T0 + timedelta(seconds=300), carries_nodeset_pod=True).remediation
    assert r is not None
    return Remediation(**{**r.__dict__, "phase": phase, "slurm_nodes": ("h100-w0",)})


def test_a_lost_machines_job_gets_no_sigterm_and_no_grace():
    now = T0 + timedelta(seconds=301)
    r = _lost_remediation(Phase.SLURM_DRAINING)
    facts = StepFacts(jobs_on_node=(SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",)),))
    step = decide.plan_step(r, facts, SPEC, now)
    assert not [a for a in step.actions if isinstance(a, SignalJobs)]
    assert step.remediation.phase is Phase.CHECKPOINTING and step.remediation.grace_deadline == now
    # the very next step requeues what still holds the node (Slurm had not marked it DOWN yet)
    nxt = decide.plan_step(step.remediation, facts, SPEC, now)
    assert nxt.remediation.phase is Phase.REQUEUED and nxt.remediation.jobs == (7,)
    # a GPU fault's job is signalled, as before
    xid = Remediation(**{**r.__dict__, "kind": Kind.XID, "xid": 79})
    assert [a for a in decide.plan_step(xid, facts, SPEC, now).actions if isinstance(a, SignalJobs)]


def _pods():
    nodeset = PodView("slurm", "slurm-worker-h100-w0", "h100-0", labels=((labels.SLINKY_POD_HOSTNAME, "h100-w0"),),
                      owner_kinds=("NodeSet",))
    other = PodView("default", "web", "h100-0", owner_kinds=("ReplicaSet",))
    return nodeset, other


def test_a_lost_machine_still_not_ready_has_its_nodeset_pod_force_deleted_and_the_heal_goes_on():
    now = T0 + timedelta(seconds=310)
    r = _lost_remediation(Phase.EVICTING)
    nodeset, other = _pods()
    step = decide.plan_step(r, StepFacts(pods=(nodeset, other), node=_node()), SPEC, now)
    # its Slurm node DOWN first, as the preStop a dead kubelet never runs would have (node_lost.let_go): else the
    # requeued job's pending termination reaches the slurmd made again on the spare and kills its next run there
    assert step.actions[:2] == (DownSlurm("h100-w0", slurm_reason(r)), DeletePods("h100-0", (nodeset.key,), force=True))
    assert EvictPods("h100-0", (other.key,)) in step.actions
    assert step.remediation.phase is Phase.REPLACING and "force-deleted" in step.remediation.reason


def test_a_lost_machine_back_ready_before_its_eviction_is_drained_as_any_other():
    now = T0 + timedelta(seconds=310)
    r = _lost_remediation(Phase.EVICTING)
    r = Remediation(**{**r.__dict__, "drain_deadline": now + timedelta(seconds=60)})
    nodeset, other = _pods()
    step = decide.plan_step(r, StepFacts(pods=(nodeset, other), node=_node(ready="True")), SPEC, now)
    assert not [a for a in step.actions if isinstance(a, DeletePods)]
    assert [a for a in step.actions if isinstance(a, EvictPods) and nodeset.key in a.pods]


# --- the runtime with fakes ---------------------------------------------------------------------------

def _world(provider: str = "kubernetes-spares"):
    spec = fleet()
    if provider == "aws-asg":  # the same fleet, its pool behind an Auto Scaling group (EC2 reboots it)
        spec = parse_fleet({"environment": "t", "cluster": {"kind": "local"},
                            "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 10, "spares": 2,
                                       "provider": "aws-asg", "aws": {"asg_name": "g"}}],
                            "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
                            "healing": {"grace_period_seconds": 60, "max_concurrent": 4, "max_unhealthy_fraction": 0.5,
                                        "drain_timeout_seconds": 10}})
    w = World(spec, operator=True)
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    return w


def test_a_dead_machine_is_healed_its_nodeset_pod_force_deleted_and_it_enters_the_repair_loop():
    w = _world()
    w.kill("h100-0")
    w.run(seconds=200, step=10)
    assert not w.store.list()  # not yet: a blip of Ready is no loss
    w.run(seconds=200, step=10)
    r = w.remediation_named("h100-0", Phase.SUCCEEDED)
    assert r.kind is Kind.NODE_LOST and r.replacement == "h100-spare-0"
    assert ("slurm/slurm-worker-h100-w0", 0) in w.kube.deletes  # force-deleted, once
    assert len([d for d in w.kube.deletes if d[0] == "slurm/slurm-worker-h100-w0"]) == 1
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-spare-0"
    assert not [c for c in w.slurm.calls if c[0] == "signal"]  # nothing to SIGTERM on a dead node
    assert w.slurm.jobs[7].state == "PENDING"  # Slurm requeued it; it runs again once the node is back
    assert w.slurm.calls.index(("down", "h100-w0")) < w.slurm.calls.index(("resume", "h100-w0"))
    assert "the machine stopped answering" in r.reason
    assert r.repair is not None  # the repair loop took it


def test_a_dead_machine_nothing_can_power_cycle_is_retired_at_once_not_after_a_reboot_asked_of_its_dead_agent():
    """kubernetes-spares asks a reboot of the node agent, which died with the machine: retired at once (Cluster
    API's MachineHealthCheck replaces such a Machine), not after the pool's reboot timeout of asking no one."""
    w = _world()
    w.kill("h100-0")
    w.run(seconds=400, step=10)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.repair is not None and r.repair.phase is RepairPhase.RETIRED, r.repair
    assert "h100-0 does not answer (not Ready for" in r.repair.reason
    assert "provider kubernetes-spares has no power control" in r.repair.reason
    assert not [c for c in w.provider.calls if c[0] == "repair"]  # nothing asked of a dead agent
    assert w.kube.nodes["h100-0"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_RETIRED
    assert [t for t in w.notifier.texts.get("retired", []) if "h100-0" in t]  # one page


def test_a_dead_machine_behind_a_provider_that_power_cycles_it_is_rebooted_checked_and_returned_to_the_spares():
    w = _world("aws-asg")
    w.kill("h100-0")
    w.run(seconds=400, step=10)
    assert w.remediation_named("h100-0", Phase.SUCCEEDED).replacement == "h100-spare-0"
    w.run(seconds=600, step=10)
    r = w.remediation("h100-0")
    assert ("repair", "h100-0", "reboot") in w.provider.calls  # through the provider: EC2's RebootInstances
    assert any(n == "h100-0" for n, _ in w.hardware.reboots)
    assert r.repair is not None and r.repair.phase is RepairPhase.RETURNED, r.repair
    assert [e.step for e in r.repair.history][:2] == ["reboot", "reboot"]
    assert w.kube.nodes["h100-0"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_SPARE


def test_a_dead_machine_that_never_answers_its_power_cycle_is_retired_by_the_repair_ladder():
    w = _world("aws-asg")
    w.hardware.revives_dead = False
    w.kill("h100-0")
    w.run(seconds=400, step=10)
    assert w.remediation_named("h100-0", Phase.SUCCEEDED).replacement == "h100-spare-0"
    assert ("repair", "h100-0", "reboot") in w.provider.calls
    w.run(seconds=1300, step=20)  # the pool's reboot_timeout_seconds (1200) passes
    r = w.remediation("h100-0")
    assert r.repair is not None and r.repair.phase is RepairPhase.RETIRED, r.repair
    assert "reboot gave no sign of success within 1200s" in r.repair.reason
    assert w.kube.nodes["h100-0"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_RETIRED
    assert not w.hardware.reboots  # nothing on it ever acted


@pytest.mark.parametrize("rung,provider,down,expected", [
    ("reboot", "kubernetes-spares", 300, "its node agent (provider kubernetes-spares has no power control"),
    ("reboot", "aws-asg", 300, ""),  # EC2 power-cycles it
    ("reset-gpu", "aws-asg", 300, "a reset-gpu is carried out by its node agent"),
    ("reboot", "kubernetes-spares", 299, ""),  # not lost yet: asked as any other (its agent acts once back)
])
def test_what_a_repair_can_reach_on_a_machine_that_does_not_answer(rung, provider, down, expected):
    pool = POOL.model_copy(update={"provider": provider})
    got = node_lost.cannot_reach(rung, _node(), pool, SPEC, T0 + timedelta(seconds=down))
    assert (expected in got) if expected else got == ""
    assert node_lost.cannot_reach(rung, _node(ready="True"), pool, SPEC, T0 + timedelta(seconds=down)) == ""


def test_a_node_back_ready_before_the_threshold_starts_nothing():
    w = _world()
    w.kill("h100-0")
    w.run(seconds=250, step=10)
    w.kube.dead.discard("h100-0")
    for c in w.kube.nodes["h100-0"]["status"]["conditions"]:
        c.update(status="True", reason="KubeletReady", message="", lastTransitionTime=w.clock.now.isoformat())
    w.run(seconds=600, step=10)
    assert not w.store.list() and not w.kube.deletes


def test_a_node_back_mid_heal_is_still_replaced_and_then_repaired():
    w = _world()
    w.kill("h100-0")
    w.run(seconds=300, step=10)
    w.run(seconds=1, step=0.5)
    assert w.remediation("h100-0").phase is not Phase.SUCCEEDED
    w.kube.dead.discard("h100-0")
    for c in w.kube.nodes["h100-0"]["status"]["conditions"]:
        c.update(status="True", reason="KubeletReady", message="", lastTransitionTime=w.clock.now.isoformat())
    w.run(seconds=300, step=10)
    r = w.remediation_named("h100-0", Phase.SUCCEEDED)
    assert r.replacement == "h100-spare-0"
    assert w.kube.nodes["h100-0"]["metadata"]["labels"][labels.ROLE] != labels.ROLE_ACTIVE


def test_the_storm_brake_counts_lost_machines_and_holds_their_replacement():
    w = World(fleet(max_unhealthy_fraction=0.2), operator=True)
    for i in range(5):
        w.kill(f"h100-{i}")
    w.run(seconds=400, step=10)
    rs = [w.remediation(f"h100-{i}") for i in range(5)]
    assert all(r.kind is Kind.NODE_LOST for r in rs)
    assert all(w.kube.nodes[f"h100-{i}"]["spec"].get("unschedulable") for i in range(5))  # contained
    # each counts: the first two (2 of 10, not above 0.2) are replaced, the third one out trips the brake
    held = [r for r in rs if r.phase is Phase.HELD]
    assert len(held) == 3 and all(r.replacement is None and "unhealthy" in r.held_message for r in held)
    assert sorted(r.phase.value for r in rs if r not in held) == ["Succeeded", "Succeeded"]
    assert w.notifier.sent.count("storm") == 1
    assert not [d for d in w.kube.deletes if any(d[0].endswith(r.slurm_nodes[0]) for r in held)]


# --- a reconciler killed anywhere on the path resumes, never repeats -----------------------------------------

def lost_path(w: World) -> list:
    return [(w.store, "write_status"), (w.store, "create"), (w.kube, "cordon"), (w.slurm, "drain"),
            (w.slurm, "requeue"), (w.slurm, "down"), (w.kube, "evict"), (w.kube, "delete_pod"), (w.provider, "promote"),
            (w.provider, "quarantine"), (w.provider, "retire"), (w.notifier, "send")]


def _dying():
    """A machine dead 295 s, its job still RUNNING in Slurm (slurmctld has not marked the node DOWN yet)."""
    w = _world()
    w.kill("h100-0", slurm_marks_down=False)
    w.run(seconds=295, step=5)
    assert not w.store.list()
    return w


LOST_PATH = 22  # every call in the window: the heal, its pages, and the retirement (nothing can power-cycle it)


def test_the_crash_points_cover_every_call_of_the_lost_machines_heal():
    from tests.unit.test_crashes import crash_after
    w = _dying()
    point = crash_after(w, 10_000, lost_path(w), 10, lambda: {})
    assert point.call == "" and point.made == LOST_PATH


@pytest.mark.parametrize("crash_at", range(1, LOST_PATH + 1))
def test_a_reconciler_killed_anywhere_on_a_lost_machines_heal_resumes_and_never_repeats(crash_at):
    from tests.unit.test_crashes import assert_guarantees, crash_after
    w = _dying()

    def sent():
        return {"notify:detected": w.notifier.sent.count("detected"),
                "signal:TERM": sum(1 for c in w.slurm.calls if c[0] == "signal")}

    point = crash_after(w, crash_at, lost_path(w), 10, sent)
    w.run(seconds=30, step=1)
    r = w.remediation("h100-0")
    assert r.phase in (Phase.RESUMING, Phase.SUCCEEDED) and r.replacement == "h100-spare-0", (point, r)
    assert {c[1] for c in w.provider.calls if c[0] == "promote"} == {"h100-spare-0"}
    assert_guarantees(point, sent(), ("notify:detected",))
    assert sent()["signal:TERM"] == 0 and ("requeue", (7,)) in w.slurm.calls
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-spare-0"


def test_gpufleet_why_tells_the_engineer_the_machine_stopped_answering_not_a_gpu():
    from gpufleet.reconciler.core import engineer_story, job_notes, job_record
    from gpufleet.reconciler.core.job_notes import JobSeen, appended, lines_for
    from gpufleet.reconciler.core.job_story import JobFacts

    r = _lost_remediation(Phase.SLURM_DRAINING)
    r = Remediation(**{**r.__dict__, "jobs": (7,)})
    for phase in (Phase.CHECKPOINTING, Phase.REQUEUED, Phase.EVICTING, Phase.REPLACING, Phase.RESUMING,
                  Phase.SUCCEEDED):
        r = r.moved(phase, T0 + timedelta(seconds=310))
    seen = JobSeen(7, "RUNNING", ("h100-w0",), T0 + timedelta(seconds=400))
    comment = appended("", 7, lines_for(r, seen), (job_record.encode(job_record.record_of(r, "H100")),)) or ""
    lines = comment.split(job_notes.SEPARATOR)[0]  # the lines `scontrol show job` shows the engineer
    assert "requeued: the machine behind h100-w0 stopped answering" in lines and "GPU" not in lines, lines
    records = job_record.records_in(comment, job_notes.SEPARATOR)
    job = JobFacts(7, "train", "RUNNING", "alice", "ml", ("h100-w0",), T0, T0 + timedelta(seconds=400), None, 1)
    s = engineer_story.tell(7, job, records, T0 + timedelta(seconds=500))
    assert "the machine behind h100-w0 stopped answering" in s.paragraph, s.paragraph
    assert "GPU" not in s.paragraph.split("What to do")[0], s.paragraph


# --- a job Slurm requeued itself before the loss was read ------------------------------------------------------

@pytest.mark.parametrize("accounting", [True, False])
def test_a_job_slurm_requeued_before_the_loss_was_read_is_noted_on_the_record_and_in_its_admin_comment(accounting):
    """slurmctld marks the Slurm node DOWN and requeues its --requeue job before the reconciler reads the loss: the
    job is on no node when the heal looks, and Slurm forgot where it ran. Accounting's NODE_FAIL run names it: the
    record keeps it (jobs, job_nodes), it is not requeued again, and its admin comment tells the story that
    `gpufleet why` reads. Without accounting the heal is the same, the job only untold."""
    from gpufleet.reconciler.core import job_notes, job_record

    w = _world()
    w.slurm.accounting = accounting
    w.kill("h100-0")  # slurm_marks_down: job 7 requeued by Slurm at once, PENDING, no nodes
    assert w.slurm.jobs[7].state == "PENDING" and not w.slurm.jobs[7].nodes
    w.run(seconds=400, step=10)
    r = w.remediation_named("h100-0", Phase.SUCCEEDED)
    assert not [c for c in w.slurm.calls if c[0] == "requeue" and 7 in c[1]]  # Slurm did it: never again
    comment = w.slurm.comments.get(7, "")
    if not accounting:
        assert r.jobs == () and comment == ""
        return
    assert r.jobs == (7,) and r.job_nodes == ("h100-w0",), r
    assert "requeued" in comment and "stopped answering" in comment, comment
    (rec,) = job_record.records_in(comment, job_notes.SEPARATOR)
    assert rec.kind == Kind.NODE_LOST.value and rec.slurm_node == "h100-w0" and rec.requeued_at is not None
    assert comment.endswith(job_notes.trailer(7))


def test_a_nodefail_on_the_slurm_node_long_before_this_loss_is_not_this_losss_job():
    r = _lost_remediation(Phase.CHECKPOINTING)  # lost after 300 s not Ready, read at T0 + 300
    since = node_lost.requeued_by_slurm_since(r)
    assert since == T0 - node_lost.REQUEUED_WINDOW
    assert decide.needs(r, T0).failed_on == ("h100-w0",) and decide.needs(r, T0).failed_since == since
    xid = Remediation(**{**r.__dict__, "kind": Kind.XID})
    assert node_lost.requeued_by_slurm_since(xid) is None and not decide.needs(xid, T0).failed_on


# --- a machine that dies during a GPU fault's heal -------------------------------------------------------------

def _xid(phase: Phase) -> Remediation:
    r = _lost_remediation(phase)
    return Remediation(**{**r.__dict__, "kind": Kind.XID, "xid": 79, "name": "h100-0-xid79-1"})


def test_a_gpu_faults_heal_force_deletes_the_nodeset_pod_once_its_machine_is_lost_and_not_before():
    nodeset, other = _pods()
    r = Remediation(**{**_xid(Phase.EVICTING).__dict__, "drain_deadline": T0 + timedelta(seconds=600)})
    lost = decide.plan_step(r, StepFacts(pods=(nodeset, other), node=_node()), SPEC, T0 + timedelta(seconds=300))
    assert DeletePods("h100-0", (nodeset.key,), force=True) in lost.actions
    early = decide.plan_step(r, StepFacts(pods=(nodeset, other), node=_node()), SPEC, T0 + timedelta(seconds=299))
    assert not [a for a in early.actions if isinstance(a, DeletePods)]


def test_a_pod_left_terminating_on_a_machine_that_died_after_its_eviction_is_force_deleted_while_resuming():
    from dataclasses import replace as dc_replace
    nodeset, _ = _pods()
    waiting = dc_replace(nodeset, deleting=True, deletion_grace=30)
    r = Remediation(**{**_xid(Phase.RESUMING).__dict__, "replacement": "h100-spare-0"})
    step = decide.plan_step(r, StepFacts(slurm_pods=(waiting,), node=_node()), SPEC, T0 + timedelta(seconds=300))
    assert step.actions == (DownSlurm("h100-w0", slurm_reason(r)), DeletePods("h100-0", (nodeset.key,), force=True))
    assert "stopped answering mid-heal" in step.remediation.reason
    forced = dc_replace(nodeset, deleting=True, deletion_grace=0)  # asked already: gone from the API server
    again = decide.plan_step(r, StepFacts(slurm_pods=(forced,), node=_node()), SPEC, T0 + timedelta(seconds=301))
    assert not [a for a in again.actions if isinstance(a, DeletePods)]


def test_a_machine_that_dies_right_after_its_gpu_fault_still_has_its_job_moved_to_the_spare():
    w = _world()
    w.fault("h100-0")
    w.kill("h100-0")
    w.run(seconds=400, step=10)
    r = w.remediation("h100-0")
    assert r.kind is Kind.XID and r.phase is Phase.SUCCEEDED and r.replacement == "h100-spare-0", r
    assert ("slurm/slurm-worker-h100-w0", 0) in w.kube.deletes
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-spare-0"


# --- a lent machine that dies (the runtime with fakes) -------------------------------------------------------

def test_a_lent_spare_that_dies_ends_its_loan_as_lost_is_healed_and_taken_by_the_repair_loop_never_waited_on():
    """Its borrowers can never leave a dead kubelet: nothing waits on them. The loan stands until the loss is read,
    then the heal takes the node (a spare: nothing to move), the loan ends counted as lost, and the repair loop
    retires it (kubernetes-spares: nothing can power-cycle it)."""
    from gpufleet.fleetspec.ledger import parse as parse_ledger

    w = World(parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 2, "spares": 2,
                   "lending": {"spares": True, "spare_floor": 1, "borrowers": {"selector": {"app": "inference"}}}}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
    }))
    w.run(seconds=3)
    assert ("lend", "h100-spare-1") in w.kube.calls
    w.kube.pods["inf/a"] = {"metadata": {"name": "a", "namespace": "inf", "uid": "uid-a", "labels": {"app": "inference"}},
                            "spec": {"nodeName": "h100-spare-1"}, "status": {"phase": "Running"}}
    w.kill("h100-spare-1", slurm_marks_down=False)
    w.run(seconds=290, step=10)
    assert not w.store.list() and ("end_loan", "h100-spare-1") not in w.kube.calls  # not lost yet: the loan stands
    w.run(seconds=60, step=5)
    r = w.remediation("h100-spare-1")
    assert r.kind is Kind.NODE_LOST and r.was_spare and r.phase is Phase.SUCCEEDED, r
    assert ("end_loan", "h100-spare-1") in w.kube.calls
    assert w.manager.metrics.lending_events.labels("h100", "lost")._value.get() == 1
    assert not [l for l in parse_ledger(w.kube.ledger["h100"], "h100").loans if l.node == "h100-spare-1" and l.open]
    assert r.repair is not None and r.repair.phase is RepairPhase.RETIRED, r.repair
    assert w.kube.nodes["h100-spare-1"]["metadata"]["labels"][labels.ROLE] == labels.ROLE_RETIRED
