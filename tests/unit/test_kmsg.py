"""The kernel-log parser and NVIDIA's rules, table-tested on real-format lines (tests/fixtures/
kernel_lines.yaml, each with its public source) in every log form, and on hostile lines: never a
crash, never a fault."""
from __future__ import annotations

import pytest

from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.faults.classify import Classifier
from gpufleet.fleetspec.faults.driver import GpuEvent, Unreadable, Untrusted
from gpufleet.reconciler.agent.kmsg import KernelLogParser, parse_line, split_line
from tests.fixtures.kmsg import FORMS, corpus, corpus_in_forms

CASES = corpus_in_forms()


def decide(lines: list[str], policy: FaultPolicy | None = None) -> list[dict]:
    parser, classifier = KernelLogParser(), Classifier(policy)
    out = []
    for line in lines:
        for item in parser.feed(line):
            if isinstance(item, GpuEvent):
                got = {"kind": item.kind.value, "code": item.code, "pci": item.pci,
                       "action": classifier.classify(item).action.value}
                if item.gpu_instance is not None:
                    got["gpu_instance"] = item.gpu_instance
                if item.compute_instance is not None:
                    got["compute_instance"] = item.compute_instance
                out.append(got)
    return out


@pytest.mark.parametrize("case,lines,expect", CASES, ids=[c[0] for c in CASES])
def test_every_corpus_line_in_every_form_is_decided_as_nvidia_says(case, lines, expect):
    assert decide(lines) == expect


def test_the_corpus_covers_every_action_kind_and_driver_era():
    entries = corpus()
    assert all(e["source"] and e["expect"] is not None for e in entries)
    expected = [x for e in entries for x in e["expect"]]
    # every action NVIDIA's catalogue and rules give (`replace` only a spec's override gives)
    assert {x["action"] for x in expected} == {a.value for a in FaultAction} - {"replace"}
    # dcgm: telemetry, node-lost: the Ready condition (core/node_lost.py), slurm-drain: Slurm's own drains
    # (core/slurm_drains.py); none has a log line
    assert {x["kind"] for x in expected} == {k.value for k in Kind} - {Kind.DCGM.value, Kind.NODE_LOST.value,
                                                                      Kind.SLURM_DRAIN.value}
    text = " ".join(e.get("message", "") + " ".join(e.get("lines", [])) for e in entries)
    for era in ("Xid (0000:", "pid='<unknown>', name=<unknown>", "pid=1234, name=python3", "): 79, GPU has",
                "caused by previous Xid", "GPU-I:05", "GPU-CI:00", " Fatal XC0 ", " Nonfatal XC0 ", "SXid (PCI:",
                "\\x0a"):
        assert era in text, era


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_yields_the_record_number_or_the_time(form):
    rec = split_line(FORMS[form]("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
    assert rec.kernel and rec.message.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert rec.seq == (4242 if form.startswith("kmsg") else None)
    assert rec.time is not None


def test_a_mig_line_splits_its_instances_from_the_pci_address():
    (ev,) = parse_line(FORMS["kmsg"]("NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 94, pid=7194, Contained: SM"))
    assert (ev.pci, ev.gpu_instance, ev.compute_instance, ev.text) == ("0000:01:00", 5, 2, "Contained: SM")
    assert ev.gpu == "0000:01:00/5"


def test_pid_and_name_are_dropped_from_the_driver_text_in_every_era():
    for rest in ("pid=1234, name=python3, Ch 00000008", "pid='<unknown>', name=<unknown>, Ch 00000008",
                 "pid=1234, Ch 00000008", "Ch 00000008"):
        (ev,) = parse_line(FORMS["dmesg"](f"NVRM: Xid (PCI:0000:00:05): 43, {rest}"))
        assert ev.text == "Ch 00000008", rest


# --- hostile lines: counted, never raised, never a fault ---------------------------------------------

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
HOSTILE = {
    "a user-space /dev/kmsg record (facility user)": f"12,501,501000,-;{XID79}",
    "a daemon's /dev/kmsg record (facility daemon)": f"30,502,502000,-;{XID79}",
    "a systemd journal line": f"Aug 10 15:36:05 gpu-node-a systemd[1]: {XID79}",
    "logger -t kern (not the kernel tag)": f"Aug 10 15:36:05 gpu-node-a kern: {XID79}",
    "a USB product string": f"6,503,503000,-;usb 1-1: Product: {XID79}",
    "a kernel line quoting the driver": f"[ 12.000001] audit: type=1400 msg='{XID79}'",
    "no log prefix at all": XID79,
    "an indented line with no record before it": f"               {XID79}",
    "a 5,000-digit XID": FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00): " + "7" * 5000 + ", GPU has fallen off the bus."),
    "Arabic-Indic digits": FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00): ٧٩, GPU has fallen off the bus."),
    "fullwidth digits": FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00): ７９, GPU has fallen off the bus."),
    "Unicode digits in the PCI address": FORMS["kmsg"]("NVRM: Xid (PCI:٠٠٠٠:3b:00): 79, x"),
    "an unclosed GPU": FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00" + "A" * 10_000),
    "a word for a code": FORMS["dmesg"]("NVRM: Xid (PCI:0000:3b:00): seventy-nine"),
    "a negative code": FORMS["dmesg"]("NVRM: Xid (PCI:0000:3b:00): -79, x"),
    "a huge kmsg header": "9" * 5000 + ",1,1,-;" + XID79,
    "NUL bytes and invalid text": "\x00\ufffd\ufffd;NVRM: Xid (\x00): 79,",
    "a huge SXid": FORMS["dmesg"]("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): " + "9" * 5000 + ", Fatal, x"),
    "a probe-time loss without its end": FORMS["dmesg"]("NVRM: The NVIDIA GPU 0000:b3:00.0"),
    "a 1 MB line": FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 1_000_000),
}


