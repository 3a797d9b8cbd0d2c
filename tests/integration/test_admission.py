"""The trust boundaries of issue 24, enforced by a real API server: Pod Security levels, RBAC and the
admission policies the stack ships (components/admission.py), with tokens the API server mints for the
reconciler's and the agent's ServiceAccounts.

- the reconciler's token creates its capacity-request placeholders and nothing else: no privileged pod, in
  its restricted namespace (prod) nor in a namespace whose level admits one (the local environment's);
- it creates its health-check Jobs (the adapter's own job_manifest) and no other Job: none that would start a
  privileged pod, none without the health-check label, none outside its namespace;
- it changes its own marks on a node (cordon, gpufleet.io labels, taints and annotations, the pool's labels)
  through the reconciler's own adapter code, and no other field; it adds a node's proven pool, never changes
  or removes it;
- it deletes borrowers and its placeholders, no other pod;
- the agent's token, bound to a pod on node A, writes A's GPU condition and kernel-log cursor, and nothing
  of node B; a token bound to no pod writes no node;
- the agent's token on node A creates an Event about A (the agent's own node_event), none about B or about
  anything but its node; a token bound to no pod creates none;
- a kubelet sets no membership on its node (NodeRestriction for `node-restriction.kubernetes.io/` labels, the
  membership policy for the rest), and what it registers with enrols nothing.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.components.admission import KUBELET_PREFIX, NODE_NAME_KEY, binding, policies, pool_label_keys
from gpufleet.components.agent import AGENT, agent_rules, agent_username
from gpufleet.components.meta import pod_security_labels
from gpufleet.components.reconciler import NAME as RECONCILER, cluster_rules, namespace_rules, reconciler_username
from gpufleet.fleetspec import labels, load_stack_file
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.placement import worker_selector
from gpufleet.waiting import wait_for
from localenv.slinky_standin import NodeSetDef, declare_nodesets, nodeset_owner
from gpufleet.reconciler.adapters.health_checks import HealthChecks, job_manifest
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.providers import placeholder_pod
from gpufleet.reconciler.core import membership
from gpufleet.reconciler.errors import PermanentError
from tests.fixtures.kube_cluster import create_or_keep
from tests.integration.test_reconciler_rbac import ROOT

pytestmark = pytest.mark.integration

NODE_A, NODE_B = "gf-sec-node-a", "gf-sec-node-b"
OTHER_NS = "gf-sec-tenant"


def spec_for(system_ns: str, agent_ns: str) -> FleetSpec:
    """The local stack's spec (it lends, so it has borrower classes), in namespaces of this test's own."""
    doc = load_stack_file(ROOT / "Pulumi.local.yaml").fleet.model_dump(mode="json")
    doc["healing"]["reconciler"].update(namespace=system_ns, agent_namespace=agent_ns)
    return FleetSpec.model_validate(doc)


def _status(fn, *args, **kw) -> tuple[int, str]:
    try:
        fn(*args, **kw)
        return 200, ""
    except ApiException as e:
        return e.status, e.body or ""
    except PermanentError as e:  # the Kube adapter's typed error (403 included)
        return (403 if " 403 " in f" {e} " else 0), str(e)


def token_client(kube, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = kube.server_url
    cfg.ssl_ca_cert = str(kube.pki.ca_cert)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


class Setup:
    """One spec's namespaces (at the level the stack gives them), identities, RBAC and admission policies."""

    def __init__(self, kube, spec: FleetSpec, system_level: str):
        self.kube, self.spec = kube, spec
        self.admin = kube.api_client()
        self.core = client.CoreV1Api(self.admin)
        rbac = client.RbacAuthorizationV1Api(self.admin)
        adm = client.AdmissionregistrationV1Api(self.admin)
        dep = spec.healing.reconciler
        self.ns, self.agent_ns = dep.namespace, dep.agent_namespace
        for ns, level in ((self.ns, system_level), (self.agent_ns, "privileged")):
            create_or_keep(self.core.create_namespace, {"metadata": {"name": ns, "labels": pod_security_labels(level)}})
        for ns, sa, rules, ns_rules in ((self.ns, RECONCILER, cluster_rules(spec), namespace_rules(spec)),
                                        (self.agent_ns, AGENT, agent_rules(), None)):
            name = f"{ns}-{sa}"
            subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
            ref = lambda kind, n=name: {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": n}  # noqa: E731
            create_or_keep(self.core.create_namespaced_service_account, ns, {"metadata": {"name": sa}})
            create_or_keep(rbac.create_cluster_role, {"metadata": {"name": name}, "rules": rules})
            create_or_keep(rbac.create_cluster_role_binding, {"metadata": {"name": name}, "roleRef": ref("ClusterRole"),
                                                       "subjects": subject})
            if ns_rules:
                create_or_keep(rbac.create_namespaced_role, ns, {"metadata": {"name": name}, "rules": ns_rules})
                create_or_keep(rbac.create_namespaced_role_binding, ns, {"metadata": {"name": name}, "roleRef": ref("Role"),
                                                                  "subjects": subject})
        self.policies = policies(spec, reconciler_username(spec), agent_username(spec))
        for p in self.policies:
            create_or_keep(adm.create_validating_admission_policy, p)
            create_or_keep(adm.create_validating_admission_policy_binding, binding(p))

    def token(self, ns: str, sa: str, bound_pod: dict | None = None) -> client.ApiClient:
        body: dict = {"spec": {"expirationSeconds": 600}}
        if bound_pod is not None:
            body["spec"]["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": bound_pod.metadata.name,
                                              "uid": bound_pod.metadata.uid}
        token = self.core.create_namespaced_service_account_token(sa, ns, body).status.token
        return token_client(self.kube, token)

    def reconciler(self) -> client.ApiClient:
        return self.token(self.ns, RECONCILER)


def _nodes(core: client.CoreV1Api) -> None:
    for name in (NODE_A, NODE_B):
        try:
            core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise
        wait_for(f"{name} gone", lambda n=name: _status(core.read_node, n)[0] == 404, timeout=30)
        core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, labels.NODE_POOL: "h100",
                                                                 labels.ROLE: labels.ROLE_SPARE}},
                          "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                                              {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]}})


