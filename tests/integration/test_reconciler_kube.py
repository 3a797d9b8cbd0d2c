"""The reconciler's Kubernetes side against a real API server (kwok nodes): conditions, cordon,
eviction, opt-out, spare promotion, Remediation records, restarts, the Lease.
The node agent's tests are in test_agent_kube.py."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timezone

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels, remediation_crd
from localenv import fake_nodes
from gpufleet.waiting import wait_for
from gpufleet.reconciler.app import build
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.runtime.leader import LeaseElector
from gpufleet.reconciler.core.phases import Phase
from tests.fixtures.reconciler_kube import Recorder, fleet, make_nodes, pod, reconciler, records_for, run_until, step

pytestmark = pytest.mark.integration


def heartbeat(node: str, api) -> None:
    """A heartbeat as kwok v0.7.0 sends it (kustomize/stage/node/heartbeat-with-lease: every 10-20 min, so it is
    sent here, not waited for): a strategic merge patch of the status with its own conditions only, each with
    a new lastHeartbeatTime (pkg/utils/lifecycle/next.go computePatch: StrategicMergePatchType for a Node)."""
    core = client.CoreV1Api(api)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
    core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": ready.status, "reason": ready.reason, "message": ready.message,
         "lastTransitionTime": ready.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ"), "lastHeartbeatTime": now}]}})


def test_fault_condition_survives_kwok_heartbeats(kube_cluster, api):
    spec = fleet("hb", nodes=1, spares=0)
    make_nodes(kube_cluster, spec)
    kube = Kube(api)
    kube.set_condition("hb-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    first = kube.get_node("hb-0")
    heartbeat("hb-0", api)
    conds = {c["type"]: c for c in kube.get_node("hb-0")["status"]["conditions"]}
    assert conds["GpuHealthy"]["status"] == "False" and conds["Ready"]["status"] == "True"
    # the same signal again does not move the transition time: one signal, not two
    kube.set_condition("hb-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    again = {c["type"]: c for c in kube.get_node("hb-0")["status"]["conditions"]}["GpuHealthy"]
    assert again["lastTransitionTime"] == {c["type"]: c for c in first["status"]["conditions"]}["GpuHealthy"]["lastTransitionTime"]


def test_heals_a_node_with_a_spare(kube_cluster, api):
    spec = fleet("heal")
    make_nodes(kube_cluster, spec)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", pod("heal-worker", "heal-0"))
    rec = reconciler(api, spec)
    Kube(api).set_condition("heal-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")

    done = run_until(rec, lambda: [r for r in records_for(rec, "heal-0") if r.phase.terminal])
    (r,) = done
    assert r.phase is Phase.SUCCEEDED and r.replacement == "heal-spare-0" and r.xid == 79
    bad = core.read_node("heal-0")
    assert bad.spec.unschedulable and bad.metadata.labels[labels.ROLE] == labels.ROLE_QUARANTINED
    assert any(t.key == labels.QUARANTINE_TAINT for t in bad.spec.taints)
    assert bad.metadata.annotations[labels.REMEDIATION] == r.name
    spare = core.read_node("heal-spare-0")
    assert spare.metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE and not spare.spec.unschedulable
    assert not any(t.key == labels.SPARE_TAINT for t in spare.spec.taints or [])
    assert spare.metadata.annotations[labels.PROMOTED_FOR] == "heal-0"
    # the worker pod was evicted through the eviction API
    wait_for("the evicted pod to be gone", lambda: "heal-worker" not in {
        p.metadata.name for p in core.list_namespaced_pod("default").items}, timeout=10)
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=heal-0").items
    assert {"GpuFleetDetected", "GpuFleetSucceeded"} <= {e.reason for e in events}
    # more passes change nothing: one record, one promotion
    for _ in range(3):
        step(rec)
    assert len(records_for(rec, "heal-0")) == 1
    assert [e for e in rec.notifier.channels[0].messages if e.event == "succeeded"].__len__() == 1


def test_opt_out_label_holds_the_node(kube_cluster, api):
    spec = fleet("opt")
    make_nodes(kube_cluster, spec)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", pod("opt-debug", "opt-1", {labels.DEFAULT_OPT_OUT: "true"}))
    rec = reconciler(api, spec)
    Kube(api).set_condition("opt-1", "GpuHealthy", "False", "Xid48", "DBE")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "opt-1") if r.phase is Phase.OPTED_OUT])
    assert "default/opt-debug" in r.reason and r.replacement is None
    assert core.read_node("opt-1").spec.unschedulable
    spare = core.read_node("opt-spare-0")
    assert spare.metadata.labels[labels.ROLE] == labels.ROLE_SPARE  # nothing replaced
    core.read_namespaced_pod("opt-debug", "default")  # and nothing evicted
    sent = [m.event for m in rec.notifier.channels[0].messages]
    assert sent.count("opted-out") == 1


def test_restart_mid_remediation_resumes_without_repeating(kube_cluster, api):
    spec = fleet("rst", spares=2)
    make_nodes(kube_cluster, spec)
    Kube(api).set_condition("rst-0", "GpuHealthy", "False", "Xid79", "off the bus")
    first = reconciler(api, spec)
    first_channel = first.notifier.channels[0]
    # run the first reconciler until it has chosen a spare, then "kill" it
    run_until(first, lambda: [r for r in records_for(first, "rst-0") if r.replacement])
    second_channel = Recorder()
    second = reconciler(api, spec, second_channel)
    (r,) = run_until(second, lambda: [r for r in records_for(second, "rst-0") if r.phase.terminal])
    assert r.phase is Phase.SUCCEEDED and r.replacement == "rst-spare-0"
    core = client.CoreV1Api(api)
    roles = {n: core.read_node(n).metadata.labels[labels.ROLE] for n in ("rst-spare-0", "rst-spare-1")}
    assert roles == {"rst-spare-0": labels.ROLE_ACTIVE, "rst-spare-1": labels.ROLE_SPARE}  # promoted once
    events = [m.event for m in first_channel.messages + second_channel.messages]
    assert events.count("detected") == 1 and events.count("succeeded") == 1
    assert [p for p, _ in r.phase_times].count("Replacing") == 1


def test_no_spare_waits_then_heals_when_capacity_joins(kube_cluster, api):
    spec = fleet("nos", nodes=2, spares=0)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    Kube(api).set_condition("nos-0", "GpuHealthy", "False", "Xid79", "off the bus")
    run_until(rec, lambda: [r for r in records_for(rec, "nos-0") if r.phase is Phase.WAITING_FOR_SPARE])
    assert client.CoreV1Api(api).read_node("nos-0").spec.unschedulable
    # capacity arrives (a cloud provider, or a person): a new spare joins the pool
    client.CoreV1Api(api).create_node(fake_nodes.pool_node(spec.pools[0], "nos-spare-9", labels.ROLE_SPARE))
    kube_cluster.wait_node_ready("nos-spare-9")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "nos-0") if r.phase.terminal])
    assert r.phase is Phase.SUCCEEDED and r.replacement == "nos-spare-9"


class Monotonic:
    """The electors' own clock, moved by the test (no sleeping for a Lease to run out)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_lease_elects_one_leader_fences_and_fails_over(api):
    clock = Monotonic()
    a = LeaseElector(api, "default", "itest-leader", "a", lease_seconds=2, renew_every=0.5, clock=clock)
    b = LeaseElector(api, "default", "itest-leader", "b", lease_seconds=2, renew_every=0.5, clock=clock)
    assert a.try_acquire() is True and a.holds()
    assert b.try_acquire() is False and a.leading.is_set() and not b.leading.is_set()
    assert a.try_acquire() is True  # renewal
    assert b.try_acquire() is False  # b sees the renewal: its own clock starts again
    clock.t += 2.2  # a stops renewing (killed): it fences itself, then b sees the lease unchanged for its duration
    assert not a.holds()
    assert b.try_acquire() is True and a.try_acquire() is False and not a.leading.is_set()
    lease = client.CoordinationV1Api(api).read_namespaced_lease("itest-leader", "default")
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions >= 1
    # a clean exit releases the lease: the next replica leads at once, without waiting for expiry
    b.release()
    c = LeaseElector(api, "default", "itest-leader", "c", lease_seconds=15, renew_every=5)
    assert c.try_acquire() is True and c.holds()


