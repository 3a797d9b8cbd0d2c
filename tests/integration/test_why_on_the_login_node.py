"""`gpufleet why` as an ML engineer runs it on the login node, against the real Slurm 26.05: a Unix user that is
not root, with no kubeconfig and no Kubernetes credentials at all, with the Slurm token slurmctld gives them
(`scontrol token`, run as that user), reads the story of their job after a GPU fault: the paragraph in their
words, from what the reconciler wrote into the job's admin comment (the lines and its record, written with the
reconciler's own Administrator token, as the job notes pass does). Another user gets what Slurm shows them:
with `PrivateData=jobs`, nothing at all.

The fault is the demo's (Xid 79 on the GPU at 0000:3b:00, index 1 in the GPU stand-in's nvidia-smi); the job
traps SIGTERM and exits, as a training job that checkpoints does, and is requeued and runs again, all in Slurm."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufleet.waiting import wait_for
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm.rest import SlurmREST
from gpufleet.reconciler.adapters.slurm.scontrol_json import jobs_from_json
from gpufleet.reconciler.core import job_notes, job_record
from gpufleet.reconciler.core.job_notes import JobSeen
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from tests.fixtures.slurm_cluster import TENANT_USER
from tests.integration.test_slurm_contract import running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE = "gpu-a-0"
OTHER_USER = "nobody"  # another ordinary user of the Slurm root (Debian's own)
HOST_USER = 65534  # who runs `gpufleet why` on this machine: nobody, not root
REPO = Path(__file__).resolve().parents[2]
SCRIPT = "#!/bin/sh\ntrap 'echo checkpoint saved; exit 0' TERM\necho started\nwhile true; do sleep 0.2; done\n"


def submit_as(cluster: LocalSlurm, user: str, script: Path) -> int:
    """The job, submitted as `user`; it counts as running once its script has set its trap and said so (a
    SIGTERM before the trap would kill it unsaved: test_reconciler_slurm.py job_on). The script and its output
    are where the user reaches them: the cluster's work dir as the daemons see it (LocalSlurm.daemon_path)."""
    out = cluster.daemon_path(script.parent) / "out-%j"
    r = cluster.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={cluster.daemon_conf}", "sbatch", "--parsable",
                     "--requeue", "--open-mode=append", "-p", "gpu", "-w", NODE, "-J", "train-llm", "--chdir=/tmp",
                     "-o", str(out), str(cluster.daemon_path(script))], timeout=15, check=True)
    jid = int(r.stdout.strip().split(";")[0])
    said = script.parent / f"out-{jid}"
    wait_for(f"job {jid} to run and set its trap", lambda: said.exists() and "started" in said.read_text(), 30)
    return jid


def token_of(cluster: LocalSlurm, user: str) -> str:
    """What `scontrol token` prints for this user (SLURM_JWT=...), run as the user."""
    r = cluster.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={cluster.daemon_conf}", "scontrol", "token"],
                    timeout=15, check=True)
    return r.stdout.strip().split("=", 1)[1]


def why_as_engineer(cluster: LocalSlurm, token: str, job_id: int, *args: str) -> subprocess.CompletedProcess:
    """`gpufleet why` run by a user that is not root, with an empty home, no KUBECONFIG, and their own token."""
    home = Path(tempfile.mkdtemp(prefix="engineer-"))
    os.chmod(home, 0o777)
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    launcher = (f"import site; site.addsitedir({str(site)!r}); "  # the editable install of this checkout
                "from gpufleet.cli import app; app(prog_name='gpufleet')")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SLURM_JWT": token, "LANG": "C.UTF-8"}
    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    return subprocess.run([python, "-c", launcher, "why", str(job_id), "--slurm-url", cluster.rest_url, *args],
                          env=env, capture_output=True, text=True, timeout=60, user=HOST_USER, group=HOST_USER, extra_groups=[],
                          cwd=home)


def remediation_of(job_id: int, fault: datetime, signalled: datetime, requeued: datetime, back: datetime,
                   grace: int = 120) -> Remediation:
    """What the reconciler recorded for the fault, in Slurm's own times (fault, SIGTERM, requeue, healed)."""
    from datetime import timedelta

    message = "[action=reboot pci=0000:3b:00 gpu=1] XID 79 (GPU has fallen off the bus): injected"
    r = Remediation("kwok-gpu-0-xid79-1", "kwok-gpu-0", "gpu", 79, message, Phase.DETECTED, fault,
                    phase_times=(("Detected", fault),), jobs=(job_id,), intents=("signal:TERM",), pci="0000:3b:00",
                    slurm_nodes=(NODE,))
    r = r.moved(Phase.SLURM_DRAINING, fault).moved(Phase.CHECKPOINTING, signalled,
                                                   grace_deadline=signalled + timedelta(seconds=grace))
    r = r.moved(Phase.REQUEUED, requeued).moved(Phase.EVICTING, requeued).moved(Phase.REPLACING, requeued)
    return r.moved(Phase.RESUMING, back).moved(Phase.SUCCEEDED, back)


