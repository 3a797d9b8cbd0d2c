"""Components under Pulumi's mocks: which resources each environment declares, and their shape."""
from __future__ import annotations

import json
from pathlib import Path

import pulumi
import pytest
import yaml


class Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outputs = dict(args.inputs)
        if "metadata" in outputs and isinstance(outputs["metadata"], dict):
            outputs["metadata"] = {**outputs["metadata"]}
            outputs["metadata"].setdefault("name", args.name)
        return [args.name + "_id", outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, typ: str, name: str) -> pulumi.runtime.MockResourceArgs:
        (r,) = [r for r in self.of_type(typ) if r.inputs.get("metadata", {}).get("name") == name]
        return r


MOCKS = Mocks()
pulumi.runtime.set_mocks(MOCKS, preview=False)

from gpufleet.components import GpuFleet, GpuFleetArgs  # noqa: E402  (mocks first, then the code under test)
from gpufleet.components.reconciler import cluster_rules, namespace_rules, slurm_namespace_rules  # noqa: E402
from gpufleet.fleetspec import labels, load_stack_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET_VALUE = "s3cr3t-munge-key-value"


def build(env: str):
    """Run the fleet under the mocks to completion: every child registered before we look."""
    spec = load_stack_file(ROOT / f"Pulumi.{env}.yaml").fleet
    build_spec(spec, env)
    return spec


def build_spec(spec, name: str) -> dict:
    """Build `spec` under the mocks; returns what each resource was declared with: Pulumi name ->
    (URN, ResourceOptions), seen by a transformation every child inherits."""
    MOCKS.resources.clear()
    declared: dict = {}

    def seen(args: pulumi.ResourceTransformationArgs):
        declared[args.name] = args
        return None

    @pulumi.runtime.test
    def program():
        secrets = {k: pulumi.Output.secret(f"{SECRET_VALUE}-{k}") for k in spec.secret_keys()}
        GpuFleet(name, GpuFleetArgs(spec, secrets, local_kubeconfig="/tmp/kubeconfig"),
                 pulumi.ResourceOptions(transformations=[seen]))

    program()
    return declared


def lending_spec(lend=("h100-a", "h100-b"), l40s_class: str | None = "gpufleet-inference"):
    """prod with lending on `lend` (the default borrower class), and l40s's borrowers in a class of their own."""
    from gpufleet.fleetspec import CONFIG_KEY, parse_fleet

    doc = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"][CONFIG_KEY]
    for pool in doc["pools"]:
        pool.pop("lending", None)
        borrowers = {"selector": {"app.kubernetes.io/name": "inference"}}
        if pool["name"] in lend:
            pool["lending"] = {"spares": True, "idle_nodes": True, "borrowers": borrowers}
        elif pool["name"] == "l40s" and l40s_class and lend:
            pool["lending"] = {"idle_nodes": True, "borrowers": {**borrowers, "priority_class": l40s_class,
                                                                 "priority": -5000}}
    return parse_fleet(doc)


K8S = "kubernetes:"
CR = "kubernetes:slinky.slurm.net/v1beta1:"


@pytest.mark.parametrize("env", ["local", "staging", "prod"])
def test_each_environment_declares_its_fleet(env):
    spec = build(env)
    types = [r.typ for r in MOCKS.resources]
    assert types.count("kubernetes:slinky.slurm.net/v1beta1:NodeSet") == len(spec.pools)
    # the NodeSets whose pods the reconciler takes for Slurm nodes (observe.pod_view) are the ones declared
    from gpufleet.fleetspec.placement import nodeset_names
    assert {r.inputs["metadata"]["name"] for r in MOCKS.of_type(CR + "NodeSet")} == nodeset_names(spec.pools)
    # capacity per pool, policy (and the agent's copy), gres.conf, the lending ledger where a pool lends, the
    # dashboard where the spec asks for it, and the script of the Job that declares the reconciler's Slurm user
    assert types.count("kubernetes:core/v1:ConfigMap") == (len(spec.pools) + 3 + bool(spec.lending_pools())
                                                         + spec.healing.grafana_dashboard + 1)
    assert types.count("kubernetes:batch/v1:Job") == 1  # SlurmUsers: every stack uses a dedicated Slurm user
    assert types.count("kubernetes:scheduling.k8s.io/v1:PriorityClass") == len(spec.borrower_classes())
    assert types.count("kubernetes:core/v1:PersistentVolumeClaim") == len(spec.storage)
    assert types.count("pulumi:providers:kubernetes") == 1
    assert "kubernetes:apps/v1:Deployment" in types and "kubernetes:policy/v1:PodDisruptionBudget" in types
    helm = types.count("kubernetes:helm.sh/v3:Release")
    crds = types.count("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    if spec.slurm.operator.mode == "helm":
        assert helm == 2 and crds == 1  # the operator charts; gpufleet's own Remediation CRD
    else:
        assert helm == 0 and crds == 7  # six Slinky kinds + Remediation
    # the resource count grows with pools, never with nodes (22: the agent's namespace, 8 admission policies
    # and their bindings, 5 NetworkPolicies; 4: accounting with its Secret, the Slurm-user Job and its script)
    assert len(MOCKS.resources) < 48 + 22 + 4 + 3 * len(spec.pools)



def test_components_are_parented_and_typed():
    build("prod")
    comps = {r.typ for r in MOCKS.resources if r.typ.startswith("gpufleet:")}
    assert comps == {"gpufleet:index:GpuFleet", "gpufleet:cluster:ClusterAccess", "gpufleet:pool:GpuNodePool",
                     "gpufleet:storage:SharedStorage", "gpufleet:slurm:SlinkySlurm",
                     "gpufleet:reconciler:Reconciler"}
    # every Kubernetes object carries the standard labels
    for r in MOCKS.resources:
        if r.typ.startswith(K8S) and "metadata" in r.inputs:
            lab = r.inputs["metadata"].get("labels", {})
            assert lab.get("app.kubernetes.io/part-of") == "gpufleet", r.name



def test_nodeset_per_pool_bound_by_selector_and_tolerations():
    spec = build("prod")
    for pool in spec.pools:
        ns = MOCKS.named(CR + "NodeSet", pool.name).inputs["spec"]
        assert ns["replicas"] == pool.nodes
        assert ns["template"]["spec"]["nodeSelector"] == {labels.NODE_POOL: pool.name}
        tol = ns["template"]["spec"]["tolerations"]
        assert {t["key"] for t in tol} == {t.key for t in pool.taints}
        assert labels.SPARE_TAINT not in {t["key"] for t in tol}  # never lands on an unpromoted spare
        assert ns["slurmd"]["resources"]["limits"]["nvidia.com/gpu"] == pool.gpus_per_node
        assert {m["mountPath"] for m in ns["slurmd"]["volumeMounts"]} == {"/checkpoints", "/datasets"}
    conf = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]["extraConf"]
    assert "PartitionName=train Nodes=h100-a,h100-b State=UP Default=YES" in conf



