"""Slurm on Kubernetes through SchedMD's Slinky: the operator and the Slurm custom resources.

`operator.mode: helm` installs the slurm-operator-crds and slurm-operator charts;
`crds-only` installs gpufleet's own definitions of the Slinky kinds instead (the chart
cannot be pulled everywhere, e.g. the local environment), so the API server still accepts
the Slurm resources (with the operator's field names and types: `slinky_schema.py`). One NodeSet
per GPU pool, bound to the pool's nodes by selector and tolerations; partitions map to NodeSets.
Around them: the LoginSet's sssd.conf Secret, Accounting with its database and password Secret,
gres.conf for the pools' GPUs, the RestApi, and the reconciler's Token (beside the JWT key it is
minted from, and a Role that lets the reconciler read its Secret and nothing else here). The control
plane runs on the system pool.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from fleetspec.models import FleetSpec, MariaDbDatabase

from .meta import metadata, resources
from .node_pool import GpuNodePool
from .slinky_schema import open_api_schema

GROUP = "slinky.slurm.net"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KINDS = ("Controller", "NodeSet", "LoginSet", "RestApi", "Accounting", "Token")


def _plural(kind: str) -> str:
    return kind.lower() + "s"


def crd_manifest(kind: str) -> dict:
    """gpufleet's definition of one Slinky kind (crds-only mode), with the operator's field names
    and types for everything the stack sets."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{_plural(kind)}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "gpufleet",
                                                                  "gpufleet.io/slinky-definitions": "crds-only"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": _plural(kind), "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": open_api_schema(kind)},
            }],
        },
    }


# Names other components need before the Slurm resources exist (no dependency cycle).
RESTAPI_NAME = "slurm-restapi"
RESTAPI_PORT = 6820
TOKEN_NAME = "gpufleet-reconciler"
TOKEN_SECRET = "gpufleet-reconciler-slurm-token"
TOKEN_KEY = "SLURM_JWT"
JWT_SECRET, JWT_KEY = "slurm-auth-jwt", "jwt.key"
SLURM_KEY_SECRET, SLURM_KEY = "slurm-auth-slurm", "slurm.key"
SSSD_SECRET, SSSD_KEY = "slurm-sssd-conf", "sssd.conf"
DB_SECRET, DB_KEY = "slurm-accounting-db", "password"
CONFIG_FILES = "slurm-config-files"


def restapi_url(spec: FleetSpec) -> str:
    """Where the reconciler reaches slurmrestd: the Service the operator creates for the RestApi."""
    return f"http://{RESTAPI_NAME}.{spec.slurm.namespace}:{RESTAPI_PORT}"


def minimal_sssd_conf() -> str:
    """Users from the image's own files, no directory service: the LoginSet needs an sssd.conf to
    start; a site with LDAP replaces this Secret's content."""
    return ("[sssd]\nconfig_file_version = 2\nservices = nss, pam\ndomains = local\n\n"
            "[nss]\nfilter_users = root,slurm\nfilter_groups = root,slurm\n\n[pam]\n\n"
            "[domain/local]\nid_provider = proxy\nproxy_lib_name = files\nauth_provider = none\n")


def gres_conf(spec: FleetSpec) -> str:
    """gres.conf for every pool: slurmd finds the GPUs through NVML; each NodeSet registers its
    count (`Gres=gpu:N` in its slurmd --conf), so a node with fewer working GPUs does not register."""
    counts = ", ".join(f"{p.name} gpu:{p.gpus_per_node}" for p in spec.pools)
    return f"# gpufleet: GPUs per node by pool: {counts}\nAutoDetect=nvml\n"


def system_placement(spec: FleetSpec) -> dict:
    """nodeSelector and tolerations of the system pool, for pods of the Slurm control plane."""
    sp = spec.system_pool
    return {"nodeSelector": dict(sp.node_selector),
            "tolerations": [t.model_dump(exclude_none=True) for t in sp.tolerations]}


def system_affinity(spec: FleetSpec) -> dict:
    """The system pool as node affinity (the operator chart takes affinity, not a nodeSelector)."""
    terms = [{"key": k, "operator": "In", "values": [v]} for k, v in spec.system_pool.node_selector.items()]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def operator_values(spec: FleetSpec) -> dict:
    """Values of the slurm-operator chart: cert-manager or not as the spec says, on the system pool."""
    placement = {"affinity": system_affinity(spec), "tolerations": system_placement(spec)["tolerations"]}
    return {"certManager": {"enabled": spec.slurm.operator.cert_manager},
            "operator": placement, "webhook": placement}


