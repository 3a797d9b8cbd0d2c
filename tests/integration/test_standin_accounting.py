"""The Slinky stand-in runs accounting for real (issue 24): for a Controller whose Accounting the API server
holds, slurmdbd runs with the slurmdbd.conf slurm-operator v1.2.1 builds (accountingbuilder/
accounting_config.go: the storage password from the Accounting's passwordKeyRef Secret), a MariaDB process
standing in for the database it names, slurmctld with the AccountingStorage lines (controller_config.go); and
the stack's SlurmUsers Job, as components/slinky.py declares it, has its script run as its pod would
(localenv/slurm_users_job.py): the reconciler's user gets its AdminLevel, once per Job."""
from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.components.meta import metadata
from gpufleet.components.slinky import (
    API_VERSION, CONFIG_FILES, GROUP, SLURM_USERS, SLURM_USERS_SCRIPT, VERSION, crd_manifest, slurm_users_job,
    slurm_users_script,
)
from gpufleet.fleetspec import load_stack_file
from gpufleet.fleetspec.models import RECONCILER_ADMIN_LEVEL
from gpufleet.waiting import wait_for
from localenv.ports import free_ports
from localenv.slinky_standin import SlinkyStandIn
from localenv.slurm import LocalSlurm
from tests.fixtures.slurm_cluster import REPO_ROOT, build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NS = "slurm-acct-it"
PASSWORD = "s3cr3t'pw"  # a quote: the database stand-in's SQL must carry it as it is


def level_of(slurm: LocalSlurm, user: str) -> str:
    r = slurm.run(["sacctmgr", "-n", "-P", "show", "user", f"name={user}", "format=adminlevel"], timeout=15)
    return r.stdout.strip() if r.returncode == 0 else ""


@pytest.fixture(scope="module")
def world(kube_cluster, tmp_path_factory) -> Iterator[tuple[SlinkyStandIn, LocalSlurm, client.ApiClient]]:
    api = kube_cluster.api_client()
    ext, core, objs = client.ApiextensionsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    for kind in ("Controller", "Accounting", "NodeSet"):
        try:
            ext.create_custom_resource_definition(crd_manifest(kind))
        except ApiException as e:
            if e.status != 409:
                raise

    def served() -> bool:
        try:
            names = {r.name for r in objs.get_api_resources(GROUP, VERSION).resources}
        except ApiException:
            return False
        return {"controllers", "accountings", "nodesets"} <= names

    wait_for("the Slinky kinds served", served, 30)
    core.create_namespace({"metadata": {"name": NS}})
    spec = load_stack_file(REPO_ROOT / "Pulumi.local.yaml").fleet
    env = spec.environment
    core.create_namespaced_secret(NS, {"metadata": {"name": "db-pass"}, "stringData": {"password": PASSWORD}})
    core.create_namespaced_config_map(NS, {"metadata": {"name": CONFIG_FILES}, "data": {}})
    core.create_namespaced_config_map(NS, {"metadata": metadata(SLURM_USERS, "slurm-users", env),
                                           "data": {SLURM_USERS_SCRIPT: slurm_users_script(spec)}})
    client.BatchV1Api(api).create_namespaced_job(NS, {"metadata": metadata(SLURM_USERS, "slurm-users", env),
                                                      "spec": slurm_users_job(spec)})
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("acct-slurm"), {"gpu": ["pool-a"]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest, cluster_name="acct-it")
    slurm.up()
    objs.create_namespaced_custom_object(GROUP, VERSION, NS, "accountings", {
        "apiVersion": API_VERSION, "kind": "Accounting", "metadata": {"name": "slurm"},
        "spec": {"slurmKeyRef": {"name": "k", "key": "k"}, "jwtKeyRef": {"name": "j", "key": "j"}, "storageConfig": {
            "host": "slurm-accounting-db", "port": 3306, "database": "slurm_acct_db", "username": "slurm",
            "passwordKeyRef": {"name": "db-pass", "key": "password"}}}})
    objs.create_namespaced_custom_object(GROUP, VERSION, NS, "controllers", {
        "apiVersion": API_VERSION, "kind": "Controller", "metadata": {"name": "slurm"},
        "spec": {"clusterName": "acct-it", "slurmKeyRef": {"name": "k", "key": "k"}, "jwtKeyRef": {"name": "j", "key": "j"},
                 "accountingRef": {"name": "slurm"},
                 "extraConf": "GresTypes=gpu\n" + "\n".join(slurm.extra_conf) + "\n",  # no NodeSet: no partition
                 "configFileRefs": [{"name": CONFIG_FILES}]}})
    try:
        yield SlinkyStandIn(api, slurm, None, namespace=NS), slurm, api
    finally:
        slurm.down()
        core.delete_namespace(NS)


def test_the_accounting_runs_and_the_stacks_job_declares_the_reconcilers_user(world) -> None:
    standin, slurm, api = world
    spec = load_stack_file(REPO_ROOT / "Pulumi.local.yaml").fleet
    user = spec.slurm.reconciler_user

    def declared() -> bool:
        standin.reconcile_once()
        return level_of(slurm, user) == RECONCILER_ADMIN_LEVEL

    wait_for(f"{user} with AdminLevel {RECONCILER_ADMIN_LEVEL}", declared, 120, interval=1)
    conf = slurm.conf_path.read_text()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStorageHost=127.0.0.1" in conf  # where the local slurmdbd runs (slinky_conf.LOCAL_KEYS)
    dbd = slurm.dbd_conf_path.read_text().splitlines()
    assert f"StoragePass={PASSWORD}" in dbd and "StorageLoc=slurm_acct_db" in dbd and "StorageUser=slurm" in dbd
    assert (slurm.dbd_conf_path.stat().st_mode & 0o777) == 0o600
    clusters = slurm.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], check=True).stdout.split()
    assert clusters == ["acct-it"]  # slurmctld registered with slurmdbd
    job = client.BatchV1Api(api).read_namespaced_job(SLURM_USERS, NS)
    assert job.metadata.uid in standin._users_done
    # Once per Job: a user removed meanwhile is not added again by the same Job (a new Job would).
    slurm.run(["sacctmgr", "-i", "delete", "user", f"name={user}"], check=True)
    standin.reconcile_once()
    assert level_of(slurm, user) == ""
