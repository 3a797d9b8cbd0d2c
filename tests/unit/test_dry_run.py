"""A dry run decides and logs each action it would take, and changes nothing: no Node patch, no
remediation, no Event, no page, no Slurm change, no node provider call, no Lease."""
from __future__ import annotations

import logging

import pytest

from gpufleet.reconciler.core.phases import Phase
from tests.unit.fakes import World, fleet


def nothing_changed(w: World) -> None:
    assert w.kube.calls == []  # no Node patch, cordon, eviction, Event, ledger
    assert w.store.objects == {}  # no remediation
    assert w.notifier.sent == []  # no page
    assert w.slurm.calls == []  # no drain, no signal, no requeue
    assert w.provider.calls == []  # no promotion, quarantine, capacity request


def would(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("dry run: would"))


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="gpufleet.reconciler")
    return caplog


def test_a_storm_in_a_dry_run_changes_nothing_and_says_what_it_would_do(logs):
    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0, occurrences=2), dry_run=True)
    for i in range(5):
        w.fault(f"h100-{i}")
    w.clock.advance(30)
    for i in range(5):  # a second signal each: `occurrences` is met (the first was not noted on the node)
        w.kube.nodes[f"h100-{i}"]["metadata"]["annotations"] = {
            "gpufleet.io/fault-signals": '["2026-11-29T11:59:00+00:00"]'}
    w.run(seconds=20)
    nothing_changed(w)
    said = would(logs)
    for i in range(5):
        assert f"Cordon(node='h100-{i}'" in said and f"DrainSlurm(node='h100-w{i}'" in said
    assert "Notify(event='storm'" in said  # it would page, once per remediation it holds ...
    assert "write remediation h100-0-xid79-" in said and ": Held" in said  # ... and hold them
    assert "EvictPods" not in said and "PromoteSpare" not in said  # the brake: nothing replaced


def test_a_heal_in_a_dry_run_changes_nothing_and_goes_as_far_as_it_can_now(logs):
    w = World(fleet(grace_period_seconds=60), dry_run=True)
    from gpufleet.reconciler.adapters.slurm import SlurmJob

    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    w.run(seconds=5)
    nothing_changed(w)
    said = would(logs)
    assert "Cordon(node='h100-0'" in said and "Notify(event='detected'" in said
    assert "SignalJobs(job_ids=(7,)" in said  # the job would get its SIGTERM ...
    assert "RequeueJobs" not in said  # ... and the grace period would be waited for
    assert said.count("Cordon(node='h100-0'") == 1  # the same intention is logged once a minute, not per pass


def test_a_dry_run_takes_no_lease():
    from kubernetes import client

    from gpufleet.reconciler.app import build

    rec = build(fleet(), client.ApiClient(), slurm=None, leader_elect=True, dry_run=True)
    assert rec.elector is None and rec.dry_run


def test_an_existing_remediation_is_not_advanced_by_a_dry_run(logs):
    """A dry run beside a reconciler that acts: it reads the real remediation, and writes nothing over it."""
    real = World(fleet(grace_period_seconds=0))
    real.fault("h100-0")
    real.run()
    before = dict(real.store.objects)
    calls = list(real.kube.calls)
    real.dry_run = True
    real.restart()
    real.clock.advance(5)
    real.run(seconds=5)
    assert real.store.objects == before and real.kube.calls == calls
    assert real.remediation("h100-0").phase is Phase.RESUMING
