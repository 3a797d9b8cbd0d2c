"""The reconciler and its node agent, deployed by the same stack that declares the fleet.

Least privilege: named verbs on named resources only, no cluster-admin; the reconciler's namespace
enforces Pod Security `restricted` (the agent has a namespace of its own: components/agent.py), and
admission policies narrow what its verbs may touch (components/admission.py). The healing policy is
the fleet spec itself, rendered into a ConfigMap the reconciler reads; webhook URLs (they carry
tokens) go into a Secret, never the ConfigMap.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.fleetspec.models import FleetSpec, WebhookTarget

from .admission import declare_admission
from .agent import declare_agent
from .dashboard import dashboard_config_map
from .meta import metadata, namespace_metadata, resources
from .slinky import TOKEN_KEY, TOKEN_SECRET, restapi_url

NAME = "gpufleet-reconciler"
METRICS_PORT = 9102
HEALTH_PORT = 9103  # the probes' own port: a slow or hostile scrape of /metrics never fails a probe


CONFIG_CHECKSUM = labels.CONFIG_CHECKSUM
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"


def config_checksum(policy: str, secrets: dict[str, str]) -> str:
    """sha256 over the rendered policy and the Secret values the reconciler reads at start-up: on
    the pod template, a change of either rolls the Deployment. (The Slurm token is re-read from its
    file, so it is not part of it.)"""
    doc = json.dumps({"policy": policy, "secrets": dict(sorted(secrets.items()))}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def reconciler_args(spec: FleetSpec, slurm_url: str | None = None) -> list[str]:
    """The reconciler's command line: its policy, leader election, and Slinky's path to Slurm
    (slurmrestd of the RestApi, with the token the Token resource keeps fresh in its Secret, read through
    the API server: the Secret lives in the Slurm namespace, with the JWT key the token is minted from).
    `slurm_url`: where slurmrestd is reached when not through the RestApi's Service (the local
    environment's host-network pods)."""
    dep = spec.healing.reconciler
    args = ["reconcile", "--policy", "/etc/gpufleet/fleet.json", "--leader-elect",
            "--namespace", dep.namespace, "--metrics-port", str(METRICS_PORT), "--health-port", str(HEALTH_PORT)]
    if spec.slurm.restapi:
        args += ["--slurm", "rest", "--slurm-url", slurm_url or restapi_url(spec), "--slurm-token-secret",
                 f"{spec.slurm.namespace}/{TOKEN_SECRET}/{TOKEN_KEY}",
                 "--slurm-user", spec.slurm.reconciler_user]
    return args


def lends(spec: FleetSpec | None) -> bool:
    return spec is not None and bool(spec.lending_pools())


def cluster_rules(spec: FleetSpec | None = None) -> list[dict]:
    """What the reconciler may do cluster-wide: exactly the calls of reconciler/adapters/kube.py and records.py;
    tests/integration/test_reconciler_rbac.py makes each call with the reconciler's token and checks that each
    verb less is refused."""
    node_verbs = ["get", "list", "watch", "patch", "update"]
    pod_verbs = ["list", "watch"]
    if lends(spec):
        pod_verbs.append("delete")  # a borrower still there after the reclaim grace, in whatever namespace (lending)
    repairs = []
    if spec is None or spec.healing.repair.enabled:
        # issue 25: a repaired, proven node's GPU condition is set back to healthy (kube.set_condition)
        repairs.append({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]})
    return repairs + [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": node_verbs},
        {"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [labels.GROUP], "resources": [remediation_crd.PLURAL],
         "verbs": ["list", "watch", "create", "delete"]},  # delete: retention of finished remediations
        # the status is written only through its subresource (records.py): the spec is never updated
        {"apiGroups": [labels.GROUP], "resources": [f"{remediation_crd.PLURAL}/status"], "verbs": ["update"]},
    ]


def namespace_rules(spec: FleetSpec | None = None) -> list[dict]:
    """In its own namespace: the leader-election Lease, the placeholder pods that declare a
    kubernetes-spares refill and the Events the cluster autoscaler answers them with (the policy is a
    mounted file, not read through the API), and, when a
    pool lends, the lending ledger: the stack declares it, the reconciler only reads and patches it."""
    rules = [
        # (listing them is the cluster-wide pods list the informers need already; so is deleting them, when a
        # pool lends: no second grant of the same verb here)
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"] if lends(spec) else ["create", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        # the cluster autoscaler's answer to a placeholder (its NotTriggerScaleUp Events there), read at once
        # (reconciler/adapters/providers.py capacity_refusals)
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    ]
    if lends(spec):
        rules.append({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [labels.LENDING_LEDGER],
                      "verbs": ["get", "patch"]})
    if spec is None or spec.healing.repair.enabled:
        # issue 25: the health-check Jobs (reconciler/adapters/health_checks.py): made and read here, never
        # deleted (their TTL does); their pods are read with the cluster-wide pods list above
        rules.append({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]})
    return rules


def reconciler_username(spec: FleetSpec) -> str:
    """The reconciler's identity as the API server names it (its ServiceAccount)."""
    return f"system:serviceaccount:{spec.healing.reconciler.namespace}:{NAME}"


