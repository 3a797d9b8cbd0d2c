"""The lines gpufleet writes into a job's admin comment (pure, table-tested), and the pass that writes them:
at least once, never twice, and never in the way of a heal."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.reconciler.adapters.slurm import SlurmJob
from gpufleet.reconciler.core import job_notes
from gpufleet.reconciler.core.job_notes import JobSeen, appended, lines_for, note_line, settled
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import T0, World, fleet

S = timedelta(seconds=1)


def remediation(*phases: tuple[Phase, int], jobs=(7,), intents=("signal:TERM",), grace=120) -> Remediation:
    """A remediation of h100-3 (XID 79) that went through `phases` (each at T0 + seconds)."""
    r = Remediation("h100-3-xid79-1", "h100-3", "h100", 79, "off the bus", Phase.DETECTED, T0,
                    phase_times=(("Detected", T0),), jobs=jobs, intents=intents)
    for phase, at in phases:
        extra = {"grace_deadline": T0 + at * S + grace * S} if phase is Phase.CHECKPOINTING else {}
        r = r.moved(phase, T0 + at * S, jobs=jobs, **extra)
    return r


HEALED = ((Phase.SLURM_DRAINING, 0), (Phase.CHECKPOINTING, 1), (Phase.REQUEUED, 60), (Phase.EVICTING, 60),
          (Phase.REPLACING, 61), (Phase.RESUMING, 70), (Phase.SUCCEEDED, 80))


def test_one_line_names_the_time_and_the_event_and_stays_short():
    assert note_line(T0, "requeued", "GPU 3 on h100-3: GPU has fallen off the bus (Xid 79)") == (
        "gpufleet 2026-11-29T12:00:00Z: requeued: GPU 3 on h100-3: GPU has fallen off the bus (Xid 79)")
    assert len(note_line(T0, "requeued", "x" * 500)) == job_notes.LINE_MAX


@pytest.mark.parametrize("phases, intents, job, expected", [
    # contained and signalled: one line, the fault told once, with the grace the remediation gave
    (HEALED[:2], ("signal:TERM",), JobSeen(7, "RUNNING", ("h100-w3",), T0 - 600 * S),
     ["SIGTERM to checkpoint: a GPU on h100-3: GPU has fallen off the bus (Xid 79); 120 s grace"]),
    # no grace (grace_period_seconds 0): no signal, straight to the requeue, which then tells the fault
    (((Phase.SLURM_DRAINING, 0), (Phase.CHECKPOINTING, 1), (Phase.REQUEUED, 1)), (), JobSeen(7, "PENDING"),
     ["requeued: a GPU on h100-3: GPU has fallen off the bus (Xid 79)"]),
    # healed, the job waiting in the queue: signalled and requeued, no resume yet
    (HEALED, ("signal:TERM",), JobSeen(7, "PENDING"),
     ["SIGTERM to checkpoint", "requeued: the machine behind h100-3 is replaced"]),
    # healed and the job running again since after the requeue: the resume, with the time from the fault
    (HEALED, ("signal:TERM",), JobSeen(7, "RUNNING", ("h100-w9",), T0 + 85 * S),
     ["SIGTERM", "requeued", "2026-11-29T12:01:25Z: running again: on h100-w9; h100-3 runs on a healthy machine; "
      "85 s after the fault"]),
    # still running from before the requeue (start before it): not a resume
    (HEALED[:3], ("signal:TERM",), JobSeen(7, "RUNNING", ("h100-w3",), T0 - 600 * S), ["SIGTERM", "requeued"]),
    # admission held the replacement
    (HEALED[:3] + ((Phase.HELD, 62),), ("signal:TERM",), JobSeen(7, "PENDING"),
     ["SIGTERM", "requeued", "on hold: replacing h100-3's machine waits for the on-call"]),
    # a job this remediation never touched: nothing
    (HEALED, ("signal:TERM",), JobSeen(8, "RUNNING", ("h100-w9",), T0 + 85 * S), []),
])
def test_the_lines_a_remediation_owes_a_job(phases, intents, job, expected):
    lines = lines_for(remediation(*phases, intents=intents), job)
    assert len(lines) == len(expected)
    for line, part in zip(lines, expected):
        assert line.startswith("gpufleet 2026-11-29T12:") and part in line
    assert sum("Xid 79" in line for line in lines) <= 1  # the fault told once


def test_the_lines_are_the_same_on_every_pass_so_none_is_written_twice():
    r, job = remediation(*HEALED), JobSeen(7, "RUNNING", ("h100-w9",), T0 + 85 * S)
    once = appended("", 7, lines_for(r, job))
    assert once is not None and appended(once, 7, lines_for(r, job)) is None


@pytest.mark.parametrize("existing, expected", [
    ("", "A | B | whole story: gpufleet why 7"),
    ("checked by ops", "checked by ops | A | B | whole story: gpufleet why 7"),  # a person's text stays first
    ("checked by ops | A | whole story: gpufleet why 7",
     "checked by ops | A | B | whole story: gpufleet why 7"),  # only what is missing, the trailer last
])
def test_appending_keeps_what_was_there(existing, expected):
    a, b = "gpufleet 2026-11-29T12:00:00Z: A", "gpufleet 2026-11-29T12:00:01Z: B"
    got = appended(existing.replace("A", a).replace("B", b) if existing else "", 7, (a, b))
    assert got == expected.replace("A", a).replace("B", b)


def test_settled_once_the_job_ran_again_or_is_gone_or_the_remediation_ended_long_ago():
    healed = remediation(*HEALED)
    now = T0 + 100 * S
    assert settled(healed, None, now)
    assert settled(healed, JobSeen(7, "RUNNING", ("h100-w9",), T0 + 85 * S), now)
    assert not settled(healed, JobSeen(7, "PENDING"), now)  # waits for its restart
    assert settled(healed, JobSeen(7, "PENDING"), T0 + 80 * S + job_notes.RESUME_WINDOW + S)
    assert settled(healed, JobSeen(7, "CANCELLED"), now)  # finished: Slurm takes no more updates
    assert not settled(remediation(*HEALED[:2]), JobSeen(7, "COMPLETED"), now)  # ended on SIGTERM: requeued next
    assert settled(remediation(*HEALED[:3]), JobSeen(7, "COMPLETED"), now)
    assert not settled(remediation(*HEALED[:3]), JobSeen(7, "RUNNING", ("h100-w9",), T0 + 85 * S), now)  # live


# --- the pass, with the runtime's fakes --------------------------------------------------------------

def job_world(**healing) -> World:
    w = World(fleet(**healing))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w3",))
    w.slurm.comments[7] = "checked by ops"  # an earlier admin comment
    return w


def test_a_requeued_job_gets_its_lines_after_what_was_there_and_its_resume_once_it_runs_again():
    w = job_world(grace_period_seconds=5)
    w.fault("h100-3")
    w.run(seconds=20)
    r = w.remediation("h100-3")
    assert r.jobs == (7,) and r.phase is Phase.RESUMING
    text = w.slurm.comments[7]
    assert text.startswith("checked by ops | gpufleet ")
    assert "SIGTERM to checkpoint: a GPU on h100-w3: GPU has fallen off the bus (Xid 79); 5 s grace" in text
    assert ": requeued: the machine behind h100-w3 is replaced" in text
    assert text.endswith(" | whole story: gpufleet why 7")
    writes = w.slurm.comment_writes
    w.run(seconds=10)
    assert w.slurm.comment_writes == writes  # nothing new: nothing written
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w10",), start_time=w.clock.now.timestamp())
    w.run(seconds=5)
    assert ": running again: on h100-w10; h100-w3 runs on a healthy machine;" in w.slurm.comments[7]
    assert w.slurm.comments[7].count("gpufleet 20") == 3
    w.run(seconds=5)
    registry = w.manager.metrics.registry
    assert registry.get_sample_value("gpufleet_job_back_seconds_count") == 1  # observed once, with its resume line


def test_a_slurm_that_refuses_the_comment_delays_the_note_never_the_heal():
    w = job_world(grace_period_seconds=0)
    refused = []

    def refuse(job_id, text):
        refused.append(job_id)
        raise __import__("gpufleet.reconciler.adapters.slurm", fromlist=["SlurmError"]).SlurmError("slurmctld busy",
                                                                                            temporary=True)

    w.slurm.set_admin_comment = refuse
    w.fault("h100-3")
    w.run(seconds=30)
    assert refused and w.remediation("h100-3").phase is Phase.RESUMING  # healed all the same
    assert w.slurm.comments[7] == "checked by ops"
    del w.slurm.set_admin_comment  # Slurm takes it again
    w.run(seconds=20)
    assert w.slurm.comments[7].count(": requeued: ") == 1


def test_a_restarted_reconciler_adds_nothing_twice():
    w = job_world(grace_period_seconds=0)
    w.fault("h100-3")
    w.run(seconds=10)
    before = w.slurm.comments[7]
    w.restart()
    w.run(seconds=10)
    assert w.slurm.comments[7] == before


def test_a_dry_run_writes_no_comment():
    w = World(fleet(grace_period_seconds=0), dry_run=True)
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w3",))
    w.fault("h100-3")
    w.run(seconds=10)
    assert w.slurm.comment_writes == 0


def test_a_finished_job_is_not_written_to_slurm_would_refuse_it():
    w = job_world(grace_period_seconds=0)
    w.fault("h100-3")
    w.run(seconds=10)
    writes = w.slurm.comment_writes
    w.slurm.jobs[7] = SlurmJob(7, "train", "COMPLETED", ("h100-w10",), start_time=w.clock.now.timestamp())
    w.run(seconds=10)
    assert w.slurm.comment_writes == writes
    assert w.manager.metrics.registry.get_sample_value("gpufleet_action_errors_total",
                                                       {"action": "NoteJob", "error": "permanent"}) is None


# --- telling the job's owner -----------------------------------------------------------------------

def owner_world(per_hour=6):
    from gpufleet.fleetspec import parse_fleet

    doc = fleet(grace_period_seconds=5).model_dump(mode="json")
    doc["healing"]["notifications"] = [
        {"type": "webhook", "name": "oncall", "url_secret": "oncall"},
        {"type": "webhook", "name": "ml-team", "url_secret": "ml", "job_owners": {
            "accounts": ["ml"], "max_per_job_per_hour": per_hour}}]
    w = World(parse_fleet(doc))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w3",), user="alice", account="ml")
    w.slurm.jobs[8] = SlurmJob(8, "train", "RUNNING", ("h100-w3",), user="bob", account="physics")
    return w


def told(w) -> list:
    return [m for route, m in w.notifier.to_owners if route == "ml-team"]


def test_the_owner_route_of_the_jobs_account_gets_one_message_per_transition_and_no_other_account_does():
    w = owner_world()
    w.fault("h100-3")
    w.run(seconds=20)
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w10",), start_time=w.clock.now.timestamp(),
                               user="alice", account="ml")
    w.run(seconds=20)
    sent = told(w)
    assert [(m.event, m.job["job_id"], m.job["user"]) for m in sent] == [
        ("signalled", 7, "alice"), ("requeued", 7, "alice"), ("running-again", 7, "alice")]
    # the engineer's paragraph, as `gpufleet why` prints it on the login node
    assert sent[1].text.startswith("your job 7: Job 7 (train): At 12:00:00 UTC, a GPU (H100) on h100-w3 failed: "
                                   "GPU has fallen off the bus (NVIDIA Xid 79).")
    assert "What to do: " in sent[1].text and "gpufleet 20" not in sent[1].text
    assert sent[1].fields()["remediation"] == w.remediation("h100-3").name
    assert {route for route, _ in w.notifier.to_owners} == {"ml-team"}  # job 8 (physics) told no one


def test_messages_about_one_job_are_rate_limited():
    w = owner_world(per_hour=2)
    w.fault("h100-3")
    w.run(seconds=20)
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w10",), start_time=w.clock.now.timestamp(),
                               user="alice", account="ml")
    w.run(seconds=20)
    assert [m.event for m in told(w)] == ["signalled", "requeued"]  # the third within the hour is not sent
    assert ": running again: on h100-w10" in w.slurm.comments[7]  # the note is written all the same


@pytest.mark.parametrize("users, accounts, user, account, told", [
    (["alice"], [], "alice", "ml", True),
    ([], ["ml"], "bob", "ml", True),
    (["*"], [], "anyone", "", True),
    (["alice"], ["ml"], "bob", "physics", False),
])
def test_owner_routes_match_the_user_or_the_account(users, accounts, user, account, told):
    from gpufleet.fleetspec.models import WebhookTarget

    t = WebhookTarget(type="webhook", name="r", url_secret="x", job_owners={"users": users, "accounts": accounts})
    assert (job_notes.owner_routes([t], JobSeen(7, "RUNNING", user=user, account=account)) == ("r",)) is told


def test_two_remediations_of_one_job_tell_its_requeue_hold_and_restart_once():
    first = remediation(*HEALED[:3], (Phase.HELD, 62))
    second = Remediation("h100-4-xid79-1", "h100-4", "h100", 79, "off the bus", Phase.DETECTED, T0 + 1 * S,
                         phase_times=(("Detected", T0 + 1 * S),), jobs=(7,))
    for phase, at in ((Phase.SLURM_DRAINING, 1), (Phase.CHECKPOINTING, 2), (Phase.REQUEUED, 61), (Phase.HELD, 63)):
        second = second.moved(phase, T0 + at * S, jobs=(7,))
    waiting = JobSeen(7, "PENDING")
    text = ""
    for r in (first, second):
        text = appended(text, 7, lines_for(r, waiting, [first, second])) or text
    assert text.count(": requeued: ") == 1 and text.count(": on hold: ") == 1
    back = JobSeen(7, "RUNNING", ("h100-w9", "h100-w10"), T0 + 90 * S)
    both = lines_for(first, back, [first, second]) + lines_for(second, back, [second, first])
    assert sum("running again" in line for line in both) == 1
    assert "; 90 s after the fault" in next(x for x in both if "running again" in x)
    # a later requeue of the same job (after it ran again) is a new event, told again
    later = replace(second, phase_times=second.phase_times[:1] + (("Requeued", T0 + 95 * S),))
    assert any(": requeued: " in x for x in lines_for(later, back, [first, later]))


def test_the_pass_writes_one_requeue_line_for_a_job_two_remediations_requeued():
    w = job_world(grace_period_seconds=5)
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w3", "h100-w4"))
    w.fault("h100-3")
    w.fault("h100-4")
    w.run(seconds=20)
    assert {w.remediation("h100-3").jobs, w.remediation("h100-4").jobs} == {(7,)}
    assert w.slurm.comments[7].count(": requeued: ") == 1


# --- a fault that leaves its node in service still reaches the job on that GPU ------------------------------

@pytest.mark.parametrize("code, event, said", [
    (94, "restart-app", "Contained memory error (Xid 94); the app on it must restart; node stays in service"),
    (31, "restart-app", "GPU memory page fault (Xid 31); the app on it must restart; node stays in service"),
])
def test_a_fault_that_leaves_the_node_in_service_reaches_the_jobs_there_and_their_owners(code, event, said):
    """NVSentinel's condition (status True, "ErrorCode:94 PCI:0000:b3:00 ... Recommended Action=...;", the format the
    docs/oncall.md's condition_sources example reads): the node stays in service, and the job running there is told, in
    its admin comment and through its owner's route, that the application on that GPU must restart."""
    from gpufleet.fleetspec import parse_fleet

    doc = fleet(grace_period_seconds=5).model_dump(mode="json")
    doc["healing"]["condition_sources"] = [{
        "type": "SysLogsXIDError",
        "message_pattern": "ErrorCode:(?P<code>[0-9]{1,6}) PCI:(?P<pci>[0-9a-fA-F:.]{7,16}) "}]
    doc["healing"]["notifications"] = [{"type": "webhook", "name": "ml-team", "url_secret": "ml",
                                        "job_owners": {"accounts": ["ml"]}}]
    w = World(parse_fleet(doc))
    started = (w.clock.now - timedelta(minutes=5)).timestamp()
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", ("h100-w3",), start_time=started, user="alice", account="ml")
    w.slurm.jobs[8] = SlurmJob(8, "eval", "RUNNING", ("h100-w4",), start_time=started, user="alice", account="ml")
    w.kube.nodes["h100-3"]["status"]["conditions"].append({
        "type": "SysLogsXIDError", "status": "True", "reason": "SysLogsXIDErrorIsNotHealthy",
        "message": f"ErrorCode:{code} PCI:0000:b3:00 Recommended Action=RESTART_APP;",
        "lastTransitionTime": w.clock.now.isoformat()})
    w.run(seconds=10)
    assert w.store.list() == [] and not w.kube.nodes["h100-3"]["spec"].get("unschedulable")  # in service
    line = w.slurm.comments[7]
    assert f": {event}: GPU 0000:b3:00 on h100-w3: {said}" in line  # the Slurm node, the name the engineer knows
    assert 8 not in w.slurm.comments  # the job on another node is not concerned
    told = [m for route, m in w.notifier.to_owners if route == "ml-team"]
    assert [(m.event, m.job["job_id"]) for m in told] == [(event, 7)]
    assert told[0].text.startswith("your job 7: Job 7 (train): At 12:00:00 UTC, the GPU at PCI 0000:b3:00 (H100) on "
                                   "h100-w3 ")
    writes = w.slurm.comment_writes
    w.run(seconds=20)
    assert w.slurm.comment_writes == writes and len(w.notifier.to_owners) == 1  # once per signal


