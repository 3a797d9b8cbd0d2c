"""Slurm on Kubernetes through SchedMD's Slinky: the operator and the Slurm custom resources.

One slurm-operator release for every environment (`gpufleet.fleetspec.models.SLINKY_RELEASE`, 1.2.1).
`operator.mode: helm` installs its slurm-operator-crds and slurm-operator charts; `crds-only`
installs gpufleet's own copy of that release's definitions instead (`slinky_schema.py`; the chart
cannot be pulled everywhere, e.g. the local environment), so the API server accepts and refuses
exactly what it would with the operator. One NodeSet per GPU pool, bound to the pool's nodes by
selector and tolerations, replaced one node at a time by default (`slurm.nodeset_update`).
Partitions are gpufleet's (the Controller's extraConf) over the operator's nodesets, which it
names after the NodeSets (`NodeSet=<pool> Feature=<pool>`, controllerbuilder/controller_config.go);
the operator's own partition per NodeSet stays off, so every job meets gpufleet's limits.
Around them: the LoginSet's sssd.conf Secret, Accounting with its database and password Secret,
gres.conf and topology.yaml for the pools, slurmctld's state on a claim the spec sizes, the RestApi,
and the reconciler's Token (beside the JWT key it is minted from, and a Role that lets the reconciler
read its Secret and nothing else here), minted for the reconciler's own Slurm user, which a Job declares in
accounting with the AdminLevel its calls need (SlurmUsers, `_slurm_users`). The control plane runs on the system pool.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import RECONCILER_ADMIN_LEVEL, SLURM_USER, FleetSpec, MariaDbDatabase

from .meta import metadata, namespace_metadata, resources
from .node_pool import GpuNodePool
from .slinky_schema import GROUP, KINDS, KNOWN_CONFIG_FILES, RESERVED_CONFIG_FILES, VERSION, crd_manifest

__all__ = ["API_VERSION", "GROUP", "KINDS", "SlinkySlurm", "SlinkySlurmArgs", "VERSION", "crd_manifest"]

API_VERSION = f"{GROUP}/{VERSION}"

# Names other components need before the Slurm resources exist (no dependency cycle). The operator
# names each Service after its CR (api/v1beta1/*_keys.go at v1.2.1): a Controller's `<name>-controller`,
# a RestApi's `<name>-restapi`, an Accounting's `<name>-accounting`, a LoginSet's `<name>`.
CLUSTER = "slurm"  # the Controller, the RestApi and the Accounting: Services slurm-controller, -restapi, -accounting
LOGIN = "login"  # the LoginSet: Service login
RESTAPI_NAME = CLUSTER
RESTAPI_SERVICE = f"{RESTAPI_NAME}-restapi"
RESTAPI_PORT = 6820
LOGIN_PORT = 22
TOPOLOGY = labels.SLURM_TOPOLOGY  # the block topology of topology.yaml; nodes join it as `blocks:<block>`
TOKEN_NAME = "gpufleet-reconciler"
TOKEN_SECRET = "gpufleet-reconciler-slurm-token"
# The longest gap between two informer resyncs of slurm-operator v1.2.1's manager (it sets no SyncPeriod:
# cmd/manager/main.go; controller-runtime v0.24 pkg/cache Options.SyncPeriod defaults to 10 h with up to 10 %
# jitter), and the shortest Token lifetime whose refresh point (exp - lifetime/5) comes after it.
OPERATOR_RESYNC_MAX_S = 11 * 3600
MIN_SAFE_TOKEN_LIFETIME_S = OPERATOR_RESYNC_MAX_S * 5 / 4
TOKEN_KEY = "SLURM_JWT"
JWT_SECRET, JWT_KEY = "slurm-auth-jwt", "jwt.key"
SLURM_KEY_SECRET, SLURM_KEY = "slurm-auth-slurm", "slurm.key"
SSSD_SECRET, SSSD_KEY = "slurm-sssd-conf", "sssd.conf"
DB_SECRET, DB_KEY = "slurm-accounting-db", "password"
CONFIG_FILES = "slurm-config-files"
SLURM_USERS = "gpufleet-slurm-users"  # the Job that declares the reconciler's Slurm user, and its script's ConfigMap
SLURM_USERS_SCRIPT = "ensure-users.sh"
SLURM_UID = 401  # the SlurmUser's uid in Slinky's images (slurm-operator v1.2.1 internal/builder/common/const.go)


def restapi_url(spec: FleetSpec) -> str:
    """Where the reconciler reaches slurmrestd: the Service the operator creates for the RestApi
    (restapibuilder/restapi_service.go: named `<RestApi>-restapi`)."""
    return f"http://{RESTAPI_SERVICE}.{spec.slurm.namespace}:{RESTAPI_PORT}"


def login_service(spec: FleetSpec) -> str:
    """The LoginSet's SSH Service (loginbuilder/login_service.go: named after the LoginSet)."""
    return f"{LOGIN}.{spec.slurm.namespace}.svc:{LOGIN_PORT}"


