"""The policy pack's rules, without the engine: each rule on a passing and a failing resource,
then every rule over what the real components declare for Pulumi.prod.yaml under Pulumi's mocks.

Rules get pulumi_policy's own ResourceValidationArgs / StackValidationArgs with props wrapped in
the engine's unknown-checking proxy, as the engine hands them over. (A PolicyPack is never built
here: its constructor starts a gRPC server and blocks.)
"""
from __future__ import annotations

import copy
import json
from datetime import date
from pathlib import Path

import pulumi
import pytest
from pulumi_policy import PolicyResource, ResourceValidationArgs, StackValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.policies.rules import BY_NAME, RULES, build_policies
from gpufleet.policies.rules import opt_out

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "policies" / "config"
DIGEST = "sha256:" + "ab" * 32

DEP = "kubernetes:apps/v1:Deployment"
DS = "kubernetes:apps/v1:DaemonSet"
STS = "kubernetes:apps/v1:StatefulSet"
JOB = "kubernetes:batch/v1:Job"
CM = "kubernetes:core/v1:ConfigMap"
NODESET = "kubernetes:slinky.slurm.net/v1beta1:NodeSet"
CONTROLLER = "kubernetes:slinky.slurm.net/v1beta1:Controller"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
CRB = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
RB = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"


def env_config(env: str) -> dict[str, dict]:
    """policies/config/<env>.json: rule -> (level, config without the level)."""
    raw = json.loads((CONFIG_DIR / f"{env}.json").read_text())
    return {name: {k: v for k, v in c.items() if k != "enforcementLevel"} for name, c in raw.items()}


def levels(env: str) -> dict[str, str]:
    return {name: c["enforcementLevel"] for name, c in json.loads((CONFIG_DIR / f"{env}.json").read_text()).items()}


def run(rule: str, typ: str, props: dict, config: dict | None = None, name: str = "res") -> list[str]:
    """Validate one resource with one rule; the messages it reported."""
    got: list[str] = []
    args = ResourceValidationArgs(typ, unknown_checking_proxy(copy.deepcopy(props)),
                                  f"urn:pulumi:test::gpufleet::{typ}::{name}", name, None, None, config)
    BY_NAME[rule].validate(args, lambda msg, urn=None: got.append(msg))
    return got


def run_stack(rule: str, resources: list[tuple[str, dict]], config: dict | None = None) -> list[str]:
    got: list[str] = []
    res = [PolicyResource(typ, unknown_checking_proxy(copy.deepcopy(props)), f"urn:pulumi:test::gpufleet::{typ}::r{i}",
                          f"r{i}", None, None, None, [], {}) for i, (typ, props) in enumerate(resources)]
    BY_NAME[rule].validate(StackValidationArgs(res, config), lambda msg, urn=None: got.append(msg))
    return got


def meta(name: str, **extra) -> dict:
    return {"name": name, "namespace": "gpufleet-system", "labels": {"app.kubernetes.io/part-of": "gpufleet"}, **extra}


def container(name="main", image=f"ghcr.io/gpufleet/reconciler@{DIGEST}", **extra) -> dict:
    return {"name": name, "image": image,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
            **extra}


def workload(name="app", containers=None, pod_labels=None, pod_annotations=None, volumes=None, **pod) -> dict:
    tmeta = {"labels": {"app": name, **(pod_labels or {})}}
    if pod_annotations is not None:
        tmeta["annotations"] = pod_annotations
    return {"metadata": meta(name), "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
        "metadata": tmeta,
        "spec": {"containers": containers or [container()], **({"volumes": volumes} if volumes else {}), **pod}}}}


def test_pack_declares_every_rule_once_with_a_schema_that_matches_the_configs():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) == 14
    policies = build_policies()
    assert [p.name for p in policies] == names
    assert {type(p).__name__ for p in policies} == {"ResourceValidationPolicy", "StackValidationPolicy"}
    for env in ("local", "staging", "prod"):
        cfg = json.loads((CONFIG_DIR / f"{env}.json").read_text())
        assert set(cfg) == set(names), env
        for name, c in cfg.items():
            assert c["enforcementLevel"] in ("advisory", "mandatory", "disabled")
            assert set(c) - {"enforcementLevel"} <= set(BY_NAME[name].config_schema), (env, name)
    assert set(levels("local").values()) == {"advisory"}
    assert set(levels("prod").values()) == {"mandatory"}


# --- opt-out labels ---------------------------------------------------------------------------

OPT = labels.DEFAULT_OPT_OUT


@pytest.fixture
def fixed_today(monkeypatch):
    monkeypatch.setattr(opt_out, "today", lambda: date(2025, 6, 1))


def test_opt_out_with_reason_and_future_expiry_passes(fixed_today):
    ok = workload("train", pod_labels={OPT: "true"},
                  pod_annotations={labels.OPT_OUT_REASON: "3-day run, no checkpoints; ask @ml-infra",
                                   labels.OPT_OUT_EXPIRES: "2025-06-20"})
    assert run("opt-out-labels", JOB, ok) == []
    assert run("opt-out-labels", DEP, workload("plain")) == []  # no opt-out at all


