"""gpufleet preview's summary: pure functions over what `pulumi preview --json` prints.

The fixtures at the bottom are real output of Pulumi CLI v3.274.0 with
PULUMI_ENABLE_STREAMING_JSON_PREVIEW=true (one engine event a line) and the gpufleet policy
pack, captured with `gpufleet preview --scratch --raw DIR` and trimmed (debug/ephemeral
diagnostics dropped, resource states cut to type/custom, long config values shortened):

- PROD_VIOLATIONS: Pulumi.prod.yaml (operator crds-only, as the chart is not reachable here) with
  the reconciler image at :latest and pool l40s at spares: 0, prod policy config.
- LOCAL_UPDATE: the local stack after an `up` in render mode, then nodes/spares/image/storage
  changed: updates, replaces, deletes and two advisory violations.
- PROD_CHART_ERROR: the shipped Pulumi.prod.yaml on a machine that cannot reach ghcr.io: the Helm
  chart fetch fails, no policy violation.
- LOCAL_DIGEST: the one-document `--json` digest (no streaming), first steps only.

Re-capture after a CLI upgrade: `gpufleet preview --stack local --scratch --raw /tmp/raw`.
"""
from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet import preview as pv
from gpufleet.cli import app
from gpufleet.preview import clean, kind_of, parse_digest, parse_events, split_urn, summarize, to_markdown, to_text


def split_output(stdout: str) -> tuple[dict | None, list[dict]]:
    """(digest, events) from `pulumi preview --json` output as these samples hold it: an event stream
    (streaming mode) or one digest document (a CLI without streaming)."""
    events = [e for e in parse_events(stdout) if "sequence" in e or any(k.endswith("Event") for k in e)]
    return (None, events) if events else (parse_digest(stdout), [])


def summary(text: str, **kw):
    digest, events = split_output(text)
    return summarize(digest, events, stack=kw.pop("stack", "prod"), **kw)


def test_streamed_output_is_events_not_a_digest():
    digest, events = split_output(PROD_VIOLATIONS)
    assert digest is None and len(events) == len(PROD_VIOLATIONS.strip().splitlines())
    assert parse_events("not json\n{\"sequence\": 1, \"cancelEvent\": {}}\n\n") == [{"sequence": 1, "cancelEvent": {}}]


def test_prod_violations_summary():
    s = summary(PROD_VIOLATIONS, engine_exit=255)
    counts = s.counts()
    assert list(counts) == ["create"]
    assert sum(counts["create"].values()) == 41
    assert counts["create"]["NodeSet"] == 4 and counts["create"]["ConfigMap"] == 5
    assert counts["create"]["provider:kubernetes"] == 1
    assert not any(c.type.startswith(("gpufleet:", "pulumi:pulumi:")) for c in s.changes)  # components left out
    assert [(v.policy, v.level, v.kind) for v in s.violations] == [
        ("gpu-pool-spares", "mandatory", "ConfigMap"), ("images-pinned", "mandatory", "Deployment")]
    spares = s.violations[0]
    assert spares.name == "prod-pool-l40s-capacity"
    assert spares.message.startswith("ConfigMap gpufleet-system/gpufleet-pool-l40s")  # description line dropped
    assert "Fix: set `spares: 2`" in spares.message
    assert s.errors == []          # the engine's bare "preview failed" is said by the violations
    assert s.warnings == []        # "using pulumi-resource-kubernetes from $PATH" is noise
    assert s.policy_packs == {"gpufleet": "0.1.0"}
    assert s.failed and s.exit_code == 1


def test_prod_violations_markdown_and_json():
    s = summary(PROD_VIOLATIONS, engine_exit=255, policy_config="policies/config/prod.json")
    md = to_markdown(s)
    assert md.startswith("### ❌ `gpufleet preview --stack prod`")
    assert "| create | 41 | " in md and "NodeSet ×4" in md
    assert "**Policy violations:** 2 mandatory, 0 advisory" in md
    assert "| 🚫 mandatory | `images-pinned` | Deployment prod-reconciler-deployment |" in md
    assert "`policies/config/prod.json`" in md
    for line in md.splitlines():
        if line.startswith("| 🚫"):
            assert line.count(" | ") == 3  # no unescaped pipe in a message breaks the table
    d = json.loads(json.dumps(s.to_dict()))
    assert d["ok"] is False and d["mandatory_violations"] == 2 and d["changes"]["create"]["NodeSet"] == 4
    assert {v["policy"] for v in d["violations"]} == {"gpu-pool-spares", "images-pinned"}
    text = to_text(s)
    assert "policy violations: 2 mandatory, 0 advisory" in text and text.endswith("result: FAILED")


def test_local_update_counts_ops_and_passes_with_advisories():
    s = summary(LOCAL_UPDATE, stack="local", engine_exit=0)
    counts = {op: dict(c) for op, c in s.counts().items()}
    assert counts == {"update": {"NodeSet": 2, "LoginSet": 1},
                      "replace": {"ConfigMap": 3, "Deployment": 1},
                      "delete": {"PersistentVolumeClaim": 1, "PersistentVolume": 1, "RestApi": 1}}
    assert s.unchanged == 25
    dep = next(c for c in s.changes if c.kind == "Deployment")
    assert dep.op == "replace" and dep.diffs == ["spec.selector"]  # from the create-replacement step
    nodeset = next(c for c in s.changes if c.name == "local-slurm-nodeset-h100")
    assert "spec.replicas" in nodeset.diffs
    assert {v.level for v in s.violations} == {"advisory"} and len(s.violations) == 2
    assert not s.failed and s.exit_code == 0
    assert any("plaintext" in w for w in s.warnings)
    md = to_markdown(s)
    assert md.startswith("### ✅") and "| unchanged | 25 | |" in md and "⚠️ advisory" in md
    assert "| replace | Deployment | `local-reconciler-deployment` (`spec.selector`) |" in md


