"""A real Slurm 26.05 on this one machine, run the way Slinky runs it, for tests and the local environment.

The daemons come from the root filesystem that ``scripts/build-slurm-root.sh`` builds
(Debian sid: the only suite with a Slurm that Slinky 1.x accepts). Each runs chrooted in
that root, in a private mount namespace (``unshare -m``) holding: a tmpfs on ``/run`` and
``/tmp``, the work directory and the extra ``binds`` at their own paths (so every path
means the same inside and out), the work dir's ``munge/`` on ``/run/munge``, and
``/proc``, ``/dev``, ``/sys``. The work directory is bound a second time under
:data:`DAEMON_VIEW` (``/run/gpufleet<workdir>``, whose parents are the root's own tmpfs
folders), and slurm.conf names it there: the daemons that run as ``slurm`` and
``slurmrest`` then reach it even when a bind covers it through a folder only its owner
may enter (a project cloned into ``mktemp -d``, mode 0700). The mounts go away with the process; nothing is mounted
on the host and nothing outside the work directory is written (bar empty mount points).

In the work directory:

* ``munged`` (``munge/``; the socket is also ``/run/munge/munge.socket.2`` in the root),
* ``slurmctld`` on ``ctld_port`` as ``SlurmUser=slurm``, configless, JWT enabled
  (``AuthAltTypes=auth/jwt``, key ``etc/jwt_hs256.key``, made once),
* ``slurmrestd`` on ``rest_port`` as the root's user ``slurmrest`` (it refuses root),
  with ``SLURM_JWT=daemon`` and ``rest_auth/jwt``: what Slinky's RestApi runs,
* one ``slurmd`` per started node, as Slinky's NodeSet pods run it: a dynamic node
  (``slurmd -Z --conf-server 127.0.0.1:<ctld_port> --conf "Feature=<nodeset> ..."``) on a
  port of its own. Partitions are over NodeSets (``NodeSet=<ns> Feature=<ns>``), as in
  Slinky's slurm.conf, so nodes come and go at run time without touching slurm.conf.

Node state set at run time (drains, reasons, comments) lives in slurmctld's saved state,
never in slurm.conf, so restarting slurmctld keeps it.

Every daemon runs under the local environment's one supervisor (:class:`localenv.supervisor.Supervisor`:
detached, pid files in ``run/`` and output in ``log/`` of the work directory); a later ``up()`` (even
from another process) finds and reuses the running daemons and restarts the slurmds of the nodes that
were started and not stopped.

Host-side tools: ``env()`` puts ``<workdir>/bin`` first on PATH, where ``scontrol``,
``squeue``, ``sbatch``... are small wrappers that run the root's tool the same way, so
``SlurmCLI(env=cluster.env())`` and scripts work unchanged.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from gpufleet.waiting import wait_for
from localenv.paths import PROJECT_DIR
from localenv.ports import free_port
from localenv.supervisor import Proc, Supervisor, SupervisorError

BUILD_ROOT_SCRIPT = PROJECT_DIR / "scripts" / "build-slurm-root.sh"

# The user slurmrestd runs as (created in the root by build-slurm-root.sh) and Slurm's SlurmUser.
REST_USER = "slurmrest"
SLURM_USER = "slurm"

# What Slinky's preStop writes when a NodeSet pod terminates.
POD_TERMINATING_REASON = "slurm-operator: Pod is terminating"

# Seconds between SIGTERM and SIGKILL when Slurm ends a job (cancel, requeue, time limit).
KILL_WAIT = 5

# Where the work directory is bound again in the root for the daemons (see the module docstring).
DAEMON_VIEW = Path("/run/gpufleet")
# munged's socket as every process in the root sees it (the work dir's munge/ is bound on /run/munge).
MUNGE_SOCKET_IN_ROOT = "/run/munge/munge.socket.2"

# Client tools wrapped in <workdir>/bin.
TOOLS = ("scontrol", "squeue", "sinfo", "sbatch", "scancel", "srun", "sacct", "sprio", "sdiag", "sacctmgr")

# The process that stands in for the accounting database a stack names (slurm.accounting.database: an external
# MySQL/MariaDB, or the MariaDB StatefulSet components/slinky.py declares): MariaDB from the Slurm root.
ACCOUNTING_DB = "accounting-db"
DB_USER = "mysql"  # MariaDB's own user in the root (Debian's mariadb-server)

# sinfo %T long states of a node whose slurmd registered and answers ("down" without "*": a DOWN node
# whose slurmd answers, e.g. registered again under ReturnToService=0).
_UP_STATES = {"idle", "allocated", "mixed", "completing", "drained", "draining",
              "reserved", "planned", "down"}


class LocalSlurmError(RuntimeError):
    """The local cluster could not be started or is unhealthy."""


class Cancelled(BaseException):
    """The caller's `cancel` event is set: raised by a Slurm command, or a wait for a daemon, that starts or ends
    after it, as a Go call returns ctx.Err() once its context is cancelled (the Slinky stand-in's stop on SIGTERM,
    as controller-runtime's manager cancels its context). A BaseException, so that no `except Exception` (a
    health check, a pass that is logged and tried again) swallows it: it unwinds the work in flight."""


def local_stack_slurm():
    """The local stack's Slurm section (Pulumi.local.yaml): the slurm.conf lines and the cgroup.conf the
    local Slurm needs beyond the operator's, declared where a stack declares them."""
    from gpufleet.fleetspec import load_stack_file

    return load_stack_file(PROJECT_DIR / "Pulumi.local.yaml").fleet.slurm


def local_stack_extra_conf() -> list[str]:
    return list(local_stack_slurm().extra_conf)


