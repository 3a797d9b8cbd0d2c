"""The reconciler's Slurm identity: it signs no token of its own outside the local environment, and
its flags name the one token source it uses (the Secret read against a real API server is in
tests/integration/test_slurm_token_secret.py)."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.reconciler.adapters.slurm import make_client
from gpufleet.reconciler.adapters.slurm.token_secret import SecretRef

runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


class Reached(Exception):
    """The command got past its checks to the API server."""


@pytest.fixture
def no_api(monkeypatch):
    def reached(*_a, **_kw):
        raise Reached()

    monkeypatch.setattr("gpufleet.commands._api", reached)


@pytest.mark.parametrize("stack", ["prod", "staging"])
def test_a_non_local_reconciler_signing_its_own_token_is_refused(stack, no_api, tmp_path):
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    r = runner.invoke(app, ["reconcile", "--stack", stack, "--slurm-url", "http://slurm-restapi.slurm:6820",
                            "--slurm-jwt-key-file", str(key), "--once"], env=ENV)
    assert r.exit_code == 2, r.output
    assert "--slurm-jwt-key-file: refused" in r.output and "--slurm-token-secret" in r.output
    assert not isinstance(r.exception, Reached)


def test_a_local_reconciler_may_sign_its_own(no_api, tmp_path):
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    r = runner.invoke(app, ["reconcile", "--stack", "local", "--slurm-url", "http://127.0.0.1:1",
                            "--slurm-jwt-key-file", str(key), "--once"], env=ENV)
    assert isinstance(r.exception, Reached), r.output


def test_a_non_local_reconciler_with_the_tokens_secret_goes_on(no_api):
    r = runner.invoke(app, ["reconcile", "--stack", "prod", "--slurm-url", "http://slurm-restapi.slurm:6820",
                            "--slurm-token-secret", "slurm/gpufleet-reconciler-slurm-token", "--once"], env=ENV)
    assert isinstance(r.exception, Reached), r.output


@pytest.mark.parametrize("text,ref", [
    ("slurm/tok", SecretRef("slurm", "tok", "SLURM_JWT")),
    ("slurm/tok/jwt", SecretRef("slurm", "tok", "jwt")),
])
def test_secret_ref_parses(text, ref):
    assert SecretRef.parse(text) == ref


@pytest.mark.parametrize("text", ["tok", "slurm/", "/tok", "a/b/c/d", "slurm//jwt"])
def test_a_bad_secret_ref_names_the_flag(text):
    with pytest.raises(ValueError, match="--slurm-token-secret"):
        SecretRef.parse(text)


def test_one_token_source_exactly(tmp_path):
    with pytest.raises(ValueError, match="exactly one of --slurm-token-secret"):
        make_client("rest", url="http://x", token_secret="slurm/tok", token_file=tmp_path / "t")
    with pytest.raises(ValueError, match="exactly one of"):
        make_client("rest", url="http://x")
    with pytest.raises(ValueError, match="needs a Kubernetes client"):
        make_client("rest", url="http://x", token_secret="slurm/tok")