def test_preview_error_fails_with_the_engine_message():
    s = summary(PROD_CHART_ERROR, engine_exit=255)
    assert s.violations == []
    assert len(s.errors) == 1
    assert s.errors[0].startswith("Release prod-slurm-operator-crds: kubernetes:helm.sh/v3:Release")
    assert "no such host" in s.errors[0]
    assert s.failed and "**Errors:**" in to_markdown(s)


def test_digest_form_is_read_too():
    digest, events = split_output(LOCAL_DIGEST)
    assert digest is not None and events == []
    s = summarize(digest, events, stack="local", engine_exit=0)
    assert [(c.op, c.kind) for c in s.changes] == [
        ("create", "provider:kubernetes"), ("create", "Namespace"),
        ("create", "CustomResourceDefinition"), ("create", "CustomResourceDefinition")]
    assert not s.failed
    assert parse_digest("garbage") is None and parse_digest('{"steps": []} trailing') == {"steps": []}


def test_helpers():
    urn = "urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::prod-reconciler-deployment"
    assert split_urn(urn) == ("kubernetes:apps/v1:Deployment", "prod-reconciler-deployment")
    assert kind_of("kubernetes:slinky.slurm.net/v1beta1:NodeSet") == "NodeSet"
    assert kind_of("pulumi:providers:kubernetes") == "provider:kubernetes"
    assert clean("<{%fg 1%}>mandatory: <{%reset%}>x\x1b[31my\x1b[0m") == "mandatory: xy"


def test_levels_dedupe_and_bare_engine_failures():
    ev = {"policyEvent": {"resourceUrn": "", "message": "desc\nthe stack has no reconciler", "policyName": "reconciler-deployed",
                          "policyPackName": "gpufleet", "enforcementLevel": "warning"}}
    s = summarize(None, [ev, ev], stack="x", engine_exit=0)
    assert len(s.violations) == 1 and s.violations[0].level == "advisory" and s.violations[0].where == "stack"
    assert s.violations[0].message == "the stack has no reconciler"
    bare = summarize(None, [{"diagnosticEvent": {"message": "preview failed\n", "severity": "error"}}], stack="x")
    assert bare.errors == ["preview failed"] and bare.failed
    assert summarize(None, [], stack="x", engine_exit=1).failed  # a non-zero engine exit is never ok


# --- the command, with the engine replaced by a captured run ---------------------------------------

@pytest.fixture
def fake_engine(monkeypatch):
    calls = {}

    @contextmanager
    def scratch(stack, secret_keys, extra_env=None, stack_yaml=None):
        calls["scratch"] = (stack, sorted(secret_keys), stack_yaml)
        yield object()

    def run(st, policy_config, timeout=3600):
        calls["policy_config"] = policy_config
        proc = subprocess.CompletedProcess(["pulumi"], calls.get("rc", 255), calls.get("stdout", PROD_VIOLATIONS), "")
        return (proc,) + split_output(proc.stdout)

    monkeypatch.setattr(pv, "scratch_stack", scratch)
    monkeypatch.setattr(pv, "run_preview", run)
    return calls


def test_preview_command_exits_1_on_mandatory_and_writes_reports(fake_engine, tmp_path):
    md, js = tmp_path / "out" / "prod.md", tmp_path / "prod.json"
    res = CliRunner().invoke(app, ["preview", "--stack", "prod", "--scratch", "--markdown", str(md), "--json", str(js)])
    assert res.exit_code == 1, res.output
    assert "[mandatory] images-pinned" in res.output
    assert fake_engine["scratch"][0] == "prod" and "mungeKey" in fake_engine["scratch"][1]
    assert fake_engine["policy_config"] == pv.POLICY_CONFIG_DIR / "prod.json"  # the env's config by default
    assert md.read_text().startswith("### ❌") and json.loads(js.read_text())["mandatory_violations"] == 2


def test_preview_command_exits_0_with_advisories_only(fake_engine, tmp_path):
    fake_engine.update(stdout=LOCAL_UPDATE, rc=0)
    res = CliRunner().invoke(app, ["preview", "--stack", "local", "--scratch"])
    assert res.exit_code == 0, res.output
    assert "result: ok" in res.output


def test_preview_command_refuses_bad_input(fake_engine, tmp_path, monkeypatch):
    import yaml

    # a copy of the prod stack file without its secrets (whether or not the real one has them)
    doc = yaml.safe_load((pv.PROJECT_DIR / "Pulumi.prod.yaml").read_text())
    doc["config"] = {k: v for k, v in doc["config"].items() if not (isinstance(v, dict) and "secure" in v)}
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(pv, "PROJECT_DIR", tmp_path)
    res = CliRunner().invoke(app, ["preview", "--stack", "prod", "--policy-config", str(tmp_path / "nope.json")])
    assert res.exit_code == 2
    res = CliRunner().invoke(app, ["preview", "--stack", "prod"])  # secrets not set: the program would refuse
    assert res.exit_code == 2 and "--scratch" in res.output
    res = CliRunner().invoke(app, ["preview", "--stack", "nosuchenv", "--scratch"])
    assert res.exit_code == 2
    assert "scratch" not in fake_engine


