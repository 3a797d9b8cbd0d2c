"""A real multi-node Slurm cluster on this one machine, for tests and the local environment.

`LocalSlurm` starts, in a work directory of its own:

* one ``munged`` on its own socket and key (``munge/``),
* one ``slurmctld`` on ``ctld_port`` (state in ``ctld/``),
* one ``slurmd`` per node (``slurmd -N NAME``), each on its own port, all with
  ``NodeAddr=127.0.0.1`` and their own ``NodeHostname`` (Debian's Slurm 22.05 is not
  built with multiple-slurmd support, so nodes must differ by NodeHostname), spool,
  pid and log under ``nodes/NAME/``.

Everything runs as root, detached (own session), with pid files and logs in the work
directory, so the cluster outlives the Python process that started it and a later
``up()`` (even from another process) finds and reuses it. It touches nothing outside
the work directory: no /etc/slurm, no /etc/munge, no system services.

Usage::

    cluster = LocalSlurm(Path("/tmp/slurm"), ["gpu-a-0", "gpu-a-1", "gpu-a-2"],
                         {"gpu": ["gpu-a-0", "gpu-a-1", "gpu-a-2"]},
                         spare_nodes=["gpu-a-2"], ctld_port=free_port(), first_slurmd_port=...)
    cluster.up()                     # idempotent; waits until every node is up
    env = cluster.env()              # SLURM_CONF etc.: pass to sbatch/scontrol/SlurmCLI
    subprocess.run(["sinfo"], env=env)
    cluster.down()                   # idempotent; SIGTERM then SIGKILL

Spare nodes (``spare_nodes``) are configured like the others but start DRAINED with
the reason ``gpufleet: spare`` (:data:`SPARE_REASON`): nothing is scheduled on them
until someone (the reconciler, when it promotes a spare) resumes them with
``scontrol update NodeName=X State=RESUME``. The spare state is applied when the
cluster is first created; after that slurmctld's saved state is what counts (as on a
real cluster), unless ``up(clean=True)`` is used.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

SPARE_REASON = "gpufleet: spare"

# Seconds between SIGTERM and SIGKILL when Slurm ends a job (cancel, requeue, time limit).
KILL_WAIT = 5

# Node states in which a node counts as up for `up()` (sinfo %T, lower-case, flags
# like "drained" are separate states in sinfo's long form).
_UP_STATES = {"idle", "allocated", "mixed", "completing", "drained", "draining",
              "reserved", "planned"}


class LocalSlurmError(RuntimeError):
    """The local cluster could not be started or is unhealthy."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free TCP ports (held open together while picking them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port_block(n: int, lo: int = 20000, hi: int = 60000) -> int:
    """The first port of `n` consecutive free TCP ports (slurmd ports are consecutive)."""
    rnd = random.Random()
    for _ in range(200):
        start = rnd.randrange(lo, hi - n)
        ok = True
        for p in range(start, start + n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return start
    raise LocalSlurmError(f"no block of {n} free ports found")


def _which(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not path:
        raise LocalSlurmError(
            f"{name} not found: install Slurm and MUNGE first (scripts/install-slurm.sh)")
    return path


# Daemons this process started: polled so that exited ones do not linger as zombies.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _alive(pid: int, must_contain: Iterable[str] = ()) -> bool:
    """Whether `pid` runs (not a zombie) and its command line contains all of `must_contain`
    (guards against pid reuse). Daemons started by an earlier process are not our
    children: when they exit they stay zombies until init reaps them, hence the state
    check."""
    if pid <= 0:
        return False
    proc = _CHILDREN.get(pid)
    if proc is not None:
        # Our own child: trust poll() (right after exec /proc/PID/cmdline can be empty).
        if proc.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        state = stat.rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return all(s in cmdline for s in must_contain)


def _is_up(state: str) -> bool:
    """A sinfo long state of a node whose slurmd registered and responds. A suffix
    marks trouble: "*" not responding, "~" powered off, "#" powering up, "%" powering
    down, "!" pending power down, "$" maintenance, "@" pending reboot, "^" rebooting,
    "-" planned."""
    return bool(state) and state.rstrip("*~#%!$@^-") == state and state in _UP_STATES


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class _Daemon:
    name: str          # "munged", "slurmctld", "slurmd:NAME"
    argv: list[str]
    pidfile: Path      # our pid file (the pid of the process we started)
    logs: tuple[Path, ...]
    marker: str        # a string its command line must contain (our work dir)


class LocalSlurm:
    """A local multi-node Slurm (see the module docstring).

    Args:
        workdir: where everything lives (created if needed). Keep the path short-ish:
            the munge socket path must fit a Unix socket name (< 108 bytes).
        nodes: node names, e.g. ["gpu-a-0", "gpu-a-1"].
        partitions: partition name -> node names; the first is the default partition.
        cpus_per_node: CPUs each node advertises (slurmd runs with config_overrides,
            so this need not match the machine).
        real_memory_mb: memory each node advertises.
        ctld_port: slurmctld's port.
        first_slurmd_port: node i listens on first_slurmd_port + i.
        cluster_name: ClusterName.
        spare_nodes: nodes that start DRAINED with reason SPARE_REASON.
        extra_conf: extra slurm.conf lines (appended).
        start_timeout: seconds to wait for each stage of `up()`.
    """

    def __init__(
        self,
        workdir: Path | str,
        nodes: list[str],
        partitions: Mapping[str, list[str]] | None = None,
        *,
        cpus_per_node: int = 2,
        real_memory_mb: int = 1024,
        ctld_port: int = 16817,
        first_slurmd_port: int = 16818,
        cluster_name: str = "gpufleet",
        spare_nodes: Iterable[str] = (),
        extra_conf: Iterable[str] = (),
        start_timeout: float = 60.0,
    ):
        if not nodes:
            raise ValueError("at least one node is needed")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate node names: {nodes}")
        self.workdir = Path(workdir).resolve()
        self.nodes = list(nodes)
        self.partitions = dict(partitions) if partitions else {"debug": list(nodes)}
        for part, members in self.partitions.items():
            unknown = set(members) - set(self.nodes)
            if unknown:
                raise ValueError(f"partition {part} names unknown nodes {sorted(unknown)}")
        self.spare_nodes = list(spare_nodes)
        unknown = set(self.spare_nodes) - set(self.nodes)
        if unknown:
            raise ValueError(f"spare_nodes names unknown nodes {sorted(unknown)}")
        self.cpus_per_node = cpus_per_node
        self.real_memory_mb = real_memory_mb
        self.ctld_port = ctld_port
        self.first_slurmd_port = first_slurmd_port
        self.cluster_name = cluster_name
        self.extra_conf = list(extra_conf)
        self.start_timeout = start_timeout

        d = self.workdir
        self.munge_dir = d / "munge"
        self.munge_key = self.munge_dir / "munge.key"
        self.munge_socket = self.munge_dir / "munge.socket"
        self.etc_dir = d / "etc"
        self.conf_path = self.etc_dir / "slurm.conf"
        self.ctld_dir = d / "ctld"
        self.state_dir = self.ctld_dir / "state"
        self.nodes_dir = d / "nodes"
        if len(str(self.munge_socket)) > 100:
            raise ValueError(f"workdir too long for a Unix socket path: {self.munge_socket}")

    # ------------------------------------------------------------------ paths / env

    def node_port(self, name: str) -> int:
        return self.first_slurmd_port + self.nodes.index(name)

    def node_dir(self, name: str) -> Path:
        return self.nodes_dir / name

    def node_log(self, name: str) -> Path:
        return self.node_dir(name) / "slurmd.log"

    @property
    def ctld_log(self) -> Path:
        return self.ctld_dir / "slurmctld.log"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients (sbatch, scontrol, squeue, SlurmCLI...).

        Based on `base` (default: os.environ) with SLURM_CONF set to this cluster's
        slurm.conf; the munge socket comes from AuthInfo in that file. Variables that
        would make a client talk to another cluster (SLURM_CLUSTERS, SLURM_JOBID...) are
        removed.
        """
        e = dict(os.environ if base is None else base)
        for k in list(e):
            if k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")):
                del e[k]
        e["SLURM_CONF"] = str(self.conf_path)
        return e

    # ------------------------------------------------------------------ config

    def slurm_conf(self) -> str:
        sock = self.munge_socket
        lines = [
            "# Generated by gpufleet.localenv.slurm.LocalSlurm: do not edit.",
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.first_slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={self.state_dir}",
            f"SlurmctldPidFile={self.ctld_dir / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.ctld_log}",
            f"SlurmdSpoolDir={self.nodes_dir}/%n/spool",
            f"SlurmdPidFile={self.nodes_dir}/%n/slurmd.pid",
            f"SlurmdLogFile={self.nodes_dir}/%n/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "JobRequeue=1",
            "ReturnToService=2",
            # Short timers so a local cluster reacts in seconds, not minutes.
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
            f"KillWait={KILL_WAIT}",
            "Waittime=0",
            "MessageTimeout=5",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "MailProg=/bin/true",
        ]
        spares = set(self.spare_nodes)
        for name in self.nodes:
            line = (f"NodeName={name} NodeHostname={name} NodeAddr=127.0.0.1 "
                    f"Port={self.node_port(name)} CPUs={self.cpus_per_node} "
                    f"RealMemory={self.real_memory_mb}")
            if name in spares:
                line += f' State=DRAIN Reason="{SPARE_REASON}"'
            else:
                line += " State=UNKNOWN"
            lines.append(line)
        for i, (part, members) in enumerate(self.partitions.items()):
            lines.append(f"PartitionName={part} Nodes={','.join(members)} "
                         f"Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE State=UP")
        lines += self.extra_conf
        return "\n".join(lines) + "\n"

    def _write_files(self) -> bool:
        """Create directories, the munge key (once) and slurm.conf. Returns whether
        slurm.conf changed."""
        for p in (self.workdir, self.munge_dir, self.etc_dir, self.ctld_dir, self.state_dir,
                  self.nodes_dir):
            p.mkdir(parents=True, exist_ok=True)
        os.chmod(self.munge_dir, 0o700)
        for n in self.nodes:
            (self.node_dir(n) / "spool").mkdir(parents=True, exist_ok=True)
        if not self.munge_key.exists():
            tmp = self.munge_key.with_suffix(".tmp")
            tmp.write_bytes(os.urandom(1024))
            os.chmod(tmp, 0o600)
            tmp.rename(self.munge_key)
        conf = self.slurm_conf()
        old = self.conf_path.read_text() if self.conf_path.exists() else None
        if old != conf:
            self.conf_path.write_text(conf)
            os.chmod(self.conf_path, 0o644)
            return True
        return False

    # ------------------------------------------------------------------ daemons

    def _daemons(self) -> list[_Daemon]:
        marker = str(self.workdir)
        ds = [
            _Daemon(
                "munged",
                [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                 f"--key-file={self.munge_key}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                 f"--log-file={self.munge_dir / 'munged.log'}",
                 f"--seed-file={self.munge_dir / 'munged.seed'}", "--num-threads=4"],
                self.munge_dir / "gpufleet.pid",
                (self.munge_dir / "munged.log", self.munge_dir / "munged.out"),
                marker,
            ),
            _Daemon(
                "slurmctld",
                [_which("slurmctld"), "-D", "-f", str(self.conf_path)],
                self.ctld_dir / "gpufleet.pid",
                (self.ctld_log, self.ctld_dir / "slurmctld.out"),
                marker,
            ),
        ]
        for n in self.nodes:
            ds.append(_Daemon(
                f"slurmd:{n}",
                [_which("slurmd"), "-D", "-N", n, "-f", str(self.conf_path)],
                self.node_dir(n) / "gpufleet.pid",
                (self.node_log(n), self.node_dir(n) / "slurmd.out"),
                marker,
            ))
        return ds

    def _daemon(self, name: str) -> _Daemon:
        for d in self._daemons():
            if d.name == name:
                return d
        raise KeyError(name)

    @staticmethod
    def _pid(d: _Daemon) -> int | None:
        try:
            return int(d.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _running(self, d: _Daemon) -> int | None:
        pid = self._pid(d)
        if pid is not None and _alive(pid, [Path(d.argv[0]).name, d.marker]):
            return pid
        return None

    def _start(self, d: _Daemon) -> int:
        pid = self._running(d)
        if pid is not None:
            return pid
        out = d.logs[-1]
        with open(out, "ab") as f:
            f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(d.argv)}\n"
                    .encode())
            f.flush()
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            env["SLURM_CONF"] = str(self.conf_path)
            proc = subprocess.Popen(
                d.argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                cwd=str(self.workdir), env=env, start_new_session=True, close_fds=True)
        d.pidfile.write_text(f"{proc.pid}\n")
        _CHILDREN[proc.pid] = proc
        return proc.pid

    def _fail(self, d: _Daemon, what: str) -> LocalSlurmError:
        tails = "\n".join(f"--- {p} (tail)\n{_tail(p)}" for p in d.logs)
        return LocalSlurmError(f"{d.name}: {what}\n{tails}")

    def _wait(self, d: _Daemon, ready, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            if self._running(d) is None:
                raise self._fail(d, f"exited while waiting for {what}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise self._fail(d, f"timed out after {timeout or self.start_timeout:.0f}s "
                                    f"waiting for {what}")
            time.sleep(0.2)

    def _munge_ok(self) -> bool:
        if not self.munge_socket.exists():
            return False
        try:
            enc = subprocess.run([_which("munge"), "-n", "-S", str(self.munge_socket)],
                                 capture_output=True, timeout=5)
            if enc.returncode != 0:
                return False
            dec = subprocess.run([_which("unmunge"), "-S", str(self.munge_socket)],
                                 input=enc.stdout, capture_output=True, timeout=5)
            return dec.returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _run(self, argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def _ctld_ok(self) -> bool:
        try:
            r = self._run([_which("scontrol"), "ping"], timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and " is UP" in r.stdout

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo's long state, lower-case (e.g. "idle", "drained", "down*")."""
        r = self._run([_which("sinfo"), "-N", "-h", "-o", "%N %T"], timeout=15)
        if r.returncode != 0:
            raise LocalSlurmError(f"sinfo failed: {r.stderr.strip()}")
        out: dict[str, str] = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out[parts[0]] = parts[1].lower()
        return out

    def nodes_up(self) -> bool:
        """Whether every node's slurmd has registered and responds."""
        try:
            states = self.node_states()
        except (LocalSlurmError, subprocess.TimeoutExpired):
            return False
        return all(_is_up(states.get(n, "")) for n in self.nodes)

    # ------------------------------------------------------------------ lifecycle

    def up(self, *, clean: bool = False) -> "LocalSlurm":
        """Start whatever is not running yet and wait until every node is up (IDLE, or
        DRAINED for spares). Idempotent: running daemons are reused. `clean=True` first
        stops everything and wipes slurmctld's saved state (jobs, node states)."""
        if clean:
            self.down()
            shutil.rmtree(self.state_dir, ignore_errors=True)
        changed = self._write_files()
        daemons = {d.name: d for d in self._daemons()}
        if changed:
            # A new slurm.conf: restart the Slurm daemons that run with the old one.
            for name, d in daemons.items():
                if name != "munged":
                    self._stop(d)

        munged = daemons["munged"]
        self._start(munged)
        self._wait(munged, self._munge_ok, "its socket to answer")

        ctld = daemons["slurmctld"]
        self._start(ctld)
        self._wait(ctld, self._ctld_ok, "`scontrol ping` to report it UP")

        for n in self.nodes:
            self._start(daemons[f"slurmd:{n}"])
        self._wait_nodes_up(daemons)
        return self

    def _wait_nodes_up(self, daemons: dict[str, _Daemon]) -> None:
        deadline = time.monotonic() + self.start_timeout
        states: dict[str, str] = {}
        while True:
            for n in self.nodes:
                d = daemons[f"slurmd:{n}"]
                if self._running(d) is None:
                    raise self._fail(d, f"exited while waiting for node {n} to be up "
                                        f"(sinfo: {states.get(n, '?')})")
            try:
                states = self.node_states()
            except (LocalSlurmError, subprocess.TimeoutExpired) as e:
                states = {"error": str(e)}
            waiting = [n for n in self.nodes if not _is_up(states.get(n, ""))]
            if not waiting:
                return
            if time.monotonic() > deadline:
                n = waiting[0]
                raise self._fail(
                    daemons[f"slurmd:{n}"],
                    f"timed out after {self.start_timeout:.0f}s waiting for node {n} to be up "
                    f"(sinfo: {states}); slurmctld log tail:\n{_tail(self.ctld_log, 15)}")
            time.sleep(0.2)

    def _stop(self, d: _Daemon, grace: float = 10.0) -> None:
        pid = self._running(d)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.1)
        d.pidfile.unlink(missing_ok=True)

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon: "munged", "slurmctld" or "slurmd:NODE" (e.g. to test a
        controller outage or a node failure). `up()` starts it again."""
        self._stop(self._daemon(name))

    def down(self, *, cancel_jobs: bool = True) -> None:
        """Stop every daemon (slurmds, then slurmctld, then munged): SIGTERM, then SIGKILL
        after a grace period. Idempotent.

        With `cancel_jobs` (default) the jobs that still run are cancelled first (while
        slurmctld answers), so a later `up()` finds them CANCELLED. Either way the
        processes of jobs still running when slurmd stops (slurmstepd and the job's own,
        which outlive slurmd) are killed; without `cancel_jobs` slurmctld's saved state
        still shows those jobs RUNNING after the next `up()`, like after a power cut,
        until Slurm notices they are gone (minutes)."""
        if not self.workdir.exists():
            return
        if cancel_jobs and self._running(self._daemon("slurmctld")) is not None:
            try:
                self._cancel_all_jobs(timeout=KILL_WAIT + 5)
            except (LocalSlurmError, subprocess.TimeoutExpired, OSError):
                pass  # stopping must go on
        for d in reversed(self._daemons()):
            self._stop(d)
        self._kill_leftover_jobs()

    def _cancel_all_jobs(self, timeout: float) -> None:
        active = "running,completing,suspended,configuring,stopped,pending"
        r = self._run([_which("squeue"), "-h", "-t", active, "-o", "%i"], timeout=10)
        if r.returncode != 0:
            return
        ids = r.stdout.split()
        if not ids:
            return
        self._run([_which("scancel"), *ids], timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self._run([_which("squeue"), "-h", "-t", active, "-o", "%i"], timeout=10)
            if r.returncode != 0 or not r.stdout.strip():
                return
            time.sleep(0.2)

    def _kill_leftover_jobs(self) -> int:
        """Stopping slurmd leaves its jobs running (slurmstepd and the job's processes are
        detached from it). Kill those of this cluster: processes whose environment has
        our SLURM_CONF and that are a slurmstepd or inside a job (SLURM_JOB_ID set).
        Returns how many were killed."""
        conf = f"SLURM_CONF={self.conf_path}".encode()
        spare = {os.getpid(), os.getppid()}
        killed = 0
        for _ in range(5):
            found = 0
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in spare:
                    continue
                try:
                    environ = (entry / "environ").read_bytes().split(b"\0")
                    cmd = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if conf not in environ:
                    continue
                if not (cmd.startswith(b"slurmstepd")
                        or any(v.startswith(b"SLURM_JOB_ID=") for v in environ)):
                    continue
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
                except ProcessLookupError:
                    pass
            killed += found
            if not found:
                break
            time.sleep(0.1)
        return killed

    def status(self) -> dict[str, object]:
        """{"daemons": {name: pid or None}, "nodes": {name: sinfo state} or None,
        "controller": bool, "conf": path}."""
        daemons = {d.name: self._running(d) for d in self._daemons()}
        ctld_up = daemons.get("slurmctld") is not None and self._ctld_ok()
        nodes = None
        if ctld_up:
            try:
                nodes = self.node_states()
            except (LocalSlurmError, subprocess.TimeoutExpired):
                nodes = None
        return {"daemons": daemons, "controller": ctld_up, "nodes": nodes,
                "conf": str(self.conf_path)}

    def healthy(self) -> bool:
        st = self.status()
        return (all(v is not None for v in st["daemons"].values())  # type: ignore[union-attr]
                and bool(st["controller"])
                and self.nodes_up())

    # ------------------------------------------------------------------ helpers

    def scontrol(self, *args: str, timeout: float = 15) -> str:
        """Run scontrol against this cluster; returns stdout, raises on failure."""
        r = self._run([_which("scontrol"), *args], timeout=timeout)
        if r.returncode != 0:
            raise LocalSlurmError(f"scontrol {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def set_node_state(self, name: str, state: str, reason: str | None = None) -> None:
        """`scontrol update NodeName=name State=state [Reason=reason]`."""
        args = ["update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            args.append(f"Reason={reason}")
        self.scontrol(*args)

    def reset(self, timeout: float = 30) -> None:
        """Back to the initial state, for tests sharing one cluster: cancel every job,
        resume every node but the spares, drain the spares with SPARE_REASON, and wait
        until no job is left and every node is up."""
        r = self._run([_which("squeue"), "-h", "-o", "%i"], timeout=15)
        ids = [i for i in r.stdout.split() if i.strip()]
        if ids:
            self._run([_which("scancel"), *ids], timeout=15)
        spares = set(self.spare_nodes)
        states = self.node_states()
        for n in self.nodes:
            st = states.get(n, "")
            if n in spares:
                self.set_node_state(n, "DRAIN", SPARE_REASON)
            elif any(s in st for s in ("drain", "down", "fail")):
                self.set_node_state(n, "RESUME")
        deadline = time.monotonic() + timeout
        while True:
            left = self._run([_which("squeue"), "-h", "-o", "%i %T"], timeout=15).stdout.strip()
            if not left and self.nodes_up():
                states = self.node_states()
                if all(("drain" in states[n]) == (n in spares) for n in self.nodes):
                    return
            if time.monotonic() > deadline:
                raise LocalSlurmError(f"reset: still jobs {left!r} or nodes {self.node_states()}")
            time.sleep(0.2)

    def sbatch(self, *args: str, timeout: float = 15) -> int:
        """Submit a batch job (`sbatch --parsable ARGS`); returns the job id."""
        r = self._run([_which("sbatch"), "--parsable", *args], timeout=timeout)
        if r.returncode != 0:
            raise LocalSlurmError(f"sbatch {' '.join(args)}: {r.stderr.strip()}")
        return int(r.stdout.strip().split(";")[0])

    def __enter__(self) -> "LocalSlurm":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