@pytest.fixture(scope="module")
def prod_like(kube_cluster) -> Iterator[Setup]:
    """The reconciler's namespace at `restricted`, as on a cluster."""
    s = Setup(kube_cluster, spec_for("gf-sec-system", "gf-sec-agent"), "restricted")
    _nodes(s.core)
    create_or_keep(s.core.create_namespace, {"metadata": {"name": OTHER_NS}})
    # the policies act once the API server's admission has loaded them: a dry run is refused then
    rec = s.reconciler()
    wait_for("the reconciler's node policy in force", lambda: _status(
        client.CoreV1Api(rec).patch_node, NODE_A, {"metadata": {"labels": {"kubernetes.io/hostname": "x"}}},
        dry_run="All")[0] == 403, timeout=60)
    yield s
    for name in (NODE_A, NODE_B):  # the cluster is the session's: later modules' reconcilers must not see them
        if _status(s.core.delete_node, name)[0] not in (200, 404):
            raise AssertionError(f"{name} could not be deleted")


@pytest.fixture(scope="module")
def local_like(kube_cluster, prod_like) -> Setup:
    """The reconciler's namespace at `privileged`, as the local environment's (its pods need the host network)."""
    s = Setup(kube_cluster, spec_for("gf-sec-local-system", "gf-sec-local-agent"), "privileged")
    rec = s.reconciler()
    wait_for("the reconciler's pod policy in force", lambda: _status(
        client.CoreV1Api(rec).create_namespaced_pod, s.ns, _pod("probe"), dry_run="All")[0] == 403, timeout=60)
    return s


def _pod(name: str, **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                                                  **spec}}


def _privileged_placeholder(s: Setup, name: str) -> dict:
    """A placeholder in every way but one: its container runs privileged."""
    body = placeholder_pod(s.spec.pools[0], name, "test", s.ns, image=s.spec.healing.reconciler.placeholder_image)
    body["metadata"]["name"] = name
    body["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return body


# --- what the reconciler may create -----------------------------------------------------------------

@pytest.mark.parametrize("where", ["prod_like", "local_like"])
def test_the_reconciler_creates_its_placeholders_and_no_privileged_pod(where, request):
    s: Setup = request.getfixturevalue(where)
    core = client.CoreV1Api(s.reconciler())
    where = where.replace("_", "-")  # a pod's name
    ok = placeholder_pod(s.spec.pools[0], f"{where}-key", "a fault took the last spare", s.ns,
                         image=s.spec.healing.reconciler.placeholder_image)
    assert _status(core.create_namespaced_pod, s.ns, ok) == (200, "")  # restricted-compliant and a placeholder
    status, why = _status(core.create_namespaced_pod, s.ns, _privileged_placeholder(s, f"{where}-priv"))
    assert status == 403, why
    if where == "local_like":  # the namespace admits privileged pods: the admission policy alone refuses it
        assert "unprivileged" in why and f"{s.ns}-reconciler-pods" in why, why
    else:
        assert "violates PodSecurity" in why or "reconciler-pods" in why, why
    for name, spec in (("host", {"hostPID": True}), ("plain", {})):  # not a placeholder: no label
        status, why = _status(core.create_namespaced_pod, s.ns, _pod(f"{where}-{name}", **spec))
        assert status == 403, why


# --- which Jobs it may create ----------------------------------------------------------------------------

def _job_variants(s: Setup) -> list[tuple[str, object, str]]:
    """(what, how a real health-check Job is changed, the refusal's words): each a health check in every way but one."""
    pod = lambda j: j["spec"]["template"]["spec"]  # noqa: E731
    c = lambda j: pod(j)["containers"][0]  # noqa: E731
    return [
        ("a privileged container", lambda j: c(j).update(securityContext={"privileged": True}), "unprivileged"),
        ("an added capability", lambda j: c(j)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
         "without capabilities"),
        ("privilege escalation", lambda j: c(j)["securityContext"].update(allowPrivilegeEscalation=True),
         "unprivileged"),
        ("another image", lambda j: c(j).update(image="docker.io/library/busybox:1.36"),
         f"runs {s.spec.healing.health_check_image()}"),
        ("the host's PID namespace", lambda j: pod(j).update(hostPID=True), "no host namespace"),
        ("the host's network", lambda j: pod(j).update(hostNetwork=True), "no host namespace"),
        ("a host path", lambda j: pod(j).update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
         "mounts nothing"),
        ("a ServiceAccount token", lambda j: pod(j).update(automountServiceAccountToken=True), "mounts nothing"),
        ("root", lambda j: pod(j)["securityContext"].update(runAsNonRoot=False, runAsUser=0), "non-root"),
        ("a second container", lambda j: pod(j)["containers"].append({**c(j), "name": "more"}), "one container"),
        ("no health-check label", _unlabel, "only health-check Jobs"),
        ("a nodeName", lambda j: pod(j).update(nodeName=NODE_A), "placed by the scheduler"),
        ("no pool in its nodeSelector", lambda j: pod(j).pop("nodeSelector"), "a pool's node"),
        ("a pool the spec does not declare", lambda j: pod(j).update(nodeSelector={labels.NODE_POOL: "nope"}),
         "a pool's node"),
        ("another node than its label names", lambda j: _pin(pod(j), "kube-system-node"), "the node its label"),
        ("a second term without the pin", lambda j: pod(j)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}),
         "the node its label"),
        ("another command", lambda j: c(j).update(command=["/bin/sh", "-c", "id"]), "the spec's check command"),
        ("extra arguments", lambda j: c(j).update(args=["--no-all-reduce"]), "the spec's check command"),
        ("another variable", lambda j: c(j)["env"].append({"name": "LD_PRELOAD", "value": "/x.so"}),
         "no variable but"),
        # a stolen token's other ways to run a shell in the check image on a pool node, or more than the check
        ("a postStart hook", lambda j: c(j).update(lifecycle={"postStart": {"exec": {"command": ["/bin/sh", "-c", "id"]}}}),
         "no lifecycle hook"),
        ("a preStop hook", lambda j: c(j).update(lifecycle={"preStop": {"exec": {"command": ["/bin/sh", "-c", "id"]}}}),
         "no lifecycle hook"),
        ("a probe's exec", lambda j: c(j).update(livenessProbe={"exec": {"command": ["/bin/sh", "-c", "id"]}}),
         "no probe"),
        ("a startup probe's exec", lambda j: c(j).update(startupProbe={"exec": {"command": ["/bin/sh", "-c", "id"]}}),
         "no probe"),
        ("memory besides its GPUs", lambda j: [c(j)["resources"][k].update(memory="512Gi") for k in ("requests", "limits")],
         "its pool's GPUs"),
        ("no GPU", lambda j: c(j).update(resources={}), "its pool's GPUs"),
        ("more GPUs than its pool's nodes have", lambda j: [c(j)["resources"][k].update({"nvidia.com/gpu": "64"})
                                                           for k in ("requests", "limits")], "its pool's GPUs"),
        ("the reconciler's own pod label (its egress)", lambda j: j["spec"]["template"]["metadata"]["labels"].update(
            {labels.APP_NAME: "gpufleet-reconciler"}), "only the labels"),
        ("another pool's label on its pods", lambda j: j["spec"]["template"]["metadata"]["labels"].update(
            {labels.POOL: "l40s"}), "only the labels"),
        ("a priority class", lambda j: pod(j).update(priorityClassName="system-node-critical"), "no priority class"),
        ("another scheduler", lambda j: pod(j).update(schedulerName="my-scheduler"), "no priority class"),
        ("a runtime class", lambda j: pod(j).update(runtimeClassName="unsandboxed"), "no priority class"),
        ("an unmasked /proc", lambda j: (c(j)["securityContext"].update(procMount="Unmasked"),  # (the API server's
                                         pod(j).update(hostUsers=False)), "default /proc"),  # validation wants hostUsers)
    ]


