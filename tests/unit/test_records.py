"""Remediations survive a round trip through their Kubernetes form; a corrupt one halts; a restart in any
phase, reading the remediation back from storage, plans the step the reconciler that wrote it would have."""
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels, parse_fleet, remediation_crd
from gpufleet.reconciler.adapters.records import CorruptRemediation, MemoryRemediationStore, from_object, to_object
from gpufleet.reconciler.core.conditions import conditions
from gpufleet.reconciler.core.decide import plan_step
from gpufleet.reconciler.core.model import (
    Admission, NodeView, PodView, Refill, RefillState, Remediation, ReplacementFailure, SlurmNodeView, StepFacts,
)
from gpufleet.reconciler.core.phases import Phase

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def full(phase=Phase.CHECKPOINTING, **kw) -> Remediation:
    """A remediation with every field set (microseconds and all)."""
    return Remediation(
        name="h100-0-xid79-1", node="h100-0", pool="h100", xid=79, message="off the bus", phase=phase,
        created=T0, phase_times=(("Detected", T0), ("SlurmDraining", T0 + timedelta(seconds=1, microseconds=250)),
                                 (phase.value, T0 + timedelta(seconds=2))),
        reason="XID 79", replacement="h100-spare-0", jobs=(41, 42), grace_deadline=T0 + timedelta(seconds=120),
        drain_deadline=T0 + timedelta(seconds=300), intents=("notify:detected", "signal:TERM"), retries=2,
        slurm_nodes=("gpu-0",), job_nodes=("gpu-0", "gpu-5"), kept_drains=("gpu-1",), held_message="3 replacements in progress",
        held_reason="MaxConcurrent", reclaim_started=T0 + timedelta(seconds=3), failing_since=T0,
        next_attempt=T0 + timedelta(seconds=4), last_error="Slurm: down", revision=7,
        delivered=("signal:TERM",), signalled=(41,),
        failed_replacements=(ReplacementFailure("h100-spare-9", T0 + timedelta(seconds=6), "h100-spare-9 reported XID 48"),),
        stands_in_for="h100-7-xid79-1", refill=Refill("h100-0-xid79-1/refill", RefillState.REQUESTED, T0, "refill"),
        waiting="Slurm node gpu-0: no pod placed yet", **kw)


def test_round_trip_keeps_everything_a_restart_needs():
    r = full()
    assert from_object(json.loads(json.dumps(to_object(r)))) == r
    store = MemoryRemediationStore()
    assert store.create(r) is True and store.create(r) is False  # the same signal twice: one remediation
    store.write_status(r.moved(Phase.REQUEUED, T0 + timedelta(seconds=5)))
    (back,) = store.list()
    assert back.phase is Phase.REQUEUED and back.retries == 0 and back.jobs == (41, 42)


def test_a_create_keeps_no_status_as_the_api_server_does():
    """A crash between the create and the first status write leaves a remediation that reads as Detected,
    from its spec and creation time: its containment starts again, nothing it noted is lost (it noted nothing)."""
    store = MemoryRemediationStore()
    store.create(full())
    (back,) = store.list()
    assert (back.phase, back.intents, back.node, back.created) == (Phase.DETECTED, (), "h100-0", T0)


def spec():
    return parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "h100", "node_type": "x", "gpu_model": "H100", "nodes": 10, "spares": 2}],
        "slurm": {"partitions": [{"name": "train", "pools": ["h100"]}]},
        "healing": {"max_concurrent": 2, "max_unhealthy_fraction": 0.3},
    })


FACTS = StepFacts(
    slurm_names=("gpu-0",), slurm=(SlurmNodeView("gpu-0", frozenset({"IDLE", "DRAIN"}), "gpufleet: XID 79 [x]"),),
    pods=(PodView("slurm", "worker-0", "h100-0"),),
    admission=Admission(pool_size=10, unhealthy=frozenset({"h100-0"}), in_flight=0, attempts=0),
    pool_nodes=(NodeView("h100-spare-1", "h100", labels.ROLE_SPARE),),
    replacement=NodeView("h100-spare-0", "h100", labels.ROLE_ACTIVE), replacement_slurm=("gpu-0",))