def test_render_refuses_to_mix_with_old_manifests(tmp_path):
    (tmp_path / "1-manifest").mkdir()
    res = CliRunner().invoke(app, ["render", "--stack", "local", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--force" in res.output


def test_rendered_secret_values_are_found_in_secrets_and_anywhere_else(tmp_path):
    import base64

    ph = pv.render_placeholders(["mungeKey", "slurmJwtKey", "slackWebhookUrl"])
    assert len(set(ph.values())) == 3 and all(k in v for k, v in ph.items())
    held = base64.b64encode(ph["mungeKey"].encode()).decode()
    (tmp_path / "a.yaml").write_text(f"apiVersion: v1\ndata:\n  slurm.key: {held}\nkind: Secret\nmetadata:\n"
                                     f"  name: slurm-auth-slurm\n  namespace: slurm\n")
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n")
    (tmp_path / "c.yaml").write_text("apiVersion: v1\ndata:\n  sssd.conf: W3Nzc2Rd\nkind: Secret\nmetadata:\n  name: t\n")
    (tmp_path / "d.yaml").write_text(f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: n\n  namespace: x\n"
                                     f"stringData:\n  URL: {ph['slackWebhookUrl']}\n")
    found = pv.find_secret_values(pv.rendered_files(tmp_path), ph)
    assert [(f.name, name, keys) for f, name, keys in found.secrets] == [
        ("a.yaml", "slurm/slurm-auth-slurm", {"slurm.key": "mungeKey"}), ("d.yaml", "x/n", {"URL": "slackWebhookUrl"})]
    assert found.leaks == []  # c holds real content, b nothing
    # a value in a manifest that is no Secret (plain, or base64 inside a longer value) is a leak
    inner = base64.b64encode(("token: " + ph["slurmJwtKey"] + "\n").encode()).decode()
    (tmp_path / "e.yaml").write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: e\nbinaryData:\n  f: {inner}\n")
    (tmp_path / "f.yaml").write_text(f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: f\n"
                                     f"spec: {{env: {ph['mungeKey']}}}\n")
    found = pv.find_secret_values(pv.rendered_files(tmp_path), ph)
    assert [(f.name, keys) for f, keys in found.leaks] == [("e.yaml", ["slurmJwtKey"]), ("f.yaml", ["mungeKey"])]
    text = pv.secrets_required_text("prod", found)
    assert "Secret `slurm/slurm-auth-slurm`: `slurm.key` (stack secret `mungeKey`)" in text


def test_render_leaves_secrets_out_names_them_and_refuses_a_leak(monkeypatch, tmp_path):
    """The command end to end with the engine replaced: what it would write, then what the command leaves."""
    import base64

    state = {}

    @contextmanager
    def scratch(stack, secret_keys, extra_env=None, stack_yaml=None, secret_values=None):
        state["values"] = secret_values
        yield FakeStack(Path(extra_env["GPUFLEET_RENDER_DIR"]), secret_values, state)

    monkeypatch.setattr(pv, "scratch_stack", scratch)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["render", "--stack", "prod", "--out", str(out), "--without-operator-chart"])
    assert res.exit_code == 0, res.output
    assert not (out / "1-manifest" / "v1-secret-slurm-slurm-auth-slurm.yaml").exists()  # left out
    assert (out / "1-manifest" / "v1-configmap-x.yaml").exists()
    required = (out / "SECRETS-REQUIRED.md").read_text()
    assert "Secret `slurm/slurm-auth-slurm`: `slurm.key` (stack secret `mungeKey`)" in required
    assert "left out of the render" in res.output
    every = "".join(f.read_text() for f in out.rglob("*") if f.is_file())
    for v in state["values"].values():
        assert v not in every and base64.b64encode(v.encode()).decode() not in every

    state["leak"] = True
    res = CliRunner().invoke(app, ["render", "--stack", "prod", "--out", str(out), "--force",
                                   "--without-operator-chart"])
    assert res.exit_code == 1 and "refusing the render" in res.output and "v1-configmap-x.yaml" in res.output
    assert not (out / "1-manifest" / "v1-configmap-x.yaml").exists()


class FakeStack:
    """Writes what the Kubernetes provider would: a Secret holding the munge key, a ConfigMap (holding the JWT
    key when the test wants a leak)."""

    def __init__(self, out: Path, values: dict[str, str], state: dict):
        self.out, self.values, self.state = out, values, state

    def run(self, *args, **kw):
        import base64

        d = self.out / "1-manifest"
        d.mkdir(parents=True, exist_ok=True)
        key = base64.b64encode(self.values["mungeKey"].encode()).decode()
        (d / "v1-secret-slurm-slurm-auth-slurm.yaml").write_text(
            f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: slurm-auth-slurm\n  namespace: slurm\n"
            f"data:\n  slurm.key: {key}\n")
        cm = f"  jwt: {self.values['slurmJwtKey']}\n" if self.state.get("leak") else "  a: b\n"
        (d / "v1-configmap-x.yaml").write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n{cm}")
        return subprocess.CompletedProcess(["pulumi"], 0, "", "")


# --- captured output (see the module docstring) ------------------------------------------------------

PROD_VIOLATIONS = r'''{"sequence":0,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":1,"policyLoadEvent":{}}
{"sequence":2,"preludeEvent":{"config":{"gpufleet:fleet":"{\"cluster\":{\"context\":\"gpu-prod\",\"kin...","gpufleet:mungeKey":"[secret]","gpufleet:slackWebhookUrl":"[secret]","gpufleet:slurmJwtKey":"[secret]"}}}
{"sequence":123,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::pulumi:pulumi:Stack::gpufleet-prod","type":"pulumi:pulumi:Stack","new":{"type":"pulumi:pulumi:Stack"}},"planning":true}}
{"sequence":129,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet::prod","type":"gpufleet:index:GpuFleet","new":{"type":"gpufleet:index:GpuFleet"}},"planning":true}}
{"sequence":135,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess::prod-cluster","type":"gpufleet:cluster:ClusterAccess","new":{"type":"gpufleet:cluster:ClusterAccess"}},"planning":true}}
{"sequence":141,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":145,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::prod-cluster-k8s","type":"pulumi:providers:kubernetes","new":{"type":"pulumi:providers:kubernetes","custom":true}},"planning":true}}
{"sequence":158,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler::prod-reconciler","type":"gpufleet:reconciler:Reconciler","new":{"type":"gpufleet:reconciler:Reconciler"}},"planning":true}}
{"sequence":163,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-h100-b","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":168,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-h100-a","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":175,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-a100","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":179,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm::prod-slurm","type":"gpufleet:slurm:SlinkySlurm","new":{"type":"gpufleet:slurm:SlinkySlurm"}},"planning":true}}
{"sequence":183,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-l40s","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":189,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::prod-storage-datasets","type":"gpufleet:storage:SharedStorage","new":{"type":"gpufleet:storage:SharedStorage"}},"planning":true}}
{"sequence":193,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::prod-storage-checkpoints","type":"gpufleet:storage:SharedStorage","new":{"type":"gpufleet:storage:SharedStorage"}},"planning":true}}
{"sequence":218,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Namespace::prod-reconciler-ns","type":"kubernetes:core/v1:Namespace","new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":226,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::prod-reconciler-agent-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":232,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-reconciler-remediation-crd","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":237,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::prod-reconciler-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":243,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Namespace::prod-slurm-ns","type":"kubernetes:core/v1:Namespace","new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":247,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-controller","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":251,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-nodeset","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":257,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-token","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":261,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-restapi","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":265,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-loginset","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":273,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-slurm-crd-accounting","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":288,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::prod-reconciler-sa","type":"kubernetes:core/v1:ServiceAccount","new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":294,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Secret::prod-reconciler-notifications","type":"kubernetes:core/v1:Secret","new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":299,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:Role::prod-reconciler-role","type":"kubernetes:rbac.authorization.k8s.io/v1:Role","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:Role","custom":true}},"planning":true}}
{"sequence":304,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ConfigMap::prod-reconciler-policy","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":310,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:policy/v1:PodDisruptionBudget::prod-reconciler-pdb","type":"kubernetes:policy/v1:PodDisruptionBudget","new":{"type":"kubernetes:policy/v1:PodDisruptionBudget","custom":true}},"planning":true}}
{"sequence":315,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Service::prod-reconciler-metrics","type":"kubernetes:core/v1:Service","new":{"type":"kubernetes:core/v1:Service","custom":true}},"planning":true}}
{"sequence":321,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-h100-a-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":326,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::prod-reconciler-agent-sa","type":"kubernetes:core/v1:ServiceAccount","new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":331,"policyEvent":{"resourceUrn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-l40s-capacity","message":"Every GPU pool keeps spare nodes: at least the minimum, and the configured share of its size.\nConfigMap gpufleet-system/gpufleet-pool-l40s (kubernetes:core/v1:ConfigMap): GPU pool 'l40s' keeps 0 spare node(s), needs 2 (at least 1 and 0.05 of its 32 nodes). A failed node then waits for a new one instead of being swapped at once. Fix: set `spares: 2` (or more) for pool l40s in gpufleet:fleet.pools of the stack file.\n","color":"never","policyName":"gpu-pool-spares","policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","enforcementLevel":"mandatory"}}
{"sequence":333,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-l40s-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":339,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-h100-b-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":343,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-a100-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":347,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::prod-slurm-slurm-key","type":"kubernetes:core/v1:Secret","new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":351,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::prod-slurm-jwt-key","type":"kubernetes:core/v1:Secret","new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":357,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage$kubernetes:core/v1:PersistentVolumeClaim::prod-storage-checkpoints-pvc","type":"kubernetes:core/v1:PersistentVolumeClaim","new":{"type":"kubernetes:core/v1:PersistentVolumeClaim","custom":true}},"planning":true}}
{"sequence":361,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage$kubernetes:core/v1:PersistentVolumeClaim::prod-storage-datasets-pvc","type":"kubernetes:core/v1:PersistentVolumeClaim","new":{"type":"kubernetes:core/v1:PersistentVolumeClaim","custom":true}},"planning":true}}
{"sequence":371,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage$kubernetes:core/v1:PersistentVolume::prod-storage-datasets-pv","type":"kubernetes:core/v1:PersistentVolume","new":{"type":"kubernetes:core/v1:PersistentVolume","custom":true}},"planning":true}}
{"sequence":386,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::prod-reconciler-clusterrolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true}},"planning":true}}
{"sequence":395,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::prod-reconciler-rolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:RoleBinding","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:RoleBinding","custom":true}},"planning":true}}
{"sequence":402,"policyEvent":{"resourceUrn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::prod-reconciler-deployment","message":"Container images are pinned: never :latest or untagged, and by digest where required.\nDeployment gpufleet-system/gpufleet-reconciler (kubernetes:apps/v1:Deployment): container reconciler image 'ghcr.io/gpufleet/reconciler:latest' uses the :latest tag, which changes under you. Fix: set spec.template.spec.containers[0].image to ghcr.io/gpufleet/reconciler@sha256:<digest> (e.g. from `crane digest ghcr.io/gpufleet/reconciler:latest`); for gpufleet's own images that is healing.reconciler.image/agent_image in the stack file.\n","color":"never","policyName":"images-pinned","policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","enforcementLevel":"mandatory"}}
{"sequence":404,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::prod-reconciler-deployment","type":"kubernetes:apps/v1:Deployment","new":{"type":"kubernetes:apps/v1:Deployment","custom":true}},"planning":true}}
{"sequence":408,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:Controller::prod-slurm-controller-slurm","type":"kubernetes:slinky.slurm.net/v1beta1:Controller","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:Controller","custom":true}},"planning":true}}
{"sequence":413,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:DaemonSet::prod-reconciler-agent","type":"kubernetes:apps/v1:DaemonSet","new":{"type":"kubernetes:apps/v1:DaemonSet","custom":true}},"planning":true}}
{"sequence":417,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::prod-reconciler-agent-clusterrolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true}},"planning":true}}
{"sequence":434,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::prod-slurm-nodeset-h100-a","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":439,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:LoginSet::prod-slurm-loginset-login","type":"kubernetes:slinky.slurm.net/v1beta1:LoginSet","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:LoginSet","custom":true}},"planning":true}}
{"sequence":445,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::prod-slurm-nodeset-l40s","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":448,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:RestApi::prod-slurm-restapi-restapi","type":"kubernetes:slinky.slurm.net/v1beta1:RestApi","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:RestApi","custom":true}},"planning":true}}
{"sequence":454,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::prod-slurm-nodeset-h100-b","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":458,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:Accounting::prod-slurm-accounting-accounting","type":"kubernetes:slinky.slurm.net/v1beta1:Accounting","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:Accounting","custom":true}},"planning":true}}
{"sequence":463,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::prod-slurm-nodeset-a100","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":471,"policyAnalyzeStackSummaryEvent":{"policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","passed":["reconciler-deployed"]}}
{"sequence":472,"diagnosticEvent":{"prefix":"error: ","message":"preview failed\n","color":"never","severity":"error"}}
{"sequence":473,"summaryEvent":{"maybeCorrupt":false,"durationSeconds":3,"resourceChanges":{"create":52},"PolicyPacks":{"gpufleet|local|/work/main/policies":"0.1.0"},"isPreview":true,"result":"failed"}}
{"sequence":475,"cancelEvent":{}}
'''

LOCAL_UPDATE = r'''{"sequence":0,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":1,"policyLoadEvent":{}}
{"sequence":2,"preludeEvent":{"config":{"gpufleet:fleet":"{\"cluster\":{\"kind\":\"local\"},\"environm...","gpufleet:mungeKey":"[secret]","gpufleet:slurmJwtKey":"[secret]"}}}
{"sequence":93,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::pulumi:pulumi:Stack::gpufleet-local","type":"pulumi:pulumi:Stack","old":{"type":"pulumi:pulumi:Stack"},"new":{"type":"pulumi:pulumi:Stack"}},"planning":true}}
{"sequence":99,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet::local","type":"gpufleet:index:GpuFleet","old":{"type":"gpufleet:index:GpuFleet"},"new":{"type":"gpufleet:index:GpuFleet"}},"planning":true}}
{"sequence":105,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess::local-cluster","type":"gpufleet:cluster:ClusterAccess","old":{"type":"gpufleet:cluster:ClusterAccess"},"new":{"type":"gpufleet:cluster:ClusterAccess"}},"planning":true}}
{"sequence":112,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":115,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s","type":"pulumi:providers:kubernetes","old":{"type":"pulumi:providers:kubernetes","custom":true},"new":{"type":"pulumi:providers:kubernetes","custom":true}},"planning":true}}
{"sequence":124,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler::local-reconciler","type":"gpufleet:reconciler:Reconciler","old":{"type":"gpufleet:reconciler:Reconciler"},"new":{"type":"gpufleet:reconciler:Reconciler"}},"planning":true}}
{"sequence":129,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-h100","type":"gpufleet:pool:GpuNodePool","old":{"type":"gpufleet:pool:GpuNodePool"},"new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":135,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm::local-slurm","type":"gpufleet:slurm:SlinkySlurm","old":{"type":"gpufleet:slurm:SlinkySlurm"},"new":{"type":"gpufleet:slurm:SlinkySlurm"}},"planning":true}}
{"sequence":140,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-l40s","type":"gpufleet:pool:GpuNodePool","old":{"type":"gpufleet:pool:GpuNodePool"},"new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":161,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Namespace::local-reconciler-ns","type":"kubernetes:core/v1:Namespace","old":{"type":"kubernetes:core/v1:Namespace","custom":true},"new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":168,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-reconciler-remediation-crd","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":174,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::local-reconciler-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":179,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::local-reconciler-agent-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":183,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Namespace::local-slurm-ns","type":"kubernetes:core/v1:Namespace","old":{"type":"kubernetes:core/v1:Namespace","custom":true},"new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":189,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-controller","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":193,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-loginset","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":197,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-nodeset","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":204,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-restapi","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":208,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-token","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":213,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-accounting","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","old":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true},"new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":227,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::local-reconciler-sa","type":"kubernetes:core/v1:ServiceAccount","old":{"type":"kubernetes:core/v1:ServiceAccount","custom":true},"new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":230,"diagnosticEvent":{"urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Secret::local-reconciler-notifications","prefix":"warning: ","message":"rendered YAML will contain a secret value in plaintext\n","color":"never","severity":"warning"}}
{"sequence":235,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Secret::local-reconciler-notifications","type":"kubernetes:core/v1:Secret","old":{"type":"kubernetes:core/v1:Secret","custom":true},"new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":242,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:Role::local-reconciler-role","type":"kubernetes:rbac.authorization.k8s.io/v1:Role","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:Role","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:Role","custom":true}},"planning":true}}
{"sequence":248,"resourcePreEvent":{"metadata":{"op":"delete-replaced","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::local-reconciler-deployment","type":"kubernetes:apps/v1:Deployment","old":{"type":"kubernetes:apps/v1:Deployment","custom":true}},"planning":true}}
{"sequence":254,"resourcePreEvent":{"metadata":{"op":"delete-replaced","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ConfigMap::local-reconciler-policy","type":"kubernetes:core/v1:ConfigMap","old":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":255,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:policy/v1:PodDisruptionBudget::local-reconciler-pdb","type":"kubernetes:policy/v1:PodDisruptionBudget","old":{"type":"kubernetes:policy/v1:PodDisruptionBudget","custom":true},"new":{"type":"kubernetes:policy/v1:PodDisruptionBudget","custom":true}},"planning":true}}
{"sequence":260,"resourcePreEvent":{"metadata":{"op":"replace","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ConfigMap::local-reconciler-policy","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"fleet.json\"]"],"detailedDiff":{"data[\"fleet.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":262,"resourcePreEvent":{"metadata":{"op":"create-replacement","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ConfigMap::local-reconciler-policy","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"fleet.json\"]"],"detailedDiff":{"data[\"fleet.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":266,"policyEvent":{"resourceUrn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-l40s-capacity","message":"Every GPU pool keeps spare nodes: at least the minimum, and the configured share of its size.\nConfigMap gpufleet-system/gpufleet-pool-l40s (kubernetes:core/v1:ConfigMap): GPU pool 'l40s' keeps 0 spare node(s), needs 1 (at least 1). A failed node then waits for a new one instead of being swapped at once. Fix: set `spares: 1` (or more) for pool l40s in gpufleet:fleet.pools of the stack file.\n","color":"never","policyName":"gpu-pool-spares","policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","enforcementLevel":"advisory"}}
{"sequence":269,"resourcePreEvent":{"metadata":{"op":"delete-replaced","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-l40s-capacity","type":"kubernetes:core/v1:ConfigMap","old":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":274,"resourcePreEvent":{"metadata":{"op":"replace","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-l40s-capacity","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"capacity.json\"]"],"detailedDiff":{"data[\"capacity.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":276,"resourcePreEvent":{"metadata":{"op":"create-replacement","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-l40s-capacity","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"capacity.json\"]"],"detailedDiff":{"data[\"capacity.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":277,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Service::local-reconciler-metrics","type":"kubernetes:core/v1:Service","old":{"type":"kubernetes:core/v1:Service","custom":true},"new":{"type":"kubernetes:core/v1:Service","custom":true}},"planning":true}}
{"sequence":284,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::local-reconciler-agent-sa","type":"kubernetes:core/v1:ServiceAccount","old":{"type":"kubernetes:core/v1:ServiceAccount","custom":true},"new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":288,"diagnosticEvent":{"urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::local-slurm-jwt-key","prefix":"warning: ","message":"rendered YAML will contain a secret value in plaintext\n","color":"never","severity":"warning"}}
{"sequence":289,"resourcePreEvent":{"metadata":{"op":"delete-replaced","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-h100-capacity","type":"kubernetes:core/v1:ConfigMap","old":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":295,"resourcePreEvent":{"metadata":{"op":"replace","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-h100-capacity","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"capacity.json\"]"],"detailedDiff":{"data[\"capacity.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":297,"resourcePreEvent":{"metadata":{"op":"create-replacement","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::local-pool-h100-capacity","type":"kubernetes:core/v1:ConfigMap","keys":["data[\"capacity.json\"]"],"detailedDiff":{"data[\"capacity.json\"]":{"diffKind":"update-replace","inputDiff":false}},"old":{"type":"kubernetes:core/v1:ConfigMap","custom":true},"new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":298,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::local-slurm-jwt-key","type":"kubernetes:core/v1:Secret","old":{"type":"kubernetes:core/v1:Secret","custom":true},"new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":301,"diagnosticEvent":{"urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::local-slurm-slurm-key","prefix":"warning: ","message":"rendered YAML will contain a secret value in plaintext\n","color":"never","severity":"warning"}}
{"sequence":305,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Secret::local-slurm-slurm-key","type":"kubernetes:core/v1:Secret","old":{"type":"kubernetes:core/v1:Secret","custom":true},"new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":314,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::local-reconciler-clusterrolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true}},"planning":true}}
{"sequence":319,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::local-reconciler-rolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:RoleBinding","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:RoleBinding","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:RoleBinding","custom":true}},"planning":true}}
{"sequence":322,"policyEvent":{"resourceUrn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::local-reconciler-deployment","message":"Container images are pinned: never :latest or untagged, and by digest where required.\nDeployment gpufleet-system/gpufleet-reconciler (kubernetes:apps/v1:Deployment): container reconciler image 'ghcr.io/gpufleet/reconciler:latest' uses the :latest tag, which changes under you. Fix: set spec.template.spec.containers[0].image to ghcr.io/gpufleet/reconciler:<version> or @sha256:<digest>; for gpufleet's own images that is healing.reconciler.image/agent_image in the stack file.\n","color":"never","policyName":"images-pinned","policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","enforcementLevel":"advisory"}}
{"sequence":324,"resourcePreEvent":{"metadata":{"op":"replace","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::local-reconciler-deployment","type":"kubernetes:apps/v1:Deployment","old":{"type":"kubernetes:apps/v1:Deployment","custom":true},"new":{"type":"kubernetes:apps/v1:Deployment","custom":true}},"planning":true}}
{"sequence":326,"resourcePreEvent":{"metadata":{"op":"create-replacement","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:Deployment::local-reconciler-deployment","type":"kubernetes:apps/v1:Deployment","keys":["spec.selector"],"old":{"type":"kubernetes:apps/v1:Deployment","custom":true},"new":{"type":"kubernetes:apps/v1:Deployment","custom":true}},"planning":true}}
{"sequence":331,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:Controller::local-slurm-controller-slurm","type":"kubernetes:slinky.slurm.net/v1beta1:Controller","old":{"type":"kubernetes:slinky.slurm.net/v1beta1:Controller","custom":true},"new":{"type":"kubernetes:slinky.slurm.net/v1beta1:Controller","custom":true}},"planning":true}}
{"sequence":336,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::local-reconciler-agent-clusterrolebinding","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","old":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true},"new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding","custom":true}},"planning":true}}
{"sequence":340,"resourcePreEvent":{"metadata":{"op":"same","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apps/v1:DaemonSet::local-reconciler-agent","type":"kubernetes:apps/v1:DaemonSet","old":{"type":"kubernetes:apps/v1:DaemonSet","custom":true},"new":{"type":"kubernetes:apps/v1:DaemonSet","custom":true}},"planning":true}}
{"sequence":353,"resourcePreEvent":{"metadata":{"op":"update","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::local-slurm-nodeset-h100","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","detailedDiff":{"spec.replicas":{"diffKind":"update","inputDiff":false},"spec.slurmd.volumeMounts[0]":{"diffKind":"delete","inputDiff":true},"spec.template.spec.volumes[0]":{"diffKind":"delete","inputDiff":true}},"old":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true},"new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":357,"resourcePreEvent":{"metadata":{"op":"update","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:LoginSet::local-slurm-loginset-login","type":"kubernetes:slinky.slurm.net/v1beta1:LoginSet","detailedDiff":{"spec.login.volumeMounts[0]":{"diffKind":"delete","inputDiff":true},"spec.template.spec.volumes[0]":{"diffKind":"delete","inputDiff":true}},"old":{"type":"kubernetes:slinky.slurm.net/v1beta1:LoginSet","custom":true},"new":{"type":"kubernetes:slinky.slurm.net/v1beta1:LoginSet","custom":true}},"planning":true}}
{"sequence":363,"resourcePreEvent":{"metadata":{"op":"update","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:NodeSet::local-slurm-nodeset-l40s","type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","detailedDiff":{"spec.slurmd.volumeMounts[0]":{"diffKind":"delete","inputDiff":true},"spec.template.spec.volumes[0]":{"diffKind":"delete","inputDiff":true}},"old":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true},"new":{"type":"kubernetes:slinky.slurm.net/v1beta1:NodeSet","custom":true}},"planning":true}}
{"sequence":369,"resourcePreEvent":{"metadata":{"op":"delete","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage$kubernetes:core/v1:PersistentVolumeClaim::local-storage-checkpoints-pvc","type":"kubernetes:core/v1:PersistentVolumeClaim","old":{"type":"kubernetes:core/v1:PersistentVolumeClaim","custom":true}},"planning":true}}
{"sequence":370,"resourcePreEvent":{"metadata":{"op":"delete","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage$kubernetes:core/v1:PersistentVolume::local-storage-checkpoints-pv","type":"kubernetes:core/v1:PersistentVolume","old":{"type":"kubernetes:core/v1:PersistentVolume","custom":true}},"planning":true}}
{"sequence":373,"resourcePreEvent":{"metadata":{"op":"delete","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:slinky.slurm.net/v1beta1:RestApi::local-slurm-restapi-restapi","type":"kubernetes:slinky.slurm.net/v1beta1:RestApi","old":{"type":"kubernetes:slinky.slurm.net/v1beta1:RestApi","custom":true}},"planning":true}}
{"sequence":374,"resourcePreEvent":{"metadata":{"op":"delete","urn":"urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::local-storage-checkpoints","type":"gpufleet:storage:SharedStorage","old":{"type":"gpufleet:storage:SharedStorage"}},"planning":true}}
{"sequence":378,"policyAnalyzeStackSummaryEvent":{"policyPackName":"gpufleet","policyPackVersion":"0.1.0","policyPackVersionTag":"0.1.0","passed":["reconciler-deployed"]}}
{"sequence":380,"summaryEvent":{"maybeCorrupt":false,"durationSeconds":4,"resourceChanges":{"delete":4,"replace":4,"same":32,"update":3},"PolicyPacks":{"gpufleet|local|/work/main/policies":"0.1.0"},"isPreview":true,"result":"succeeded"}}
{"sequence":381,"cancelEvent":{}}
'''

PROD_CHART_ERROR = r'''{"sequence":0,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":1,"policyLoadEvent":{}}
{"sequence":2,"preludeEvent":{"config":{"gpufleet:fleet":"{\"cluster\":{\"context\":\"gpu-prod\",\"kin...","gpufleet:mungeKey":"[secret]","gpufleet:slackWebhookUrl":"[secret]","gpufleet:slurmJwtKey":"[secret]"}}}
{"sequence":115,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::pulumi:pulumi:Stack::gpufleet-prod","type":"pulumi:pulumi:Stack","new":{"type":"pulumi:pulumi:Stack"}},"planning":true}}
{"sequence":121,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet::prod","type":"gpufleet:index:GpuFleet","new":{"type":"gpufleet:index:GpuFleet"}},"planning":true}}
{"sequence":127,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess::prod-cluster","type":"gpufleet:cluster:ClusterAccess","new":{"type":"gpufleet:cluster:ClusterAccess"}},"planning":true}}
{"sequence":134,"diagnosticEvent":{"prefix":"warning: ","message":"using pulumi-resource-kubernetes from $PATH at /work/main/.tools/bin/pulumi-resource-kubernetes\n","color":"never","severity":"warning"}}
{"sequence":137,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::prod-cluster-k8s","type":"pulumi:providers:kubernetes","new":{"type":"pulumi:providers:kubernetes","custom":true}},"planning":true}}
{"sequence":150,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler::prod-reconciler","type":"gpufleet:reconciler:Reconciler","new":{"type":"gpufleet:reconciler:Reconciler"}},"planning":true}}
{"sequence":155,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-h100-a","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":159,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-a100","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":165,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-h100-b","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":170,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::prod-pool-l40s","type":"gpufleet:pool:GpuNodePool","new":{"type":"gpufleet:pool:GpuNodePool"}},"planning":true}}
{"sequence":175,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm::prod-slurm","type":"gpufleet:slurm:SlinkySlurm","new":{"type":"gpufleet:slurm:SlinkySlurm"}},"planning":true}}
{"sequence":179,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::prod-storage-checkpoints","type":"gpufleet:storage:SharedStorage","new":{"type":"gpufleet:storage:SharedStorage"}},"planning":true}}
{"sequence":184,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::prod-storage-datasets","type":"gpufleet:storage:SharedStorage","new":{"type":"gpufleet:storage:SharedStorage"}},"planning":true}}
{"sequence":207,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Namespace::prod-reconciler-ns","type":"kubernetes:core/v1:Namespace","new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":212,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::prod-reconciler-remediation-crd","type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","new":{"type":"kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition","custom":true}},"planning":true}}
{"sequence":219,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::prod-reconciler-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":225,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::prod-reconciler-agent-clusterrole","type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole","custom":true}},"planning":true}}
{"sequence":231,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:core/v1:Namespace::prod-slurm-ns","type":"kubernetes:core/v1:Namespace","new":{"type":"kubernetes:core/v1:Namespace","custom":true}},"planning":true}}
{"sequence":246,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::prod-reconciler-sa","type":"kubernetes:core/v1:ServiceAccount","new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":250,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ConfigMap::prod-reconciler-policy","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":258,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:rbac.authorization.k8s.io/v1:Role::prod-reconciler-role","type":"kubernetes:rbac.authorization.k8s.io/v1:Role","new":{"type":"kubernetes:rbac.authorization.k8s.io/v1:Role","custom":true}},"planning":true}}
{"sequence":263,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:policy/v1:PodDisruptionBudget::prod-reconciler-pdb","type":"kubernetes:policy/v1:PodDisruptionBudget","new":{"type":"kubernetes:policy/v1:PodDisruptionBudget","custom":true}},"planning":true}}
{"sequence":270,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Service::prod-reconciler-metrics","type":"kubernetes:core/v1:Service","new":{"type":"kubernetes:core/v1:Service","custom":true}},"planning":true}}
{"sequence":275,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Secret::prod-reconciler-notifications","type":"kubernetes:core/v1:Secret","new":{"type":"kubernetes:core/v1:Secret","custom":true}},"planning":true}}
{"sequence":279,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-h100-a-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":284,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:ServiceAccount::prod-reconciler-agent-sa","type":"kubernetes:core/v1:ServiceAccount","new":{"type":"kubernetes:core/v1:ServiceAccount","custom":true}},"planning":true}}
{"sequence":289,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-h100-b-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":294,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-a100-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":298,"resourcePreEvent":{"metadata":{"op":"create","urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool$kubernetes:core/v1:ConfigMap::prod-pool-l40s-capacity","type":"kubernetes:core/v1:ConfigMap","new":{"type":"kubernetes:core/v1:ConfigMap","custom":true}},"planning":true}}
{"sequence":310,"diagnosticEvent":{"urn":"urn:pulumi:prod::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:helm.sh/v3:Release::prod-slurm-operator-crds","prefix":"error: ","message":"kubernetes:helm.sh/v3:Release resource 'prod-slurm-operator-crds': property chart value {oci://ghcr.io/slinkyproject/charts/slurm-operator-crds} has a problem: failed to perform \"FetchReference\" on source: Get \"https://ghcr.io/v2/slinkyproject/charts/slurm-operator-crds/manifests/1.0.1\": dial tcp: lookup ghcr.io on 10.255.255.53:53: no such host; check the chart name and repository configuration.\n","color":"never","severity":"error"}}
{"sequence":315,"summaryEvent":{"maybeCorrupt":false,"durationSeconds":3,"resourceChanges":{"create":28},"PolicyPacks":{"gpufleet|local|/work/main/policies":"0.1.0"},"isPreview":true,"result":"failed"}}
{"sequence":317,"cancelEvent":{}}
'''

LOCAL_DIGEST = r'''{
 "config": {
  "gpufleet:fleet": "{\"cluster\":{\"kind\":\"local\"},\"e",
  "gpufleet:mungeKey": "[secret]",
  "gpufleet:slurmJwtKey": "[secret]"
 },
 "steps": [
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::pulumi:pulumi:Stack::gpufleet-local",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::pulumi:pulumi:Stack::gpufleet-local",
    "custom": false,
    "type": "pulumi:pulumi:Stack"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet::local",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet::local",
    "custom": false,
    "type": "gpufleet:index:GpuFleet"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess::local-cluster",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess::local-cluster",
    "custom": false,
    "type": "gpufleet:cluster:ClusterAccess"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s",
    "custom": true,
    "type": "pulumi:providers:kubernetes"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler::local-reconciler",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler::local-reconciler",
    "custom": false,
    "type": "gpufleet:reconciler:Reconciler"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-h100",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-h100",
    "custom": false,
    "type": "gpufleet:pool:GpuNodePool"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-l40s",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:pool:GpuNodePool::local-pool-l40s",
    "custom": false,
    "type": "gpufleet:pool:GpuNodePool"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::local-storage-checkpoints",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:storage:SharedStorage::local-storage-checkpoints",
    "custom": false,
    "type": "gpufleet:storage:SharedStorage"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm::local-slurm",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm::local-slurm",
    "custom": false,
    "type": "gpufleet:slurm:SlinkySlurm"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Namespace::local-reconciler-ns",
   "provider": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s::04da6b54-80e4-46f7-96ec-b56ff0331ba9",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:core/v1:Namespace::local-reconciler-ns",
    "custom": true,
    "type": "kubernetes:core/v1:Namespace"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-controller",
   "provider": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s::04da6b54-80e4-46f7-96ec-b56ff0331ba9",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:slurm:SlinkySlurm$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-slurm-crd-controller",
    "custom": true,
    "type": "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
   },
   "detailedDiff": null
  },
  {
   "op": "create",
   "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-reconciler-remediation-crd",
   "provider": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:cluster:ClusterAccess$pulumi:providers:kubernetes::local-cluster-k8s::04da6b54-80e4-46f7-96ec-b56ff0331ba9",
   "newState": {
    "urn": "urn:pulumi:local::gpufleet::gpufleet:index:GpuFleet$gpufleet:reconciler:Reconciler$kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition::local-reconciler-remediation-crd",
    "custom": true,
    "type": "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
   },
   "detailedDiff": null
  }
 ],
 "diagnostics": [],
 "duration": 5052020360,
 "changeSummary": {
  "create": 43
 }
}
'''


@pytest.mark.parametrize("log", [PROD_VIOLATIONS, LOCAL_UPDATE, PROD_CHART_ERROR])
def test_automation_api_events_give_the_same_summary(log):
    """The Automation API hands typed events; turned back into the event log's JSON, they give the
    same summary as the engine's own event log."""
    from pulumi.automation.events import EngineEvent

    raw = [e for e in parse_events(log) if "sequence" in e]
    typed = [pv.event_dict(EngineEvent.from_json(e)) for e in raw]
    want, got = summarize(None, raw, stack="prod"), summarize(None, typed, stack="prod")
    assert got.to_dict() == want.to_dict()
    assert want.changes or want.violations or want.errors
