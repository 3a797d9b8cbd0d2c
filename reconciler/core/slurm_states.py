"""Slurm's state words and what gpufleet reads from them: one definition, for the core and both clients.

Nodes (Slurm 26.05): slurmrestd sends the base state and every flag as a list, e.g. ["IDLE", "DRAIN"]
(data parser v0.0.45, NODE_STATES in src/plugins/data_parser/v0.0.45/parsers.c); `scontrol -o show node`
prints the same words joined by "+" ("IDLE+DRAIN", node_state_string_complete in
src/common/slurm_protocol_defs.c). DRAINING and DRAINED are sinfo's names for DRAIN with and without work
(node_state_string), never sent by either. NOT_RESPONDING is a flag, not a state: slurmd missed its pings,
so slurmctld schedules nothing there, but the node is DOWN only once SlurmdTimeout passes. FAIL is an
administrator's "expected to fail": no new work, like DOWN.

Jobs: the base state and flags of JOB_STATE in the same parser (a RUNNING job may also be COMPLETING).
"""
from __future__ import annotations

from collections.abc import Collection

IDLE = "IDLE"
DRAIN = "DRAIN"
NOT_RESPONDING = "NOT_RESPONDING"
DOWN_STATES = frozenset({"DOWN", "FAIL"})
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})  # runs, or is finishing, a job

PENDING = "PENDING"
# Jobs that hold their node (the grace period waits for them; a requeue kills what is left) ...
ON_NODE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING",
                                "SIGNALING"})
# ... and of those, the ones a signal can still reach (a completing job is already ending).
SIGNALLABLE_JOB_STATES = ON_NODE_JOB_STATES - {"COMPLETING"}


def drained(states: Collection[str]) -> bool:
    return DRAIN in states


def down(states: Collection[str]) -> bool:
    return any(s in DOWN_STATES for s in states)


def drained_or_down(states: Collection[str]) -> bool:
    """Out of service by someone's hand (RESUME undoes it); NOT_RESPONDING alone is not."""
    return drained(states) or down(states)


def busy(states: Collection[str]) -> bool:
    return any(s in BUSY_STATES for s in states)


def idle(states: Collection[str]) -> bool:
    return IDLE in states and not busy(states)


def takes_jobs(states: Collection[str]) -> bool:
    """slurmctld would start a job there now."""
    return not drained_or_down(states) and NOT_RESPONDING not in states
