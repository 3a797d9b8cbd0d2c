"""The aws-asg node provider as a whole chain: nodes on a real API server, the Auto Scaling group
on a moto server. Fault, promotion, refill, the new instance joining as a spare, a replay after a
restart, MaxSize, the quarantine and the terminate modes; the instance count asserted at the end."""
from __future__ import annotations

import boto3
import pytest
from kubernetes import client
from moto.server import ThreadedMotoServer

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.reconciler.core import membership
from gpufleet.reconciler.errors import PermanentError, TemporaryError
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.providers import AwsAsgProvider
from gpufleet.reconciler.core.actions import ApplyMembership

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def aws(monkeypatch_module):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        monkeypatch_module.setenv(k, v)
    session = boto3.session.Session()
    ec2 = session.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": image,
                                                                          "InstanceType": "p5.48xlarge"})
    yield session
    server.stop()


def make_group(session, name: str, desired: int, max_size: int) -> None:
    session.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": "gpu"}, MinSize=0, MaxSize=max_size,
        DesiredCapacity=desired, AvailabilityZones=["us-east-1a"])


def group(session, name: str) -> tuple[dict, list[str]]:
    g = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return g, sorted(i["InstanceId"] for i in g["Instances"])


def state(session, iid: str) -> tuple[str, dict[str, str]]:
    inst = session.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    return inst["State"]["Name"], {t["Key"]: t["Value"] for t in inst.get("Tags") or []}


def spec_for(pool: str, asg: str, on_fault: str):
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": pool, "node_type": "p5.48xlarge", "gpu_model": "H100", "nodes": 2, "spares": 1,
                   "provider": "aws-asg", "aws": {"asg_name": asg, "region": "us-east-1", "on_fault": on_fault},
                   "taints": [{"key": "nvidia.com/gpu"}]}],
        "slurm": {"partitions": [{"name": "p", "pools": [pool]}]},
    })


def private_dns_name(session, iid: str) -> str:
    return session.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["PrivateDnsName"]


def join(core, session, iid: str, name: str | None = None) -> str:
    """A node the kubelet of a new instance registers: no gpufleet label yet, only its providerID, under
    the one name its credentials allow on EKS (the instance's private DNS name), unless `name` forges one."""
    name = name or private_dns_name(session, iid)
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                   "annotations": {"kwok.x-k8s.io/node": "fake"}},
                      "spec": {"providerID": f"aws:///us-east-1a/{iid}"},
                      "status": {"capacity": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}}})
    return name


def label_members(kube: Kube, provider: AwsAsgProvider, spec) -> membership.MembershipPlan:
    """What a membership pass does (reconciler/runtime/membership_pass.py): the core plans from the provider's
    facts, and each change is made as the executor makes it."""
    facts = provider.membership_facts()
    ours = set(facts.instance_groups)
    nodes = [n for n in kube.list_nodes()[0] if (n["metadata"].get("labels") or {}).get(labels.NODE_POOL)
             == spec.pools[0].name or membership.instance_id(n) in ours]
    result = membership.plan(nodes, spec, facts)
    for a in membership.membership_actions(result):
        if isinstance(a, ApplyMembership):
            kube.apply_membership(a.node, dict(a.labels), [dict(t) for t in a.add_taints], seen=a.seen)
    return result


def roles(core, pool: str) -> dict[str, str]:
    return {n.metadata.name: (n.metadata.labels or {}).get(labels.ROLE)
            for n in core.list_node(label_selector=f"{labels.NODE_POOL}={pool}").items}


def replace_step(provider, spare: str, bad: str, pool: str, key: str) -> None:
    """The actions of decide's Replacing step, in its order."""
    provider.promote(spare, bad)
    provider.quarantine(bad, 79)
    provider.request_capacity(pool, f"refill the spare used for {bad}", key)


