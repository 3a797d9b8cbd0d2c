"""Active checks against a real Slurm 26.05 (reconciler/core/active_checks.py): the maintenance reservation that
takes an idle node from Slurm is made only while no job runs there, keeps new jobs off it while it stands, and is
gone once deleted; the pass's reservations are found by name."""
from __future__ import annotations

import pytest

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.core import active_checks

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("backend", ["cli", "rest"])
def test_a_check_reservation_is_made_only_on_an_idle_node_and_deleted_after(slurm_fresh: LocalSlurm, backend,
                                                                             request) -> None:
    """Both backends: scontrol (as root here) and slurmrestd (as the reconciler's own Slurm user, AdminLevel
    Administrator, as the stack has it)."""
    slurm_cli = request.getfixturevalue(f"slurm_{backend}")
    idle = "gpu-a-0"
    name = "gpufleet-check-kwok-gpu-0-1796126400"
    busy_name = "gpufleet-check-kwok-gpu-1-1796126400"
    try:
        slurm_cli.reserve_for_maintenance(name, [idle], 30)
        [r] = [r for r in slurm_cli.reservations() if r.name == name]
        assert r.nodes == (idle,) and "MAINT" in r.flags and active_checks.is_ours(r.name)
        # while it stands, a job asking for that node does not start there
        jid = slurm_fresh.sbatch("-w", idle, "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 60")
        held = wait_for("the scheduler to look at the job", lambda: (
            j if (j := slurm_cli.job(jid)) is not None and j.reason not in ("", "None") or j.state != "PENDING"
            else None), 20)
        assert held.state == "PENDING" and "Reserv" in held.reason or "ReqNodeNotAvail" in held.reason, held
        slurm_fresh.run(["scancel", str(jid)])

        # a node running a job: Slurm refuses the reservation (no IGNORE_JOBS), so the node is never taken
        jid = slurm_fresh.sbatch("-w", "gpu-a-1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 120")
        wait_for("the job to run", lambda: (j := slurm_cli.job(jid)) is not None and j.state == "RUNNING", 20)
        with pytest.raises(SlurmError):
            slurm_cli.reserve_for_maintenance(busy_name, ["gpu-a-1"], 30)
        assert busy_name not in {r.name for r in slurm_cli.reservations()}
        assert slurm_cli.job(jid).state == "RUNNING"  # the job goes on

        slurm_cli.delete_reservation(name)
        slurm_cli.delete_reservation(name)  # deleting it again: already what was asked
        assert name not in {r.name for r in slurm_cli.reservations()}
    finally:
        for r in slurm_cli.reservations():
            if active_checks.is_ours(r.name):
                slurm_cli.delete_reservation(r.name)