def test_the_notice_line_is_for_a_job_that_ran_when_the_fault_came():
    from gpufleet.fleetspec.faults import FaultAction
    from gpufleet.reconciler.core.model import Fault
    f = Fault(94, "m", T0, action=FaultAction.RESTART_APP, pci="0000:01:00")
    running = JobSeen(7, "RUNNING", ("h100-w3",), T0 - timedelta(hours=1))
    assert job_notes.notice_line("h100-3", f, running) == (
        "gpufleet 2026-11-29T12:00:00Z: restart-app: GPU 0000:01:00 on h100-3: Contained memory error (Xid 94); the "
        "app on it must restart; node stays in service")
    assert job_notes.notice_line("h100-3", f, JobSeen(7, "RUNNING", (), T0 + timedelta(seconds=1))) is None  # later
    assert job_notes.notice_line("h100-3", f, JobSeen(7, "PENDING", ())) is None
    diag = Fault(13, "[action=diagnose gpu=2] m", T0, action=FaultAction.DIAGNOSE)
    # the job's owner learns the node is checked while it stays in service: the job runs on, no new one lands
    assert job_notes.notice_line("h100-3", diag, running) == (
        "gpufleet 2026-11-29T12:00:00Z: diagnose: GPU 2 on h100-3: Graphics Engine Exception (Xid 13); repeated: "
        "diagnostics asked while the job runs on")
    assert job_notes.notice_line("h100-3", Fault(79, "m", T0), running) is None  # a fault that takes the node out
