"""`gpufleet why` on the login node: the record gpufleet keeps in a job's admin comment, read back through Slurm
alone, told in the engineer's words (pure, table-tested)."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.reconciler.core import engineer_story, job_notes, job_record
from gpufleet.reconciler.core.job_notes import JobSeen, appended, lines_for
from gpufleet.reconciler.core.job_story import JobFacts
from gpufleet.reconciler.core.model import Refill, RefillState, Remediation
from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import T0

S = timedelta(seconds=1)
MODEL = "NVIDIA H100 80GB HBM3"
MESSAGE = "[action=reboot pci=0000:9b:00 gpu=3] XID 79 (GPU has fallen off the bus): NVRM: Xid (PCI:0000:9b:00): 79"


def remediation(*phases: tuple[Phase, int], grace: int = 120, **kw) -> Remediation:
    """A remediation of the machine (Kubernetes node ip-10-0-3-17) behind Slurm node h100-a-w17, job 7."""
    r = Remediation("ip-10-0-3-17-xid79-1", "ip-10-0-3-17", "h100", 79, MESSAGE, Phase.DETECTED, T0,
                    phase_times=(("Detected", T0),), jobs=(7,), intents=("signal:TERM",), pci="0000:9b:00",
                    slurm_nodes=("h100-a-w17",), **kw)
    for phase, at in phases:
        extra = {"grace_deadline": T0 + (at + grace) * S} if phase is Phase.CHECKPOINTING else {}
        r = r.moved(phase, T0 + at * S, **extra)
    return r


IN_TIME = ((Phase.SLURM_DRAINING, 0), (Phase.CHECKPOINTING, 1), (Phase.REQUEUED, 43))
HEALED = IN_TIME + ((Phase.EVICTING, 43), (Phase.REPLACING, 44), (Phase.RESUMING, 70), (Phase.SUCCEEDED, 90))


def comment_of(r: Remediation, job: JobSeen) -> str:
    return appended("", 7, lines_for(r, job), (job_record.encode(job_record.record_of(r, MODEL)),)) or ""


def facts(state="RUNNING", nodes=("h100-a-w16", "h100-a-w17"), started=330, name="train-llm", **kw) -> JobFacts:
    return JobFacts(7, name, state, "alice", "ml", nodes, T0 - 900 * S,
                    T0 + started * S if started is not None else None, None, 1, **kw)


def told(r: Remediation, job: JobFacts, now=T0 + 400 * S) -> engineer_story.EngineerStory:
    seen = JobSeen(7, job.state, job.nodes, job.started)
    records = job_record.records_in(comment_of(r, seen), job_notes.SEPARATOR)
    return engineer_story.tell(7, job, records, now)


def test_a_healed_job_reads_in_the_engineers_words():
    s = told(remediation(*HEALED), facts())
    assert s.paragraph == (
        "Job 7 (train-llm): At 12:00:00 UTC, GPU 3 (NVIDIA H100 80GB HBM3) on h100-a-w17, one of its 2 nodes, "
        "failed: GPU has fallen off the bus (NVIDIA Xid 79). gpufleet asked the job to checkpoint (SIGTERM at "
        "12:00:01 UTC); it exited within 42 s, inside its 120 s grace, and was requeued. The machine behind "
        "h100-a-w17 was replaced; h100-a-w17 now runs on a healthy one. It runs again since 12:05:30 UTC on "
        "h100-a-w16, h100-a-w17; it was not running for 5 min 29 s. What to do: nothing: the job resumes from its "
        "last checkpoint, as it does after any requeue.")
    assert s.state == "running-again" and s.not_running_s == 329
    assert s.checkpoint is not None and s.checkpoint.in_time and s.checkpoint.exited_within_s == 42
    assert "ip-10-0-3-17" not in s.paragraph and "0000:9b:00" not in s.paragraph  # no machine or bus names
    assert s.paragraph.count("machine behind") == 1


def test_a_job_still_running_when_its_grace_ran_out_is_told_its_work_since_the_checkpoint_is_lost():
    killed = ((Phase.SLURM_DRAINING, 0), (Phase.CHECKPOINTING, 1), (Phase.REQUEUED, 121))
    s = told(remediation(*killed, *HEALED[3:]), facts())
    assert s.checkpoint is not None and not s.checkpoint.in_time
    assert "was still running when its 120 s grace ran out and was stopped and requeued: the work since its " \
           "last checkpoint is lost." in s.paragraph
    assert "make it checkpoint within 120 s of SIGTERM" in s.what_to_do


def test_a_job_waiting_for_a_spare_whose_refill_failed_is_told_so_never_that_all_is_well():
    failed = Refill("h100/refill/1", RefillState.FAILED, T0 + 50 * S, "InsufficientInstanceCapacity",
                    retry_at=T0 + 650 * S)
    r = remediation(*IN_TIME, (Phase.EVICTING, 43), (Phase.REPLACING, 44), (Phase.WAITING_FOR_SPARE, 45))
    r = replace(r, refill=failed)
    s = told(r, facts("PENDING", nodes=(), started=None, reason="BeginTime"), now=T0 + 600 * S)
    assert s.state == "waiting" and s.waiting_for == job_record.REFILL_FAILED
    assert ("It waits for hardware: the pool has no spare, and the order for a new machine failed at 12:00:50 UTC; "
            "it is asked again at 12:10:50 UTC. It starts once a machine joins.") in s.paragraph
    assert "It has not been running for 9 min 59 s so far." in s.paragraph
    assert "healthy one" not in s.paragraph and "healing" not in s.paragraph
    assert s.what_to_do == "nothing: the job starts by itself once it has healthy machines"
    # and its admin comment said it, dated, in a short line of its own
    text = comment_of(r, JobSeen(7, "PENDING"))
    assert "gpufleet 2026-11-29T12:00:50Z: no spare: ordering a new machine failed; asked again at " \
           "2026-11-29T12:10:50Z" in text


@pytest.mark.parametrize("phase_tail, refill, words", [
    (((Phase.WAITING_FOR_SPARE, 45),), None, "the pool has no spare free since 12:00:45 UTC"),
    (((Phase.WAITING_FOR_SPARE, 45),), Refill("k", RefillState.REQUESTED, T0 + 46 * S),
     "a new machine was ordered at 12:00:46 UTC; it has not joined yet"),
])
def test_waiting_says_what_for_and_since_when(phase_tail, refill, words):
    r = replace(remediation(*IN_TIME, (Phase.EVICTING, 43), (Phase.REPLACING, 44), *phase_tail), refill=refill)
    assert words in told(r, facts("PENDING", nodes=(), started=None)).paragraph


def test_a_held_replacement_says_a_person_decides():
    s = told(remediation(*IN_TIME, (Phase.HELD, 44)), facts("PENDING", nodes=(), started=None))
    assert "on hold since 12:00:44 UTC" in s.paragraph and "on-call" in s.what_to_do


def test_slurm_supplied_strings_are_printed_escaped():
    s = told(remediation(*HEALED), facts(name="x\n\x1b[31mAll is well\r"))
    assert "\n" not in s.paragraph and "\x1b" not in s.paragraph and "\r" not in s.paragraph
    assert "x\\x0a\\x1b[31mAll is well\\x0d" in s.paragraph
    rendered = engineer_story.render(s, ["a\nb"])
    assert "\x1b" not in rendered and "a\\x0ab" in rendered


def test_a_job_slurm_does_not_show_tells_nothing_of_gpufleet():
    s = engineer_story.tell(7, None, [], T0)
    assert s.state == "unknown" and "Slurm shows you no job 7" in s.paragraph and not s.records


def test_an_application_error_points_at_the_jobs_own_stderr_with_the_time_and_the_gpu():
    from gpufleet.fleetspec.faults import FaultAction
    from gpufleet.reconciler.core.model import Fault

    f = Fault(13, "[action=restart-app gpu=5] Graphics Engine Exception", T0, action=FaultAction.RESTART_APP)
    rec = job_record.notice_record("ip-10-0-3-17", ("h100-a-w17",), f, MODEL)
    s = engineer_story.tell(7, facts(started=-600), [rec], T0 + 60 * S)
    assert "GPU 5 (NVIDIA H100 80GB HBM3) on h100-a-w17 reported Graphics Engine Exception (NVIDIA Xid 13), most " \
           "often the application's own error" in s.paragraph
    assert s.what_to_do == "look at the job's stderr around 12:00:00 UTC for GPU 5 (NVIDIA H100 80GB HBM3) on h100-a-w17"


def test_the_json_carries_the_paragraph_and_every_fact():
    d = json.loads(json.dumps(told(remediation(*HEALED), facts()).to_json()))
    assert d["paragraph"].startswith("Job 7 (train-llm): ") and d["state"] == "running-again"
    assert d["checkpoint"] == {"signalled_at": "2026-11-29T12:00:01Z", "grace_seconds": 120,
                               "exited_within_seconds": 42.0, "in_time": True}
    assert d["not_running_seconds"] == 329
    rec = d["records"][0]
    assert (rec["gpu"], rec["model"], rec["slurm_node"], rec["state"]) == (3, MODEL, "h100-a-w17", "replaced")


def test_the_record_reads_back_as_written_and_a_garbled_one_is_ignored():
    rec = job_record.record_of(remediation(*HEALED), MODEL)
    assert job_record.decode(job_record.encode(rec)) == rec
    assert job_record.decode(job_record.encode(rec).replace("t=", "t=x")) is None
    assert job_record.decode("gpufleet-record v1 zz=1 r=a n=b t=0") is not None  # unknown keys: a newer writer
    assert job_record.records_in("a person's | gpufleet-record v1 r=a", " | ") == []  # no time: not a record


def test_every_admin_comment_segment_is_well_under_200_characters_and_the_fault_is_told_once():
    failed = Refill("h100/refill/1", RefillState.FAILED, T0 + 50 * S, "InsufficientInstanceCapacity",
                    retry_at=T0 + 650 * S)
    r = remediation(*IN_TIME, (Phase.EVICTING, 43), (Phase.REPLACING, 44), (Phase.WAITING_FOR_SPARE, 45),
                    (Phase.REPLACING, 700), (Phase.RESUMING, 710), (Phase.SUCCEEDED, 720))
    r = replace(r, refill=failed, name="ip-10-0-3-17.eu-west-1.compute.internal-xid79-1795953600")
    text = comment_of(r, JobSeen(7, "RUNNING", ("h100-a-w16", "h100-a-w17"), T0 + 730 * S))
    segments = text.split(job_notes.SEPARATOR)
    assert len(segments) == 7  # SIGTERM, requeued, waiting, no refill, running again, the record, the trailer
    assert all(len(x) < 200 for x in segments), [len(x) for x in segments]
    assert sum("Xid 79" in x for x in segments) == 1 and segments[-1] == "whole story: gpufleet why 7"
    assert "ip-10-0-3-17" not in text  # the engineer's names only: Slurm nodes, never the machine's


# --- the GPU by index: what the node agent writes into the condition ------------------------------------------

def test_the_agent_names_the_gpu_by_nvidia_smis_index():
    from datetime import datetime, timezone

    from gpufleet.fleetspec.faults import FaultAction, Kind
    from gpufleet.fleetspec.faults.classify import Classification
    from gpufleet.fleetspec.faults.driver import GpuEvent
    from gpufleet.reconciler.agent.sightings import Sighting, condition_message, gpu_indexes

    # `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader` on an H100 machine (its bus ids as in
    # tests/fixtures/gpu/nvidia-smi-q.h100x8.535.161.08.txt)
    gpus = gpu_indexes("0, 00000000:19:00.0\n1, 00000000:3B:00.0\n2, 00000000:4C:00.0\nnot a line\n")
    assert gpus == {"0000:19:00": 0, "0000:3b:00": 1, "0000:4c:00": 2}
    event = GpuEvent(Kind.XID, 79, "0000:3b:00", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    s = Sighting(event, 1, 1, datetime.now(timezone.utc), verdict=Classification(FaultAction.REBOOT, ""))
    message = condition_message(s, s.seen_at, gpus)
    assert message.startswith("[action=reboot pci=0000:3b:00 gpu=1] ")
    assert job_record.gpu_index(message) == 1
    assert "gpu=" not in condition_message(s, s.seen_at, {})  # no nvidia-smi: the PCI address alone
    assert job_record.gpu_index("[action=reboot gpu=x1] m") is None


def test_the_demo_fault_is_on_the_gpu_the_standins_nvidia_smi_lists_second():
    from demos.demo import DEMO_PCI, standin_gpu_index

    assert (DEMO_PCI, standin_gpu_index(DEMO_PCI)) == ("0000:3b:00", 1)


def test_a_job_asked_to_checkpoint_is_told_so_not_that_it_waits_in_the_queue():
    r = remediation((Phase.SLURM_DRAINING, 0), (Phase.CHECKPOINTING, 1))
    s = told(r, facts(started=-600), now=T0 + 30 * S)
    assert s.state == "checkpointing" and s.not_running_s is None
    assert ("The job was asked to checkpoint (SIGTERM at 12:00:01 UTC); gpufleet requeues it once it exits, at the "
            "latest when its grace ends at 12:02:01 UTC, and it runs again on healthy machines.") in s.paragraph
    assert "Slurm's queue" not in s.paragraph and "not been running" not in s.paragraph
    assert s.what_to_do == engineer_story.NOTHING_TO_DO


def test_a_job_that_ran_again_and_completed_is_told_so_not_that_it_did_not_run_again():
    done = replace(facts("COMPLETED", exit_code="SUCCESS 0"), ended=T0 + 400 * S)
    s = told(remediation(*HEALED), done, now=T0 + 500 * S)
    assert ("It ran again from 12:05:30 UTC on h100-a-w16, h100-a-w17 (it was not running for 5 min 29 s) and "
            "ended COMPLETED, SUCCESS 0.") in s.paragraph
    assert s.state == "ended" and s.not_running_s == 329 and s.what_to_do == engineer_story.NOTHING_TO_DO
    assert "did not run again" not in s.paragraph
