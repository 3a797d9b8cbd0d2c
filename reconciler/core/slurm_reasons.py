"""Who set a Slurm node's reason, as Slurm records it, and the reasons Slurm's own daemons write: a table,
each row with what it means for the node and what gpufleet does about it.

Slurm keeps, beside a node's reason, the uid of whoever set it (`reason_uid`) and when (`reason_time`):
- slurmrestd sends them as `reason_set_by_user` (the user's name; "" when slurmrestd cannot name the uid)
  and `reason_changed_at` (data parser v0.0.45 and v0.0.44, PARSER_ARRAY(NODE) in
  src/plugins/data_parser/v0.0.45/parsers.c, NODE_REASON_USER_ID's dumper; slurm-26-05-3-1);
- `scontrol show node` prints `Reason=<reason> [<user>@<time>]`, the user a name or, when it has none, the
  uid in digits (src/api/node_info.c, uid_to_string).

Whose uid Slurm records (slurm-26-05-3-1):
- a drain, down or reason sent by a client (`scontrol update`, slurmrestd's POST /node): the sender's uid
  (src/slurmctld/proc_req.c _slurm_rpc_update_node -> src/slurmctld/node_mgr.c update_node: `reason_uid =
  auth_uid`). A person with their own account is recorded as themselves; gpufleet as the reconciler's Slurm
  user (`slurm.reconciler_user`); Slinky's operator as `slurm` (its client's token: slurm-operator v1.2.1
  internal/controller/slurmclient/slurmclient_sync.go, slurmjwt.NewToken's default username) and, for its
  preStop's DOWN, as the slurmd container's root (internal/builder/workerbuilder/worker_app.go);
- slurmctld's own drains and downs: the SlurmUser (`slurm_conf.slurm_user_id`): node_mgr.c set_node_reason
  ("Not responding" from src/slurmctld/ping_nodes.c, "reboot timed out" and "ResumeTimeout reached" from
  src/slurmctld/power_save.c), and every drain_nodes() caller (node_mgr.c validate_node_specs: "Prolog error",
  "Job env setup error", a registration that does not match, e.g. "Low RealMemory ..." or gres.c's "gres/gpu
  count reported lower than configured ..."; src/slurmctld/agent.c "Prolog/Epilog failure", "Duplicate jobid";
  src/slurmctld/job_mgr.c "Epilog error"; proc_req.c "batch job complete failure");
- slurmd's and slurmstepd's own: the uid they run as, root (SlurmdUser), since they drain through the same
  update RPC: "Kill task failed (JobId=...)" (src/slurmd/slurmstepd/step_terminate_monitor.c ->
  mgr.c stepd_drain_node), "Failed to set node feature(s) ..." (src/slurmd/slurmd/req.c).

So the user alone says "a person" for every other account, whatever the text. The SlurmUser and root are
ambiguous: Slurm's daemons use them, and so does a person who runs scontrol as root or inside the
controller's container (Slinky's runs as the SlurmUser). A reason set by one of them is Slurm's own only
when it is one of the reasons below (every part of it: slurmctld appends its reason to one already there,
" : " between them, and records itself as the setter, node_mgr.c set_node_reason); anything else they set
is a person's.

The reasons (`prefix` as Slurm writes it; what follows varies):
"""
from __future__ import annotations

from dataclasses import dataclass

from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import reason_for

SLURMD_USER = "root"  # SlurmdUser's default (slurm.conf(5)); Slinky's slurmd containers run as root
# A person's own account never matches these; the SlurmUser is gpufleet.fleetspec.models.SLURM_USER.

CHECK = "check"  # something on the node failed: it takes no job until a reboot or a check proves it (slurm_drains.py)
GONE = "gone"  # slurmd is unreachable: Slurm set it DOWN; it comes back when its slurmd registers again


@dataclass(frozen=True)
class SlurmReason:
    """A reason Slurm's own daemons write: what it means and what gpufleet does about it."""

    prefix: str
    kind: str  # the fault's kind, a short name
    action: str  # CHECK or GONE
    means: str
    source: str  # where Slurm writes it (slurm-26-05-3-1)
    code: int  # the row's number in gpufleet's GPU condition (`SlurmDrain<code>`) and a record's name; never reused
    needs: FaultAction | None  # what core/slurm_drains.py asks for a CHECK row; None: GONE (node_lost.py reads it)
    why: str  # why that action

    @property
    def reason(self) -> str:
        """The condition's reason: `SlurmDrain<code>` (fleetspec/faults/condition.py)."""
        return reason_for(Kind.SLURM_DRAIN, self.code)


