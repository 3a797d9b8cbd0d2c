"""The fleet spec: every example is valid, every bad input fails naming the field."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.fleetspec import CONFIG_KEY, SpecError, load_stack_file, parse_fleet

ROOT = Path(__file__).resolve().parents[2]


def base() -> dict:
    doc = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    return copy.deepcopy(doc["config"][CONFIG_KEY])


@pytest.mark.parametrize("env", ["local", "staging", "prod"])
def test_examples_are_valid(env):
    sf = load_stack_file(ROOT / f"Pulumi.{env}.yaml")
    assert sf.fleet.environment == env
    assert all(p.spares >= 1 for p in sf.fleet.pools)


def test_prod_is_a_realistic_fleet():
    f = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    assert len(f.pools) >= 3 and sum(p.nodes for p in f.pools) >= 300
    assert f.healing.grace_period_seconds == 120


def mutate(fn):
    d = base()
    fn(d)
    return d


def lend(i: int, **fields):
    """A mutation: pool i lends its spares to inference pods, with `fields` changed (None removes one)."""
    def fn(d):
        spec = {"spares": True, "spare_floor": 1, "borrowers": {"selector": {"app.kubernetes.io/name": "inference"}}}
        for k, v in fields.items():
            spec.pop(k) if v is None else spec.__setitem__(k, v)
        d["pools"][i]["lending"] = spec
    return fn


def borrowers(**fields):
    return {"selector": {"app.kubernetes.io/name": "inference"}, **fields}


CASES = [
    ("unknown key", lambda d: d["pools"][0].__setitem__("spraes", 2), "pools[0].spraes", "unknown key"),
    ("unknown top key", lambda d: d.__setitem__("heal", {}), f"{CONFIG_KEY}.heal", "unknown key"),
    ("duplicate pool", lambda d: d["pools"][1].__setitem__("name", "h100-a"), "pools[1].name", "duplicate"),
    ("partition names missing pool", lambda d: d["slurm"]["partitions"][1].__setitem__("pools", ["h200"]),
     "slurm.partitions[1].pools", "h200"),
    ("negative spares", lambda d: d["pools"][2].__setitem__("spares", -1), "pools[2].spares", "greater than or equal to 0"),
    ("negative nodes", lambda d: d["pools"][0].__setitem__("nodes", -5), "pools[0].nodes", "greater than or equal to 0"),
    ("bad k8s name", lambda d: d["pools"][0].__setitem__("name", "H100_A"), "pools[0].name", "not a valid Kubernetes name"),
    ("grace too long", lambda d: d["healing"].__setitem__("grace_period_seconds", 7200), "healing.grace_period_seconds", "3600"),
    ("grace negative", lambda d: d["healing"].__setitem__("grace_period_seconds", -1), "healing.grace_period_seconds", "0"),
    ("admission hold too long", lambda d: d["healing"].__setitem__("admission_hold_seconds", 3600),
     "healing.admission_hold_seconds", "600"),
    ("root's jobs outside local", lambda d: d["slurm"].__setitem__("disable_root_jobs", False),
     "slurm.disable_root_jobs", "only on the local cluster"),
    # issue 24: the reconciler's Slurm identity
    ("reconciler as the SlurmUser outside local", lambda d: d["slurm"].__setitem__("reconciler_user", "slurm"),
     "slurm.reconciler_user", "super user to slurmctld"),
    ("reconciler as root outside local", lambda d: d["slurm"].__setitem__("reconciler_user", "root"),
     "slurm.reconciler_user", "dedicated Slurm user"),
    ("reconciler user without accounting", lambda d: d["slurm"].__setitem__("accounting", {"enabled": False}),
     "slurm.accounting.enabled", "AdminLevel (Administrator) from accounting"),
    ("reconciler user not a user name", lambda d: d["slurm"].__setitem__("reconciler_user", "gp fleet"),
     "slurm.reconciler_user", "pattern"),
    ("critical_xids is gone", lambda d: d["healing"].__setitem__("critical_xids", [79]), "healing.critical_xids",
     "faults.actions"),
    ("xid not a number", lambda d: d["healing"].__setitem__("faults", {"actions": {"xid": {"seventy": "reboot"}}}),
     "healing.faults.actions.xid.seventy.[key]", "integer"),
    ("xid out of range", lambda d: d["healing"].__setitem__("faults", {"actions": {"xid": {0: "reboot"}}}),
     "healing.faults.actions.xid[0]", "not a code"),
    ("unknown action", lambda d: d["healing"].__setitem__("faults", {"actions": {"sxid": {24007: "fix-it"}}}),
     "healing.faults.actions.sxid[24007]", "'reset-gpu'"),
    ("repeats of one", lambda d: d["healing"].__setitem__("faults", {"repeats": {"count": 1}}),
     "healing.faults.repeats.count", "greater than or equal to 2"),
    ("source without a way to read it", lambda d: d["healing"].__setitem__("condition_sources", [{"type": "GpuXid"}]),
     "healing.condition_sources[0].reason_pattern", "say how a fault is read"),
    ("source pattern without code", lambda d: d["healing"].__setitem__(
        "condition_sources", [{"type": "AcceleratedHardwareReady", "reason_pattern": "^NvidiaXID[0-9]+Error$"}]),
     "healing.condition_sources[0].reason_pattern", "(?P<code>"),
    ("source pattern broken", lambda d: d["healing"].__setitem__(
        "condition_sources", [{"type": "X", "message_pattern": "ErrorCode:(?P<code>[0-9]+"}]),
     "healing.condition_sources[0].message_pattern", "not a regular expression"),
    ("source is gpufleet's own", lambda d: d["healing"].__setitem__(
        "condition_sources", [{"type": "GpuHealthy", "read": "kernel-log"}]),
     "healing.condition_sources[0].type", "condition_types"),
    ("fraction > 1", lambda d: d["healing"].__setitem__("max_unhealthy_fraction", 1.5), "healing.max_unhealthy_fraction", "1"),
    ("aws without block", lambda d: d["pools"][0].pop("aws"), "pools[0].aws", "asg"),
    ("bad label key", lambda d: d["pools"][0]["labels"].__setitem__("bad key!", "x"), "pools[0].labels", "label key"),
    ("reserved label", lambda d: d["pools"][0]["labels"].__setitem__("gpufleet.io/pool", "x"), "pools[0].labels", "reserved"),
    ("storage two backends", lambda d: d["storage"][0].__setitem__("nfs", {"server": "s", "path": "/x"}), "storage[0]", "exactly one"),
    ("bad quantity", lambda d: d["storage"][0].__setitem__("size", "lots"), "storage[0].size", "quantity"),
    ("two defaults", lambda d: d["slurm"]["partitions"][1].__setitem__("default", True), "slurm.partitions", "default"),
    ("bad ssh key", lambda d: d["slurm"]["login"].__setitem__("ssh_authorized_keys", ["hello"]),
     "slurm.login.ssh_authorized_keys[0]", "OpenSSH"),
    ("no pools", lambda d: d.__setitem__("pools", []), f"{CONFIG_KEY}.pools", "at least 1"),
    ("bad notification type", lambda d: d["healing"]["notifications"].append({"type": "pager", "name": "x"}),
     "healing.notifications[2]", "type"),
    ("host_path outside local", lambda d: d["storage"][0].update(storage_class=None, host_path="/tmp/x"),
     "storage[0].host_path", "local"),
    # the health check: prod and staging prove every node with every check (nothing skipped, nothing left out)
    ("health check skip outside local",
     lambda d: d["healing"].setdefault("repair", {}).__setitem__("health_check", {"allow_skip": ["dcgm"]}),
     "healing.repair.health_check.allow_skip", "only on the local cluster"),
    ("health check without DCGM outside local",
     lambda d: d["healing"].setdefault("repair", {}).__setitem__("health_check", {"dcgm_level": None}),
     "healing.repair.health_check.dcgm_level", "only on the local cluster"),
    ("health check without all-reduce outside local",
     lambda d: d["healing"].setdefault("repair", {}).__setitem__("health_check", {"all_reduce": False}),
     "healing.repair.health_check.all_reduce", "only on the local cluster"),
    ("health check skips an unknown check",
     lambda d: d["healing"].setdefault("repair", {}).__setitem__("health_check", {"allow_skip": ["nvidia-smi"]}),
     "healing.repair.health_check.allow_skip[0]", "nvlink"),
    ("health check skip listed twice",
     lambda d: d["healing"].setdefault("repair", {}).__setitem__("health_check", {"allow_skip": ["dcgm", "dcgm"]}),
     "healing.repair.health_check.allow_skip", "twice"),
    # lending (issue 13)
    ("lending floor above spares", lend(2, spare_floor=5), "pools[2].lending.spare_floor", "the pool's 4 spares"),
    ("lending floor negative", lend(0, spare_floor=-1), "pools[0].lending.spare_floor", "greater than or equal to 0"),
    ("lending lends nothing", lend(0, spares=False), "pools[0].lending.spares", "lends nothing"),
    ("lending unknown key", lend(1, spraes=True), "pools[1].lending.spraes", "unknown key"),
    ("lending no borrowers", lend(0, borrowers=None), "pools[0].lending.borrowers", "required"),
    ("borrowers empty selector", lend(0, borrowers={"selector": {}}), "pools[0].lending.borrowers.selector", "at least 1"),
    ("borrowers bad selector", lend(0, borrowers={"selector": {"bad key!": "x"}}),
     "pools[0].lending.borrowers.selector", "label key"),
    ("borrowers reserved selector", lend(0, borrowers={"selector": {"gpufleet.io/lent": "spare"}}),
     "pools[0].lending.borrowers.selector", "reserved"),
    ("borrowers unknown key", lend(0, borrowers=borrowers(prio=1)), "pools[0].lending.borrowers.prio", "unknown key"),
    ("borrowers bad class name", lend(0, borrowers=borrowers(priority_class="Borrow_Me")),
     "pools[0].lending.borrowers.priority_class", "not a valid Kubernetes name"),
    ("borrowers system class", lend(0, borrowers=borrowers(priority_class="system-borrower")),
     "pools[0].lending.borrowers.priority_class", "system-"),
    ("borrowers priority too high", lend(0, borrowers=borrowers(priority=2_000_000_000)),
     "pools[0].lending.borrowers.priority", "1000000000"),
    ("borrowers class two values", lambda d: (lend(0)(d), lend(3, borrowers=borrowers(priority=-5))(d)),
     "pools[3].lending.borrowers.priority", "-1000"),
    ("lending grace too long", lend(0, reclaim_grace_seconds=7200), "pools[0].lending.reclaim_grace_seconds", "3600"),
    ("lending fraction zero", lend(0, max_lent_fraction=0), "pools[0].lending.max_lent_fraction", "greater than 0"),
    ("lending idle after negative", lend(0, idle_nodes=True, idle_after_seconds=-1),
     "pools[0].lending.idle_after_seconds", "greater than or equal to 0"),
    ("lending not a mapping", lambda d: d["pools"][0].__setitem__("lending", "yes"), "pools[0].lending", "dictionary"),
    # trust boundaries (issue 24)
    ("agent shares the reconciler's namespace", lambda d: d["healing"].setdefault("reconciler", {}).__setitem__(
        "agent_namespace", "gpufleet-system"), "healing.reconciler.agent_namespace", "one of its own"),
    ("login scheme contradicted", lambda d: d["slurm"]["login"]["service_annotations"].__setitem__(
        "service.beta.kubernetes.io/aws-load-balancer-scheme", "internet-facing"),
     "slurm.login.service_annotations", "contradicts"),
    ("login scheme unknown", lambda d: d["slurm"]["login"].__setitem__("load_balancer_scheme", "public"),
     "slurm.login.load_balancer_scheme", "internal"),
    ("class without a load balancer", lambda d: d["slurm"]["login"].update(service_type="ClusterIP",
                                                                          load_balancer_class="service.k8s.aws/nlb"),
     "slurm.login.load_balancer_class", "LoadBalancer"),
    ("slurm digest malformed", lambda d: d["slurm"].__setitem__("image_digests", {"slurmctld": "sha256:abc"}),
     "slurm.image_digests.slurmctld", "digest"),
    ("slurm digest of no image", lambda d: d["slurm"].__setitem__("image_digests", {"slurmx": "sha256:" + "a" * 64}),
     "slurm.image_digests.slurmx.[key]", "slurmctld"),
    ("api server cidr", lambda d: d.__setitem__("network", {"api_server_cidrs": ["10.0.0.1/16"]}),
     "network.api_server_cidrs[0]", "CIDR"),
    ("more GPUs than the model's machine has", lambda d: d["pools"][0].update(gpu_model="H100-SXM5-80GB", gpus_per_node=16),
     "pools[0].gpus_per_node", "at most 8"),
    ("more GPUs than a GB200 tray has", lambda d: d["pools"][0].update(gpu_model="NVIDIA GB200", gpus_per_node=8),
     "pools[0].gpus_per_node", "at most 4"),
    ("spares but no active nodes", lambda d: d["pools"][0].update(nodes=0, spares=2), "pools[0].nodes", "0 active nodes"),
    ("kmsg device not a resource name", lambda d: d["healing"].setdefault("reconciler", {}).__setitem__(
        "agent_kmsg_device", "not a name!"), "healing.reconciler.agent_kmsg_device", "label key"),
]


@pytest.mark.parametrize("what,fn,path,reason", CASES, ids=[c[0] for c in CASES])
def test_bad_input_names_the_field(what, fn, path, reason):
    with pytest.raises(SpecError) as e:
        parse_fleet(mutate(fn))
    text = str(e.value)
    paths = [p for p, _ in e.value.issues]
    assert any(p.endswith(path) for p in paths), (paths, text)
    assert reason.lower() in text.lower(), text


def test_lending_is_optional_and_bounded():
    f = parse_fleet(mutate(lend(0, max_lent_fraction=0.25)))
    assert f.pools[1].lending is None and f.pools[1].max_lent() == 0
    assert f.pools[0].max_lent() == (128 + 8) // 4
    two = parse_fleet(mutate(lambda d: (lend(0)(d), lend(1)(d))))  # one class, one value: fine
    assert {p.lending.borrowers.priority_class for p in two.pools if p.lending} == {"gpufleet-borrower"}


def test_plain_text_secret_is_refused(tmp_path):
    doc = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    doc["config"]["gpufleet:slackWebhookUrl"] = "https://hooks.example.com/T000/B000/XXXX"
    p = tmp_path / "Pulumi.leaky.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as e:
        load_stack_file(p)
    assert "gpufleet:slackWebhookUrl" in str(e.value) and "--secret" in str(e.value)
    doc["config"]["gpufleet:slackWebhookUrl"] = {"secure": "v1:abc"}
    p.write_text(yaml.safe_dump(doc))
    assert "slackWebhookUrl" not in load_stack_file(p).missing_secrets()


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "gpufleet", *args], cwd=cwd, capture_output=True, text=True)


def clis(*argvs: list[str], cwd=ROOT) -> list[subprocess.CompletedProcess]:
    """`cli` for each argv, the processes run side by side (each starts Python and imports gpufleet)."""
    procs = [subprocess.Popen([sys.executable, "-m", "gpufleet", *a], cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in argvs]
    outs = [p.communicate(timeout=300) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


def test_cli_validate_exit_codes(tmp_path):
    bad_files = []
    for i, (what, fn, path, reason) in enumerate(CASES[:8]):
        p = tmp_path / f"case-{i}" / "Pulumi.bad.yaml"
        p.parent.mkdir()
        p.write_text(yaml.safe_dump({"config": {CONFIG_KEY: mutate(fn)}}))
        bad_files.append(p)
    bare = tmp_path / "fleet.yaml"
    bare.write_text(yaml.safe_dump(base()))
    ok, *bad, bare_ok, missing = clis(["validate", "--stack", "local"], *(["validate", str(p)] for p in bad_files),
                                      ["validate", str(bare)], ["validate", str(tmp_path / "missing.yaml")])
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stdout
    for (what, fn, path, reason), r in zip(CASES[:8], bad, strict=True):
        assert r.returncode == 2, (what, r.stdout, r.stderr)
        assert path in r.stderr, (what, r.stderr)
    assert bare_ok.returncode == 0
    assert missing.returncode == 2


def test_cli_spec_schema_is_json_schema():
    import json

    out = cli("spec-schema")
    schema = json.loads(out.stdout)
    assert schema["title"] == "FleetSpec" and "pools" in schema["properties"]
    assert schema["additionalProperties"] is False


def test_the_login_service_says_its_scheme_to_every_controller_that_may_serve_it():
    from gpufleet.fleetspec.models import LB_INTERNAL, LB_SCHEME, LoginSpec

    plain = LoginSpec(service_type="LoadBalancer").service()
    assert plain["metadata"]["annotations"] == {LB_SCHEME: "internal", LB_INTERNAL: "true"}
    assert "loadBalancerClass" not in plain["spec"]
    classed = LoginSpec(service_type="LoadBalancer", load_balancer_class="service.k8s.aws/nlb").service()
    assert classed == {"spec": {"type": "LoadBalancer", "loadBalancerClass": "service.k8s.aws/nlb"},
                       "metadata": {"annotations": {LB_SCHEME: "internal"}}}
    public = LoginSpec(service_type="LoadBalancer", load_balancer_scheme="internet-facing").service()
    assert public["metadata"]["annotations"] == {LB_SCHEME: "internet-facing"}
    assert LoginSpec().service() == {"spec": {"type": "ClusterIP"}}


def test_slurm_images_by_tag_and_by_digest_where_recorded():
    f = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    digest = "sha256:" + "e" * 64
    slurm = f.slurm.model_copy(update={"image_digests": {"slurmd": digest}})
    assert slurm.image("slurmd") == f"{slurm.image_registry}/slurmd:{slurm.image_tag}@{digest}"
    assert slurm.image("slurmctld") == f"{slurm.image_registry}/slurmctld:{slurm.image_tag}"


def test_the_reconciler_has_a_slurm_identity_of_its_own_by_default():
    """Default: the dedicated user `gpufleet` with accounting on (a MariaDB the stack deploys); root and the
    SlurmUser only on the local cluster, where accounting may then be off."""
    doc = base()
    doc["slurm"].pop("accounting", None)
    spec = parse_fleet(doc)
    assert spec.slurm.reconciler_user == "gpufleet" and spec.slurm.accounting.enabled
    assert spec.slurm.accounting.database.kind == "mariadb"
    local = base()
    local["cluster"] = {"kind": "local"}
    local["storage"][0].update(storage_class=None, host_path="/tmp/x")
    local["slurm"].update(reconciler_user="slurm", accounting={"enabled": False})
    assert parse_fleet(local).slurm.reconciler_user == "slurm"


@pytest.mark.parametrize("env", ["local", "staging", "prod"])
def test_every_stack_gives_the_reconciler_its_own_slurm_user_with_accounting(env):
    slurm = load_stack_file(ROOT / f"Pulumi.{env}.yaml").fleet.slurm
    assert slurm.reconciler_user == "gpufleet" and slurm.accounting.enabled and slurm.accounting.database is not None
