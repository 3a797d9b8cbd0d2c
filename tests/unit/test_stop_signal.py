"""SIGTERM ends the local environment's host processes even when it comes while their main thread holds the stop
Event's lock (inside Event.wait() between passes, or inside the first SIGTERM's Event.set() when the supervisor's
second SIGTERM comes): a handler that called Event.set() deadlocked the main thread on that lock, and `gpufleet
local down` had to SIGKILL the stand-in 10 s later. Each case runs in a process of its own, as the stand-ins do."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpufleet.paths import PROJECT_DIR

# Replaces a stand-in's loop: the SIGTERM comes while the main thread holds the Event's lock, and the handler runs
# there (the loop's backward jump is a bytecode boundary where Python runs pending handlers).
SIGTERM_UNDER_THE_LOCK = """
import os, signal

def run(self, stop, interval=1.0):
    with stop._cond:  # what Event.wait() and Event.set() hold
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    print("stop set" if stop.wait(10) else "stop not set", flush=True)
"""


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=15, cwd=PROJECT_DIR, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"still running 15 s after its SIGTERM (deadlocked in its signal handler?): {e.stderr!r}")


def _kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for an API server that is not there: the stand-in's passes fail and are logged, as in any
    pass that meets an API server going down."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "x"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return path


def test_set_on_signals_sets_the_event_when_sigterm_comes_under_its_lock(tmp_path) -> None:
    r = _run(SIGTERM_UNDER_THE_LOCK + """
import threading
from gpufleet.stop_signal import set_on_signals

stop = threading.Event()
received = set_on_signals(stop)
run(None, stop)
print("signals noted:", len(received))
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["stop set", "signals noted: 1"]


def test_the_slinky_standin_stops_on_a_sigterm_under_its_stop_events_lock(tmp_path) -> None:
    from localenv.slinky_standin import StandInConfig

    config = tmp_path / "standin.json"
    StandInConfig(kubeconfig=str(_kubeconfig(tmp_path)), namespace="x", nodesets=[],
                  slurm={"workdir": str(tmp_path / "slurm"), "partitions": {"gpu": ["a"]}, "root": "/",
                         "extra_conf": []}).write(config)
    r = _run(SIGTERM_UNDER_THE_LOCK + f"""
from localenv import slinky_standin

slinky_standin.SlinkyStandIn.run = run
raise SystemExit(slinky_standin.main(["--config", {str(config)!r}]))
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["stop set"]
    assert "stopped" in r.stderr and "after SIGTERM" in r.stderr  # its log line on how long the stop took


def test_the_autoscaler_standin_stops_on_a_sigterm_under_its_stop_events_lock(tmp_path) -> None:
    from localenv.autoscaler_standin import AutoscalerConfig

    config = tmp_path / "autoscaler.json"
    AutoscalerConfig(kubeconfig=str(_kubeconfig(tmp_path))).write(config)
    r = _run(SIGTERM_UNDER_THE_LOCK + f"""
from localenv import autoscaler_standin

autoscaler_standin.AutoscalerStandIn.run = run
raise SystemExit(autoscaler_standin.main(["--config", {str(config)!r}]))
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["stop set"]