def joined_group(kube_cluster, aws, asg: str, pool: str, on_fault: str, max_size: int):
    """A group of 3 instances whose nodes have joined the cluster, the pool's provider, the instance ids."""
    make_group(aws, asg, desired=3, max_size=max_size)
    spec = spec_for(pool, asg, on_fault)
    api = kube_cluster.api_client()
    core, kube = client.CoreV1Api(api), Kube(api)
    _, ids = group(aws, asg)
    for iid in ids:
        join(core, aws, iid)
    return spec, core, kube, AwsAsgProvider(kube, spec, None, session=aws), ids


def test_one_instance_per_fault_through_the_whole_chain(kube_cluster, aws):
    asg, pool = "gpu-itest-quarantine", "awsq"
    spec, core, kube, provider, ids = joined_group(kube_cluster, aws, asg, pool, "quarantine", max_size=4)

    # Membership: the group's instances become the pool's, 2 active then 1 spare with its taint.
    label_members(kube, provider, spec)
    got = roles(core, pool)
    assert sorted(got.values()) == ["active", "active", "spare"]
    spare = next(n for n, r in got.items() if r == "spare")
    assert {labels.SPARE_TAINT, "nvidia.com/gpu"} <= {t.key for t in core.read_node(spare).spec.taints}
    bad = sorted(n for n, r in got.items() if r == "active")[0]
    bad_iid = core.read_node(bad).spec.provider_id.rsplit("/", 1)[-1]

    # The fault: promote the spare, the bad instance leaves (desired 3 -> 2), the refill adds one (-> 3).
    replace_step(provider, spare, bad, pool, "awsq-n0-xid79-1")
    g, after = group(aws, asg)
    assert g["DesiredCapacity"] == 3 and len(after) == 3 and bad_iid not in after
    run, tags = state(aws, bad_iid)
    assert run == "running" and tags[labels.QUARANTINED_TAG] == "xid-79"  # kept for a human, tagged
    assert core.read_node(bad).metadata.labels[labels.ROLE] == labels.ROLE_QUARANTINED

    # The new instance joins and becomes the pool's spare.
    (new_iid,) = set(after) - set(ids)
    new = join(core, aws, new_iid)
    plan = label_members(kube, provider, spec)
    assert [(c.node, c.labels.get(labels.ROLE)) for c in plan.changes] == [(new, "spare")]

    # A replay after a restart (a new provider, the same step): nothing changes.
    again = AwsAsgProvider(kube, spec, None, session=boto3.session.Session())
    replace_step(again, spare, bad, pool, "awsq-n0-xid79-1")
    assert group(aws, asg)[0]["DesiredCapacity"] == 3 and group(aws, asg)[1] == after
    assert label_members(kube, again, spec).changes == ()

    # MaxSize: a refill with no instance leaving (no spare left) takes the group to 4 = MaxSize;
    # then the provider says so before anything is promoted, and a request changes nothing.
    assert again.can_refill(pool)
    again.request_capacity(pool, "no spare for x", "awsq-other-xid79-2")
    assert group(aws, asg)[0]["DesiredCapacity"] == 4 and not again.can_refill(pool)
    with pytest.raises(PermanentError, match="MaxSize 4"):
        again.request_capacity(pool, "no spare for y", "awsq-other-xid79-3")
    g, final = group(aws, asg)
    assert g["DesiredCapacity"] == 4 and len(final) == 4
    # At MaxSize a replacement still fits: the faulted instance leaves first, then the refill.
    join(core, aws, sorted(set(final) - set(after))[0])
    label_members(kube, again, spec)
    now = roles(core, pool)
    actives = sorted(n for n, r in now.items() if r == "active")
    spares = sorted(n for n, r in now.items() if r == "spare")
    replace_step(again, spares[0], actives[0], pool, "awsq-xid79-4")
    g, end = group(aws, asg)
    assert g["DesiredCapacity"] == 4 and len(end) == 4

    # In all: two faults, two refills, one addition; two instances out of the group, still running.
    quarantined = [i for i in set(ids) | set(final) if state(aws, i)[1].get(labels.QUARANTINED_TAG)]
    assert len(quarantined) == 2 and all(state(aws, i)[0] == "running" for i in quarantined)
    assert len(set(end) | set(quarantined)) == 6  # 3 at the start + 2 refills + 1 addition, never more


