"""`gpufleet preview` with the real engine and the policy pack: a clean stack passes, a violating
one is blocked with messages naming the rule and the resource."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def preview(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufleet", "preview", "--stack", "local", "--scratch", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_clean_local_stack_passes(pulumi_bin_dir, tmp_path):
    r = preview("--json", str(tmp_path / "summary.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["violations"] == [] or all(v["level"] != "mandatory" for v in summary["violations"])
    assert "NodeSet 2" in r.stdout and "policy violations: none" in r.stdout


def test_violating_stack_is_blocked_naming_rule_and_resource(pulumi_bin_dir, tmp_path):
    doc = yaml.safe_load((ROOT / "Pulumi.local.yaml").read_text())
    fleet = doc["config"]["gpufleet:fleet"]
    fleet["pools"][1]["spares"] = 0
    fleet["healing"]["reconciler"] = {"image": "ghcr.io/gpufleet/reconciler:latest"}
    bad = tmp_path / "Pulumi.violating.yaml"
    bad.write_text(yaml.safe_dump(doc))
    md = tmp_path / "summary.md"
    r = preview("--stack-file", str(bad), "--policy-config", str(ROOT / "policies/config/prod.json"),
                "--markdown", str(md))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[mandatory] gpu-pool-spares: ConfigMap gpufleet-system/gpufleet-pool-l40s" in r.stdout
    assert "[mandatory] images-pinned: Deployment gpufleet-system/gpufleet-reconciler" in r.stdout
    assert ":latest" in r.stdout and "Fix:" in r.stdout
    assert "gpu-pool-spares" in md.read_text()
    # the real stack file is untouched by a what-if
    assert yaml.safe_load((ROOT / "Pulumi.local.yaml").read_text())["config"]["gpufleet:fleet"]["pools"][1]["spares"] == 1


@pytest.mark.parametrize("env", ["prod", "staging"])
def test_prod_and_staging_preview_with_the_policy_pack(pulumi_bin_dir, tmp_path, env):
    """From a clean clone: scratch state, placeholder secrets, the env's mandatory policy config; the
    operator's charts left out (they cannot be fetched here), everything else previewed for real."""
    r = subprocess.run([sys.executable, "-m", "gpufleet", "preview", "--stack", env, "--scratch",
                        "--without-operator-chart", "--json", str(tmp_path / "s.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["errors"] == [], r.stdout + r.stderr
    if env == "prod":
        # Prod names its images only once the release workflow recorded their digests (gpufleet's, and the
        # Slurm images' at their tag): until then its mandatory images-pinned rule blocks it, for exactly those
        # and nothing else: the agent, the reconciler, slurmdbd, slurmctld, slurmd of each of the 4 pools,
        # login, slurmrestd, and the slurmctld image the Job that declares the reconciler's Slurm user runs.
        assert r.returncode == 1 and summary["mandatory_violations"] == 11, r.stdout + r.stderr
        assert "Job slurm/gpufleet-slurm-users" in r.stdout, r.stdout
        assert r.stdout.count("[mandatory] images-pinned") == 11 and "[mandatory]" not in r.stdout.replace(
            "[mandatory] images-pinned", "")
    else:
        assert r.returncode == 0 and summary["mandatory_violations"] == 0, r.stdout + r.stderr
    assert summary["policy_packs"], "the policy pack did not run"
    kinds = summary["changes"]["create"]
    assert kinds["Token"] == 1 and kinds["RestApi"] == 1 and kinds["Controller"] == 1
    assert any("left out of this preview" in w for w in summary["warnings"])
