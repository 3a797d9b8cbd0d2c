"""Node providers: who turns a spare into a worker, takes a bad node out, and refills spares.

One interface, three providers:
- `kubernetes-spares` (default, cloud-agnostic): spares are pre-joined nodes with the spare
  label and taint; promotion removes the taint. A refill is a declared capacity request: a
  pending placeholder pod that fits one node of the pool, which a cluster autoscaler acts on (or
  a person: `kubectl get pods -l gpufleet.io/capacity-request`); once it is bound to a node that
  joined, the request is settled (the pod deleted) and membership makes that node a spare.
- `aws-asg`: the same on Kubernetes, plus the Auto Scaling group (boto3): a faulted instance
  leaves the group with the desired capacity decremented (terminated, or detached and tagged
  for a human, as the spec says); a refill raises the desired capacity by exactly one, once per
  remediation (the key is recorded as a group tag, so a replay changes nothing).

The local environment's pools are `kubernetes-spares` too: a stand-in for the cluster autoscaler there
(localenv/autoscaler_standin.py) answers the capacity requests.

Repairs (issue 25), per provider:
- a GPU reset, and a reboot on `kubernetes-spares`, are asked of the node itself: a request annotation
  (`gpufleet.io/repair-request`, fleetspec/node_repair.py) that the node agent, already privileged on the
  node, carries out once per request id and answers in `gpufleet.io/repair-result`. The reconciler needs no
  privilege on the node for it (and no grant beyond the node patch it has).
- `aws-asg` reboots through EC2 (RebootInstances); a node it will repair leaves its group the way a
  quarantined one does (detached, the desired capacity decremented), so the group does not replace it
  while it reboots, and is attached again when it returns (the desired capacity grows back by one).
- retiring: `kubernetes-spares` labels the node `gpufleet.io/role=retired` for a person or an autoscaler
  and asks for a node when nothing replaced it yet; `aws-asg` terminates it, or keeps it tagged for the
  vendor, as `aws.on_fault` says.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import PAUSE_IMAGE, FleetSpec, NodePool
from gpufleet.fleetspec.node_repair import REBOOT, RepairRequest
from gpufleet.fleetspec.placement import SPARE_TAINT, worker_tolerations

from gpufleet.reconciler.adapters.aws_errors import typed
from gpufleet.reconciler.adapters.kube import Kube, _call, _json
from gpufleet.reconciler.adapters.slurm import SlurmClient
from gpufleet.reconciler.core.membership import MembershipFacts, instance_id, settle
from gpufleet.reconciler.core.refills import NOT_TRIGGER_SCALE_UP, pool_refusals, request_name
from gpufleet.reconciler.errors import AlreadyExists, NotFound, PermanentError

log = logging.getLogger(__name__)

KEEP_REFILL_TAGS = 20  # an ASG holds at most 50 tags


def quarantine_taint(xid: int) -> dict[str, str]:
    return {"key": labels.QUARANTINE_TAINT, "value": f"xid-{xid}", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Capacity:
    """A pool's node group as its provider sees it."""

    desired: int
    max_size: int

    @property
    def can_add(self) -> bool:
        return self.desired < self.max_size


class NodeProvider(Protocol):
    def promote(self, spare: str, replaces: str) -> None: ...
    def quarantine(self, node: str, xid: int, repair: bool = False) -> None: ...
    def request_repair(self, node: str, request: RepairRequest) -> None: ...
    def retire(self, node: str, reason: str, refill: str | None = None) -> None: ...
    def forget(self, node: str, pool: str, reason: str, refill: str | None = None) -> None: ...
    def back_in_service(self, node: str) -> None: ...
    def request_capacity(self, pool: str, reason: str, key: str) -> None: ...
    def can_refill(self, pool: str) -> bool: ...
    def return_to_spares(self, node: str) -> None: ...
    def give_back(self, node: str, why: str) -> None: ...
    def membership_facts(self) -> MembershipFacts: ...
    def settle_capacity_requests(self, nodes: list[dict] | None = None) -> list[str]: ...
    def withdraw_capacity_request(self, pool: str, key: str) -> None: ...


