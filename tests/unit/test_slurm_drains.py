"""Nodes Slurm drained itself (slurmctld's or slurmd's own reason, set by Slurm's own users): each reason's row says
what gpufleet asks (core/slurm_reasons.py), the core writes gpufleet's GPU condition (core/slurm_drains.py), and the
heal or the diagnosis follows (a reboot for "Kill task failed" and a missing GPU, a health check while it stays
drained for a Prolog error or a registration that does not match). A person's drain is never acted on, whatever
its text. Pure tables, then the runtime with fakes and a fake clock."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import parse_condition
from gpufleet.fleetspec.load import SpecError
from gpufleet.reconciler.adapters.slurm import SlurmNode
from gpufleet.reconciler.core import decide, engineer_story, job_notes, job_record, slurm_drains
from gpufleet.reconciler.core.diagnosis_stages import Stage
from gpufleet.reconciler.core.drains import SlurmUsers
from gpufleet.reconciler.core.job_notes import JobSeen, appended, lines_for
from gpufleet.reconciler.core.job_story import JobFacts
from gpufleet.reconciler.core.actions import Notify, PageOnce
from gpufleet.reconciler.core.model import Fault, Remediation
from gpufleet.reconciler.core.observe import node_view
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from gpufleet.reconciler.core.slurm_reasons import GONE, REASONS
from gpufleet.reconciler.runtime.facts import slurm_view
from tests.unit.fakes import T0, World, fleet, pool_node

SPEC = fleet(nodes=4, spares=2)
POOL = SPEC.pools[0]
USERS = SlurmUsers.of(SPEC)
KILL = "Kill task failed (JobId=41)"
GPU_LOW = "gres/gpu count reported lower than configured (7 < 8)"
PROLOG = "Prolog error"
LOW_MEM = "Low RealMemory (reported:1000 < 100.00% of configured:2000)"


def slurm(reason: str, by: str = "root", states=("IDLE", "DRAIN"), name="h100-w0"):
    return slurm_view(SlurmNode(name, frozenset(states), reason, reason_set_by=by,
                                reason_changed_at=T0.timestamp()), USERS)


def drained(reason: str, by: str = "root", role=labels.ROLE_ACTIVE, node="h100-0", spec=SPEC, **view):
    v = node_view(pool_node(spec.pools[0], node, role), [labels.GPU_CONDITION])
    if view:
        v = type(v)(**{**v.__dict__, **view})
    return {node: slurm_drains.Drained(v, (slurm(reason, by),))}


def plan(nodes, records=(), spec=SPEC, now=T0):
    return slurm_drains.plan(nodes, list(records), spec, now)


# --- the table -----------------------------------------------------------------------------------------------

def test_every_row_asks_for_an_action_or_none_when_gone_and_codes_are_unique():
    assert len({r.code for r in REASONS}) == len(REASONS)
    for r in REASONS:
        assert (r.needs is None) == (r.action == GONE), r
        assert r.why and r.source.startswith("src/")
    asks = {r.prefix: r.needs for r in REASONS}
    assert asks["Kill task failed"] is FaultAction.REBOOT
    assert asks["gres/gpu count reported lower than configured"] is FaultAction.REBOOT
    assert {asks[p] for p in ("Prolog error", "Epilog error", "Job env setup error", "Prolog/Epilog failure",
                              "Low RealMemory")} == {FaultAction.DIAGNOSE}
    assert asks["Not responding"] is None  # core/node_lost.py reads the machine's loss from Kubernetes
    assert "UnkillableStepTimeout" in next(r.why for r in REASONS if r.prefix == "Kill task failed")


# --- what the core writes (pure) ---------------------------------------------------------------------------

@pytest.mark.parametrize("reason, needs", [(KILL, FaultAction.REBOOT), (GPU_LOW, FaultAction.REBOOT),
                                           (PROLOG, FaultAction.DIAGNOSE), (LOW_MEM, FaultAction.DIAGNOSE),
                                           ("Epilog error", FaultAction.DIAGNOSE)])
def test_slurms_own_drain_gets_the_condition_its_row_asks_for(reason, needs):
    (a,) = plan(drained(reason))
    sig = parse_condition(a.reason, a.message)
    assert a.node == "h100-0" and sig.kind is Kind.SLURM_DRAIN and sig.action is needs
    assert f"Slurm drained h100-w0 itself: {reason} [root at {T0.isoformat(timespec='seconds')}]" in a.message
    assert slurm_drains.headline(a.message) == f"Slurm drained h100-w0 itself: {reason}"
    # what the node's fault reads back, and the record it names
    n = pool_node(POOL, "h100-0", labels.ROLE_ACTIVE)
    n["status"]["conditions"].append({"type": labels.GPU_CONDITION, "status": "False", "reason": a.reason,
                                      "message": a.message, "lastTransitionTime": T0.isoformat()})
    f = node_view(n, [labels.GPU_CONDITION]).fault
    assert f is not None and f.kind is Kind.SLURM_DRAIN and f.needs is needs


@pytest.mark.parametrize("case", ["a person's drain, the same text", "root's drain of another text",
                                  "Not responding", "gpufleet's own drain", "not drained"])
def test_what_is_not_slurms_own_drain_asking_for_an_action_is_never_marked(case):
    reason, by, states = KILL, "root", ("IDLE", "DRAIN")
    if case == "a person's drain, the same text":
        by = "alice"  # a person who typed Slurm's words is still a person (drains.owner)
    elif case == "root's drain of another text":
        reason = "bad cable, ticket 4711"
    elif case == "Not responding":
        reason, by, states = "Not responding", "slurm", ("DOWN",)
    elif case == "gpufleet's own drain":
        reason, by = "gpufleet: XID 79 [h100-0-xid79-1]", "gpufleet"
    elif case == "not drained":
        states = ("IDLE",)
    v = node_view(pool_node(POOL, "h100-0", labels.ROLE_ACTIVE), [labels.GPU_CONDITION])
    assert plan({"h100-0": slurm_drains.Drained(v, (slurm(reason, by, states),))}) == ()


@pytest.mark.parametrize("case", ["a live remediation", "a fault read", "a spare", "an unmanaged pool"])
def test_a_node_already_healing_or_not_serving_in_a_managed_pool_is_left_alone(case):
    live, nodes = (), drained(KILL)
    if case == "a live remediation":  # of any fault: its heal drains over Slurm's drain and resumes it at its end
        live = (Remediation("h100-0-xid79-1", "h100-0", "h100", 79, "off the bus", Phase.SLURM_DRAINING, T0),)
    elif case == "a fault read":
        nodes = drained(KILL, fault=Fault(79, "off the bus", T0))
    elif case == "a spare":
        nodes = drained(KILL, role=labels.ROLE_SPARE)
    elif case == "an unmanaged pool":
        nodes = drained(KILL, pool="a100")
    assert plan(nodes, live) == ()


def test_the_switch_turns_it_off_and_a_check_needs_the_pools_health_check():
    assert plan(drained(KILL), spec=fleet(nodes=4, spares=2, slurm_drains="ignore")) == ()
    no_repair = fleet(nodes=4, spares=2, repair={"enabled": False})
    assert plan(drained(PROLOG, spec=no_repair), spec=no_repair) == ()  # left to a person, as before
    (a,) = plan(drained(KILL, spec=no_repair), spec=no_repair)  # the heal needs no check: a spare takes the job
    assert parse_condition(a.reason, a.message).action is FaultAction.REBOOT
    with pytest.raises(SpecError, match="healing.slurm_drains"):
        fleet(slurm_drains="sometimes")
    with pytest.raises(SpecError, match=r"condition_sources\[0\].kind: slurm-drain is read from Slurm's own"):
        fleet(condition_sources=[{"type": "Broken", "kind": "slurm-drain", "action": "reboot"}])


def test_the_gravest_of_several_slurm_nodes_on_one_machine_is_marked():
    v = node_view(pool_node(POOL, "h100-0", labels.ROLE_ACTIVE), [labels.GPU_CONDITION])
    nodes = {"h100-0": slurm_drains.Drained(v, (slurm(PROLOG, name="h100-w0"), slurm(KILL, name="h100-w9")))}
    (a,) = plan(nodes)
    assert parse_condition(a.reason, a.message).action is FaultAction.REBOOT and "h100-w9" in a.message


def test_a_slurm_drain_is_its_own_debounce_and_names_one_record():
    spec = fleet(nodes=4, spares=2, occurrences=3)
    (a,) = plan(drained(KILL))
    n = pool_node(POOL, "h100-0", labels.ROLE_ACTIVE)
    n["status"]["conditions"].append({"type": labels.GPU_CONDITION, "status": "False", "reason": a.reason,
                                      "message": a.message, "lastTransitionTime": T0.isoformat()})
    r = decide.detect(node_view(n, [labels.GPU_CONDITION]), [], spec, T0).remediation
    assert r is not None and r.name == f"h100-0-slurmdrain1-{int(T0.timestamp())}" and r.phase is Phase.DETECTED
    assert r.reason.startswith("Slurm's own drain needs reboot") and KILL in r.reason


# --- through the runtime (fakes, a fake clock) ---------------------------------------------------------------

def world(**healing) -> World:
    return World(fleet(nodes=4, spares=2, grace_period_seconds=0, **healing), operator=True)


def slurm_drains_node(w: World, host: str, reason: str, by: str = "root") -> None:
    """What slurmd (root) or slurmctld (the SlurmUser) does: the node drained with its own reason."""
    w.slurm.table[host] = SlurmNode(host, frozenset({"IDLE", "DRAIN"}), reason, reason_set_by=by,
                                    reason_changed_at=w.clock.now.timestamp())


def test_kill_task_failed_heals_the_node_and_the_repair_loop_reboots_checks_and_returns_it():
    w = world()
    slurm_drains_node(w, "h100-w0", KILL)
    w.run(seconds=60)
    r = w.remediation("h100-0")
    assert (r.kind, r.action, r.xid) == (Kind.SLURM_DRAIN, FaultAction.REBOOT, 1)
    assert "Slurm drained h100-w0 itself: Kill task failed (JobId=41) [root at" in r.reason
    assert r.replacement == "h100-spare-0" and r.phase is Phase.SUCCEEDED
    (page,) = w.notifier.texts["detected"]
    assert "Slurm's own drain" in page and KILL in page
    # the Slurm node moved with its pod to the spare, its drain lifted there; the machine goes to the repair loop
    assert w.kube.pods["slurm/slurm-worker-h100-w0"]["spec"]["nodeName"] == "h100-spare-0"
    assert "DRAIN" not in w.slurm.table["h100-w0"].states
    w.run(seconds=300)
    r = w.remediation("h100-0")
    assert r.repair is not None and r.repair.rungs == ("reboot",) and r.repair.phase is RepairPhase.RETURNED
    assert [x[0] for x in w.hardware.reboots] == ["h100-0"]
    assert len(w.store.list()) == 1  # one drain, one record


def test_a_prolog_error_is_checked_while_drained_and_returns_with_slurms_drain_lifted():
    w = world()
    slurm_drains_node(w, "h100-w1", PROLOG, by="slurm")  # slurmctld's own: the SlurmUser
    w.run(seconds=120)
    r = w.remediation("h100-1")
    assert r.kind is Kind.SLURM_DRAIN and r.action is FaultAction.DIAGNOSE
    assert r.phase is Phase.SUCCEEDED and r.diagnosis.stage is Stage.PASSED, r
    assert [s for s, _ in r.diagnosis.stage_times] == ["Draining", "Clearing", "Checking", "Returning", "Passed"]
    assert "Slurm drained h100-w1 itself: Prolog error" in r.reason
    assert len(w.checks.started) == 1 and w.provider.calls and {c[0] for c in w.provider.calls} <= {"back"}
    # verified, then undrained: Slurm's drain is lifted and the node serves again where it is
    assert ("resume", "h100-w1") in w.slurm.calls and "DRAIN" not in w.slurm.table["h100-w1"].states
    assert w.kube.pods["slurm/slurm-worker-h100-w1"]["spec"]["nodeName"] == "h100-1"
    (passed,) = w.notifier.texts["diagnosis-passed"]
    assert "was diagnosed (Slurm drained h100-w1 itself: Prolog error)" in passed
    w.run(seconds=120)
    assert len(w.store.list()) == 1  # the returned node starts nothing more


def test_a_persons_drain_with_slurms_words_is_never_acted_on():
    w = world()
    slurm_drains_node(w, "h100-w0", KILL, by="alice")
    w.run(seconds=120)
    assert w.store.list() == [] and w.slurm.calls == [] and w.checks.started == []
    assert w.slurm.table["h100-w0"].reason == KILL  # as the person left it


def test_a_failed_check_after_slurms_drain_heals_the_node():
    w = world()
    w.hardware.state["h100-2"] = w.hardware.REBOOT_FIXES
    slurm_drains_node(w, "h100-w2", LOW_MEM)
    w.run(seconds=120)
    r = w.remediation("h100-2")
    assert r.diagnosis.stage is Stage.FAILED and r.diagnosis.needs == "reboot" and r.replacement == "h100-spare-0"


def test_a_burst_of_kill_task_failed_drains_is_held_by_the_storm_brake_not_healed_at_once():
    """A hung shared file system: slurmd drains every node whose job touched it. Each is contained (it was drained
    already), and the storm brake (max_unhealthy_fraction 0.5 of 4) replaces none of them: one page, a person."""
    w = world(max_concurrent=4)
    for i in range(3):
        slurm_drains_node(w, f"h100-w{i}", KILL)
    w.run(seconds=60)
    rs = sorted(w.store.list(), key=lambda r: r.node)
    assert [r.node for r in rs] == ["h100-0", "h100-1", "h100-2"]
    assert all(r.phase is Phase.HELD for r in rs), [r.phase for r in rs]
    assert w.notifier.sent.count("storm") == 1 and not any(c[0] == "promote" for c in w.provider.calls)
    assert w.hardware.reboots == []


def test_a_drain_back_after_its_check_passed_is_left_to_a_person_with_one_page():
    """A registration that does not match (RealMemory configured above what the machine has) drains the node each
    time its slurmd registers again: a passing GPU check does not mend it, so it is not checked in a loop."""
    w = world()
    slurm_drains_node(w, "h100-w2", LOW_MEM)
    w.run(seconds=120)
    first = w.remediation("h100-2")
    assert first.diagnosis.stage is Stage.PASSED and "DRAIN" not in w.slurm.table["h100-w2"].states
    slurm_drains_node(w, "h100-w2", LOW_MEM)  # slurmd registered again: slurmctld drains it again
    w.run(seconds=300)
    assert w.store.list() == [first] and len(w.checks.started) == 1
    (page,) = w.notifier.texts["slurm-drain-again"]
    assert f"Slurm drained h100-w2 itself again: {LOW_MEM!r}, after its health check passed ({first.name}" in page
    assert "State=RESUME" in page and w.slurm.table["h100-w2"].reason == LOW_MEM  # left as Slurm set it
    assert w.kube.nodes["h100-2"]["metadata"]["annotations"][labels.SLURM_DRAIN_PAGED].startswith("h100-w2:")
    w.restart()  # a new process (or leader) reads that this drain was paged: no second page
    w.run(seconds=120)
    assert len(w.notifier.texts["slurm-drain-again"]) == 1
    # past healing.attempts_window_seconds after that check passed, the same reason is checked again
    ended = first.diagnosis.entered(Stage.PASSED)
    window = timedelta(seconds=SPEC.healing.attempts_window_seconds)
    late = slurm_view(SlurmNode("h100-w2", frozenset({"IDLE", "DRAIN"}), LOW_MEM, reason_set_by="slurm",
                                reason_changed_at=(ended + timedelta(seconds=60)).timestamp()), USERS)
    nodes = {"h100-2": slurm_drains.Drained(w.manager.caches.nodes.get("h100-2"), (late,))}
    (page,) = plan(nodes, w.store.list(), now=ended + window)
    assert isinstance(page, PageOnce) and isinstance(page.page, Notify) and page.node == "h100-2"
    (a,) = plan(nodes, w.store.list(), now=ended + window + timedelta(seconds=1))
    assert not isinstance(a, Notify) and a.node == "h100-2"


def test_ignore_leaves_slurms_drains_to_a_person():
    w = world(slurm_drains="ignore")
    slurm_drains_node(w, "h100-w0", KILL)
    w.run(seconds=120)
    assert w.store.list() == [] and w.slurm.calls == []


# --- what the engineer reads (`gpufleet why`) ------------------------------------------------------------------

def test_why_says_slurm_drained_the_node_itself_and_why():
    w = world()
    slurm_drains_node(w, "h100-w0", KILL)
    w.run(seconds=60)
    r = w.remediation("h100-0")
    seen = JobSeen(7, "RUNNING", ("h100-w0",), T0 + timedelta(minutes=5))
    r = type(r)(**{**r.__dict__, "jobs": (7,)})
    comment = appended("", 7, lines_for(r, seen), (job_record.encode(job_record.record_of(r, "H100")),)) or ""
    assert "requeued: Slurm drained h100-w0 itself: Kill task failed (JobId=41)" in comment  # its admin comment
    records = job_record.records_in(comment, job_notes.SEPARATOR)
    job = JobFacts(7, "train", "RUNNING", "alice", "ml", ("h100-w0",), T0, w.clock.now, None, 1)
    story = engineer_story.tell(7, job, records, w.clock.now)
    assert "Slurm drained h100-w0 itself: Kill task failed (a job's processes did not end on SIGKILL" in story.paragraph
    assert "GPU" not in story.paragraph.split("itself")[0]


def test_a_job_on_a_node_slurm_drained_for_a_check_is_told_so_not_of_a_gpu():
    (a,) = plan(drained(PROLOG))
    fault = Fault(3, a.message, T0, Kind.SLURM_DRAIN, FaultAction.DIAGNOSE)
    line = job_notes.notice_line("h100-w0", fault, JobSeen(7, "RUNNING", ("h100-w0",), T0 - timedelta(hours=1)))
    assert line == "gpufleet 2026-11-29T12:00:00Z: diagnose: Slurm drained h100-w0 itself: Prolog error; health " \
                   "check asked once the job ends"


def test_why_tells_a_job_left_running_on_a_node_slurm_drained_for_a_check_what_was_asked():
    (a,) = plan(drained(PROLOG))
    fault = Fault(3, a.message, T0, Kind.SLURM_DRAIN, FaultAction.DIAGNOSE)
    rec = job_record.notice_record("h100-0", ("h100-w0",), fault, "H100")
    assert rec.remediation == job_record.record_id(f"h100-0-slurmdrain3-{int(T0.timestamp())}")
    job = JobFacts(7, "train", "RUNNING", "alice", "ml", ("h100-w0",), T0 - timedelta(hours=1),
                   T0 - timedelta(minutes=50), None, 0)
    story = engineer_story.tell(7, job, [rec], T0 + timedelta(minutes=1))
    assert "At 12:00:00 UTC, Slurm drained h100-w0 itself: Prolog error (the node's Prolog failed); gpufleet asked " \
           "for a health check and left the job running" in story.paragraph