def test_pool_capacity_declares_spares_with_their_taint():
    spec = build("prod")
    for pool in spec.pools:
        cm = MOCKS.named("kubernetes:core/v1:ConfigMap", f"gpufleet-pool-{pool.name}")
        cap = json.loads(cm.inputs["data"]["capacity.json"])
        assert (cap["nodes"], cap["spares"], cap["provider"]) == (pool.nodes, pool.spares, pool.provider)
        assert cap["spareLabels"][labels.ROLE] == labels.ROLE_SPARE
        assert cap["activeLabels"][labels.ROLE] == labels.ROLE_ACTIVE
        assert {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"} in cap["spareTaints"]
        assert labels.SPARE_TAINT not in {t["key"] for t in cap["activeTaints"]}



def _verbs(rules: list[dict]) -> dict[tuple[str, str], set[str]]:
    return {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}


def test_reconciler_rbac_is_least_privilege():
    for spec in (None, load_stack_file(ROOT / "Pulumi.staging.yaml").fleet, lending_spec()):
        for rule in cluster_rules(spec) + namespace_rules(spec) + slurm_namespace_rules(spec):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        verbs = _verbs(cluster_rules(spec))
        assert verbs[("", "pods/eviction")] == {"create"}
        assert "delete" not in verbs[("", "nodes")]
        assert ("", "secrets") not in verbs and ("", "configmaps") not in verbs
        # pods: listed and watched, never created or changed cluster-wide; deleted cluster-wide only when a
        # pool lends (a borrower past its reclaim grace, in whatever namespace it runs)
        lends = spec is not None and bool(spec.lending_pools())
        assert verbs[("", "pods")] == ({"list", "watch", "delete"} if lends else {"list", "watch"})
        # without lending, a pod is deleted only in the Slurm namespace (a NodeSet pod a stale busy-pod PDB
        # keeps at the drain timeout) and the reconciler's own (its capacity placeholders)
        assert _verbs(slurm_namespace_rules(spec)) == ({} if lends else {("", "pods"): {"delete"}})
        # events: created anywhere, listed only in its own namespace (the autoscaler's answer to a placeholder)
        assert verbs[("", "events")] == {"create"} and _verbs(namespace_rules(spec))[("", "events")] == {"list"}


def test_lending_adds_exactly_its_calls_to_the_reconcilers_rules():
    """Pod delete (a borrower past its reclaim grace) cluster-wide, and get/patch of the one ledger ConfigMap
    in its namespace; nothing of either without a lending pool."""
    plain = lending_spec(lend=())
    assert not plain.lending_pools()
    lends = lending_spec()
    cluster_before, cluster_after = _verbs(cluster_rules(plain)), _verbs(cluster_rules(lends))
    assert cluster_after[("", "pods")] - cluster_before[("", "pods")] == {"delete"}
    assert {k: v for k, v in cluster_after.items() if k != ("", "pods")} == \
        {k: v for k, v in cluster_before.items() if k != ("", "pods")}
    assert cluster_before == _verbs(cluster_rules())
    ns_before, ns_after = namespace_rules(plain), namespace_rules(lends)
    assert [r for r in ns_after if r["resources"] == ["configmaps"]] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpufleet-lending"], "verbs": ["get", "patch"]}]
    # the namespaced pod deletes (capacity placeholders; NodeSet pods in the Slurm namespace) are the
    # cluster-wide one when a pool lends: granted once
    assert _verbs(ns_before)[("", "pods")] == {"create", "delete"} and _verbs(ns_after)[("", "pods")] == {"create"}
    assert {k: v for k, v in _verbs(ns_after).items() if k not in {("", "pods"), ("", "configmaps")}} == \
        {k: v for k, v in _verbs(ns_before).items() if k != ("", "pods")}
    assert ns_before == namespace_rules()
    assert slurm_namespace_rules(plain) == slurm_namespace_rules() == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    assert slurm_namespace_rules(lends) == []


def test_the_reconciler_deletes_nodeset_pods_through_a_role_in_the_slurm_namespace():
    """Bound to the reconciler's ServiceAccount, declared after the Slurm namespace (its output); no such
    Role when a pool lends (the cluster-wide delete covers it)."""
    spec = build("staging")
    assert not spec.lending_pools()
    role = MOCKS.named("kubernetes:rbac.authorization.k8s.io/v1:Role", "gpufleet-reconciler-nodeset-pods")
    assert role.inputs["metadata"]["namespace"] == spec.slurm.namespace != spec.healing.reconciler.namespace
    assert role.inputs["rules"] == slurm_namespace_rules(spec)
    binding = MOCKS.named("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "gpufleet-reconciler-nodeset-pods")
    assert binding.inputs["metadata"]["namespace"] == spec.slurm.namespace
    assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": "gpufleet-reconciler-nodeset-pods"}
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-reconciler",
                                           "namespace": spec.healing.reconciler.namespace}]
    build_spec(lending_spec(), "lend")
    assert not [r for r in MOCKS.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
                if r.inputs["metadata"]["name"] == "gpufleet-reconciler-nodeset-pods"]


