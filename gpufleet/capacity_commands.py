"""`gpufleet capacity`: what each pool's GPUs are doing, and how much of them was lent.

The reconciler counts every pool into the lending ledger (ConfigMap `gpufleet-lending` in its
namespace, reconciler/core/ledger.py); this command reads it and the Nodes. Where the ledger has
no pool (the reconciler has not run yet, or the pool does not lend), the Nodes say what they can:
roles and the lent label; whether an active node is busy or idle only Slurm knows, so that is `?`.

Reading and counting are apart: `snapshot()` is pure over what `ClusterSource` read, so the tests
give it a fake cluster.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional, Protocol

import typer

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.console import EXIT_FAILED, EXIT_INVALID, _err, app, load_spec
from gpufleet.fleetspec import ledger as L

REFRESH_SECONDS = 2.0


def clock() -> datetime:
    return datetime.now(timezone.utc)


class Unreachable(RuntimeError):
    """The cluster did not answer (or refused): exit 1."""


class ClusterSource(Protocol):
    def nodes(self) -> list[dict]: ...

    def ledger_data(self) -> dict[str, str] | None:
        """The ledger ConfigMap's data; None when there is none (no pool lends, or not deployed yet)."""


@dataclass(frozen=True)
class PoolRow:
    pool: str
    source: str                         # "ledger" | "nodes"
    as_of: datetime | None              # when the reconciler counted it (ledger); None: just now (nodes)
    active_busy: int | None             # None: unknown without the ledger (Slurm's state)
    active_idle: int | None
    active_lent: int
    spares_lent: int
    spares_unlent: int
    quarantined: int
    gpus_lent: int
    gpu_hours_lent: float | None        # over the window; None: no ledger, no history


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    window: timedelta
    pools: tuple[PoolRow, ...]
    warnings: tuple[str, ...] = field(default=())


