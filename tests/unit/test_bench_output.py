"""The benchmarks' machine output: `--json` prints one JSON document whose tables have the printed
tables' columns as keys; progress stays on stderr so stdout parses."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield {name: importlib.import_module(name)
               for name in ("_output", "_watch", "storms", "scale", "time_to_heal", "preview_cost")}
    finally:
        sys.path.remove(str(BENCH))


STORM = {  # what storms.storm() measures, as it returns it
    "faults": 150, "pool_nodes": 1500, "inject_spread_s": 0.8, "cordoned": 150, "succeeded": 150,
    "outcomes": ["Succeeded"], "cordon_p50": 7.0, "cordon_p90": 10.4, "cordon_max": 12.1,
    "record_p50": 6.1, "record_p90": 9.9, "ok_p50": 48.0, "ok_p90": 77.0, "ok_max": 90.2,
    "cordon_rate": 11.2, "heal_rate": 1.7, "double_promoted": 0, "held_max_concurrent": 0.0, "load": 2.5,
    "drained_p50": 7.2, "drained_p90": 10.9, "drained_max": 12.5, "reconciler_cpu_s": 30.1, "reconciler_rss_mib": 110.0,
    "api_requests": {"PUT remediations": 1350.0, "POST events": 600.0}, "api_requests_per_fault": 13.0,
    "cordon_written_p50": 0.9, "cordon_written_p90": 1.2, "cordon_written_max": 1.5,
}
TIER = {"tier": "5%", "max_concurrent": 2, "failed_nodes": 10, "started": 10, "contained": 10, "healed": 0, "held": 10,
        "brake": "engaged", "heal_p50": None, "heal_max": None, "all_healed_after": None,
        "gate": "gate TooManyUnhealthy ...", "load": 1.9}
ARGS = Namespace(tier_nodes=200, fraction=0.1)


def test_storms_json_parses_and_has_the_tables_keys(bench, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["storms.py", "--json"])
    storms, common = bench["storms"], bench["_output"]
    out = common.Output("storms", "-")
    common.say("progress goes to stderr")
    print("a stray print during the run")  # sent to stderr too, while JSON is on stdout
    tables = storms.result_tables(STORM, [TIER], ARGS)
    out.emit(tables, raw={"storm": STORM, "tiers": [TIER]})
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "progress goes to stderr" in captured.err and "a stray print" in captured.err
    assert doc["bench"] == "storms" and doc["argv"] == ["--json"] and doc["raw"]["storm"] == STORM
    storm, brake = doc["tables"]
    assert storm["columns"] == ["measure", "P50 s", "P90 s", "max s", "nodes/s"]
    assert all(set(r) == set(storm["columns"]) for r in storm["rows"])
    cordon = next(r for r in storm["rows"] if r["measure"] == "fault -> cordon seen (this script's watch)")
    assert (cordon["P50 s"], cordon["P90 s"], cordon["nodes/s"]) == (7.0, 10.4, 11.2)  # numbers, not text
    written = next(r for r in storm["rows"] if r["measure"] == "fault -> cordon written (the reconciler's log)")
    assert (written["P50 s"], written["P90 s"], written["max s"]) == (0.9, 1.2, 1.5)
    assert brake["rows"] == [dict(zip(brake["columns"], ["5%", 2, 10, 10, 10, 0, 10, "engaged", None, None, 1.9]))]


def test_without_json_the_same_tables_print_as_markdown(bench, capsys, tmp_path):
    storms, common = bench["storms"], bench["_output"]
    saved = tmp_path / "storms.json"
    tables = storms.result_tables(STORM, [TIER], ARGS)
    common.Output("storms", str(saved)).emit(tables, raw={"storm": STORM})
    text = capsys.readouterr().out
    for t in tables:
        assert common.table(t.columns, t.rows) in text
    assert [t["columns"] for t in json.loads(saved.read_text())["tables"]] == [t.columns for t in tables]


def test_every_script_has_the_json_option(bench):
    for name in ("storms", "scale", "time_to_heal", "preview_cost"):
        with pytest.raises(SystemExit) as e:
            bench[name].main(["--help"])
        assert e.value.code == 0
    ap = argparse.ArgumentParser()
    bench["_output"].add_json_option(ap)
    assert ap.parse_args(["--json"]).json == "-" and ap.parse_args(["--json", "x.json"]).json == "x.json"
    assert ap.parse_args([]).json is None


def test_the_other_scripts_tables_have_their_columns_as_keys(bench):
    th = bench["time_to_heal"]
    rows = [{m: float(i) for i, m in enumerate(th.MILESTONES)} | {"load": 1.0, "returned_to_spares": 3.0}]
    (t,) = th.result_tables({0: rows})
    assert [len(r) for r in t.rows] == [len(t.columns)] * 3 and t.as_dict()["rows"][0]["grace"] == "0s"
    pc = bench["preview_cost"]
    (t,) = pc.result_tables([{"pools": 1, "nodes": 64, "policy_pack": False, "resources": 40, "k8s_resources": 30,
                              "wall_s": 20.0, "wall_all": [20.0], "peak_tree_med": 500.0, "peak_single_mib": 300.0,
                              "peak_single": "pulumi", "load": 1.0}], Namespace(repeat=1))
    assert t.as_dict()["rows"][0]["resources"] == 40


def test_the_storm_reads_when_each_cordon_was_written_from_the_reconcilers_log(bench, tmp_path):
    log = tmp_path / "reconciler.log"
    log.write_text("\n".join([
        '{"time": "2026-12-01 18:30:21,343", "level": "INFO", "message": "cordoned", "node": "storm-0"}',
        'not json: a line the supervisor wrote',
        '{"time": "2026-12-01 18:30:22,000", "level": "INFO", "message": "cordoned", "node": "storm-0"}',
        '{"time": "2026-12-01 18:30:21,500", "level": "INFO", "message": "phase Detected -> SlurmDraining"}',
    ]))
    got = bench["storms"].cordons_logged(log)
    assert list(got) == ["storm-0"]  # the first cordon counts, other lines are skipped
    assert got["storm-0"] % 60 == pytest.approx(21.343, abs=1e-6)


def test_the_node_watch_counts_a_node_cordoned_again_after_it_was_uncordoned(bench):
    """Its watch is filtered (only cordoned nodes): an uncordon arrives once, as DELETED, and may come
    before the next arm(); the node's next cordon must still count (time_to_heal faults a node twice)."""
    w = bench["_watch"].NodeWatcher.__new__(bench["_watch"].NodeWatcher)
    import threading

    w.cordoned_at, w.cordoned_before, w.cordoned_now, w.lock = {}, set(), set(), threading.Lock()
    w.arm()
    w._changed("n0", None, True)  # the informer: n0 entered the selector (cordoned)
    assert "n0" in w.cordoned_at
    w._changed("n0", True, None)  # uncordoned: the filtered watch says DELETED
    w.arm()
    assert w.cordoned_before == set()
    w._changed("n0", None, True)
    assert "n0" in w.cordoned_at
    w.arm()  # still cordoned when armed: not counted until it is uncordoned and cordoned again
    w._changed("n0", True, True)
    assert w.cordoned_at == {}