def minimal_sssd_conf() -> str:
    """Users from the image's own files, no directory service: the LoginSet needs an sssd.conf to
    start; a site with LDAP replaces this Secret's content."""
    return ("[sssd]\nconfig_file_version = 2\nservices = nss, pam\ndomains = local\n\n"
            "[nss]\nfilter_users = root,slurm\nfilter_groups = root,slurm\n\n[pam]\n\n"
            "[domain/local]\nid_provider = proxy\nproxy_lib_name = files\nauth_provider = none\n")


def gres_conf(spec: FleetSpec) -> str:
    """gres.conf for every pool: slurmd finds the GPUs itself (`AutoDetect=nvidia`: Slinky's images
    are built without NVML, its docs and helm/slurm/_vendor use this); each NodeSet registers its
    count (`Gres=gpu:N` in its slurmd --conf), so a node with fewer working GPUs does not register."""
    counts = ", ".join(f"{p.name} gpu:{p.gpus_per_node}" for p in spec.pools)
    return f"# gpufleet: GPUs per node by pool: {counts}\nAutoDetect=nvidia\n"


def topology_yaml(spec: FleetSpec) -> str | None:
    """topology.yaml (Slurm 26.05 topology.yaml(5)): a flat default, and a block topology whose blocks are
    the pools' `topology_block`s, empty: the nodes join at run time. slurm-operator v1.2.1 copies a
    Kubernetes node's `topology.slinky.slurm.net/spec` annotation (`blocks:<block>`, which gpufleet's
    membership sets on a pool's nodes) to the Slurm node of each NodeSet pod there (nodeset_sync.go
    syncSlurmTopology); Slurm's topology/block accepts only blocks declared here
    (plugins/topology/block topology_p_add_rm_node). A partition whose pools all sit in blocks uses
    it (`Topology=blocks`); the others stay flat. The base block size is the smallest block's node count
    (slurmctld refuses empty blocks without one). None when no pool declares a block."""
    sizes: dict[str, int] = {}
    for p in spec.pools:
        if p.topology_block:
            sizes[p.topology_block] = sizes.get(p.topology_block, 0) + p.nodes
    blocks = sorted(sizes)
    if not blocks:
        return None
    lines = ["# gpufleet: the pools' network blocks; nodes join them at run time (Topology=blocks:<block>)",
             "- topology: flat", "  cluster_default: true", "  flat: true",
             f"- topology: {TOPOLOGY}", "  block:", f"    block_sizes: [{max(1, min(sizes.values()))}]", "    blocks:"]
    lines += [f"      - block: {b}" for b in blocks]
    return "\n".join(lines) + "\n"


def config_files(spec: FleetSpec) -> dict[str, str]:
    """The files of the Controller's configFileRefs ConfigMap. The operator's webhook refuses
    slurm.conf and slurmdbd.conf there and warns for a file Slurm does not know."""
    files = {"gres.conf": spec.slurm.gres_conf if spec.slurm.gres_conf is not None else gres_conf(spec)}
    topo = topology_yaml(spec)
    if topo:
        files["topology.yaml"] = topo
    if spec.slurm.cgroup_conf is not None:  # the operator then writes none (controller_config.go hasCgroupConfFile)
        files["cgroup.conf"] = spec.slurm.cgroup_conf
    bad = [f for f in files if f in RESERVED_CONFIG_FILES or f not in KNOWN_CONFIG_FILES]
    if bad:
        raise ValueError(f"config files {bad} are reserved for the operator or unknown to Slurm")
    return files