def test_borrowers_get_one_priority_class_per_class_name():
    spec = lending_spec()
    declared = build_spec(spec, "lend")
    classes = {r.inputs["metadata"]["name"]: r for r in MOCKS.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass")}
    assert sorted(classes) == ["gpufleet-borrower", "gpufleet-inference"]  # h100-a and h100-b share one
    for name, value, pools in (("gpufleet-borrower", -1000, "h100-a, h100-b"), ("gpufleet-inference", -5000, "l40s")):
        pc = classes[name].inputs
        assert (pc["value"], pc["preemptionPolicy"], pc["globalDefault"]) == (value, "Never", False)
        assert f"pool(s) {pools}" in pc["description"]
        assert pc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet"
        assert pc["metadata"]["labels"]["app.kubernetes.io/component"] == "borrower"
        assert "namespace" not in pc["metadata"]  # cluster-scoped
        assert declared[classes[name].name].opts.parent.__class__.__name__ == "GpuFleet"
    build("staging")  # no lending: no PriorityClass, no ledger
    assert not MOCKS.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass")
    assert not [r for r in MOCKS.of_type("kubernetes:core/v1:ConfigMap") if r.inputs["metadata"]["name"] == "gpufleet-lending"]


def test_the_lending_ledger_is_declared_and_its_data_left_to_the_reconciler():
    spec = lending_spec()
    declared = build_spec(spec, "lend")
    ledger = MOCKS.named("kubernetes:core/v1:ConfigMap", labels.LENDING_LEDGER)
    assert ledger.inputs["metadata"]["namespace"] == spec.healing.reconciler.namespace
    assert ledger.inputs["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet"
    assert not ledger.inputs.get("data")
    opts = declared[ledger.name].opts
    assert opts.ignore_changes == ["data"] and opts.parent.__class__.__name__ == "Reconciler"


def test_reconciler_deployment_policy_and_bindings():
    spec = build("prod")
    cm = MOCKS.named("kubernetes:core/v1:ConfigMap", "gpufleet-policy")
    healing = json.loads(cm.inputs["data"]["fleet.json"])["healing"]
    assert healing == json.loads(spec.healing.model_dump_json())
    dep = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]
    assert dep["replicas"] == 2 and "--leader-elect" in dep["template"]["spec"]["containers"][0]["args"]
    pdb = MOCKS.named("kubernetes:policy/v1:PodDisruptionBudget", "gpufleet-reconciler").inputs["spec"]
    assert pdb["minAvailable"] == 1
    for b in MOCKS.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"):
        assert b.inputs["roleRef"]["name"] != "cluster-admin"
    privileged = [r.inputs["metadata"]["name"] for r in MOCKS.resources
                  if r.typ in ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet")
                  and any(c.get("securityContext", {}).get("privileged")
                          for c in r.inputs["spec"]["template"]["spec"]["containers"])]
    assert privileged == ["gpufleet-agent"]



def test_the_agent_gets_what_its_repairs_need_only_when_the_repair_loop_is_on():
    """Resets and reboots run in the host's namespaces (nsenter into PID 1: hostPID, root); off, none of it."""
    spec = build("prod")
    assert spec.healing.repair.enabled
    pod = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["hostPID"] is True and "--repairs" in c["args"]
    assert c["securityContext"]["runAsUser"] == 0 and c["securityContext"]["privileged"] is True
    off = spec.model_copy(update={"healing": spec.healing.model_copy(update={
        "repair": spec.healing.repair.model_copy(update={"enabled": False})})})
    build_spec(off, "off")
    pod = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "hostPID" not in pod and "--repairs" not in c["args"] and "runAsGroup" not in c["securityContext"]


def test_secrets_stay_secret():
    build("prod")
    holders = []
    for r in MOCKS.resources:
        text = json.dumps(r.inputs, default=str)
        if SECRET_VALUE in text:
            holders.append((r.typ, r.inputs["metadata"]["name"]))
    # the values reach exactly the Secrets that need them, and nothing else
    assert sorted(holders) == [("kubernetes:core/v1:Secret", "gpufleet-notifications"),
                               ("kubernetes:core/v1:Secret", "slurm-accounting-db"),
                               ("kubernetes:core/v1:Secret", "slurm-auth-jwt"),  # the Controller's and the Token's
                               ("kubernetes:core/v1:Secret", "slurm-auth-slurm")]
    cm = MOCKS.named("kubernetes:core/v1:ConfigMap", "gpufleet-policy")
    assert '"url_secret": "slackWebhookUrl"' in cm.inputs["data"]["fleet.json"]


def test_missing_secret_is_refused_before_any_resource():
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        GpuFleet("prod-missing", GpuFleetArgs(spec, {"mungeKey": "x", "slurmJwtKey": "y"}))

    with pytest.raises(ValueError, match="slackWebhookUrl"):
        program()
    assert not [r for r in MOCKS.resources if r.name.startswith("prod-missing-")]


# --- Slinky resources the operator accepts (issue 12, item 5) ----------------------------------

def _secret_data(name: str) -> dict:
    data = MOCKS.named("kubernetes:core/v1:Secret", name).inputs["stringData"]
    return data.get("value", data)  # the provider marks stringData secret: {sig, value}


def _crs(kind: str) -> list:
    return MOCKS.of_type(CR + kind)


def _strict_schema(kind: str) -> dict:
    from gpufleet.components.slinky import crd_manifest
    from gpufleet.components.slinky_schema import strict_json_schema

    return strict_json_schema(crd_manifest(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("env", ["local", "staging", "prod"])
def test_every_slinky_resource_fits_the_v1beta1_schema(env):
    """Every Slinky CR the stack declares validates against the local CRD's schema with unknown
    fields refused (what strict field validation does), so a misplaced field fails here."""
    import jsonschema

    from gpufleet.components.slinky import KINDS

    build(env)
    seen = set()
    for kind in KINDS:
        for r in _crs(kind):
            jsonschema.validate({"spec": r.inputs["spec"]}, _strict_schema(kind))
            seen.add(kind)
    assert {"Controller", "NodeSet", "RestApi", "Token"} <= seen


@pytest.mark.parametrize("kind,spec", [
    ("LoginSet", {"controllerRef": {"name": "slurm"}, "sssdConfRefs": {"name": "x", "key": "sssd.conf"}}),
    ("Accounting", {"storageConfig": {"host": "db", "password": {"name": "x", "key": "p"}}}),
    ("Controller", {"accountingRef": {"name": "accounting"}, "jwtHs256Key": {"name": "x", "key": "k"}}),
    ("Token", {"username": "slurm", "lifetime": 900}),
    ("NodeSet", {"controllerRef": {"name": "slurm"}, "partition": {"enabled": "yes"}}),
])
def test_local_slinky_schemas_refuse_misspelt_fields(kind, spec):
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": spec}, _strict_schema(kind))


def test_prod_slinky_resources_carry_what_the_operator_needs():
    spec = build("prod")
    rel = next(r for r in MOCKS.of_type("kubernetes:helm.sh/v3:Release") if r.name == "prod-slurm-operator")
    assert rel.inputs["values"]["certManager"] == {"enabled": True}
    assert rel.inputs["values"]["operator"]["nodeSelector"] == dict(spec.system_pool.node_selector)
    login = MOCKS.named(CR + "LoginSet", "login").inputs["spec"]
    assert login["sssdConfRef"] == {"name": "slurm-sssd-conf", "key": "sssd.conf"}
    sssd = _secret_data("slurm-sssd-conf")["sssd.conf"]
    assert "[sssd]" in sssd and "domains = local" in sssd
    assert login["service"]["spec"]["type"] == "LoadBalancer"
    assert login["service"]["metadata"]["annotations"] == dict(spec.slurm.login.service_annotations)
    acct = MOCKS.named(CR + "Accounting", "slurm").inputs["spec"]
    db = spec.slurm.accounting.database
    assert acct["storageConfig"] == {"host": db.host, "port": 3306, "database": "slurm_acct_db", "username": "slurm",
                                     "passwordKeyRef": {"name": "slurm-accounting-db", "key": "password"}}
    assert _secret_data("slurm-accounting-db")["password"] == f"{SECRET_VALUE}-slurmDbPassword"
    ctl = MOCKS.named(CR + "Controller", "slurm").inputs["spec"]
    assert ctl["accountingRef"] == {"name": "slurm"}
    assert ctl["jwtKeyRef"] == {"name": "slurm-auth-jwt", "key": "jwt.key"} and "jwtHs256KeyRef" not in ctl
    assert "GresTypes=gpu" in ctl["extraConf"]
    assert "DisableRootJobs=YES" in ctl["extraConf"].splitlines()  # slurm.conf(5) 26.05: root runs no job
    assert ctl["configFileRefs"] == [{"name": "slurm-config-files"}]
    gres = MOCKS.named("kubernetes:core/v1:ConfigMap", "slurm-config-files").inputs["data"]["gres.conf"]
    assert "AutoDetect=nvidia" in gres
    for pool in spec.pools:
        ns = MOCKS.named(CR + "NodeSet", pool.name).inputs["spec"]
        assert f"Gres=gpu:{pool.gpus_per_node}" in ns["extraConf"]
        assert f"{pool.name} gpu:{pool.gpus_per_node}" in gres


def test_staging_operator_runs_without_cert_manager():
    build("staging")
    rel = next(r for r in MOCKS.of_type("kubernetes:helm.sh/v3:Release") if r.name == "staging-slurm-operator")
    assert rel.inputs["values"]["certManager"] == {"enabled": False}
    # accounting on (the reconciler's Slurm user needs it), with the MariaDB the stack deploys
    assert MOCKS.named(CR + "Controller", "slurm").inputs["spec"]["accountingRef"] == {"name": "slurm"}
    assert MOCKS.named(CR + "Accounting", "slurm").inputs["spec"]["storageConfig"]["host"] == "mariadb"


def test_a_mariadb_the_stack_deploys_backs_accounting():
    spec = load_stack_file(ROOT / "Pulumi.staging.yaml").fleet
    slurm = spec.slurm.model_copy(update={"accounting": spec.slurm.accounting.model_validate(
        {"enabled": True, "database": {"kind": "mariadb", "storage_class": "gp3"}})})
    spec = spec.model_copy(update={"slurm": slurm})
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        GpuFleet("mdb", GpuFleetArgs(spec, {k: pulumi.Output.secret("v") for k in spec.secret_keys()}))

    program()
    assert "slurmDbPassword" in spec.secret_keys()
    sts = MOCKS.named("kubernetes:apps/v1:StatefulSet", "mariadb").inputs["spec"]
    env = {e["name"]: e for e in sts["template"]["spec"]["containers"][0]["env"]}
    assert env["MARIADB_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "slurm-accounting-db", "key": "password"}
    assert MOCKS.named("kubernetes:core/v1:Service", "mariadb").inputs["spec"]["ports"][0]["port"] == 3306
    acct = MOCKS.named(CR + "Accounting", "slurm").inputs["spec"]
    assert acct["storageConfig"]["host"] == "mariadb"


def test_reconciler_reaches_slurm_through_the_restapi_with_its_token():
    spec = build("prod")
    restapi = _crs("RestApi")
    assert [r.inputs["metadata"]["name"] for r in restapi] == ["slurm"]  # its Service: slurm-restapi
    # The Token is minted where the key lives (slurm-operator v1.2.1 resolves jwtKeyRef and writes
    # secretRef in the Token's namespace): no copy of the key in the reconciler's namespace.
    token = MOCKS.named(CR + "Token", "gpufleet-reconciler").inputs
    assert token["metadata"]["namespace"] == spec.slurm.namespace
    assert token["spec"] == {"jwtKeyRef": {"name": "slurm-auth-jwt", "key": "jwt.key"}, "username": "gpufleet",
                             "lifetime": "24h", "refresh": True,
                             "secretRef": {"name": "gpufleet-reconciler-slurm-token", "key": "SLURM_JWT"}}
    keys = [r for r in MOCKS.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] == "slurm-auth-jwt"]
    assert [k.inputs["metadata"]["namespace"] for k in keys] == [spec.slurm.namespace]
    # Its refresh point (4/5 of the lifetime) comes after the operator's longest resync gap (11 h), so the pass
    # a resync queues always requeues it there: slurm-operator 1.2.1's stop after a re-mint cannot bite.
    from gpufleet.components.slinky import MIN_SAFE_TOKEN_LIFETIME_S, OPERATOR_RESYNC_MAX_S
    assert 24 * 3600 * 4 / 5 > OPERATOR_RESYNC_MAX_S and MIN_SAFE_TOKEN_LIFETIME_S <= 24 * 3600
    # The reconciler reads that one Secret, by name, and patches that one Token (its nudge), nothing else in
    # the Slurm namespace.
    role = MOCKS.named("kubernetes:rbac.authorization.k8s.io/v1:Role", "gpufleet-reconciler-slurm-token").inputs
    assert role["metadata"]["namespace"] == spec.slurm.namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["gpufleet-reconciler-slurm-token"], "verbs": ["get"]},
                             {"apiGroups": ["slinky.slurm.net"], "resources": ["tokens"],
                              "resourceNames": ["gpufleet-reconciler"], "verbs": ["patch"]}]
    binding = MOCKS.named("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "gpufleet-reconciler-slurm-token")
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-reconciler",
                                           "namespace": spec.healing.reconciler.namespace}]
    pod = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]["template"]["spec"]
    c = pod["containers"][0]
    args = c["args"]
    flag = lambda f: args[args.index(f) + 1]  # noqa: E731
    assert flag("--slurm") == "rest"
    assert flag("--slurm-url") == "http://slurm-restapi.slurm:6820"
    assert flag("--slurm-user") == "gpufleet"
    assert flag("--slurm-token-secret") == "slurm/gpufleet-reconciler-slurm-token/SLURM_JWT"
    assert "--slurm-token-file" not in args and "--slurm-jwt-key-file" not in args
    assert [v["name"] for v in pod["volumes"]] == ["policy"]  # no Secret mounted


