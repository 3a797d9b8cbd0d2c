"""The CLI: every command describes itself; the remediations table shows time per phase."""
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.commands import remediation_rows
from reconciler.model import Record
from reconciler.phases import Phase

runner = CliRunner()


@pytest.mark.parametrize("cmd,words", [
    (["reconcile"], ["self-healing", "--leader-elect", "--policy", "--dry-run"]),
    (["agent"], ["kernel log", "--node", "--kmsg"]),
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