def dedicated_reconciler_user(spec: FleetSpec) -> bool:
    """Whether the reconciler's Slurm user is one the stack declares (not root or the SlurmUser, which need
    nothing: slurmctld treats both as root; only the local cluster may use them)."""
    return spec.slurm.reconciler_user not in ("root", SLURM_USER)


def slurm_users_script(spec: FleetSpec) -> str:
    """The script of the SlurmUsers Job: the reconciler's Slurm user in accounting with its AdminLevel
    (gpufleet.fleetspec.models.RECONCILER_ADMIN_LEVEL), idempotent (sacctmgr(1) 26.05: `add` of an existing user adds
    nothing, `modify` sets the level again), and it fails unless accounting then shows that level. Under the
    cluster's root account: the association every registered cluster has."""
    user, level = spec.slurm.reconciler_user, RECONCILER_ADMIN_LEVEL
    return (
        "#!/bin/sh\n"
        "# gpufleet: the reconciler's Slurm user, declared by the stack (components/slinky.py SlurmUsers)\n"
        "set -u\n"
        f"user={user}\nlevel={level}\n"
        'sacctmgr -i add user name="$user" account=root adminlevel="$level" || true\n'
        'sacctmgr -i modify user where name="$user" set adminlevel="$level" || true\n'
        'got=$(sacctmgr -n -P show user name="$user" format=adminlevel)\n'
        'if [ "$got" != "$level" ]; then\n'
        '  echo "gpufleet: Slurm user $user has AdminLevel \'$got\', not $level (is slurmdbd up?)" >&2\n'
        "  exit 1\n"
        "fi\n"
        'echo "gpufleet: Slurm user $user has AdminLevel $level"\n'
    )


def slurm_users_job(spec: FleetSpec) -> dict:
    """The Job's spec: sacctmgr in Slinky's slurmctld image (the image slurm-operator v1.2.1's own e2e test runs
    `sacctmgr add user` in: test/e2e/e2e_test_utils.go), as the SlurmUser, with the operator's slurm.conf (the
    Controller's ConfigMap `<controller>-config`, api/v1beta1/controller_keys.go ConfigKey) and the Slurm key
    (auth/slurm) in /etc/slurm. Retried until slurmdbd and the cluster's registration are there."""
    files = {"projected": {"defaultMode": 0o440, "sources": [
        {"configMap": {"name": f"{CLUSTER}-config"}},
        {"secret": {"name": SLURM_KEY_SECRET, "items": [{"key": SLURM_KEY, "path": SLURM_KEY}]}},
    ]}}
    return {
        "backoffLimit": 30,
        "template": {"spec": {
            **system_placement(spec),
            "restartPolicy": "OnFailure",
            "securityContext": {"runAsUser": SLURM_UID, "runAsGroup": SLURM_UID, "fsGroup": SLURM_UID,
                                "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sacctmgr", "image": spec.slurm.image("slurmctld"),
                "command": ["/bin/sh", f"/etc/gpufleet/{SLURM_USERS_SCRIPT}"],
                "env": [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                "resources": resources("100m", "128Mi", "500m", "256Mi"),
                "volumeMounts": [{"name": "slurm", "mountPath": "/etc/slurm", "readOnly": True},
                                 {"name": "script", "mountPath": "/etc/gpufleet", "readOnly": True}],
            }],
            "volumes": [{"name": "slurm", **files},
                        {"name": "script", "configMap": {"name": SLURM_USERS}}],
        }},
    }


def system_placement(spec: FleetSpec) -> dict:
    """nodeSelector and tolerations of the system pool, for pods of the Slurm control plane."""
    sp = spec.system_pool
    return {"nodeSelector": dict(sp.node_selector),
            "tolerations": [t.model_dump(exclude_none=True) for t in sp.tolerations]}


def operator_values(spec: FleetSpec) -> dict:
    """Values of the slurm-operator chart (v1.2.1 helm/slurm-operator/values.yaml): cert-manager or not
    as the spec says, operator and webhook on the system pool."""
    placement = {"nodeSelector": dict(spec.system_pool.node_selector),
                 "tolerations": system_placement(spec)["tolerations"]}
    return {"certManager": {"enabled": spec.slurm.operator.cert_manager},
            "operator": placement, "webhook": placement}


