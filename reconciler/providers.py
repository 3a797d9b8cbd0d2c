"""Node providers: who turns a spare into a worker, takes a bad node out, and refills spares.

One interface, three providers:
- `kubernetes-spares` (default, cloud-agnostic): spares are pre-joined nodes with the spare
  label and taint; promotion removes the taint. Refills are asked of whoever adds nodes
  (cluster autoscaler, a human) through an Event.
- `aws-asg`: the same on Kubernetes, plus the Auto Scaling group (boto3): the bad instance
  is detached (the group launches a replacement, which joins as a spare); no spare left
  raises the desired capacity.
- `local`: the local environment's fake nodes (kwok) and real Slurm: promotion also
  resumes the spare's slurmd node; a refill joins the next reserved fake node.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

from fleetspec import labels
from fleetspec.models import FleetSpec, NodePool

from .errors import PermanentError, TemporaryError
from .kube import Kube
from .local_nodes import join_reserve_spare
from .slurm import SlurmClient, SlurmError

log = logging.getLogger(__name__)

SPARE_TAINT = {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}


def quarantine_taint(xid: int) -> dict[str, str]:
    return {"key": labels.QUARANTINE_TAINT, "value": f"xid-{xid}", "effect": "NoSchedule"}


class NodeProvider(Protocol):
    def promote(self, spare: str, replaces: str) -> None: ...
    def quarantine(self, node: str, xid: int) -> None: ...
    def request_capacity(self, pool: str, reason: str, key: str) -> None:
        """Ask for one more node; idempotent by `key` (the remediation and purpose)."""
    def return_to_spares(self, node: str) -> None: ...


def slurm_call(fn, *args):
    """Slurm errors as the reconciler's typed errors."""
    try:
        return fn(*args)
    except SlurmError as e:
        raise (TemporaryError if e.temporary else PermanentError)(f"Slurm: {e}") from None


class KubernetesSpares:
    def __init__(self, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None = None):
        self.kube, self.spec, self.slurm = kube, spec, slurm

    def promote(self, spare: str, replaces: str) -> None:
        self.kube.set_node_role(spare, labels.ROLE_ACTIVE, remove_taints=[labels.SPARE_TAINT],
                                annotations={labels.PROMOTED_FOR: replaces}, schedulable=True)

    def quarantine(self, node: str, xid: int) -> None:
        self.kube.set_node_role(node, labels.ROLE_QUARANTINED, add_taints=[quarantine_taint(xid)],
                                remove_taints=[labels.SPARE_TAINT], schedulable=False)

    def request_capacity(self, pool: str, reason: str, key: str = "") -> None:
        self.kube.event({"kind": "Node", "name": pool, "apiVersion": "v1"}, "SpareCapacityRequested",
                        f"pool {pool}: {reason}; add a node labelled {labels.POOL}={pool},{labels.ROLE}=spare", "Warning")

    def return_to_spares(self, node: str) -> None:
        self.kube.set_node_role(node, labels.ROLE_SPARE, add_taints=[SPARE_TAINT],
                                remove_taints=[labels.QUARANTINE_TAINT], schedulable=True,
                                annotations={labels.PROMOTED_FOR: None, labels.REMEDIATION: None})


class LocalProvider(KubernetesSpares):
    """Fake nodes from kwok and a real Slurm whose nodes are named like the Kubernetes ones."""

    def request_capacity(self, pool: str, reason: str, key: str = "") -> None:
        joined = join_reserve_spare(self.kube, self.spec.pool(pool), key)
        log.info("local refill for pool %s (%s): %s", pool, reason, joined or "reserve exhausted")


class AwsAsgProvider(KubernetesSpares):
    """Spares on Kubernetes, capacity from an EC2 Auto Scaling group (boto3)."""

    def __init__(self, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None = None, session: Any = None):
        super().__init__(kube, spec, slurm)
        import boto3

        self._session = session or boto3.session.Session()
        self._clients: dict[str, Any] = {}

    def _asg(self, pool: NodePool):
        assert pool.aws is not None
        if pool.aws.region not in self._clients:
            self._clients[pool.aws.region] = self._session.client("autoscaling", region_name=pool.aws.region)
        return self._clients[pool.aws.region]

    def _pool_of(self, node: str) -> NodePool:
        name = (self.kube.get_node(node)["metadata"].get("labels") or {}).get(labels.POOL)
        return self.spec.pool(name)

    @staticmethod
    def instance_id(node: dict) -> str | None:
        pid = node.get("spec", {}).get("providerID", "")  # aws:///us-east-1a/i-0abc...
        return pid.rsplit("/", 1)[-1] if pid.startswith("aws://") else None

    def quarantine(self, node: str, xid: int) -> None:
        super().quarantine(node, xid)
        obj = self.kube.get_node(node)
        pool = self.spec.pool(obj["metadata"]["labels"][labels.POOL])
        iid = self.instance_id(obj)
        if not iid:
            raise PermanentError(f"node {node} has no AWS providerID; cannot detach it from {pool.aws.asg_name}")
        asg = self._asg(pool)
        group = self._group(asg, pool)
        if iid in {i["InstanceId"] for i in group["Instances"]}:
            # Keep the desired capacity: the group launches a replacement, which joins as a spare.
            asg.detach_instances(InstanceIds=[iid], AutoScalingGroupName=pool.aws.asg_name,
                                 ShouldDecrementDesiredCapacity=False)
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceDetached",
                        f"{iid} detached from {pool.aws.asg_name} for repair; a replacement is launching")

    def request_capacity(self, pool_name: str, reason: str, key: str = "") -> None:
        pool = self.spec.pool(pool_name)
        asg = self._asg(pool)
        group = self._group(asg, pool)
        want = group["DesiredCapacity"] + 1
        if want > group["MaxSize"]:
            raise PermanentError(f"{pool.aws.asg_name} is at its MaxSize {group['MaxSize']}: {reason}")
        asg.set_desired_capacity(AutoScalingGroupName=pool.aws.asg_name, DesiredCapacity=want, HonorCooldown=False)
        log.info("raised %s desired capacity to %d: %s", pool.aws.asg_name, want, reason)

    def _group(self, asg, pool: NodePool) -> dict:
        try:
            groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[pool.aws.asg_name])["AutoScalingGroups"]
        except Exception as e:  # botocore's errors: endpoint down, throttled
            raise TemporaryError(f"describe {pool.aws.asg_name}: {e}") from None
        if not groups:
            raise PermanentError(f"Auto Scaling group {pool.aws.asg_name} not found in {pool.aws.region}")
        return groups[0]


def provider_for(pool: NodePool, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None, **kw) -> NodeProvider:
    if pool.provider == "aws-asg":
        return AwsAsgProvider(kube, spec, slurm, **kw)
    if pool.provider == "local":
        return LocalProvider(kube, spec, slurm)
    return KubernetesSpares(kube, spec, slurm)
