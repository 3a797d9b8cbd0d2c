"""What the local Slurm runs: slurm-operator v1.2.1's slurm.conf for the Slinky resources the stack
declares (localenv/slinky_conf.py, following internal/builder/controllerbuilder/controller_config.go
and common/common.go), with only the where-it-runs values changed. Issue 20's "done when": the local
slurm.conf has no line the stack does not declare or the release does not write."""
from __future__ import annotations

import pytest

from localenv import slinky_conf as sc
from localenv.slurm import LocalSlurm
from tests.unit.test_components import CR, MOCKS, build


def ctl(extra: str = "", **spec) -> dict:
    return {"metadata": {"name": "slurm", "namespace": "slurm"}, "spec": {"extraConf": extra, **spec}}


def nodeset(name: str, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "slurm"}, "spec": {"controllerRef": {"name": "slurm"}, **spec}}


def test_the_operators_general_and_plugin_lines():
    conf = sc.slurm_conf(ctl(clusterName="gpufleet"), None, [])
    lines = conf.splitlines()
    assert lines[:3] == ["#", "### GENERAL ###", "ClusterName=gpufleet"]
    assert "SlurmctldHost=slurm-controller-0(slurm-controller.slurm)" in lines
    assert "StateSaveLocation=/var/spool/slurmctld/gpufleet" in lines
    assert "AuthType=auth/slurm" in lines and "AuthAltParameters=jwt_key=/etc/slurm/jwt.key" in lines
    assert "SlurmctldParameters=enable_configless,reconfig_on_restart" in lines
    assert "AccountingStorageType=accounting_storage/none" in lines
    # pruned in 1.2.0 ("prune all non-required Slurm config options"): the stack must declare these
    keys = sc.conf_keys(conf)
    for gone in ("ReturnToService", "GresTypes", "ProctrackType", "TaskPlugin", "PartitionName"):
        assert gone not in keys
    # no clusterName: <namespace>_<name> (api/v1beta1/controller_keys.go ClusterName)
    assert "ClusterName=slurm_slurm" in sc.slurm_conf(ctl(), None, [])


def test_nodesets_accounting_and_a_partition_per_nodeset_only_when_enabled():
    conf = sc.slurm_conf(ctl(), {"metadata": {"name": "db"}}, [
        nodeset("l40s", partition={"enabled": True, "config": "MaxTime=60"}), nodeset("h100"),
        nodeset("foo", template={"spec": {"hostname": "bar-"}})])
    section = conf.split("### NODESET & PARTITION ###\n")[1].split("\n#")[0].splitlines()
    assert section == ["NodeSet=bar Feature=bar", "NodeSet=h100 Feature=h100", "NodeSet=l40s Feature=l40s",
                       "PartitionName=l40s Nodes=l40s MaxTime=60"]
    assert "AccountingStorageHost=db-accounting" in conf and "AccountingStoragePort=6819" in conf


def test_extra_conf_is_appended_and_merged_parameters_are_unioned():
    conf = sc.slurm_conf(ctl("GresTypes=gpu\nSlurmctldParameters=enable_stepmgr,enable_configless\n"), None, [])
    assert conf.split("### EXTRA CONFIG ###\n")[1].startswith("GresTypes=gpu\nSlurmctldParameters=enable_stepmgr")
    merged = conf.split("### MERGED CONFIG ###\n")[1]
    assert merged.strip() == "SlurmctldParameters=enable_configless,enable_stepmgr,reconfig_on_restart"


def test_slurmd_conf_is_the_nodesets_features_and_extra_conf():
    """workerbuilder/worker_app.go slurmdConfArgs: Features=<nodeset> first-class, keys title-cased, sorted."""
    assert sc.slurmd_conf(nodeset("h100", extraConf="Gres=gpu:8")) == "Features=h100 Gres=gpu:8"
    assert sc.slurmd_conf(nodeset("h100", extraConf="features=ib weight=5")) == "Features=h100,ib Weight=5"
    assert sc.slurmd_conf(nodeset("h100")) == "Features=h100"
    with pytest.raises(ValueError):
        sc.slurmd_conf(nodeset("h100", extraConf="Gres"))


def test_localize_changes_only_where_it_runs():
    conf = sc.slurm_conf(ctl("AuthInfo=cred_expire=70\n"), None, [])
    local = sc.localize(conf, {"SlurmctldPort": "16817", "AuthInfo": "socket=/run/munge/munge.socket.2"})
    assert "SlurmctldPort=16817" in local and "AuthInfo=socket=/run/munge/munge.socket.2" in local
    assert local.count("AuthInfo=") == conf.count("AuthInfo=")
    with pytest.raises(ValueError):
        sc.localize(conf, {"ReturnToService": "2"})


