"""The agent's pure parts: the pending queue, the cursor, and whether a sighting is reported."""
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import parse_condition
from gpufleet.fleetspec.faults.classify import Classification
from gpufleet.fleetspec.faults.driver import GpuEvent
from gpufleet.reconciler.agent.kmsg import record_seq
from gpufleet.reconciler.agent.sightings import (Cursor, Pending, Sighting, Verdict, advance, condition_message, resume_from,
                                        verdict)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
XID79 = GpuEvent(Kind.XID, 79, "0000:3b:00", "GPU has fallen off the bus.")
XID48 = GpuEvent(Kind.XID, 48, "0000:3b:00", "DBE (double bit error) ECC error detected.")


def XidEvent(code, pci, text):  # noqa: N802 - the tests' shorthand
    return GpuEvent(Kind.XID, code, pci, text)


def seen(ev=XID79, seq=None, count=1, at=T0, action=FaultAction.REBOOT):
    return Sighting(ev, seq, seq, at, count, Classification(action, "RESTART_BM"))


@pytest.mark.parametrize("line,seq", [
    ("4,103,1003,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.", 103),
    ("6,2041,5678901234,-,caller=T1;NVRM: Xid (PCI:0000:18:00): 94, Contained", 2041),
    ("[ 1843.451234] NVRM: Xid (PCI:0000:b7:00): 48, DBE", None),
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", None),
    (" SUBSYSTEM=pci", None),
])
def test_record_numbers_come_from_the_kmsg_header_only(line, seq):
    assert record_seq(line) == seq


def test_cursor_round_trips_and_rejects_garbage():
    c = Cursor("0b5c3e2a-1f9e-4c1a-9d0e-6a1c2b3d4e5f", 2041)
    assert Cursor.parse(str(c)) == c
    for bad in (None, "", "2041", "boot:", "boot:x", ":12"):
        assert Cursor.parse(bad) is None


@pytest.mark.parametrize("saved,condition_set,expected", [
    (Cursor("b1", 50), True, 50),    # this boot: right after what was reported
    (Cursor("b1", 50), False, 50),
    (Cursor("b0", 900), True, -1),   # an earlier boot: all of this boot is news
    (None, False, -1),               # never reported on, never faulted: all of it is news
    (None, True, 120),               # reported on before the cursor existed: from the end of the log
])
def test_resume_from(saved, condition_set, expected):
    assert resume_from(saved, "b1", log_end=120, condition_set=condition_set) == Cursor("b1", expected)


def test_pending_merges_repeats_of_one_gpu_and_keeps_the_oldest_first():
    p = Pending(limit=4)
    assert p.add(seen(XID79, 10)) and p.add(seen(XID48, 11)) and p.add(seen(XID79, 12))
    assert len(p) == 2
    first = p.oldest()
    assert (first.event.code, first.first_seq, first.last_seq, first.count) == (79, 10, 12, 2)
    assert p.floor() == 10


def test_pending_is_bounded_and_counts_what_it_refused():
    p = Pending(limit=2)
    assert p.add(seen(XidEvent(79, "PCI:a", ""), 1)) and p.add(seen(XidEvent(79, "PCI:b", ""), 2))
    assert not p.add(seen(XidEvent(79, "PCI:c", ""), 3))
    assert p.add(seen(XidEvent(79, "PCI:a", ""), 4))  # a repeat still merges
    assert (len(p), p.refused) == (2, 1)


def test_done_keeps_a_repeat_that_arrived_while_reporting():
    p = Pending()
    p.add(seen(XID79, 10))
    taken = p.oldest()
    p.add(seen(XID48, 11))
    p.add(seen(XID79, 12))  # arrives while `taken` is being reported
    p.done(taken)
    rest = p.oldest()
    assert (rest.event.code, rest.first_seq, rest.last_seq, rest.count) == (79, 11, 12, 1)
    p.done(rest)
    assert p.oldest().event.code == 48
    p.done(p.oldest())
    assert len(p) == 0 and p.floor() is None


def test_the_cursor_never_passes_a_sighting_still_queued():
    c = Cursor("b", 5)
    assert advance(c, handled=12, floor=None) == Cursor("b", 12)
    assert advance(c, handled=12, floor=11) == Cursor("b", 10)
    assert advance(c, handled=None, floor=None) == c
    assert advance(c, handled=3, floor=None) == c  # never backwards


@pytest.mark.parametrize("seq,condition,expected", [
    (None, None, Verdict.REPORT),
    (51, None, Verdict.REPORT),
    (50, None, Verdict.REPORTED_BEFORE),
    (40, {"status": "True", "reason": "HealthCheckPassed"}, Verdict.REPORTED_BEFORE),  # repaired since: never again
    (51, {"status": "True", "reason": "HealthCheckPassed"}, Verdict.REPORT),           # a new fault after the repair
    (51, {"status": "False", "reason": "Xid79"}, Verdict.ALREADY_SET),
    (51, {"status": "False", "reason": "Xid48"}, Verdict.REPORT),
])
def test_verdict(seq, condition, expected):
    assert verdict(seen(XID79, seq), Cursor("b", 50), condition) is expected


def test_message_says_how_often_and_when_it_was_seen_if_reported_late():
    now = condition_message(seen(), T0 + timedelta(seconds=1))
    head = "[action=reboot pci=0000:3b:00] XID 79 (GPU has fallen off the bus): "
    assert now == f"{head}{XID79.message} [NVIDIA: RESTART_BM]"
    late = condition_message(seen(count=40), T0 + timedelta(minutes=3))
    assert "seen 40 times" in late and "seen at 2026-12-01T09:00:00Z" in late


def test_the_message_is_what_the_reconciler_reads_back():
    mig = GpuEvent(Kind.XID, 94, "0000:01:00", "Contained: CE User Channel (0x9).", gpu_instance=5, compute_instance=1)
    s = seen(mig, action=FaultAction.RESET_GPU)
    sig = parse_condition(s.reason, condition_message(s, T0))
    assert (sig.kind, sig.code, sig.action, sig.pci, sig.gpu_instance, sig.compute_instance) == \
        (Kind.XID, 94, FaultAction.RESET_GPU, "0000:01:00", 5, 1)


def test_a_restart_app_sighting_is_a_notice_and_is_reported_even_over_a_fault_condition():
    s = seen(XID79, 51, action=FaultAction.RESTART_APP)
    assert s.notice and not seen(XID79, 51).notice
    assert verdict(s, Cursor("b", 50), {"status": "False", "reason": "Xid79"}) is Verdict.REPORT
    assert verdict(s, Cursor("b", 51), None) is Verdict.REPORTED_BEFORE
