"""LocalSlurm's cancel (the Slinky stand-in's stop): once set, no Slurm command runs, a command's result that
comes after it is dropped, and a wait for a daemon ends; the stand-in's loop then returns."""
from __future__ import annotations

import subprocess
import threading

import pytest
from kubernetes import client

from localenv.slinky_standin import SlinkyStandIn
from localenv.slurm import Cancelled, LocalSlurm


@pytest.fixture
def cancel() -> threading.Event:
    return threading.Event()


@pytest.fixture
def slurm(tmp_path, cancel) -> LocalSlurm:
    return LocalSlurm(tmp_path / "slurm", {"gpu": ["a"]}, root="/", cancel=cancel)


def test_no_command_runs_once_cancelled(slurm, cancel, monkeypatch) -> None:
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **_: ran.append(argv))
    cancel.set()
    with pytest.raises(Cancelled):
        slurm.run(["scontrol", "ping"])
    assert ran == []


def test_a_result_that_comes_after_the_cancel_is_dropped(slurm, cancel, monkeypatch) -> None:
    def killed_by_the_stop(argv, **_):  # the stop's SIGTERM reached the command's process group too
        cancel.set()
        return subprocess.CompletedProcess(argv, -15, "", "")
    monkeypatch.setattr(subprocess, "run", killed_by_the_stop)
    with pytest.raises(Cancelled):
        slurm.node_info()  # not a LocalSlurmError a pass would log and retry


def test_a_wait_for_a_daemon_ends_once_cancelled(slurm, cancel) -> None:
    health = slurm._proc(slurm._daemon("slurmctld")).health
    cancel.set()
    with pytest.raises(Cancelled):  # through the supervisor's `except Exception` around a health check
        health()


def test_the_standin_loop_returns_when_its_pass_is_cancelled(slurm, cancel) -> None:
    standin = SlinkyStandIn(client.ApiClient(), slurm, [], namespace="x")
    passes = []

    def one_pass() -> None:
        passes.append(1)
        cancel.set()  # SIGTERM during the pass
        slurm.run(["scontrol", "show", "nodes"])
    standin.reconcile_once = one_pass
    standin.run(cancel, interval=0)
    assert passes == [1]
