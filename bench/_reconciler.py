"""The reconciler a benchmark measures: `gpufleet reconcile` as the local environment runs it on the host
(localenv/host_reconciler.py, under its supervisor), optionally profiled (py-spy) or counting its calls
(_count_calls.py); its metrics, its log and its Lease."""
from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Sequence

import psutil

from _repo import PYTHON

from gpufleet.waiting import wait_for
from localenv.host_reconciler import reconciler_proc
from localenv.supervisor import Supervisor


class HostReconciler:
    """Started at once; `stop()` stops it (SIGTERM, then SIGKILL). Its log is `log` (the supervisor's
    `<dir>/<name>.log`), its pid file beside it."""

    def __init__(self, kubeconfig: Path, policy: Path, log: Path, *, slurm: str = "none",
                 metrics_port: int = 0, env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
                 profile: Path | None = None, count_calls: Path | None = None):
        self.log, self.metrics_port, self.profile, self.count_calls = log, metrics_port, profile, count_calls
        self.name = log.stem
        self.supervisor = Supervisor(log.parent, log.parent, start_timeout=30.0, stop_timeout=15.0, prefix="[bench]")
        # py-spy starts the reconciler as its child (attaching to a running process needs ptrace rights this
        # machine does not grant); SIGINT makes it write the profile.
        wrapper = [py_spy(), "record", "--rate", "50", "--format", "raw", "--threads", "--output", str(profile),
                   "--"] if profile is not None else []
        launcher = [str(Path(__file__).with_name("_count_calls.py")), str(count_calls)] if count_calls else ["-m", "gpufleet"]
        self.supervisor.ensure([reconciler_proc(
            self.name, kubeconfig, policy, log.parent / "env.json", slurm=slurm, metrics_port=metrics_port,
            env=env, extra_args=extra_args, launcher=launcher, wrapper=wrapper)])

    @property
    def pid(self) -> int:
        """The reconciler's own pid (under py-spy: py-spy's child)."""
        top = self.supervisor.pid(self.name)
        if top is None:
            raise RuntimeError(f"the reconciler is not running; see {self.log}")
        if self.profile is None:
            return top
        return wait_for("py-spy to start the reconciler", lambda: next(
            (c.pid for c in psutil.Process(top).children()), None), 10, interval=0.05)

    def alive(self) -> bool:
        return self.supervisor.pid(self.name) is not None

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the reconciler exited; see {self.log}:\n{self.supervisor.tail(self.name, 15)}")

    def calls(self) -> dict[str, float]:
        """The reconciler's API and Slurm calls so far, by verb and resource (with `count_calls`)."""
        try:
            return json.loads(self.count_calls.read_text()) if self.count_calls else {}
        except (OSError, ValueError):
            return {}

    def metric(self, name: str, labels_: dict[str, str] | None = None) -> float | None:
        """One sample from /metrics (loopback), or None."""
        from prometheus_client.parser import text_string_to_metric_families

        if not self.metrics_port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:  # noqa: S310
                text = r.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and (labels_ is None or all(s.labels.get(k) == v for k, v in labels_.items())):
                    return s.value
        return None

    def stop(self, timeout: float = 15) -> None:
        if self.profile is not None and self.alive():
            top = psutil.Process(self.supervisor.pid(self.name))
            try:
                os.kill(self.pid, signal.SIGTERM)  # the reconciler stops; py-spy then writes the profile and exits
                top.wait(timeout)
            except (OSError, RuntimeError, psutil.Error):
                top.send_signal(signal.SIGINT)
        self.supervisor.stop([self.name], timeout)


def py_spy() -> str:
    """py-spy (a PyPI package) next to this Python, for `--profile`."""
    exe = Path(PYTHON).parent / "py-spy"
    if not exe.exists():
        raise SystemExit(f"--profile needs py-spy: {Path(PYTHON).parent / 'pip'} install py-spy")
    return str(exe)


def wait_leading(log: Path, timeout: float = 60, since: int = 0) -> None:
    """Wait for the reconciler's "leading" log line (written after byte offset `since`)."""
    def leading() -> bool:
        try:
            with open(log, "rb") as f:
                f.seek(since)
                return b'"leading (lease' in f.read()
        except OSError:
            return False
    wait_for(f"the reconciler to lead (log {log})", leading, timeout, interval=0.2)


def json_lines(path: Path) -> list[dict]:
    """The JSON objects of a log or events file, a line each; other lines (a line being written, a
    supervisor's note) are skipped: the reader the previews use for the engine's event log."""
    from gpufleet.preview import parse_events

    return parse_events(path.read_text(errors="replace"))
