"""Remediation records survive a round trip through their Kubernetes form; a corrupt one halts."""
from datetime import datetime, timedelta, timezone

import pytest

from reconciler.core.model import Record
from reconciler.core.phases import Phase
from reconciler.adapters.records import CorruptRecord, MemoryRecordStore, from_object, to_object

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def test_round_trip_keeps_everything_a_restart_needs():
    r = Record(name="h100-0-xid79-1", node="h100-0", pool="h100", xid=79, message="off the bus",
               phase=Phase.CHECKPOINTING, created=T0,
               phase_times=(("Detected", T0), ("SlurmDraining", T0 + timedelta(seconds=1))),
               reason="XID 79", replacement="h100-spare-0", jobs=(41, 42), grace_deadline=T0 + timedelta(seconds=120),
               intents=("notify:detected", "signal:TERM"), retries=2, slurm_nodes=("gpu-0",), kept_drains=("gpu-0",),
               held="MaxConcurrent", failing_since=T0, next_attempt=T0 + timedelta(seconds=4), last_error="Slurm: down",
               revision=7)
    assert from_object(to_object(r)) == r
    store = MemoryRecordStore()
    assert store.create(r) is True and store.create(r) is False  # the same signal twice: one record
    store.update(r.moved(Phase.REQUEUED, T0 + timedelta(seconds=5)))
    (back,) = store.list()
    assert back.phase is Phase.REQUEUED and back.retries == 0 and back.jobs == (41, 42)


@pytest.mark.parametrize("mutate", [
    lambda o: o["status"].update(phase="Halfway"),
    lambda o: o["spec"].pop("node"),
    lambda o: o["spec"].update(xid="seventy-nine"),
    lambda o: o["status"].update(phases=[{"phase": "Detected", "at": "yesterday"}]),
])
def test_unreadable_record_halts_with_a_clear_error(mutate):
    obj = to_object(Record(name="n-xid79-1", node="n", pool="p", xid=79, message="", phase=Phase.DETECTED, created=T0))
    mutate(obj)
    with pytest.raises(CorruptRecord, match="n-xid79-1 is unreadable"):
        from_object(obj)