@pytest.mark.parametrize("why", sorted(HOSTILE))
def test_hostile_lines_never_fault_and_never_raise(why):
    parser, classifier = KernelLogParser(), Classifier()
    for item in parser.feed(HOSTILE[why]):
        if isinstance(item, GpuEvent):  # a 1 MB kernel line is still the kernel's: it is read, cut to its head
            assert why == "a 1 MB line" and len(item.text) <= 512
            assert classifier.classify(item).action is FaultAction.REBOOT
        else:
            assert isinstance(item, (Unreadable, Untrusted)) and len(item.line) <= 200


def test_what_the_kernel_did_not_write_is_counted_as_untrusted_and_bad_driver_lines_as_unreadable():
    kinds = {why: {type(i).__name__ for i in parse_line(line)} for why, line in HOSTILE.items()}
    for why in ("a user-space /dev/kmsg record (facility user)", "a systemd journal line", "a USB product string",
                "no log prefix at all"):
        assert kinds[why] == {"Untrusted"}, why
    for why in ("a 5,000-digit XID", "Arabic-Indic digits", "fullwidth digits", "an unclosed GPU", "a word for a code",
                "a huge SXid"):
        assert kinds[why] == {"Unreadable"}, why


def test_a_probe_time_loss_needs_its_last_line_within_three():
    p = KernelLogParser()
    assert p.feed(FORMS["dmesg"]("NVRM: The NVIDIA GPU 0000:b3:00.0")) == []
    assert p.feed("[ 1843.308146] usb 1-1: new device") == []  # another record in between: not a loss
    assert p.feed("               NVRM: fallen off the bus and is not responding to commands.") == []
    # older kernels log the three lines as three records: read as one
    lines = [FORMS["journalctl-k"](m) for m in ("NVRM: The NVIDIA GPU 0000:b3:00.0",
                                                 "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                                                 "NVRM: fallen off the bus and is not responding to commands.")]
    assert [(e.kind, e.pci) for line in lines for e in p.feed(line)] == [(Kind.GPU_LOST, "0000:b3:00.0")]
    # rsyslog's #012 for the newlines of one record
    joined = "#012".join(["NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                          "NVRM: fallen off the bus and is not responding to commands."])
    assert [e.kind for e in parse_line(FORMS["syslog-klogd"](joined))] == [Kind.GPU_LOST]


def test_the_parser_takes_linear_time_on_lines_built_to_backtrack():
    import time

    started = time.process_time()
    for n in (1_000, 10_000, 100_000):
        for line in (FORMS["kmsg"]("NVRM: Xid (" + "0000:" * n), "[" + " " * n, "0," * n,
                     FORMS["dmesg"]("NVRM: Xid (PCI:0000:3b:00): 79, NETIR " + "Fatal " * n),
                     "Aug 10 15:36:05 " + "a" * n + " kernel: " + XID79):
            parse_line(line)
    assert time.process_time() - started < 5  # bounded by MAX_LINE: never seconds per line


@pytest.mark.parametrize("line", [
    "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",  # no host name
    "Mär 18 19:02:39 gpu-node-a kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",  # de_DE
    "déc. 06 10:00:01 gpu-node-a kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",  # fr_FR
])
def test_syslog_lines_without_a_host_or_with_a_localized_month_are_the_kernels(line):
    rec = split_line(line)
    assert rec.form == "syslog" and rec.kernel
    assert [(e.kind, e.code, e.pci) for e in parse_line(line)] == [(Kind.XID, 79, "0000:3b:00")]
    assert (rec.time is not None) == line.startswith("May")  # an English month gives the time; others do not


@pytest.mark.parametrize("line", [
    "May 18 19:02:39 evil: kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "Mär 18 19:02:39 gpu-node-a python3: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
])
def test_a_syslog_tag_other_than_kernel_is_still_not_believed(line):
    assert {type(i).__name__ for i in parse_line(line)} == {"Untrusted"}