def test_reconciler_and_operator_run_on_the_declared_system_pool():
    spec = build("prod")
    pod = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-restriction.kubernetes.io/gpufleet-system": "true"} == spec.system_pool.node_selector
    rel = next(r for r in MOCKS.of_type("kubernetes:helm.sh/v3:Release") if r.name == "prod-slurm-operator")
    for part in ("operator", "webhook"):
        assert rel.inputs["values"][part]["nodeSelector"] == {"node-restriction.kubernetes.io/gpufleet-system": "true"}


def _checksum(spec, webhook: str = "https://hooks.example.com/a") -> str:
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        secrets = {k: pulumi.Output.secret(f"{SECRET_VALUE}-{k}") for k in spec.secret_keys()}
        secrets["slackWebhookUrl"] = pulumi.Output.secret(webhook)
        GpuFleet("prod", GpuFleetArgs(spec, secrets))

    program()
    tpl = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]["template"]
    return tpl["metadata"]["annotations"]["gpufleet.io/config-checksum"]


def test_a_policy_or_webhook_change_rolls_the_reconciler():
    spec = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    base = _checksum(spec)
    assert len(base) == 64 and base == _checksum(spec)  # stable: no roll without a change
    longer = spec.model_copy(update={"healing": spec.healing.model_copy(update={"grace_period_seconds": 300})})
    assert _checksum(longer) != base
    assert _checksum(spec, "https://hooks.example.com/rotated") != base
    assert "hooks.example.com" not in base


