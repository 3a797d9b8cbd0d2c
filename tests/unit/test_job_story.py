"""`gpufleet why`'s story, assembled from Slurm's job fields, the remediations and the node faults: pure,
table-tested."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.reconciler.core.job_story import (
    APP_RESTART, FAILED, HEALED, HEALING, HELD, NOTHING, OWN_ERROR, JobFacts, LendingEvent, NodeFault, reclaims, render, story)
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import T0

S = timedelta(seconds=1)
KUBE = {"gpu-a-0": "kgpu-0", "gpu-a-2": "kgpu-spare-0"}


def healed(until: Phase = Phase.SUCCEEDED, jobs=(7,)) -> Remediation:
    r = Remediation("kgpu-0-xid79-1", "kgpu-0", "kgpu", 79, "GPU has fallen off the bus", Phase.DETECTED, T0,
                    phase_times=(("Detected", T0),), jobs=jobs, slurm_nodes=("gpu-a-0",))
    path = [(Phase.SLURM_DRAINING, 0, {}), (Phase.CHECKPOINTING, 1, {"grace_deadline": T0 + 121 * S}),
            (Phase.REQUEUED, 60, {}), (Phase.EVICTING, 60, {}), (Phase.REPLACING, 61, {"replacement": "kgpu-spare-0"}),
            (Phase.RESUMING, 70, {}), (Phase.SUCCEEDED, 80, {})]
    for phase, at, extra in path:
        r = r.moved(phase, T0 + at * S, **extra)
        if phase is until:
            break
    return r


def job(state="RUNNING", nodes=("gpu-a-2",), started=85, ended=None, restarts=1, **kw) -> JobFacts:
    return JobFacts(7, "train", state, "alice", "ml", nodes, T0 - 900 * S, T0 + started * S if started is not None else None,
                    T0 + ended * S if ended is not None else None, restarts, **kw)


BEFORE = dict(nodes=("gpu-a-0",), started=-600, restarts=0)


@pytest.mark.parametrize("name, the_job, remediations, faults, verdict, says", [
    ("healed and running again", job(), [healed()], [], HEALED,
     ["fault: XID 79 (GPU has fallen off the bus) on kgpu-0 (Slurm gpu-a-0)", "Checkpointing (SIGTERM, 120 s",
      "Requeued", "Resuming (replacement kgpu-spare-0)", "Succeeded", "running again on gpu-a-2 (1 requeue(s)), 85 s"]),
    ("healed, still queued", job("PENDING", (), None, reason="Priority"), [healed()], [], HEALED,
     ["waits in Slurm's queue (Slurm: Priority)"]),
    ("being healed", job("PENDING", (), None), [healed(Phase.REPLACING)], [], HEALING, ["gpufleet is healing it"]),
    ("heal failed", job("PENDING", (), None),
     [healed(Phase.RESUMING).moved(Phase.FAILED, T0 + 400 * S, reason="replacement not taking jobs")], [], FAILED,
     ["remediation failed: replacement not taking jobs"]),
    ("its own XID 13 while it ran", job("FAILED", ended=-60, exit_code="ERROR 1", **BEFORE), [],
     [NodeFault("kgpu-0", T0 - 120 * S, 13, "Graphics Engine Exception")], OWN_ERROR,
     ["XID 13 (Graphics Engine Exception) on its node kgpu-0: the application on that GPU had to restart",
      "most often the job's own error: look at the job's stderr", "ended FAILED (ERROR 1)"]),
    ("a contained memory error (XID 94) while it ran", job("FAILED", ended=-60, exit_code="ERROR 1", **BEFORE), [],
     [NodeFault("kgpu-0", T0 - 120 * S, 94, "Contained memory error")], APP_RESTART,
     ["XID 94 (Contained memory error) on its node kgpu-0: a GPU memory error the GPU contained (hardware)",
      "only the application on that GPU had to restart; the node stays in service"]),
    ("its XID 13 repeated on one GPU: diagnostics asked", job(**BEFORE), [],
     [NodeFault("kgpu-0", T0 - 120 * S, 13, "[action=diagnose pci=0000:cb:00] XID 13 (Graphics Engine Exception)")],
     OWN_ERROR, ["XID 13 (Graphics Engine Exception) on its node kgpu-0: repeated on that GPU: diagnostics are asked",
                 "the node stays in service and the job runs on", "health-checked once idle"]),
    ("held by the storm brake", job("PENDING", (), None),
     [healed(Phase.REQUEUED).moved(Phase.HELD, T0 + 61 * S, held_message="2 of 4 nodes in pool kgpu unhealthy")],
     [], HELD, ["its replacement is held (2 of 4 nodes in pool kgpu unhealthy)", "nothing more happens until"]),
    ("an XID 13 on another node", job(**BEFORE), [], [NodeFault("kgpu-1", T0, 13)], NOTHING, ["nothing gpufleet saw"]),
    ("an XID 13 before it started", job(**BEFORE), [], [NodeFault("kgpu-0", T0 - 700 * S, 13)], NOTHING, []),
    ("a remediation of another job", job(**BEFORE), [healed(jobs=(8,))], [], NOTHING, []),
    ("completed, never touched", job("COMPLETED", ended=-10, exit_code="SUCCESS 0", **BEFORE), [], [], NOTHING,
     ["(Slurm: COMPLETED, SUCCESS 0)"]),
])
def test_the_story_and_its_verdict(name, the_job, remediations, faults, verdict, says):
    s = story(7, the_job, remediations, faults, KUBE, T0 + 1000 * S)
    text = render(s)
    assert s.verdict == verdict, text
    for part in says:
        assert part in text, text
    assert text.splitlines()[-1].startswith("verdict: ")
    times = [e.at for e in s.entries]
    assert times == sorted(times)  # in the order it happened


def test_a_requeued_jobs_submit_time_is_told_as_its_return_to_the_queue():
    text = render(story(7, job(), [healed()], [], KUBE, T0 + 1000 * S))
    assert "back in Slurm's queue" in text and "submitted by" not in text
    assert text.startswith("job 7 (train, alice/ml): RUNNING on gpu-a-2")
    first = render(story(7, replace(job(restarts=0), account=""), [], [], KUBE, T0 + 1000 * S))
    assert "submitted by alice" in first and first.startswith("job 7 (train, alice): ")


def test_the_fault_itself_is_told_once_not_again_as_a_node_fault():
    s = story(7, job(), [healed()], [NodeFault("kgpu-0", T0, 79, "off the bus")], KUBE, T0 + 1000 * S)
    assert sum("XID 79" in e.text for e in s.entries) == 1
    assert s.fault_to_running_seconds == 85


def test_unknown_to_slurm_and_to_every_remediation_is_no_story():
    assert story(7, None, [healed(jobs=(8,))], [], KUBE, T0) is None


def test_a_job_slurm_forgot_is_told_from_the_remediations():
    s = story(7, None, [healed()], [], KUBE, T0 + 1000 * S)
    assert not s.known_to_slurm and s.verdict == HEALED
    assert "neither slurmctld nor accounting remembers it" in render(s)


def test_a_job_slurmctld_forgot_is_told_from_accounting_and_says_so():
    """`gpufleet why` falls back to accounting (slurmrestd's GET /slurmdb/v0.0.45/job/{id}) once slurmctld forgot
    the job: the story is the same, its head names where the job's facts come from."""
    s = story(7, job("COMPLETED", ended=900, source="accounting"), [healed()], [], KUBE, T0 + 1000 * S)
    assert s.known_to_slurm
    head = render(s).splitlines()[0]
    assert head == "job 7 (train, alice/ml): COMPLETED on gpu-a-2 (from accounting: slurmctld no longer remembers it)"
    assert s.to_json()["job"]["source"] == "accounting"
    assert "from accounting" not in render(story(7, job(), [healed()], [], KUBE, T0 + 1000 * S))


def test_json_is_plain_data_with_utc_stamps():
    d = json.loads(json.dumps(story(7, job(), [healed()], [], KUBE, T0 + 1000 * S).to_json()))
    assert d["verdict"] == HEALED and d["remediations"] == ["kgpu-0-xid79-1"]
    assert d["job"]["started"] == "2026-11-29T12:01:25Z" and d["entries"][0]["at"].endswith("Z")
    assert d["kube_nodes"] == ["kgpu-0", "kgpu-spare-0"]


def test_slurms_expected_times_are_not_taken_for_a_start_or_an_end():
    from gpufleet.why_command import job_facts
    from gpufleet.reconciler.adapters.slurm import SlurmJob

    t = T0.timestamp()
    pending = job_facts(SlurmJob(7, "train", "PENDING", start_time=t + 600, end_time=t + 4200, submit_time=t))
    assert pending.started is None and pending.ended is None  # an expected start and end
    running = job_facts(SlurmJob(7, "train", "RUNNING", ("gpu-a-2",), start_time=t, end_time=t + 3600))
    assert running.started == T0 and running.ended is None
    done = job_facts(SlurmJob(7, "train", "COMPLETED", start_time=t, end_time=t + 60, admin_comment=None))
    assert done.ended == T0 + 60 * S and done.admin_comment == ""


# --- reclaims for lending that delayed the start (issue 22 item 2) ---

def _loan(node, start, end=None, reclaimed=None):
    from gpufleet.fleetspec.ledger import Loan

    at = lambda s: T0 + s * S if s is not None else None  # noqa: E731
    return Loan(node=node, kind="idle", gpus=8, start=at(start), end=at(end), reclaimed=at(reclaimed))


def _ledger(*loans):
    from gpufleet.fleetspec.ledger import PoolLedger

    return PoolLedger(at=T0, loans=loans)


BACK = [LendingEvent("kgpu-0", T0 - 140 * S, "Reclaiming",
                     "taking kgpu-0 back: 1 node(s) asked for by pending Slurm jobs, 0 idle"),
        LendingEvent("kgpu-0", T0 - 110 * S, "ReclaimForced", "borrowers on kgpu-0 outlasted the 30s reclaim grace "
                     "(a PodDisruptionBudget, or a slow exit): deleted"),
        LendingEvent("kgpu-0", T0 - 100 * S, "Reclaimed", "kgpu-0 is back from its loan after 3500s")]
FIRST = dict(nodes=("gpu-a-0",), started=0, restarts=0)  # submitted at -900, started at 0


@pytest.mark.parametrize("name, the_job, ledgers, events, says, not_says", [
    # the ledger closes the loan a pass late (-99); the Reclaimed Event has the time it ended (-100)
    ("delayed by a reclaim (ledger and Events)", job(**FIRST), {"kgpu": _ledger(_loan("kgpu-0", -3600, -99, -140))},
     BACK, ["kgpu-0 was lent to inference and taken back for it: the reclaim took 40 s (reclaim grace 30 s",
            "why: 1 node(s) asked for by pending Slurm jobs"], []),
    ("the ledger alone, its Events expired", job(**FIRST), {"kgpu": _ledger(_loan("kgpu-0", -3600, -100, -140))},
     [], ["kgpu-0 was lent to inference and taken back for it: the reclaim took 40 s"], ["grace", "why:"]),
    ("the Events alone, no ledger", job(**FIRST), {}, BACK, ["the reclaim took 40 s (reclaim grace 30 s"], []),
    ("a reclaim before it was submitted does not count", job(**FIRST),
     {"kgpu": _ledger(_loan("kgpu-0", -3600, -1000, -1040))}, [], [], ["taken back"]),
    ("a reclaim on another pool's node does not count", job(**FIRST),
     {"other": _ledger(_loan("kother-0", -3600, -100, -140))}, [], [], ["taken back"]),
    ("a loan ended by a fault is no reclaim", job(**FIRST), {"kgpu": _ledger(_loan("kgpu-0", -3600, -100))}, [],
     [], ["taken back"]),
    ("a reclaim after it started does not count", job(**FIRST),
     {"kgpu": _ledger(_loan("kgpu-0", -3600, 100, 60))}, [], [], ["taken back"]),
])
def test_reclaims_that_delayed_its_start(name, the_job, ledgers, events, says, not_says):
    found = reclaims(ledgers, events, {})
    s = story(7, the_job, [], [], KUBE, T0 + 1000 * S, found, pools=("kgpu",))
    text = render(s)
    for part in says:
        assert part in text, text
    for part in not_says:
        assert part not in text, text
    assert ("its start waited for 1 node(s) taken back from inference" in s.summary) == bool(says), s.summary
    assert [e.at for e in s.entries] == sorted(e.at for e in s.entries)


def test_a_pending_job_is_told_of_a_reclaim_under_way_in_its_pool_only():
    under_way = {"kgpu-1": ("kgpu", T0 + 900 * S)}
    events = [LendingEvent("kgpu-1", T0 + 900 * S, "Reclaiming", "taking kgpu-1 back: 1 node(s) asked for by "
                                                                  "pending Slurm jobs, 0 idle")]
    found = reclaims({"kgpu": _ledger(_loan("kgpu-1", 0))}, events, under_way)
    assert [(r.node, r.ended) for r in found] == [("kgpu-1", None)]
    pending = job("PENDING", (), None, restarts=0, reason="Resources")
    text = render(story(7, pending, [], [], KUBE, T0 + 1000 * S, found, pools=("kgpu",)))
    assert "kgpu-1 (pool kgpu, of the job's partition) is being taken back from inference since " \
           "2026-11-29T12:15:00Z" in text and "why: 1 node(s) asked for" in text, text
    elsewhere = render(story(7, pending, [], [], KUBE, T0 + 1000 * S, found, pools=("other",)))
    assert "taken back" not in elsewhere
    running = render(story(7, job(**FIRST), [], [], KUBE, T0 + 1000 * S, found, pools=("kgpu",)))
    assert "taken back" not in running  # an open loan delayed nothing it ran on


def test_an_open_loan_not_being_taken_back_is_no_reclaim():
    assert reclaims({"kgpu": _ledger(_loan("kgpu-1", 0))}, [], {}) == []


def test_a_contained_memory_error_is_never_blamed_on_the_job():
    s = story(7, job("FAILED", ended=-60, **BEFORE), [], [NodeFault("kgpu-0", T0 - 120 * S, 94)], KUBE, T0 + 1000 * S)
    text = render(s)
    assert s.verdict == APP_RESTART
    assert "job's own error" not in text and "job's code" not in text and "hardware" in text


def test_a_requeued_job_waiting_in_the_queue_lists_every_node_it_ran_on():
    r = replace(healed(Phase.REQUEUED), job_nodes=("gpu-a-0", "gpu-a-1"))
    s = story(7, job("PENDING", (), None), [r], [], {**KUBE, "gpu-a-1": "kgpu-1"}, T0 + 100 * S)
    assert s.kube_nodes == ("kgpu-0", "kgpu-1")
    assert "Kubernetes nodes: kgpu-0, kgpu-1" in render(s)


@pytest.mark.parametrize("component,host,counts", [
    ("gpufleet-agent", "kgpu-0", True),   # the agent's own Event about its node (kube.node_event)
    ("kubelet", "kgpu-0", False),          # anyone else who may create Events in default
    ("gpufleet-agent", "kgpu-1", False),   # said to come from another node's agent
    (None, None, False),
])
def test_a_nodes_story_counts_only_the_agents_events_about_it(component, host, counts):
    from gpufleet.reconciler.core.job_story import agent_event
    assert agent_event("kgpu-0", component, host) is counts


def test_every_slurm_supplied_string_is_printed_escaped():
    forged = replace(job(nodes=("gpu-a-2\n",), admin_comment="ok\r\nverdict: healed"),
                     name="x\nverdict: all is well\x1b[0m")
    text = render(story(7, forged, [healed()], [], KUBE, T0 + 100 * S))
    assert "\x1b" not in text and "\r" not in text
    assert [line for line in text.splitlines() if line.startswith("verdict:")] == [text.splitlines()[-1]]
    assert "x\\x0averdict: all is well\\x1b[0m" in text and "ok\\x0d\\x0averdict: healed" in text


def test_a_record_about_another_job_with_the_same_id_is_not_its_story():
    """Slurm reuses job ids (a new slurmctld state starts again at FirstJobId): a record of job 7 made before
    this job 7 was submitted, never requeued, or of a pool outside its partitions, is another job's."""
    fresh = job(nodes=("gpu-a-2",), started=1000, restarts=0)  # submitted at T0 - 900 s
    older = replace(healed(), created=T0 - 1000 * S)  # a remediation 100 s before that submission
    s = story(7, fresh, [older], [], KUBE, T0 + 2000 * S)
    assert s is not None and "kgpu-0-xid79-1" not in render(s) and s.verdict != HEALED
    # the same record, made after its submission, is its story; requeued, the submit time proves nothing
    assert "kgpu-0-xid79-1" in render(story(7, fresh, [healed()], [], KUBE, T0 + 2000 * S))
    assert "kgpu-0-xid79-1" in render(story(7, replace(fresh, restarts=1), [older], [], KUBE, T0 + 2000 * S))
    # a fault on a pool its partitions do not use never reached it
    s = story(7, job(), [healed()], [], KUBE, T0 + 2000 * S, pools=["lend"])
    assert "kgpu-0-xid79-1" not in render(s)
    assert "kgpu-0-xid79-1" in render(story(7, job(), [healed()], [], KUBE, T0 + 2000 * S, pools=["kgpu", "lend"]))
