"""`gpufleet capacity`: counting a pool from the ledger or from its Nodes, the table, the JSON, and the
command itself over a fake cluster (reading is behind gpufleet.capacity_commands.ClusterSource)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.fleetspec import labels, load_stack_file
from gpufleet import capacity_commands as C
from gpufleet.cli import app
from gpufleet.fleetspec import ledger as L
from gpufleet.reconciler.core import ledger as B

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_stack_file(ROOT / "Pulumi.local.yaml").fleet  # pools h100 (2 + 2 spares, lends) and l40s (1 + 1)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def node(name: str, pool: str | None, role: str, lent: str | None = None, gpus: int | None = 8) -> dict:
    lab = {labels.ROLE: role, **({labels.NODE_POOL: pool} if pool else {}), **({labels.LENT: lent} if lent else {})}
    return {"metadata": {"name": name, "labels": lab},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}} if gpus is not None else {}}


NODES = [
    node("system-0", None, labels.ROLE_SYSTEM, gpus=None),
    node("kwok-h100-0", "h100", labels.ROLE_ACTIVE),
    node("kwok-h100-1", "h100", labels.ROLE_ACTIVE, lent=labels.LENT_IDLE),
    node("kwok-h100-spare-0", "h100", labels.ROLE_SPARE, lent=labels.LENT_SPARE, gpus=None),  # GPUs from the spec
    node("kwok-h100-spare-1", "h100", labels.ROLE_SPARE),
    node("kwok-l40s-0", "l40s", labels.ROLE_QUARANTINED, gpus=4),
    node("kwok-l40s-spare-0", "l40s", labels.ROLE_SPARE, gpus=4),
    node("elsewhere-0", "a100", labels.ROLE_ACTIVE, lent=labels.LENT_IDLE),  # not a pool of this spec
]


def h100_ledger() -> str:
    led = B.open_loan(L.empty(NOW), "kwok-h100-spare-0", "spare", 8, NOW - 3 * H)
    led = B.open_loan(led, "kwok-h100-1", "idle", 8, NOW - 2 * H)
    led = B.close_loan(led, "kwok-h100-1", NOW - H)
    led = B.open_loan(led, "kwok-h100-1", "idle", 8, NOW - timedelta(minutes=30))
    cap = L.Capacity(active_busy=1, active_idle=0, active_lent=1, spares_lent=1, spares_unlent=1, gpus_lent=16)
    return L.dump(B.record_capacity(led, cap, NOW - timedelta(seconds=4)))


def test_nodes_alone_give_roles_and_loans_but_not_busy_or_idle():
    rows = C.count_nodes(SPEC, NODES)
    assert set(rows) == {"h100", "l40s"}
    h = rows["h100"]
    assert (h.active_busy, h.active_idle, h.active_lent) == (None, None, 1)
    assert (h.spares_lent, h.spares_unlent, h.quarantined, h.gpus_lent) == (1, 1, 0, 16)
    assert h.source == "nodes" and h.gpu_hours_lent is None
    l40s = rows["l40s"]
    assert (l40s.active_lent, l40s.spares_lent, l40s.spares_unlent, l40s.quarantined, l40s.gpus_lent) == (0, 0, 1, 1, 0)


def test_the_ledger_wins_where_it_has_the_pool():
    snap = C.snapshot(SPEC, NODES, {"h100": h100_ledger()}, NOW, timedelta(hours=24))
    h, l40s = snap.pools
    assert (h.pool, h.source, h.as_of) == ("h100", "ledger", NOW - timedelta(seconds=4))
    assert (h.active_busy, h.active_idle, h.active_lent, h.spares_lent, h.spares_unlent, h.gpus_lent) == (1, 0, 1, 1, 1, 16)
    # spare-0 lent 3 h, h100-1 lent 1 h then 0.5 h: 8 GPUs each
    assert h.gpu_hours_lent == pytest.approx(8 * 3 + 8 * 1 + 8 * 0.5)
    assert l40s.source == "nodes" and snap.warnings == ()
    assert C.snapshot(SPEC, NODES, {"h100": h100_ledger()}, NOW, timedelta(hours=1)).pools[0].gpu_hours_lent == \
        pytest.approx(8 * 1 + 8 * 0.5)


def test_a_bad_ledger_entry_is_named_and_its_pool_counted_from_the_nodes():
    snap = C.snapshot(SPEC, NODES, {"h100": '{"at": "yesterday"}'}, NOW, timedelta(hours=24))
    assert snap.pools[0].source == "nodes" and snap.pools[0].active_lent == 1
    (w,) = snap.warnings
    assert "gpufleet-lending: ledger data['h100']: at:" in w and "counted from its Nodes" in w


def test_a_pool_only_the_ledger_knows_is_shown_too_and_long_windows_are_flagged():
    snap = C.snapshot(SPEC, NODES, {"gone": L.dump(L.empty(NOW))}, NOW, timedelta(days=30))
    assert [r.pool for r in snap.pools] == ["h100", "l40s", "gone"]
    assert any("keeps 7 days" in w for w in snap.warnings)


def test_table_rows_print_question_marks_for_what_is_unknown():
    snap = C.snapshot(SPEC, NODES, {"h100": h100_ledger()}, NOW, timedelta(hours=24))
    h, l40s = C.table_rows(snap)
    assert h == ["h100", "1", "0", "1", "1", "1", "0", "16", "36.0", "4s ago"]
    older = C.Snapshot(NOW + 2 * H, snap.window, snap.pools)
    assert C.table_rows(older)[0][9] == "2h ago" and C.table_rows(C.Snapshot(NOW + H, snap.window, snap.pools))[0][9] == "60m ago"
    assert l40s == ["l40s", "?", "?", "0", "0", "1", "1", "0", "?", "now (Nodes; no ledger)"]
    assert len(C.COLUMNS) == len(h)


def test_json_for_machines():
    doc = C.to_json(C.snapshot(SPEC, NODES, {"h100": h100_ledger()}, NOW, timedelta(hours=24)))
    assert doc["at"] == "2026-12-01T12:00:00Z" and doc["window_seconds"] == 86400
    h, l40s = doc["pools"]
    assert h == {"pool": "h100", "source": "ledger", "as_of": "2026-12-01T11:59:56Z", "active_busy": 1,
                 "active_idle": 0, "active_lent": 1, "spares_lent": 1, "spares_unlent": 1, "quarantined": 0,
                 "gpus_lent": 16, "gpu_hours_lent": 36.0}
    assert l40s["active_busy"] is None and l40s["gpu_hours_lent"] is None
    json.dumps(doc)


@pytest.mark.parametrize("text,want", [("24h", timedelta(hours=24)), ("90m", timedelta(minutes=90)),
                                       ("7d", timedelta(days=7)), ("45s", timedelta(seconds=45)),
                                       ("1.5h", timedelta(minutes=90))])
def test_windows(text, want):
    assert C.parse_window(text) == want


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "0m", "2w"])
def test_bad_windows(text):
    with pytest.raises(ValueError, match="--window"):
        C.parse_window(text)


class FakeCluster:
    """A cluster as ClusterSource: Nodes, the ledger's data, and failures on the passes listed in `down`."""

    def __init__(self, nodes, data, down=()):
        self._nodes, self.data, self.down, self.reads = nodes, data, set(down), 0

    def nodes(self):
        self.reads += 1
        if self.reads in self.down:
            raise C.Unreachable("cluster unreachable (fake): list nodes: connection refused")
        return self._nodes

    def ledger_data(self):
        return self.data


runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    monkeypatch.setattr(C, "clock", lambda: NOW)


@pytest.fixture
def cluster(monkeypatch):
    fake = FakeCluster(NODES, {"h100": h100_ledger()})
    monkeypatch.setattr(C, "_source", lambda spec, kubeconfig: fake)
    return fake


def test_the_command_prints_every_pool(cluster):
    r = runner.invoke(app, ["capacity", "--stack", "local"], env=ENV)
    assert r.exit_code == 0, r.output
    assert "GPU-hours over 24h" in r.output
    cells = {row[0]: row for ln in r.output.splitlines() if len(row := ln.split()) == len(C.COLUMNS) - 1}
    assert cells["h100"][1:9] == ["1", "0", "1", "1", "1", "0", "16", "36.0"]
    assert cells["l40s"][1:3] == ["?", "?"] and cells["l40s"][8] == "?"
    assert "as of: h100 4s ago; l40s now (Nodes; no ledger)" in r.output


def test_the_command_speaks_json(cluster):
    r = runner.invoke(app, ["capacity", "--json", "--window", "1h"], env=ENV)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["window_seconds"] == 3600 and [p["pool"] for p in doc["pools"]] == ["h100", "l40s"]


def test_an_unreachable_cluster_exits_1_saying_so(monkeypatch):
    monkeypatch.setattr(C, "_source", lambda spec, kubeconfig: FakeCluster(NODES, None, down={1}))
    r = runner.invoke(app, ["capacity"], env=ENV)
    assert r.exit_code == 1 and "cluster unreachable (fake)" in r.output


def test_no_kubeconfig_is_unreachable_too(tmp_path):
    r = runner.invoke(app, ["capacity", "--kubeconfig", str(tmp_path / "none.yaml")], env=ENV)
    assert r.exit_code == 1 and "no kubeconfig at" in r.output


def test_a_bad_window_exits_2():
    r = runner.invoke(app, ["capacity", "--window", "soon"], env=ENV)
    assert r.exit_code == 2 and "--window 'soon'" in r.output


def test_watch_redraws_until_interrupted_and_outlives_an_outage(monkeypatch):
    fake = FakeCluster(NODES, {"h100": h100_ledger()}, down={2})
    monkeypatch.setattr(C, "_source", lambda spec, kubeconfig: fake)
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(C.time, "sleep", sleep)
    r = runner.invoke(app, ["capacity", "--watch", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    docs = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    assert len(docs) == 2  # pass 1, (pass 2 unreachable: said, no document), pass 3
    assert "cluster unreachable (fake)" in r.output and "retrying" in r.output
    assert sleeps == [C.REFRESH_SECONDS] * 3 and fake.reads == 3


def test_the_table_keeps_every_header_whole_in_an_80_column_terminal():
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(C.render(C.snapshot(SPEC, NODES, {"h100": h100_ledger()}, NOW, timedelta(hours=24))))
    text = console.export_text()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    words = " ".join(text.split())
    for word in ("ACTIVE", "BUSY", "SPARES", "UNLENT", "QUARANTINED", "GPU-H", "now (Nodes; no ledger)"):
        assert word in words, text
