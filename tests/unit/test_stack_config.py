"""The local stack's generated configuration: the tracked Pulumi.local.yaml whole (fleet, secrets, salt)
plus what the environment supplies, in the shape the stack program reads; the tracked file untouched."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.program import LocalEnvironment
from localenv import stack_config

ROOT = Path(__file__).resolve().parents[2]
TRACKED = ROOT / "Pulumi.local.yaml"


def test_the_generated_config_is_the_tracked_one_plus_the_environments_part(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_IMAGES_JSON", str(tmp_path / "none.json"))  # nothing built: no images key
    before = TRACKED.read_text()
    local = stack_config.local_environment(tmp_path / "kubeconfig", 40123, "http://127.0.0.1:26820")
    out = stack_config.write(tmp_path / "pulumi" / "Pulumi.local.yaml", TRACKED, local)
    assert TRACKED.read_text() == before
    doc, tracked = yaml.safe_load(out.read_text()), yaml.safe_load(before)
    assert doc["encryptionsalt"] == tracked["encryptionsalt"]
    extra = doc["config"].pop(stack_config.KEY)
    assert doc["config"] == tracked["config"]  # the fleet and its secrets as they are
    parsed = LocalEnvironment.model_validate(extra)  # what infra/program.py reads
    assert (parsed.api_server.port, parsed.slurm_rest_url, parsed.images) == (40123, "http://127.0.0.1:26820", {})
    mtime = out.stat().st_mtime_ns
    stack_config.write(out, TRACKED, local)  # unchanged: not rewritten
    assert out.stat().st_mtime_ns == mtime


def test_secrets_set_with_pulumi_config_outlive_a_new_local_up(tmp_path, monkeypatch):
    """`pulumi config set --secret` of the local stack writes into the generated file (pulumi is given
    it); generating it again (every `gpufleet local up`) keeps such a secret, and only secrets."""
    monkeypatch.setenv("GPUFLEET_IMAGES_JSON", str(tmp_path / "none.json"))
    path = tmp_path / "pulumi" / "Pulumi.local.yaml"
    local = stack_config.local_environment(tmp_path / "kubeconfig", 40123, None)
    stack_config.write(path, TRACKED, local)
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpufleet:pagerUrl"] = {"secure": "v1:abc:def"}  # as pulumi writes a secret
    doc["config"]["gpufleet:someSetting"] = "plain"
    path.write_text(yaml.safe_dump(doc))
    stack_config.write(path, TRACKED, stack_config.local_environment(tmp_path / "kubeconfig", 40999, None))
    config = yaml.safe_load(path.read_text())["config"]
    assert config["gpufleet:pagerUrl"] == {"secure": "v1:abc:def"}
    assert "gpufleet:someSetting" not in config
    assert config[stack_config.KEY]["apiServer"]["port"] == 40999
    assert config["gpufleet:mungeKey"] == yaml.safe_load(TRACKED.read_text())["config"]["gpufleet:mungeKey"]


def test_an_unreadable_generated_file_is_reported_and_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_IMAGES_JSON", str(tmp_path / "none.json"))
    path = tmp_path / "Pulumi.local.yaml"
    path.write_text("config: [unclosed\n")
    with pytest.raises(stack_config.StackConfigError, match="Pulumi.local.yaml"):
        stack_config.write(path, TRACKED, stack_config.local_environment(tmp_path / "kubeconfig", 40123, None))
    assert path.read_text() == "config: [unclosed\n"