def test_opt_out_without_reason_or_expiry_fails(fixed_today):
    msgs = run("opt-out-labels", STS, workload("train", pod_labels={OPT: "true"}))
    assert len(msgs) == 2
    assert any(labels.OPT_OUT_REASON in m and "StatefulSet gpufleet-system/train" in m for m in msgs)
    assert any(labels.OPT_OUT_EXPIRES in m and "YYYY-MM-DD" in m for m in msgs)


def test_opt_out_expired_wrong_value_and_too_long_fail(fixed_today):
    ann = {labels.OPT_OUT_REASON: "why"}
    expired = run("opt-out-labels", DEP, workload("a", pod_labels={OPT: "true"},
                                                   pod_annotations={**ann, labels.OPT_OUT_EXPIRES: "2025-05-31"}))
    assert len(expired) == 1 and "expired on 2025-05-31" in expired[0] and "Fix:" in expired[0]
    bad = run("opt-out-labels", DEP, workload("a", pod_labels={OPT: "yes-please"},
                                               pod_annotations={**ann, labels.OPT_OUT_EXPIRES: "2025-06-02"}))
    assert len(bad) == 1 and "not an allowed value" in bad[0]
    far = run("opt-out-labels", DEP, workload("a", pod_labels={OPT: "true"},
                                               pod_annotations={**ann, labels.OPT_OUT_EXPIRES: "2026-06-02"}),
              {"maxDays": 30})
    assert len(far) == 1 and "2025-07-01" in far[0]
    garbled = run("opt-out-labels", DEP, workload("a", pod_labels={OPT: "true"},
                                                   pod_annotations={**ann, labels.OPT_OUT_EXPIRES: "next week"}))
    assert len(garbled) == 1 and "not an ISO date" in garbled[0]


def test_opt_out_label_key_is_configurable(fixed_today):
    custom = "example.com/no-replace"
    props = workload("a", pod_labels={custom: "true"})
    assert run("opt-out-labels", DEP, props) == []
    assert len(run("opt-out-labels", DEP, props, {"label": custom})) == 2


def test_nodeset_never_opts_out_where_forbidden(fixed_today):
    ns = {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": meta("h100"),
          "spec": {"slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.11"},
                   "template": {"metadata": {"labels": {OPT: "true"},
                                             "annotations": {labels.OPT_OUT_REASON: "r",
                                                             labels.OPT_OUT_EXPIRES: "2025-06-05"}},
                                "spec": {}}}}
    assert run("opt-out-labels", NODESET, ns) == []  # allowed outside prod, with reason and expiry
    msgs = run("opt-out-labels", NODESET, ns, {"forbidOnNodeSets": True})
    assert len(msgs) == 1 and "NodeSet gpufleet-system/h100" in msgs[0] and "remove the label" in msgs[0]
    on_object = {**ns, "metadata": {**ns["metadata"], "labels": {OPT: "true"}}, "spec": {**ns["spec"], "template": {}}}
    assert len(run("opt-out-labels", NODESET, on_object, {"forbidOnNodeSets": True})) == 1


def test_unknown_values_during_preview_are_skipped_not_failed(fixed_today):
    props = workload("a", pod_labels={OPT: "true"},
                     pod_annotations={labels.OPT_OUT_REASON: UNKNOWN_STRING_VALUE,
                                      labels.OPT_OUT_EXPIRES: UNKNOWN_STRING_VALUE})
    assert run("opt-out-labels", DEP, props) == []


# --- spares -----------------------------------------------------------------------------------

def capacity(pool: str, nodes: int, spares: int) -> dict:
    return {"metadata": meta(f"gpufleet-pool-{pool}"),
            "data": {"capacity.json": json.dumps({"pool": pool, "nodes": nodes, "spares": spares})}}


def _membership(selector: dict, provider: str = "kubernetes-spares") -> dict:
    return {"metadata": meta("gpufleet-pool-l40s"), "data": {"capacity.json": json.dumps(
        {"pool": "l40s", "nodes": 2, "spares": 1, "provider": provider, "memberSelector": selector})}}


@pytest.mark.parametrize("selector,needle", [
    ({"node-restriction.kubernetes.io/node-group": "l40s"}, None),
    ({"eks.amazonaws.com/nodegroup": "l40s"}, "labels a kubelet may set on its own node"),
    ({"node-restriction.kubernetes.io/node-group": "l40s", "gpufleet.io/pool": "l40s"}, "['gpufleet.io/pool']"),
    ({}, "declares no member_selector"),
])
def test_pool_members_are_selected_on_labels_no_kubelet_can_set(selector, needle):
    msgs = run("pool-membership-declared", CM, _membership(selector))
    assert (msgs == []) if needle is None else (len(msgs) == 1 and needle in msgs[0]), msgs


def test_pool_with_spares_passes_and_without_fails():
    assert run("gpu-pool-spares", CM, capacity("h100", 8, 1)) == []
    msgs = run("gpu-pool-spares", CM, capacity("h100", 8, 0))
    assert len(msgs) == 1
    assert "ConfigMap gpufleet-system/gpufleet-pool-h100" in msgs[0] and "spares: 1" in msgs[0]
    assert run("gpu-pool-spares", CM, {"metadata": meta("other"), "data": {}}) == []  # not a pool


