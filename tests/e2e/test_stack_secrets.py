"""Secrets reach the real Pulumi engine intact, whatever characters a random value starts with.

A clean-clone CI run once failed because `pulumi config set --secret slurmDbPassword -h3a…` read the
generated password as a flag (token_urlsafe begins with `-` one time in 64) and printed it in the error.
"""
from __future__ import annotations

import json

from gpufleet.preview import scratch_stack


def _config(st) -> dict:
    return json.loads(st.run("config", "--json", "--show-secrets", capture=True).stdout)


def test_a_secret_that_looks_like_a_flag_is_stored_as_given(pulumi_bin_dir):
    values = {"slurmDbPassword": "-h3aLE3sPn0PUVGDoOj3Px3", "slurmJwtKey": "--yes"}
    with scratch_stack("staging", list(values), secret_values=values) as st:
        cfg = _config(st)
        for key, value in values.items():
            assert cfg[f"gpufleet:{key}"] == {"value": value, "secret": True}


def test_ensure_secrets_fills_only_the_missing_keys(pulumi_bin_dir):
    with scratch_stack("staging", ["kept"], secret_values={"kept": "-kept-value"}) as st:
        added = st.ensure_secrets(["kept", "fresh"])
        cfg = _config(st)
    assert added == ["fresh"]
    assert cfg["gpufleet:kept"]["value"] == "-kept-value"
    assert cfg["gpufleet:fresh"]["secret"] is True and len(cfg["gpufleet:fresh"]["value"]) >= 32