def token_reader_rules() -> list[dict]:
    """What the reconciler may do in the Slurm namespace: read the Secret its Token writes, and patch that one
    Token (the nudge that makes slurm-operator reconcile it again when it stopped re-minting:
    reconciler/core/slurm_token.py; the admission policy `<ns>-reconciler-token-nudge` lets the patch change
    one annotation only), nothing else (no list: a name-limited get cannot be widened by a list)."""
    return [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TOKEN_SECRET], "verbs": ["get"]},
            {"apiGroups": ["slinky.slurm.net"], "resources": ["tokens"], "resourceNames": [TOKEN_NAME],
             "verbs": ["patch"]}]


def controller_extra_conf(spec: FleetSpec) -> str:
    """What gpufleet adds to the operator's slurm.conf (the Controller's extraConf). The operator writes
    neither GresTypes nor ReturnToService since 1.2.0 (controller_config.go, "prune all non-required
    Slurm config options"), and `NodeSet=<pool> Feature=<pool>` for every NodeSet itself; the partitions
    are gpufleet's, over those nodesets. Root runs no job (DisableRootJobs, slurm.conf(5) 26.05: a token
    or key that acts as root submits nothing)."""
    slurm = spec.slurm
    lines = ["DisableRootJobs=YES"] if slurm.disable_root_jobs else []
    lines += ["GresTypes=gpu", f"ReturnToService={slurm.return_to_service}"]
    for part in slurm.partitions:
        line = f"PartitionName={part.name} Nodes={','.join(part.pools)} State=UP"
        if part.default:
            line += " Default=YES"
        if part.max_time:
            line += f" MaxTime={part.max_time}"
        if all(spec.pool(p).topology_block for p in part.pools):
            line += f" Topology={TOPOLOGY}"  # topology.yaml's blocks
        lines.append(line)
    lines += slurm.extra_conf
    return "\n".join(lines) + "\n"