def token_reader_rules() -> list[dict]:
    """What the reconciler may do in the Slurm namespace: read the Secret its Token writes, and nothing else
    (no list: a name-limited get cannot be widened by a list)."""
    return [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TOKEN_SECRET], "verbs": ["get"]}]


def extra_slurm_conf(spec: FleetSpec) -> str:
    """slurm.conf lines the stack adds: root runs no job (DisableRootJobs, slurm.conf(5) 26.05: a token or
    key that acts as root submits nothing), and partitions: each pool's NodeSet is a Slurm nodeset named
    after the pool."""
    lines = ["DisableRootJobs=YES", "GresTypes=gpu"] + [f"NodeSet={p.name} Feature={p.name}" for p in spec.pools]
    for part in spec.slurm.partitions:
        line = f"PartitionName={part.name} Nodes={','.join(part.pools)} State=UP"
        if part.default:
            line += " Default=YES"
        if part.max_time:
            line += f" MaxTime={part.max_time}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass
class SlinkySlurmArgs:
    spec: FleetSpec
    pools: dict[str, GpuNodePool]
    slurm_key: pulumi.Input[str] = ""
    jwt_key: pulumi.Input[str] = ""
    db_password: pulumi.Input[str] = ""
    reconciler_namespace: pulumi.Input[str] | None = None  # the reconciler's: its account reads the Token's Secret
    reconciler_account: str = "gpufleet-reconciler"  # the reconciler's ServiceAccount
    operator_chart: bool = True  # False: a render that leaves the operator's charts out (installed apart)