def test_prod_spare_ratio_rounds_up():
    prod = env_config("prod")["gpu-pool-spares"]
    assert run("gpu-pool-spares", CM, capacity("h100-a", 128, 7), prod) == []   # 0.05 * 128 = 6.4 -> 7
    msgs = run("gpu-pool-spares", CM, capacity("h100-a", 128, 6), prod)
    assert len(msgs) == 1 and "needs 7" in msgs[0] and "`spares: 7`" in msgs[0]
    assert run("gpu-pool-spares", CM, capacity("h100-a", 128, 6)) == []  # no ratio outside prod


def test_malformed_capacity_fails():
    bad = {"metadata": meta("gpufleet-pool-x"), "data": {"capacity.json": "{not json"}}
    assert "capacity.json" in run("gpu-pool-spares", CM, bad)[0]


# --- healing ----------------------------------------------------------------------------------

def policy_cm(**healing) -> dict:
    h = {"enabled": True, "dry_run": False, "grace_period_seconds": 120, "max_unhealthy_fraction": 0.2, **healing}
    return {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": json.dumps({"healing": h})}}


def test_healing_policy_passes_and_fails():
    prod = env_config("prod")["healing-enabled"]
    assert run("healing-enabled", CM, policy_cm(), prod) == []
    off = run("healing-enabled", CM, policy_cm(enabled=False), prod)
    assert len(off) == 1 and "`enabled: true`" in off[0]
    assert run("healing-enabled", CM, policy_cm(enabled=False)) == []  # only prod requires it
    assert "dry-run" in run("healing-enabled", CM, policy_cm(dry_run=True), prod)[0]
    short = run("healing-enabled", CM, policy_cm(grace_period_seconds=5))
    assert len(short) == 1 and "between 30 and 600" in short[0]
    assert len(run("healing-enabled", CM, policy_cm(grace_period_seconds=900))) == 1
    assert len(run("healing-enabled", CM, policy_cm(max_unhealthy_fraction=None))) == 1
    assert len(run("healing-enabled", CM, policy_cm(max_unhealthy_fraction=0.5), prod)) == 1  # prod caps at 0.25


def test_stack_with_pools_must_deploy_the_reconciler():
    pools = [(CM, capacity("h100", 8, 1))]
    full = pools + [(DEP, workload("gpufleet-reconciler")), (DS, workload("gpufleet-agent")), (CM, policy_cm())]
    assert run_stack("reconciler-deployed", full) == []
    assert run_stack("reconciler-deployed", [(DEP, workload("web"))]) == []  # no pools, nothing to heal
    msgs = run_stack("reconciler-deployed", pools + [(DS, workload("gpufleet-agent")), (CM, policy_cm())])
    assert len(msgs) == 1 and "no Deployment gpufleet-reconciler" in msgs[0] and "gpufleet-pool-h100" in msgs[0]
    no_agent = pools + [(DEP, workload("gpufleet-reconciler")), (CM, policy_cm())]
    assert len(run_stack("reconciler-deployed", no_agent)) == 1
    assert run_stack("reconciler-deployed", no_agent, {"requireAgent": False}) == []


# --- lending (issue 13) ------------------------------------------------------------------------

PC = "kubernetes:scheduling.k8s.io/v1:PriorityClass"


def lending_policy(**lending) -> dict:
    """The policy ConfigMap of a fleet whose pool h100 (pools[1]) lends its spares; l40s (pools[0]) does not."""
    spec = {"spares": True, "spare_floor": 1, "reclaim_grace_seconds": 30,
            "borrowers": {"selector": {"app": "inference"}, "priority_class": "gpufleet-borrower", "priority": -1000},
            **lending}
    fleet = {"healing": {}, "pools": [{"name": "l40s", "spares": 1, "lending": None},
                                      {"name": "h100", "spares": 2, "lending": spec}]}
    return {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": json.dumps(fleet)}}


def priority_class(name="gpufleet-borrower", value=-1000, preemption="Never") -> dict:
    return {"metadata": {"name": name}, "value": value, "preemptionPolicy": preemption, "globalDefault": False}


def lending(policy: dict, *classes: dict, config: dict | None = None) -> list[str]:
    return run_stack("lending-safe", [(CM, policy), *[(PC, c) for c in classes]],
                     {**env_config("prod")["lending-safe"], **(config or {})})


def test_lending_floor_of_one_unlent_spare():
    assert lending(lending_policy(spare_floor=1), priority_class()) == []
    assert lending(lending_policy(spares=False, idle_nodes=True, spare_floor=0), priority_class()) == []  # lends no spare
    (msg,) = lending(lending_policy(spare_floor=0), priority_class())
    assert "pool 'h100'" in msg and "gpufleet:fleet.pools[1].lending.spare_floor: 0" in msg and "spare_floor: 1" in msg


def test_lending_reclaim_grace_at_most_60_s():
    assert lending(lending_policy(reclaim_grace_seconds=60), priority_class()) == []
    (msg,) = lending(lending_policy(reclaim_grace_seconds=61), priority_class())
    assert "pool 'h100'" in msg and "pools[1].lending.reclaim_grace_seconds is 61" in msg and "at most 60" in msg
    assert lending(lending_policy(reclaim_grace_seconds=61), priority_class(), config={"maxReclaimGraceSeconds": 120}) == []


def test_borrowers_are_below_zero_and_below_every_other_class():
    others = [priority_class("training", 1000, "PreemptLowerPriority"), priority_class("batch-low", -10, "Never")]
    assert lending(lending_policy(), priority_class(value=-1000), *others) == []
    (zero,) = lending(lending_policy(), priority_class(value=0), *others[:1])
    assert "pool 'h100'" in zero and "priority 0, above -1" in zero and "pools[1].lending.borrowers.priority" in zero
    (under,) = lending(lending_policy(), priority_class(value=-5), *others)
    assert "not below the stack's PriorityClass(es) ['batch-low'] (-10)" in under and "below -10" in under
    (missing,) = lending(lending_policy(), *others)
    assert "no PriorityClass 'gpufleet-borrower'" in missing and "pools[1].lending.borrowers.priority_class" in missing


def test_borrowers_never_preempt():
    assert lending(lending_policy(), priority_class(preemption="Never")) == []
    (msg,) = lending(lending_policy(), priority_class(preemption="PreemptLowerPriority"))
    assert "pool 'h100'" in msg and "preemptionPolicy 'PreemptLowerPriority'" in msg and "Never" in msg


def test_a_stack_without_lending_or_policy_is_not_judged_here():
    no_lending = {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": json.dumps({"pools": [{"name": "a"}]})}}
    assert lending(no_lending, priority_class(value=5, preemption="PreemptLowerPriority")) == []
    assert run_stack("lending-safe", [(PC, priority_class(value=5))]) == []
    unknown = {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": UNKNOWN_STRING_VALUE}}
    assert run_stack("lending-safe", [(CM, unknown)]) == []


# --- least privilege --------------------------------------------------------------------------

def test_rbac_without_wildcards_passes_with_them_fails():
    good = {"metadata": meta("r"), "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}
    assert run("rbac-least-privilege", CLUSTER_ROLE, good) == []
    bad = {"metadata": meta("r"), "rules": [{"apiGroups": ["*"], "resources": ["nodes"], "verbs": ["*"]}]}
    msgs = run("rbac-least-privilege", ROLE, bad)
    assert len(msgs) == 2 and all("Role gpufleet-system/r" in m and "Fix:" in m for m in msgs)
    assert {m.split("contains")[0].rsplit(".", 1)[1].strip() for m in msgs} == {"verbs", "apiGroups"}


def test_no_binding_to_cluster_admin():
    ok = {"metadata": meta("b"), "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                             "name": "gpufleet-reconciler"}, "subjects": []}
    assert run("rbac-least-privilege", CRB, ok) == []
    admin = {**ok, "roleRef": {**ok["roleRef"], "name": "cluster-admin"}}
    msgs = run("rbac-least-privilege", RB, admin)
    assert len(msgs) == 1 and "cluster-admin" in msgs[0] and "RoleBinding gpufleet-system/b" in msgs[0]


def test_rbac_that_escalates_binds_impersonates_or_mints_tokens_fails():
    for verb in ("escalate", "bind", "impersonate"):
        role = {"metadata": meta("r"), "rules": [{"apiGroups": ["rbac.authorization.k8s.io"],
                                                  "resources": ["clusterroles", "users"], "verbs": ["get", verb]}]}
        msgs = run("rbac-least-privilege", CLUSTER_ROLE, role)
        assert len(msgs) == 1 and f"grants {verb!r}" in msgs[0], msgs
    mint = {"metadata": meta("r"), "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                                              "verbs": ["create"]}]}
    assert "mints a token" in run("rbac-least-privilege", ROLE, mint)[0]
    read = {"metadata": meta("r"), "rules": [{"apiGroups": ["rbac.authorization.k8s.io"],
                                              "resources": ["clusterroles"], "verbs": ["get", "list"]}]}
    assert run("rbac-least-privilege", CLUSTER_ROLE, read) == []


@pytest.mark.parametrize("rule,words", [
    # RBAC matches "*/token" as every resource's token subresource, "serviceaccounts/*" as every subresource
    ({"apiGroups": [""], "resources": ["*/token"], "verbs": ["create"]}, ["wildcard", "mints a token"]),
    ({"apiGroups": [""], "resources": ["serviceaccounts/*"], "verbs": ["create"]}, ["wildcard"]),
    ({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}, ["kubelets' API"]),
    ({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
      "verbs": ["get", "patch"]}, ["rewrites or removes the admission policies"]),
    ({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicybindings"],
      "verbs": ["delete"]}, ["rewrites or removes the admission policies"]),
    ({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
      "verbs": ["create"]}, ["rewrites or removes the admission policies"]),
])
def test_rbac_that_mints_any_token_reaches_the_kubelets_or_writes_admission_fails(rule, words):
    msgs = run("rbac-least-privilege", CLUSTER_ROLE, {"metadata": meta("r"), "rules": [rule]})
    for w in words:
        assert any(w in m for m in msgs), (w, msgs)
    assert all("Fix:" in m for m in msgs)


def test_reading_admission_configuration_passes():
    read = {"metadata": meta("r"), "rules": [{"apiGroups": ["admissionregistration.k8s.io"],
                                              "resources": ["validatingadmissionpolicies"],
                                              "verbs": ["get", "list", "watch"]}]}
    assert run("rbac-least-privilege", CLUSTER_ROLE, read) == []


KMSG = [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}}]
RO_KMSG = [{"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}]


def in_ns(body: dict, namespace: str) -> dict:
    return {**body, "metadata": {**body["metadata"], "namespace": namespace}}


def test_privileged_pods_only_in_a_namespace_set_aside_whatever_their_name():
    agent = workload("gpufleet-agent", [container(securityContext={"privileged": True}, volumeMounts=RO_KMSG)],
                     volumes=KMSG)
    assert run("pod-host-access", DS, in_ns(agent, "gpufleet-agent")) == []
    # the same DaemonSet, same name, in any other namespace: judged by what it is
    msgs = run("pod-host-access", DS, in_ns(agent, "default"))
    assert len(msgs) == 2 and any("runs privileged" in m for m in msgs) and any("/dev/kmsg" in m for m in msgs)
    assert len(run("pod-host-access", DEP, in_ns(workload("x", [container(securityContext={"privileged": True})]),
                                                  "gpufleet-system"))) == 1


def test_host_namespaces_fail_whatever_the_name_and_namespace():
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        agent = in_ns(workload("gpufleet-agent", **{host: True}), "gpufleet-agent")
        msgs = run("pod-host-access", DS, agent)
        assert len(msgs) == 1 and host in msgs[0], msgs
    # the host's PIDs for a privileged pod in the namespace set aside (the agent's repairs), and only there
    repairs = workload("gpufleet-agent", [container(securityContext={"privileged": True})], hostPID=True)
    assert run("pod-host-access", DS, in_ns(repairs, "gpufleet-agent")) == []
    msgs = run("pod-host-access", DS, in_ns(repairs, "default"))
    assert any("hostPID" in m for m in msgs) and any("runs privileged" in m for m in msgs)
    local = {"hostNetworkWorkloads": ["gpufleet-system/Deployment/gpufleet-reconciler"]}
    rec = workload("gpufleet-reconciler", hostNetwork=True)
    assert run("pod-host-access", DEP, rec, local) == []  # the local environment's, by namespace/kind/name
    assert len(run("pod-host-access", DEP, in_ns(rec, "default"), local)) == 1


def test_host_paths_only_allowed_ones_and_read_only():
    writable = workload("a", [container(securityContext={"privileged": True},
                                        volumeMounts=[{"name": "kmsg", "mountPath": "/dev/kmsg"}])], volumes=KMSG)
    msgs = run("pod-host-access", DS, in_ns(writable, "gpufleet-agent"))
    assert len(msgs) == 1 and "writable" in msgs[0] and "readOnly" in msgs[0]
    wider = workload("a", [container(volumeMounts=RO_KMSG)], volumes=KMSG + [{"name": "root", "hostPath": {"path": "/"}}])
    msgs = run("pod-host-access", DS, in_ns(wider, "gpufleet-agent"))
    assert len(msgs) == 1 and "mounts the host path /;" in msgs[0]


def test_added_capabilities_outside_the_allow_list_fail():
    def caps(*add):
        return workload("a", [container(securityContext={"capabilities": {"drop": ["ALL"], "add": list(add)}})])

    assert run("capabilities-allowed", DEP, caps("NET_BIND_SERVICE")) == []
    for bad in ("SYS_ADMIN", "ALL", "NET_ADMIN", "SYS_PTRACE", "CAP_BPF", "syslog"):
        msgs = run("capabilities-allowed", DEP, caps(bad))
        assert len(msgs) == 1 and bad in msgs[0], (bad, msgs)
    # CAP_SYSLOG in the agent's namespace only (per-namespace allow-list), however it is spelt
    assert run("capabilities-allowed", DS, in_ns(caps("SYSLOG"), "gpufleet-agent")) == []
    assert run("capabilities-allowed", DS, in_ns(caps("CAP_SYSLOG"), "gpufleet-agent")) == []
    assert len(run("capabilities-allowed", DS, in_ns(caps("SYSLOG", "NET_RAW"), "gpufleet-agent"))) == 1


SERVICE = "kubernetes:core/v1:Service"


def test_load_balancers_are_internal_for_the_controller_that_serves_them():
    from gpufleet.fleetspec.models import LB_INTERNAL, LB_SCHEME

    def svc(annotations, cls=None):
        spec = {"type": "LoadBalancer", "ports": [{"port": 22}], **({"loadBalancerClass": cls} if cls else {})}
        return {"metadata": meta("login", annotations=annotations), "spec": spec}

    both = {LB_SCHEME: "internal", LB_INTERNAL: "true"}
    assert run("load-balancers-internal", SERVICE, svc(both)) == []
    # only the scheme the AWS Load Balancer Controller reads: the in-tree controller opens it to the internet
    msgs = run("load-balancers-internal", SERVICE, svc({LB_SCHEME: "internal"}))
    assert len(msgs) == 1 and LB_INTERNAL in msgs[0]
    assert run("load-balancers-internal", SERVICE, svc({LB_SCHEME: "internal"}, "service.k8s.aws/nlb")) == []
    assert len(run("load-balancers-internal", SERVICE, svc({LB_SCHEME: "internet-facing"}, "service.k8s.aws/nlb"))) == 1
    assert "does not know" in run("load-balancers-internal", SERVICE, svc(both, "example.com/lb"))[0]
    assert run("load-balancers-internal", SERVICE, svc({}), {"internetFacing": ["gpufleet-system/Service/login"]}) == []
    login = {"metadata": meta("login"), "spec": {"service": svc({LB_SCHEME: "internal"})}}
    assert len(run("load-balancers-internal", LOGINSET, login)) == 1  # a LoginSet's SSH Service alike
    cluster_ip = {"metadata": meta("login"), "spec": {"type": "ClusterIP"}}
    assert run("load-balancers-internal", SERVICE, cluster_ip) == []


# --- supply chain -----------------------------------------------------------------------------

@pytest.mark.parametrize("image,ok", [
    ("ghcr.io/gpufleet/reconciler:0.1.0", True),
    (f"ghcr.io/gpufleet/reconciler@{DIGEST}", True),
    ("localhost:5000/gpufleet/reconciler:0.1.0", True),
    ("ghcr.io/gpufleet/reconciler:latest", False),
    ("ghcr.io/gpufleet/reconciler", False),
    ("localhost:5000/gpufleet/reconciler", False),  # a registry port is not a tag
    ("ghcr.io/gpufleet/reconciler@sha256:1234", False),
])
def test_images_pinned(image, ok):
    msgs = run("images-pinned", DEP, workload("r", [container(image=image)]))
    assert (msgs == []) is ok, msgs
    if not ok:
        assert "Deployment gpufleet-system/r" in msgs[0] and image in msgs[0] and "Fix:" in msgs[0]


def test_prod_requires_digests_the_slurm_images_too():
    prod = env_config("prod")["images-pinned"]
    tagged = workload("r", [container(image="ghcr.io/gpufleet/reconciler:0.1.0")])
    msgs = run("images-pinned", DEP, tagged, prod)
    assert len(msgs) == 1 and "requires a digest" in msgs[0]
    ctl = {"metadata": meta("slurm"), "spec": {"slurmctld": {"image": "ghcr.io/slinkyproject/slurmctld:25.11"}}}
    assert "requires a digest" in run("images-pinned", CONTROLLER, ctl, prod)[0]  # no exemption for SchedMD's
    assert run("images-pinned", CONTROLLER, ctl, {**prod, "digestExemptPrefixes": ["ghcr.io/slinkyproject/"]}) == []
    pinned = {"metadata": meta("slurm"), "spec": {"slurmctld": {
        "image": f"ghcr.io/slinkyproject/slurmctld:25.11@{DIGEST}"}}}
    assert run("images-pinned", CONTROLLER, pinned, prod) == []
    ctl_latest = {"metadata": meta("slurm"), "spec": {"slurmctld": {"image": "ghcr.io/slinkyproject/slurmctld"}}}
    assert len(run("images-pinned", CONTROLLER, ctl_latest, prod)) == 1


def _policy_configmap(**changes) -> dict:
    """The reconciler's policy ConfigMap (components/reconciler.py) for the prod spec, released, with changes."""
    return {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": prod_spec(**changes).model_dump_json()}}


@pytest.mark.parametrize("field,changes", [
    ("healing.reconciler.placeholder_image", {"healing__reconciler__placeholder_image": "registry.k8s.io/pause:3.10"}),
    ("healing.repair.health_check.image", {"healing__repair__health_check__image": "ghcr.io/acme/gpu-check:2.1"}),
])
def test_images_the_reconciler_starts_at_run_time_are_pinned_in_its_policy(field, changes):
    """The placeholders' and the health checks' images appear in no declared pod: the reconciler starts them
    from its policy, so the rule judges them there, naming the field to fix."""
    prod = env_config("prod")["images-pinned"]
    (msg,) = run("images-pinned", CM, _policy_configmap(**changes), prod)
    assert msg.startswith("ConfigMap gpufleet-system/gpufleet-policy") and "requires a digest" in msg, msg
    assert f"Fix: set {field} in the stack file to " in msg and "at run time" in msg
    image = next(iter(changes.values()))
    assert run("images-pinned", CM, _policy_configmap(**{k: f"{v}@{DIGEST}" for k, v in changes.items()}), prod) == []
    assert run("images-pinned", CM, _policy_configmap(**changes)) == []  # a tag is enough without requireDigest
    latest = run("images-pinned", CM, _policy_configmap(**{k: image.rsplit(":", 1)[0] for k in changes}))
    assert len(latest) == 1 and "no tag" in latest[0] and field in latest[0]


def test_the_health_checks_run_the_agents_image_when_they_name_none():
    """Unset, the checks run the agent's image, which its DaemonSet declares and the rule judges there: the
    policy reports it not a second time. The agent's own ConfigMap (the same spec) is not the reconciler's."""
    prod = env_config("prod")["images-pinned"]
    unreleased = {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": prod_spec(released=False).model_dump_json()}}
    assert prod_spec(released=False).healing.repair.health_check.image is None
    assert run("images-pinned", CM, unreleased, prod) == []
    agents = _policy_configmap(healing__repair__health_check__image="ghcr.io/acme/gpu-check:2.1")
    agents["metadata"]["name"] = "gpufleet-agent-policy"
    assert run("images-pinned", CM, agents, prod) == []
    unknown = {"metadata": meta("gpufleet-policy"), "data": {"fleet.json": UNKNOWN_STRING_VALUE}}
    assert run("images-pinned", CM, unknown, prod) == []  # a preview before the value is known


def test_containers_set_requests_and_limits():
    assert run("container-resources", DEP, workload("r")) == []
    bare = workload("r", [{"name": "main", "image": "x:1", "resources": {"limits": {"cpu": "1"}}}])
    msgs = run("container-resources", DEP, bare)
    assert len(msgs) == 1
    assert "requests.cpu, requests.memory, limits.memory" in msgs[0] and "container main" in msgs[0]
    nodeset = {"metadata": meta("h100"), "spec": {"slurmd": {"image": "x:1", "resources": {
        "limits": {"nvidia.com/gpu": 8}}}, "template": {"spec": {}}}}
    assert run("container-resources", NODESET, nodeset) == []  # slurmd owns the node: exempt by default
    assert len(run("container-resources", NODESET, nodeset, {"exemptContainers": []})) == 1
    sidecar = {**nodeset, "spec": {**nodeset["spec"], "template": {"spec": {"containers": [{"name": "s", "image": "y:1"}]}}}}
    assert "container s" in run("container-resources", NODESET, sidecar)[0]


# --- the real components, under Pulumi's mocks ----------------------------------------------------

class Recorder(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outputs = dict(args.inputs)
        if isinstance(outputs.get("metadata"), dict):
            outputs["metadata"] = {**outputs["metadata"]}
            outputs["metadata"].setdefault("name", args.name)
        return [args.name + "_id", outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


@pytest.fixture
def recorder():
    """Pulumi's mocks are process-global and test_components installs its own at import: borrow
    the installed monitor for this test (our recorder in place of its mocks), then give it back."""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import get_monitor

    rec = Recorder()
    monitor = get_monitor()
    if isinstance(monitor, MockMonitor):
        saved = monitor.mocks
        monitor.mocks = rec
        try:
            yield rec
        finally:
            monitor.mocks = saved
    else:
        pulumi.runtime.set_mocks(rec, preview=False)
        yield rec


def declare(rec: Recorder, spec: FleetSpec) -> list[pulumi.runtime.MockResourceArgs]:
    from gpufleet.components import GpuFleet, GpuFleetArgs

    rec.resources.clear()

    @pulumi.runtime.test
    def program():
        secrets = {k: pulumi.Output.secret(f"value-{k}") for k in spec.secret_keys()}
        GpuFleet(spec.environment, GpuFleetArgs(spec, secrets, local_kubeconfig="/tmp/kubeconfig"))

    program()
    return list(rec.resources)


def evaluate(resources: list[pulumi.runtime.MockResourceArgs], env: str) -> dict[str, list[str]]:
    """Every enabled rule over the declared resources with the env's config: rule -> messages."""
    cfg, lv = env_config(env), levels(env)
    out: dict[str, list[str]] = {}
    k8s = [r for r in resources if r.typ.startswith("kubernetes:")]
    for rule in RULES:
        if lv[rule.name] == "disabled":
            continue
        got: list[str] = []
        report = lambda msg, urn=None: got.append(msg)  # noqa: E731
        if rule.scope == "stack":
            res = [PolicyResource(r.typ, unknown_checking_proxy(copy.deepcopy(r.inputs)), f"urn:{r.typ}::{r.name}",
                                  r.name, None, None, None, [], {}) for r in k8s]
            rule.validate(StackValidationArgs(res, cfg[rule.name]), report)
        else:
            for r in k8s:
                rule.validate(ResourceValidationArgs(r.typ, unknown_checking_proxy(copy.deepcopy(r.inputs)),
                                                     f"urn:{r.typ}::{r.name}", r.name, None, None, cfg[rule.name]),
                              report)
        out[rule.name] = got
    return out


# What the release workflow (.github/workflows/release.yml) records in Pulumi.prod.yaml: gpufleet's images by
# digest, and the digest of each Slurm image at the stack's tag.
RELEASED = {"healing__reconciler__image": f"ghcr.io/gpufleet/reconciler@{DIGEST}",
            "healing__reconciler__agent_image": f"ghcr.io/gpufleet/agent@{DIGEST}",
            "slurm__image_digests": {n: DIGEST for n in ("slurmctld", "slurmd", "slurmrestd", "slurmdbd", "login")}}


def prod_spec(released: bool = True, **changes) -> FleetSpec:
    doc = load_stack_file(ROOT / "Pulumi.prod.yaml").fleet.model_dump(mode="json")
    for path, value in {**(RELEASED if released else {}), **changes}.items():
        *head, last = path.split("__")
        node = doc
        for p in head:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value
    return FleetSpec.model_validate(doc)


def test_shipped_prod_passes_every_mandatory_rule(recorder):
    resources = declare(recorder, prod_spec())
    types = {r.typ for r in resources}
    assert {DEP, DS, CM, NODESET, CLUSTER_ROLE, CRB} <= types  # the rules saw the real shapes
    result = evaluate(resources, "prod")
    mandatory = [n for n, lv in levels("prod").items() if lv == "mandatory"]
    assert set(mandatory) == set(result)
    assert {n: m for n, m in result.items() if m} == {}


def test_prod_before_a_release_is_blocked_by_its_unpinned_images_only(recorder):
    result = evaluate(declare(recorder, prod_spec(released=False)), "prod")
    assert {n for n, m in result.items() if m} == {"images-pinned"}
    # gpufleet's two and every Slurm image of prod (slurmd per pool): a tag can be moved
    pinned = result["images-pinned"]
    assert all("requires a digest" in m for m in pinned)
    assert {m.split("image '")[1].split(":")[0].rsplit("/", 1)[1] for m in pinned} == {
        "reconciler", "agent", "slurmctld", "slurmd", "login", "slurmrestd", "slurmdbd"}
    # one per declaring resource (slurmd per pool, slurmctld twice: the controller and the Slurm-user Job), 11 as
    # tests/e2e/test_preview.py counts; the reconciler's policy adds none: the placeholders' default image is
    # pinned, and the health checks, naming none, run the agent's, reported on its DaemonSet
    assert len(pinned) == 11 and not any(m.startswith("ConfigMap ") for m in pinned)


@pytest.mark.parametrize("env", ["local", "staging"])
def test_other_shipped_environments_are_clean_too(recorder, env):
    spec = load_stack_file(ROOT / f"Pulumi.{env}.yaml").fleet
    result = evaluate(declare(recorder, spec), env)
    assert {n: m for n, m in result.items() if m} == {}


@pytest.mark.parametrize("changes,rule,needle", [
    ({"healing__reconciler__image": "ghcr.io/gpufleet/reconciler:latest"}, "images-pinned", ":latest"),
    ({"healing__reconciler__agent_image": "ghcr.io/gpufleet/agent:0.1.0"}, "images-pinned", "requires a digest"),
    ({"pools__3__spares": 0}, "gpu-pool-spares", "'l40s' keeps 0 spare"),
    ({"pools__0__spares": 2}, "gpu-pool-spares", "needs 7"),
    ({"healing__enabled": False}, "healing-enabled", "healing is disabled"),
    ({"healing__grace_period_seconds": 3000}, "healing-enabled", "grace_period_seconds"),
    ({"slurm__login__service_annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
     "load-balancers-internal", "aws-load-balancer-internal"),
    ({"slurm__image_digests": {}}, "images-pinned", "slurmctld"),
    ({"healing__reconciler__placeholder_image": "registry.k8s.io/pause:3.10"}, "images-pinned",
     "healing.reconciler.placeholder_image"),
    ({"healing__repair__health_check__image": "ghcr.io/acme/gpu-check:2.1"}, "images-pinned",
     "healing.repair.health_check.image"),
    ({"healing__reconciler__agent_namespace": "kube-system"}, "pod-host-access", "runs privileged"),
    ({"pools__3__member_selector": {}}, "pool-membership-declared", "'l40s' (kubernetes-spares) declares no"),
    ({"pools__0__lending__spare_floor": 0}, "lending-safe", "pools[0].lending.spare_floor: 0"),
    ({"pools__0__lending__reclaim_grace_seconds": 120}, "lending-safe", "reclaim_grace_seconds is 120"),
    ({"pools__0__lending__borrowers__priority": 0}, "lending-safe", "'h100-a''s borrowers run at priority 0"),
])
def test_violating_prod_variants_fail_the_named_rule(recorder, changes, rule, needle):
    result = evaluate(declare(recorder, prod_spec(**changes)), "prod")
    failing = {n for n, m in result.items() if m}
    assert failing == {rule}, result
    assert any(needle in m for m in result[rule]), result[rule]
    assert levels("prod")[rule] == "mandatory"


LOGINSET = "kubernetes:slinky.slurm.net/v1beta1:LoginSet"
ACCOUNTING = "kubernetes:slinky.slurm.net/v1beta1:Accounting"
RESTAPI = "kubernetes:slinky.slurm.net/v1beta1:RestApi"
SA = "kubernetes:core/v1:ServiceAccount"


def test_slinky_resources_need_sssd_database_and_accounting_ref():
    login = {"metadata": meta("login"), "spec": {"controllerRef": {"name": "slurm"}}}
    acct = {"metadata": meta("accounting"), "spec": {"storageConfig": {"host": "mariadb"}}}
    ctl = {"metadata": meta("slurm"), "spec": {"clusterName": "x"}}
    msgs = run_stack("slinky-resources-complete", [(LOGINSET, login), (ACCOUNTING, acct), (CONTROLLER, ctl)])
    assert len(msgs) == 3
    assert "sssdConfRef" in msgs[0] and "passwordKeyRef" in msgs[1] and "accountingRef" in msgs[2]
    login["spec"]["sssdConfRef"] = {"name": "s", "key": "sssd.conf"}
    acct["spec"]["storageConfig"]["passwordKeyRef"] = {"name": "db", "key": "password"}
    ctl["spec"]["accountingRef"] = {"name": "accounting"}
    assert run_stack("slinky-resources-complete", [(LOGINSET, login), (ACCOUNTING, acct), (CONTROLLER, ctl)]) == []


def test_reconciler_wiring_checksum_restapi_and_iam_role():
    dep = workload("gpufleet-reconciler")
    sa = {"metadata": meta("gpufleet-reconciler")}
    api = {"metadata": meta("slurm-restapi"), "spec": {"controllerRef": {"name": "slurm"}}}
    msgs = run_stack("reconciler-wiring", [(DEP, dep), (SA, sa), (RESTAPI, api)], {"requireIamRole": True})
    assert len(msgs) == 4
    assert "config-checksum" in msgs[0] and "--slurm-url" in msgs[1] and "Token" in msgs[2]
    assert "eks.amazonaws.com/role-arn" in msgs[3] and "iam_role_arn" in msgs[3]
    assert len(run_stack("reconciler-wiring", [(DEP, dep), (SA, sa)], {"requireIamRole": False})) == 1