def controller_persistence(spec: FleetSpec) -> dict:
    """Controller.spec.persistence: the claim of slurmctld's saved state (enabled by default since 1.1.0;
    without access modes and a size Kubernetes refuses it and slurmctld never starts)."""
    st = spec.slurm.controller_storage
    out: dict = {"enabled": True, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": st.size}}}
    if st.storage_class:
        out["storageClassName"] = st.storage_class
    return out


def nodeset_update_strategy(spec: FleetSpec) -> dict:
    u = spec.slurm.nodeset_update
    if u.type == "OnDelete":
        return {"type": "OnDelete"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": u.max_unavailable}}


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

        # privileged: the NodeSet pods' slurmd runs privileged with BPF, NET_ADMIN, SYS_ADMIN and SYS_NICE
        # (slurm-operator v1.2.1 internal/builder/workerbuilder/worker_app.go); warned and audited at restricted
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=namespace_metadata(slurm.namespace, "slurm", env, "privileged"),
                                   opts=child)
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
            data=config_files(spec), opts=child)
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
            accounting = cr("Accounting", CLUSTER, {
                "slurmKeyRef": slurm_key_ref,
                "jwtKeyRef": jwt_key_ref,
                "slurmdbd": {"image": image("slurmdbd"), "resources": resources("500m", "1Gi", "2", "4Gi")},
                "storageConfig": {"host": db.host, "port": db.port, "database": db.database, "username": db.user,
                                  "passwordKeyRef": {"name": DB_SECRET, "key": DB_KEY}},
                "template": system,
            }, depends)

        controller = cr("Controller", CLUSTER, {
            "clusterName": slurm.cluster_name,
            "slurmKeyRef": slurm_key_ref,
            "jwtKeyRef": jwt_key_ref,
            **({"accountingRef": {"name": CLUSTER}} if accounting is not None else {}),
            "slurmctld": {"image": image("slurmctld"), "resources": resources("1", "2Gi", "4", "8Gi")},
            "persistence": controller_persistence(spec),
            "extraConf": controller_extra_conf(spec),
            "configFileRefs": [{"name": CONFIG_FILES}],
            "template": system,
        }, [*keys, files] + ([accounting] if accounting is not None else []))
        controller_ref = {"name": CLUSTER}
        self.slurm_users = None
        if accounting is not None and dedicated_reconciler_user(spec):
            self.slurm_users = self._slurm_users(name, spec, env, [accounting, controller, *keys])

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
                # The operator adds Features=<NodeSet> itself (workerbuilder/worker_app.go slurmdConfArgs).
                "extraConf": f"Gres=gpu:{pool.gpus_per_node}",
                "partition": {"enabled": False},  # gpufleet's partitions only: each carries its limits
                "updateStrategy": nodeset_update_strategy(spec),
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
            login = cr("LoginSet", LOGIN, {
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
                # lifetime and refresh: slurm-operator v1.2.1 stops re-minting after a pass that re-mints (its
                # Token reconcile returns RequeueAfter <= 0: internal/controller/token/token_sync.go Sync pushes
                # refreshTime.Sub(now) computed from the OLD token, token_controller.go Reconcile returns
                # durationStore.Pop, and the new Secret wakes nothing: its controller owner is the JWT-key
                # Secret, not the Token, so SetupWithManager's Owns(&corev1.Secret{}) maps it to no Token).
                # What still wakes it: a change of the Token, the operator's start, and the informers' resync
                # (controller-runtime v0.24 pkg/cache Options.SyncPeriod: 10 h, jittered by up to 10 %: at
                # most 11 h apart). That resync pass, before the refresh point, requeues it there with a
                # positive RequeueAfter. So a lifetime whose refresh point (4/5 of it) comes after 11 h,
                # i.e. >= 13.75 h (MIN_SAFE_TOKEN_LIFETIME_S), is always re-minted on time: the bug
                # cannot bite. A shorter one (the spec may ask for it) stalls at each refresh and the
                # reconciler's nudge wakes it (reconciler/runtime/token_alarm.py). `refresh: True` (the
                # default, said explicitly): false makes the Secret immutable and never re-mints it at all
                # (internal/builder/common/token_secret.go Immutable).
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

        self.login_endpoint = pulumi.Output.concat(LOGIN, ".", self.namespace, f".svc:{LOGIN_PORT}") if login \
            else pulumi.Output.from_input("")
        self.register_outputs({
            "namespace": self.namespace,
            "login_endpoint": self.login_endpoint,
            "operator_mode": self.operator_mode,
            "nodesets": list(self.nodesets),
            "restapi_url": restapi_url(spec) if slurm.restapi else "",
        })

    def _slurm_users(self, name: str, spec: FleetSpec, env: str, depends: list) -> k8s.batch.v1.Job:
        """SlurmUsers: the reconciler's Slurm user and its AdminLevel, declared by the stack as a Job in the Slurm
        namespace that runs `slurm_users_script` with sacctmgr. Why a Job: slurm-operator v1.2.1 has no resource
        for Slurm users or accounts (api/v1beta1: Controller, NodeSet, LoginSet, RestApi, Accounting, Token);
        slurmrestd's `/slurmdb/v0.0.45/users/` would need a super-user token where Pulumi runs (outside the
        cluster, with a copy of the JWT key), while the Job runs beside the key and slurm.conf it needs, in the
        namespace that already holds them, and is idempotent, so a re-run (a replaced Job, a restored database)
        converges. Pulumi does not wait for it (slurmdbd may come up later; the Job retries); the reconciler's
        Token for that user works once it has run (until then slurmrestd refuses its node updates)."""
        script = k8s.core.v1.ConfigMap(
            f"{name}-slurm-users-script", metadata=metadata(SLURM_USERS, "slurm-users", env, self.namespace),
            data={SLURM_USERS_SCRIPT: slurm_users_script(spec)}, opts=pulumi.ResourceOptions(parent=self))
        return k8s.batch.v1.Job(
            f"{name}-slurm-users",
            metadata=metadata(SLURM_USERS, "slurm-users", env, self.namespace,
                              annotations={"pulumi.com/skipAwait": "true"}),
            spec=slurm_users_job(spec),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[script, *depends],
                                        replace_on_changes=["spec"], delete_before_replace=True))

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