def test_terminate_mode_decrements_then_refills(kube_cluster, aws):
    asg, pool = "gpu-itest-terminate", "awst"
    # at MaxSize from the start: a replacement still fits
    spec, core, kube, provider, _ = joined_group(kube_cluster, aws, asg, pool, "terminate", max_size=3)
    label_members(kube, provider, spec)
    got = roles(core, pool)
    spare = next(n for n, r in got.items() if r == "spare")
    bad = sorted(n for n, r in got.items() if r == "active")[0]
    bad_iid = core.read_node(bad).spec.provider_id.rsplit("/", 1)[-1]
    assert not provider.can_refill(pool)  # nothing can be added...
    replace_step(provider, spare, bad, pool, "awst-n0-xid79-1")  # ...but a replacement is one out, one in
    replace_step(provider, spare, bad, pool, "awst-n0-xid79-1")  # replayed
    g, after = group(aws, asg)
    assert g["DesiredCapacity"] == 3 and len(after) == 3 and bad_iid not in after
    assert state(aws, bad_iid)[0] in ("shutting-down", "terminated")


@pytest.mark.parametrize("on_fault", ["terminate", "quarantine"])
def test_an_instance_held_for_repair_whose_node_disappears_is_settled_and_refilled(kube_cluster, aws, on_fault):
    """A node held out of its group for a repair (detached, tagged) whose Node object is deleted: the provider
    finds the instance by its tags, terminates it or keeps it tagged for the vendor as on_fault says, and asks
    for one node, once (a replay changes nothing)."""
    asg, pool = f"gpu-itest-gone-{on_fault}", f"gone{on_fault[0]}"
    spec, core, kube, provider, _ = joined_group(kube_cluster, aws, asg, pool, on_fault, max_size=5)
    label_members(kube, provider, spec)
    bad = sorted(n for n, r in roles(core, pool).items() if r == "active")[0]
    iid = core.read_node(bad).spec.provider_id.rsplit("/", 1)[-1]
    provider.quarantine(bad, 79, repair=True)
    g, members = group(aws, asg)
    assert iid not in members and g["DesiredCapacity"] == 2 and labels.REPAIRING_TAG in state(aws, iid)[1]
    core.delete_node(bad)
    for _ in range(2):  # replayed
        provider.forget(bad, pool, "its Node object disappeared during the repair", f"{bad}-rem/gone")
    g, members = group(aws, asg)
    assert g["DesiredCapacity"] == 3 and iid not in members
    now, tags = state(aws, iid)
    if on_fault == "terminate":
        assert now in ("shutting-down", "terminated")
    else:
        assert now == "running" and tags[labels.QUARANTINED_TAG] == "retired" and labels.REPAIRING_TAG not in tags


def test_botocore_errors_are_typed(kube_cluster, aws, monkeypatch):
    spec = spec_for("awse", "no-such-group", "quarantine")
    kube = Kube(kube_cluster.api_client())
    with pytest.raises(PermanentError, match="no-such-group not found"):
        AwsAsgProvider(kube, spec, None, session=aws).request_capacity("awse", "x", "k")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: the endpoint is down
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(TemporaryError, match="AWS describe-auto-scaling-groups"):
        AwsAsgProvider(kube, spec, None, session=boto3.session.Session()).request_capacity("awse", "x", "k")


