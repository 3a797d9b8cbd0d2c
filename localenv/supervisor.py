"""One supervisor for the local environment's background processes (etcd, the control plane, kwok,
containerd, the kubelet): start detached with a pid file and a log, check health, stop the whole
process tree (SIGTERM, then SIGKILL), tail logs.

A process is "ours" when the pid file's pid is alive with the recorded start time (psutil's
create_time), so a reused pid is never signalled. A process that is still shutting down when
:meth:`Supervisor.ensure` runs (a stop from elsewhere, a crash) is waited for until its whole tree
is gone, and then started again, instead of being reported as "exited during start-up".
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from localenv.ports import port_free

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


class SupervisorError(RuntimeError):
    """A process failed to start, did not become healthy, or could not be stopped."""


@dataclass
class Proc:
    """What to run and how to tell that it works."""

    name: str
    argv: Callable[[], list[str]] | Sequence[str]
    health: Callable[[], bool]
    url: str = ""                       # where health is checked (for messages)
    ports: tuple[int, ...] = ()         # must be free on 127.0.0.1 before a start
    env: dict[str, str] | None = None   # None: inherit
    cwd: Path | None = None
    before_start: Callable[[], None] | None = None
    # Orphans of the process (e.g. containerd's shims, which daemonise) are re-parented to it, so that
    # stopping it stops them and the containers under them.
    subreaper: bool = False

    def command(self) -> list[str]:
        return list(self.argv() if callable(self.argv) else self.argv)


@dataclass
class Supervisor:
    """Pid files in ``run_dir`` (``<name>.pid``, JSON), logs in ``log_dir`` (``<name>.log``)."""

    run_dir: Path
    log_dir: Path
    start_timeout: float = 90.0
    stop_timeout: float = 15.0
    progress: Callable[[str], None] | None = None
    prefix: str = "[local]"
    _children: dict[str, subprocess.Popen] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir, self.log_dir = Path(self.run_dir), Path(self.log_dir)

    # ------------------------------------------------------------------ paths, state
    def pid_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def process(self, name: str) -> psutil.Process | None:
        """The running process of ``name`` that this supervisor started, else None (stale pid files go)."""
        try:
            rec = json.loads(self.pid_path(name).read_text())
            pid, created = int(rec["pid"]), float(rec["create_time"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) > 0.05 or p.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(pid)
        except psutil.NoSuchProcess:
            self._reap(name)
            self.pid_path(name).unlink(missing_ok=True)
            return None
        return p

    def pid(self, name: str) -> int | None:
        p = self.process(name)
        return p.pid if p else None

    def status(self, proc: Proc) -> dict:
        pid = self.pid(proc.name)
        return {"pid": pid, "running": pid is not None, "healthy": pid is not None and _safe(proc.health),
                "port": proc.ports[0] if proc.ports else None, "url": proc.url, "log": str(self.log_path(proc.name))}

    def tail(self, name: str, lines: int = 25) -> str:
        return tail(self.log_path(name), lines)

    # ------------------------------------------------------------------ start
    def start(self, proc: Proc) -> psutil.Process:
        """Start ``proc`` detached (its own session), appending to its log; write its pid file."""
        for port in proc.ports:
            if not port_free(port):
                raise SupervisorError(
                    f"{proc.name}: port {port} on 127.0.0.1 is in use by a process that this environment "
                    f"({self.run_dir.parent}) did not start; stop it or choose other ports")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = proc.command()
        with open(self.log_path(proc.name), "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            out.flush()
            child = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=proc.cwd,
                env=proc.env, start_new_session=True, close_fds=True,
                preexec_fn=_become_subreaper if proc.subreaper else None)
        self._children[proc.name] = child
        p = psutil.Process(child.pid)
        tmp = self.pid_path(proc.name).with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": p.pid, "create_time": p.create_time(), "argv": argv}))
        os.replace(tmp, self.pid_path(proc.name))
        return p

    def ensure(self, procs: Iterable[Proc]) -> None:
        """Reuse healthy processes, start missing ones, and wait until all are healthy.

        A process found running but unhealthy is waited for; if it exits meanwhile (it was shutting
        down), its whole tree is waited for and it is started again. Only a process started by this
        call that exits is an error, reported with its exit code and log tail.
        """
        t0 = time.monotonic()
        pending: dict[str, tuple[Proc, psutil.Process, bool]] = {}
        for proc in procs:
            p = self.process(proc.name)
            if p is not None:
                if _safe(proc.health):
                    self._say(f"{proc.name} already running (pid {p.pid}), healthy")
                    continue
                self._say(f"{proc.name} running (pid {p.pid}) but not healthy yet; waiting")
                pending[proc.name] = (proc, p, False)
                continue
            pending[proc.name] = (proc, self._start_logged(proc), True)

        deadline = t0 + self.start_timeout
        while pending:
            for name, (proc, p, started) in list(pending.items()):
                if not _running(p):
                    if started:
                        code = self._reap(name)
                        self.pid_path(name).unlink(missing_ok=True)
                        raise SupervisorError(
                            f"{name} exited during start-up (pid {p.pid}, exit code {code}); "
                            f"last lines of {self.log_path(name)}:\n{self.tail(name)}")
                    # It was on its way out when we looked: wait for all of it, then start anew.
                    self._say(f"{name} (pid {p.pid}) exited while we waited for it; starting it again")
                    self._wait_tree_gone(name, [p], t0)
                    pending[name] = (proc, self._start_logged(proc), True)
                elif _safe(proc.health):
                    self._say(f"{name} ready ({time.monotonic() - t0:.1f}s)")
                    del pending[name]
            if pending and time.monotonic() > deadline:
                name, (proc, p, _) = next(iter(pending.items()))
                raise SupervisorError(
                    f"{name} (pid {p.pid}) did not become healthy at {proc.url} within {self.start_timeout:.0f}s; "
                    f"last lines of {self.log_path(name)}:\n{self.tail(name)}")
            if pending:
                time.sleep(0.2)

    # ------------------------------------------------------------------ stop
    def stop(self, names: Sequence[str], timeout: float | None = None, *, sig: int = signal.SIGTERM,
             tree: bool = True) -> None:
        """Send ``sig`` (SIGTERM; SIGKILL to test a crash) to each process tree together, wait, SIGKILL
        whatever of the trees is left after ``timeout``; return when every process of the trees is gone.
        With ``tree=False`` only the process itself (and its process group) is stopped: what it started
        in sessions of their own lives on. Idempotent."""
        timeout = self.stop_timeout if timeout is None else timeout
        t0 = time.monotonic()
        trees: dict[str, list[psutil.Process]] = {}
        for name in names:
            p = self.process(name)
            if p is None:
                continue
            trees[name] = _tree(p) if tree else [p]
            _signal_tree(p, trees[name], sig)
        killed: set[str] = set()
        while trees:
            for name, procs in list(trees.items()):
                for q in procs if tree else ():  # children forked after the first look join the tree
                    if q.is_running():
                        procs.extend(c for c in _children(q) if c not in procs)
                if not any(_running(q) for q in procs):
                    del trees[name]
                    self._reap(name)
                    self.pid_path(name).unlink(missing_ok=True)
                    self._say(f"{name} {'killed' if name in killed else 'stopped'} "
                              f"(pid {procs[0].pid}, {time.monotonic() - t0:.1f}s)")
            if not trees:
                break
            waited = time.monotonic() - t0
            if waited > timeout:
                for name, procs in trees.items():
                    if name not in killed:
                        self._say(f"{name} (pid {procs[0].pid}) still running {timeout:.0f}s after SIGTERM; "
                                  f"sending SIGKILL")
                        killed.add(name)
                    _signal_tree(procs[0], procs, signal.SIGKILL)
                if waited > timeout + 10:
                    raise SupervisorError("could not stop: " + ", ".join(
                        f"{n} (pids {[q.pid for q in ps if _running(q)]})" for n, ps in trees.items()))
            time.sleep(0.1)

    # ------------------------------------------------------------------ internals
    def _start_logged(self, proc: Proc) -> psutil.Process:
        if proc.before_start is not None:
            proc.before_start()
        p = self.start(proc)
        port = f", port {proc.ports[0]}" if proc.ports else ""
        self._say(f"{proc.name} starting (pid {p.pid}{port}, log {self.log_path(proc.name)})")
        return p

    def _wait_tree_gone(self, name: str, procs: list[psutil.Process], t0: float) -> None:
        procs = procs + [c for p in procs for c in _children(p)]
        _, alive = psutil.wait_procs(procs, timeout=self.stop_timeout)
        if alive:
            for q in alive:
                _kill(q, signal.SIGKILL)
            _, alive = psutil.wait_procs(alive, timeout=10)
        if alive:
            raise SupervisorError(f"{name}: the previous process tree did not go away ({[q.pid for q in alive]})")
        self._reap(name)
        self.pid_path(name).unlink(missing_ok=True)

    def _reap(self, name: str) -> int | None:
        child = self._children.get(name)
        if child is None:
            return None
        code = child.poll()
        if code is not None:
            self._children.pop(name, None)
        return code

    def _say(self, msg: str) -> None:
        line = f"{self.prefix} {msg}" if self.prefix else msg
        log.info(line)
        if self.progress is not None:
            self.progress(line)


# ---------------------------------------------------------------------- helpers
def _become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _safe(fn: Callable[[], bool]) -> bool:
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - a health check that raises is a failed health check
        return False


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _tree(p: psutil.Process) -> list[psutil.Process]:
    return [p, *_children(p)]


def _kill(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _signal_tree(root: psutil.Process, procs: list[psutil.Process], sig: int) -> None:
    """Signal the root's process group (it leads one: start_new_session) and every other live member
    of the tree (children in sessions of their own, e.g. containerd's shims)."""
    try:
        os.killpg(root.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for q in procs:
        if _running(q):
            _kill(q, sig)


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log, indented for an error message."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return f"  (no log file {path})"
    return "\n".join("  | " + line for line in data[-lines:])


def deaf_to_sigterm(pid: int) -> bool:
    """Whether a SIGTERM sent from this pid namespace can never reach `pid`: it is the init (pid 1) of a pid namespace
    of its own and has no handler for SIGTERM. The kernel delivers to such an init, from an ancestor namespace, only
    the signals it has a handler for, and SIGKILL and SIGSTOP (pid_namespaces(7), "The namespace init process"), so
    a SIGTERM is dropped and only a SIGKILL after the stop's timeout ends it. A container's `sleep infinity` (the
    local pause image's process: scripts/build-images.sh) is one. False when it cannot be told (gone, no /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    ns_pids = fields.get("NSpid", "").split()
    caught = int(fields.get("SigCgt", "0").strip() or "0", 16)
    return len(ns_pids) > 1 and ns_pids[-1] == "1" and not caught & (1 << (signal.SIGTERM - 1))