def test_irsa_role_and_the_alert_on_undelivered_pages():
    spec = build("prod")
    sa = MOCKS.named("kubernetes:core/v1:ServiceAccount", "gpufleet-reconciler").inputs["metadata"]
    assert sa["annotations"]["eks.amazonaws.com/role-arn"] == spec.healing.reconciler.iam_role_arn
    (rule,) = MOCKS.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    alerts = {r["alert"]: r for g in rule.inputs["spec"]["groups"] for r in g["rules"]}
    page = alerts["GpuFleetNotificationFailed"]
    assert "gpufleet_notification_failures_total" in page["expr"] and page["labels"]["severity"] == "critical"
    build("local")  # no Prometheus operator there: no rule, no IRSA
    assert not MOCKS.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert "annotations" not in MOCKS.named("kubernetes:core/v1:ServiceAccount", "gpufleet-reconciler").inputs["metadata"]


def test_aws_calls_need_a_named_iam_role():
    from gpufleet.fleetspec import SpecError, parse_fleet

    doc = {"environment": "x", "cluster": {"kind": "kubeconfig"},
           "pools": [{"name": "a", "node_type": "p5", "gpu_model": "H", "nodes": 1, "spares": 1,
                      "provider": "aws-asg", "aws": {"asg_name": "g"}}],
           "slurm": {"partitions": [{"name": "p", "pools": ["a"]}]}}
    with pytest.raises(SpecError, match="healing.reconciler.iam_role_arn"):
        parse_fleet(doc)


def test_the_agent_reads_the_policy_the_reconciler_reads_and_rolls_when_its_faults_change():
    from gpufleet.fleetspec import CONFIG_KEY, parse_fleet

    spec = build("prod")
    ds = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs["spec"]["template"]
    (c,) = ds["spec"]["containers"]
    assert c["args"][c["args"].index("--policy") + 1] == "/etc/gpufleet/fleet.json" and "--condition" not in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["policy"]["mountPath"] == "/etc/gpufleet" and mounts["policy"]["readOnly"]
    volumes = {v["name"]: v for v in ds["spec"]["volumes"]}
    # the agent's copy of the policy, in its own namespace, is the reconciler's policy
    cms = {r.inputs["metadata"]["name"]: r.inputs for r in MOCKS.of_type("kubernetes:core/v1:ConfigMap")}
    assert cms["gpufleet-agent-policy"]["metadata"]["namespace"] == spec.healing.reconciler.agent_namespace
    assert cms["gpufleet-agent-policy"]["data"] == cms["gpufleet-policy"]["data"]
    assert volumes["policy"]["configMap"]["name"] == "gpufleet-agent-policy"
    before = ds["metadata"]["annotations"]["gpufleet.io/config-checksum"]

    doc = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"][CONFIG_KEY]
    doc["healing"]["max_concurrent"] = 3  # not the agent's business: no roll
    build_spec(parse_fleet(doc), "prod")
    same = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs["spec"]["template"]
    assert same["metadata"]["annotations"]["gpufleet.io/config-checksum"] == before
    doc["healing"]["faults"] = {"actions": {"xid": {94: "reset-gpu"}}}  # the agent's: the DaemonSet rolls
    build_spec(parse_fleet(doc), "prod")
    rolled = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs["spec"]["template"]
    assert rolled["metadata"]["annotations"]["gpufleet.io/config-checksum"] != before
    role = MOCKS.named("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "gpufleet-agent").inputs["rules"]
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in role
    assert spec.healing.faults.actions.xid == {}
# --- trust boundaries (issue 24): namespaces, the agent, admission, network ---------------------------

NS_TYPE = "kubernetes:core/v1:Namespace"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAPB = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _enforced(name: str) -> str:
    return MOCKS.named(NS_TYPE, name).inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]