@pytest.mark.parametrize("phase", [p for p in Phase if not p.terminal and p is not Phase.OPTED_OUT])
@pytest.mark.parametrize("with_replacement", [True, False])
def test_a_restart_in_any_phase_plans_the_same_step_from_what_was_stored(phase, with_replacement):
    """The reconciler writes a remediation and dies; a new one reads it back from storage (nothing else)
    and plans the step the first would have planned."""
    r = full(phase)
    if not with_replacement:
        r = replace(r, replacement=None, reclaim_started=None, next_attempt=None)
    store = MemoryRemediationStore()
    store.create(r)
    store.write_status(r)
    (back,) = store.list()  # the restarted reconciler's only memory
    now = T0 + timedelta(seconds=200)
    assert plan_step(back, FACTS, spec(), now) == plan_step(r, FACTS, spec(), now)


@pytest.mark.parametrize("mutate", [
    lambda o: o["status"].update(phase="Halfway"),
    lambda o: o["spec"].pop("node"),
    lambda o: o["spec"].update(xid="seventy-nine"),
    lambda o: o["status"].update(phases=[{"phase": "Detected", "at": "yesterday"}]),
])
def test_unreadable_remediation_halts_with_a_clear_error(mutate):
    obj = to_object(Remediation(name="n-xid79-1", node="n", pool="p", xid=79, message="", phase=Phase.DETECTED,
                                created=T0))
    mutate(obj)
    with pytest.raises(CorruptRemediation, match="n-xid79-1 is unreadable"):
        from_object(obj)


def test_the_status_follows_the_crds_schema_and_its_conditions_say_where_it_is():
    schema = remediation_crd.status_schema()["properties"]
    status = to_object(full(Phase.HELD, ))["status"]
    assert set(status) <= set(schema)  # nothing the API server would prune
    assert status["phase"] in schema["phase"]["enum"]
    allowed = {c["type"]: c for c in status["conditions"]}["RemediationAllowed"]
    assert (allowed["status"], allowed["reason"], allowed["message"]) == ("False", "MaxConcurrent",
                                                                        "3 replacements in progress")
    assert allowed["lastTransitionTime"] == (T0 + timedelta(seconds=2)).isoformat()


def test_conditions_through_a_remediation():
    r = full(Phase.DETECTED)
    steps = {Phase.SLURM_DRAINING: ("False", None, None), Phase.REQUEUED: ("True", "Unknown", None),
             Phase.EVICTING: ("True", "True", "False"), Phase.SUCCEEDED: ("True", "True", "True")}
    r = replace(r, phase_times=(("Detected", T0),))
    for phase, want in steps.items():
        r = replace(r, phase=phase, phase_times=r.phase_times + ((phase.value, T0),))
        got = {c.type: c.status for c in conditions(r)}
        assert (got.get("Contained"), got.get("RemediationAllowed"), got.get("Replaced")) == want, phase
    failed = replace(r, phase=Phase.FAILED, phase_times=(("Detected", T0), ("Failed", T0)), reason="API gone",
                     refill=None)
    assert {c.type: (c.status, c.reason) for c in conditions(failed)} == {"Contained": ("False", "Failed")}
    # the refill asked for has a condition of its own, whatever the phase
    for state, want in (("Requested", ("Unknown", "RefillRequested")), ("Answered", ("True", "RefillAnswered")),
                        ("Failed", ("False", "RefillFailed"))):
        refill = Refill("k", state, T0 + timedelta(seconds=9), "why")
        got = {c.type: c for c in conditions(replace(failed, refill=refill))}["Refilled"]
        assert (got.status, got.reason, got.message, got.at) == (*want, "why", T0 + timedelta(seconds=9))
