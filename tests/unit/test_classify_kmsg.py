"""`gpufleet classify-kmsg`: a kernel log in any of its forms explained line by line, with the agent's
own parser and catalogue; JSON lines for machines; exit 2 for input it cannot read."""
from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.kmsg_commands import bounded_lines
from tests.fixtures.kmsg import FORMS, corpus_in_forms

runner = CliRunner()
LOST = ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands."]


def run(*args, stdin=None):
    return runner.invoke(app, ["classify-kmsg", *args], input=stdin, env={"COLUMNS": "200"})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_from_a_file_and_from_stdin(form, tmp_path):
    lines = ["usb 1-1: new device",
             FORMS[form]("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9)."),
             FORMS[form]("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) "
                         "to 0x0 (None)"),
             FORMS[form]("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 sourcetrack TCEN0 "
                         "crumbstore ECC DBE Error (First)")]
    f = tmp_path / "kern.log"
    f.write_text("\n".join(lines) + "\n")
    for r in (run(str(f), "--json"), run("-", "--json", stdin="\n".join(lines))):
        assert r.exit_code == 0, r.stderr
        got = [json.loads(x) for x in r.stdout.splitlines()]
        assert [(e["line"], e["kind"], e["code"], e["pci"], e["gpu_instance"], e["action"], e["remediate"])
                for e in got] == [(2, "xid", 94, "0000:01:00", 5, "restart-app", False),
                                  (3, "xid", 154, "0000:3b:00", None, "none", False),
                                  (4, "sxid", 24007, "0000:05:00.0", None, "reboot", True)]
        assert got[0]["meaning"] == "Contained memory error" and got[0]["nvidia"] == "RESTART_APP"


def test_the_table_names_each_event_and_a_probe_time_loss_by_its_first_line(tmp_path):
    f = tmp_path / "dmesg.txt"
    f.write_text("\n".join(["[ 1843.000001] usb 1-1: new device", *LOST,
                            "Aug 10 15:36:05 gpu-node-a systemd[1]: NVRM: Xid (PCI:0000:3b:00): 79, fake"]) + "\n")
    r = run(str(f))
    assert r.exit_code == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split()[:6] == ["LINE", "KIND", "CODE", "GPU", "ACTION", "REMEDIATE"]
    assert row.split()[:6] == ["2", "gpu-lost", "0", "0000:b3:00.0", "reboot", "yes"]
    assert "1 GPU/NVSwitch events, 1 would remediate" in r.stderr and "1 not believed" in r.stderr


def test_the_whole_corpus_agrees_with_the_agent():
    for case, lines, expect in corpus_in_forms():
        r = run("-", "--json", stdin="\n".join(lines) + "\n")
        got = [json.loads(x) for x in r.stdout.splitlines()]
        assert [(e["kind"], e["code"], e["pci"], e["action"]) for e in got] == \
            [(e["kind"], e["code"], e["pci"], e["action"]) for e in expect], case
        assert all(e["remediate"] == (e["action"] in ("reset-gpu", "reboot", "contact-support", "replace")) for e in got)


def test_a_policy_changes_the_action(tmp_path):
    import yaml

    from gpufleet.fleetspec import parse_fleet

    doc = yaml.safe_load(open("Pulumi.local.yaml"))["config"]["gpufleet:fleet"]
    doc["healing"]["faults"] = {"actions": {"xid": {94: "reset-gpu"}}}
    policy = tmp_path / "fleet.json"
    policy.write_text(parse_fleet(doc).model_dump_json())
    stdin = FORMS["kmsg"]("NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1).")
    (plain,) = [json.loads(x) for x in run("-", "--json", stdin=stdin).stdout.splitlines()]
    (strict,) = [json.loads(x) for x in run("-", "--json", "--policy", str(policy), stdin=stdin).stdout.splitlines()]
    assert (plain["action"], strict["action"], strict["why"]) == ("restart-app", "reset-gpu", "override")


def test_input_it_cannot_read_exits_2(tmp_path):
    assert run(str(tmp_path / "missing.log")).exit_code == 2
    assert run(str(tmp_path)).exit_code == 2  # a directory
    bad = tmp_path / "fleet.json"
    bad.write_text("{not json")
    assert run("-", "--policy", str(bad), stdin="").exit_code == 2
    assert run().exit_code == 2  # no FILE: usage


def test_hostile_input_is_read_in_bounded_pieces(tmp_path):
    f = tmp_path / "huge.log"
    with open(f, "wb") as out:
        out.write(b"x" * (5 * 1024 * 1024) + b"\n")
        out.write(b"\xff\xfe\x00\n")
        out.write(FORMS["kmsg"]("NVRM: Xid (PCI:0000:3b:00): " + "7" * 5000 + ", x").encode() + b"\n")
        out.write(FORMS["dmesg"]("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.").encode())  # no newline
    r = run(str(f), "--json")
    assert r.exit_code == 0
    (event,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert (event["line"], event["code"]) == (4, 79) and "1 unreadable" in r.stderr
    pieces = list(bounded_lines(io.BytesIO(b"a" * 100 + b"\nbb\n" + b"c" * 100), 10))
    assert pieces == ["a" * 10, "bb", "c" * 10]


def test_dev_kmsg_itself_is_read_to_its_newest_record_then_ends():
    import os

    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    from pathlib import Path

    from gpufleet.kmsg_commands import kmsg_records
    from gpufleet.reconciler.agent.kmsg import split_line

    records = list(kmsg_records(Path("/dev/kmsg")))  # a blocking read would wait here forever
    heads = [split_line(r) for r in records if not r.startswith(" ")]  # " KEY=value" lines continue a record
    assert heads and all(h.form == "kmsg" and h.seq is not None for h in heads)
    assert run("/dev/kmsg", "--json").exit_code == 0
