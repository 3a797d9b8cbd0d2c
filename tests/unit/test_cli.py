"""The CLI: every command describes itself; the remediations table shows time per phase."""
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.commands import remediation_rows
from reconciler.core.model import Record
from reconciler.core.phases import Phase

runner = CliRunner()


@pytest.mark.parametrize("cmd,words", [
    (["reconcile"], ["self-healing", "--leader-elect", "--policy", "--dry-run"]),
    (["agent"], ["kernel log", "--node", "--kmsg", "--policy"]),
    (["classify-kmsg"], ["FILE", "--json", "journalctl -k", "dmesg -T", "standard input", "Exit 0", "2"]),
    (["inject-fault"], ["NODE", "--xid"]),
    (["remediations"], ["--watch", "phase"]),
    (["validate"], ["--stack", "exit"]),
    (["local", "up"], ["idempotent"]),
    (["demo"], ["main job"]),
])
def test_help_describes_each_command(cmd, words):
    r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    for w in words:
        assert w.lower() in r.output.lower(), (w, r.output)


def test_remediation_rows_show_each_phase_duration():
    t0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    times = [("Detected", 0), ("SlurmDraining", 0.2), ("Checkpointing", 0.5), ("Requeued", 3.5), ("Evicting", 3.7),
             ("Replacing", 4.0), ("Resuming", 4.1), ("Succeeded", 5.6)]
    r = Record(name="n-xid79-1", node="h100-0", pool="h100", xid=79, message="", phase=Phase.SUCCEEDED, created=t0,
               phase_times=tuple((p, t0 + timedelta(seconds=s)) for p, s in times), replacement="h100-spare-0")
    (row,) = remediation_rows([r])
    assert row[:4] == ["h100-0", "79", "Succeeded", "h100-spare-0"]
    assert "Checkpointing 3.0s" in row[4] and "Resuming 1.5s" in row[4]
    assert row[5] == "5.6s" and row[6] == "Succeeded"


@pytest.mark.parametrize("cmd", [["pulumi", "-s", "prod", "up"], ["preview", "--stack", "prod"],
                                 ["pulumi", "-s", "staging", "preview"]])
def test_a_non_local_stack_without_a_backend_is_refused(cmd, monkeypatch, tmp_path):
    """Never the local file backend for prod: an `up` there would start from an empty state."""
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setattr("gpufleet.stack.pulumi_binary", lambda: "/bin/false")
    monkeypatch.setattr("os.execve", lambda *a: pytest.fail(f"pulumi was started: {a[1]}"))
    r = runner.invoke(app, cmd, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 2, r.output
    assert "PULUMI_BACKEND_URL" in r.output and "has no explicit state backend" in r.output


def test_the_local_stack_and_an_explicit_backend_are_allowed(monkeypatch, tmp_path):
    from gpufleet.stack import Stack

    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setenv("GPUFLEET_LOCAL_DIR", str(tmp_path))
    assert Stack("local").env()["PULUMI_BACKEND_URL"].startswith("file://")
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://bucket/gpufleet")
    assert Stack("prod").env()["PULUMI_BACKEND_URL"] == "s3://bucket/gpufleet"
    assert Stack("local").env()["PULUMI_BACKEND_URL"].startswith("file://")  # local stays local