@pytest.fixture
def healed_job(slurm_fresh: LocalSlurm, slurm_rest: SlurmREST) -> Iterator[int]:
    """A tenant's job that lost a GPU, checkpointed on SIGTERM, was requeued and runs again; its admin comment
    written by the reconciler's token as the job notes pass writes it."""
    folder = slurm_fresh.workdir / "engineer"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    folder.chmod(0o777)  # the tenant's job writes its output there
    script = folder / "train.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    job_id = submit_as(slurm_fresh, TENANT_USER, script)
    wait_for("the job to run", lambda: running(slurm_rest, job_id))
    fault = signalled = datetime.now(timezone.utc).replace(microsecond=0)
    slurm_rest.signal_jobs([job_id], "TERM")
    wait_for("the job to checkpoint and exit", lambda: slurm_rest.job(job_id).state not in ("RUNNING", "COMPLETING"))
    slurm_rest.requeue([job_id])
    requeued = datetime.now(timezone.utc).replace(microsecond=0)
    wait_for("the job to be requeued", lambda: slurm_rest.job(job_id).state == "PENDING")
    slurm_rest.release([job_id])
    job = wait_for("the job to run again", lambda: running(slurm_rest, job_id), 60)
    r = remediation_of(job_id, fault, signalled, requeued, datetime.now(timezone.utc))
    seen = JobSeen(job_id, job.state, job.nodes, datetime.fromtimestamp(job.start_time, timezone.utc))
    text = job_notes.appended(job.admin_comment or "", job_id, job_notes.lines_for(r, seen),
                              (job_record.encode(job_record.record_of(r, "NVIDIA H100 80GB HBM3")),))
    slurm_rest.set_admin_comment(job_id, text)
    yield job_id


def test_the_engineer_reads_the_paragraph_with_their_own_token_and_no_kubernetes(
        slurm_fresh: LocalSlurm, healed_job: int) -> None:
    r = why_as_engineer(slurm_fresh, token_of(slurm_fresh, TENANT_USER), healed_job)
    assert r.returncode == 0, r.stderr
    print(f"$ gpufleet why {healed_job}\n{r.stdout}")  # docs/engineers.md shows a run's output (pytest -s)
    paragraph = r.stdout.split("\n\n", 1)[0]
    assert paragraph.startswith(f"Job {healed_job} (train-llm): At ")
    assert f"GPU 1 (NVIDIA H100 80GB HBM3) on {NODE} failed: GPU has fallen off the bus (NVIDIA Xid 79)." in paragraph
    assert "gpufleet asked the job to checkpoint (SIGTERM at " in paragraph
    assert "inside its 120 s grace, and was requeued." in paragraph
    assert f"The machine behind {NODE} was replaced; {NODE} now runs on a healthy one." in paragraph
    assert f"It runs again since " in paragraph and "; it was not running for " in paragraph
    assert paragraph.endswith("What to do: nothing: the job resumes from its last checkpoint, as it does after "
                              "any requeue.")
    assert "kwok-gpu-0" not in r.stdout  # the machine's own name is nobody's business here
    d = json.loads(why_as_engineer(slurm_fresh, token_of(slurm_fresh, TENANT_USER), healed_job, "--json").stdout)
    assert d["state"] == "running-again" and d["checkpoint"]["in_time"] and d["records"][0]["gpu"] == 1
    assert 0 <= d["not_running_seconds"] < 120


def test_the_users_own_scontrol_shows_the_same_record(slurm_fresh: LocalSlurm, healed_job: int) -> None:
    """On the login node the default path is the engineer's own `scontrol --json show job` (sackd's identity):
    its output, read by the same models, carries the same record."""
    r = slurm_fresh.run(["runuser", "-u", TENANT_USER, "--", "env", f"SLURM_CONF={slurm_fresh.daemon_conf}",
                         "scontrol", "--json", "show", "job", str(healed_job)], timeout=15, check=True)
    (job,) = jobs_from_json(r.stdout)
    (rec,) = job_record.records_in(job.admin_comment or "", job_notes.SEPARATOR)
    assert (rec.gpu, rec.slurm_node, rec.state) == (1, NODE, job_record.DONE)
    assert all(len(x) < 200 for x in (job.admin_comment or "").split(job_notes.SEPARATOR))


def test_another_user_gets_what_slurm_shows_them_and_nothing_with_private_jobs(
        slurm_fresh: LocalSlurm, healed_job: int) -> None:
    mine = why_as_engineer(slurm_fresh, token_of(slurm_fresh, TENANT_USER), healed_job)
    other = why_as_engineer(slurm_fresh, token_of(slurm_fresh, OTHER_USER), healed_job)
    # Slurm shows every job to everyone by default (PrivateData unset): the story is what Slurm shows
    assert other.returncode == 0 and other.stdout.split("\n\n")[0] == mine.stdout.split("\n\n")[0]
    slurm_fresh.extra_conf.append("PrivateData=jobs")
    try:
        slurm_fresh.up()  # slurm.conf changed: the daemons restart with it, their state kept
        hidden = why_as_engineer(slurm_fresh, token_of(slurm_fresh, OTHER_USER), healed_job)
        assert hidden.returncode == 1
        assert f"Slurm shows you no job {healed_job}" in hidden.stdout
        assert "GPU" not in hidden.stdout and "gpufleet 20" not in hidden.stdout and "train-llm" not in hidden.stdout
        still = why_as_engineer(slurm_fresh, token_of(slurm_fresh, TENANT_USER), healed_job)
        assert still.returncode == 0 and "GPU 1 (NVIDIA H100 80GB HBM3)" in still.stdout
    finally:
        slurm_fresh.extra_conf.remove("PrivateData=jobs")
        slurm_fresh.up()