def test_watch_queues_a_fault_not_heartbeats(kube_cluster, api):
    spec = fleet("wch", nodes=1, spares=0)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    stop = threading.Event()
    nodes = rec.caches.nodes
    nodes.start(stop)
    try:
        assert nodes.synced.wait(10)
        q = rec.queue
        while (key := q.get(timeout=1.0)) is not None:  # what the first list and kwok's start-up queued, until quiet
            q.done(key)
        before = nodes.version
        heartbeat("wch-0", api)
        wait_for("the watch to bring the heartbeat", lambda: nodes.version != before, timeout=10)
        assert rec.queue.get(timeout=1.0) is None, "a heartbeat queued a node"
        Kube(api).set_condition("wch-0", "GpuHealthy", "False", "Xid79", "off the bus")
        assert rec.queue.get(timeout=5.0) == "wch-0"
        assert nodes.get("wch-0").fault.xid == 79
    finally:
        stop.set()


def test_pdb_blocks_eviction_until_the_drain_timeout(kube_cluster, api):
    spec = fleet("pdb", nodes=2, spares=1)
    make_nodes(kube_cluster, spec)
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    core.create_namespaced_pod("default", pod("pdb-guarded", "pdb-0", {"app": "guarded"}))
    policy.create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "guarded"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    wait_for("the disruption controller to count the pod", lambda: (
        st := policy.read_namespaced_pod_disruption_budget("guarded", "default").status) and st.observed_generation
        and st.current_healthy == 1, timeout=30)
    rec = reconciler(api, spec)
    Kube(api).set_condition("pdb-0", "GpuHealthy", "False", "Xid79", "off the bus")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "pdb-0") if r.phase.terminal], timeout=60)
    assert r.phase is Phase.SUCCEEDED and "drain timed out after 10s" in r.reason and "default/pdb-guarded" in r.reason
    assert core.read_namespaced_pod("pdb-guarded", "default").metadata.name  # the PDB was respected
    evicting = r.entered(Phase.EVICTING)
    assert (r.entered(Phase.REPLACING) - evicting).total_seconds() >= 10


