"""The local environment's stand-in for the cluster autoscaler, with a real API server and scheduler: the
reconciler's capacity request (kubernetes-spares) grows the pool's node group by one node, the scheduler
binds the request to it, membership makes it a spare and the request is settled; a group at its maximum
size grows no more. The stand-in makes its template from the pool's existing node, as upstream does (its
clock is a few minutes ahead, so the node just made counts as Ready long enough)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.waiting import wait_for
from localenv import fake_nodes
from localenv.autoscaler_standin import AutoscalerStandIn, node_groups, template_node, unschedulable
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.providers import KubernetesSpares
from gpufleet.reconciler.core import membership, refills
from gpufleet.reconciler.core.model import Refill, RefillState, Remediation
from gpufleet.reconciler.core.phases import Phase

pytestmark = pytest.mark.integration
NS = "gpufleet-asi"
GROUP_LABEL = "node-restriction.kubernetes.io/node-group"
SPEC = parse_fleet({
    "environment": "itest", "cluster": {"kind": "local"},
    "pools": [{"name": "asi", "node_type": "kwok-gpu", "gpu_model": "L40S", "gpus_per_node": 4, "nodes": 1,
               "spares": 0, "member_selector": {GROUP_LABEL: "asi"}, "taints": [{"key": "nvidia.com/gpu"}]}],
    "slurm": {"partitions": [{"name": "p", "pools": ["asi"]}]},
    "healing": {"reconciler": {"namespace": NS}},
})


def test_a_capacity_request_joins_the_next_node_of_the_pool(kube_cluster):
    api = kube_cluster.api_client()
    core, kube = client.CoreV1Api(api), Kube(api)
    pool = SPEC.pool("asi")
    core.create_namespace({"metadata": {"name": NS}})
    wait_for("default ServiceAccount", lambda: core.list_namespaced_service_account(
        NS, field_selector="metadata.name=default").items, timeout=30)
    core.create_node(fake_nodes.pool_node(pool, "kwok-asi-0", labels.ROLE_ACTIVE))
    provider = KubernetesSpares(kube, SPEC)
    standin = AutoscalerStandIn(api, node_groups(SPEC), clock=lambda: datetime.now(timezone.utc) + timedelta(minutes=5))
    try:
        provider.request_capacity("asi", "refill the spare used for kwok-asi-x", "asi-x-xid79-1")
        (pod,) = core.list_namespaced_pod(NS, label_selector=labels.CAPACITY_REQUEST).items
        name = pod.metadata.name
        wait_for("the scheduler to find no room", lambda: unschedulable(
            api.sanitize_for_serialization(core.read_namespaced_pod(name, NS))), timeout=30)

        wait_for("kwok-asi-0 Ready", lambda: any(c.type == "Ready" and c.status == "True"
                                                 for c in core.read_node("kwok-asi-0").status.conditions or []), timeout=30)
        group = node_groups(SPEC)[0]
        template = template_node(group, [api.sanitize_for_serialization(n) for n in core.list_node().items],
                                 standin.clock())
        assert template["metadata"]["labels"][labels.ROLE] == labels.ROLE_ACTIVE  # made from kwok-asi-0
        assert standin.scale_up_once() == ["kwok-asi-spare-0"]  # the pool's node group, one node larger
        assert standin.scale_up_once() == []  # the request waits for the node asked for it, no second one
        wait_for("the request bound to the new node",
                 lambda: core.read_namespaced_pod(name, NS).spec.node_name == "kwok-asi-spare-0", timeout=60)
        events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        assert any(e.reason == "TriggeredScaleUp" and "asi 1->2 (max: 3)" in e.message for e in events)

        nodes = [n for n in kube.list_nodes()[0] if n["metadata"]["name"].startswith("kwok-asi-")]
        plan = membership.plan(nodes, SPEC, provider.membership_facts())
        assert [(c.node, c.labels.get(labels.ROLE)) for c in plan.changes] == [("kwok-asi-spare-0", labels.ROLE_SPARE)]
        for c in plan.changes:
            kube.apply_membership(c.node, dict(c.labels), list(c.add_taints))
        assert provider.settle_capacity_requests() == [name]

        # Two more requests: the group has room for one more node (max 3), then it is at its maximum size.
        for key in ("asi-y-xid79-2", "asi-z-xid79-3"):
            provider.request_capacity("asi", "refill", key)
        wait_for("both new requests unschedulable", lambda: sum(
            unschedulable(api.sanitize_for_serialization(p))
            for p in core.list_namespaced_pod(NS, label_selector=labels.CAPACITY_REQUEST).items) == 2, timeout=30)
        assert standin.scale_up_once() == ["kwok-asi-spare-1"]
        assert standin.scale_up_once() == []
        events = [e for e in core.list_namespaced_event(NS).items if e.reason == "NotTriggerScaleUp"]
        assert [e.message for e in events] == ["pod didn't trigger scale-up: 1 max node group size reached"]
        # The reconciler reads that no at once (the record and the page say it; the request is not left to
        # time out): the provider finds the Event on the refused request, and only there.
        asked = [refills.request_name("asi", k) for k in ("asi-y-xid79-2", "asi-z-xid79-3")]
        refused = events[0].involved_object.name
        assert refused in asked
        assert provider.capacity_refusals("asi", asked) == {
            refused: "pod didn't trigger scale-up: 1 max node group size reached"}
        now = datetime.now(timezone.utc)
        r = Remediation("asi-z-xid79-3", "kwok-asi-x", "asi", 79, "m", Phase.SUCCEEDED, now,
                        refill=Refill([k for k in ("asi-y-xid79-2", "asi-z-xid79-3")
                                       if refills.request_name("asi", k) == refused][0], RefillState.REQUESTED, now))
        step = refills.settle(r, (), SPEC, now, refusals=provider.capacity_refusals("asi", asked))
        assert step.remediation.refill.state == RefillState.FAILED
        assert "1 max node group size reached" in step.remediation.refill.message
    finally:
        for n in ("kwok-asi-0", "kwok-asi-spare-0", "kwok-asi-spare-1", "kwok-asi-spare-2"):
            try:
                core.delete_node(n)
            except client.ApiException:
                pass
        core.delete_namespace(NS)
