"""A machine that stopped answering: its Kubernetes node's `Ready` condition has not been True for
`healing.node_lost_after_seconds`. Pure.

Nothing on such a machine can report a fault (its node agent is as dead as its kubelet), so the reconciler
reads the loss from the Node object itself, as Cluster API's MachineHealthCheck does: an `unhealthyConditions`
entry of type Ready, status Unknown or False, with a timeout (cluster-api docs, "Configure a
MachineHealthCheck"). The default, 300 s, is Kubernetes' own: the `node.kubernetes.io/not-ready` and
`node.kubernetes.io/unreachable` NoExecute tolerations the DefaultTolerationSeconds admission plugin gives every
pod (kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/#taint-based-evictions), after which
Kubernetes itself gives up on the pods there. A node back to Ready before then was a blip: nothing happens.

A lost node with a NodeSet pod on it is a fault of kind `node-lost` that needs a reboot: the same heal as any
fault (containment, the storm brake, a spare promoted, its job moved; the repair loop then reboots it through
its provider and, if it never answers, retires it). Its job cannot checkpoint (no SIGTERM reaches a dead
slurmd) and its NodeSet pod's eviction never completes on a dead kubelet, so the heal force-deletes that pod
(`force_delete`), which Kubernetes' "Force Delete StatefulSet Pods" page allows only for a node known to be down
or partitioned (kubernetes.io/docs/tasks/run-application/force-delete-stateful-set-pod/): what the threshold
establishes.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.models import NodePool
from gpufleet.fleetspec.repair import REBOOT

from gpufleet.reconciler.core.actions import Action, DeletePods, DownSlurm
from gpufleet.reconciler.core.drains import slurm_reason
from gpufleet.reconciler.core.model import Fault, JobView, NodeView, PodView, Remediation

SOURCE = "Ready"  # the condition the loss is read from
_SEEN = "Kubernetes has not seen it Ready for"  # the fault message's head, then the seconds (read back: _DOWN)
_DOWN = re.compile(re.escape(_SEEN) + r" (\d+)s")


def _after(spec: FleetSpec) -> timedelta:
    return timedelta(seconds=spec.healing.node_lost_after_seconds)


def watched(node: NodeView, spec: FleetSpec, carries_nodeset_pod: bool) -> bool:
    """A node of a managed pool whose Ready condition is not True, and that serves: an active node carrying a
    NodeSet pod, or a node on loan (its NodeSet pods left for the borrowers; lending keeps the loan until the
    loss is read, core/lending.py, and the heal ends it: no eviction there can finish on a dead kubelet)."""
    serves = (carries_nodeset_pod and node.role == labels.ROLE_ACTIVE) or \
        (node.on_loan and node.role in (labels.ROLE_ACTIVE, labels.ROLE_SPARE))
    return serves and node.not_ready_since is not None and node.pool in {p.name for p in spec.pools}


def fault(node: NodeView, spec: FleetSpec, now: datetime, carries_nodeset_pod: bool) -> Fault | None:
    """The `node-lost` fault of `node`, once its Ready condition has not been True for the spec's time; else None.
    Its `since` is the Ready condition's lastTransitionTime: one loss names one remediation however often it is read."""
    if not watched(node, spec, carries_nodeset_pod):
        return None
    since = node.not_ready_since
    assert since is not None
    down = now - since
    if down < _after(spec):
        return None
    message = (f"{_SEEN} {down.total_seconds():.0f}s "
               f"(Ready {node.ready_status or 'Unknown'}"
               + (f", {node.ready_message}" if node.ready_message else "") + ")")
    return Fault(0, message[:1024], since, Kind.NODE_LOST, FaultAction.REBOOT, source=SOURCE)


def look_again_after(node: NodeView, spec: FleetSpec, now: datetime, carries_nodeset_pod: bool) -> float | None:
    """Seconds until a not-Ready node would be lost (no event comes when a timeout passes), or None: not
    watched, or lost already (its loss was read: a remediation, or a gate; events and the resync look again)."""
    if not watched(node, spec, carries_nodeset_pod):
        return None
    assert node.not_ready_since is not None
    left = (node.not_ready_since + _after(spec) - now).total_seconds()
    return left + 1.0 if left >= 0 else None


def force_delete(node: NodeView | None, pods: tuple[PodView, ...], spec: FleetSpec, now: datetime) -> tuple[str, ...]:
    """The NodeSet pods (the Slurm namespace's) to delete with grace 0 from a node under a heal (of any fault:
    a GPU fault's machine may die mid-heal too) that has not been Ready for the spec's time: a dead kubelet never
    completes their eviction nor runs their preStop, and the NodeSet makes no pod of the same name while the old
    one stands. A node Ready again, or not Ready for less, is drained as any other (its kubelet stops the pod,
    and the preStop runs)."""
    if node is None or node.ready or node.not_ready_since is None or now - node.not_ready_since < _after(spec):
        return ()
    return tuple(sorted(p.key for p in pods if p.label(labels.SLINKY_POD_HOSTNAME) is not None
                        and p.namespace == spec.slurm.namespace and p.phase not in ("Succeeded", "Failed")
                        and p.deletion_grace != 0))  # forced already: gone from the API server