def test_quarantined_node_returns_to_spares_after_health_check(kube_cluster, api):
    spec = fleet("ret", nodes=2, spares=1)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    kube = Kube(api)
    kube.set_condition("ret-0", "GpuHealthy", "False", "Xid79", "off the bus")
    run_until(rec, lambda: [r for r in records_for(rec, "ret-0") if r.phase.terminal])
    assert kube.get_node("ret-0")["metadata"]["labels"][labels.ROLE] == labels.ROLE_QUARANTINED
    for _ in range(3):  # idle is not healthy: nothing happens without a passed check
        step(rec)
    assert kube.get_node("ret-0")["metadata"]["labels"][labels.ROLE] == labels.ROLE_QUARANTINED
    kube.set_condition("ret-0", "GpuHealthy", "True", "HealthCheckPassed", "dcgmi diag -r 3 passed")
    node = run_until(rec, lambda: (n := kube.get_node("ret-0"))["metadata"]["labels"][labels.ROLE] == labels.ROLE_SPARE
                     and n)
    taints = {t["key"] for t in node["spec"].get("taints") or []}
    assert labels.SPARE_TAINT in taints and labels.QUARANTINE_TAINT not in taints
    assert not node["spec"].get("unschedulable")


def test_storm_brake_contains_every_fault_replaces_nothing_and_pages_once(kube_cluster, api):
    spec = fleet("stm", nodes=3, spares=2, max_unhealthy_fraction=0.5, max_concurrent=10)
    make_nodes(kube_cluster, spec)
    channel = Recorder()
    rec = reconciler(api, spec, channel)
    kube = Kube(api, manager=labels.MANAGER_INJECT_FAULT)  # one writer (a person's inject-fault) faults both
    for n in ("stm-0", "stm-1"):
        kube.set_condition(n, "GpuHealthy", "False", "Xid79", "off the bus")
    run_until(rec, lambda: len([r for r in rec.store.list() if r.pool == "stm" and r.phase is Phase.HELD]) == 2)
    for _ in range(4):
        step(rec)
    for n in ("stm-0", "stm-1"):
        (r,) = records_for(rec, n)
        assert r.phase is Phase.HELD and "2 of 3 nodes in pool stm" in r.held_message
        assert kube.get_node(n)["spec"].get("unschedulable")  # contained: cordoned
    for s_ in ("stm-spare-0", "stm-spare-1"):
        assert kube.get_node(s_)["metadata"]["labels"][labels.ROLE] == labels.ROLE_SPARE  # nothing replaced
    rec.alerts.refresh_gauges()
    storms = [m for m in channel.messages if m.event == "storm"]
    assert len(storms) == 1 and storms[0].severity == "critical" and "2 of 3 nodes in pool stm" in storms[0].text
    # who reported them, from the API server's managedFields: one writer, named, with the warning
    assert (f"reported by a person (gpufleet inject-fault) ({labels.MANAGER_INJECT_FAULT}) on stm-0, stm-1; "
            f"{labels.MANAGER_INJECT_FAULT} alone reported" in storms[0].text)
    assert {r.reporter for r in rec.store.list() if r.pool == "stm"} == {labels.MANAGER_INJECT_FAULT}
    assert rec.metrics.held.labels("TooManyUnhealthy")._value.get() == 2
    # The gate is a condition on the remediations it holds (what `kubectl get remediations` shows) ...
    for obj in client.CustomObjectsApi(api).list_cluster_custom_object(
            labels.GROUP, remediation_crd.VERSION, "remediations", label_selector=f"{labels.POOL}=stm")["items"]:
        allowed = {c["type"]: c for c in obj["status"]["conditions"]}["RemediationAllowed"]
        assert (allowed["status"], allowed["reason"]) == ("False", "TooManyUnhealthy")
        assert "2 of 3 nodes in pool stm" in allowed["message"]
    # ... and the page's intent is on one of them: a restarted reconciler pages no one again.
    again = reconciler(api, spec, channel)
    for _ in range(3):
        step(again)
    assert len([m for m in channel.messages if m.event == "storm"]) == 1


