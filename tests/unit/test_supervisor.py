"""The local environment's supervisor with real processes (a tiny Python server; no tools needed):
start detached, health, stop of a whole tree, a process still shutting down, stale pid files."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from gpufleet.waiting import wait_for
from localenv.ports import free_port
from localenv.supervisor import Proc, Supervisor, SupervisorError, deaf_to_sigterm

# Listens on PORT (its health); on SIGTERM closes the socket at once but takes 1.5 s to exit, like an
# API server draining; with CHILD=1 it first starts a grandchild in a session of its own that ignores TERM.
SERVER = r"""
import os, signal, socket, subprocess, sys, time
if os.environ.get("CHILD"):
    subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 300"], start_new_session=True)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
def term(*_):
    s.close(); time.sleep(float(os.environ.get("DRAIN", "1.5"))); sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("listening", flush=True)
while True:
    time.sleep(1)
"""


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server(port: int, **env: str) -> Proc:
    return Proc("srv", [sys.executable, "-c", SERVER, str(port)], lambda: listening(port), f"tcp://127.0.0.1:{port}",
                ports=(port,), env={**os.environ, **env})


@pytest.fixture
def sup(tmp_path):
    lines: list[str] = []
    s = Supervisor(tmp_path / "run", tmp_path / "logs", start_timeout=10, stop_timeout=3, progress=lines.append)
    s.lines = lines
    yield s
    s.stop(["srv"])


def test_start_health_reuse_and_stop(sup):
    port = free_port()
    sup.ensure([server(port)])
    pid = sup.pid("srv")
    assert pid and listening(port) and sup.status(server(port))["healthy"]
    assert json.loads(sup.pid_path("srv").read_text())["pid"] == pid
    sup.ensure([server(port)])  # healthy: reused
    assert sup.pid("srv") == pid and any("already running" in line for line in sup.lines)
    assert "listening" in sup.tail("srv")
    sup.stop(["srv"])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert sup.pid("srv") is None and not sup.pid_path("srv").exists()
    assert any(line.startswith("[local] srv stopped") for line in sup.lines)


def test_stop_waits_for_the_whole_tree_and_kills_what_ignores_term(sup):
    port = free_port()
    sup.ensure([server(port, CHILD="1", DRAIN="0")])
    root = psutil.Process(sup.pid("srv"))
    time.sleep(0.3)
    tree = [root, *root.children(recursive=True)]
    assert len(tree) >= 2  # the grandchild, in a session of its own
    sup.stop(["srv"], timeout=0.5)  # what still runs then is killed: the grandchild ignores SIGTERM
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert any("sending SIGKILL" in line for line in sup.lines)  # the grandchild ignored SIGTERM


def test_stop_without_the_tree_leaves_what_the_process_started_in_its_own_session(sup):
    """The Slinky stand-in's slurmds outlive it, as NodeSet pods outlive the operator."""
    port = free_port()
    sup.ensure([server(port, CHILD="1", DRAIN="0")])
    root = psutil.Process(sup.pid("srv"))
    time.sleep(0.3)
    (child,) = root.children(recursive=True)
    sup.stop(["srv"], tree=False)
    try:
        assert not root.is_running() or root.status() == psutil.STATUS_ZOMBIE
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        assert sup.pid("srv") is None
    finally:
        child.kill()


def test_stop_with_sigkill_gives_no_time_to_clean_up(sup):
    """A crash (the e2e test kills the reconciler mid-remediation): SIGKILL at once, no SIGTERM first."""
    port = free_port()
    sup.ensure([server(port, DRAIN="5")])
    t0 = time.monotonic()
    sup.stop(["srv"], sig=signal.SIGKILL)
    assert time.monotonic() - t0 < 2  # a SIGTERM would have drained for 5 s
    assert sup.pid("srv") is None and not listening(port)


def test_up_after_a_stop_from_elsewhere_waits_for_the_old_process(sup):
    """Issue 14.6: a component SIGTERMed by someone else is still shutting down when up() runs; up() must
    wait for it to be gone and start a new one, not report it as 'exited during start-up'."""
    port = free_port()
    sup.ensure([server(port)])
    old = psutil.Process(sup.pid("srv"))
    old.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # it closed its socket, and is draining
    assert old.is_running() and not listening(port)
    sup.ensure([server(port)])
    new = sup.pid("srv")
    assert new != old.pid and listening(port)
    assert not old.is_running() or old.status() == psutil.STATUS_ZOMBIE
    assert any("exited while we waited for it; starting it again" in line for line in sup.lines)


def test_exit_at_start_up_is_reported_with_code_and_log(sup):
    bad = Proc("srv", [sys.executable, "-c", "import sys; print('bad flag --x', file=sys.stderr); sys.exit(3)"],
               lambda: False, "nowhere")
    with pytest.raises(SupervisorError, match=r"^srv exited during start-up \(pid \d+, exit code 3\)") as e:
        sup.ensure([bad])
    assert "bad flag --x" in str(e.value) and not sup.pid_path("srv").exists()


def test_a_stale_pid_file_is_never_signalled(sup):
    sup.run_dir.mkdir(parents=True)
    me = psutil.Process()
    sup.pid_path("srv").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time() - 100}))
    assert sup.process("srv") is None and not sup.pid_path("srv").exists()
    sup.stop(["srv"])  # nothing to stop; this test process is still here
    assert me.is_running()


def test_a_busy_port_names_the_component(sup, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(SupervisorError, match=r"srv: port \d+ on 127.0.0.1 is in use"):
            sup.ensure([server(s.getsockname()[1])])


def test_a_pid_namespaces_init_without_a_sigterm_handler_is_known_deaf_to_it():
    """pid_namespaces(7): from outside, a namespace's init gets only the signals it handles (and SIGKILL, SIGSTOP).
    `sleep infinity` as a container's process (the local pause image's) handles none; a process with a SIGTERM
    handler, or one that is no namespace's init, gets its SIGTERM."""
    handler = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); print('ready', flush=True); time.sleep(60)"
    procs = [subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv], stdout=subprocess.PIPE, text=True)
             for argv in (["sleep", "infinity"], [sys.executable, "-c", handler])]
    try:
        assert procs[1].stdout.readline() == "ready\n"  # its handler is set
        deaf, handled = (wait_for("the namespace's init", lambda p=p: psutil.Process(p.pid).children(), 10)[0]
                         for p in procs)
        assert deaf_to_sigterm(deaf.pid) and not deaf_to_sigterm(handled.pid)
        assert not deaf_to_sigterm(os.getpid())  # the init of no namespace
    finally:
        for p in procs:
            p.kill()
            p.wait()