def let_go(r: Remediation, keys: tuple[str, ...], pods: tuple[PodView, ...]) -> tuple[Action, ...]:
    """A lost machine's NodeSet pods `keys`, deleted with grace 0, their Slurm nodes first set DOWN: what each
    pod's slurmd preStop does (`scontrol update state=down`, slurm-operator v1.2.1
    internal/builder/workerbuilder/worker_app.go), which a dead kubelet never runs.

    The DOWN is what ends the old run's termination. A requeued job is COMPLETING on its node until that node's
    slurmd confirms the kill, and slurmctld resends TERMINATE_JOB to each of its nodes that is not DOWN, skipping
    only one that does not respond (slurm-26-05-3-1 src/slurmctld/node_scheduler.c `re_kill_job`). Once the pod is
    made again on the spare, the Slurm node's name answers again: the resent termination reaches the new slurmd,
    the requeue ends, the job is scheduled there and the next resend kills its new run (ExitCode 0:15). A node set
    DOWN counts the job done on it at once (src/slurmctld/node_mgr.c `update_node` -> job_mgr.c
    `kill_running_job_by_node_ptr`, which clears it from the job's completing nodes). The DOWN carries the
    remediation's reason, so the heal resumes the Slurm node once it runs on the spare (as it does a drain); a
    person's drain there went with the machine (decide.py `carry_person_drains`)."""
    names = sorted({name for p in pods if p.key in keys and (name := p.label(labels.SLINKY_POD_HOSTNAME))})
    return tuple(DownSlurm(n, slurm_reason(r)) for n in names) + (DeletePods(r.node, keys, force=True),)


def lost(node: NodeView, spec: FleetSpec, now: datetime) -> bool:
    """Whether `node` does not answer: its Ready condition not True for the spec's time (what a loss reads)."""
    return not node.ready and node.not_ready_since is not None and now - node.not_ready_since >= _after(spec)


# Providers that reboot a machine without anything on it: aws-asg's reboot is EC2's RebootInstances, which
# "performs a hard reboot" of an instance that does not shut down cleanly within a few minutes (Amazon EC2 API
# Reference, RebootInstances): a power cycle, as Metal3's reboot remediation is one through the BMC (Cluster
# API's external remediation). kubernetes-spares asks every repair of the node agent (a request annotation,
# adapters/providers.py): on a machine that does not answer, nothing carries it out.
POWER_CYCLES = frozenset({"aws-asg"})


def cannot_reach(rung: str, node: NodeView, pool: NodePool, spec: FleetSpec, now: datetime) -> str:
    """Why a repair rung asked now would never be carried out on `node` ('' when it would): the node does not
    answer (`lost`) and the rung needs its node agent (a GPU reset always; a reboot unless the pool's provider
    power-cycles the machine). A node not Ready for less is asked as any other: a reboot takes a node NotReady,
    and its agent acts once it is back."""
    if not lost(node, spec, now) or (rung == REBOOT and pool.provider in POWER_CYCLES):
        return ""
    down = (now - node.not_ready_since).total_seconds() if node.not_ready_since else 0.0
    how = "its node agent" if rung != REBOOT else \
        f"its node agent (provider {pool.provider} has no power control to power-cycle it)"
    return f"{node.name} does not answer (not Ready for {down:.0f}s): a {rung} is carried out by {how}"


# How long before the node stopped being Ready a job's NODE_FAIL on its Slurm nodes still counts as this loss's:
# slurmctld's SlurmdTimeout (slurm.conf(5): 300 s by default) may mark the Slurm node DOWN before Kubernetes
# notices the kubelet's silence.
REQUEUED_WINDOW = timedelta(seconds=300)


def requeued_by_slurm_since(r: Remediation) -> datetime | None:
    """Since when a lost machine's remediation looks for jobs slurmctld requeued off its Slurm nodes (None: not
    a lost machine's). slurmctld requeues a requeueable batch job of a node it marks DOWN and then keeps no trace
    of where it ran (slurm-26-05-3-1 src/slurmctld/job_mgr.c kill_running_job_by_node_ptr; batch_requeue_fini
    clears its nodes); accounting keeps the run that ended NODE_FAIL. From when the node stopped being Ready
    (the fault's message says how long before the loss was read: `fault`), less REQUEUED_WINDOW."""
    if r.kind is not Kind.NODE_LOST or not r.slurm_nodes:
        return None
    m = _DOWN.search(r.message)
    down = timedelta(seconds=int(m.group(1))) if m else timedelta()
    return r.created - down - REQUEUED_WINDOW


def requeued_by_slurm(r: Remediation, failed: tuple[JobView, ...], requeued: tuple[int, ...]) -> tuple[JobView, ...]:
    """The jobs slurmctld failed off `r`'s Slurm nodes (accounting's NODE_FAIL runs) that gpufleet did not see
    on them: noted on the record, not requeued."""
    if r.kind is not Kind.NODE_LOST:
        return ()
    mine = set(r.slurm_nodes)
    return tuple(j for j in failed if j.job_id not in requeued and mine & set(j.nodes))


def stuck_on(node: NodeView | None, slurm_pods: tuple[PodView, ...], spec: FleetSpec, now: datetime) -> tuple[str, ...]:
    """The remediation's NodeSet pods still on its node once that node is lost (it died after their eviction or
    their delete was asked with a grace: both wait for a kubelet that is not there): to delete with grace 0."""
    if node is None:
        return ()
    return force_delete(node, tuple(p for p in slurm_pods if p.node == node.name), spec, now)