def test_on_call_releases_a_held_remediation_with_the_command_and_learns_what_was_done(kube_cluster, api):
    """`gpufleet release NODE` writes the person's request on the node's remediation; the reconciler carries it
    out (the held node is replaced) and the command, waiting, prints what was done; asked of a node with
    nothing held, the reconciler refuses and the command exits 1 saying why."""
    from typer.testing import CliRunner

    from gpufleet.cli import app

    spec = fleet("rel", nodes=3, spares=2, max_unhealthy_fraction=0.5, max_concurrent=10)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    kube = Kube(api, manager=labels.MANAGER_INJECT_FAULT)
    for n in ("rel-0", "rel-1"):
        kube.set_condition(n, "GpuHealthy", "False", "Xid79", "off the bus")
    run_until(rec, lambda: len([r for r in rec.store.list() if r.pool == "rel" and r.phase is Phase.HELD]) == 2)
    cfg = str(kube_cluster.kubeconfig_path)
    got: dict = {}

    def person():
        got["result"] = CliRunner().invoke(app, ["release", "rel-0", "--kubeconfig", cfg, "--json", "--by", "oncall",
                                                 "--reason", "a bad driver roll-out, rolled back", "--timeout", "60"])

    t = threading.Thread(target=person)
    t.start()
    run_until(rec, lambda: not t.is_alive())
    out = got["result"]
    assert out.exit_code == 0, out.output
    said = json.loads(out.output)
    assert said["remediation"] == records_for(rec, "rel-0")[0].name and not said["refused"]
    assert said["done"].startswith("release by oncall (a bad driver roll-out, rolled back): ")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "rel-0") if r.replacement])
    assert r.replacement.startswith("rel-spare-")  # released: replaced from the spares
    (other,) = records_for(rec, "rel-1")
    assert other.phase is Phase.HELD  # only the node asked about

    run_until(rec, lambda: records_for(rec, "rel-0")[0].phase.terminal)
    t = threading.Thread(target=lambda: got.update(again=CliRunner().invoke(
        app, ["release", "rel-0", "--kubeconfig", cfg, "--timeout", "60"])))
    t.start()
    run_until(rec, lambda: not t.is_alive())
    assert got["again"].exit_code == 1 and "refused" in got["again"].output