def test_a_kubelet_naming_a_fresh_instance_of_the_group_enrols_in_nothing(kube_cluster, aws):
    """A compromised kubelet writes a providerID of its choice, that of an instance the group just started
    whose node has not registered yet. Its name it cannot choose (EKS maps a node's credentials to
    system:node:<the instance's private DNS name>, and NodeRestriction holds it to that Node), so the
    forged node is reported and enrols in nothing, and the instance's own node joins when it registers."""
    asg, pool = "gpu-itest-forged", "awsf"
    make_group(aws, asg, desired=1, max_size=1)
    spec = spec_for(pool, asg, "quarantine")
    api = kube_cluster.api_client()
    core, kube = client.CoreV1Api(api), Kube(api)
    provider = AwsAsgProvider(kube, spec, None, session=aws)
    _, (iid,) = group(aws, asg)
    forged = join(core, aws, iid, name="awsf-forger")  # first to register, naming the fresh instance
    result = label_members(kube, provider, spec)
    assert result.changes == () and any(n == forged and why.startswith(f"names instance {iid}") for n, why in result.conflicts)
    assert labels.NODE_POOL not in (core.read_node(forged).metadata.labels or {})
    real = join(core, aws, iid)
    assert real == private_dns_name(aws, iid) and real.startswith("ip-")  # as EC2 names it (moto follows)
    result = label_members(kube, provider, spec)
    assert [(c.node, c.labels.get(labels.ROLE)) for c in result.changes] == [(real, labels.ROLE_ACTIVE)]
    assert roles(core, pool) == {real: labels.ROLE_ACTIVE}

    # An instance's name is asked of EC2 once: it is fixed for the instance's life, and the membership
    # pass runs about once a second in a storm.
    asked: list[list[str]] = []
    session = boto3.session.Session()
    session.events.register("before-parameter-build.ec2.DescribeInstances",
                            lambda params, **_: asked.append(sorted(params["InstanceIds"])))
    counted = AwsAsgProvider(kube, spec, None, session=session)
    assert dict(counted.membership_facts().instance_names) == {iid: real}
    assert dict(counted.membership_facts().instance_names) == {iid: real}
    assert asked == [[iid]]


def test_a_surplus_spare_is_scaled_in_once_and_a_full_group_says_so_in_its_numbers(kube_cluster, aws):
    """The surplus decision (core/surplus.py) acted on by aws-asg: the spare leaves the group with the
    desired capacity decremented (the group does not replace it), once however often it is given back; a
    group at its MaxSize answers a refill with its numbers, which the record and the page say."""
    from gpufleet.reconciler.core import surplus
    from gpufleet.reconciler.core.actions import GiveBack
    from gpufleet.reconciler.core.observe import node_view

    asg, pool = "gpu-itest-surplus", "awss"
    spec, core, kube, provider, ids = joined_group(kube_cluster, aws, asg, pool, "terminate", max_size=3)
    label_members(kube, provider, spec)
    assert provider.refill_refusal(pool) == f"AWS: {asg} is at its MaxSize 3 (desired 3)"
    # The pool declares 1 spare; a second one joins as a spare (a repaired node back, a late refill).
    spare = next(n for n, r in roles(core, pool).items() if r == "spare")
    core.patch_node(sorted(n for n, r in roles(core, pool).items() if r == "active")[0],
                    {"metadata": {"labels": {labels.ROLE: labels.ROLE_SPARE}}})
    views = [node_view(n, spec.healing.condition_types) for n in kube.list_nodes()[0]
             if (n["metadata"].get("labels") or {}).get(labels.NODE_POOL) == pool]
    (give,) = surplus.plan(spec.pool(pool), views, [])
    assert isinstance(give, GiveBack) and give.node in {n for n, r in roles(core, pool).items() if r == "spare"}
    iid = core.read_node(give.node).spec.provider_id.rsplit("/", 1)[-1]
    provider.give_back(give.node, give.why)
    provider.give_back(give.node, give.why)  # a replay: the instance is out of the group already
    g, after = group(aws, asg)
    assert g["DesiredCapacity"] == 2 and iid not in after and len(after) == 2
    assert state(aws, iid)[0] in ("shutting-down", "terminated")
    assert core.read_node(give.node).metadata.labels[labels.ROLE] == labels.ROLE_SURPLUS
    assert provider.refill_refusal(pool) == ""  # room again for a refill
    assert spare in roles(core, pool)