def slurm_root() -> Path:
    """The Slurm 26.05 root: $GPUFLEET_SLURM_ROOT, else the cached one build-slurm-root.sh made."""
    env = os.environ.get("GPUFLEET_SLURM_ROOT")
    if env:
        return Path(env)
    r = subprocess.run([str(BUILD_ROOT_SCRIPT), "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        raise LocalSlurmError(f"no Slurm root built yet: run {BUILD_ROOT_SCRIPT} ({r.stderr.strip()})")
    return Path(r.stdout.strip().splitlines()[-1])


def _root_user(root: Path, name: str) -> tuple[int, int]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == name:
            return int(f[2]), int(f[3])
    raise LocalSlurmError(f"user {name} not in {root}/etc/passwd: rebuild with {BUILD_ROOT_SCRIPT} --force")


def _is_up(state: str) -> bool:
    """A sinfo long state of a node whose slurmd registered and responds (no trouble suffix
    such as "*" not responding or "~" powered off)."""
    return bool(state) and state.rstrip("*~#%!$@^-") == state and state in _UP_STATES


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


def _open_files(proc: Path) -> list[str]:
    """What process `proc` (/proc/PID) has open: its file descriptors' targets (one closed meanwhile is left out)."""
    out = []
    for fd in (proc / "fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            pass
    return out


@dataclass(frozen=True)
class _Daemon:
    name: str                    # "munged", "slurmctld", "slurmrestd", "slurmd:NAME"
    argv: list[str]              # inside the root
    health: Callable[[], bool]   # it answers
    what: str                    # what answering means, for messages
    logs: tuple[Path, ...]       # its own log files (the supervisor keeps its output)
    ports: tuple[int, ...] = ()  # must be free before it starts
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AccountingDb:
    """What slurmdbd's storage needs from the database (an Accounting's storageConfig and its password)."""
    database: str
    user: str
    password: str


def _port_open(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class NodeSpec:
    """A node started with `start_node`, kept in nodes/NAME/node.json so `up()` brings it back."""
    name: str
    nodeset: str
    port: int
    comment: dict
    drained_reason: str | None = None
    wanted: bool = True  # False once stop_node() ran
    conf: str = ""  # the slurmd --conf the operator gives the NodeSet's pods (slinky_conf.slurmd_conf)
    host: str = ""  # the Kubernetes node of the pod this slurmd stands for (the stand-in's note)


class LocalSlurm:
    """A local Slurm 26.05 with slurmrestd and dynamic nodes (see the module docstring).

    Args:
        workdir: where everything lives (created if needed; short: Unix socket paths).
        partitions: partition -> NodeSet names; the first partition is the default.
        root: the Slurm root (default: :func:`slurm_root`).
        binds: more host folders to mount at their own path in the root (checkpoints,
            the job's code): jobs run inside the root and see only these and the work dir.
        ctld_port, rest_port: slurmctld's and slurmrestd's ports on 127.0.0.1.
        cpus_per_node, real_memory_mb: what each slurmd advertises.
        cluster_name: ClusterName.
        extra_conf: slurm.conf lines a stack declares (slurm.extra_conf), for a Slurm started without
            a stack's resources; default: the local stack's (Pulumi.local.yaml).
        start_timeout: seconds to wait for each stage of `up()` and `start_node()`.
        cancel: once set, every Slurm command and every wait for a daemon raises :class:`Cancelled` (a command
            in flight is not waited for again: its result is dropped when it ends).
    """

    def __init__(
        self,
        workdir: Path | str,
        partitions: Mapping[str, Sequence[str]],
        *,
        root: Path | str | None = None,
        binds: Iterable[Path | str] = (),
        ctld_port: int = 16817,
        rest_port: int = 16820,
        cpus_per_node: int = 2,
        real_memory_mb: int = 1024,
        cluster_name: str = "gpufleet",
        extra_conf: Iterable[str] | None = None,
        start_timeout: float = 60.0,
        cancel: threading.Event | None = None,
    ):
        if not partitions:
            raise ValueError("at least one partition is needed")
        for part, sets in partitions.items():
            if not sets:
                raise ValueError(f"partition {part} names no NodeSet")
        self.workdir = Path(workdir).resolve()
        self.partitions = {p: list(s) for p, s in partitions.items()}
        self.nodesets = list(dict.fromkeys(s for sets in self.partitions.values() for s in sets))
        self._root = Path(root).resolve() if root else None
        self.binds = [Path(b).resolve() for b in binds]
        self.ctld_port = ctld_port
        self.rest_port = rest_port
        self.cpus_per_node = cpus_per_node
        self.real_memory_mb = real_memory_mb
        self.cluster_name = cluster_name
        self.extra_conf = list(local_stack_extra_conf() if extra_conf is None else extra_conf)
        self.start_timeout = start_timeout
        self.cancel = cancel

        d = self.workdir
        self.bin_dir = d / "bin"
        self.munge_dir = d / "munge"
        self.munge_key = self.munge_dir / "munge.key"
        self.munge_socket = self.munge_dir / "munge.socket.2"
        self.etc_dir = d / "etc"
        self.conf_path = self.etc_dir / "slurm.conf"
        self.operator_dir = self.etc_dir / "operator"  # the operator's files, as the stand-in rendered them
        self.jwt_key_path = self.etc_dir / "jwt_hs256.key"
        self.ctld_dir = d / "ctld"
        self.state_dir = self.ctld_dir / "state"
        self.rest_dir = d / "rest"
        self.nodes_dir = d / "nodes"
        self.acct_dir = d / "accounting"  # slurmdbd's files and the database's (apply_accounting)
        self.dbd_conf_path = self.etc_dir / "slurmdbd.conf"  # next to slurm.conf: slurmdbd looks there
        if len(str(self.munge_socket)) > 100:
            raise ValueError(f"workdir too long for a Unix socket path: {self.munge_socket}")
        self.supervisor = Supervisor(d / "run", d / "log", start_timeout=start_timeout, stop_timeout=10.0,
                                     prefix="[slurm]")
        self._states: tuple[float, dict[str, str]] = (0.0, {})

    # ------------------------------------------------------------------ paths / env

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = slurm_root()
        return self._root

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def ctld_log(self) -> Path:
        return self.ctld_dir / "slurmctld.log"

    def daemon_path(self, path: Path) -> Path:
        """`path` (in the work dir) as slurm.conf names it: under DAEMON_VIEW, through folders
        that anyone may enter, whatever the modes of the work dir's parents on the host."""
        return DAEMON_VIEW / path.relative_to("/")

    @property
    def daemon_conf(self) -> Path:
        """slurm.conf as slurmctld and slurmrestd are told to read it."""
        return self.daemon_path(self.conf_path)

    def node_dir(self, name: str) -> Path:
        return self.nodes_dir / name

    def node_log(self, name: str) -> Path:
        return self.node_dir(name) / "slurmd.log"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients on the host (SlurmCLI, scripts): `base` (default
        os.environ) without variables that point at another cluster, with SLURM_CONF and
        the wrappers of <workdir>/bin first on PATH."""
        e = dict(os.environ if base is None else base)
        for k in list(e):
            if k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")):
                del e[k]
        e["SLURM_CONF"] = str(self.conf_path)
        e["PATH"] = f"{self.bin_dir}:{e.get('PATH', '/usr/bin:/bin')}"
        return e

    def token(self, user: str = SLURM_USER, lifetime_s: int = 900) -> str:
        """An HS256 JWT signed with the cluster's key, claims `sun` (Slurm user), `iat`, `exp`:
        what Slinky's operator and its Token resource make."""
        import jwt

        now = int(time.time())
        return jwt.encode({"sun": user, "iat": now, "exp": now + int(lifetime_s)},
                          self.jwt_key_path.read_bytes(), algorithm="HS256")

    # ------------------------------------------------------------------ config

    def slurm_conf(self) -> str:
        """slurm.conf: what slurm-operator 1.2.1 renders (localenv/slinky_conf.py) from the Slinky resources a
        stack applied (the stand-in writes the operator's files to etc/operator/: `apply_operator_files`), or,
        for a Slurm started without a stack (tests), from a Controller and NodeSets made of `partitions` and
        `extra_conf` as the stack would declare them; in both, the values of slinky_conf.LOCAL_KEYS (where
        these daemons run) replaced. No other line: what the local Slurm needs beyond the operator's lines,
        the stack declares (Pulumi.local.yaml slurm.extra_conf)."""
        from localenv.slinky_conf import localize

        return localize(self.operator_files()["slurm.conf"], self._local_values())

    def operator_files(self) -> dict[str, str]:
        """The operator's files for /etc/slurm: slurm.conf and the rest (cgroup.conf, the configFileRefs)."""
        from localenv import slinky_conf

        if (self.operator_dir / "slurm.conf").exists():
            return {f.name: f.read_text() for f in sorted(self.operator_dir.iterdir()) if f.is_file()}
        lines = ["GresTypes=gpu", "ReturnToService=2"]
        for i, (part, sets) in enumerate(self.partitions.items()):
            lines.append(f"PartitionName={part} Nodes={','.join(sets)} State=UP" + (" Default=YES" if i == 0 else ""))
        controller = slinky_conf.synthetic_controller(self.cluster_name, "\n".join(lines + self.extra_conf) + "\n")
        nodesets = [slinky_conf.synthetic_nodeset(n) for n in self.nodesets]
        stack = local_stack_slurm()  # the config files the local stack declares; its cgroup.conf replaces the operator's
        # With accounting applied, the Accounting the stack would declare beside the Controller (only its name counts).
        accounting = {"metadata": {"name": controller["metadata"]["name"]}} if self.accounting else None
        files = {"slurm.conf": slinky_conf.slurm_conf(controller, accounting, nodesets),
                 "cgroup.conf": stack.cgroup_conf if stack.cgroup_conf is not None else slinky_conf.cgroup_conf()}
        if stack.gres_conf is not None:
            files["gres.conf"] = stack.gres_conf
        return files

    def apply_operator_files(self, files: dict[str, str]) -> bool:
        """What the operator renders from the stack's resources becomes this Slurm's configuration (the
        operator recreates slurmctld's pod when it changes: `inplaceReconfigure` false). Returns whether
        anything changed; then the daemons restart with it (their state is kept)."""
        if files == (self.operator_files() if (self.operator_dir / "slurm.conf").exists() else None):
            return False
        self.operator_dir.mkdir(parents=True, exist_ok=True)
        for f in self.operator_dir.iterdir():
            if f.name not in files:
                f.unlink()
        for name, text in files.items():
            tmp = self.operator_dir / f".{name}.tmp"
            tmp.write_text(text)
            tmp.rename(self.operator_dir / name)
        self.up()
        return True

    def _local_values(self) -> dict[str, str]:
        v = self.daemon_path
        return {
            "SlurmctldHost": "localhost(127.0.0.1)", "SlurmctldPort": str(self.ctld_port),
            "StateSaveLocation": str(v(self.state_dir)), "SlurmdSpoolDir": f"{v(self.nodes_dir)}/%n/spool",
            "SlurmctldLogFile": str(v(self.ctld_log)), "SlurmSchedLogFile": str(v(self.ctld_log)),
            "SlurmdLogFile": f"{v(self.nodes_dir)}/%n/slurmd.log",
            "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={MUNGE_SOCKET_IN_ROOT}",
            "AuthAltParameters": f"jwt_key={v(self.jwt_key_path)}",
            **({"AccountingStorageHost": "127.0.0.1", "AccountingStoragePort": str(ports["dbd"])}
               if (ports := self._acct_ports()) else {}),
        }

    def _inroot_script(self) -> str:
        """The launcher: private mounts, then chroot into the root and exec the command."""
        r = shlex.quote(str(self.root))
        lines = ["#!/bin/sh", "# Generated by LocalSlurm: run a command in the Slurm root.",
                 "# Called as `unshare -m --propagation private <this> CMD...`.", "set -e", "umask 022",
                 f"R={r}",
                 'mount -t tmpfs -o mode=755 tmpfs "$R/run"',
                 'mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"']
        for b in sorted({self.workdir, *self.binds}, key=lambda p: len(p.parts)):  # parents first
            q = shlex.quote(str(b))
            lines += [f'mkdir -p "$R"{q}', f'mount --bind {q} "$R"{q}']
        view = shlex.quote(str(self.daemon_path(self.workdir)))
        lines += [f'mkdir -p "$R"{view} && mount --bind {shlex.quote(str(self.workdir))} "$R"{view}',
                  f'mkdir -p "$R/run/munge" && mount --bind {shlex.quote(str(self.munge_dir))} "$R/run/munge"',
                  'mount -t proc proc "$R/proc"',
                  'mount --rbind /dev "$R/dev"',
                  'mount --rbind /sys "$R/sys"',
                  # chroot changes to /: go back to the caller's folder when the root has it.
                  'exec chroot "$R" /bin/sh -c \'cd "$0" 2>/dev/null || cd /; exec "$@"\' "$PWD" '
                  '/usr/bin/env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"']
        return "\n".join(lines) + "\n"

    @property
    def _inroot(self) -> list[str]:
        return [shutil.which("unshare") or "/usr/bin/unshare", "-m", "--propagation", "private",
                str(self.bin_dir / "inroot")]

    def _write_files(self) -> bool:
        """Directories, the munge and JWT keys (once), the wrappers and slurm.conf. Returns
        whether slurm.conf changed."""
        uid, gid = _root_user(self.root, SLURM_USER)
        # Its parents may be private: the daemons reach it through DAEMON_VIEW (see _inroot_script).
        for p in (self.workdir, self.bin_dir, self.munge_dir, self.etc_dir, self.ctld_dir,
                  self.state_dir, self.rest_dir, self.nodes_dir):
            p.mkdir(parents=True, exist_ok=True)
            os.chmod(p, 0o755)
        for p in (self.ctld_dir, self.state_dir):
            os.chown(p, uid, gid)
        for key, size in ((self.munge_key, 1024), (self.jwt_key_path, 32)):
            if not key.exists():
                tmp = key.with_suffix(".tmp")
                tmp.write_bytes(os.urandom(size))
                os.chmod(tmp, 0o600)
                tmp.rename(key)
        os.chown(self.jwt_key_path, uid, gid)  # slurmctld (SlurmUser) reads it
        script = self.bin_dir / "inroot"
        script.write_text(self._inroot_script())
        os.chmod(script, 0o755)
        for tool in TOOLS:
            w = self.bin_dir / tool
            w.write_text("#!/bin/sh\n# Generated by LocalSlurm: the Slurm root's tool.\n"
                         f"exec {' '.join(map(shlex.quote, self._inroot))} {tool} \"$@\"\n")
            os.chmod(w, 0o755)
        changed = False
        files = {**self.operator_files(), "slurm.conf": self.slurm_conf()}
        for name, text in files.items():  # next to slurm.conf, as the operator mounts them in /etc/slurm
            path = self.etc_dir / name
            if (path.read_text() if path.exists() else None) != text:
                path.write_text(text)
                os.chmod(path, 0o644)
                changed = True
        return changed

    # ------------------------------------------------------------------ nodes (specs)

    def _spec_path(self, name: str) -> Path:
        return self.node_dir(name) / "node.json"

    def node_spec(self, name: str) -> NodeSpec | None:
        try:
            return NodeSpec(**json.loads(self._spec_path(name).read_text()))
        except FileNotFoundError:
            return None

    def _save_spec(self, spec: NodeSpec) -> None:
        self.node_dir(spec.name).mkdir(parents=True, exist_ok=True)
        tmp = self._spec_path(spec.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(spec), indent=1))
        tmp.rename(self._spec_path(spec.name))

    def _specs(self) -> list[NodeSpec]:
        if not self.nodes_dir.exists():
            return []
        out = []
        for d in sorted(self.nodes_dir.iterdir()):
            s = self.node_spec(d.name)
            if s is not None:
                out.append(s)
        return out

    def wanted_nodes(self) -> list[str]:
        """Nodes started and not stopped (their slurmd should run)."""
        return [s.name for s in self._specs() if s.wanted]

    # ------------------------------------------------------------------ daemons

    def _slurmd(self, spec: NodeSpec) -> _Daemon:
        # The operator's --conf for the NodeSet (features, GRES); where it listens is this machine's business.
        conf = f"NodeAddr=127.0.0.1 Port={spec.port} {spec.conf or 'Features=' + spec.nodeset}"
        return _Daemon(
            f"slurmd:{spec.name}",
            ["/usr/sbin/slurmd", "-D", "-Z", "-N", spec.name,
             "--conf-server", f"127.0.0.1:{self.ctld_port}", "--conf", conf,
             "-L", str(self.node_log(spec.name))],
            lambda: _is_up(self._node_states_now().get(spec.name, "")), f"node {spec.name} up in sinfo",
            (self.node_log(spec.name), self.ctld_log), (spec.port,),
        )

    def _daemons(self, with_nodes: bool = True) -> list[_Daemon]:
        conf = str(self.daemon_conf)  # they read it as slurm / slurmrest
        ds = [
            _Daemon("munged",
                    ["/usr/sbin/munged", "-F", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={self.munge_key}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                     f"--log-file={self.munge_dir / 'munged.log'}",
                     f"--seed-file={self.munge_dir / 'munged.seed'}", "--num-threads=10"],
                    self._munge_ok, "its socket to answer", (self.munge_dir / "munged.log",)),
            _Daemon("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", conf], self._ctld_ok,
                    "`scontrol ping` to report it UP", (self.ctld_log,), (self.ctld_port,), (("SLURM_CONF", conf),)),
            _Daemon("slurmrestd",
                    ["/usr/sbin/slurmrestd", "-f", conf, "-u", REST_USER, "-g", REST_USER,
                     "-a", "rest_auth/jwt", f"127.0.0.1:{self.rest_port}"],
                    self.rest_ok, f"slurmrestd to answer on {self.rest_url}", (), (self.rest_port,),
                    (("SLURM_CONF", conf), ("SLURM_JWT", "daemon"))),
        ]
        ds += self._accounting_daemons()
        if with_nodes:
            ds += [self._slurmd(s) for s in self._specs() if s.wanted]
        return ds

    def _daemon(self, name: str) -> _Daemon:
        if name.startswith("slurmd:"):
            spec = self.node_spec(name.split(":", 1)[1])
            if spec is None:
                raise KeyError(name)
            return self._slurmd(spec)
        for d in self._daemons(with_nodes=False):
            if d.name == name:
                return d
        raise KeyError(name)

    def _proc(self, d: _Daemon) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(d.env)
        def health() -> bool:  # the supervisor's wait for it looks here: a cancel ends the wait
            self._check_cancel()
            return d.health()
        return Proc(d.name, [*self._inroot, *d.argv], health, url=d.what, ports=d.ports, env=env, cwd=Path("/"))

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("the local Slurm's caller cancelled")

    def _running(self, d: _Daemon) -> int | None:
        return self.supervisor.pid(d.name)

    def _ensure(self, ds: Sequence[_Daemon]) -> None:
        """Start those not running and wait until all answer; a failure names the daemon with the tails of
        its own logs."""
        try:
            self.supervisor.ensure([self._proc(d) for d in ds])
        except SupervisorError as e:
            failed = next((d for d in sorted(ds, key=lambda d: -len(d.name)) if str(e).startswith(d.name)), None)
            tails = "".join(f"\n--- {p} (tail)\n{_tail(p)}" for p in (failed.logs if failed else ()))
            raise LocalSlurmError(f"{e}{tails}") from None

    def _stop(self, ds: Sequence[_Daemon], grace: float = 10.0) -> None:
        self.supervisor.stop([d.name for d in ds], grace)

    def _node_states_now(self, max_age: float = 0.2) -> dict[str, str]:
        """sinfo's states, read at most every `max_age` s (one read answers the health of every slurmd)."""
        at, states = self._states
        if time.monotonic() - at > max_age:
            try:
                states = self.node_states()
            except (LocalSlurmError, subprocess.TimeoutExpired):
                states = {}
            self._states = (time.monotonic(), states)
        return states

    def run(self, argv: Sequence[str], *, timeout: float = 30, check: bool = False,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command (scontrol, squeue, sbatch, ...) inside the root against this cluster. Raises
        :class:`Cancelled` when `cancel` is set before it starts or by the time it ends (the stop that set it
        may have killed it)."""
        self._check_cancel()
        r = subprocess.run([*self._inroot, *argv], env=self.env(), capture_output=True, text=True,
                           timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)
        self._check_cancel()
        if check and r.returncode != 0:
            raise LocalSlurmError(f"{shlex.join(argv)} (in the Slurm root) failed ({r.returncode}): "
                                  f"{(r.stderr or r.stdout).strip()}")
        return r

    def _munge_ok(self) -> bool:
        if not self.munge_socket.exists():
            return False
        try:
            r = self.run(["sh", "-c", f"munge -n -S {self.munge_socket} | unmunge -S {self.munge_socket}"],
                         timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def _ctld_ok(self) -> bool:
        try:
            r = self.run(["scontrol", "ping"], timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and " is UP" in r.stdout

    def rest_ok(self) -> bool:
        """Whether slurmrestd answers a ping with a valid token."""
        import httpx

        try:
            r = httpx.get(f"{self.rest_url}/slurm/v0.0.45/ping/", timeout=5,
                          headers={"X-SLURM-USER-TOKEN": self.token(lifetime_s=60)})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def node_states(self) -> dict[str, str]:
        """Slurm node name -> sinfo's long state, lower-case (e.g. "idle", "drained", "down*")."""
        r = self.run(["sinfo", "-N", "-h", "-o", "%N %T"], timeout=15)
        if r.returncode != 0:
            raise LocalSlurmError(f"sinfo failed: {r.stderr.strip()}")
        out: dict[str, str] = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out[parts[0]] = parts[1].lower()
        return out

    def node_info(self) -> dict[str, dict]:
        """Slurm node name -> its record as `scontrol --json show nodes` gives it (state list,
        reason, comment, ...)."""
        r = self.run(["scontrol", "--json", "show", "nodes"], timeout=15)
        if r.returncode != 0:
            raise LocalSlurmError(f"scontrol --json show nodes failed: {(r.stderr or r.stdout).strip()}")
        return {n["name"]: n for n in json.loads(r.stdout).get("nodes", [])}

    def node_names(self) -> list[str]:
        """The Slurm nodes slurmctld knows (started ones, including stopped but not deleted)."""
        r = self.run(["scontrol", "-o", "show", "nodes"], timeout=15)
        if r.returncode != 0:
            if "no nodes" in (r.stdout + r.stderr).lower():
                return []
            raise LocalSlurmError(f"scontrol show nodes failed: {r.stderr.strip()}")
        return sorted(line.split()[0].split("=", 1)[1] for line in r.stdout.splitlines()
                      if line.startswith("NodeName="))

    def nodes_up(self, names: Iterable[str] | None = None) -> bool:
        """Whether every wanted node's slurmd has registered and responds."""
        names = list(self.wanted_nodes() if names is None else names)
        if not names:
            return True
        try:
            states = self.node_states()
        except (LocalSlurmError, subprocess.TimeoutExpired):
            return False
        return all(_is_up(states.get(n, "")) for n in names)

    # ------------------------------------------------------------------ lifecycle

    def up(self, *, clean: bool = False) -> "LocalSlurm":
        """Start what is not running (munged, slurmctld, slurmrestd, the slurmd of every node
        started and not stopped) and wait until all answer. Idempotent. `clean=True` first
        stops everything and forgets slurmctld's saved state and the nodes."""
        if clean:
            self.down()
            shutil.rmtree(self.state_dir, ignore_errors=True)
            shutil.rmtree(self.nodes_dir, ignore_errors=True)
        changed = self._write_files()
        daemons = {d.name: d for d in self._daemons()}
        if changed:
            self._stop([d for name, d in daemons.items() if name not in ("munged", ACCOUNTING_DB)])
        order = ["munged", ACCOUNTING_DB, "slurmdbd", "slurmctld", "slurmrestd"]
        if ACCOUNTING_DB in daemons:
            self._init_accounting_db()
        for name in (n for n in order if n in daemons):  # each answers before the next starts
            self._ensure([daemons[name]])
        self._ensure([self._slurmd(s) for s in self._specs() if s.wanted])
        return self

    def start_node(self, name: str, nodeset: str, comment: Mapping | None = None,
                   drained_reason: str | None = None, conf: str = "", host: str = "") -> None:
        """Start a slurmd for Slurm node `name` in `nodeset` (as a NodeSet pod does), wait until
        it registered, then write `comment` (JSON, as the operator does) and, with
        `drained_reason`, drain it with that reason. For a node whose slurmd runs already only a
        changed comment is written. `conf`: the operator's slurmd --conf for the NodeSet (default
        `Features=<nodeset>`, what it gives a NodeSet without extraConf)."""
        if nodeset not in self.nodesets:
            raise ValueError(f"nodeset {nodeset!r} is in no partition ({self.nodesets})")
        old = self.node_spec(name)
        spec = NodeSpec(name, nodeset, old.port if old else free_port(), dict(comment or {}), drained_reason, conf=conf,
                        host=host)
        if old is not None and old.wanted and self._running(self._slurmd(old)) is not None:
            # Runs already: only a new comment is written (its drain is Slurm's business now).
            if comment is not None and dict(comment) != old.comment:
                self.scontrol("update", f"NodeName={name}", f"Comment={json.dumps(comment, separators=(',', ':'))}")
                self._save_spec(NodeSpec(name, old.nodeset, old.port, dict(comment), old.drained_reason, conf=old.conf,
                                         host=old.host))
            return
        self._save_spec(spec)
        (self.node_dir(name) / "spool").mkdir(parents=True, exist_ok=True)
        self._ensure([self._slurmd(spec)])
        args = ["update", f"NodeName={name}"]
        if comment is not None:
            args.append(f"Comment={json.dumps(comment, separators=(',', ':'))}")
        if drained_reason:
            args += ["State=DRAIN", f"Reason={drained_reason}"]
        if len(args) > 2:
            self.scontrol(*args)

    def stop_node(self, name: str, *, delete: bool = False) -> None:
        """What a NodeSet pod's preStop does: set the node DOWN with reason
        POD_TERMINATING_REASON (Slurm requeues or ends its jobs), then stop slurmd. With
        `delete`, also remove the node from Slurm (the NodeSet scaled in)."""
        spec = self.node_spec(name)
        if spec is None:
            raise KeyError(f"no node {name} was started here")
        if self._running(self._daemon("slurmctld")) is not None:
            self.run(["scontrol", "update", f"NodeName={name}", "State=DOWN",
                      f"Reason={POD_TERMINATING_REASON}"], timeout=15)
        spec.wanted = False
        self._save_spec(spec)
        self._stop([self._slurmd(spec)])
        self._kill_leftover_jobs(node=name)
        if delete:
            self.run(["scontrol", "delete", f"NodeName={name}"], timeout=15)

    def lose_node(self, name: str) -> None:
        """The machine under Slurm node `name` died: its slurmd is killed (SIGKILL), and with it everything the
        machine ran (its slurmstepds and its jobs' processes: here they share a host with the others, and a
        slurmd started again for the name would find a live slurmstepd and report its job, which a new machine
        never does); no preStop runs (no kubelet is left to run it). slurmctld then finds it silent and,
        SlurmdTimeout after its last answer, sets it DOWN with reason "Not responding" (slurm
        src/slurmctld/ping_nodes.c ping_nodes: set_node_down_ptr(node_ptr, "Not responding")); nothing here sets
        that: slurmctld does."""
        spec = self.node_spec(name)
        if spec is None:
            raise KeyError(f"no node {name} was started here")
        spec.wanted = False
        self._save_spec(spec)
        self.supervisor.stop([self._slurmd(spec).name], 0, sig=signal.SIGKILL)
        self._kill_leftover_jobs(node=name)

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon: "munged", "slurmctld", "slurmrestd" or "slurmd:NODE" (to test an
        outage; the node stays wanted). `up()` starts it again."""
        self._stop([self._daemon(name)])

    def down(self, *, cancel_jobs: bool = True) -> None:
        """Stop every daemon (slurmds, slurmrestd, slurmctld, munged). Started nodes stay
        wanted: the next `up()` starts their slurmd again. With `cancel_jobs` (default) the
        jobs still running are cancelled first. Idempotent."""
        if not self.workdir.exists() or not (self.bin_dir / "inroot").exists():
            return
        if cancel_jobs and self._running(self._daemon("slurmctld")) is not None:
            try:
                self._cancel_all_jobs(timeout=KILL_WAIT + 5)
            except (LocalSlurmError, subprocess.TimeoutExpired, OSError):
                pass
        daemons = {d.name: d for d in self._daemons()}
        self._stop([d for n, d in daemons.items() if n.startswith("slurmd:")])
        for name in ("slurmrestd", "slurmctld", "slurmdbd", ACCOUNTING_DB, "munged"):  # the slurmds first
            if name in daemons:
                self._stop([daemons[name]])
        self._kill_leftover_jobs()

    def _cancel_all_jobs(self, timeout: float) -> None:
        active = "running,completing,suspended,configuring,stopped,pending"
        r = self.run(["squeue", "-h", "-t", active, "-o", "%i"], timeout=10)
        ids = r.stdout.split() if r.returncode == 0 else []
        if not ids:
            return
        self.run(["scancel", *ids], timeout=10)

        def gone() -> bool:
            r = self.run(["squeue", "-h", "-t", active, "-o", "%i"], timeout=10)
            return r.returncode != 0 or not r.stdout.strip()

        wait_for("the cancelled jobs to end", gone, timeout, interval=0.2)  # TimeoutError: the caller goes on

    def _kill_leftover_jobs(self, node: str | None = None) -> int:
        """A stopped slurmd leaves its slurmstepds and their jobs running. Kill this cluster's (of `node` only, if
        given): slurmstepds holding a file of a node of ours open (each keeps its node's slurmd.log; slurmstepd
        starts with an empty environment, so nothing there names the node), and job processes whose SLURM_CONF is
        one of ours (slurmd's configless cache under the node's folder, or the cluster's slurm.conf)."""
        mine = f"{self.workdir}/nodes/{node}/" if node else f"{self.workdir}/nodes/"
        conf = f"SLURM_CONF={self.conf_path}".encode()
        skip = {os.getpid(), os.getppid()}
        killed = 0
        for _ in range(5):
            found = 0
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in skip:
                    continue
                try:
                    cmd = (entry / "cmdline").read_bytes()
                    if cmd.startswith(b"slurmstepd"):
                        ours = any(mine in f for f in _open_files(entry))
                    else:
                        environ = (entry / "environ").read_bytes().split(b"\0")
                        ours = any(v.startswith(b"SLURM_JOB_ID=") for v in environ) and any(
                            v.startswith(b"SLURM_CONF=") and (mine.encode() in v or (node is None and v == conf))
                            for v in environ)
                except OSError:
                    continue
                if not ours:
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
        """{"daemons": {name: pid or None}, "controller": bool, "rest": bool, "nodes":
        {name: sinfo state} or None, "conf": path, "rest_url": url}."""
        if not (self.bin_dir / "inroot").exists():
            return {"daemons": {}, "controller": False, "rest": False, "nodes": None,
                    "conf": str(self.conf_path), "rest_url": self.rest_url}
        daemons = {d.name: self._running(d) for d in self._daemons()}
        ctld_up = daemons.get("slurmctld") is not None and self._ctld_ok()
        nodes = None
        if ctld_up:
            try:
                nodes = self.node_states()
            except (LocalSlurmError, subprocess.TimeoutExpired):
                nodes = None
        rest = daemons.get("slurmrestd") is not None and self.rest_ok()
        return {"daemons": daemons, "controller": ctld_up, "rest": rest, "nodes": nodes,
                "conf": str(self.conf_path), "rest_url": self.rest_url}

    def healthy(self) -> bool:
        st = self.status()
        return (bool(st["daemons"]) and all(v is not None for v in st["daemons"].values())  # type: ignore[union-attr]
                and bool(st["controller"]) and bool(st["rest"]) and self.nodes_up())

    # ------------------------------------------------------------------ accounting (slurmdbd and its database)

    def _acct_ports(self) -> dict[str, int] | None:
        """{"dbd": slurmdbd's port, "db": the database's}, chosen once by apply_accounting; None without accounting."""
        try:
            return json.loads((self.acct_dir / "ports.json").read_text())
        except FileNotFoundError:
            return None

    @property
    def accounting(self) -> bool:
        """Whether this Slurm runs accounting (an Accounting was applied)."""
        return (self.acct_dir / "slurmdbd.operator.conf").exists()

    def apply_accounting(self, dbd_conf: str, db: AccountingDb) -> bool:
        """The operator's slurmdbd.conf for the Accounting (localenv/slinky_conf.py slurmdbd_conf) and what its
        database needs: from now on `up()` runs the database stand-in and slurmdbd before slurmctld, and
        slurm.conf's AccountingStorage lines point at this slurmdbd. Returns whether anything changed; then
        slurmdbd (and the database, for a new user or password) restart with it."""
        self.acct_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.acct_dir, 0o755)
        if self._acct_ports() is None:
            from localenv.ports import free_ports

            dbd, dbp = free_ports(2)
            (self.acct_dir / "ports.json").write_text(json.dumps({"dbd": dbd, "db": dbp}))
        want = {"slurmdbd.operator.conf": dbd_conf, "db.json": json.dumps(asdict(db))}
        old = {n: (self.acct_dir / n).read_text() if (self.acct_dir / n).exists() else None for n in want}
        if old == want:
            return False
        for name, text in want.items():  # both hold the password: root only
            tmp = self.acct_dir / f".{name}.tmp"
            tmp.write_text(text)
            os.chmod(tmp, 0o600)
            tmp.rename(self.acct_dir / name)
        names = ["slurmdbd"] + ([ACCOUNTING_DB] if old["db.json"] != want["db.json"] else [])
        self._stop([d for d in self._daemons(with_nodes=False) if d.name in names])
        self.up()
        return True

    def _accounting_db(self) -> AccountingDb:
        return AccountingDb(**json.loads((self.acct_dir / "db.json").read_text()))

    def _dbd_conf(self) -> str:
        """slurmdbd.conf: the operator's, where it runs replaced (slinky_conf.LOCAL_DBD_KEYS)."""
        from localenv.slinky_conf import LOCAL_DBD_KEYS, localize

        v, ports = self.daemon_path, self._acct_ports() or {}
        return localize((self.acct_dir / "slurmdbd.operator.conf").read_text(), {
            "DbdHost": "localhost", "DbdPort": str(ports["dbd"]),
            "StorageHost": "127.0.0.1", "StoragePort": str(ports["db"]),
            "AuthType": "auth/munge", "AuthInfo": f"socket={MUNGE_SOCKET_IN_ROOT}",
            "AuthAltParameters": f"jwt_key={v(self.jwt_key_path)}",
            "LogFile": str(v(self.acct_dir / "dbd" / "slurmdbd.log")),
        }, LOCAL_DBD_KEYS)

    def _write_accounting_files(self) -> None:
        """slurmdbd.conf (mode 0600, the SlurmUser's: slurmdbd refuses others), its log folder, and the SQL the
        database runs at each start: the storage user with its password and rights on its database (what a
        platform team sets up for an external database, and the mariadb image's MARIADB_USER/PASSWORD do)."""
        uid, gid = _root_user(self.root, SLURM_USER)
        (self.acct_dir / "dbd").mkdir(exist_ok=True)
        os.chown(self.acct_dir / "dbd", uid, gid)
        tmp = self.dbd_conf_path.with_suffix(".tmp")
        tmp.write_text(self._dbd_conf())
        os.chmod(tmp, 0o600)
        os.chown(tmp, uid, gid)
        tmp.rename(self.dbd_conf_path)
        db = self._accounting_db()
        q = lambda text: text.replace("\\", "\\\\").replace("'", "\\'")  # noqa: E731 - SQL string literal
        who = f"'{q(db.user)}'@'127.0.0.1'"
        sql = (f"CREATE DATABASE IF NOT EXISTS `{db.database.replace('`', '``')}`;\n"
               f"CREATE USER IF NOT EXISTS {who} IDENTIFIED BY '{q(db.password)}';\n"
               f"ALTER USER {who} IDENTIFIED BY '{q(db.password)}';\n"
               f"GRANT ALL ON `{db.database.replace('`', '``')}`.* TO {who};\n")
        muid, mgid = _root_user(self.root, DB_USER)
        init = self.acct_dir / "init.sql"
        tmp = init.with_suffix(".tmp")
        tmp.write_text(sql)
        os.chmod(tmp, 0o600)
        os.chown(tmp, muid, mgid)
        tmp.rename(init)

    def _init_accounting_db(self) -> None:
        """The database's data folder, made once (mariadb-install-db), and this start's files."""
        self._write_accounting_files()
        data = self.acct_dir / "db"
        if not (data / "mysql").is_dir():
            shutil.rmtree(data, ignore_errors=True)
            self.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.daemon_path(data)}", f"--user={DB_USER}",
                      "--auth-root-authentication-method=socket", "--skip-test-db"], timeout=180, check=True)

    def _accounting_daemons(self) -> list[_Daemon]:
        """The database stand-in (MariaDB) and slurmdbd, when an Accounting was applied."""
        ports = self._acct_ports()
        if not self.accounting or ports is None:
            return []
        v, a = self.daemon_path, self.acct_dir
        conf = str(self.daemon_conf)  # slurmdbd reads slurmdbd.conf next to it
        return [
            _Daemon(ACCOUNTING_DB,
                    ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={v(a / 'db')}", f"--user={DB_USER}",
                     f"--socket={v(a / 'db' / 'mysqld.sock')}", f"--port={ports['db']}", "--bind-address=127.0.0.1",
                     "--skip-name-resolve", f"--pid-file={v(a / 'db' / 'mariadbd.pid')}",
                     f"--init-file={v(a / 'init.sql')}", "--innodb-buffer-pool-size=16M"],
                    lambda: _port_open(ports["db"]), f"the accounting database on 127.0.0.1:{ports['db']}",
                    (), (ports["db"],)),
            _Daemon("slurmdbd", ["/usr/sbin/slurmdbd", "-D"], lambda: _port_open(ports["dbd"]),
                    f"slurmdbd on 127.0.0.1:{ports['dbd']}", (a / "dbd" / "slurmdbd.log",), (ports["dbd"],),
                    (("SLURM_CONF", conf),)),
        ]

    # ------------------------------------------------------------------ helpers

    def scontrol(self, *args: str, timeout: float = 15, user: str | None = None) -> str:
        """Run scontrol against this cluster; returns stdout, raises on failure. `user`: as that user of the root
        (Slurm records them as the sender, e.g. as who set a node's reason), not root."""
        return self.run([*self.as_user(user), "scontrol", *args], timeout=timeout, check=True).stdout

    def as_user(self, user: str | None) -> list[str]:
        """The prefix that runs a command in the root as `user` (nothing for root), with slurm.conf where every
        user reaches it (the daemons' view: the work directory may be its owner's only)."""
        if user in (None, "root"):
            return []
        return ["runuser", "-u", str(user), "--", "env", f"SLURM_CONF={self.daemon_conf}"]

    def set_node_state(self, name: str, state: str, reason: str | None = None, user: str | None = None) -> None:
        """`scontrol update NodeName=name State=state [Reason=reason]`, as `user` (default root)."""
        args = ["update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            args.append(f"Reason={reason}")
        self.scontrol(*args, user=user)

    def reset(self, timeout: float = 30) -> None:
        """Back to the started state, for tests sharing one cluster: cancel every job, start
        again the nodes that were started (and stopped since), give each its comment back,
        drain those started drained with their reason, resume the others; wait until no
        job is left and every node is up."""
        r = self.run(["squeue", "-h", "-o", "%i"], timeout=15)
        ids = r.stdout.split()
        if ids:
            self.run(["scancel", *ids], timeout=15)
        specs = self._specs()
        for s in specs:
            if not s.wanted:
                self.start_node(s.name, s.nodeset, s.comment, s.drained_reason)
        self.up()
        states = self.node_states()
        for s in specs:
            st = states.get(s.name, "")
            self.scontrol("update", f"NodeName={s.name}", f"Comment={json.dumps(s.comment, separators=(',', ':'))}")
            if s.drained_reason:
                self.set_node_state(s.name, "DRAIN", s.drained_reason)
            elif any(x in st for x in ("drain", "down", "fail")):
                self.set_node_state(s.name, "RESUME")

        def settled() -> bool:
            if self.run(["squeue", "-h", "-o", "%i %T"], timeout=15).stdout.strip() or not self.nodes_up():
                return False
            states = self.node_states()
            return all(("drain" in states.get(s.name, "")) == bool(s.drained_reason) for s in specs)

        try:
            wait_for("no job left and every node up", settled, timeout, interval=0.2,
                     explain=lambda: f"jobs {self.run(['squeue', '-h', '-o', '%i %T'], timeout=15).stdout.strip()!r}, "
                                     f"nodes {self.node_states()}")
        except TimeoutError as e:
            raise LocalSlurmError(f"reset: {e}") from None

    def sbatch(self, *args: str, timeout: float = 15) -> int:
        """Submit a batch job (`sbatch --parsable ARGS` in the root); returns the job id."""
        r = self.run(["sbatch", "--parsable", *args], timeout=timeout)
        if r.returncode != 0:
            raise LocalSlurmError(f"sbatch {' '.join(args)}: {r.stderr.strip()}")
        return int(r.stdout.strip().split(";")[0])

    def __enter__(self) -> "LocalSlurm":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
