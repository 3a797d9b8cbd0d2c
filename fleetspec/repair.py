"""The spec of the repair loop (issue 25): what happens to a node after a heal replaced it.

A broken node climbs a ladder, mildest rung first: reset its GPU(s), reboot it, retire it. Which rungs
a pool allows, and how long each may take, are the pool's (`pools[].repair`); the health check every
node passes before it serves (a repaired node, a refill, a node that joins), the lemon rule and
`min_healthy_seconds` are the fleet's (`healing.repair`). Pydantic only, like the rest of the spec.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .faults.catalogue import FaultAction
from .models import FieldError, Image, Strict  # defined before models.py imports this module

# the repair's rungs are the fault catalogue's actions (one name, one thing)
RESET_GPU = FaultAction.RESET_GPU.value
REBOOT = FaultAction.REBOOT.value
REPLACE = FaultAction.REPLACE.value
RUNGS = (RESET_GPU, REBOOT)  # the ladder's order; retiring tops it and is always allowed
RepairAction = Literal["reset-gpu", "reboot"]
SkippableCheck = Literal["nvlink", "dcgm", "all-reduce", "pcie"]  # fleetspec/health_report.py's CHECKS but nvidia-smi

DEFAULT_CHECK_COMMAND = ("gpufleet", "health-check")


class PoolRepair(Strict):
    """How one pool's broken nodes are repaired."""

    enabled: bool = Field(True, description="Repair this pool's broken nodes; off: they stay quarantined for a person.")
    actions: list[RepairAction] = Field(
        default_factory=lambda: list(RUNGS),
        description="The rungs of the ladder this pool allows (reset-gpu, reboot); retiring is always allowed.")
    reset_timeout_seconds: int = Field(300, ge=30, le=3600, description="How long a GPU reset may take.")
    reboot_timeout_seconds: int = Field(1200, ge=60, le=7200,
                                        description="How long a reboot may take, until the node is Ready again.")
    reboot_timeouts: dict[str, Annotated[int, Field(ge=60, le=7200)]] = Field(
        default_factory=dict,
        description="How long a reboot may take by instance type (the node's label node.kubernetes.io/instance-type), "
        "for types that boot slower (or faster) than reboot_timeout_seconds, which a node of any other type gets: "
        "e.g. {p5.48xlarge: 2400} for a machine whose firmware trains 2 TiB of memory at every boot.")
    max_concurrent: int = Field(
        4, ge=1, le=1000, description="Repairs of this pool under way at once (a reset, a reboot or a health check); "
        "a repair over the cap waits its turn, oldest first, and its record says so.")
    in_place: bool = Field(
        True, description="When no spare is free and the fault allows a reset or a reboot, the node is repaired at "
        "once and takes its own job back (the job waits for the repair, not for a refill). Off: the job waits for "
        "a spare (a refill, or another node's repair).")

    @model_validator(mode="after")
    def _rungs(self) -> "PoolRepair":
        dupes = sorted({a for a in self.actions if self.actions.count(a) > 1})
        if dupes:
            raise FieldError("actions", f"{dupes} listed twice")
        blank = [k for k in self.reboot_timeouts if not k.strip()]
        if blank:
            raise FieldError("reboot_timeouts", "an instance type is blank (node.kubernetes.io/instance-type's value)")
        if self.in_place and not self.actions and "in_place" in self.model_fields_set:
            raise FieldError("in_place", "repairing in place needs a rung to repair with: allow reset-gpu or reboot")
        return self

    def allows(self, action: str) -> bool:
        return self.enabled and action in self.actions

    def timeout(self, action: str, instance_type: str | None = None) -> int:
        """How long `action` may take on a node of `instance_type` (its label; None or unlisted: the pool's)."""
        if action == RESET_GPU:
            return self.reset_timeout_seconds
        return self.reboot_timeouts.get(instance_type or "", self.reboot_timeout_seconds)


class HealthCheckSpec(Strict):
    """The health check a node passes before it serves: a Job on that node, its result read from the Job."""

    image: Image | None = Field(None, description="Default: the node agent's image (gpufleet health-check).")
    command: list[str] | None = Field(
        None, min_length=1, description="Default: gpufleet health-check with the options below. A command of your own "
        "writes its result to the termination log (fleetspec/health_report.py's JSON) and exits 0 only when it passed.")
    dcgm_level: int | None = Field(
        2, ge=1, le=4, description="DCGM's diagnostic level (dcgmi diag -r), when DCGM is on the node; null: skip it.")
    all_reduce: bool = Field(True, description="A short all-reduce across the node's GPUs (nccl-tests' all_reduce_perf), "
                             "its bus bandwidth held to the GPU model's floor.")
    allow_skip: list[SkippableCheck] = Field(
        default_factory=list, description="Checks that may be skipped when their tool is not in the check's image (the "
        "local cluster only). Any other check whose tool is missing leaves the node unproven: it does not serve, "
        "and a person is paged with the image it needs.")
    timeout_seconds: int = Field(1200, ge=60, le=4 * 3600, description="The Job's deadline: then it failed.")
    before_service: bool = Field(
        True, description="A spare serves only once it passed the check on its current boot (a spare that joins or "
        "comes back from a repair is checked first); off: spares are trusted as they come.")

    @model_validator(mode="after")
    def _skips(self) -> "HealthCheckSpec":
        dupes = sorted({a for a in self.allow_skip if self.allow_skip.count(a) > 1})
        if dupes:
            raise FieldError("allow_skip", f"{dupes} listed twice")
        return self

    def argv(self) -> list[str]:
        if self.command:
            return list(self.command)
        out = [*DEFAULT_CHECK_COMMAND, "--termination-log", "/dev/termination-log"]
        if self.dcgm_level is not None:
            out += ["--dcgm-level", str(self.dcgm_level)]
        if not self.all_reduce:
            out.append("--no-all-reduce")
        for name in self.allow_skip:
            out += ["--allow-skip", name]
        return out


class RepairSpec(Strict):
    """The repair loop, fleet-wide: a node out of service is repaired, proven healthy, and returned (or retired)."""

    enabled: bool = Field(True, description="Off: a healed node stays quarantined for a person.")
    health_check: HealthCheckSpec = Field(default_factory=HealthCheckSpec, description="The check a node passes before it serves.")
    min_healthy_seconds: int = Field(
        3600, ge=0, le=30 * 86400, description="A repaired node that faults within this long of serving again "
        "counts against the node: its repair did not hold, and the next starts a rung higher.")
    retire_after_faults: int = Field(3, ge=1, le=100, description="Faults of one node within the window that retire it.")
    retire_window_seconds: int = Field(7 * 86400, ge=3600, le=365 * 86400, description="The window `retire_after_faults` is counted in.")
    max_concurrent: int = Field(
        16, ge=1, le=10000, description="Repairs under way at once across the fleet (each pool's own cap too): a bad "
        "driver or agent cannot reboot the whole fleet at once; a repair over the cap waits its turn.")
