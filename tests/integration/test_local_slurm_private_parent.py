"""The local Slurm in a work directory that a bind covers through a folder only its owner may enter
(a project cloned into `mktemp -d`, mode 0700, with the environment in its `.local/`): the daemons
that run as `slurm` and `slurmrest` must still reach their files."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from localenv.ports import free_ports
from localenv.slurm import LocalSlurm
from gpufleet.waiting import wait_for
from tests.fixtures.slurm_cluster import build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_daemons_run_under_a_private_parent_that_is_bound_into_the_root() -> None:
    private = Path(tempfile.mkdtemp(prefix="gpufleet-private-"))  # 0700, as mktemp -d makes it
    assert private.stat().st_mode & 0o777 == 0o700
    ctld, rest = free_ports(2)
    cluster = LocalSlurm(private / "project" / ".local" / "slurm", {"gpu": ["gpu-a"]}, root=build_slurm_root(),
                         binds=[private], ctld_port=ctld, rest_port=rest, start_timeout=30)
    try:
        cluster.up()
        st = cluster.status()
        assert st["controller"] is True and st["rest"] is True  # slurmctld as slurm, slurmrestd as slurmrest
        cluster.start_node("gpu-a-0", "gpu-a")
        out = private / "job.out"
        job = cluster.sbatch("-p", "gpu", "-o", str(out), "--wrap", "echo ran")
        wait_for(f"job {job} to write {out}", lambda: out.exists() and "ran" in out.read_text(), 60)
        # slurmctld saved its state where the work dir is, and nobody opened up the private folder.
        assert any(cluster.state_dir.iterdir())
        assert private.stat().st_mode & 0o777 == 0o700
    finally:
        cluster.down()
        shutil.rmtree(private, ignore_errors=True)
