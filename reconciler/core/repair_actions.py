"""What the repair loop and the health checks tell the runtime to do (issue 25). Data only; the
executor runs them, fenced by the Lease, nothing in a dry run.

Idempotent unless `once` says otherwise: a health-check Job is named per node and attempt (asking
again finds it made); a node annotation is written whole. A reset or a reboot is once per request:
whoever acts on the node acts once per request id, and a reboot through the cloud's API is noted on
the remediation before it is called.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpufleet.fleetspec.node_repair import HealthCheckRecord, RepairRequest

from gpufleet.reconciler.core.actions import Action


@dataclass(frozen=True)
class RequestRepair(Action):
    """Reset the node's GPU(s) or reboot it, through its pool's provider."""

    node: str
    pool: str
    request: RepairRequest

    @property
    def once(self) -> str:
        return f"repair:{self.request.id}"


@dataclass(frozen=True)
class StartHealthCheck(Action):
    """Create the health-check Job on the node (named per node and attempt: a second create finds it)."""

    node: str
    pool: str
    job: str


@dataclass(frozen=True)
class RecordCheck(Action):
    """Note the node's health check on the node itself: a spare serves only with a passed one for its boot."""

    node: str
    record: HealthCheckRecord


@dataclass(frozen=True)
class MarkHealthy(Action):
    """The node's GPU condition back to True (HealthCheckPassed): the fault that took it out is over."""

    node: str
    message: str


@dataclass(frozen=True)
class BackInService(Action):
    """A node whose Slurm node still runs on it goes back to work where it is: active, schedulable,
    the quarantine taint off (a person's release or mark-healthy)."""

    node: str
    pool: str


@dataclass(frozen=True)
class Retire(Action):
    """Out for good, through the provider (terminated, or kept for the vendor as the pool's `on_fault` says);
    `refill`: the key of a capacity request when nothing replaced the node yet."""

    node: str
    pool: str
    reason: str
    refill: str | None = None


@dataclass(frozen=True)
class ForgetNode(Action):
    """A node whose Node object disappeared mid-repair: its provider settles what it kept for the repair (an
    aws-asg instance detached from its group is terminated, or kept tagged for the vendor, as `on_fault`
    says); `refill`: the key of a capacity request when nothing replaced the node yet."""

    node: str
    pool: str
    reason: str
    refill: str | None = None


@dataclass(frozen=True)
class NodeEvent(Action):
    """An Event on the node: each step of its repair shows in `kubectl describe node`."""

    node: str
    reason: str
    message: str
    type: str = "Normal"