def _pin(pod: dict, node: str) -> None:
    pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]


def _unlabel(job: dict) -> None:
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        meta["labels"] = {k: v for k, v in meta["labels"].items() if k != labels.HEALTH_CHECK_NODE}


def _job(s: Setup, name: str, namespace: str | None = None) -> dict:
    """The Job the reconciler's adapter creates to check NODE_A (reconciler/adapters/health_checks.py)."""
    return job_manifest(s.spec, s.spec.pools[0], NODE_A, name, namespace or s.ns)


def _jobs_policy_in_force(s: Setup) -> None:
    batch = client.BatchV1Api(s.reconciler())
    unlabelled = _job(s, "probe")
    _unlabel(unlabelled)
    wait_for("the reconciler's Job policy in force", lambda: _status(
        batch.create_namespaced_job, s.ns, unlabelled, dry_run="All")[0] == 403, timeout=60)


@pytest.mark.parametrize("where", ["prod_like", "local_like"])
def test_the_reconciler_creates_its_health_check_jobs_and_no_other_job(where, request):
    """The real job_manifest, created through the reconciler's adapter (HealthChecks.start) with its token, is
    admitted; the same Job changed in one way is refused by the policy (a Job's pod is not the reconciler's: the
    Job controller creates it, so the pod policy never sees it, and locally Pod Security admits a privileged one)."""
    s: Setup = request.getfixturevalue(where)
    _jobs_policy_in_force(s)
    admin = client.BatchV1Api(s.admin)
    name = f"gf-sec-check-{where.replace('_', '-')}"
    try:
        HealthChecks(s.reconciler(), s.spec).start(NODE_A, s.spec.pools[0].name, name)
        job = admin.read_namespaced_job(name, s.ns)
        assert job.metadata.labels[labels.HEALTH_CHECK_NODE] == NODE_A
        assert HealthChecks(s.reconciler(), s.spec).verdict(name).state == "running"
    finally:
        assert _status(admin.delete_namespaced_job, name, s.ns, propagation_policy="Background")[0] in (200, 404)
    batch = client.BatchV1Api(s.reconciler())
    for i, (what, change, words) in enumerate(_job_variants(s)):
        body = _job(s, f"gf-sec-bad-{i}")
        change(body)
        status, why = _status(batch.create_namespaced_job, s.ns, body)
        assert status == 403 and f"{s.ns}-reconciler-jobs" in why and words in why, (what, why)
        assert _status(admin.read_namespaced_job, f"gf-sec-bad-{i}", s.ns)[0] == 404, what


def test_the_reconciler_creates_no_job_outside_its_namespace_even_where_rbac_would_let_it(prod_like):
    """RBAC grants the Jobs in its namespace only; should a grant elsewhere appear, the policy still refuses."""
    s = prod_like
    _jobs_policy_in_force(s)
    rbac = client.RbacAuthorizationV1Api(s.admin)
    name = "gf-sec-stray-jobs"
    create_or_keep(rbac.create_namespaced_role, OTHER_NS, {"metadata": {"name": name}, "rules": [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]})
    create_or_keep(rbac.create_namespaced_role_binding, OTHER_NS, {
        "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": RECONCILER, "namespace": s.ns}]})
    try:
        # RBAC now admits it (so the refusal below is the policy's): the API server's own answer for this identity
        review = client.AuthorizationV1Api(s.admin).create_subject_access_review({"spec": {
            "user": reconciler_username(s.spec), "groups": ["system:serviceaccounts", f"system:serviceaccounts:{s.ns}"],
            "resourceAttributes": {"namespace": OTHER_NS, "verb": "create", "group": "batch", "resource": "jobs"}}})
        assert review.status.allowed
        batch = client.BatchV1Api(s.reconciler())
        status, why = _status(batch.create_namespaced_job, OTHER_NS, _job(s, "gf-sec-elsewhere", OTHER_NS))
        assert status == 403 and f"{s.ns}-reconciler-jobs" in why and f"only in {s.ns}" in why, why
        assert _status(client.BatchV1Api(s.admin).read_namespaced_job, "gf-sec-elsewhere", OTHER_NS)[0] == 404
    finally:
        rbac.delete_namespaced_role_binding(name, OTHER_NS)
        rbac.delete_namespaced_role(name, OTHER_NS)


# --- which node fields it may change -----------------------------------------------------------------

def test_the_reconciler_changes_its_own_marks_on_a_node(prod_like):
    """Through the reconciler's own adapter (reconciler/adapters/kube.py), with its token."""
    kube = Kube(prod_like.reconciler())
    kube.cordon(NODE_A, "gpufleet: Xid 79", "gf-sec-node-a-xid79-1")
    kube.set_node_role(NODE_A, labels.ROLE_ACTIVE, remove_taints=[labels.SPARE_TAINT],
                       annotations={labels.PROMOTED_FOR: NODE_B})
    kube.apply_membership(NODE_A, {labels.GPU_MODEL: "H100-SXM5-80GB", labels.TOPOLOGY_BLOCK: "b1"})
    kube.lend(NODE_A, "h100", labels.LENT_SPARE, "2026-12-01T00:00:00Z")
    kube.start_reclaim(NODE_A, "2026-12-01T00:01:00Z")
    kube.end_loan(NODE_A, back_to_spare=True)
    node = prod_like.core.read_node(NODE_A)
    assert node.spec.unschedulable and node.metadata.labels[labels.ROLE] == labels.ROLE_ACTIVE
    assert node.metadata.labels[labels.GPU_MODEL] == "H100-SXM5-80GB"
    assert node.metadata.annotations[labels.SLINKY_CORDON_REASON] == "gpufleet: Xid 79"
    # (node.kubernetes.io/ taints are the node lifecycle controller's: no kubelet runs these nodes)
    assert {t.key for t in node.spec.taints if not t.key.startswith("node.kubernetes.io/")} == {
        "dedicated", labels.SPARE_TAINT}


