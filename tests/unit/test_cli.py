"""The CLI: every command describes itself; the remediations table shows time per phase."""
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.commands import remediation_rows
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase

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
    r = Remediation(name="n-xid79-1", node="h100-0", pool="h100", xid=79, message="", phase=Phase.SUCCEEDED, created=t0,
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


def _local_state(tmp_path):
    from gpufleet.local_cluster import LocalCluster

    state = LocalCluster(environment="local", kubeconfig=tmp_path / "kc", slurm_conf=tmp_path / "slurm.conf",
                         slurm_bin_dir=tmp_path / "bin", slurm_rest_url="http://127.0.0.1:1",
                         slurm_jwt_key=tmp_path / "jwt", pulumi_backend_url=f"file://{tmp_path / 'state'}",
                         pulumi_config_file=tmp_path / "Pulumi.local.yaml")
    state.write(tmp_path / "env.json")
    return state


def test_the_local_stack_runs_against_the_recorded_environment_and_an_explicit_backend_is_allowed(
        monkeypatch, tmp_path):
    from gpufleet.stack import NoBackendError, Stack

    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setenv("GPUFLEET_LOCAL_STATE", str(tmp_path / "env.json"))
    with pytest.raises(NoBackendError, match="gpufleet local up"):  # no environment recorded
        Stack("local").env()
    state = _local_state(tmp_path)
    assert Stack("local").env()["PULUMI_BACKEND_URL"] == state.pulumi_backend_url
    assert Stack("local").config_args(["up", "--yes"]) == ["--config-file", str(state.pulumi_config_file)]
    assert Stack("local").config_args(["stack", "ls"]) == []  # commands that read no stack config
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://bucket/gpufleet")
    assert Stack("prod").env()["PULUMI_BACKEND_URL"] == "s3://bucket/gpufleet"
    assert Stack("prod").config_args(["up"]) == []
    assert Stack("local").env()["PULUMI_BACKEND_URL"] == state.pulumi_backend_url  # local stays local


def test_an_unreadable_state_file_says_so(monkeypatch, tmp_path):
    from gpufleet import local_cluster

    (tmp_path / "env.json").write_text('{"kubeconfig": "/x"}')
    monkeypatch.setenv("GPUFLEET_LOCAL_STATE", str(tmp_path / "env.json"))
    with pytest.raises(local_cluster.LocalClusterError, match="gpufleet local up"):
        local_cluster.find()


def test_the_local_slurm_env_points_at_its_cluster(tmp_path):
    env = _local_state(tmp_path).slurm_env({"PATH": "/usr/bin", "SLURM_CONF": "/elsewhere", "HOME": "/h"})
    assert env == {"PATH": f"{tmp_path / 'bin'}:/usr/bin", "SLURM_CONF": str(tmp_path / "slurm.conf"), "HOME": "/h"}


@pytest.mark.parametrize("xid,need", [(94, "restart-app"), (43, "none")])
def test_demo_refuses_an_xid_that_leaves_the_node_in_service(xid, need, monkeypatch):
    """Issue 21: such a fault never takes a node out, so the demo would wait for a heal that cannot come;
    it says so before it starts anything."""
    import demos.demo

    monkeypatch.setattr(demos.demo, "bring_up", lambda *a, **k: pytest.fail("the demo started the environment"))
    r = runner.invoke(app, ["demo", "--xid", str(xid)], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 2, r.output
    assert f"--xid {xid}" in r.output and f"needs {need}" in r.output and "leaves the node in service" in r.output


def test_demo_injects_the_fault_as_the_agent_writes_it():
    """The demo's condition carries the action the spec's policy gives the XID, in the agent's format."""
    from demos.demo import demo_fault
    from gpufleet.fleetspec.faults import FaultAction
    from gpufleet.fleetspec.faults.condition import format_message, parse_header
    from gpufleet.console import load_spec

    fault = demo_fault(load_spec("local", None), 79)
    assert fault.action is FaultAction.REBOOT
    # the GPU by its index too, as the agent's nvidia-smi gives it: the stand-in's second GPU
    assert parse_header(format_message(fault, "x")) == {"action": "reboot", "pci": "0000:3b:00", "gpu": "1"}


@pytest.mark.parametrize("cmd", [["reconcile", "--stack", "prod", "--once"], ["why", "7", "--stack", "prod"]])
def test_no_command_signs_a_slurm_token_from_the_key_outside_local(cmd, tmp_path):
    """Issue 24 item 3: the JWT key signs a token for any Slurm user, root included; only the local environment's
    may be used to sign one. Refused before anything is contacted (exit 2, naming the flag)."""
    key = tmp_path / "jwt"
    key.write_bytes(b"k" * 32)
    r = runner.invoke(app, [*cmd, "--slurm-jwt-key-file", str(key)], env={"PULUMI_BACKEND_URL": "file:///nowhere"})
    assert r.exit_code == 2, r.output
    assert "--slurm-jwt-key-file: refused" in r.output


def test_inject_fault_names_no_gpu_it_was_not_given_and_says_the_meaning_once(monkeypatch):
    """The condition a drill writes: the XID's meaning once, no made-up PCI address (which the admin comment
    would tell the job's owner as 'GPU 0000:00:00'); --pci names one, checked."""
    import gpufleet.commands
    import gpufleet.reconciler.adapters.kube

    written = []

    class FakeKube:
        def __init__(self, api, manager=None):
            assert manager == "gpufleet-inject-fault"

        def set_condition(self, node, ctype, status, reason, message):
            written.append((node, reason, message))

    monkeypatch.setattr(gpufleet.commands, "_api", lambda *a: object())
    monkeypatch.setattr(gpufleet.reconciler.adapters.kube, "Kube", FakeKube)
    r = runner.invoke(app, ["inject-fault", "kwok-h100-1", "--xid", "79"])
    assert r.exit_code == 0, r.output
    (_, reason, message), = written
    assert reason == "Xid79" and "pci=" not in message
    assert message.count("GPU has fallen off the bus") == 1 and "injected by `gpufleet inject-fault`" in message
    r = runner.invoke(app, ["inject-fault", "kwok-h100-1", "--xid", "79", "--pci", "0000:3b:00"])
    assert r.exit_code == 0 and "pci=0000:3b:00" in written[-1][2]
    r = runner.invoke(app, ["inject-fault", "kwok-h100-1", "--pci", "0000:3b:00; rm -rf /"])
    assert r.exit_code == 2 and "--pci" in r.output


@pytest.mark.parametrize("keep", [False, True])
def test_the_demo_leaves_nothing_running_unless_kept_and_says_which(keep, capsys):
    """`make demo && make test`: the demo's environment holds the default ports the README test needs, so the
    demo takes it down unless --keep, which leaves it up and says how to stop it."""
    from pathlib import Path

    from localenv.commands import leave

    class Env:
        root, downs = Path("/tmp/x/.local"), 0

        def down(self):
            self.downs += 1

    env = Env()
    leave(env, keep)
    said = capsys.readouterr().out
    assert env.downs == (0 if keep else 1)
    assert ("gpufleet local down" in said) is keep and ("--keep" in said)
