"""A policy change rolls the reconciler: with the real engine, a stack brought up (rendered to a
folder, so no cluster is needed) and then previewed with a longer grace period shows the policy
ConfigMap updated in place and the Deployment updated on its pod template's config checksum."""
from __future__ import annotations

import pytest
import yaml

from gpufleet.fleetspec import load_stack_file
from gpufleet.paths import PROJECT_DIR
from gpufleet.preview import run_preview, scratch_stack, summarize

pytestmark = pytest.mark.e2e


def test_a_policy_change_shows_the_reconciler_rolling(pulumi_bin_dir, tmp_path):
    sf = load_stack_file(PROJECT_DIR / "Pulumi.prod.yaml")
    env = {"GPUFLEET_RENDER_DIR": str(tmp_path / "out"), "GPUFLEET_WITHOUT_OPERATOR_CHART": "1"}
    with scratch_stack("prod", sf.fleet.secret_keys(), env) as st:
        st.run("up", "--yes", "--skip-preview", capture=True)
        stack_file = st.project_dir / "Pulumi.prod.yaml"
        doc = yaml.safe_load(stack_file.read_text())
        assert doc["config"]["gpufleet:fleet"]["healing"]["grace_period_seconds"] == 120
        doc["config"]["gpufleet:fleet"]["healing"]["grace_period_seconds"] = 300
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        run, _, events = run_preview(st, None)
    assert run.returncode == 0, run.stderr
    s = summarize(None, events, stack="prod")
    updates = {(c.kind, c.name.rsplit("-", 1)[-1]): c for c in s.changes if c.op == "update"}
    dep = next(c for c in s.changes if c.kind == "Deployment")
    assert dep.op == "update", [(c.op, c.kind, c.name) for c in s.changes]
    assert any("config-checksum" in d for d in dep.diffs), dep.diffs
    assert ("ConfigMap", "policy") in updates  # in place: the ConfigMaps are mutable
    assert not [c for c in s.changes if c.op in ("replace", "delete")]