def test_namespaces_by_trust():
    """The reconciler's namespace is restricted; the agent has a privileged one of its own; Slurm's (its slurmd
    runs privileged) says so too: no namespace of the stack is left without a Pod Security level."""
    spec = build("prod")
    dep = spec.healing.reconciler
    assert (_enforced(dep.namespace), _enforced(dep.agent_namespace)) == ("restricted", "privileged")
    assert _enforced(spec.slurm.namespace) == "privileged"
    for r in MOCKS.of_type(NS_TYPE):
        assert r.inputs["metadata"]["labels"].get("pod-security.kubernetes.io/enforce"), r.name
    ds = MOCKS.named("kubernetes:apps/v1:DaemonSet", "gpufleet-agent").inputs
    assert ds["metadata"]["namespace"] == dep.agent_namespace
    sa = MOCKS.named("kubernetes:core/v1:ServiceAccount", "gpufleet-agent").inputs
    assert sa["metadata"]["namespace"] == dep.agent_namespace
    # nothing privileged, no host path and no host namespace in the reconciler's namespace
    for r in MOCKS.resources:
        if r.inputs.get("metadata", {}).get("namespace") == dep.namespace and "template" in r.inputs.get("spec", {}):
            pod = r.inputs["spec"]["template"]["spec"]
            assert not any(pod.get(h) for h in ("hostNetwork", "hostPID", "hostIPC")), r.name
            assert not any("hostPath" in v for v in pod.get("volumes", [])), r.name


def test_locally_the_reconcilers_namespace_admits_the_host_network_its_pods_need():
    from gpufleet.components.reconciler import HostNetworkApi

    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    MOCKS.resources.clear()

    @pulumi.runtime.test
    def program():
        secrets = {k: pulumi.Output.secret("x") for k in spec.secret_keys()}
        GpuFleet("local", GpuFleetArgs(spec, secrets, local_kubeconfig="/tmp/kubeconfig",
                                       host_network_api=HostNetworkApi("127.0.0.1", 6443)))

    program()
    ns = MOCKS.named(NS_TYPE, spec.healing.reconciler.namespace).inputs["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "privileged"  # hostNetwork: only privileged admits it
    assert ns["pod-security.kubernetes.io/warn"] == "restricted"     # ... and says what restricted would refuse


def _without_repairs(doc: dict) -> dict:
    """The agent's kernel-log reading alone: the repair loop (on by default) adds hostPID and privilege."""
    doc["healing"].setdefault("repair", {})["enabled"] = False
    return doc


def test_the_agent_without_a_kmsg_device_is_privileged_with_kmsg_read_only_and_nothing_else():
    from gpufleet.components.agent import agent_pod_spec
    from gpufleet.fleetspec.models import FleetSpec

    doc = _without_repairs(load_stack_file(ROOT / "Pulumi.prod.yaml").fleet.model_dump(mode="json"))
    pod = agent_pod_spec(FleetSpec.model_validate(doc))
    (c,) = pod["containers"]
    # root: a non-root process holds none of a privileged container's capabilities (no CAP_SYSLOG)
    assert c["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0,
                                    "runAsNonRoot": False}
    assert pod["volumes"] == [{"name": "policy", "configMap": {"name": "gpufleet-agent-policy"}},
                              {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}]
    assert c["volumeMounts"] == [{"name": "policy", "mountPath": "/etc/gpufleet", "readOnly": True},
                                 {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}]
    assert not any(pod.get(h) for h in ("hostNetwork", "hostPID", "hostIPC"))


def test_the_agent_with_a_kmsg_device_runs_unprivileged_with_cap_syslog_only():
    from gpufleet.components.agent import agent_pod_spec

    doc = _without_repairs(load_stack_file(ROOT / "Pulumi.prod.yaml").fleet.model_dump(mode="json"))
    doc["healing"]["reconciler"]["agent_kmsg_device"] = "squat.ai/kmsg"
    from gpufleet.fleetspec.models import FleetSpec

    pod = agent_pod_spec(FleetSpec.model_validate(doc))
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is False and c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert c["resources"]["limits"]["squat.ai/kmsg"] == "1"
    assert [v["name"] for v in pod["volumes"]] == [m["name"] for m in c["volumeMounts"]] == ["policy"]  # no host path


def test_admission_policies_bind_each_identity():
    spec = build("prod")
    dep = spec.healing.reconciler
    policies = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in MOCKS.of_type(VAP)}
    bindings = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in MOCKS.of_type(VAPB)}
    assert set(policies) == set(bindings) == {f"{dep.namespace}-reconciler-pods", f"{dep.namespace}-reconciler-nodes",
                                              f"{dep.namespace}-reconciler-pod-deletion",
                                              f"{dep.namespace}-reconciler-jobs",
                                              f"{dep.namespace}-reconciler-token-nudge",
                                              f"{dep.agent_namespace}-agent-own-node",
                                              f"{dep.agent_namespace}-agent-own-events",
                                              f"{dep.namespace}-kubelet-membership",
                                              f"{dep.namespace}-kubelet-events"}
    for name, b in bindings.items():
        assert b == {"policyName": name, "validationActions": ["Deny"]}
        assert policies[name]["failurePolicy"] == "Fail"
    who = {n: p["matchConditions"][0]["expression"] for n, p in policies.items()}
    assert who[f"{dep.agent_namespace}-agent-own-node"] == who[f"{dep.agent_namespace}-agent-own-events"] == \
        f'request.userInfo.username == "system:serviceaccount:{dep.agent_namespace}:gpufleet-agent"'
    assert who[f"{dep.namespace}-reconciler-nodes"] == \
        f'request.userInfo.username == "system:serviceaccount:{dep.namespace}:gpufleet-reconciler"'
    assert who[f"{dep.namespace}-kubelet-membership"] == who[f"{dep.namespace}-kubelet-events"] == \
        'request.userInfo.username.startsWith("system:node:")'
    deletion = policies[f"{dep.namespace}-reconciler-pod-deletion"]["validations"][0]["expression"]
    assert all(f'"{c}"' in deletion for c in spec.borrower_classes())
    jobs = policies[f"{dep.namespace}-reconciler-jobs"]
    assert who[f"{dep.namespace}-reconciler-jobs"] == who[f"{dep.namespace}-reconciler-nodes"]
    assert jobs["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]
    # the image the health-check Jobs run (reconciler/adapters/health_checks.py job_manifest) and no other
    assert any(f'c.image == "{spec.healing.health_check_image()}"' in v["expression"] for v in jobs["validations"])



def test_the_agents_events_are_about_its_own_node():
    """The agent creates Events (components/agent.py agent_rules; reconciler/adapters/kube.py node_event): the
    policy keys them, core/v1 and events.k8s.io/v1 alike, on the node its token names, as it keys node writes."""
    from gpufleet.components.admission import NODE_NAME_KEY, agent_events_policy
    from gpufleet.components.agent import agent_rules, agent_username

    spec = build("prod")
    dep = spec.healing.reconciler
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in agent_rules()
    policies = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in MOCKS.of_type(VAP)}
    events = policies[f"{dep.agent_namespace}-agent-own-events"]
    assert events == agent_events_policy(spec, agent_username(spec))["spec"]
    assert events["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [g], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["events"]}
        for g in ("", "events.k8s.io")]
    own, where = (v["expression"] for v in events["validations"])
    assert own == ("variables.tokenNode.size() == 1 && variables.about.?kind.orValue('') == 'Node' && "
                   "variables.about.?name.orValue('') == variables.tokenNode[0]")
    assert where == "request.namespace == 'default'"  # where node_event writes them, and `gpufleet why` reads them
    variables = {v["name"]: v["expression"] for v in events["variables"]}
    assert variables["tokenNode"] == f'request.userInfo.extra[?"{NODE_NAME_KEY}"].orValue([])'
    assert "object.?regarding" in variables["about"] and "object.?involvedObject" in variables["about"]
    node = policies[f"{dep.agent_namespace}-agent-own-node"]
    assert {"name": "tokenNode", "expression": variables["tokenNode"]} in node["variables"]


