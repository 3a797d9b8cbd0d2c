"""What only SlurmREST has, against a real slurmrestd and slurmctld (Slurm 26.05, JWT): the data parser
choice (and v0.0.44's requeue), tokens (signed, read from a Token's Secret file, expired, signed with the
wrong key) and slurmrestd outages. The contract both clients keep is test_slurm_contract.py."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import jwt
import pytest

from localenv.slurm import LocalSlurm
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.slurm import SlurmError, make_client
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST, TokenFile
from tests.integration.test_slurm_contract import running, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PERSON_REASON = "maintenance: alice replaces the PSU"


def idle(states) -> bool:
    return states == {"IDLE", "DYNAMIC_NORM"}


# --------------------------------------------------------------------------- reading


def test_the_newest_data_parser_the_server_offers_is_chosen_once(slurm_rest: SlurmREST) -> None:
    t0 = time.monotonic()
    slurm_rest.nodes()
    first = time.monotonic() - t0  # includes GET /openapi/v3 (the parser choice)
    assert slurm_rest.parser == "v0.0.45"
    t0 = time.monotonic()
    slurm_rest.node("gpu-a-0")
    print(f"first call (with /openapi/v3) {first * 1000:.0f} ms, GET node {(time.monotonic() - t0) * 1000:.0f} ms")


# --------------------------------------------------------------------------- requeue on v0.0.44


def test_v0_0_44_requeue_sets_the_drained_node_down_keeping_its_reason(
        slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    """Slurm 25.11 (v0.0.44) has no requeue call: the documented fallback, on the real server."""
    rest = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path), parsers=("v0.0.44",))
    assert rest.parser == "v0.0.44"
    out = tmp_path / "job"
    job_id = submit(slurm_fresh, out)
    job = wait_for("the job to run", lambda: running(rest, job_id))
    with pytest.raises(SlurmError) as ei:  # no drained node: refused, nothing taken down
        rest.requeue([job_id])
    assert ei.value.temporary is False and "drain" in str(ei.value)
    assert rest.job(job_id).state == "RUNNING"
    bad = job.nodes[0]
    rest.drain(bad, PERSON_REASON)  # say a person had drained it
    rest.requeue([job_id])
    pending = wait_for("the job to be requeued", lambda: (j := rest.job(job_id)) and j.state == "PENDING" and j)
    assert pending.restarts == 1
    n = rest.node(bad)
    assert "DOWN" in n.states or "DRAIN" in n.states
    assert n.reason == PERSON_REASON  # kept


# --------------------------------------------------------------------------- tokens


def write_token(path: Path, key: bytes, user: str = "slurm", lifetime: int = 900, age: int = 0) -> str:
    now = int(time.time()) - age
    tok = jwt.encode({"sun": user, "iat": now, "exp": now + lifetime}, key, algorithm="HS256")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{tok}\n")
    tmp.rename(path)  # as the kubelet swaps a Secret volume's files
    return tok


def test_token_file_is_reread_when_expired(slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    key = slurm_fresh.jwt_key_path.read_bytes()
    f = tmp_path / "SLURM_JWT"
    write_token(f, key, lifetime=60, age=120)  # expired a minute ago
    rest = SlurmREST(slurm_fresh.rest_url, TokenFile(f))
    with pytest.raises(SlurmError) as ei:
        rest.node("gpu-a-0")
    assert ei.value.temporary is True
    assert "expired" in str(ei.value) and str(f) in str(ei.value)
    write_token(f, key)  # the Token controller refreshed the Secret
    assert rest.node("gpu-a-0").name == "gpu-a-0"
    # A token about to expire is swapped for the file's newer one before it is sent.
    old = write_token(f, key, lifetime=30)
    rest.node("gpu-a-0")
    new = write_token(f, key, lifetime=900, age=1)
    assert new != old
    rest.node("gpu-a-0")
    assert rest.tokens.token() == new


def test_wrong_key_is_a_clear_permanent_error(slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    wrong = tmp_path / "other.key"
    wrong.write_bytes(os.urandom(32))
    rest = SlurmREST(slurm_fresh.rest_url, SignedToken(wrong))
    with pytest.raises(SlurmError) as ei:
        rest.drain("gpu-a-0", "x")
    e = ei.value
    assert e.temporary is False
    assert "rejected the token" in str(e) and "another key" in str(e) and str(wrong) in str(e)
    f = tmp_path / "SLURM_JWT"
    write_token(f, wrong.read_bytes())
    with pytest.raises(SlurmError) as ei:
        SlurmREST(slurm_fresh.rest_url, TokenFile(f)).node("gpu-a-0")
    assert ei.value.temporary is False and str(f) in str(ei.value)
    assert not SlurmCLI(env=slurm_fresh.env()).node("gpu-a-0").drained_or_down


def test_a_user_without_rights_cannot_change_nodes(slurm_fresh: LocalSlurm) -> None:
    rest = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path, user="slurmrest"))
    assert rest.node("gpu-a-0").name == "gpu-a-0"  # reading is fine
    with pytest.raises(SlurmError) as ei:
        rest.drain("gpu-a-0", "x")
    assert ei.value.temporary is False and "Invalid user id" in str(ei.value)


# --------------------------------------------------------------------------- slurmrestd outages


def test_slurmrestd_stopped_is_temporary_and_works_again(slurm_fresh: LocalSlurm, slurm_rest: SlurmREST) -> None:
    slurm_rest.node("gpu-a-0")
    slurm_fresh.stop_daemon("slurmrestd")
    try:
        for call in (lambda: slurm_rest.node("gpu-a-0"), lambda: slurm_rest.drain("gpu-a-0", "x")):
            t0 = time.monotonic()
            with pytest.raises(SlurmError) as ei:
                call()
            assert ei.value.temporary is True and "cannot reach slurmrestd" in str(ei.value)
            assert time.monotonic() - t0 < 2
    finally:
        slurm_fresh.up()
    assert idle(slurm_rest.node("gpu-a-0").states)


def test_slow_slurmrestd_times_out_as_temporary(slurm_fresh: LocalSlurm) -> None:
    pid = slurm_fresh.status()["daemons"]["slurmrestd"]
    rest = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path), timeout=1.5)
    rest.node("gpu-a-0")
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(SlurmError) as ei:
            rest.node("gpu-a-0")
        assert ei.value.temporary is True and "did not answer within 1.5s" in str(ei.value)
        assert time.monotonic() - t0 < 3
    finally:
        os.kill(pid, signal.SIGCONT)
    assert rest.node("gpu-a-0").name == "gpu-a-0"


# --------------------------------------------------------------------------- the factory


def test_make_client(slurm_fresh: LocalSlurm, tmp_path: Path) -> None:
    assert make_client("none") is None
    assert isinstance(make_client("cli", env=slurm_fresh.env()), SlurmCLI)
    c = make_client("rest", url=slurm_fresh.rest_url, jwt_key_file=slurm_fresh.jwt_key_path)
    assert isinstance(c, SlurmREST) and c.node("gpu-a-1").name == "gpu-a-1"
    with pytest.raises(ValueError, match="--slurm-url"):
        make_client("rest", jwt_key_file=slurm_fresh.jwt_key_path)
    with pytest.raises(ValueError, match="exactly one of"):
        make_client("rest", url=slurm_fresh.rest_url)
    with pytest.raises(ValueError, match="unknown backend"):
        make_client("pyslurm")


# --------------------------------------------------------------------------- the demo's job in the root


def test_demo_training_job_runs_inside_the_slurm_root(slurm_fresh: LocalSlurm, slurm_rest: SlurmREST,
                                                      tmp_path: Path) -> None:
    """The demo's train.py (stdlib only) runs with the root's python3 as a batch job and gets the
    same weights as the host's reference run."""
    from localenv import train

    run = tmp_path / "run"
    run.mkdir()
    script = Path(train.__file__).resolve()
    job = slurm_fresh.sbatch("-p", "gpu", f"--chdir={run}", f"--output={run}/slurm-%j.out", "--wrap",
                             f"exec python3 {script} --dir {run} --steps 30 --every 10 --delay 0.01")
    wait_for("the training job to complete", lambda: (j := slurm_rest.job(job)) and j.state == "COMPLETED",
             timeout=60)
    result = json.loads((run / "result.json").read_text())
    assert result["weights"] == train.reference(30)
