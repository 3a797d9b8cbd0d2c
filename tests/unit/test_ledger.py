"""The lending ledger (reconciler/core/ledger.py): its JSON, idempotent loans, pruning, GPU-hours."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels
from gpufleet.fleetspec import ledger as L
from gpufleet.reconciler.core import ledger as B

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def sample() -> L.PoolLedger:
    led = L.empty(T0)
    led = B.open_loan(led, "kwok-h100-spare-0", labels.LENT_SPARE, 8, T0)
    led = B.open_loan(led, "kwok-h100-1", labels.LENT_IDLE, 8, T0 + H)
    led = B.mark_reclaim(led, "kwok-h100-1", T0 + 2 * H - timedelta(seconds=40))
    led = B.close_loan(led, "kwok-h100-1", T0 + 2 * H)
    cap = L.Capacity(active_busy=1, active_idle=0, active_lent=0, spares_lent=1, spares_unlent=1, gpus_lent=8)
    return B.record_capacity(led, cap, T0 + 2 * H)


def test_dump_is_the_documented_json_and_parses_back():
    led = sample()
    text = L.dump(led)
    assert text == L.dump(L.parse(text)) and L.parse(text) == led  # stable: no churn on rewrite
    assert " " not in text  # compact
    doc = json.loads(text)
    assert list(doc) == ["at", "capacity", "loans"]
    assert doc["at"] == "2026-12-01T14:00:00Z"
    assert doc["capacity"] == {"active_busy": 1, "active_idle": 0, "active_lent": 0, "spares_lent": 1,
                               "spares_unlent": 1, "quarantined": 0, "gpus_lent": 8}
    assert doc["loans"] == [
        {"node": "kwok-h100-spare-0", "kind": "spare", "gpus": 8, "start": "2026-12-01T12:00:00Z", "end": None,
         "reclaimed": None},
        {"node": "kwok-h100-1", "kind": "idle", "gpus": 8, "start": "2026-12-01T13:00:00Z",
         "end": "2026-12-01T14:00:00Z", "reclaimed": "2026-12-01T13:59:20Z"}]


def test_times_are_utc_to_the_second():
    cet = timezone(timedelta(hours=1))
    led = B.open_loan(L.empty(T0), "n", "idle", 4, datetime(2026, 12, 1, 13, 0, 0, 123456, tzinfo=cet))
    assert led.loans[0].start == T0
    assert json.loads(L.dump(led))["loans"][0]["start"] == "2026-12-01T12:00:00Z"


def test_opening_or_closing_twice_changes_nothing():
    led = B.open_loan(L.empty(T0), "a", "spare", 8, T0)
    assert B.open_loan(led, "a", "spare", 8, T0 + H) == led  # a replayed lend
    assert B.open_loan(led, "a", "idle", 4, T0 + H) == led  # still one loan per node
    closed = B.close_loan(led, "a", T0 + H)
    assert closed.loans[0].end == T0 + H and closed.open_loan_of("a") is None
    assert B.close_loan(closed, "a", T0 + 2 * H) == closed  # a replayed reclaim
    assert B.close_loan(led, "never-lent", T0 + H) == led
    again = B.open_loan(closed, "a", "idle", 8, T0 + 2 * H)  # lent anew: a second loan
    assert [x.end for x in again.loans] == [T0 + H, None] and again.lent_nodes() == ("a",)


def test_a_reclaim_is_marked_once_on_the_open_loan_and_kept_when_it_closes():
    led = B.open_loan(L.empty(T0), "a", "idle", 8, T0)
    marked = B.mark_reclaim(led, "a", T0 + H)
    assert marked.loans[0].reclaimed == T0 + H and marked.open_loan_of("a") is not None
    assert B.mark_reclaim(marked, "a", T0 + 2 * H) == marked  # each pass sees the same annotation
    assert B.mark_reclaim(led, "never-lent", T0) == led
    assert B.close_loan(marked, "a", T0 + 2 * H).loans[0].reclaimed == T0 + H
    assert B.close_loan(led, "a", T0 + H).loans[0].reclaimed is None  # ended otherwise (a fault)


def test_the_book_marks_a_reclaim_the_node_shows():
    from gpufleet.reconciler.core.model import NodeView

    lent = NodeView("a", pool="p", role=labels.ROLE_ACTIVE, lent=labels.LENT_IDLE, lent_since=T0, gpus=8)
    first = L.parse(B.book(None, "p", [lent], L.Capacity(), T0).text, "p")
    back = NodeView("a", pool="p", role=labels.ROLE_ACTIVE, lent_since=T0, reclaiming=T0 + H, gpus=8)
    marked = L.parse(B.book(first, "p", [back], L.Capacity(), T0 + H).text, "p")
    assert marked.loans[0].reclaimed == T0 + H and marked.loans[0].open
    ended = L.parse(B.book(marked, "p", [], L.Capacity(), T0 + 2 * H).text, "p")
    assert (ended.loans[0].reclaimed, ended.loans[0].end) == (T0 + H, T0 + 2 * H)


def test_a_close_before_the_start_ends_at_the_start():
    led = B.open_loan(L.empty(T0), "a", "spare", 8, T0)
    assert B.close_loan(led, "a", T0 - H).loans[0].end == T0


def test_prune_drops_only_loans_that_ended_before_the_window():
    now = T0 + timedelta(days=10)
    led = L.empty(T0)
    led = B.open_loan(led, "old", "idle", 8, T0)
    led = B.close_loan(led, "old", T0 + H)                        # ended 10 days ago: dropped
    led = B.open_loan(led, "forever", "spare", 8, T0)             # open for 10 days: kept
    led = B.open_loan(led, "recent", "idle", 8, now - timedelta(days=3))
    led = B.close_loan(led, "recent", now - timedelta(days=2))    # ended 2 days ago: kept
    pruned = B.prune(led, now)
    assert [x.node for x in pruned.loans] == ["forever", "recent"]
    assert B.prune(pruned, now) == pruned
    assert [x.node for x in B.prune(led, now, keep=timedelta(days=1)).loans] == ["forever"]
    assert [x.node for x in B.prune(led, now, keep=timedelta(days=11)).loans] == ["old", "forever", "recent"]


def test_gpu_hours_are_the_overlap_with_the_window():
    loans = [L.Loan(node="a", kind="spare", gpus=8, start=T0, end=T0 + 2 * H),
             L.Loan(node="b", kind="idle", gpus=4, start=T0 + H, end=None),          # open: runs to `until`
             L.Loan(node="c", kind="idle", gpus=8, start=T0 - 5 * H, end=T0 - 4 * H)]  # before the window
    assert L.gpu_hours(loans, T0, T0 + 3 * H) == pytest.approx(8 * 2 + 4 * 2)
    assert L.gpu_hours(loans, T0 + H, T0 + 90 * timedelta(minutes=1)) == pytest.approx(8 * 0.5 + 4 * 0.5)
    assert L.gpu_hours(loans, T0 - 10 * H, T0 - 3 * H) == pytest.approx(8)
    assert L.gpu_hours(loans, T0 + 3 * H, T0 + 3 * H) == 0
    assert L.gpu_hours([], T0, T0 + H) == 0


@pytest.mark.parametrize("text,needle", [
    ("not json", "ledger data['h100']: not JSON"),
    ("[]", "the document: Input should be a valid dictionary"),
    ('{"capacity": {}}', "at: Field required"),
    ('{"at": "2026-12-01T12:00:00"}', "at: Input should have timezone info"),
    ('{"at": "2026-12-01T12:00:00Z", "capacity": {"spares_lent": -1}}', "capacity.spares_lent: Input should be greater"),
    ('{"at": "2026-12-01T12:00:00Z", "capacity": {"spares_lent": "2"}}', "capacity.spares_lent: Input should be a valid integer"),
    ('{"at": "2026-12-01T12:00:00Z", "capacity": {"spare_lent": 1}}', "capacity.spare_lent: Extra inputs"),
    ('{"at": "2026-12-01T12:00:00Z", "loans": [{"node": "a", "kind": "borrowed", "gpus": 8, '
     '"start": "2026-12-01T12:00:00Z"}]}', "loans[0].kind: Input should be 'spare' or 'idle'"),
    ('{"at": "2026-12-01T12:00:00Z", "loans": [{"node": "a", "kind": "idle", "gpus": 8, '
     '"start": "2026-12-01T12:00:00Z", "end": "2026-12-01T11:00:00Z"}]}', "loans[0]: loan of a ends"),
    ('{"at": "2026-12-01T12:00:00Z", "loans": [{"node": "a", "kind": "idle", "gpus": 8, "start": "2026-12-01T12:00:00Z"},'
     '{"node": "a", "kind": "spare", "gpus": 8, "start": "2026-12-01T13:00:00Z"}]}', "['a'] have more than one open loan"),
])
def test_a_bad_ledger_names_the_pool_and_the_field(text, needle):
    with pytest.raises(L.LedgerError) as e:
        L.parse(text, "h100")
    assert str(e.value).startswith("ledger data['h100']: ") and needle in str(e.value), str(e.value)


def test_parse_data_reads_every_pool_of_the_configmap():
    text = L.dump(sample())
    assert L.parse_data({"h100": text, "l40s": L.dump(L.empty(T0))})["h100"] == sample()
    assert L.parse_data(None) == {}
    with pytest.raises(L.LedgerError, match=r"data\['l40s'\]"):
        L.parse_data({"h100": text, "l40s": "{"})


def test_the_loan_kinds_are_the_lent_labels_values():
    for kind in (labels.LENT_SPARE, labels.LENT_IDLE):
        assert L.Loan(node="a", kind=kind, gpus=1, start=T0).kind == kind