def test_the_status_subresource_is_judged_for_the_reconciler_as_for_the_agent():
    """The reconciler patches nodes/status (a repaired node's GPU condition): its node policy judges that
    subresource too, with the agent's rule (only the GPU condition changes), not only the node itself."""
    spec = build("prod")
    dep = spec.healing.reconciler
    policies = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in MOCKS.of_type(VAP)}
    rec, agent = policies[f"{dep.namespace}-reconciler-nodes"], policies[f"{dep.agent_namespace}-agent-own-node"]
    assert rec["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes", "nodes/status"]
    status_rule = next(v["expression"] for v in agent["validations"] if "variables.subResource != 'status'" in v["expression"])
    assert status_rule in [v["expression"] for v in rec["validations"]]
    assert {"name": "subResource", "expression": "request.?subResource.orValue('')"} in rec["variables"]
    # the status subresource resets only the spec (nodeStatusStrategy.PrepareForUpdate): no rule of any policy
    # lets metadata through because the request came by nodes/status
    for name, p in policies.items():
        for v in p["validations"]:
            assert "variables.subResource == 'status' ||" not in v["expression"], (name, v["message"])

def test_network_policies_for_the_reconciler_the_agent_and_slurmrestd():
    spec = build("prod")
    dep = spec.healing.reconciler
    pols = {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["spec"]
            for r in MOCKS.of_type(NETPOL)}
    assert set(pols) == {(dep.namespace, "gpufleet-default-deny"), (dep.namespace, "gpufleet-reconciler"),
                         (dep.agent_namespace, "gpufleet-default-deny"), (dep.agent_namespace, "gpufleet-agent"),
                         (spec.slurm.namespace, "slurmrestd")}
    rec = pols[(dep.namespace, "gpufleet-reconciler")]
    ports = {p["port"] for e in rec["egress"] for p in e["ports"]}
    assert ports == {53, 443, 6443, 6820}  # DNS, the API server (and HTTPS), slurmrestd
    assert rec["ingress"] == [{"from": [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}}],
        "ports": [{"protocol": "TCP", "port": 9102}]}]
    agent = pols[(dep.agent_namespace, "gpufleet-agent")]
    assert agent["ingress"] == [] and {p["port"] for e in agent["egress"] for p in e["ports"]} == {53, 443, 6443}
    rest = pols[(spec.slurm.namespace, "slurmrestd")]
    assert rest["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "slurmrestd"}}
    (only,) = rest["ingress"]
    assert only["from"] == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [dep.namespace]}]},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpufleet-reconciler"}}}]
    assert {p["port"] for e in rest["egress"] for p in e["ports"]} == {53, 6817, 6819}


def test_the_probes_have_a_port_of_their_own():
    build("prod")
    c = MOCKS.named("kubernetes:apps/v1:Deployment", "gpufleet-reconciler").inputs["spec"]["template"]["spec"][
        "containers"][0]
    assert c["livenessProbe"]["httpGet"]["port"] == c["readinessProbe"]["httpGet"]["port"] == 9103
    assert c["args"][c["args"].index("--health-port") + 1] == "9103"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9102, "health": 9103}


def test_slurm_images_are_pinned_by_the_digests_the_stack_file_records():
    doc = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet.model_dump(mode="json")
    digest = "sha256:" + "cd" * 32
    doc["slurm"]["image_digests"] = {"slurmctld": digest}
    from gpufleet.fleetspec.models import FleetSpec

    build_spec(FleetSpec.model_validate(doc), "prod")
    (ctl,) = MOCKS.of_type(CR + "Controller")
    assert ctl.inputs["spec"]["slurmctld"]["image"].endswith(f":{doc['slurm']['image_tag']}@{digest}")
    (rest,) = MOCKS.of_type(CR + "RestApi")
    assert "@" not in rest.inputs["spec"]["slurmrestd"]["image"]  # no digest recorded for it: by tag