def parse_window(text: str) -> timedelta:
    """`90s`, `30m`, `24h`, `7d` -> a timedelta."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--window {text!r}: give a positive duration such as 90m, 24h or 7d")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
    return timedelta(**{unit: float(m.group(1))})


def _node_gpus(node: dict, default: int) -> int:
    status = node.get("status") or {}
    for where in (status.get("capacity") or {}, status.get("allocatable") or {}):
        try:
            return int(where["nvidia.com/gpu"])
        except (KeyError, TypeError, ValueError):
            pass
    try:
        return int(((node.get("metadata") or {}).get("labels") or {})[labels.GPU_COUNT])
    except (KeyError, TypeError, ValueError):
        return default


def count_nodes(spec: FleetSpec, nodes: list[dict]) -> dict[str, PoolRow]:
    """Per pool of the spec, what the Nodes alone show, counted as the reconciler counts them
    (`gpufleet.reconciler.core.lending.capacity`); busy and idle need Slurm, so they stay unknown."""
    from dataclasses import replace

    from gpufleet.reconciler.core.lending import PoolFacts, capacity
    from gpufleet.reconciler.core.faults import FaultReader
    from gpufleet.reconciler.core.observe import node_view

    faults = FaultReader.from_spec(spec.healing)
    views: dict[str, list] = {p.name: [] for p in spec.pools}
    for node in nodes:
        v = node_view(node, faults)
        if v.pool in views:
            views[v.pool].append(replace(v, gpus=_node_gpus(node, spec.pool(v.pool).gpus_per_node)))
    rows = {}
    for name, pool_views in views.items():
        c = capacity(PoolFacts(name, tuple(pool_views)))
        rows[name] = PoolRow(name, "nodes", None, None, None, c.active_lent, c.spares_lent, c.spares_unlent,
                             c.quarantined, c.gpus_lent, gpu_hours_lent=None)
    return rows


def from_ledger(pool: str, ledger: L.PoolLedger, now: datetime, window: timedelta) -> PoolRow:
    c = ledger.capacity
    return PoolRow(pool, "ledger", ledger.at, c.active_busy, c.active_idle, c.active_lent, c.spares_lent,
                   c.spares_unlent, c.quarantined, c.gpus_lent, L.gpu_hours(ledger.loans, now - window, now))


def snapshot(spec: FleetSpec, nodes: list[dict], ledger_data: dict[str, str] | None, now: datetime,
             window: timedelta) -> Snapshot:
    """Every pool of the spec (and any other pool the ledger holds), from the ledger where it has the
    pool, else from the Nodes. A pool whose ledger entry cannot be read is counted from the Nodes, with
    a warning naming what is wrong."""
    by_nodes = count_nodes(spec, nodes)
    warnings: list[str] = []
    ledgers: dict[str, L.PoolLedger] = {}
    for pool, text in sorted((ledger_data or {}).items()):
        try:
            ledgers[pool] = L.parse(text, pool)
        except L.LedgerError as e:
            warnings.append(f"{labels.LENDING_LEDGER}: {e}; pool {pool} counted from its Nodes")
    if window > L.KEEP and ledgers:
        warnings.append(f"the ledger keeps {L.KEEP.days} days of loans: GPU-hours cover at most that")
    names = [p.name for p in spec.pools] + sorted(set(ledgers) - {p.name for p in spec.pools})
    rows = tuple(from_ledger(n, ledgers[n], now, window) if n in ledgers else by_nodes[n] for n in names)
    return Snapshot(now, window, rows, tuple(warnings))


COLUMNS = ("POOL", "ACTIVE BUSY", "IDLE", "LENT", "SPARES LENT", "UNLENT", "QUARANTINED", "GPUS LENT",
           "GPU-H LENT", "AS OF")


def _n(v: int | None) -> str:
    return "?" if v is None else str(v)


def _window(w: timedelta) -> str:
    s = int(w.total_seconds())
    if s % 86400 == 0 and s > 2 * 86400:
        return f"{s // 86400}d"
    for unit, size in (("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def _age(row: PoolRow, now: datetime) -> str:
    if row.as_of is None:
        return "now (Nodes; no ledger)"
    s = max(0, int((now - row.as_of).total_seconds()))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def table_rows(snap: Snapshot) -> list[list[str]]:
    return [[r.pool, _n(r.active_busy), _n(r.active_idle), str(r.active_lent), str(r.spares_lent),
             str(r.spares_unlent), str(r.quarantined), str(r.gpus_lent),
             "?" if r.gpu_hours_lent is None else f"{r.gpu_hours_lent:.1f}", _age(r, snap.at)]
            for r in snap.pools]


def render(snap: Snapshot):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from rich import box

    # Fits an 80-column terminal: light rules, each header word kept whole (the window of GPU-H LENT is in the
    # title), and each pool's AS OF, which can be a note, on a line of its own below the table: nothing is cut.
    t = Table(title=f"gpufleet capacity ({snap.at:%H:%M:%S} UTC; GPU-hours over {_window(snap.window)})",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for col in COLUMNS[:-1]:
        t.add_column(col.replace(" ", "\n"), justify="left" if col == "POOL" else "right", overflow="fold")
    rows = table_rows(snap)
    for row in rows:
        t.add_row(*row[:-1])
    as_of = Text("as of: " + "; ".join(f"{row[0]} {row[-1]}" for row in rows))
    return Group(t, as_of, *[Text(w, style="yellow") for w in snap.warnings])


def to_json(snap: Snapshot) -> dict:
    def iso(t: datetime | None) -> str | None:
        return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if t else None

    return {"at": iso(snap.at), "window_seconds": int(snap.window.total_seconds()),
            "pools": [{**asdict(r), "as_of": iso(r.as_of),
                       "gpu_hours_lent": None if r.gpu_hours_lent is None else round(r.gpu_hours_lent, 3)}
                      for r in snap.pools],
            "warnings": list(snap.warnings)}


class KubeSource:
    """The Nodes and the ledger, read through the Kubernetes API; any failure is `Unreachable`."""

    def __init__(self, api, namespace: str, where: str):
        from gpufleet.reconciler.adapters.kube import Kube

        self.kube, self.namespace, self.where = Kube(api), namespace, where

    def nodes(self) -> list[dict]:
        from gpufleet.reconciler.errors import PermanentError, TemporaryError

        try:
            return self.kube.list_nodes()[0]
        except (TemporaryError, PermanentError) as e:
            raise Unreachable(f"cluster unreachable ({self.where}): {e}") from None

    def ledger_data(self) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            cm = self.kube.core.read_namespaced_config_map(labels.LENDING_LEDGER, self.namespace, _request_timeout=20)
        except ApiException as e:
            if e.status == 404:
                return None
            raise Unreachable(f"cluster refused to read ConfigMap {self.namespace}/{labels.LENDING_LEDGER} "
                              f"({self.where}): {e.status} {e.reason}") from None
        except (HTTPError, OSError) as e:
            raise Unreachable(f"cluster unreachable ({self.where}): {e}") from None
        return dict(cm.data or {})


def _source(spec: FleetSpec, kubeconfig: Optional[Path]) -> ClusterSource:
    """The stack's cluster: --kubeconfig, else the running local environment's (a local cluster), else the
    spec's kubeconfig and context."""
    from gpufleet import local_cluster
    from gpufleet.reconciler.app import api_client

    context = None
    if kubeconfig is None:
        if spec.cluster.kind == "local":
            local = local_cluster.find()
            if local is None:
                raise Unreachable(f"cluster unreachable: no local environment is up (none recorded in the file "
                                  f"{local_cluster.STATE_ENV} names; `gpufleet local up` starts one)")
            kubeconfig = local.kubeconfig
        else:
            kubeconfig = Path(spec.cluster.kubeconfig or "~/.kube/config").expanduser()
            context = spec.cluster.context
    if not kubeconfig.exists():
        hint = " (`gpufleet local up` starts the local one)" if spec.cluster.kind == "local" else ""
        raise Unreachable(f"cluster unreachable: no kubeconfig at {kubeconfig}{hint}")
    where = f"{kubeconfig}" + (f", context {context}" if context else "")
    try:
        api = api_client(str(kubeconfig), context)
    except Exception as e:  # noqa: BLE001 - a broken kubeconfig or a missing context: said as such
        raise Unreachable(f"cluster unreachable: cannot use {where}: {e}") from None
    return KubeSource(api, spec.healing.reconciler.namespace, where)


