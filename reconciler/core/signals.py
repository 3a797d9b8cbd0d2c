"""The SIGTERM a remediation sends its node's jobs before the grace period: at least once, and once per job.

- **Once per job, whatever number of remediations touch it.** A job on two faulted nodes is signalled by
  the first remediation that gets to it; the others see that checkpoint under way (`StepFacts.checkpoints`:
  the jobs another live remediation signalled, with its grace deadline, counted under the claims lock with
  the steps being applied, so two workers never both signal) and wait on the same deadline. A second
  SIGTERM during a checkpoint makes many training frameworks abort the save.
- **At least once across a crash.** The intent (`signal:TERM`) is written before the send and a delivered
  mark after it (`Remediation.delivered`); a restart that finds the intent without the mark sends again
  while the jobs still run and the grace lasts. Twice only when the crash falls between the send and the
  mark: losing the SIGTERM would cost the job its checkpoint, which is worse.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Iterable

from gpufleet.reconciler.core.actions import SignalJobs
from gpufleet.reconciler.core.model import Remediation, StepFacts
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.slurm_states import ON_NODE_JOB_STATES, SIGNALLABLE_JOB_STATES

SIGTERM = SignalJobs((), "TERM").once


def on_node(facts: StepFacts) -> tuple[int, ...]:
    """The jobs that hold the node (the grace period waits for them; a requeue ends what is left)."""
    return tuple(sorted(j.job_id for j in facts.jobs_on_node if j.state in ON_NODE_JOB_STATES))


def signallable(facts: StepFacts) -> tuple[int, ...]:
    return tuple(sorted(j.job_id for j in facts.jobs_on_node if j.state in SIGNALLABLE_JOB_STATES))


def checkpoint(facts: StepFacts, grace_seconds: int, now: datetime) -> tuple[tuple[int, ...], datetime]:
    """The jobs this remediation signals now, and until when it waits for the node's jobs: its own grace
    for the jobs it signals, the other remediation's deadline for a job whose checkpoint is under way."""
    others = dict(facts.checkpoints)
    mine = tuple(j for j in signallable(facts) if j not in others) if grace_seconds > 0 else ()
    deadline = now + timedelta(seconds=grace_seconds)
    shared = [others[j] for j in on_node(facts) if j in others]
    if shared and not mine:
        deadline = max(shared)
    elif shared:
        deadline = max([deadline, *shared])
    return mine, deadline


def undelivered(r: Remediation, facts: StepFacts, now: datetime) -> SignalJobs | None:
    """The SIGTERM to send again: noted as begun, never marked delivered (a crash, or a failed send), its
    jobs still running, the grace not over."""
    if SIGTERM not in r.intents or SIGTERM in r.delivered or now >= (r.grace_deadline or now):
        return None
    still = tuple(j for j in signallable(facts) if j in r.signalled)
    return SignalJobs(still, "TERM") if still else None


def checkpoints_under_way(remediations: Iterable[Remediation], excluding: str, now: datetime) -> tuple[tuple[int, datetime], ...]:
    """Jobs whose SIGTERM other remediations sent (or are sending: the steps being applied count) and whose
    checkpoint they wait for (Checkpointing; past its deadline the requeue is next): job -> the latest deadline."""
    out: dict[int, datetime] = {}
    for x in remediations:
        if x.name == excluding or x.phase is not Phase.CHECKPOINTING or SIGTERM not in x.intents:
            continue
        deadline = x.grace_deadline or now
        for j in x.signalled:
            out[j] = max(out.get(j, deadline), deadline)
    return tuple(sorted(out.items()))