def test_the_dashboard_configmap_is_declared_when_the_spec_asks_for_it():
    build("local")  # healing.grafana_dashboard: true
    (cm,) = [r for r in MOCKS.of_type("kubernetes:core/v1:ConfigMap")
             if r.inputs["metadata"]["name"] == "gpufleet-dashboard"]
    assert cm.inputs["metadata"]["labels"][labels.GRAFANA_DASHBOARD] == "1"
    assert json.loads(cm.inputs["data"]["gpufleet.json"])["uid"] == "gpufleet-fleet-health"
    build("prod")  # not asked
    assert not [r for r in MOCKS.of_type("kubernetes:core/v1:ConfigMap")
                if r.inputs["metadata"]["name"] == "gpufleet-dashboard"]


def test_the_reconcilers_slurm_user_is_declared_by_a_job_with_the_admin_level_its_calls_need():
    """SlurmUsers: a Job in the Slurm namespace runs sacctmgr (Slinky's slurmctld image) as the SlurmUser with the
    operator's slurm.conf and the Slurm key, after the Accounting; its script adds the Token's user with
    AdminLevel Administrator (slurmctld's validate_super_user for node updates and admin comments) and
    fails unless accounting shows that level."""
    spec = build("prod")
    job = MOCKS.named("kubernetes:batch/v1:Job", "gpufleet-slurm-users").inputs
    assert job["metadata"]["namespace"] == spec.slurm.namespace
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}  # slurmdbd may come later; it retries
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure" and pod["nodeSelector"] == spec.system_pool.node_selector
    assert pod["securityContext"]["runAsUser"] == 401 and pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == spec.slurm.image("slurmctld")
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    sources = next(v for v in pod["volumes"] if v["name"] == "slurm")["projected"]["sources"]
    assert {"configMap": {"name": "slurm-config"}} in sources  # the operator's slurm.conf (controller_keys.go)
    assert any(src.get("secret", {}).get("name") == "slurm-auth-slurm" for src in sources)
    script = MOCKS.named("kubernetes:core/v1:ConfigMap", "gpufleet-slurm-users").inputs["data"]["ensure-users.sh"]
    assert c["command"] == ["/bin/sh", "/etc/gpufleet/ensure-users.sh"]
    assert "user=gpufleet\nlevel=Administrator\n" in script
    assert 'sacctmgr -i add user name="$user" account=root adminlevel="$level"' in script
    assert 'set adminlevel="$level"' in script and "exit 1" in script
    token = MOCKS.named(CR + "Token", "gpufleet-reconciler").inputs["spec"]
    assert token["username"] == spec.slurm.reconciler_user == "gpufleet"


def test_a_local_stack_with_the_slurm_user_declares_no_users_job():
    """root or the SlurmUser (the local cluster only) need no accounting entry: no Job."""
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"reconciler_user": "slurm"})})
    build_spec(spec, "local")
    assert not MOCKS.of_type("kubernetes:batch/v1:Job")
    assert MOCKS.named(CR + "Token", "gpufleet-reconciler").inputs["spec"]["username"] == "slurm"


def test_the_reconciler_gets_https_egress_only_where_something_needs_it():
    """HTTPS beyond the API server is for AWS (an aws-asg pool, SNS) and webhooks: a stack with neither gets no
    0.0.0.0/0 HTTPS peer; prod (aws-asg pools) keeps the one `network.https_egress_cidrs` names."""
    from gpufleet.components.network import reconciler_policy
    from gpufleet.fleetspec.models import FleetSpec

    def https_peers(spec) -> list:
        return [e for e in reconciler_policy(spec)["spec"]["egress"] if e["ports"] == [{"protocol": "TCP", "port": 443}]]

    prod = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet
    assert [to["ipBlock"]["cidr"] for e in https_peers(prod) for to in e["to"]] == prod.network.https_egress_cidrs
    doc = load_stack_file(ROOT / "Pulumi.local.yaml").fleet.model_dump(mode="json")
    doc["healing"]["notifications"] = []
    quiet = FleetSpec.model_validate(doc)
    assert all(p.provider != "aws-asg" for p in quiet.pools) and https_peers(quiet) == []
    doc["healing"]["notifications"] = [{"type": "sns", "name": "oncall",
                                        "topic_arn": "arn:aws:sns:us-east-1:123456789012:oncall"}]
    assert https_peers(FleetSpec.model_validate(doc))


def test_the_security_models_privilege_figures_are_the_renders():
    """The security model's figures (docs/security.md: admission validations per policy, egress peers of 0.0.0.0/0) are counted
    from what prod renders, so they cannot drift from it."""
    import re

    from gpufleet.components.admission import policies
    from gpufleet.components.network import network_policies

    spec = build("prod")
    text = (ROOT / "docs" / "security.md").read_text()
    found = {p["metadata"]["name"]: len(p["spec"]["validations"]) for p in policies(spec, "r", "a")}
    dep = spec.healing.reconciler
    m = re.search(r"(\d+) policies,\s+(\d+) validations: the reconciler's pods (\d+), Jobs (\d+), nodes (\d+), pod "
                  r"deletions (\d+), Token (\d+); the agent's node (\d+), Events (\d+);\s+kubelets' membership (\d+), Events (\d+)\.", text)
    assert m, "docs/security.md's admission figures"
    order = [f"{dep.namespace}-reconciler-pods", f"{dep.namespace}-reconciler-jobs", f"{dep.namespace}-reconciler-nodes",
             f"{dep.namespace}-reconciler-pod-deletion", f"{dep.namespace}-reconciler-token-nudge",
             f"{dep.agent_namespace}-agent-own-node",
             f"{dep.agent_namespace}-agent-own-events", f"{dep.namespace}-kubelet-membership",
             f"{dep.namespace}-kubelet-events"]
    assert sorted(order) == sorted(found)
    assert [int(g) for g in m.groups()] == [len(found), sum(found.values())] + [found[n] for n in order]
    wide = [e for p in network_policies(spec) for e in p["spec"].get("egress", [])
            for to in e.get("to", []) if to.get("ipBlock", {}).get("cidr") == "0.0.0.0/0"]
    assert f"**NetworkPolicy egress peers of `0.0.0.0/0`**: {len(wide)} by default" in text
