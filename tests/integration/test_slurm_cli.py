"""What only SlurmCLI has, against a real local Slurm 26.05 (the sid root, through LocalSlurm's wrappers):
the tools' time-outs and a controller they cannot reach; and LocalSlurm's own start. The contract both
clients keep is test_slurm_contract.py; hostlists are parsed in tests/unit/test_slurm_cli_parsing.py."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


# --------------------------------------------------------------------------- the cluster


def test_cluster_up_is_idempotent_and_spare_is_drained(slurm_fresh: LocalSlurm) -> None:
    before = slurm_fresh.status()["daemons"]
    t0 = time.monotonic()
    slurm_fresh.up()
    assert time.monotonic() - t0 < 5
    st = slurm_fresh.status()
    assert st["daemons"] == before and all(st["daemons"].values())
    assert st["controller"] is True and st["rest"] is True
    assert st["nodes"] == {"gpu-a-0": "idle", "gpu-a-1": "idle", "gpu-a-2": "drained"}
    assert slurm_fresh.node_names() == ["gpu-a-0", "gpu-a-1", "gpu-a-2"]
    # A second LocalSlurm object on the same folder (another process would do the same)
    # finds the running daemons instead of starting new ones.
    other = LocalSlurm(slurm_fresh.workdir, slurm_fresh.partitions, root=slurm_fresh.root,
                       binds=slurm_fresh.binds, ctld_port=slurm_fresh.ctld_port, rest_port=slurm_fresh.rest_port,
                       extra_conf=slurm_fresh.extra_conf)  # the same slurm.conf (the fixture's Epilog included)
    other.up()
    assert other.status()["daemons"] == before
    assert other.healthy()


# --------------------------------------------------------------------------- controller outages


def test_dead_controller_port_is_temporary(slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(
        "SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
        for line in slurm_fresh.conf_path.read_text().splitlines()) + "\n")
    env = {**slurm_fresh.env(), "SLURM_CONF": str(conf)}
    cli = SlurmCLI(env=env, timeout=15)
    # Each call takes ~4 s here (the client's connect retries). `scontrol requeue` says
    # "Unexpected message received" instead of "Unable to contact slurm controller".
    for call in (lambda: cli.requeue([1]), lambda: cli.drain("gpu-a-0", "x")):
        t0 = time.monotonic()
        with pytest.raises(SlurmError) as ei:
            call()
        assert ei.value.temporary is True, str(ei.value)
        assert time.monotonic() - t0 < 15
        assert "Unable to contact slurm controller" in str(ei.value) or "Unexpected message" in str(ei.value)


def test_hung_controller_times_out_as_temporary(slurm_fresh: LocalSlurm) -> None:
    pid = slurm_fresh.status()["daemons"]["slurmctld"]
    assert pid
    cli = SlurmCLI(env=slurm_fresh.env(), timeout=2)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(SlurmError) as ei:
            cli.node("gpu-a-0")
        assert ei.value.temporary is True
        assert "timed out after 2s" in str(ei.value)
        assert time.monotonic() - t0 < 4
    finally:
        os.kill(pid, signal.SIGCONT)
    assert cli.node("gpu-a-0").states == {"IDLE", "DYNAMIC_NORM"}


