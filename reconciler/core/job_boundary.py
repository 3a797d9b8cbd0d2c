"""NVIDIA's "drain at the next job boundary": the faults whose resolution is DRAIN_AND_RESET. Pure.

NVIDIA's Xid catalogue resolves Xid 48 with 63/64 (WORKFLOW_XID_48) and Xid 154's "Drain and Reset" with
DRAIN_AND_RESET (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Fault Resolution Buckets"): stop
new work landing on the GPU, let the work on it finish, then reset it. The node agent writes such a fault's
condition with `when=job-boundary` (fleetspec/faults/condition.py); the telemetry rows that follow the same
resolution say it in their row (fleetspec/faults/telemetry.py). Both use what is here:

- while the node's Slurm nodes run a job, they are drained in Slurm (DRAIN: slurmctld starts no new job there and
  lets the running one finish) with gpufleet's reason (so the heal that follows owns it and resumes it on the
  replacement), tagged with the code that asked, `[xid48 node]`, `[dcgm311 node]`; nobody is signalled;
- once they run no job, the heal every fault takes follows (the reset, through the repair loop);
- a job still running `healing.job_boundary_max_seconds` after the fault is moved at a checkpoint, as any
  fault's (SIGTERM and the grace period): a week-long job does not keep a faulted GPU in service for a week.

A node that runs no Slurm node (no NodeSet pod on it) has no job to wait for: it is healed at once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from gpufleet.fleetspec import FleetSpec, labels
from gpufleet.fleetspec.faults import Kind, describe
from gpufleet.fleetspec.faults.catalogue import When

from gpufleet.reconciler.core.actions import DrainSlurm
from gpufleet.reconciler.core.drains import drained_by_gpufleet
from gpufleet.reconciler.core.model import Fault, SlurmNodeView

TAG = re.compile(r"\[(xid|sxid|dcgm)([0-9]{1,6}) ")  # in a job-boundary drain's reason: the code that asked for it
LOOK_EVERY = 15.0  # seconds between looks at a node waiting for its job's end (no event marks a job's end)
RESOLUTION = "NVIDIA's resolution DRAIN_AND_RESET"


def tag(kind: Kind, code: int) -> str:
    return f"{'sxid' if kind is Kind.SXID else 'dcgm' if kind is Kind.DCGM else 'xid'}{code}"


def asked_by(reason: str) -> tuple[str, int] | None:
    """The tag and code a job-boundary drain's reason names (`reason`), e.g. ("dcgm", 311); None: not one."""
    m = TAG.search(reason)
    return (m.group(1), int(m.group(2))) if m else None


def reason(what: str, kind: Kind, code: int, node: str) -> str:
    """A job-boundary drain's Slurm reason: gpufleet's (its heal owns it), naming the code that asked."""
    return f"{labels.SLURM_REASON_PREFIX} {what}, healed when its job ends [{tag(kind, code)} {node}]"[:200]


def drains(slurm: Sequence[SlurmNodeView], why: str) -> tuple[DrainSlurm, ...]:
    """Drain those not drained yet: a node drained already (by gpufleet, a person or the operator) keeps its drain
    and its reason."""
    return tuple(DrainSlurm(s.name, why) for s in slurm if not s.drained)


def overdue(slurm: Sequence[SlurmNodeView], spec: FleetSpec, now: datetime) -> float | None:
    """Seconds a job-boundary drain of these Slurm nodes has waited, once that is `healing.job_boundary_max_seconds`
    or more (Slurm's time of the reason: reason_changed_at); None while it may wait on, or when no time is known."""
    bound = spec.healing.job_boundary_max_seconds
    times = [s.reason_at for s in slurm if s.reason_at is not None and TAG.search(s.reason) and drained_by_gpufleet(s)]
    waited = (now - min(times)).total_seconds() if times else None
    return waited if waited is not None and waited >= bound else None


def drained_at_boundary(slurm: Sequence[SlurmNodeView]) -> tuple[str, ...]:
    """The Slurm nodes gpufleet drained for a job's boundary (their reason carries the tag)."""
    return tuple(s.name for s in slurm if TAG.search(s.reason) and drained_by_gpufleet(s))


@dataclass(frozen=True)
class OnNode:
    """What a kernel fault's boundary is read from: the node's Slurm nodes and the jobs running on them."""

    slurm: tuple[SlurmNodeView, ...] = ()
    jobs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Wait:
    """The node waits for its job's end: these drains, and a look again after `look_after` seconds."""

    actions: tuple[DrainSlurm, ...]
    look_after: float


def asks(f: Fault | None) -> bool:
    """A fault that takes its node out at its job's boundary rather than now."""
    return f is not None and f.when is When.JOB_BOUNDARY and f.needs.remediates and f.kind in (Kind.XID, Kind.SXID)


def wait(node: str, f: Fault, on: OnNode, spec: FleetSpec, now: datetime) -> Wait | None:
    """What a boundary fault asks while its node's Slurm nodes run a job and the bound has not passed; None: heal
    now (no job runs there, or the job ran past `healing.job_boundary_max_seconds`)."""
    bound = spec.healing.job_boundary_max_seconds
    waited = (now - f.since).total_seconds()
    if not on.jobs or waited >= bound:
        return None
    what = f"{describe(f.xid, f.kind)} needs {f.needs.value} ({RESOLUTION})"
    return Wait(drains(on.slurm, reason(what, f.kind, f.xid, node)), max(0.0, min(LOOK_EVERY, bound - waited)))


def note(f: Fault, on: OnNode, spec: FleetSpec, now: datetime) -> str:
    """What the record adds to its reason about the boundary, when the heal starts (`wait` said None)."""
    bound = spec.healing.job_boundary_max_seconds
    waited = (now - f.since).total_seconds()
    drained = drained_at_boundary(on.slurm)
    if on.jobs:
        if bound == 0:
            return (f"; {RESOLUTION} waits for the job's boundary, but healing.job_boundary_max_seconds is 0: "
                    f"job(s) {', '.join(map(str, on.jobs))} moved at a checkpoint now")
        return (f"; {RESOLUTION}: its Slurm node(s) {', '.join(drained) or 'were'} drained at the job's boundary, but "
                f"job(s) {', '.join(map(str, on.jobs))} still ran {waited:.0f}s after the fault (longer than "
                f"healing.job_boundary_max_seconds, {bound}s): moved at a checkpoint")
    if drained:
        return (f"; drained at its job's boundary ({RESOLUTION}: no new job landed, the running job finished; "
                f"Slurm node(s) {', '.join(drained)}), healed once they ran no job, {waited:.0f}s after the fault")
    return f"; {RESOLUTION} waits for the job's boundary: no job ran on it, healed at once"