def pod_security_level(args: "ReconcilerArgs") -> str:
    """What the reconciler's namespace enforces: `restricted`, except in the local environment, whose pods
    must use the host's network (no pod network there), which only `privileged` admits; there admission
    policies still keep the reconciler's own pods restricted (components/admission.py)."""
    return "privileged" if args.host_network_api is not None else "restricted"


def slurm_namespace_rules(spec: FleetSpec | None = None) -> list[dict]:
    """In the Slurm namespace: delete of the NodeSet pods a stale busy-pod PodDisruptionBudget still keeps at
    the drain timeout (healing, reconciler/core/decide.py end_eviction, which picks only this namespace's), and
    the NodeSet pods of a machine that stopped answering, deleted with grace 0 (reconciler/core/node_lost.py).
    None when a pool lends: the cluster-wide pod delete covers them then (no second grant of the same verb)."""
    return [] if lends(spec) else [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]


def notification_env(spec: FleetSpec) -> dict[str, str]:
    """Env var per webhook target, read from the notifications Secret."""
    return {n.name: f"GPUFLEET_WEBHOOK_{n.name.upper().replace('-', '_')}"
            for n in spec.healing.notifications if isinstance(n, WebhookTarget)}


@dataclass(frozen=True)
class HostNetworkApi:
    """Where pods on the host's network reach the API server (the local environment: its kubelet nodes
    run pods with hostNetwork, and the API server listens on loopback, not on the Service IP)."""
    host: str
    port: int
    slurm_url: str | None = None  # the local slurmrestd on loopback (no cluster DNS for the RestApi's Service)


@dataclass
class ReconcilerArgs:
    spec: FleetSpec
    webhook_urls: dict[str, pulumi.Input[str]] = field(default_factory=dict)  # target name -> secret URL
    host_network_api: HostNetworkApi | None = None


@dataclass(frozen=True)
class Placement:
    pod: dict                      # pod-spec fields
    env: list[dict]                # container env
    probe: dict                    # the httpGet of both probes
    args: list[str]                # extra reconcile arguments
    slurm_url: str | None = None   # slurmrestd, where not the RestApi's Service
    strategy: dict | None = None   # the Deployment's, when the default would not roll


def placement(args: ReconcilerArgs) -> Placement:
    """Where and how the reconciler pods run.

    On a cluster: the system pool, the in-cluster Service for the API server. With ``host_network_api``
    (the local environment): the host's network, so the pods reach the API server and Slurm on
    loopback; probes go to 127.0.0.1 (the node's address is not where they listen); the hostPort that
    hostNetwork implies spreads the replicas over the system nodes.
    """
    system = args.spec.system_pool  # the system pool the spec declares (never a GPU node)
    pod = {"nodeSelector": dict(system.node_selector),
           **({"tolerations": [t.model_dump(exclude_none=True) for t in system.tolerations]} if system.tolerations else {})}
    probe = {"path": "/healthz", "port": HEALTH_PORT}
    api = args.host_network_api
    if api is None:
        return Placement(pod, [], probe, [])
    return Placement(
        {**pod, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"},
        [{"name": "KUBERNETES_SERVICE_HOST", "value": api.host},
         {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)}],
        {**probe, "host": "127.0.0.1"},
        [] if api.slurm_url and args.spec.slurm.restapi else ["--slurm", "none"],
        api.slurm_url,
        # The hostPort holds one pod per node: a surge pod would wait for a free node forever (found by a
        # real rollout). Replace one pod at a time instead; the PDB and the other replica keep one up.
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
    )