# Why a reboot, why a check. A reboot climbs the repair loop's ladder (core/repair.py: reboot, health check,
# return); a check is the diagnosis a repeated Xid 13 asks for (core/diagnosis.py: the node stays drained, is
# health-checked, and returns with the drain lifted, or is healed as the check says), as CoreWeave's SUNK drains,
# restarts, rechecks and undrains a node its health checks took out (docs.coreweave.com/products/sunk/manage_sunk/
# drain-and-undrain-nodes, "When nodes are drained automatically").
_UNKILLABLE = ("slurm.conf(5) UnkillableStepTimeout: a step's processes that outlive SIGKILL this long make slurmd "
               "run UnkillableStepProgram and drain the node (slurm.schedmd.com/slurm.conf.html"
               "#OPT_UnkillableStepTimeout); a process stuck in the kernel (a hung GPU, a hung file system) ends only "
               "with the machine's restart")
_GPU_MISSING = ("a GPU the node is configured with is not seen by slurmd at registration: like a GPU lost at probe "
                "(NVIDIA's RESTART_BM for a GPU fallen off the bus), a restart brings it back or proves it gone")
_CHECK = "nothing says what broke: the node stays drained and takes no job until a health check proves it"
_GONE = None

REASONS: tuple[SlurmReason, ...] = (
    SlurmReason("Kill task failed", "kill-task-failed", CHECK,
                "a job's processes did not end on SIGKILL (UnkillableStepTimeout): often a process stuck in the "
                "kernel on a hung GPU or file system", "src/slurmd/slurmstepd/step_terminate_monitor.c",
                1, FaultAction.REBOOT, _UNKILLABLE),
    SlurmReason("Not responding", "not-responding", GONE,
                "slurmd missed SlurmdTimeout of pings: the node or its slurmd is gone", "src/slurmctld/ping_nodes.c",
                2, _GONE, "read from Kubernetes' Ready condition (core/node_lost.py)"),
    SlurmReason("Prolog error", "prolog-error", CHECK, "the node's Prolog failed",
                "src/slurmctld/node_mgr.c validate_node_specs", 3, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Job env setup error", "job-env-setup-error", CHECK, "slurmd could not set up a job's environment",
                "src/slurmctld/node_mgr.c validate_node_specs", 4, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Prolog/Epilog failure", "prolog-epilog-failure", CHECK, "a Prolog or Epilog failed",
                "src/slurmctld/agent.c", 5, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Epilog error", "epilog-error", CHECK, "the node's Epilog failed", "src/slurmctld/job_mgr.c",
                6, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("batch job complete failure", "batch-complete-failure", CHECK,
                "slurmd reported an error ending a batch job", "src/slurmctld/proc_req.c", 7, FaultAction.DIAGNOSE,
                _CHECK),
    SlurmReason("Duplicate jobid", "duplicate-jobid", CHECK, "slurmd already ran a job of that id",
                "src/slurmctld/agent.c", 8, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("gres/gpu count reported lower than configured", "gpu-count-low", CHECK,
                "slurmd found fewer GPUs than the node is configured with (a GPU fell off)",
                "src/interfaces/gres.c via node_mgr.c validate_node_specs", 9, FaultAction.REBOOT, _GPU_MISSING),
    SlurmReason("Low RealMemory", "registration-mismatch", CHECK, "slurmd registered less memory than configured",
                "src/slurmctld/node_mgr.c validate_node_specs", 10, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Low socket*core*thread count", "registration-mismatch", CHECK,
                "slurmd registered fewer CPUs than configured", "src/slurmctld/node_mgr.c validate_node_specs",
                11, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Low TmpDisk", "registration-mismatch", CHECK, "slurmd registered less TmpDisk than configured",
                "src/slurmctld/node_mgr.c validate_node_specs", 12, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("Failed to set node feature(s)", "node-features", CHECK, "slurmd could not set a node feature",
                "src/slurmd/slurmd/req.c", 13, FaultAction.DIAGNOSE, _CHECK),
    SlurmReason("reboot timed out", "reboot-timed-out", GONE, "a reboot Slurm asked for did not come back in time",
                "src/slurmctld/power_save.c", 14, _GONE, "the machine is gone: Kubernetes' Ready says so"),
    SlurmReason("ResumeTimeout reached", "resume-timeout", GONE, "a powered-down node did not come back in time",
                "src/slurmctld/power_save.c", 15, _GONE, "the machine is gone: Kubernetes' Ready says so"),
)
BY_CODE = {r.code: r for r in REASONS}


def reason_parts(reason: str) -> list[str]:
    """A reason as the pieces slurmctld joined (" : " between them, node_mgr.c set_node_reason)."""
    return [p.strip() for p in reason.split(" : ") if p.strip()]


def reason_row(part: str) -> SlurmReason | None:
    """The row of one piece of a reason that Slurm's daemons write, or None."""
    return next((r for r in REASONS if part.startswith(r.prefix)), None)


def slurms_own_text(reason: str) -> SlurmReason | None:
    """The row of a reason every piece of which Slurm's daemons write (the newest piece's row), or None."""
    rows = [reason_row(p) for p in reason_parts(reason)]
    return rows[-1] if rows and all(rows) else None


def nameless(user: str | None) -> bool:
    """Slurm recorded a setter it could not name (slurmrestd's "", scontrol's digits), or did not say: the
    user then tells nothing."""
    return user is None or not user.strip() or user.strip().isdigit()