def _declared_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_local_slurm_conf_has_no_line_the_stack_does_not_declare_or_the_release_does_not_write(tmp_path):
    """Render the local stack (Pulumi.local.yaml) under Pulumi's mocks, give its Controller and NodeSets to
    the operator's renderer as the stand-in does, localize as LocalSlurm does: every line is either the
    release's own (same value, or a where-it-runs value of slinky_conf.LOCAL_KEYS) or one of the
    Controller's extraConf lines the stack declared."""
    spec = build("local")
    controller = {"metadata": {"name": "slurm", "namespace": "slurm"},
                  "spec": MOCKS.named(CR + "Controller", "slurm").inputs["spec"]}
    nodesets = [{"metadata": {"name": r.inputs["metadata"]["name"], "namespace": "slurm"}, "spec": r.inputs["spec"]}
                for r in MOCKS.of_type(CR + "NodeSet")]
    operator = sc.slurm_conf(controller, None, nodesets)
    slurm = LocalSlurm(tmp_path / "slurm", {p.name: [p.name] for p in spec.slurm.partitions}, root="/")
    local = sc.localize(operator, slurm._local_values())
    bare = sc.slurm_conf({**controller, "spec": {**controller["spec"], "extraConf": ""}}, None, nodesets)
    release = _declared_lines(bare)
    declared = _declared_lines(controller["spec"]["extraConf"])
    for line in _declared_lines(local):
        key = line.split("=", 1)[0]
        assert line in release or line in declared or (key in sc.LOCAL_KEYS and key in sc.conf_keys(bare)), line
    # what the local Slurm needs beyond the release's lines reached it through the stack
    assert {"ReturnToService=2", "GresTypes=gpu", "KillWait=5", "ProctrackType=proctrack/linuxproc"} <= set(declared)
    assert not [line for line in _declared_lines(local) if line.startswith("NodeSet=") and line not in release]


def test_a_slurm_started_without_a_stack_runs_what_the_local_stack_would_declare(tmp_path):
    slurm = LocalSlurm(tmp_path / "slurm", {"train": ["h100"], "infer": ["l40s"]}, root="/")
    files = slurm.operator_files()
    assert files["cgroup.conf"] == "CgroupPlugin=disabled\n" and "File=/dev/loop[0-7]" in files["gres.conf"]
    conf = slurm.slurm_conf()
    assert "PartitionName=train Nodes=h100 State=UP Default=YES" in conf and "NodeSet=l40s Feature=l40s" in conf
    assert "AuthType=auth/munge" in conf and f"SlurmctldPort={slurm.ctld_port}" in conf


def test_slurmdbd_conf_is_the_accounting_builders():
    """accountingbuilder/accounting_config.go buildSlurmdbdConf: DbdHost the Accounting's primary pod
    (`<name>-0`), the operator's auth, the storageConfig with the password read from its Secret, no log file;
    localized, only the where-it-runs keys change."""
    acct = {"metadata": {"name": "slurm", "namespace": "slurm"},
            "spec": {"storageConfig": {"host": "db.example", "port": 3306, "database": "acct", "username": "su",
                                       "passwordKeyRef": {"name": "s", "key": "k"}}}}
    conf = sc.slurmdbd_conf(acct, "pw")
    lines = conf.splitlines()
    for line in ("DbdHost=slurm-0", "DbdPort=6819", "SlurmUser=slurm", "AuthType=auth/slurm",
                 "AuthAltTypes=auth/jwt", "AuthAltParameters=jwt_key=/etc/slurm/jwt.key", "AuthInfo=use_client_ids",
                 "StorageType=accounting_storage/mysql", "StorageHost=db.example", "StoragePort=3306",
                 "StorageUser=su", "StorageLoc=acct", "StoragePass=pw", "LogFile=/dev/null"):
        assert line in lines
    assert "### EXTRA CONFIG ###" not in conf
    local = sc.localize(conf, {"DbdHost": "localhost", "StorageHost": "127.0.0.1"}, sc.LOCAL_DBD_KEYS)
    assert "DbdHost=localhost" in local and "StorageHost=127.0.0.1" in local and "StoragePass=pw" in local
    with pytest.raises(ValueError, match="StoragePass"):
        sc.localize(conf, {"StoragePass": "x"}, sc.LOCAL_DBD_KEYS)
    extra = sc.slurmdbd_conf({**acct, "spec": {**acct["spec"], "extraConf": "AuthInfo=cred_expire=70"}}, "pw")
    assert extra.split("### MERGED CONFIG ###\n")[1].strip() == "AuthInfo=cred_expire=70,use_client_ids"