def placeholder_pod(pool: NodePool, key: str, reason: str, namespace: str, existing: Iterable[str] = (),
                    image: str = PAUSE_IMAGE) -> dict:
    """A pod that fits one new node of the pool and no node that exists when it is asked for.

    A real cluster autoscaler decides whether a pending pod would fit a node group by a template made
    from one of the group's Ready, schedulable nodes: its labels and taints kept, only its name and
    hostname fresh (cluster-autoscaler 1.32 processors/nodeinfosprovider/mixed_nodeinfos_processor.go,
    simulator/node_info_utils.go createSanitizedNode; taints dropped only for the autoscaler's own, the
    node-condition ones and the startup/status prefixes, utils/taints/taints.go SanitizeTaints). So the
    pod asks only for what every node of the group carries: the pool's member selector, the pool's taints
    tolerated, and also the spare and lending taints (the template may be made from a spare, lent or not),
    one node's GPUs. What keeps it off the nodes that exist is their names: one `metadata.name NotIn`
    field requirement per node (a node field requirement takes one value: k8s.io/kubernetes
    pkg/apis/core/validation ValidateNodeFieldSelectorRequirement), which a template's fresh name and any
    node that joins later pass.

    It passes Pod Security `restricted` (its namespace's level) and the admission policy that limits what
    the reconciler may create (components/admission.py): non-root, no privilege, no capability, no volume."""
    selector = dict(pool.member_selector) or {labels.NODE_POOL: pool.name}
    not_these = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in sorted(set(existing))]
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": not_these}]}}}} if not_these else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": request_name(pool.name, key), "namespace": namespace,
                     "labels": {labels.CAPACITY_REQUEST: pool.name, labels.APP_PART_OF: labels.PART_OF},
                     "annotations": {labels.REQUEST_KEY: key, labels.REQUEST_REASON: reason[:500]}},
        "spec": {
            "nodeSelector": selector,
            **affinity,
            "tolerations": worker_tolerations(pool) + [
                {"key": labels.SPARE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                {"key": labels.LENDING_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "runAsGroup": 65535,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "hold", "image": image,
                "resources": {"requests": {"nvidia.com/gpu": str(pool.gpus_per_node)},
                              "limits": {"nvidia.com/gpu": str(pool.gpus_per_node)}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


class KubernetesSpares:
    def __init__(self, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None = None):
        self.kube, self.spec, self.slurm = kube, spec, slurm
        self.namespace = spec.healing.reconciler.namespace

    def promote(self, spare: str, replaces: str) -> None:
        self.kube.set_node_role(spare, labels.ROLE_ACTIVE, remove_taints=[labels.SPARE_TAINT],
                                annotations={labels.PROMOTED_FOR: replaces}, schedulable=True)

    def quarantine(self, node: str, xid: int, repair: bool = False) -> None:
        self.kube.set_node_role(node, labels.ROLE_QUARANTINED, add_taints=[quarantine_taint(xid)],
                                remove_taints=[labels.SPARE_TAINT], schedulable=False)

    def request_repair(self, node: str, request: RepairRequest) -> None:
        """Ask the node (its agent) for a reset or a reboot: acted on once per request id."""
        self.kube.patch_node(node, {"metadata": {"annotations": {labels.REPAIR_REQUEST: request.dumps()}}})

    def retire(self, node: str, reason: str, refill: str | None = None) -> None:
        """Out for good: `retired`, cordoned, tainted, why in an annotation; a node asked for when none
        replaced it yet (`refill`: the request's key)."""
        view = self.kube.get_node(node)
        xid_taint = next((t for t in (view.get("spec") or {}).get("taints") or []
                          if t.get("key") == labels.QUARANTINE_TAINT), None)
        self.kube.set_node_role(node, labels.ROLE_RETIRED,
                                add_taints=[xid_taint or {"key": labels.QUARANTINE_TAINT, "value": "retired",
                                                          "effect": "NoSchedule"}],
                                remove_taints=[labels.SPARE_TAINT], schedulable=False,
                                annotations={labels.RETIRED: reason[:1000], labels.REPAIR_REQUEST: None})
        pool = (view["metadata"].get("labels") or {}).get(labels.NODE_POOL)
        if refill and pool:
            self.request_capacity(pool, f"{node} retired", refill)

    def forget(self, node: str, pool: str, reason: str, refill: str | None = None) -> None:
        """The node's Node object is gone mid-repair: nothing of it is left on Kubernetes to undo; a node is
        asked for when none replaced it yet (`refill`: the request's key)."""
        if refill:
            self.request_capacity(pool, f"{node} gone: {reason}", refill)

    def back_in_service(self, node: str) -> None:
        """Back to work where it is (its Slurm node still runs there): active, schedulable, untainted."""
        self.kube.set_node_role(node, labels.ROLE_ACTIVE, remove_taints=[labels.QUARANTINE_TAINT, labels.SPARE_TAINT],
                                schedulable=True, annotations={labels.REMEDIATION: None, labels.REPAIR_REQUEST: None})

    def request_capacity(self, pool: str, reason: str, key: str) -> None:
        """Declare that the pool needs one node: a pending placeholder pod (idempotent by key)."""
        body = placeholder_pod(self.spec.pool(pool), key, reason, self.namespace, self.pool_node_names(pool),
                               self.spec.healing.reconciler.placeholder_image)
        try:
            _call(f"create capacity request {body['metadata']['name']}", self.kube.core.create_namespaced_pod,
                  self.namespace, body, _preload_content=False)
        except AlreadyExists:
            pass  # asked already for this remediation
        log.info("capacity requested for pool %s (%s): pod %s/%s", pool, reason, self.namespace,
                 body["metadata"]["name"])

    def withdraw_capacity_request(self, pool: str, key: str) -> None:
        """Delete a request nobody answered in time (the remediation that asked says it failed)."""
        name = request_name(pool, key)
        try:
            _call(f"delete capacity request {name}", self.kube.core.delete_namespaced_pod, name, self.namespace,
                  grace_period_seconds=0, _preload_content=False)
        except NotFound:
            return  # answered and settled meanwhile, or withdrawn already
        log.info("capacity request %s/%s withdrawn: unanswered", self.namespace, name)

    def pool_node_names(self, pool: str) -> list[str]:
        """The nodes a capacity request of the pool must not land on: every node its selector matches now."""
        p = self.spec.pool(pool)
        selector = ",".join(f"{k}={v}" for k, v in (dict(p.member_selector) or {labels.NODE_POOL: p.name}).items())
        names, cont = [], None
        while True:
            data = _json(_call("list the pool's nodes", self.kube.core.list_node, label_selector=selector, limit=500,
                               _continue=cont, _preload_content=False))
            names += [n["metadata"]["name"] for n in data["items"]]
            cont = (data.get("metadata") or {}).get("continue")
            if not cont:
                return names

    def can_refill(self, pool: str) -> bool:
        return True  # whoever acts on the request decides; nothing to exceed here

    def capacity_refusals(self, pool: str, names: list[str]) -> dict[str, str]:
        """The cluster autoscaler's no to these requests: each placeholder's newest `NotTriggerScaleUp`
        Event (core/refills.py `pool_refusals` cites upstream's source). One list of the namespace's Events
        of that reason (a field selector on `reason`, which the API server indexes for Events)."""
        data = _json(_call("list the capacity requests' events", self.kube.core.list_namespaced_event, self.namespace,
                           field_selector=f"reason={NOT_TRIGGER_SCALE_UP}", _preload_content=False))
        return pool_refusals(data.get("items") or [], names)

    def capacity_requests(self) -> list[dict]:
        data = _json(_call("list capacity requests", self.kube.core.list_namespaced_pod, self.namespace,
                           label_selector=labels.CAPACITY_REQUEST, _preload_content=False))
        return data["items"]

    def settle_capacity_requests(self, nodes: list[dict] | None = None) -> list[str]:
        """Delete the placeholder pods a joined node answered (membership made it a spare), and
        mark that node, so one node answers one request; returns the settled requests. `nodes`: the
        nodes as the runtime's cache has them (`observe.membership_dict`); None: listed here."""
        requests = self.capacity_requests()
        if not requests:
            return []  # nothing to settle: no look at the nodes
        # settle() reads only spares and the nodes that answered a request: leave the rest of the fleet out
        # (it looks at the nodes once per request).
        nodes = [n for n in (self._settle_views() if nodes is None else nodes)
                 if (n["metadata"].get("labels") or {}).get(labels.ROLE) == labels.ROLE_SPARE
                 or labels.FULFILS in (n["metadata"].get("annotations") or {})]
        done = []
        for st in settle(requests, nodes, labels.CAPACITY_REQUEST):
            self.kube.patch_node(st.node, {"metadata": {"annotations": {labels.FULFILS: st.request}}})
            try:
                _call(f"delete capacity request {st.request}", self.kube.core.delete_namespaced_pod, st.request,
                      self.namespace, grace_period_seconds=0, _preload_content=False)
            except NotFound:
                pass  # deleted already
            log.info("capacity request %s answered by %s", st.request, st.node)
            done.append(st.request)
        return done

    def _settle_views(self) -> list[dict]:
        """Every node, paged, cut to what `settle` reads (name, creation time, pool and role labels, the
        answer annotation): a fleet of 10,000 nodes is never held whole in memory."""
        out, cont = [], None
        while True:
            items, _, cont = self.kube.list_page("nodes", 500, cont)
            for n in items:
                meta = n.get("metadata") or {}
                lab, ann = meta.get("labels") or {}, meta.get("annotations") or {}
                out.append({"metadata": {
                    "name": meta.get("name"), "creationTimestamp": meta.get("creationTimestamp"),
                    "labels": {k: lab[k] for k in (labels.NODE_POOL, labels.ROLE) if k in lab},
                    "annotations": {labels.FULFILS: ann[labels.FULFILS]} if labels.FULFILS in ann else {}}})
            if not cont:
                return out

    def membership_facts(self) -> MembershipFacts:
        return MembershipFacts()  # members are known by their labels (the pool's member_selector)

    def give_back(self, node: str, why: str) -> None:
        """A spare above the pool's count: role `surplus`, its spare taint kept (nothing lands there), so it is
        an empty node the cluster autoscaler scales down once it has been unneeded long enough (its
        --scale-down-unneeded-time, 10 minutes by default: cluster-autoscaler FAQ.md "How does scale-down
        work?"). Membership leaves a node with a role as it is; a pool that runs short takes it back."""
        self.kube.set_node_role(node, labels.ROLE_SURPLUS, annotations={labels.PROMOTED_FOR: None})

    def return_to_spares(self, node: str) -> None:
        self.kube.set_node_role(node, labels.ROLE_SPARE, add_taints=[SPARE_TAINT],
                                remove_taints=[labels.QUARANTINE_TAINT], schedulable=True,
                                annotations={labels.PROMOTED_FOR: None, labels.REMEDIATION: None,
                                             labels.REPAIR_REQUEST: None, labels.RETIRED: None})


class AwsAsgProvider(KubernetesSpares):
    """Spares on Kubernetes, capacity from an EC2 Auto Scaling group (boto3). One instance per
    fault: the faulted one leaves with the desired capacity decremented, the refill adds one."""

    def __init__(self, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None = None, session: Any = None,
                 clock=time.time):
        super().__init__(kube, spec, slurm)
        import boto3

        self._session = session or boto3.session.Session()
        self._clients: dict[tuple[str, str], Any] = {}
        self._dns_names: dict[str, str] = {}  # instance id -> private DNS name: fixed for the instance's life
        self.clock = clock

    def _client(self, service: str, region: str):
        if (service, region) not in self._clients:
            self._clients[service, region] = self._session.client(service, region_name=region)
        return self._clients[service, region]

    def _aws(self, what: str, fn, **kw):
        """One AWS call, its botocore errors typed (temporary: retried by the runtime; permanent: the
        remediation fails with the reason), so a replay never crash-loops."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kw)
        except (ClientError, BotoCoreError) as e:
            raise typed(what, e) from None

    def _asg(self, pool: NodePool):
        assert pool.aws is not None
        return self._client("autoscaling", pool.aws.region)

    def _pool_of(self, node: dict) -> NodePool:
        name = (node["metadata"].get("labels") or {}).get(labels.NODE_POOL)
        pool = next((p for p in self.spec.pools if p.name == name), None)
        if pool is None or pool.aws is None:
            raise PermanentError(f"node {node['metadata']['name']} is in no aws-asg pool (label {labels.NODE_POOL}={name})")
        return pool

    instance_id = staticmethod(instance_id)

    def group(self, pool: NodePool) -> dict:
        asg = self._asg(pool)
        groups = self._aws(f"describe-auto-scaling-groups {pool.aws.asg_name}", asg.describe_auto_scaling_groups,
                           AutoScalingGroupNames=[pool.aws.asg_name])["AutoScalingGroups"]
        if not groups:
            raise PermanentError(f"Auto Scaling group {pool.aws.asg_name} not found in {pool.aws.region}")
        return groups[0]

    def capacity(self, pool_name: str) -> Capacity:
        g = self.group(self.spec.pool(pool_name))
        return Capacity(g["DesiredCapacity"], g["MaxSize"])

    def can_refill(self, pool: str) -> bool:
        """Whether the group can take one more instance now (a refill with no instance leaving)."""
        return self.capacity(pool).can_add

    def refill_refusal(self, pool: str) -> str:
        """The group's no to one more instance, in its numbers ('' when it has room)."""
        c, name = self.capacity(pool), self.spec.pool(pool).aws.asg_name
        return "" if c.can_add else f"AWS: {name} is at its MaxSize {c.max_size} (desired {c.desired})"

    def capacity_refusals(self, pool: str, names: list[str]) -> dict[str, str]:
        return {}  # the group says no before it is asked (refill_refusal)

    def _instance(self, node: str) -> tuple[dict, NodePool, str]:
        obj = self.kube.get_node(node)
        pool = self._pool_of(obj)
        iid = instance_id(obj)
        if not iid:
            raise PermanentError(f"node {node} has no AWS providerID; cannot act on it in {pool.aws.asg_name}")
        return obj, pool, iid

    def quarantine(self, node: str, xid: int, repair: bool = False) -> None:
        super().quarantine(node, xid)
        obj, pool, iid = self._instance(node)
        asg, name = self._asg(pool), pool.aws.asg_name
        if repair:
            self._hold_for_repair(node, pool, iid, xid)
            return
        if pool.aws.on_fault == "quarantine":
            # Tag first: an instance that left the group is never untagged and forgotten.
            ec2 = self._client("ec2", pool.aws.region)
            self._aws(f"create-tags {iid}", ec2.create_tags, Resources=[iid], Tags=[
                {"Key": labels.QUARANTINED_TAG, "Value": f"xid-{xid}"},
                {"Key": labels.QUARANTINED_FROM_TAG, "Value": name},
                {"Key": labels.NODE_TAG, "Value": node}])
        if iid not in {i["InstanceId"] for i in self.group(pool)["Instances"]}:
            return  # already out of the group (a replay)
        if pool.aws.on_fault == "terminate":
            self._aws(f"terminate-instance-in-auto-scaling-group {iid}", asg.terminate_instance_in_auto_scaling_group,
                      InstanceId=iid, ShouldDecrementDesiredCapacity=True)
            what = f"{iid} terminated; {name} desired capacity decremented"
        else:
            self._aws(f"detach-instances {iid} from {name}", asg.detach_instances, InstanceIds=[iid],
                      AutoScalingGroupName=name, ShouldDecrementDesiredCapacity=True)
            what = f"{iid} detached from {name} and tagged {labels.QUARANTINED_TAG}=xid-{xid} for a human; still running"
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceQuarantined", what, "Warning")

    # --- repairs (issue 25) -------------------------------------------------------------------------

    def _hold_for_repair(self, node: str, pool: NodePool, iid: str, xid: int) -> None:
        """Out of the group while it is repaired (as a quarantine is), so the group neither counts nor
        replaces it; tagged first, so an instance out of its group is never forgotten."""
        ec2, name = self._client("ec2", pool.aws.region), pool.aws.asg_name
        self._aws(f"create-tags {iid}", ec2.create_tags, Resources=[iid], Tags=[
            {"Key": labels.REPAIRING_TAG, "Value": f"xid-{xid}"}, {"Key": labels.QUARANTINED_FROM_TAG, "Value": name},
            {"Key": labels.NODE_TAG, "Value": node}])
        if iid in {i["InstanceId"] for i in self.group(pool)["Instances"]}:
            self._aws(f"detach-instances {iid} from {name}", self._asg(pool).detach_instances, InstanceIds=[iid],
                      AutoScalingGroupName=name, ShouldDecrementDesiredCapacity=True)
            self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceHeldForRepair",
                            f"{iid} detached from {name} while it is repaired", "Normal")

    def request_repair(self, node: str, request: RepairRequest) -> None:
        """A reboot through EC2 (RebootInstances: AWS reboots it, hard after a few minutes if the OS does not
        shut down); a GPU reset through the node agent, as on any provider."""
        if request.action != REBOOT:
            super().request_repair(node, request)
            return
        _, pool, iid = self._instance(node)
        ec2 = self._client("ec2", pool.aws.region)
        self._aws(f"reboot-instances {iid}", ec2.reboot_instances, InstanceIds=[iid])
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceRebooted",
                        f"{iid} rebooted through EC2 ({request.id})", "Normal")

    def return_to_spares(self, node: str) -> None:
        """Back in its group (AttachInstances: the desired capacity grows by one), then a spare."""
        _, pool, iid = self._instance(node)
        name = pool.aws.asg_name
        if iid not in {i["InstanceId"] for i in self.group(pool)["Instances"]}:
            self._aws(f"attach-instances {iid} to {name}", self._asg(pool).attach_instances, InstanceIds=[iid],
                      AutoScalingGroupName=name)
        ec2 = self._client("ec2", pool.aws.region)
        self._aws(f"delete-tags {iid}", ec2.delete_tags, Resources=[iid], Tags=[
            {"Key": labels.REPAIRING_TAG}, {"Key": labels.QUARANTINED_TAG}, {"Key": labels.QUARANTINED_FROM_TAG}])
        super().return_to_spares(node)

    def give_back(self, node: str, why: str) -> None:
        """Scaled in: role `surplus` first (so nothing takes it meanwhile), then the instance terminated with
        the group's desired capacity decremented (TerminateInstanceInAutoScalingGroup,
        ShouldDecrementDesiredCapacity), so the group does not replace it. Done again, the instance is out of
        the group already and nothing changes."""
        super().give_back(node, why)
        _, pool, iid = self._instance(node)
        if iid in {i["InstanceId"] for i in self.group(pool)["Instances"]}:
            self._aws(f"terminate-instance-in-auto-scaling-group {iid}",
                      self._asg(pool).terminate_instance_in_auto_scaling_group, InstanceId=iid,
                      ShouldDecrementDesiredCapacity=True)
            self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceScaledIn",
                            f"{iid} terminated, {pool.aws.asg_name} desired capacity decremented: {why}", "Normal")

    def retire(self, node: str, reason: str, refill: str | None = None) -> None:
        """Terminated, or kept out of its group tagged for the vendor, as `aws.on_fault` says."""
        super().retire(node, reason, None)
        _, pool, iid = self._instance(node)
        asg, name, ec2 = self._asg(pool), pool.aws.asg_name, self._client("ec2", pool.aws.region)
        if iid in {i["InstanceId"] for i in self.group(pool)["Instances"]}:
            self._aws(f"detach-instances {iid} from {name}", asg.detach_instances, InstanceIds=[iid],
                      AutoScalingGroupName=name, ShouldDecrementDesiredCapacity=True)
        if pool.aws.on_fault == "terminate":
            self._aws(f"terminate-instances {iid}", ec2.terminate_instances, InstanceIds=[iid])
            what = f"{iid} terminated"
        else:
            self._aws(f"create-tags {iid}", ec2.create_tags, Resources=[iid], Tags=[
                {"Key": labels.QUARANTINED_TAG, "Value": "retired"}, {"Key": labels.QUARANTINED_FROM_TAG, "Value": name},
                {"Key": labels.NODE_TAG, "Value": node}])
            what = f"{iid} kept out of {name}, tagged {labels.QUARANTINED_TAG}=retired for the vendor"
        self.kube.event({"kind": "Node", "name": node, "apiVersion": "v1"}, "InstanceRetired", f"{what}: {reason}",
                        "Warning")
        if refill:
            self.request_capacity(pool.name, f"{node} retired", refill)

    def forget(self, node: str, pool: str, reason: str, refill: str | None = None) -> None:
        """The node's Node object is gone mid-repair. The instance held out of its group for the repair (found
        by the tags `_hold_for_repair` wrote first: a detached instance is never forgotten) is settled as a
        retirement is: terminated, or kept tagged for the vendor, as `aws.on_fault` says. An instance back in
        its group is the group's own again; one already terminated needs nothing. Then the refill."""
        p = self.spec.pool(pool)
        ec2, name = self._client("ec2", p.aws.region), p.aws.asg_name
        found = self._aws(f"describe-instances tagged {labels.NODE_TAG}={node}", ec2.describe_instances, Filters=[
            {"Name": f"tag:{labels.NODE_TAG}", "Values": [node]},
            {"Name": "tag-key", "Values": [labels.REPAIRING_TAG]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        held = sorted(i["InstanceId"] for res in found.get("Reservations") or [] for i in res.get("Instances") or [])
        in_group = {i["InstanceId"] for i in self.group(p)["Instances"]}
        for iid in (i for i in held if i not in in_group):
            if p.aws.on_fault == "terminate":
                self._aws(f"terminate-instances {iid}", ec2.terminate_instances, InstanceIds=[iid])
                what = f"{iid} terminated"
            else:
                self._aws(f"create-tags {iid}", ec2.create_tags, Resources=[iid], Tags=[
                    {"Key": labels.QUARANTINED_TAG, "Value": "retired"},
                    {"Key": labels.QUARANTINED_FROM_TAG, "Value": name}, {"Key": labels.NODE_TAG, "Value": node}])
                self._aws(f"delete-tags {iid}", ec2.delete_tags, Resources=[iid], Tags=[{"Key": labels.REPAIRING_TAG}])
                what = f"{iid} kept out of {name}, tagged {labels.QUARANTINED_TAG}=retired for the vendor"
            log.warning("%s (node %s gone mid-repair): %s", what, node, reason)
        super().forget(node, pool, reason, refill)

    def request_capacity(self, pool_name: str, reason: str, key: str) -> None:
        """Raise the desired capacity by exactly one, once per key: the key is a group tag whose
        value is the target; a replay finds it and changes nothing."""
        pool = self.spec.pool(pool_name)
        asg, name = self._asg(pool), pool.aws.asg_name
        g = self.group(pool)
        tags = {t["Key"]: t["Value"] for t in g.get("Tags") or []}
        tag = (labels.REFILL_TAG_PREFIX + key)[:128]
        state, target = _refill_state(tags.get(tag))
        if state == "done":
            log.info("refill of %s for %s already done (target %s)", name, key, target)
            return
        if state == "pending":
            if g["DesiredCapacity"] < target:  # died between the tag and the call
                self._set_desired(asg, name, target)
            self._tag(asg, name, tag, f"done:{target}:{int(self.clock())}")
            return
        want = g["DesiredCapacity"] + 1
        if want > g["MaxSize"]:
            raise PermanentError(f"AWS: {name} is at its MaxSize {g['MaxSize']} (desired {g['DesiredCapacity']}); "
                                 f"not raised for {key}: {reason}")
        self._tag(asg, name, tag, f"pending:{want}:{int(self.clock())}")
        self._set_desired(asg, name, want)
        self._tag(asg, name, tag, f"done:{want}:{int(self.clock())}")
        self._prune(asg, name, {**tags, tag: f"done:{want}:{int(self.clock())}"})
        log.info("raised %s desired capacity to %d for %s: %s", name, want, key, reason)

    def _set_desired(self, asg, name: str, desired: int) -> None:
        self._aws(f"set-desired-capacity {name}={desired}", asg.set_desired_capacity, AutoScalingGroupName=name,
                  DesiredCapacity=desired, HonorCooldown=False)

    def _tag(self, asg, name: str, key: str, value: str) -> None:
        self._aws(f"create-or-update-tags {name}", asg.create_or_update_tags, Tags=[{
            "ResourceId": name, "ResourceType": "auto-scaling-group", "Key": key, "Value": value,
            "PropagateAtLaunch": False}])

    def _prune(self, asg, name: str, tags: dict[str, str]) -> None:
        """Keep the newest refill tags only (a group holds 50 tags)."""
        done = sorted(((int(v.rsplit(":", 1)[-1]), k) for k, v in tags.items()
                       if k.startswith(labels.REFILL_TAG_PREFIX) and v.startswith("done:")), reverse=True)
        old = [k for _, k in done[KEEP_REFILL_TAGS:]]
        if old:
            self._aws(f"delete-tags {name}", asg.delete_tags, Tags=[
                {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": k} for k in old])

    def membership_facts(self) -> MembershipFacts:
        """Which instance is in which of the spec's groups, and each one's private DNS name: the Node name
        its kubelet may register on EKS (reconciler/core/membership.py). One describe of the groups per
        region; a describe of their instances (per hundred) only for those not seen before, since an
        instance's private DNS name is fixed for its life (the membership pass runs often in a storm)."""
        by_region: dict[str, list[str]] = {}
        for p in self.spec.pools:
            if p.provider == "aws-asg" and p.aws is not None:
                by_region.setdefault(p.aws.region, []).append(p.aws.asg_name)
        groups: dict[str, str] = {}
        for region, asg_names in by_region.items():
            asg = self._client("autoscaling", region)
            here: dict[str, str] = {}
            token = None
            while True:
                kw = {"AutoScalingGroupNames": asg_names, **({"NextToken": token} if token else {})}
                page = self._aws("describe-auto-scaling-groups", asg.describe_auto_scaling_groups, **kw)
                for g in page["AutoScalingGroups"]:
                    here.update({i["InstanceId"]: g["AutoScalingGroupName"] for i in g.get("Instances") or []})
                token = page.get("NextToken")
                if not token:
                    break
            groups.update(here)
            self._dns_names.update(self._private_dns_names(region, sorted(set(here) - set(self._dns_names))))
        self._dns_names = {i: n for i, n in self._dns_names.items() if i in groups}  # forget those that left
        return MembershipFacts(groups, dict(self._dns_names))

    def _private_dns_names(self, region: str, ids: list[str]) -> dict[str, str]:
        ec2 = self._client("ec2", region)
        out: dict[str, str] = {}
        for start in range(0, len(ids), 100):
            token = None
            while True:
                kw = {"InstanceIds": ids[start:start + 100], **({"NextToken": token} if token else {})}
                page = self._aws("describe-instances", ec2.describe_instances, **kw)
                for reservation in page.get("Reservations") or []:
                    for i in reservation.get("Instances") or []:
                        if i.get("PrivateDnsName"):
                            out[i["InstanceId"]] = i["PrivateDnsName"]
                token = page.get("NextToken")
                if not token:
                    break
        return out

    def settle_capacity_requests(self, nodes: list[dict] | None = None) -> list[str]:
        return []  # the group's desired capacity is the request; nothing to settle

    def withdraw_capacity_request(self, pool: str, key: str) -> None:
        return None  # a raised desired capacity is not taken back: the group answers when it can


def _refill_state(value: str | None) -> tuple[str | None, int]:
    if not value:
        return None, 0
    state, _, rest = value.partition(":")
    try:
        return state, int(rest.split(":", 1)[0])
    except ValueError:
        raise PermanentError(f"unreadable refill tag value {value!r}; remove it from the group") from None


PROVIDERS: dict[str, Any] = {"kubernetes-spares": KubernetesSpares, "aws-asg": AwsAsgProvider}


def provider_for(pool: NodePool, kube: Kube, spec: FleetSpec, slurm: SlurmClient | None, **kw) -> NodeProvider:
    factory = PROVIDERS.get(pool.provider)
    if factory is None:
        raise PermanentError(f"pool {pool.name}: no node provider {pool.provider!r} (known: {sorted(PROVIDERS)})")
    return factory(kube, spec, slurm, **kw) if pool.provider == "aws-asg" else factory(kube, spec, slurm)