@pytest.mark.parametrize("what,patch", [
    ("a Kubernetes label", {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}}),
    ("a control-plane label", {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
    ("a label removed", {"metadata": {"labels": {"kubernetes.io/hostname": None}}}),
    ("another annotation", {"metadata": {"annotations": {"example.com/owner": "me"}}}),
    ("a finalizer", {"metadata": {"finalizers": ["example.com/hold"]}}),
    ("another taint", {"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                                           {"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"},
                                           {"key": "example.com/evil", "effect": "NoExecute"}]}}),
    ("a taint removed", {"spec": {"taints": [{"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]}}),
    ("the provider id", {"spec": {"providerID": "aws:///us-east-1a/i-0123456789"}}),
    ("the pod CIDR", {"spec": {"podCIDR": "10.9.0.0/24", "podCIDRs": ["10.9.0.0/24"]}}),
    ("the proven pool changed", {"metadata": {"labels": {labels.NODE_POOL: "l40s"}}}),
    ("the proven pool removed", {"metadata": {"labels": {labels.NODE_POOL: None}}}),
])
def test_the_reconciler_cannot_change_unrelated_node_fields(prod_like, what, patch):
    before = prod_like.core.read_node(NODE_B)
    status, why = _status(client.CoreV1Api(prod_like.reconciler()).patch_node, NODE_B, patch)
    assert status == 403 and "reconciler-nodes" in why, (what, why)
    after = prod_like.core.read_node(NODE_B)
    assert after.metadata.resource_version == before.metadata.resource_version  # nothing written


def test_the_reconciler_adds_a_proven_pool_and_never_changes_or_removes_one(prod_like):
    """Membership sets labels.NODE_POOL on a node without one and never relabels (reconciler/core/membership.py):
    through the reconciler's adapter, the add is admitted, a change or a removal is not."""
    node, core = "gf-sec-joining", prod_like.core
    create_or_keep(core.create_node, {"metadata": {"name": node, "labels": {
        "kubernetes.io/hostname": node, **prod_like.spec.pool("h100").member_selector}}})
    try:
        kube = Kube(prod_like.reconciler())
        kube.apply_membership(node, {labels.NODE_POOL: "h100"})
        assert core.read_node(node).metadata.labels[labels.NODE_POOL] == "h100"
        before = core.read_node(node).metadata.resource_version
        status, why = _status(kube.apply_membership, node, {labels.NODE_POOL: "l40s"})
        assert status == 403 and "reconciler-nodes" in why, why  # (the adapter's error keeps 300 characters)

        def without_pool(n: dict) -> bool:
            n["metadata"]["labels"].pop(labels.NODE_POOL)
            return True

        status, why = _status(kube.update_node, node, without_pool)
        assert status == 403 and "reconciler-nodes" in why, why
        after = core.read_node(node)
        assert after.metadata.labels[labels.NODE_POOL] == "h100" and after.metadata.resource_version == before
    finally:
        assert _status(core.delete_node, node)[0] in (200, 404)


@pytest.mark.parametrize("what,taint", [
    ("its own taint, NoExecute", {"key": "gpufleet.io/x", "value": "true", "effect": "NoExecute"}),
    ("its quarantine taint, NoExecute", {"key": labels.QUARANTINE_TAINT, "value": "xid-79", "effect": "NoExecute"}),
    ("a pool taint's key with another effect", {"key": "nvidia.com/gpu", "effect": "NoExecute"}),
])
def test_the_reconciler_taints_nothing_noexecute(prod_like, what, taint):
    """A NoExecute taint evicts every pod of the node at once, PodDisruptionBudgets or not: the reconciler's own
    taints are NoSchedule, a pool's taints as the spec declares them. Its own NoSchedule quarantine (kube.cordon)
    is admitted: test_the_reconciler_changes_its_own_marks_on_a_node."""
    kube = Kube(prod_like.reconciler())
    before = prod_like.core.read_node(NODE_B)

    def add(n: dict) -> bool:
        n["spec"]["taints"] = (n["spec"].get("taints") or []) + [taint]
        return True

    status, why = _status(kube.update_node, NODE_B, add)
    assert status == 403 and "reconciler-nodes" in why, (what, why)
    assert prod_like.core.read_node(NODE_B).metadata.resource_version == before.metadata.resource_version


OUTSIDERS = {  # nodes membership never enrols: no declared pool's evidence, or the platform's own
    "gf-sec-system-node": {labels.SYSTEM_NODE: "true"},
    "gf-sec-control-plane": {"node-role.kubernetes.io/control-plane": ""},
    "gf-sec-other-team": {"team.example.com/owner": "vision"},
    "gf-sec-system-claimed": {labels.SYSTEM_NODE: "true", "node-restriction.kubernetes.io/node-group": "h100"},
}


@pytest.fixture
def outsiders(prod_like) -> Iterator[list[str]]:
    for name, extra in OUTSIDERS.items():
        create_or_keep(prod_like.core.create_node, {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, **extra}}})
    yield sorted(OUTSIDERS)
    for name in OUTSIDERS:
        assert _status(prod_like.core.delete_node, name)[0] in (200, 404)


def test_the_reconciler_writes_no_node_outside_its_pools(prod_like, outsiders):
    """A stolen reconciler token adds no pool label to a node its pools do not claim (a system node, the control
    plane, another team's), after which the privileged agent would land there and a repair request reboot it;
    nor cordons, taints or annotates one. The node with its pool's member labels is enrolled: the test above."""
    kube = Kube(prod_like.reconciler())
    for node in outsiders:
        before = prod_like.core.read_node(node).metadata.resource_version
        for what, call in [
            ("the proven pool", lambda: kube.apply_membership(node, {labels.NODE_POOL: "h100"})),
            ("a pool's labels and taints", lambda: kube.apply_membership(
                node, {labels.ROLE: labels.ROLE_SPARE}, [{"key": labels.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}])),
            ("a cordon", lambda: kube.cordon(node, "gpufleet: Xid 79", f"{node}-xid79-1")),
            ("a repair request", lambda: kube.patch_node(node, {"metadata": {"annotations": {labels.REPAIR_REQUEST: "x"}}})),
        ]:
            status, why = _status(call)
            assert status == 403 and "only the nodes of the pools the spec declares" in why, (node, what, why)
        assert prod_like.core.read_node(node).metadata.resource_version == before, node


def test_the_reconciler_sets_the_gpu_condition_and_nothing_else_of_a_nodes_status(prod_like):
    """The status subresource (patched to mark a repaired node healthy: kube.set_condition) is held to the GPU
    condition: no Ready condition, no address the API server would dial the kubelet at."""
    kube = Kube(prod_like.reconciler())
    kube.set_condition(NODE_B, labels.GPU_CONDITION, "True", "HealthCheckPassed", "repaired")
    before = prod_like.core.read_node(NODE_B)
    assert any(c.type == labels.GPU_CONDITION and c.reason == "HealthCheckPassed" for c in before.status.conditions)
    for what, call in [
        ("the Ready condition", lambda: kube.set_condition(NODE_B, "Ready", "False", "Forged", "forged")),
        ("an address", lambda: client.CoreV1Api(prod_like.reconciler()).patch_node_status(
            NODE_B, {"status": {"addresses": [{"type": "InternalIP", "address": "203.0.113.9"}]}})),
        ("the capacity", lambda: client.CoreV1Api(prod_like.reconciler()).patch_node_status(
            NODE_B, {"status": {"capacity": {"nvidia.com/gpu": "64"}}})),
    ]:
        status, why = _status(call)
        assert status == 403 and "reconciler-nodes" in why, (what, why)
    assert prod_like.core.read_node(NODE_B).metadata.resource_version == before.metadata.resource_version


# --- which pods it may delete --------------------------------------------------------------------------

def test_the_reconciler_deletes_borrowers_and_its_placeholders_only(prod_like):
    s = prod_like
    classes = s.spec.borrower_classes()
    assert classes  # the local stack lends
    sched = client.SchedulingV1Api(s.admin)
    for name, value in classes.items():
        create_or_keep(sched.create_priority_class, {"metadata": {"name": name}, "value": value,
                                              "preemptionPolicy": "Never"})
    borrower = _pod("gf-sec-borrower", priorityClassName=next(iter(classes)))
    tenant = _pod("gf-sec-tenant-job")
    for body in (borrower, tenant):
        create_or_keep(s.core.create_namespaced_pod, OTHER_NS, body)
    kube = Kube(s.reconciler())
    assert _status(kube.delete_pod, OTHER_NS, "gf-sec-tenant-job", 0)[0] == 403  # a force-delete of a tenant's pod
    assert _status(kube.delete_pod, OTHER_NS, "gf-sec-tenant-job", 30)[0] == 403  # any delete
    assert _status(kube.delete_pod, OTHER_NS, "gf-sec-borrower", 0) == (200, "")
    placeholder = placeholder_pod(s.spec.pools[0], "deleted-again", "test", s.ns,
                                  image=s.spec.healing.reconciler.placeholder_image)
    assert _status(client.CoreV1Api(s.reconciler()).create_namespaced_pod, s.ns, placeholder)[0] in (200, 409)
    assert _status(kube.delete_pod, s.ns, placeholder["metadata"]["name"], 0) == (200, "")
    assert s.core.read_namespaced_pod("gf-sec-tenant-job", OTHER_NS).metadata.deletion_timestamp is None
    # a NodeSet pod a stale busy-pod PDB keeps (decide.py end_eviction): in the Slurm namespace only, controlled
    # by a NodeSet the spec declares; a pod that carries the same label elsewhere, or there without that
    # NodeSet's controller reference, is not one
    create_or_keep(s.core.create_namespace, {"metadata": {"name": s.spec.slurm.namespace}})
    (owner,) = declare_nodesets(s.core.api_client, s.spec.slurm.namespace, [NodeSetDef(s.spec.pools[0].name, 0, {})])
    nodeset = {"metadata": {"name": "gf-sec-nodeset-0", "labels": {labels.SLINKY_POD_HOSTNAME: "gpu-0"},
                            "ownerReferences": [nodeset_owner(owner)]}, "spec": _pod("x")["spec"]}
    lookalike = {"metadata": {"name": "gf-sec-lookalike-0", "labels": {labels.SLINKY_POD_HOSTNAME: "gpu-0"}},
                 "spec": _pod("x")["spec"]}
    for ns in (s.spec.slurm.namespace, OTHER_NS):
        create_or_keep(s.core.create_namespaced_pod, ns, lookalike)
    create_or_keep(s.core.create_namespaced_pod, s.spec.slurm.namespace, nodeset)
    assert _status(kube.delete_pod, OTHER_NS, "gf-sec-lookalike-0", 0)[0] == 403
    assert _status(kube.delete_pod, s.spec.slurm.namespace, "gf-sec-lookalike-0", 0)[0] == 403
    assert _status(kube.delete_pod, s.spec.slurm.namespace, "gf-sec-nodeset-0", 0) == (200, "")


# --- what the agent may write -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def agents(prod_like) -> dict[str, client.ApiClient]:
    """An agent pod on each node (bound by spec.nodeName; no kubelet runs them) and a token bound to each."""
    s = prod_like
    out = {}
    for node in (NODE_A, NODE_B):
        name = f"agent-{node}"
        create_or_keep(s.core.create_namespaced_pod, s.agent_ns, _pod(name, nodeName=node, serviceAccountName=AGENT))
        out[node] = s.token(s.agent_ns, AGENT, s.core.read_namespaced_pod(name, s.agent_ns))
    out["unbound"] = s.token(s.agent_ns, AGENT)
    return out


def test_a_pod_bound_token_names_its_node(prod_like, agents):
    """What the policy keys on, as this API server says it (k8s.io/apiserver serviceaccount NodeNameKey)."""
    token = agents[NODE_A].configuration.api_key["authorization"].split(" ", 1)[1]
    review = client.AuthenticationV1Api(prod_like.admin).create_token_review({"spec": {"token": token}})
    assert review.status.authenticated and review.status.user.extra[NODE_NAME_KEY] == [NODE_A]
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["kubernetes.io"]["node"]["name"] == NODE_A


def test_the_agent_writes_its_own_node(prod_like, agents):
    kube = Kube(agents[NODE_A])
    kube.set_condition(NODE_A, labels.GPU_CONDITION, "False", "Xid79", "NVRM: Xid 79 (test)")
    kube.patch_node(NODE_A, {"metadata": {"annotations": {labels.KMSG_REPORTED: "boot:42"}}})
    node = prod_like.core.read_node(NODE_A)
    assert node.metadata.annotations[labels.KMSG_REPORTED] == "boot:42"
    assert any(c.type == labels.GPU_CONDITION and c.reason == "Xid79" for c in node.status.conditions)


@pytest.mark.parametrize("who", [NODE_A, "unbound"])
def test_the_agent_cannot_write_another_node(prod_like, agents, who):
    """Root on node A holds A's agent token: it cannot fault node B. A token bound to no pod writes nothing."""
    kube = Kube(agents[who])
    before = prod_like.core.read_node(NODE_B)
    status, why = _status(kube.set_condition, NODE_B, labels.GPU_CONDITION, "False", "Xid79", "forged")
    assert status == 403 and "only the node its token is bound to" in why, why
    status, why = _status(kube.patch_node, NODE_B, {"metadata": {"annotations": {labels.KMSG_REPORTED: "x:1"}}})
    assert status == 403, why
    assert prod_like.core.read_node(NODE_B).metadata.resource_version == before.metadata.resource_version


@pytest.mark.parametrize("what,patch", [
    ("another pool (its NodeSet and partition)", {"metadata": {"labels": {labels.NODE_POOL: "l40s"}}}),
    ("a role", {"metadata": {"labels": {labels.ROLE: labels.ROLE_SYSTEM}}}),
    ("the health-check record", {"metadata": {"annotations": {labels.HEALTH_CHECK: '{"verdict": "passed"}'}}}),
    ("a repair request", {"metadata": {"annotations": {labels.REPAIR_REQUEST: "reboot"}}}),
    ("a finalizer", {"metadata": {"finalizers": ["example.com/hold"]}}),
])
def test_the_agent_cannot_relabel_its_own_node_through_its_status(prod_like, agents, what, patch):
    """With the agent pod's token on node A, PATCH nodes/A/status carrying metadata: the status subresource's
    strategy resets only the spec and keeps the metadata sent (kubernetes v1.34.4 pkg/registry/core/node/
    strategy.go nodeStatusStrategy.PrepareForUpdate), so without the agent's rule on that subresource this would
    move A into another pool. Refused; the agent's own status write still passes."""
    core = client.CoreV1Api(agents[NODE_A])
    before = prod_like.core.read_node(NODE_A)
    status, why = _status(core.patch_node_status, NODE_A, patch)
    assert status == 403 and "agent-own-node" in why and "through the node or its status alike" in why, (what, why)
    after = prod_like.core.read_node(NODE_A)
    assert after.metadata.resource_version == before.metadata.resource_version  # nothing written
    assert after.metadata.labels[labels.NODE_POOL] == "h100"
    Kube(agents[NODE_A]).set_condition(NODE_A, labels.GPU_CONDITION, "False", "Xid79", "NVRM: Xid 79 (test)")
    assert any(c.type == labels.GPU_CONDITION and c.reason == "Xid79"
               for c in prod_like.core.read_node(NODE_A).status.conditions)


def _flip_cordon(kube: Kube) -> None:
    node = kube.get_node(NODE_A)
    kube.patch_node(NODE_A, {"spec": {"unschedulable": not node["spec"].get("unschedulable", False)}})


@pytest.mark.parametrize("what,call", [
    ("a label", lambda k: k.patch_node(NODE_A, {"metadata": {"labels": {labels.ROLE: "forged-by-the-agent"}}})),
    ("a cordon", _flip_cordon),
    ("another annotation", lambda k: k.patch_node(NODE_A, {"metadata": {"annotations": {labels.REMEDIATION: "forged"}}})),
    ("another condition", lambda k: k.set_condition(NODE_A, "Ready", "False", "Forged", "forged")),
    ("an operand label set to another value", lambda k: k.patch_node(NODE_A, {"metadata": {"labels": {
        labels.GPU_OPERATOR_DEPLOY[0]: "pre-installed"}}})),
    ("another NVIDIA label", lambda k: k.patch_node(NODE_A, {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})),
])
def test_on_its_own_node_the_agent_writes_only_its_cursor_and_condition(prod_like, agents, what, call):
    before = prod_like.core.read_node(NODE_A).metadata.resource_version
    status, why = _status(call, Kube(agents[NODE_A]))
    assert status == 403, (what, why)
    assert prod_like.core.read_node(NODE_A).metadata.resource_version == before  # nothing written


def test_a_gpu_reset_stops_and_restores_the_gpu_operators_operands_on_its_own_node(prod_like, agents):
    """What reconciler/agent/gpu_clients.py writes around a reset: the note of what it stopped, the operands'
    deploy labels to false and back to true; the note removed. On another node none of it."""
    kube, key = Kube(agents[NODE_A]), labels.GPU_OPERATOR_DEPLOY[0]
    kube.patch_node(NODE_A, {"metadata": {"annotations": {labels.GPU_CLIENTS_STOPPED: '{"request": "r/1"}'}}})
    for value in ("false", "true"):
        kube.patch_node(NODE_A, {"metadata": {"labels": {key: value}}})
        assert prod_like.core.read_node(NODE_A).metadata.labels[key] == value
    kube.patch_node(NODE_A, {"metadata": {"annotations": {labels.GPU_CLIENTS_STOPPED: None}}})
    assert labels.GPU_CLIENTS_STOPPED not in (prod_like.core.read_node(NODE_A).metadata.annotations or {})
    status, why = _status(kube.patch_node, NODE_B, {"metadata": {"labels": {key: "false"}}})
    assert status == 403 and "only the node its token is bound to" in why, why


def _events_about(core: client.CoreV1Api, node: str, reason: str) -> list:
    return [e for e in core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}").items if e.reason == reason]


def test_the_agent_creates_events_about_its_own_node(prod_like, agents):
    """The agent's own call (reconciler/adapters/kube.py node_event, what reconciler/agent/daemon.py sends for a
    fault that leaves the node in service): `gpufleet why` reads such an Event as the node's fault."""
    Kube(agents[NODE_A]).node_event(NODE_A, "Xid13", "NVRM: Xid 13 (test): restart the job")
    (event,) = _events_about(prod_like.core, NODE_A, "Xid13")
    assert event.source.component == "gpufleet-agent" and event.type == "Warning"


@pytest.mark.parametrize("who", [NODE_A, "unbound"])
def test_the_agent_cannot_write_another_nodes_history(prod_like, agents, who):
    """Root on node A holds A's agent token: it creates no Event about node B, through the core group or
    events.k8s.io (RBAC grants it only the core group's; admission judges both), and none about another kind.
    A token bound to no pod creates no Event at all."""
    kube = Kube(agents[who])
    core = client.CoreV1Api(agents[who])
    forged = {"metadata": {"generateName": f"{NODE_B}.", "namespace": "default"}, "reason": "Xid79",
              "involvedObject": {"kind": "Node", "name": NODE_B, "apiVersion": "v1"}, "message": "forged",
              "type": "Warning", "source": {"component": "gpufleet-agent", "host": NODE_A}}
    # the policy acts once the API server's admission has loaded it: a dry run about B is refused then
    wait_for("the agent's Event policy in force", lambda: _status(
        core.create_namespaced_event, "default", forged, dry_run="All")[0] == 403, timeout=60)
    status, why = _status(kube.node_event, NODE_B, "Xid79", "NVRM: Xid 79 (forged)")
    assert status == 403 and "Events only about the node its token is bound to" in why, why
    pod = {**forged, "involvedObject": {"kind": "Pod", "name": NODE_A, "namespace": "default", "apiVersion": "v1"}}
    assert _status(core.create_namespaced_event, "default", pod)[0] == 403
    if who == NODE_A:  # its own node, but not where Events about nodes live (the API server's validation
        # admits another namespace when the involvedObject names it too)
        status, why = _status(core.create_namespaced_event, OTHER_NS, {
            **forged, "metadata": {"generateName": f"{NODE_A}.", "namespace": OTHER_NS},
            "involvedObject": {"kind": "Node", "name": NODE_A, "namespace": OTHER_NS, "apiVersion": "v1"}})
        assert status == 403 and "are in default" in why, why
    status, why = _status(client.EventsV1Api(agents[who]).create_namespaced_event, "default", {
        "metadata": {"generateName": f"{NODE_B}.", "namespace": "default"}, "reason": "Xid79", "note": "forged",
        "type": "Warning", "action": "Fault", "reportingController": "gpufleet-agent", "reportingInstance": NODE_A,
        "eventTime": "2026-12-02T00:00:00.000000Z", "regarding": {"kind": "Node", "name": NODE_B, "apiVersion": "v1"}})
    assert status == 403, why
    assert _events_about(prod_like.core, NODE_B, "Xid79") == []


# --- what a kubelet may change of a node's membership ---------------------------------------------------

def as_kubelet(s: Setup, node: str) -> client.ApiClient:
    """The admin's client impersonating node `node`'s kubelet: the API server authorizes (Node, RBAC) and
    admits the request as that kubelet's (username system:node:<node>, group system:nodes)."""
    from kubernetes import config as kconfig

    from localenv.control_plane import CONTEXT_NAME

    api = kconfig.new_client_from_config(config_file=str(s.kube.kubeconfig_path), context=CONTEXT_NAME)
    api.set_default_header("Impersonate-User", f"{KUBELET_PREFIX}{node}")
    api.set_default_header("Impersonate-Group", "system:nodes")
    return api


def kubelet_cert(s: Setup, node: str) -> client.ApiClient:
    """Node `node`'s kubelet as the API server knows a kubelet: a client certificate of the cluster's CA with
    CN=system:node:<node>, O=system:nodes (what localenv/node.py gives its kubelets), no impersonation."""
    from localenv.certs import ensure_client_cert

    cert, key = ensure_client_cert(s.kube.pki, f"gf-sec-kubelet-{node}", f"{KUBELET_PREFIX}{node}", "system:nodes")
    cfg = client.Configuration()
    cfg.host = s.kube.server_url
    cfg.ssl_ca_cert = str(s.kube.pki.ca_cert)
    cfg.cert_file, cfg.key_file = str(cert), str(key)
    return client.ApiClient(cfg)


def _node_event(about: str, reason: str, message: str, component: str = "kubelet") -> dict:
    return {"metadata": {"generateName": f"{about}.", "namespace": "default"}, "reason": reason, "message": message,
            "involvedObject": {"kind": "Node", "name": about, "uid": about, "apiVersion": "v1"}, "type": "Warning",
            "source": {"component": component, "host": about}}


def test_a_kubelet_writes_no_other_nodes_story(prod_like):
    """NodeRestriction has no case for Events and the node authorizer grants a kubelet Events create in any
    namespace (kubernetes v1.34.4 plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go NodeRules):
    with node A's kubelet certificate, an Event in default about node B that names an Xid (dressed as the agent's,
    which `gpufleet why` counts) is refused; its own node's Events and its pods' pass."""
    s = prod_like
    core = client.CoreV1Api(kubelet_cert(s, NODE_A))
    forged = _node_event(NODE_B, "Xid79", "NVRM: Xid 79 (forged)", component="gpufleet-agent")
    wait_for("the kubelet Event policy in force", lambda: _status(
        core.create_namespaced_event, "default", forged, dry_run="All")[0] == 403, timeout=60)
    status, why = _status(core.create_namespaced_event, "default", forged)
    assert status == 403 and "kubelet-events" in why and "about its own node only" in why, why
    status, why = _status(client.EventsV1Api(kubelet_cert(s, NODE_A)).create_namespaced_event, "default", {
        "metadata": {"generateName": f"{NODE_B}.", "namespace": "default"}, "reason": "Xid79", "note": "forged",
        "type": "Warning", "action": "Fault", "reportingController": "gpufleet-agent", "reportingInstance": NODE_B,
        "eventTime": "2026-12-02T00:00:00.000000Z", "regarding": {"kind": "Node", "name": NODE_B, "apiVersion": "v1"}})
    assert status == 403, why  # (the node authorizer grants the core group's Events only; the policy judges both)
    assert _events_about(s.core, NODE_B, "Xid79") == []
    # what a kubelet writes of its own: an Event about its node, and one about a pod
    assert _status(core.create_namespaced_event, "default", _node_event(NODE_A, "NodeReady", "kubelet is ready")) == (200, "")
    pod_event = {**_node_event(NODE_A, "Pulled", "image pulled"),
                 "involvedObject": {"kind": "Pod", "name": "agent-x", "namespace": "default", "apiVersion": "v1"}}
    assert _status(core.create_namespaced_event, "default", pod_event) == (200, "")


def test_a_kubelet_cannot_say_its_node_answered_a_capacity_request(prod_like):
    """With node A's kubelet certificate, gpufleet.io/fulfils (or any gpufleet.io/ annotation) on its own node is
    refused; another annotation of its own passes (so the refusal is the policy's, not authorization)."""
    s = prod_like
    core = client.CoreV1Api(kubelet_cert(s, NODE_A))
    wait_for("the kubelet membership policy in force", lambda: _status(
        core.patch_node, NODE_A, {"metadata": {"annotations": {labels.FULFILS: "probe"}}}, dry_run="All")[0] == 403,
        timeout=60)
    before = s.core.read_node(NODE_A).metadata.resource_version
    for key in (labels.FULFILS, labels.REPAIR_RESULT, labels.HEALTH_CHECK):
        status, why = _status(core.patch_node, NODE_A, {"metadata": {"annotations": {key: "gf-sec-request"}}})
        assert status == 403 and "kubelet-membership" in why and "annotation" in why, (key, why)
    assert s.core.read_node(NODE_A).metadata.resource_version == before
    assert _status(core.patch_node, NODE_A, {"metadata": {"annotations": {"example.org/kubelet-note": "x"}}}) == (200, "")


@pytest.fixture(scope="module")
def kubelet_a(prod_like) -> client.CoreV1Api:
    core = client.CoreV1Api(as_kubelet(prod_like, NODE_A))
    wait_for("the kubelet membership policy in force", lambda: _status(
        core.patch_node, NODE_A, {"metadata": {"labels": {labels.ROLE: "probe"}}}, dry_run="All")[0] == 403,
        timeout=60)
    return core


def test_a_kubelet_writes_its_node_but_no_membership(prod_like, kubelet_a):
    """A kubelet may label its node with other keys (so a refusal below is the policy, not authorization),
    and cannot enrol it: no gpufleet.io/ label, no pool label, no gpufleet.io/ taint."""
    assert _status(kubelet_a.patch_node, NODE_A, {"metadata": {"labels": {"example.org/kubelet-set": "yes"}}}) == (200, "")
    before = prod_like.core.read_node(NODE_A).metadata.resource_version
    # a pool label NodeRestriction does not cover (its own prefix is the next test's)
    pool_label = sorted(k for k in pool_label_keys(prod_like.spec) if not k.startswith(labels.TRUSTED_PREFIX))[0]
    for patch in ({"metadata": {"labels": {labels.ROLE: labels.ROLE_SYSTEM}}},
                  {"metadata": {"labels": {labels.POOL: "l40s"}}},
                  {"metadata": {"labels": {"gpufleet.io/anything": "x"}}},
                  {"metadata": {"labels": {pool_label: "forged"}}}):
        status, why = _status(kubelet_a.patch_node, NODE_A, patch)
        assert status == 403 and "kubelet-membership" in why and KUBELET_PREFIX + NODE_A in why, (patch, why)
    node = prod_like.core.read_node(NODE_A)
    node.spec.taints = [t for t in node.spec.taints or [] if not t.key.startswith("gpufleet.io/")] + [
        client.V1Taint(key="gpufleet.io/forged", value="true", effect="NoSchedule")]
    status, why = _status(kubelet_a.replace_node, NODE_A, node)
    assert status == 403 and "taint" in why, why
    assert prod_like.core.read_node(NODE_A).metadata.resource_version == before  # nothing written


NODE_RESTRICTED = labels.NODE_POOL  # a label no kubelet can set (issue 24 item 2)


def test_no_kubelet_sets_a_node_restriction_label_on_its_node_at_registration_or_after(prod_like, kubelet_a):
    """The premise of membership a kubelet cannot forge: NodeRestriction (on the local API server, as in a kubeadm
    cluster) refuses a kubelet any `node-restriction.kubernetes.io/` label on its own Node, when it registers it
    and after (kubernetes v1.34 plugin/pkg/admission/noderestriction/admission.go; core/v1 well_known_labels.go
    LabelNamespaceNodeRestriction), while a trusted party (here the admin) may set one."""
    assert prod_like.core.read_node(NODE_A).metadata.labels[NODE_RESTRICTED] == "h100"  # a member, as the platform made it
    status, why = _status(kubelet_a.patch_node, NODE_A, {"metadata": {"labels": {NODE_RESTRICTED: "l40s"}}})
    assert status == 403 and "is not allowed to modify labels" in why and NODE_RESTRICTED in why, why
    newcomer = "gf-sec-newcomer"
    registering = client.CoreV1Api(as_kubelet(prod_like, newcomer))
    status, why = _status(registering.create_node, {"metadata": {"name": newcomer, "labels": {NODE_RESTRICTED: "h100"}}})
    assert status == 403 and "is not allowed to set the following labels" in why and NODE_RESTRICTED in why, why
    assert newcomer not in {n.metadata.name for n in prod_like.core.list_node().items}
    assert _status(prod_like.core.patch_node, NODE_A, {"metadata": {"labels": {NODE_RESTRICTED: "l40s"}}}) == (200, "")
    assert prod_like.core.read_node(NODE_A).metadata.labels[NODE_RESTRICTED] == "l40s"
    prod_like.core.patch_node(NODE_A, {"metadata": {"labels": {NODE_RESTRICTED: "h100"}}})


def test_a_kubelet_cannot_enrol_another_node(prod_like, kubelet_a):
    """NodeRestriction refuses a kubelet any other node (where a platform runs without it, the membership
    policy still refuses membership there: it keys on any kubelet's username)."""
    status, why = _status(kubelet_a.patch_node, NODE_B, {"metadata": {"labels": {labels.ROLE: labels.ROLE_SYSTEM}}})
    assert status == 403 and "is not allowed to modify node" in why and NODE_B in why, why


def test_a_kubelets_own_labels_enrol_nothing_while_the_platforms_do(prod_like):
    """A kubelet registers its Node claiming a pool and the spare role with labels it may set at registration
    (NodeRestriction and the membership policy judge neither). The membership plan, over the nodes as the
    reconciler's token reads them, gives it nothing and names it unproven, so no NodeSet pod (the pool's worker
    selector) and no promotion ever reaches it. A node the platform labelled with the pool's member selector (a
    `node-restriction.kubernetes.io/` label) joins, and the reconciler's own token writes its proven pool."""
    forger, proven = "gf-sec-forger", "gf-sec-proven"
    pool = prod_like.spec.pool("h100")
    claims = {labels.POOL: pool.name, labels.ROLE: labels.ROLE_SPARE, "nvidia.com/gpu.present": "true"}
    registering = client.CoreV1Api(as_kubelet(prod_like, forger))
    assert _status(registering.create_node, {"metadata": {"name": forger, "labels": claims}}) == (200, "")
    create_or_keep(prod_like.core.create_node, {"metadata": {"name": proven, "labels": dict(pool.member_selector)}})
    try:
        kube = Kube(prod_like.reconciler())
        nodes = [n for n in kube.list_nodes()[0] if n["metadata"]["name"] in (forger, proven)]
        plan = membership.plan(nodes, prod_like.spec)
        assert plan.unproven == (forger,) and [c.node for c in plan.changes] == [proven]
        for c in plan.changes:
            kube.apply_membership(c.node, dict(c.labels), list(c.add_taints), dict(c.annotations))
        assert prod_like.core.read_node(proven).metadata.labels[labels.NODE_POOL] == pool.name
        forged = prod_like.core.read_node(forger)
        assert labels.NODE_POOL not in forged.metadata.labels
        assert not [t.key for t in forged.spec.taints or [] if t.key.startswith(f"{labels.GROUP}/")]
        assert any(forged.metadata.labels.get(k) != v for k, v in worker_selector(pool).items())
        assert membership.plan([n for n in kube.list_nodes()[0] if n["metadata"]["name"] == forger],
                               prod_like.spec).changes == ()  # and stays so, pass after pass
    finally:
        for name in (forger, proven):
            assert _status(prod_like.core.delete_node, name)[0] in (200, 404)
