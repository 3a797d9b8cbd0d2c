"""Shared helpers for the benchmarks: fleets, a private control plane, the reconciler as a
host process, process statistics from /proc, percentiles and tables.

Everything here talks only to loopback (the local control plane, local Slurm), and every
wait is bounded by a timeout.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fleetspec import labels, parse_fleet, remediation_crd  # noqa: E402
from gpufleet import waiting  # noqa: E402
from fleetspec.models import FleetSpec  # noqa: E402

PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- output ---------------------------------------------------------------------------------------

def exit_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) ends the script through its `finally` blocks, so whatever it
    started (control plane, Slurm, reconciler) is torn down."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def say(msg: str) -> None:
    """A progress line, on stderr: stdout carries only the result (tables, or JSON with --json)."""
    print(f"{datetime.now().strftime('%H:%M:%S')} [load {load():.2f}] {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return os.getloadavg()[0]


def machine() -> str:
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {mem} GiB, Python {platform.python_version()}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (pastes into bench/README.md as is)."""
    rows = [[_cell(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


@dataclass
class Table:
    """One result table: printed as Markdown, or one entry of the --json document (rows keyed by
    column). `notes` are the lines printed under it."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    notes: Sequence[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [self.title, "", table(self.columns, self.rows)]
        return "\n".join(out + ([""] + list(self.notes) if self.notes else []))

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [dict(zip(self.columns, r)) for r in self.rows], "notes": list(self.notes)}


def add_json_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="machine output: one JSON document (each table's rows keyed by column, and every "
                         "measurement under 'raw') on stdout instead of the tables; with FILE, written there "
                         "and the tables printed as usual")


def parse_bench_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None, bench: str) -> tuple[argparse.Namespace, "Output"]:
    """The options every script that starts an environment shares (`--root`, `--keep`, `--json`), then
    parse; returns the arguments and where the result goes. A SIGTERM from here on tears down too."""
    ap.add_argument("--root", type=Path, help="work folder (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="leave the work folder (logs) in place")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output(bench, a.json)
    exit_on_sigterm()
    return a, out


class Output:
    """Where a script's result goes (stdout: tables, or JSON with `--json`). Made at the start: with
    JSON on stdout, anything else printed meanwhile is sent to stderr, so stdout parses."""

    def __init__(self, bench: str, json_arg: str | None):
        self.bench, self.json_arg = bench, json_arg
        self.stdout = sys.stdout
        if json_arg == "-":
            sys.stdout = sys.stderr

    def emit(self, tables: Sequence[Table], raw: Any = None, **meta: Any) -> None:
        doc = {"bench": self.bench, "argv": sys.argv[1:], "machine": machine(),
               "date": datetime.now().isoformat(timespec="seconds"), **meta, "tables": [t.as_dict() for t in tables], "raw": raw}
        text = json.dumps(doc, indent=2, default=str)
        if self.json_arg == "-":
            sys.stdout = self.stdout
            print(text, flush=True)
            return
        if self.json_arg:
            Path(self.json_arg).write_text(text + "\n")
        for t in tables:
            print(file=self.stdout)
            print(t.markdown(), file=self.stdout, flush=True)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def pct(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100), linear interpolation between closest ranks."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# --- /proc --------------------------------------------------------------------------------------

def proc_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of the process (all its threads), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _ppid_map() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(d)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def tree_pids(root: int) -> list[int]:
    parents = _ppid_map()
    kids: dict[int, list[int]] = {}
    for pid, pp in parents.items():
        kids.setdefault(pp, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


class TreeSampler:
    """Samples the summed VmRSS of a process tree every `every` seconds (peak kept)."""

    def __init__(self, pid: int, every: float = 0.1):
        self.pid, self.every = pid, every
        self.peak_kib = 0
        self.peak_single_kib = 0
        self.peak_single_name = ""
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in tree_pids(self.pid):
                rss = proc_rss_kib(p) or 0
                total += rss
                if rss > self.peak_single_kib:
                    self.peak_single_kib = rss
                    try:
                        self.peak_single_name = Path(f"/proc/{p}/comm").read_text().strip()
                    except OSError:
                        pass
            self.peak_kib = max(self.peak_kib, total)
            self._stop.wait(self.every)


# --- fleets -------------------------------------------------------------------------------------

def pool_doc(name: str, nodes: int, spares: int, provider: str = "kubernetes-spares", cpus: int = 2) -> dict:
    return {"name": name, "node_type": "kwok-gpu", "gpu_model": "H100-SXM5-80GB", "gpus_per_node": 8,
            "cpus_per_node": cpus, "memory_per_node": "16Gi", "nodes": nodes, "spares": spares,
            "provider": provider, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}


def fleet_doc(pools: list[dict], healing: dict | None = None, storage: list[dict] | None = None,
              environment: str = "bench") -> dict:
    return {
        "environment": environment,
        "cluster": {"kind": "local"},
        "pools": pools,
        "storage": storage or [],
        "slurm": {"operator": {"mode": "crds-only"},
                  "partitions": [{"name": p["name"], "pools": [p["name"]], "default": i == 0}
                                 for i, p in enumerate(pools)]},
        "healing": healing or {},
    }


def make_spec(pools: list[dict], healing: dict | None = None, storage: list[dict] | None = None) -> FleetSpec:
    return parse_fleet(fleet_doc(pools, healing, storage), source="bench")


def write_policy(spec: FleetSpec, path: Path) -> Path:
    """The policy exactly as the stack renders it into the gpufleet-policy ConfigMap."""
    path.write_text(spec.model_dump_json(indent=2))
    return path


# --- a private control plane --------------------------------------------------------------------

def new_kube(workdir: Path, progress: Callable[[str], None] | None = None):
    from localenv.control_plane import DEFAULT_PORTS, LocalKube
    from localenv.slurm import free_ports
    from gpufleet.paths import TOOLS_BIN

    ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS))))
    return LocalKube(workdir, TOOLS_BIN, **{f"{k}_port": v for k, v in ports.items()},
                     etcd_unsafe_no_fsync=True, progress=progress)


def install_crd_and_namespace(api, namespace: str = "gpufleet-system", timeout: float = 60) -> None:
    """What `pulumi up` installs that the reconciler needs: the Remediation CRD and its namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(remediation_crd.manifest())
    except ApiException as e:
        if e.status != 409:
            raise
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.CustomObjectsApi(api).list_cluster_custom_object(labels.GROUP, remediation_crd.VERSION,
                                                                    remediation_crd.PLURAL)
            return
        except ApiException:
            time.sleep(0.3)
    raise TimeoutError("the Remediation kind was not served in time")


def create_nodes(kubeconfig: Path, manifests: list[dict], concurrency: int = 8, timeout: float = 1800,
                 progress: Callable[[str], None] = say) -> float:
    """Create Node objects in parallel (one API client per worker thread). Returns seconds taken."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    local = threading.local()

    def core():
        if not hasattr(local, "core"):
            local.core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        return local.core

    done = [0]
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(m: dict) -> None:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("node creation took too long")
        for attempt in range(5):
            try:
                core().create_node(m, _preload_content=False, _request_timeout=30)
                break
            except ApiException as e:
                if e.status == 409:
                    break
                if attempt == 4 or e.status not in (429, 500, 503, 504):
                    raise
                time.sleep(0.5 * (attempt + 1))
        with lock:
            done[0] += 1
            if done[0] % 500 == 0:
                progress(f"  created {done[0]}/{len(manifests)} nodes ({time.monotonic() - t0:.0f}s)")

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for f in [ex.submit(one, m) for m in manifests]:
            f.result()
    return time.monotonic() - t0


def list_nodes_raw(api) -> list[dict]:
    from kubernetes import client

    resp = client.CoreV1Api(api).list_node(_preload_content=False, _request_timeout=60)
    return json.loads(resp.data)["items"]


def is_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def wait_all_ready(api, expected: int, timeout: float = 600, progress: Callable[[str], None] = say,
                   min_fraction: float = 1.0) -> int:
    """Wait until `expected` nodes are Ready, or at least `min_fraction` of them on two checks in a row
    (at 10,000 kwok nodes on 2 cores a few leases expire now and then, and those nodes flap). Returns
    how many were Ready."""
    t0 = time.monotonic()
    last, enough_before = -1, False
    while time.monotonic() - t0 < timeout:
        nodes = list_nodes_raw(api)
        ready = sum(1 for n in nodes if is_ready(n))
        if ready >= expected:
            return ready
        enough = ready >= expected * min_fraction
        if enough and enough_before:
            progress(f"  {ready}/{expected} nodes Ready: going on (at least {min_fraction:.1%})")
            return ready
        enough_before = enough
        if ready != last and ready // 500 != last // 500:
            progress(f"  {ready}/{expected} nodes Ready")
        last = ready
        time.sleep(2)
    raise TimeoutError(f"only {last}/{expected} nodes Ready after {timeout:.0f}s")


CORDONED = "spec.unschedulable=true"


class NodeWatcher:
    """Watches the cordoned nodes (raw JSON, `fieldSelector=spec.unschedulable=true`) in a thread;
    records when each node was first seen cordoned after `arm()`, on this host's clock. The API server
    filters: kwok's heartbeats of every other node never reach this process, so its own lag stays
    out of the figures."""

    def __init__(self, kubeconfig: Path):
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.cordoned_at: dict[str, float] = {}  # first seen cordoned since arm()
        self.cordoned_before: set[str] = set()  # cordoned at arm() and not uncordoned since
        self.cordoned_now: set[str] = set()  # in the selector now
        self.stop = threading.Event()
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self._t = threading.Thread(target=self._run, daemon=True, name="bench-node-watch")

    def start(self) -> "NodeWatcher":
        self._t.start()
        if not self.synced.wait(120):
            raise TimeoutError("bench node watch did not sync")
        return self

    def close(self) -> None:
        self.stop.set()
        self._t.join(timeout=10)

    def arm(self) -> None:
        """Forget what was cordoned so far: later cordons are recorded."""
        with self.lock:
            self.cordoned_before = set(self.cordoned_now)
            self.cordoned_at = {}

    def _see(self, node: dict) -> None:
        name = node["metadata"]["name"]
        with self.lock:
            if (node.get("spec") or {}).get("unschedulable"):
                self.cordoned_now.add(name)
                if name not in self.cordoned_at and name not in self.cordoned_before:
                    self.cordoned_at[name] = time.time()
            else:
                self._left(name)

    def _left(self, name: str) -> None:
        """Uncordoned (it left the selector): a later cordon counts again."""
        self.cordoned_now.discard(name)
        self.cordoned_before.discard(name)

    def _run(self) -> None:
        follow_nodes(self.api, self.stop, self._listed, self._event, CORDONED)

    def _listed(self, items: list[dict]) -> None:
        with self.lock:
            self.cordoned_now = {n["metadata"]["name"] for n in items if (n.get("spec") or {}).get("unschedulable")}
            self.cordoned_before = set(self.cordoned_now) - set(self.cordoned_at)
        self.synced.set()

    def _event(self, kind: str, node: dict) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._see(node)
        elif kind == "DELETED":  # left the selector: uncordoned (or deleted)
            with self.lock:
                self._left(node["metadata"]["name"])


def follow_nodes(api, stop: threading.Event, on_list: Callable[[list[dict]], None],
                 on_event: Callable[[str, dict], None], field_selector: str | None = None) -> None:
    """List the nodes (raw JSON), then watch from that version until `stop`, listing again after an
    error or an expired version: the benches' own node watches (not the reconciler's informer)."""
    from kubernetes import client, watch

    core = client.CoreV1Api(api)
    selector = {"field_selector": field_selector} if field_selector else {}
    version = ""
    while not stop.is_set():
        try:
            if not version:
                data = json.loads(core.list_node(**selector, _preload_content=False, _request_timeout=60).data)
                on_list(data["items"])
                version = data["metadata"]["resourceVersion"]
            w = watch.Watch()
            for ev in w.stream(core.list_node, **selector, resource_version=version, deserialize=False,
                               timeout_seconds=30, allow_watch_bookmarks=True):
                obj = ev.get("raw_object") or ev["object"]
                if ev["type"] == "ERROR":
                    version = ""
                    break
                version = obj["metadata"].get("resourceVersion", version)
                on_event(ev["type"], obj)
                if stop.is_set():
                    break
            w.stop()
        except Exception:  # noqa: BLE001 - list again
            version = ""
            stop.wait(0.5)


def json_lines(path: Path) -> list[dict]:
    """The JSON objects of a log or events file, a line each; other lines (a line being written, a
    supervisor's note) are skipped: the reader the previews use for the engine's event log."""
    from gpufleet.preview import parse_events

    return parse_events(path.read_text(errors="replace"))


# --- the reconciler as a host process --------------------------------------------------------------

class HostReconciler:
    """`python -m gpufleet reconcile` in the background, like LocalEnv.start_reconciler, with a
    chosen Slurm backend and metrics port. Stopped (SIGTERM, then SIGKILL) by `stop()`."""

    def __init__(self, kubeconfig: Path, policy: Path, log: Path, *, slurm: str = "none",
                 metrics_port: int = 0, env: dict[str, str] | None = None, local_dir: Path | None = None,
                 extra_args: Sequence[str] = (), profile: Path | None = None, count_calls: Path | None = None):
        run = [str(Path(__file__).with_name("_count_calls.py")), str(count_calls)] if count_calls else ["-m", "gpufleet"]
        argv = [PYTHON, *run, "reconcile", "--policy", str(policy), "--kubeconfig", str(kubeconfig),
                "--slurm", slurm, "--leader-elect", "--metrics-port", str(metrics_port), *extra_args]
        self.count_calls = count_calls
        self.profile = profile
        if profile is not None:
            # py-spy starts the reconciler as its child (attaching to a running process needs ptrace
            # rights this machine does not grant); SIGINT makes it write the profile.
            argv = [py_spy(), "record", "--rate", "50", "--format", "raw", "--threads", "--output", str(profile),
                    "--", *argv]
        e = {**os.environ, **(env or {})}
        if local_dir is not None:
            e["GPUFLEET_LOCAL_DIR"] = str(local_dir)
        self.log = log
        self.metrics_port = metrics_port
        self._f = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._f, stderr=self._f, stdin=subprocess.DEVNULL, env=e,
                                     cwd=str(REPO), start_new_session=True)

    @property
    def pid(self) -> int:
        """The reconciler's own pid (under py-spy: py-spy's child)."""
        if self.profile is None:
            return self.proc.pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            time.sleep(0.05)
        raise RuntimeError("py-spy did not start the reconciler")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the reconciler exited ({self.proc.returncode}); see {self.log}:\n"
                               + "\n".join(self.log.read_text(errors="replace").splitlines()[-15:]))

    def calls(self) -> dict[str, float]:
        """The reconciler's API and Slurm calls so far, by verb and resource (with `count_calls`)."""
        try:
            return json.loads(self.count_calls.read_text()) if self.count_calls else {}
        except (OSError, ValueError):
            return {}

    def metric(self, name: str, labels_: str = "") -> float | None:
        """One sample from /metrics (loopback), or None."""
        import urllib.request

        if not self.metrics_port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:  # noqa: S310
                text = r.read().decode()
        except OSError:
            return None
        want = f"{name}{{{labels_}}}" if labels_ else name
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return None

    def stop(self, timeout: float = 15) -> None:
        if self.profile is not None and self.proc.poll() is None:
            import signal

            child = self.pid
            try:
                os.kill(child, signal.SIGTERM)  # the reconciler stops; py-spy then writes the profile and exits
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._f.close()


def py_spy() -> str:
    """py-spy (a PyPI package) next to this Python, for `--profile`."""
    exe = Path(PYTHON).parent / "py-spy"
    if not exe.exists():
        raise SystemExit(f"--profile needs py-spy: {Path(PYTHON).parent / 'pip'} install py-spy")
    return str(exe)


def apiserver_requests(api) -> dict[tuple[str, str, str], float]:
    """The API server's own request counters (apiserver_request_total), summed by (verb, resource,
    subresource): the calls every client made, to count the reconciler's per remediation."""
    resp = api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
                        _request_timeout=30)
    data = resp[0].data.decode() if isinstance(resp, tuple) else resp.data.decode()
    out: dict[tuple[str, str, str], float] = {}
    for line in data.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_, value = line[len("apiserver_request_total{"):].rsplit("} ", 1)
        kv = dict(x.split("=", 1) for x in labels_.split(",") if "=" in x)
        key = tuple(kv.get(k, "").strip('"') for k in ("verb", "resource", "subresource"))
        out[key] = out.get(key, 0.0) + float(value)
    return out


def request_delta(before: dict, after: dict) -> dict[str, float]:
    """Requests between two `apiserver_requests` samples, as "VERB resource[/sub]" -> count."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d > 0:
            out[f"{k[0]} {k[1]}" + (f"/{k[2]}" if k[2] else "")] = d
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def free_port() -> int:
    from localenv.slurm import free_port as fp

    return fp()


def wait_for(fn: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """gpufleet.waiting.wait_for, in the argument order these scripts use."""
    return waiting.wait_for(what, fn, timeout, every)


def release_lease(api, namespace: str = "gpufleet-system", name: str = "gpufleet-reconciler") -> None:
    """Delete the leader Lease a stopped reconciler left behind (it does not release it on exit),
    so the next one leads at once instead of after the lease expires (15 s)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoordinationV1Api(api).delete_namespaced_lease(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise


def wait_leading(log: Path, timeout: float = 60, since: int = 0) -> None:
    """Wait for the reconciler's "leading" log line (written after byte offset `since`)."""
    def leading() -> bool:
        try:
            with open(log, "rb") as f:
                f.seek(since)
                return b'"leading (lease' in f.read()
        except OSError:
            return False
    wait_for(leading, timeout, f"the reconciler to lead (log {log})")


def teardown(stop: Callable[[], None], root: Path, keep: bool, own_root: bool, watcher: Any = None) -> None:
    """Close the watcher, stop the environment, and remove the run's folder unless it is to be kept."""
    say("tearing down")
    try:
        if watcher:
            watcher.close()
        stop()
    finally:
        if own_root and not keep:
            shutil.rmtree(root, ignore_errors=True)


def start_standin_for_the_spec(env) -> None:
    """The Slinky stand-in, acting on the spec's NodeSets (there is no stack here to declare the
    NodeSet resources it would otherwise wait for), as a process of its own like the operator."""
    env.stop_standin()
    env.start_standin(env.nodesets())