def read(spec: FleetSpec, source: ClusterSource, window: timedelta, now: datetime | None = None) -> Snapshot:
    nodes = source.nodes()
    return snapshot(spec, nodes, source.ledger_data(), now or clock(), window)


@app.command()
def capacity(
    watch: bool = typer.Option(False, "--watch", "-w", help=f"Redraw every {REFRESH_SECONDS:g} s until Ctrl-C."),
    window: str = typer.Option("24h", help="GPU-hours lent over this window: 90m, 24h, 7d."),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="Pulumi.<STACK>.yaml: its cluster, pools and "
                                        "reconciler namespace (default: local)."),
    kubeconfig: Optional[Path] = typer.Option(None, help="Kubeconfig; default: the local cluster's, or the "
                                              "stack's cluster.kubeconfig and context."),
    json_out: bool = typer.Option(False, "--json", help="JSON for machines (one document per redraw with --watch)."),
) -> None:
    """Per pool: active nodes (busy, idle, lent), spares (lent, unlent), quarantined, GPUs lent now and
    GPU-hours lent over the window. Exit 1: the cluster is unreachable."""
    try:
        span = parse_window(window)
    except ValueError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    spec = load_spec(stack, None)
    try:
        source = _source(spec, kubeconfig)
        snap = read(spec, source, span)
    except Unreachable as e:
        _err(str(e))
        raise typer.Exit(EXIT_FAILED)
    if json_out:
        _watch_json(spec, source, span, snap) if watch else typer.echo(json.dumps(to_json(snap), indent=2))
        return
    from rich.console import Console

    if not watch:
        Console().print(render(snap))
        return
    _watch_table(spec, source, span, snap)


def _watch_table(spec: FleetSpec, source: ClusterSource, span: timedelta, snap: Snapshot) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    try:
        with Live(render(snap), refresh_per_second=4) as live:
            while True:
                time.sleep(REFRESH_SECONDS)
                try:
                    snap = read(spec, source, span)
                    live.update(render(snap))
                except Unreachable as e:  # keep the last counts on screen, say why they are old
                    live.update(Group(render(snap), Text(f"{e}; retrying", style="red")))
    except KeyboardInterrupt:
        pass


def _watch_json(spec: FleetSpec, source: ClusterSource, span: timedelta, snap: Snapshot | None) -> None:
    try:
        while True:
            if snap is not None:
                typer.echo(json.dumps(to_json(snap)))
            time.sleep(REFRESH_SECONDS)
            try:
                snap = read(spec, source, span)
            except Unreachable as e:  # no document for a pass that read nothing
                _err(f"{e}; retrying")
                snap = None
    except KeyboardInterrupt:
        pass
