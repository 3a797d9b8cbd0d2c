"""The Grafana dashboard: every query parses as PromQL (promql-parser) and names only metrics the
reconciler exports (reconciler/runtime/metrics.py), with labels those metrics have."""
from __future__ import annotations

import promql_parser as pp
import pytest
from prometheus_client.metrics import MetricWrapperBase

from gpufleet.components.dashboard import PANELS, dashboard, queries
from gpufleet.reconciler.runtime.metrics import Metrics


def exported() -> dict[str, set[str]]:
    """Each series name the reconciler exports -> its label names (a histogram's _bucket adds `le`)."""
    out: dict[str, set[str]] = {}
    for m in vars(Metrics()).values():
        if not isinstance(m, MetricWrapperBase):
            continue
        names = set(m._labelnames)  # prometheus_client keeps a metric's label names here
        base = m._name
        if m._type == "counter":
            out[f"{base}_total"] = names
        elif m._type == "histogram":
            out.update({f"{base}_bucket": names | {"le"}, f"{base}_sum": names, f"{base}_count": names})
        else:
            out[base] = names
    return out


def selectors(e, seen: list) -> set[str]:
    """Walk a parsed query: note each vector selector (name, matcher labels); return the labels available
    at this node (for `by`, `without`, `on`, `ignoring` to be checked against)."""
    match type(e).__name__:
        case "VectorSelector":
            seen.append((e.name, {m.name for m in e.matchers.matchers}))
            return set(EXPORTED.get(e.name, set()))
        case "MatrixSelector":
            return selectors(e.vector_selector, seen)
        case "Call":
            have: set[str] = set()
            for a in e.args:
                have |= selectors(a, seen)
            return have
        case "AggregateExpr":
            have = selectors(e.expr, seen)
            grouped = set(e.modifier.labels) if e.modifier is not None else set()
            missing = grouped - have
            assert not missing, f"{e}: groups by {missing}, not labels of its metrics {have}"
            by = e.modifier is not None and str(e.modifier.type).endswith("By")
            return grouped if by else have - grouped
        case "BinaryExpr":
            have = selectors(e.lhs, seen) | selectors(e.rhs, seen)
            matching = getattr(e.modifier, "matching", None) if e.modifier is not None else None
            if matching is not None:
                assert set(matching.labels) <= have, f"{e}: matches on {matching.labels}, not in {have}"
            return have
        case "ParenExpr" | "UnaryExpr" | "SubqueryExpr":
            return selectors(e.expr, seen)
        case "NumberLiteral" | "StringLiteral":
            return set()
    raise AssertionError(f"a query part this test does not know: {type(e).__name__} ({e})")


EXPORTED = exported()


@pytest.mark.parametrize("query", queries())
def test_every_query_names_an_exported_metric_with_labels_it_has(query):
    seen: list = []
    selectors(pp.parse(query), seen)
    assert seen, query
    for name, matched in seen:
        assert name in EXPORTED, f"{query}: {name} is not exported (exported: {sorted(EXPORTED)})"
        assert matched <= EXPORTED[name], f"{query}: {name} has no label(s) {matched - EXPORTED[name]}"


def test_the_checker_catches_an_unknown_metric_and_an_unknown_label():
    seen: list = []
    selectors(pp.parse('sum(rate(gpufleet_remediations_total{pool="x"}[5m]))'), seen)
    assert seen == [("gpufleet_remediations_total", {"pool"})]
    assert not seen[0][1] <= EXPORTED["gpufleet_remediations_total"]  # pool is not one of its labels
    with pytest.raises(AssertionError, match="groups by"):
        selectors(pp.parse("sum by (node) (gpufleet_gpus_lent)"), [])
    assert "gpufleet_gpu_faults_total" not in EXPORTED


def test_the_dashboard_covers_what_on_call_asks_and_is_valid_json_with_unique_panel_ids():
    d = dashboard()
    assert len({p["id"] for p in d["panels"]}) == len(PANELS)
    used = {n for q in queries() for n in EXPORTED if n in q}
    for metric in ("gpufleet_remediations_started_total", "gpufleet_time_to_healthy_seconds_bucket",
                   "gpufleet_job_back_seconds_bucket", "gpufleet_remediations_total", "gpufleet_lending_nodes",
                   "gpufleet_lending_events_total", "gpufleet_nodes_held"):
        assert metric in used
    assert all(t["datasource"]["uid"] == "${datasource}" for p in d["panels"] for t in p["targets"])
