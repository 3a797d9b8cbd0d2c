"""Validation before service (issue 25): a node serves only once a health check on that node passed.
Pure: which spares are checked now, what a check's verdict means, whose checks failed.

The check is a Job on the node (its image and command from `healing.repair.health_check`); its verdict is
read from the Job's status and the structured termination message of its pod, never from a log line
(adapters/health_checks.py). A passed check is noted on the node with the boot it ran on
(`gpufleet.io/health-check`), so a reboot makes it stale: a spare is *proven* when its check passed on
its current boot. Unproven spares are checked by the validation pass (runtime/validation_pass.py): a
node that joins a pool, a refill, a node returned by a person. A spare that fails becomes a remediation of
its own (quarantined, refilled, then repaired like any broken node); it is never promoted.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from gpufleet.fleetspec import health_report, labels
from gpufleet.fleetspec.faults import FaultAction
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.node_repair import FAILED, PASSED, RUNNING, HealthCheckRecord
from gpufleet.fleetspec.node_repair import UNPROVEN as UNPROVEN_RECORD

from gpufleet.reconciler.core.actions import Action, Notify
from gpufleet.reconciler.core.model import NodeView, Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_actions import NodeEvent, RecordCheck, StartHealthCheck

SLACK = timedelta(seconds=120)  # past the Job's own deadline, a check nobody answered gave no verdict
UNPROVEN_RECHECK = timedelta(hours=1)  # an unproven spare is checked again this often (its image may be fixed)
RERUN = "checked again: "  # the message of a check run again because the one before gave no verdict
RECHECK = 5.0  # seconds between looks at running checks (a pod's change wakes the pass sooner)

MISSING = "missing"  # no such Job (not made yet, or made and gone)
INCONCLUSIVE = "inconclusive"  # the Job ended without a verdict (its deadline, or its pod died before writing one)
UNPROVEN = "unproven"  # the check ran but could not prove the node: a check it must run had no tool in its image

UNPROVEN_HELP = ("A check the spec requires could not run (its tool is not in the check's image, or it could not "
                 "start): run the check from an image that carries NVIDIA's DCGM (dcgmi) and nccl-tests "
                 "(all_reduce_perf): healing.repair.health_check.image (docs/platform.md: the health check's image).")


@dataclass(frozen=True)
class Verdict:
    """What a health-check Job says now."""

    state: str  # missing | running | passed | failed | inconclusive | unproven
    message: str = ""
    action: str = ""  # failed: what the check says the node needs (reset-gpu, reboot, replace; '' unknown)


def read_report(message: str, job_complete: bool) -> Verdict:
    """What a check's termination message says (fleetspec/health_report.py), with how its Job ended: passed only
    when both say so; unproven when no check failed but a required one could not run; failed otherwise. A message
    that is no report proves nothing: a Job that failed with it is inconclusive."""
    try:
        reading = health_report.loads(message)
    except health_report.UnreadableReport as e:
        return Verdict(PASSED, str(e)) if job_complete else Verdict(INCONCLUSIVE, str(e))
    if reading.passed and job_complete:
        return Verdict(PASSED, reading.summary)
    if reading.unproven and not reading.failed:
        return Verdict(UNPROVEN, reading.summary)
    return Verdict(FAILED, reading.summary, "" if reading.action == "none" else reading.action)


def required(spec: FleetSpec) -> bool:
    """Whether spares must be proven to serve."""
    return spec.healing.repair.enabled and spec.healing.repair.health_check.before_service


def serves(n: NodeView, spec: FleetSpec) -> bool:
    """A spare that may be promoted or lent: proven, or the spec trusts spares as they come."""
    return n.proven or not required(spec)


def job_name(node: str, token: str) -> str:
    """A DNS-1123 name per node and attempt (`token`): creating it again finds it made."""
    digest = hashlib.sha256(f"{node}/{token}".encode()).hexdigest()[:10]
    return f"gpufleet-check-{node}"[:52].rstrip("-.") + f"-{digest}"


def deadline(record: HealthCheckRecord, spec: FleetSpec) -> datetime:
    return record.at + timedelta(seconds=spec.healing.repair.health_check.timeout_seconds) + SLACK


@dataclass(frozen=True)
class SparePlan:
    actions: tuple[Action, ...] = ()
    running: tuple[str, ...] = ()  # nodes whose check is under way (their Jobs' verdicts are read next time)
    failed: tuple[Remediation, ...] = ()  # spares that failed: their remediations, to be created


def to_check(n: NodeView, claimed: frozenset[str]) -> bool:
    """A spare the validation pass checks: in service as a spare, not lent, not taken, not proven."""
    return (n.is_spare and n.ready and n.fault is None and not n.on_loan and n.name not in claimed
            and n.remediation is None and not n.proven)


def plan_spare_checks(nodes: Iterable[NodeView], verdicts: Mapping[str, Verdict], claimed: frozenset[str],
                      spec: FleetSpec, now: datetime) -> SparePlan:
    """For each unproven spare: start its check (the record first, so a restart finds the Job's name), or
    read the verdict of the one under way. `verdicts`: by Job name, for the checks under way."""
    if not required(spec):
        return SparePlan()
    actions: list[Action] = []
    running, failed = [], []
    for n in sorted(nodes, key=lambda n: n.name):
        if not to_check(n, claimed):
            continue
        c = n.check
        if c is None or c.boot != n.boot_id or c.state == PASSED:
            job = job_name(n.name, f"{n.boot_id}@{now.isoformat()}")
            actions += [RecordCheck(n.name, HealthCheckRecord(job, n.boot_id, RUNNING, now)),
                        StartHealthCheck(n.name, n.pool or "", job),
                        NodeEvent(n.name, "HealthCheckStarted", f"spare {n.name} is checked before it serves: Job {job}")]
            running.append(n.name)
            continue
        if c.state == FAILED:
            failed.append(failed_spare(n, c, spec))  # noted failed; its remediation not made yet (a crash)
            continue
        if c.state == UNPROVEN_RECORD:
            if now - c.at >= UNPROVEN_RECHECK:  # its image may carry the tools by now
                job = job_name(n.name, f"{n.boot_id}@{now.isoformat()}")
                actions += [RecordCheck(n.name, HealthCheckRecord(job, n.boot_id, RUNNING, now, c.message)),
                            StartHealthCheck(n.name, n.pool or "", job)]
                running.append(n.name)
            continue
        v = verdicts.get(c.job, Verdict(MISSING))
        if v.state == PASSED:
            actions += [RecordCheck(n.name, HealthCheckRecord(c.job, n.boot_id, PASSED, now, v.message)),
                        NodeEvent(n.name, "HealthCheckPassed", f"spare {n.name} passed its health check: {v.message}")]
        elif v.state == UNPROVEN:
            actions += [RecordCheck(n.name, HealthCheckRecord(c.job, n.boot_id, UNPROVEN_RECORD, now, v.message)),
                        NodeEvent(n.name, "HealthCheckUnproven", f"spare {n.name} could not be proven: {v.message}",
                                  "Warning")]
            if c.message != v.message:  # paged once for what it could not prove, not at every hourly look
                actions.append(Notify("health-check-unproven", "critical", f"spare {n.name} ({n.pool}) does not "
                                      f"serve: its health check could not prove it ({v.message}). {UNPROVEN_HELP}",
                                      key=n.name))
        elif (v.state == INCONCLUSIVE or now > deadline(c, spec)) and not c.message.startswith(RERUN):
            why = v.message if v.state == INCONCLUSIVE else \
                f"no verdict within {spec.healing.repair.health_check.timeout_seconds}s"
            job = job_name(n.name, f"{n.boot_id}@{now.isoformat()}")
            actions += [RecordCheck(n.name, HealthCheckRecord(job, n.boot_id, RUNNING, now, f"{RERUN}{c.job}: {why}")),
                        StartHealthCheck(n.name, n.pool or "", job),
                        NodeEvent(n.name, "HealthCheckInconclusive", f"spare {n.name}: health check {c.job} gave no "
                                  f"verdict ({why}): checked again once, by {job}", "Warning")]
            running.append(n.name)
        elif v.state in (FAILED, INCONCLUSIVE) or now > deadline(c, spec):
            why = v.message if v.state == FAILED else \
                f"the second check in a row without a verdict ({v.message or 'its deadline passed'}; {c.message})"
            done = HealthCheckRecord(c.job, n.boot_id, FAILED, now, why, v.action)
            actions += [RecordCheck(n.name, done),
                        NodeEvent(n.name, "HealthCheckFailed", f"spare {n.name} failed its health check: {why}",
                                  "Warning")]
            failed.append(failed_spare(n, done, spec))
        else:
            if v.state == MISSING:
                actions.append(StartHealthCheck(n.name, n.pool or "", c.job))  # noted, not made (a crash): made now
            running.append(n.name)
    return SparePlan(tuple(actions), tuple(running), tuple(failed))


def failed_spare(n: NodeView, check: HealthCheckRecord, spec: FleetSpec) -> Remediation:
    """A spare that failed its check, as a remediation of its own: the heal's spare path quarantines it and
    asks for a refill, then its repair begins at what the check says it needs (the record's action: a reset,
    a reboot, the vendor; none said: the repair's default). Named after the check, so making it again finds
    it made."""
    why = f"failed its health check ({check.job}): {check.message}"
    needs = next((a for a in FaultAction if a.value == check.action and a.remediates), None)
    return Remediation(
        name=f"{n.name}-check-{int(check.at.timestamp())}", node=n.name, pool=n.pool or "", xid=0, message=why,
        phase=Phase.DETECTED, created=check.at, phase_times=((Phase.DETECTED.value, check.at),), reason=why,
        was_spare=True, action=needs,
    )


def passed_record(node: NodeView, job: str, now: datetime, message: str) -> HealthCheckRecord:
    return HealthCheckRecord(job, node.boot_id, PASSED, now, message)


def nodes_checking(nodes: Iterable[NodeView]) -> tuple[str, ...]:
    """Spares whose check runs now (a remediation that finds no proven spare waits for these)."""
    return tuple(n.name for n in nodes if n.is_spare and n.check is not None and n.check.state == RUNNING
                 and n.check.boot == n.boot_id and n.role == labels.ROLE_SPARE)
