"""A pool's active checks: the health check run again, at a declared period, on capacity that waits.

Faults that the kernel never reports (a GPU that computes wrong, an NVLink that lost bandwidth) are found only by
looking. The check is the one that proves a node before service (`healing.repair.health_check`: the same Job,
image and floors); it runs on an active node only while Slurm has it idle, under a maintenance reservation that
Slurm refuses while a job runs there, and on a spare that serves. Its default period, an hour, is CoreWeave's: "At the top of each hour, if a
Node is idle ... CoreWeave runs a 20-30 minute verification test" (CoreWeave's docs, "HPC Verification",
https://docs.coreweave.com/platform/fleet-management/hpc-verification).

Pure pydantic: read by the spec (`fleetspec/models.py`: `pools[].active_checks`) and the reconciler's core
(`reconciler/core/active_checks.py`).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PERIOD_SECONDS = 3600  # CoreWeave's HPC verification of idle nodes: hourly


class ActiveChecks(BaseModel):
    """`pools[].active_checks`: absent, the pool's nodes are checked only before service and in repair."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    period_seconds: int = Field(PERIOD_SECONDS, ge=300, le=30 * 86400, description=(
        "A node whose last passed health check is older than this is checked again when it waits: an active "
        "node that Slurm has idle, or a spare (default 3600: hourly, as CoreWeave's HPC verification)."))
    max_at_once: int = Field(1, ge=1, description=(
        "The most of the pool's nodes checked at once: the rest of its idle capacity stays in Slurm's hands."))
    idle_nodes: bool = Field(True, description="Check active nodes while Slurm has them idle.")
    spares: bool = Field(True, description="Check spares (they serve meanwhile only once the check passed).")


def errors(checks: ActiveChecks, *, pool_size: int, check_timeout_seconds: int, repair_enabled: bool) \
        -> tuple[str, str] | None:
    """The first thing wrong with a pool's active checks, as (field under `active_checks`, reason), or None."""
    if not repair_enabled:
        return "", ("active checks run the repair loop's health check and hand a node that fails it to the "
                    "repair loop: turn healing.repair.enabled on, or leave active_checks out")
    if checks.period_seconds <= check_timeout_seconds:
        return "period_seconds", (f"{checks.period_seconds}s is not longer than the health check's own deadline "
                                  f"(healing.repair.health_check.timeout_seconds: {check_timeout_seconds}s): a node "
                                  "would be due again before its check could end")
    if pool_size > 1 and checks.max_at_once >= pool_size:
        return "max_at_once", (f"{checks.max_at_once} at once would take all {pool_size} of the pool's nodes "
                               "(active and spares) at the same time: at most "
                               f"{pool_size - 1}")
    return None