class Reconciler(pulumi.ComponentResource):
    namespace: pulumi.Output[str]
    policy_config_map: k8s.core.v1.ConfigMap
    lending_ledger: k8s.core.v1.ConfigMap | None
    deployment: k8s.apps.v1.Deployment

    def __init__(self, name: str, args: ReconcilerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:reconciler:Reconciler", name, None, opts)
        spec, env = args.spec, args.spec.environment
        dep = spec.healing.reconciler
        child = pulumi.ResourceOptions(parent=self)
        meta = lambda n, comp="reconciler", ns=True, **kw: metadata(  # noqa: E731
            n, comp, env, self.namespace if ns else None, **kw)

        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=namespace_metadata(dep.namespace, "reconciler", env,
                                                                             pod_security_level(args)), opts=child)
        self.namespace = ns.metadata.name

        crd = k8s.apiextensions.v1.CustomResourceDefinition(
            f"{name}-remediation-crd",
            metadata=remediation_crd.manifest()["metadata"], spec=remediation_crd.manifest()["spec"], opts=child)

        # IRSA: the role the spec names gives the Auto Scaling and SNS calls their credentials.
        irsa = {IRSA_ANNOTATION: dep.iam_role_arn} if dep.iam_role_arn else None
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta(NAME, annotations=irsa), opts=child)
        self._name, self._spec, self.service_account = name, spec, sa
        role = k8s.rbac.v1.ClusterRole(f"{name}-clusterrole", metadata=meta(NAME, ns=False), rules=cluster_rules(spec),
                                       opts=child)
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-clusterrolebinding", metadata=meta(NAME, ns=False),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": sa.metadata.name, "namespace": self.namespace}], opts=child)
        ns_role = k8s.rbac.v1.Role(f"{name}-role", metadata=meta(NAME), rules=namespace_rules(spec), opts=child)
        k8s.rbac.v1.RoleBinding(
            f"{name}-rolebinding", metadata=meta(NAME),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ns_role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": sa.metadata.name, "namespace": self.namespace}], opts=child)

        policy = spec.model_dump_json(indent=2)
        self.policy_config_map = k8s.core.v1.ConfigMap(
            f"{name}-policy", metadata=meta("gpufleet-policy"),
            data={"fleet.json": policy}, opts=child)

        # The lending ledger: loans and capacity per pool. The reconciler writes `data` (get + patch on this name
        # only); the stack declares the object and leaves its data alone, so `pulumi up` never rolls it back.
        self.lending_ledger = k8s.core.v1.ConfigMap(
            f"{name}-lending-ledger", metadata=meta(labels.LENDING_LEDGER, "lending"), data={},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["data"])) if spec.lending_pools() else None

        if spec.healing.grafana_dashboard:
            dashboard_config_map(f"{name}-dashboard", spec, self.namespace, child)

        env_names = notification_env(spec)
        env_from = []
        if args.webhook_urls:
            secret = k8s.core.v1.Secret(
                f"{name}-notifications", metadata=meta("gpufleet-notifications"),
                string_data={env_names[n]: url for n, url in args.webhook_urls.items()}, opts=child)
            env_from = [{"secretRef": {"name": secret.metadata.name}}]

        selector = {labels.APP_NAME: NAME, labels.APP_INSTANCE: env}
        pod_labels = metadata(NAME, "reconciler", env)["labels"]
        names = sorted(args.webhook_urls)
        # A hash of the secrets is no secret: unsecret it, so a preview shows the roll.
        checksum = pulumi.Output.unsecret(pulumi.Output.all(*[args.webhook_urls[n] for n in names]).apply(
            lambda urls: config_checksum(policy, {env_names[n]: u for n, u in zip(names, urls)})))
        place = placement(args)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta(NAME),
            spec={
                "replicas": dep.replicas,
                **({"strategy": place.strategy} if place.strategy else {}),
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": pod_labels,
                                 "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                                                 CONFIG_CHECKSUM: checksum}},
                    "spec": {
                        "serviceAccountName": sa.metadata.name,
                        **place.pod,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "reconciler",
                            "image": dep.image,
                            "args": [*reconciler_args(spec, slurm_url=place.slurm_url), *place.args],
                            # The replica's name (its leader-election identity).
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    *place.env],
                            "envFrom": env_from,
                            "ports": [{"name": "metrics", "containerPort": METRICS_PORT},
                                      {"name": "health", "containerPort": HEALTH_PORT}],
                            "livenessProbe": {"httpGet": place.probe},
                            "readinessProbe": {"httpGet": place.probe},
                            "resources": resources("100m", "128Mi", "1", "512Mi"),
                            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "policy", "mountPath": "/etc/gpufleet", "readOnly": True}],
                        }],
                        "volumes": [{"name": "policy", "configMap": {"name": self.policy_config_map.metadata.name}}],
                    },
                },
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[crd]),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata=meta(NAME),
            spec={"minAvailable": 1, "selector": {"matchLabels": selector}}, opts=child)
        k8s.core.v1.Service(
            f"{name}-metrics", metadata=meta(f"{NAME}-metrics"),
            spec={"selector": selector, "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]},
            opts=child)

        # The node agent (components/agent.py): a namespace of its own, its own identity.
        self.agent = declare_agent(name, spec, self)
        # What RBAC cannot say about both identities: admission policies (components/admission.py).
        declare_admission(name, spec, reconciler_username(spec), self)
        self.register_outputs({
            "namespace": self.namespace,
            "policy_config_map": self.policy_config_map.metadata.name,
            "deployment": self.deployment.metadata.name,
            "lending_ledger": self.lending_ledger.metadata.name if self.lending_ledger else None,
        })

    def grant_in_slurm_namespace(self, slurm_namespace: pulumi.Input[str]) -> k8s.rbac.v1.Role | None:
        """The Role in the Slurm namespace (slurm_namespace_rules), bound to the reconciler's ServiceAccount.
        Declared once that namespace exists (it is the Slurm component's, which comes after this one)."""
        rules = slurm_namespace_rules(self._spec)
        if not rules:
            return None
        env, child = self._spec.environment, pulumi.ResourceOptions(parent=self)
        meta = metadata(f"{NAME}-nodeset-pods", "reconciler", env, slurm_namespace)
        role = k8s.rbac.v1.Role(f"{self._name}-slurm-role", metadata=meta, rules=rules, opts=child)
        k8s.rbac.v1.RoleBinding(
            f"{self._name}-slurm-rolebinding", metadata=meta,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": self.service_account.metadata.name,
                       "namespace": self.namespace}], opts=child)
        return role