def test_simultaneous_faults_get_distinct_spares(kube_cluster, api):
    """Two remediations stepping in the same pass must not both choose the first spare (the node
    cache lags the promotion)."""
    spec = fleet("two", nodes=3, spares=2, max_unhealthy_fraction=0.9, max_concurrent=5)
    make_nodes(kube_cluster, spec)
    rec = reconciler(api, spec)
    kube = Kube(api)
    for n in ("two-0", "two-1"):
        kube.set_condition(n, "GpuHealthy", "False", "Xid79", "off the bus")
    done = run_until(rec, lambda: (rs := [r for r in rec.store.list() if r.pool == "two"]) and len(rs) == 2
                     and all(r.phase.terminal for r in rs) and rs)
    assert {r.phase for r in done} == {Phase.SUCCEEDED}
    assert sorted(r.replacement for r in done) == ["two-spare-0", "two-spare-1"]
    for spare, r in ((r.replacement, r) for r in done):
        assert kube.get_node(spare)["metadata"]["annotations"][labels.PROMOTED_FOR] == r.node


def test_a_record_is_deleted_only_as_last_seen(api):
    """Retention's delete (records.py): preconditioned on the resourceVersion the store last saw."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from gpufleet.reconciler.adapters.records import KubeRemediationStore
    from gpufleet.reconciler.core.model import Remediation
    from gpufleet.reconciler.errors import Conflict

    store, other = KubeRemediationStore(api), KubeRemediationStore(api)
    r = Remediation(name="retention-itest", node="ret-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED,
                    created=datetime.now(timezone.utc))
    assert store.create(r)
    store.write_status(r)
    other.list()  # the second store saw this version
    store.write_status(replace(r, reason="changed"))  # ... and then it changed
    with pytest.raises(Conflict) as e:
        other.delete(r)
    assert (e.value.code, e.value.reason) == (409, "Conflict")
    assert "retention-itest" in {x.name for x in store.list()}
    assert store.delete(r) is True
    assert "retention-itest" not in {x.name for x in store.list()}
    assert store.delete(r) is False  # gone already


def test_the_status_is_described_written_through_its_subresource_and_kept_apart_from_the_spec(api):
    """What `kubectl explain remediation.status` reads (the API server's OpenAPI v3 for the group), the
    status subresource, and the typed errors the API server's answers become."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from gpufleet.reconciler.adapters.kube import _call
    from gpufleet.reconciler.adapters.records import KubeRemediationStore
    from gpufleet.reconciler.core.model import Remediation
    from gpufleet.reconciler.errors import AlreadyExists, Invalid, NotFound

    resp = api.call_api(f"/openapi/v3/apis/{labels.GROUP}/{remediation_crd.VERSION}", "GET",
                        _preload_content=False, auth_settings=["BearerToken"])
    doc = json.loads((resp[0] if isinstance(resp, tuple) else resp).data)
    schema = doc["components"]["schemas"][f"io.gpufleet.{remediation_crd.VERSION}.Remediation"]
    status = schema["properties"]["status"]
    assert "everything a restart needs" in status["description"]
    assert {"phase", "conditions", "intents", "heldMessage"} <= set(status["properties"])

    store = KubeRemediationStore(api)
    r = Remediation(name="status-itest", node="st-0", pool="h100", xid=79, message="m", phase=Phase.HELD,
                    created=datetime.now(timezone.utc), held_message="2 of 3 unhealthy", held_reason="TooManyUnhealthy")
    assert store.create(r) and store.create(r) is False  # AlreadyExists: made already
    (made,) = [x for x in store.list() if x.name == r.name]
    assert made.phase is Phase.DETECTED  # a create keeps no status
    store.write_status(r)
    custom = client.CustomObjectsApi(api)
    obj = custom.get_cluster_custom_object(labels.GROUP, remediation_crd.VERSION, "remediations", r.name)
    obj["spec"]["message"] = "a person's edit"
    obj["status"]["phase"] = "Succeeded"  # ignored: the main resource does not write the status
    custom.replace_cluster_custom_object(labels.GROUP, remediation_crd.VERSION, "remediations", r.name, obj)
    (back,) = [x for x in store.list() if x.name == r.name]
    assert back.phase is Phase.HELD and back.message == "a person's edit"
    with pytest.raises(Invalid) as e:  # a status the schema refuses: the API server says so, typed
        store.write_status(replace(back, held_reason="not a reason!"))
    assert e.value.code == 422
    with pytest.raises(AlreadyExists) as e:  # as the API server answers a create of a name it has
        _call("create remediation", custom.create_cluster_custom_object, labels.GROUP, remediation_crd.VERSION,
              "remediations", {**{k: v for k, v in obj.items() if k != "status"}, "metadata": {"name": r.name}})
    assert (e.value.code, e.value.reason) == (409, "AlreadyExists")
    assert store.delete(back) is True
    with pytest.raises(NotFound):
        store.write_status(back)


def test_a_dry_run_against_a_real_api_server_changes_nothing(kube_cluster, api, caplog):
    """`gpufleet reconcile --dry-run`'s reconciler: a fault is decided on and logged, and nothing is written."""
    import logging

    spec = fleet("dry", nodes=2, spares=1)
    make_nodes(kube_cluster, spec)
    channel = Recorder()
    rec = build(spec, api, slurm=None, dry_run=True, leader_elect=True)
    rec.notifier.channels = [channel]
    core = client.CoreV1Api(api)
    ours = lambda: [e for e in core.list_namespaced_event("default").items  # noqa: E731
                    if e.source and e.source.component == "gpufleet-reconciler"]
    events_before = len(ours())
    Kube(api).set_condition("dry-0", "GpuHealthy", "False", "Xid79", "off the bus")
    caplog.set_level(logging.INFO, logger="gpufleet.reconciler")
    wait_for("the dry run to say it would cordon dry-0", lambda: (step(rec), any(
        "would Cordon(node='dry-0'" in r.getMessage() for r in caplog.records))[1], timeout=30)
    for _ in range(3):
        step(rec)
    assert rec.elector is None  # no Lease taken
    assert records_for(rec, "dry-0") == [] and channel.messages == []
    assert not core.read_node("dry-0").spec.unschedulable
    assert len(ours()) == events_before


def test_a_refill_the_autoscaler_cannot_answer_is_a_failed_refill_in_the_record_an_event_and_a_metric(
        kube_cluster, api):
    """kubernetes-spares with the cluster autoscaler's stand-in, the pool's node group at its maximum size:
    the capacity request (made as a real autoscaler would answer it) starts no scale-up, and the autoscaler
    says so on it (NotTriggerScaleUp, upstream's words). The reconciler reads that answer at once, not at
    refill_timeout_seconds (30 min here): the record says the refill failed and why, in the autoscaler's
    words, its Events and page say so, it is counted, the placeholder is withdrawn, and the record says when
    it is asked again."""
    from datetime import timedelta

    from localenv.autoscaler_standin import AutoscalerStandIn, NodeGroup, unschedulable

    spec = fleet("rfl", nodes=2, spares=1, refill_timeout_seconds=1800)
    make_nodes(kube_cluster, spec)
    pool = spec.pools[0]
    own = NodeGroup.of_pool(pool, prefix="")
    at_max = NodeGroup(own.name, own.template, tuple(pool.node_names() + pool.spare_names()), ())
    standin = AutoscalerStandIn(api, [at_max], clock=lambda: datetime.now(timezone.utc) + timedelta(minutes=5))
    channel = Recorder()
    rec = reconciler(api, spec, channel)
    core = client.CoreV1Api(api)
    Kube(api).set_condition("rfl-0", "GpuHealthy", "False", "Xid79", "off the bus")
    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "rfl-0") if r.refill and r.phase.terminal])
    assert r.phase is Phase.SUCCEEDED and r.refill.state == "Requested"
    mine = f"{labels.CAPACITY_REQUEST}=rfl"  # other tests of this module leave requests of their own pools
    (placeholder,) = core.list_namespaced_pod("default", label_selector=mine).items
    name = placeholder.metadata.name
    wait_for("the scheduler to find no node for the request", lambda: unschedulable(
        api.sanitize_for_serialization(core.read_namespaced_pod(name, "default"))), timeout=30)
    assert standin.scale_up_once() == []
    told = [e.message for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
            if e.reason == "NotTriggerScaleUp"]
    assert told == ["pod didn't trigger scale-up: 1 max node group size reached"]

    (r,) = run_until(rec, lambda: [r for r in records_for(rec, "rfl-0") if r.refill.state == "Failed"], timeout=60)
    assert f"the capacity request {name} was refused: pod didn't trigger scale-up: 1 max node group size reached" \
        in r.refill.message and r.refill.retry_at is not None
    obj = client.CustomObjectsApi(api).get_cluster_custom_object(labels.GROUP, remediation_crd.VERSION,
                                                                 "remediations", r.name)
    refilled = {c["type"]: c for c in obj["status"]["conditions"]}["Refilled"]
    assert (refilled["status"], refilled["reason"]) == ("False", "RefillFailed")
    assert obj["status"]["refill"]["state"] == "Failed" and obj["status"]["refill"]["retryAt"]
    assert "1 max node group size reached" in refilled["message"]
    wait_for("the Event on the record", lambda: "GpuFleetRefillFailed" in {
        e.reason for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={r.name}").items},
        timeout=30)
    assert [m.event for m in channel.messages].count("refill-failed") == 1
    assert "1 max node group size reached" in next(m for m in channel.messages if m.event == "refill-failed").text
    assert rec.metrics.refills.labels("rfl", "failed")._value.get() == 1
    wait_for("the placeholder withdrawn", lambda: not core.list_namespaced_pod(
        "default", label_selector=mine).items, timeout=30)


def test_a_nodeset_pod_no_node_can_take_is_read_with_the_schedulers_own_words(kube_cluster, api):
    """What a remediation waits on when its Slurm node's pod has nowhere to go (issue 23: a heal was called a
    success while that pod could not run): the pod as the real kube-scheduler leaves it (PodScheduled False,
    reason Unschedulable, its message), read by the reconciler's pod view, and what the record says."""
    from gpufleet.reconciler.core import resume
    from gpufleet.reconciler.core.model import Remediation, StepFacts
    from gpufleet.reconciler.core.observe import pod_view

    from localenv.slinky_standin import NodeSetDef, declare_nodesets, nodeset_owner

    core = client.CoreV1Api(api)
    (nodeset,) = declare_nodesets(api, "default", [NodeSetDef("nowhere", 0, {})])
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "slurm-worker-nowhere-0", "namespace": "default",
                         "ownerReferences": [nodeset_owner(nodeset)],
                         "labels": {labels.SLINKY_POD_HOSTNAME: "nowhere-0"}},
            "spec": {"nodeSelector": {"gpufleet.io/no-such-pool": "x"},
                     "containers": [{"name": "slurmd", "image": "registry.example/slurmd:26.05"}]}}
    core.create_namespaced_pod("default", body)
    try:
        seen = wait_for("the scheduler to find no node for it", lambda: (lambda v: v if v.unschedulable else None)(
            pod_view(api.sanitize_for_serialization(core.read_namespaced_pod("slurm-worker-nowhere-0", "default")),
                     slurm_namespace="default", nodesets=frozenset({"nowhere"}))),
            timeout=60)
        # the scheduler's FitError text: "0/<n> nodes are available: <why per node>" (kubernetes
        # pkg/scheduler/framework/types.go, FitError.Error)
        assert seen.node is None and seen.unschedulable.startswith("0/") and "nodes are available" in seen.unschedulable
        r = Remediation(name="nw-0-xid79-1", node="nw-0", pool="nw", xid=79, message="m", phase=Phase.RESUMING,
                        slurm_nodes=("nowhere-0",), created=datetime.now(timezone.utc))
        why = resume.not_back(r, StepFacts(slurm_pods=(seen,)))
        assert why == {"nowhere-0": f"pod default/slurm-worker-nowhere-0 cannot be scheduled: {seen.unschedulable}"}
    finally:
        core.delete_namespaced_pod("slurm-worker-nowhere-0", "default", grace_period_seconds=0)
