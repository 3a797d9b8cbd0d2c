"""The on-call commands' own logic: which remediation a request is about, and how its outcome is read back;
the commands against a real API server and reconciler are in tests/integration/test_reconciler_kube.py."""
from __future__ import annotations

from datetime import timedelta

from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.oncall_commands import newest, outcome
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import T0


def rec(name: str, node: str, minutes: int, **kw) -> Remediation:
    return Remediation(name, node, "h100", 79, "m", Phase.HELD, T0 + timedelta(minutes=minutes), **kw)


def test_a_request_is_about_the_nodes_newest_remediation():
    records = [rec("a-1", "a", 0), rec("a-2", "a", 5), rec("b-1", "b", 9)]
    assert newest(records, "a").name == "a-2" and newest(records, "c") is None


def test_the_outcome_is_the_note_the_reconciler_appended_once_the_request_is_done():
    asked = "release@2026-11-29T12:00:00+00:00"
    assert outcome(rec("a-1", "a", 0, reason="held"), asked) is None
    done = rec("a-1", "a", 0, reason="held; release by oncall: admitted", requests_done=(asked,))
    assert outcome(done, asked) == "release by oncall: admitted"


def test_every_on_call_command_has_help_and_the_hold_names_the_label():
    for cmd in ("release", "return", "retire", "hold", "unhold"):
        r = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0 and "NODE" in r.output.upper(), r.output
    assert "opt-out label" in CliRunner().invoke(app, ["hold", "--help"], env={"COLUMNS": "200"}).output
