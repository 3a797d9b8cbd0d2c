"""The aws-asg node provider: nodes on a real API server, the Auto Scaling group on a moto server."""
from __future__ import annotations

import boto3
import pytest
from kubernetes import client
from moto.server import ThreadedMotoServer

from fleetspec import labels, parse_fleet
from reconciler import local_nodes
from reconciler.errors import PermanentError
from reconciler.kube import Kube
from reconciler.providers import AwsAsgProvider

pytestmark = pytest.mark.integration
ASG = "gpu-itest-h100"


@pytest.fixture(scope="module")
def aws(monkeypatch_module):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
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
    asg = session.client("autoscaling")
    asg.create_auto_scaling_group(AutoScalingGroupName=ASG, LaunchTemplate={"LaunchTemplateName": "gpu"},
                                  MinSize=0, MaxSize=5, DesiredCapacity=3, AvailabilityZones=["us-east-1a"])
    yield session
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def instances(session):
    g = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"][0]
    return g, sorted(i["InstanceId"] for i in g["Instances"])


def test_quarantine_detaches_the_instance_and_capacity_is_raised(kube_cluster, aws):
    spec = parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": "awsp", "node_type": "p5.48xlarge", "gpu_model": "H100", "nodes": 2, "spares": 1,
                   "provider": "aws-asg", "aws": {"asg_name": ASG, "region": "us-east-1"}}],
        "slurm": {"partitions": [{"name": "p", "pools": ["awsp"]}]},
    })
    pool = spec.pools[0]
    group, ids = instances(aws)
    assert len(ids) == 3
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    names = pool.node_names() + pool.spare_names()
    for name, iid in zip(names, ids):
        node = local_nodes.pool_node(pool, name, labels.ROLE_SPARE if "spare" in name else labels.ROLE_ACTIVE)
        node["spec"]["providerID"] = f"aws:///us-east-1a/{iid}"
        core.create_node(node)
    provider = AwsAsgProvider(Kube(api), spec, None, session=aws)

    provider.promote("awsp-spare-0", "awsp-0")
    provider.quarantine("awsp-0", 79)
    group, after = instances(aws)
    assert ids[0] not in after  # detached for repair
    assert group["DesiredCapacity"] == 3 and len(after) == 3  # the group launched a replacement
    bad = core.read_node("awsp-0")
    assert bad.metadata.labels[labels.ROLE] == labels.ROLE_QUARANTINED and bad.spec.unschedulable
    provider.quarantine("awsp-0", 79)  # idempotent: already detached, nothing else happens
    assert instances(aws)[0]["DesiredCapacity"] == 3

    provider.request_capacity("awsp", "no spare left")
    assert instances(aws)[0]["DesiredCapacity"] == 4
    provider.request_capacity("awsp", "again")
    with pytest.raises(PermanentError, match="MaxSize"):
        provider.request_capacity("awsp", "past the maximum")