class SlinkySlurm(pulumi.ComponentResource):
    namespace: pulumi.Output[str]
    login_endpoint: pulumi.Output[str]
    operator_mode: str
    nodesets: dict[str, k8s.apiextensions.CustomResource]
    token: k8s.apiextensions.CustomResource | None

    def __init__(self, name: str, args: SlinkySlurmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:slurm:SlinkySlurm", name, None, opts)
        spec, slurm, env = args.spec, args.spec.slurm, args.spec.environment
        child = pulumi.ResourceOptions(parent=self)
        image = slurm.image  # registry/name:tag, @digest where the stack file records one

        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=metadata(slurm.namespace, "slurm", env), opts=child)
        self.namespace = ns.metadata.name

        # The operator, or gpufleet's definitions of its kinds.
        self.operator_mode = slurm.operator.mode
        if slurm.operator.mode == "helm" and not args.operator_chart:
            self.operator_mode = "helm (charts left out of this render: install them apart)"
            ready = []
        elif slurm.operator.mode == "helm":
            crds = k8s.helm.v3.Release(
                f"{name}-operator-crds",
                chart=f"{slurm.operator.repository}/slurm-operator-crds", version=slurm.operator.chart_version,
                namespace=self.namespace, opts=child)
            operator = k8s.helm.v3.Release(
                f"{name}-operator",
                chart=f"{slurm.operator.repository}/slurm-operator", version=slurm.operator.chart_version,
                namespace=self.namespace, create_namespace=False, values=operator_values(spec),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[crds]))
            ready = [crds, operator]
        else:
            ready = [
                k8s.apiextensions.v1.CustomResourceDefinition(f"{name}-crd-{kind.lower()}", **_crd_args(kind), opts=child)
                for kind in KINDS
            ]

        def secret(res: str, sname: str, data: dict, namespace=None) -> k8s.core.v1.Secret:
            return k8s.core.v1.Secret(f"{name}-{res}", metadata=metadata(sname, "slurm", env, namespace or self.namespace),
                                      string_data=data, opts=child)

        # Keys for Slurm's own auth (auth/slurm) and JWTs (auth/jwt): Pulumi secrets in, Secrets out.
        keys = [secret("slurm-key", SLURM_KEY_SECRET, {SLURM_KEY: args.slurm_key}),
                secret("jwt-key", JWT_SECRET, {JWT_KEY: args.jwt_key})]
        slurm_key_ref = {"name": SLURM_KEY_SECRET, "key": SLURM_KEY}
        jwt_key_ref = {"name": JWT_SECRET, "key": JWT_KEY}
        files = k8s.core.v1.ConfigMap(
            f"{name}-config-files", metadata=metadata(CONFIG_FILES, "slurm", env, self.namespace),
            data={"gres.conf": gres_conf(spec)}, opts=child)
        system = {"spec": system_placement(spec)}

        def cr(kind: str, cr_name: str, body: dict, depends: list | None = None,
               namespace=None) -> k8s.apiextensions.CustomResource:
            return k8s.apiextensions.CustomResource(
                f"{name}-{kind.lower()}-{cr_name}",
                api_version=API_VERSION, kind=kind,
                metadata=metadata(cr_name, f"slurm-{kind.lower()}", env, namespace or self.namespace),
                spec=body,
                opts=pulumi.ResourceOptions(parent=self, depends_on=ready + (depends or [])),
            )

        accounting = None
        acct = slurm.accounting
        if acct.enabled and acct.database is not None:
            db = acct.database
            db_secret = secret("accounting-db", DB_SECRET, {DB_KEY: args.db_password})
            depends = [db_secret, *keys]
            if isinstance(db, MariaDbDatabase):
                depends.append(self._mariadb(name, spec, db, env, child))
            accounting = cr("Accounting", "accounting", {
                "slurmKeyRef": slurm_key_ref,
                "jwtKeyRef": jwt_key_ref,
                "slurmdbd": {"image": image("slurmdbd"), "resources": resources("500m", "1Gi", "2", "4Gi")},
                "storageConfig": {"host": db.host, "port": db.port, "database": db.database, "username": db.user,
                                  "passwordKeyRef": {"name": DB_SECRET, "key": DB_KEY}},
                "template": system,
            }, depends)

        controller = cr("Controller", "slurm", {
            "clusterName": slurm.cluster_name,
            "slurmKeyRef": slurm_key_ref,
            "jwtKeyRef": jwt_key_ref,
            **({"accountingRef": {"name": "accounting"}} if accounting is not None else {}),
            "slurmctld": {"image": image("slurmctld"), "resources": resources("1", "2Gi", "4", "8Gi")},
            "extraConf": extra_slurm_conf(spec),
            "configFileRefs": [{"name": CONFIG_FILES}],
            "template": system,
        }, [*keys, files] + ([accounting] if accounting is not None else []))
        controller_ref = {"name": "slurm"}

        # Claims are named after the storage (SharedStorage creates them in this namespace).
        volumes = [{"name": s.name, "persistentVolumeClaim": {"claimName": s.name}} for s in spec.storage]
        mounts = [{"name": s.name, "mountPath": s.mount_path} for s in spec.storage]

        self.nodesets = {}
        for pool in spec.pools:
            p = args.pools[pool.name]
            self.nodesets[pool.name] = cr("NodeSet", pool.name, {
                "controllerRef": controller_ref,
                "replicas": pool.nodes,
                "slurmd": {
                    "image": image("slurmd"),
                    "resources": {"limits": {"nvidia.com/gpu": pool.gpus_per_node}},
                    "volumeMounts": mounts,
                },
                "extraConf": f"Features={pool.name} Gres=gpu:{pool.gpus_per_node}",
                "partition": {"enabled": True},
                "template": {"spec": {
                    "nodeSelector": p.selector,
                    "tolerations": p.tolerations,
                    "volumes": volumes,
                }},
            }, [controller])

        login = None
        if slurm.login.replicas:
            sssd = secret("sssd-conf", SSSD_SECRET, {SSSD_KEY: minimal_sssd_conf()})
            service: dict = {"spec": {"type": slurm.login.service_type}}
            if slurm.login.service_annotations:
                service["metadata"] = {"annotations": dict(slurm.login.service_annotations)}
            login = cr("LoginSet", "login", {
                "controllerRef": controller_ref,
                "replicas": slurm.login.replicas,
                "login": {"image": image("login"), "volumeMounts": mounts,
                          "resources": resources("500m", "1Gi", "2", "4Gi")},
                "rootSshAuthorizedKeys": "\n".join(slurm.login.ssh_authorized_keys),
                "sssdConfRef": {"name": SSSD_SECRET, "key": SSSD_KEY},
                "template": {"spec": {"volumes": volumes, **system_placement(spec)}},
                "service": service,
            }, [controller, sssd])

        self.token = None
        if slurm.restapi:
            cr("RestApi", RESTAPI_NAME, {
                "controllerRef": controller_ref, "replicas": 1,
                "slurmrestd": {"image": image("slurmrestd"), "resources": resources("250m", "512Mi", "1", "1Gi")},
                "template": system,
            }, [controller])
            if args.reconciler_namespace is not None:
                # The Token lives with the key, in this namespace: slurm-operator v1.2.1 reads the Token's
                # jwtKeyRef and writes its secretRef in the Token's own namespace (api/v1beta1/token_keys.go,
                # internal/builder/common/token_secret.go), so a Token elsewhere needs a copy of the key
                # there, and whoever reads Secrets there mints tokens for any Slurm user, root included.
                # The reconciler reads only the minted token: `get` on that one Secret, by name.
                self.token = cr("Token", TOKEN_NAME, {
                    "jwtKeyRef": jwt_key_ref,
                    "username": slurm.reconciler_user,
                    "lifetime": slurm.token_lifetime,
                    "refresh": True,
                    "secretRef": {"name": TOKEN_SECRET, "key": TOKEN_KEY},
                }, keys)
                reader = k8s.rbac.v1.Role(
                    f"{name}-token-reader", metadata=metadata(TOKEN_SECRET, "slurm", env, self.namespace),
                    rules=token_reader_rules(), opts=child)
                k8s.rbac.v1.RoleBinding(
                    f"{name}-token-reader", metadata=metadata(TOKEN_SECRET, "slurm", env, self.namespace),
                    role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": reader.metadata.name},
                    subjects=[{"kind": "ServiceAccount", "name": args.reconciler_account,
                               "namespace": args.reconciler_namespace}], opts=child)

        self.login_endpoint = pulumi.Output.concat("login-slurm.", self.namespace, ".svc:22") if login \
            else pulumi.Output.from_input("")
        self.register_outputs({
            "namespace": self.namespace,
            "login_endpoint": self.login_endpoint,
            "operator_mode": self.operator_mode,
            "nodesets": list(self.nodesets),
            "restapi_url": restapi_url(spec) if slurm.restapi else "",
        })

    def _mariadb(self, name: str, spec: FleetSpec, db: MariaDbDatabase, env: str,
                 child: pulumi.ResourceOptions) -> k8s.apps.v1.StatefulSet:
        """One MariaDB for slurmdbd, on the system pool, its data on a claim of its own."""
        selector = {"app.kubernetes.io/name": "mariadb", "app.kubernetes.io/instance": env}
        k8s.core.v1.Service(
            f"{name}-mariadb-svc", metadata=metadata(db.host, "slurm-database", env, self.namespace),
            spec={"selector": selector, "ports": [{"name": "mysql", "port": db.port}]}, opts=child)
        claim: dict = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": db.size}}}
        if db.storage_class:
            claim["storageClassName"] = db.storage_class
        password = {"secretKeyRef": {"name": DB_SECRET, "key": DB_KEY}}
        return k8s.apps.v1.StatefulSet(
            f"{name}-mariadb", metadata=metadata("mariadb", "slurm-database", env, self.namespace),
            spec={
                "serviceName": db.host, "replicas": 1, "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": metadata("mariadb", "slurm-database", env)["labels"]},
                    "spec": {**system_placement(spec), "containers": [{
                        "name": "mariadb", "image": db.image,
                        "env": [{"name": "MARIADB_DATABASE", "value": db.database},
                                {"name": "MARIADB_USER", "value": db.user},
                                {"name": "MARIADB_PASSWORD", "valueFrom": password},
                                {"name": "MARIADB_RANDOM_ROOT_PASSWORD", "value": "1"}],
                        "ports": [{"name": "mysql", "containerPort": db.port}],
                        "resources": resources("500m", "1Gi", "2", "4Gi"),
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}],
                    }]},
                },
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}],
            },
            opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(create="5m")),
        )


def _crd_args(kind: str) -> dict:
    m = crd_manifest(kind)
    return {"metadata": m["metadata"], "spec": m["spec"]}
