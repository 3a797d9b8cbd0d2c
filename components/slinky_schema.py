"""The Slinky kinds as SchedMD's slurm-operator v1.2.1 defines them: its CRDs, written again here.

gpufleet pins one operator release for every environment (`RELEASE`); this module is that release's
API as gpufleet's own code: every field of the six kinds (spec and status), with their types,
required fields, enums, defaults, patterns and CEL rules, the short names, printer columns and
subresources. It follows slurm-operator v1.2.1 `config/crd/bases/slinky.slurm.net_*.yaml` (generated
from `api/v1beta1/*_types.go`); descriptions are left out. Where the operator keeps a Kubernetes
type open (containers, pod specs, service specs), so does this: `x-kubernetes-preserve-unknown-fields`,
exactly as there.

The local environment installs these definitions (`operator.mode: crds-only`), so the API server
refuses what the release's CRDs refuse. The release also refuses through its validating webhook
(`internal/webhook/*_webhook.go`); the rules of it that a CR alone decides are `WEBHOOK_RULES`, added
to the local definitions as CEL rules (marked as the webhook's), so that a CR the release refuses is
refused locally too. What the webhook decides from other objects (a configFileRefs ConfigMap that
holds slurm.conf) is checked where gpufleet builds them (components/slinky.py).

Upgrading the operator is one pin (`RELEASE`, `IMAGE_TAG`) and one schema change here, reviewed
together; `scripts/check-slinky-schema.py --crds DIR` compares this module with a release's CRD
files and names every difference.
"""
from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

RELEASE = "1.2.1"  # slurm-operator and its charts (slurm-operator-crds, slurm-operator)
# The Slurm images that release ships (helm/slurm/values.yaml at v1.2.1: 26.05-ubuntu26.04), and the
# slurmrestd data parser gpufleet speaks to them (Slurm 26.05: v0.0.45).
IMAGE_TAG = "26.05-ubuntu26.04"
SLURM_VERSION = "26.05"
REST_VERSION = "v0.0.45"

GROUP = "slinky.slurm.net"
VERSION = "v1beta1"
KINDS = ("Controller", "NodeSet", "LoginSet", "RestApi", "Accounting", "Token")

# --- building blocks (each as controller-gen writes the Go type) ------------------------------------

STRING: Schema = {"type": "string"}
BOOLEAN: Schema = {"type": "boolean"}
INTEGER: Schema = {"type": "integer"}
INT32: Schema = {"type": "integer", "format": "int32"}
INT64: Schema = {"type": "integer", "format": "int64"}
PRESERVE: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
INT_OR_STRING: Schema = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
QUANTITY: Schema = {
    **INT_OR_STRING,
    "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
}
DURATION_PATTERN = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


def default(schema: Schema, value: Any) -> Schema:
    return {**schema, "default": value}


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def obj(required: tuple[str, ...] = (), rules: tuple[tuple[str, str], ...] = (), map_type: str | None = None,
        **props: Schema) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    if map_type:
        out["x-kubernetes-map-type"] = map_type
    return out


def array(items: Schema, list_type: str | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items}
    if list_type:
        out["x-kubernetes-list-type"] = list_type
    return out


def string_map() -> Schema:
    return {"type": "object", "additionalProperties": STRING}


def enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


# corev1.SecretKeySelector / ConfigMapKeySelector / LocalObjectReference.
KEY_SELECTOR = obj(("key",), map_type="atomic", key=STRING, name=default(STRING, ""), optional=BOOLEAN)
LOCAL_REF = obj(map_type="atomic", name=default(STRING, ""))
REF_LIST = nullable(array(LOCAL_REF))
METADATA = obj(annotations=nullable(string_map()), labels=nullable(string_map()))
POD_TEMPLATE = obj(metadata=METADATA, spec=PRESERVE)  # PodTemplate: spec is a corev1.PodSpec, preserved
SERVICE = obj(metadata=METADATA, nodePort=INTEGER, port=INTEGER, spec=PRESERVE)  # ServiceSpec
EXTERNAL_CONFIG = obj(("host", "port"), host=STRING, port=INTEGER)
CONDITIONS = {**array(obj(
    ("lastTransitionTime", "message", "reason", "status", "type"),
    lastTransitionTime={"type": "string", "format": "date-time"},
    message={"type": "string", "maxLength": 32768},
    observedGeneration={"type": "integer", "format": "int64", "minimum": 0},
    reason={"type": "string", "maxLength": 1024, "minLength": 1, "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
    status=enum("True", "False", "Unknown"),
    type={"type": "string", "maxLength": 316,
          "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
), list_type="map"), "x-kubernetes-list-map-keys": ["type"]}
CONDITIONS_STATUS = obj(conditions=CONDITIONS)

# Controller.spec.persistence: ControllerPersistence (enabled, existingClaim) + an inline corev1.PersistentVolumeClaimSpec.
PERSISTENCE = obj(
    ("enabled",),
    accessModes=array(STRING, "atomic"),
    dataSource=obj(("kind", "name"), map_type="atomic", apiGroup=STRING, kind=STRING, name=STRING),
    dataSourceRef=obj(("kind", "name"), apiGroup=STRING, kind=STRING, name=STRING, namespace=STRING),
    enabled=default(BOOLEAN, True),
    existingClaim=STRING,
    resources=obj(limits={"type": "object", "additionalProperties": QUANTITY},
                  requests={"type": "object", "additionalProperties": QUANTITY}),
    selector=obj(
        map_type="atomic",
        matchExpressions=array(obj(("key", "operator"), key=STRING, operator=STRING, values=array(STRING, "atomic")),
                               "atomic"),
        matchLabels=string_map(),
    ),
    storageClassName=STRING,
    volumeAttributesClassName=STRING,
    volumeMode=STRING,
    volumeName=STRING,
)
METRICS = obj(
    enabled=default(BOOLEAN, False),
    serviceMonitor=nullable(obj(
        annotations=nullable(string_map()),
        enabled=default(BOOLEAN, False),
        endpoints=nullable(array(obj(("path",), interval={"type": "string", "pattern": DURATION_PATTERN}, path=STRING,
                                     scrapeTimeout={"type": "string", "pattern": DURATION_PATTERN}))),
        interval={"type": "string", "pattern": DURATION_PATTERN},
        labels=nullable(string_map()),
        scrapeTimeout={"type": "string", "pattern": DURATION_PATTERN},
    )),
)

KEY_RULE = ("!self.external ? has(self.slurmKeyRef) : true", "slurmKeyRef must be set when external is false")
JWT_RULE = ("!self.external ? has(self.jwtKeyRef) || has(self.jwtHs256KeyRef) : true",
            "jwtKeyRef or jwtHs256KeyRef must be set when external is false")
EXTERNAL_RULE = ("self.external ? has(self.externalConfig) : true", "externalConfig must be set when external is true")

SPECS: dict[str, Schema] = {
    # api/v1beta1/controller_types.go
    "Controller": obj(
        rules=(KEY_RULE, JWT_RULE, EXTERNAL_RULE),
        accountingRef=LOCAL_REF,
        clusterName=STRING,
        configFileRefs=REF_LIST,
        epilogScriptRefs=REF_LIST,
        epilogSlurmctldScriptRefs=REF_LIST,
        external=default(BOOLEAN, False),
        externalConfig=EXTERNAL_CONFIG,
        extraConf=STRING,
        inplaceReconfigure=default(BOOLEAN, False),
        jwksKeyRef=KEY_SELECTOR,
        jwtHs256KeyRef=KEY_SELECTOR,
        jwtKeyRef=KEY_SELECTOR,
        logfile=PRESERVE,
        metrics=METRICS,
        persistence=PERSISTENCE,
        prologScriptRefs=REF_LIST,
        prologSlurmctldScriptRefs=REF_LIST,
        reconfigure=PRESERVE,
        service=SERVICE,
        slurmKeyRef=KEY_SELECTOR,
        slurmctld=PRESERVE,
        template=POD_TEMPLATE,
    ),
    # api/v1beta1/nodeset_types.go
    "NodeSet": obj(
        ("controllerRef",),
        controllerRef=LOCAL_REF,
        extraConf=STRING,
        logfile=PRESERVE,
        minReadySeconds=INT32,
        ordinalPadding=default(INTEGER, 0),
        oversubscribeNode=default(BOOLEAN, False),
        partition=obj(("enabled",), config={"type": "string", "pattern": r"^[^\n]+$"}, enabled=default(BOOLEAN, False)),
        persistentVolumeClaimRetentionPolicy=obj(whenDeleted=default(enum("Retain", "Delete"), "Retain"),
                                                 whenScaled=default(enum("Retain", "Delete"), "Retain")),
        pinToNode=default(BOOLEAN, False),
        pruneSlurmNodeRecords=default(enum("Never", "NodeNotFound"), "Never"),
        replicas=default(INT32, 1),
        revisionHistoryLimit=default(INT32, 0),
        scalingMode=default(enum("DaemonSet", "StatefulSet"), "StatefulSet"),
        slurmd=PRESERVE,
        ssh=obj(("enabled", "sssdConfRef"), enabled=default(BOOLEAN, False), extraSshdConfig=STRING,
                sssdConfRef=KEY_SELECTOR),
        template=POD_TEMPLATE,
        updateStrategy=obj(
            rules=(("self.type != 'ScheduledUpdate' || (has(self.scheduledUpdate.startTime) && "
                    "has(self.scheduledUpdate.duration))",
                    "scheduledUpdate.startTime and scheduledUpdate.duration are required when type is ScheduledUpdate"),),
            rollingUpdate=obj(maxUnavailable=default(INT_OR_STRING, "25%")),
            scheduledUpdate=obj(duration=default(STRING, "30m"), flags=nullable(array(STRING)),
                                startTime={"type": "string", "format": "date-time"}),
            type=default(enum("RollingUpdate", "OnDelete", "ScheduledUpdate"), "RollingUpdate"),
        ),
        volumeClaimTemplates={"nullable": True, "x-kubernetes-preserve-unknown-fields": True},
        workloadDisruptionProtection=default(BOOLEAN, True),
    ),
    # api/v1beta1/loginset_types.go
    "LoginSet": obj(
        ("controllerRef", "sssdConfRef"),
        controllerRef=LOCAL_REF,
        extraSshdConfig=STRING,
        initconf=PRESERVE,
        login=PRESERVE,
        replicas=default(INT32, 1),
        rootSshAuthorizedKeys=STRING,
        service=SERVICE,
        sssdConfRef=KEY_SELECTOR,
        strategy=obj(rollingUpdate=obj(maxSurge=INT_OR_STRING, maxUnavailable=INT_OR_STRING), type=STRING),
        template=POD_TEMPLATE,
    ),
    # api/v1beta1/restapi_types.go
    "RestApi": obj(
        ("controllerRef",),
        controllerRef=LOCAL_REF,
        replicas=default(INT32, 1),
        service=SERVICE,
        slurmrestd=PRESERVE,
        template=POD_TEMPLATE,
    ),
    # api/v1beta1/accounting_types.go
    "Accounting": obj(
        rules=(KEY_RULE, JWT_RULE, EXTERNAL_RULE),
        external=default(BOOLEAN, False),
        externalConfig=EXTERNAL_CONFIG,
        extraConf=STRING,
        jwksKeyRef=KEY_SELECTOR,
        jwtHs256KeyRef=KEY_SELECTOR,
        jwtKeyRef=KEY_SELECTOR,
        service=SERVICE,
        slurmKeyRef=KEY_SELECTOR,
        slurmdbd=PRESERVE,
        storageConfig=obj(("host", "passwordKeyRef"), database=default(STRING, "slurm_acct_db"), host=STRING,
                          passwordKeyRef=KEY_SELECTOR, port=default(INTEGER, 3306), username=STRING),
        template=POD_TEMPLATE,
    ),
    # api/v1beta1/token_types.go
    "Token": obj(
        ("username",),
        rules=(("has(self.jwtKeyRef) || has(self.jwtHs256KeyRef)", "jwtKeyRef or jwtHs256KeyRef must be set"),),
        jwtHs256KeyRef=KEY_SELECTOR,
        jwtKeyRef=KEY_SELECTOR,
        lifetime=STRING,
        refresh=default(BOOLEAN, True),
        secretRef=KEY_SELECTOR,
        username=STRING,
    ),
}

STATUSES: dict[str, Schema] = {
    "Controller": CONDITIONS_STATUS,
    "RestApi": CONDITIONS_STATUS,
    "Accounting": CONDITIONS_STATUS,
    "Token": obj(conditions=CONDITIONS, issuedAt={"type": "string", "format": "date-time"}),
    "LoginSet": obj(("selector",), conditions=CONDITIONS, replicas=INT32, selector=STRING),
    "NodeSet": obj(
        ("nodeSetHash", "selector"),
        availableReplicas=INT32, collisionCount=INT32, conditions=CONDITIONS, desired=INT32, nodeSetHash=STRING,
        observedGeneration=INT64, ordinalToNode=nullable(string_map()), readyReplicas=INT32, replicas=INT32,
        selector=STRING, slurmAllocated=INT32, slurmDown=INT32, slurmDrain=INT32, slurmIdle=INT32,
        unavailableReplicas=INT32, updatedReplicas=INT32,
    ),
}

SHORT_NAMES = {
    "Controller": ["slurmctld"], "NodeSet": ["nodesets", "nss", "slurmd"], "LoginSet": ["loginsets", "lss", "sackd"],
    "RestApi": ["slurmrestd"], "Accounting": ["slurmdbd"], "Token": ["tokens", "jwt"],
}
SCALED = ("NodeSet", "LoginSet")  # a scale subresource over spec.replicas

AGE = {"jsonPath": ".metadata.creationTimestamp", "name": "AGE", "type": "date"}
PRINTER_COLUMNS: dict[str, list[Schema]] = {
    "Controller": [AGE], "RestApi": [AGE], "Accounting": [AGE],
    "Token": [{"jsonPath": ".spec.username", "name": "USER", "type": "string"},
              {"jsonPath": ".status.issuedAt", "name": "IAT", "type": "date"}, AGE],
    "LoginSet": [{"jsonPath": ".status.replicas", "name": "REPLICAS", "type": "integer"}, AGE],
    "NodeSet": [
        {"jsonPath": ".status.desired", "name": "DESIRED", "type": "integer"},
        {"jsonPath": ".status.replicas", "name": "REPLICAS", "type": "integer"},
        {"jsonPath": ".status.updatedReplicas", "name": "UPDATED", "type": "integer"},
        {"jsonPath": ".status.readyReplicas", "name": "READY", "type": "integer"},
        {"jsonPath": ".status.slurmIdle", "name": "IDLE", "priority": 1, "type": "integer"},
        {"jsonPath": ".status.slurmAllocated", "name": "ALLOCATED", "priority": 1, "type": "integer"},
        {"jsonPath": ".status.slurmDown", "name": "DOWN", "priority": 1, "type": "integer"},
        {"jsonPath": ".status.slurmDrain", "name": "DRAIN", "priority": 1, "type": "integer"},
        AGE,
    ],
}

# --- the validating webhook's rules that a CR decides alone (internal/webhook/*_webhook.go at v1.2.1) ---

CLUSTER_NAME_MAX = 40  # controller_webhook.go ValidateCreate: "ClusterName exceeds 40 characters"


def _jwt_ref(s: str) -> str:
    """AuthJwtRef() (api/v1beta1/*_keys.go): jwtKeyRef if set, else jwtHs256KeyRef, as name/key."""
    return (f"(has({s}.jwtKeyRef) ? {s}.jwtKeyRef.name + '/' + {s}.jwtKeyRef.key : "
            f"has({s}.jwtHs256KeyRef) ? {s}.jwtHs256KeyRef.name + '/' + {s}.jwtHs256KeyRef.key : '')")


_JWT_FIXED = (f"{_jwt_ref('self')} == {_jwt_ref('oldSelf')}",
              "the value of JwtKeyRef or JwtHs256KeyRef cannot be modified after deployment")
_CONTROLLER_REF_SET = ("has(self.controllerRef.name) && self.controllerRef.name != ''",
                       "controllerRef.name must not be empty")
_CONTROLLER_REF_FIXED = ("(has(self.controllerRef.name) ? self.controllerRef.name : '') == "
                         "(has(oldSelf.controllerRef.name) ? oldSelf.controllerRef.name : '')",
                         "cannot change controllerRef after deployment")

WEBHOOK_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "Controller": (
        (f"!has(self.clusterName) || size(self.clusterName) <= {CLUSTER_NAME_MAX}",
         f"ClusterName exceeds {CLUSTER_NAME_MAX} characters"),
        ("(has(self.clusterName) ? self.clusterName : '') == (has(oldSelf.clusterName) ? oldSelf.clusterName : '')",
         "cannot change ClusterName after deployment"),
        ("(has(self.slurmKeyRef) && has(self.slurmKeyRef.name) ? self.slurmKeyRef.name : '') == "
         "(has(oldSelf.slurmKeyRef) && has(oldSelf.slurmKeyRef.name) ? oldSelf.slurmKeyRef.name : '')",
         "cannot change SlurmKeyRef after deployment"),
        _JWT_FIXED,
        ("(has(self.persistence) ? self.persistence.enabled : true) == "
         "(has(oldSelf.persistence) ? oldSelf.persistence.enabled : true)",
         "cannot change persistence.enabled after deployment"),
    ),
    "NodeSet": (
        _CONTROLLER_REF_SET,
        ("!has(self.updateStrategy) || !has(self.updateStrategy.rollingUpdate) || "
         "!has(self.updateStrategy.rollingUpdate.maxUnavailable) || "
         "(type(self.updateStrategy.rollingUpdate.maxUnavailable) == int ? "
         "int(self.updateStrategy.rollingUpdate.maxUnavailable) > 0 : "
         "string(self.updateStrategy.rollingUpdate.maxUnavailable) != '0%')",
         "maxUnavailable must be > 0 and must not be 0%"),
        ("!has(self.updateStrategy) || !has(self.updateStrategy.scheduledUpdate) || "
         "!has(self.updateStrategy.scheduledUpdate.duration) || "
         "duration(self.updateStrategy.scheduledUpdate.duration) >= duration('1m')",
         "UpdateStrategy.ScheduledUpdate.Duration must be at least 1 minute"),
        ("!has(self.ssh) || !self.ssh.enabled || (has(self.ssh.sssdConfRef.name) && self.ssh.sssdConfRef.name != '')",
         "ssh.sssdConfRef.name must not be empty when ssh is enabled"),
        _CONTROLLER_REF_FIXED,
    ),
    "LoginSet": (
        _CONTROLLER_REF_SET,
        ("has(self.sssdConfRef.name) && self.sssdConfRef.name != ''", "sssdConfRef.name must not be empty"),
        _CONTROLLER_REF_FIXED,
    ),
    "Accounting": (_JWT_FIXED,),
    "Token": (_JWT_FIXED,),
    "RestApi": (),
}
# Files the webhook reserves for the operator in a Controller's configFileRefs, and those it knows
# (any other is accepted with a warning: Slurm ignores it unless another file includes it).
RESERVED_CONFIG_FILES = ("slurm.conf", "slurmdbd.conf")
KNOWN_CONFIG_FILES = ("acct_gather.conf", "burst_buffer.conf", "cgroup.conf", "cli_filter.lua", "gres.conf",
                      "helpers.conf", "job_container.conf", "job_submit.lua", "mpi.conf", "namespace.yaml", "oci.conf",
                      "plugstack.conf", "topology.conf", "topology.yaml")


def spec_schema(kind: str, with_webhook: bool = True) -> Schema:
    """The kind's spec schema; with the webhook's rules added (the local definitions)."""
    spec = dict(SPECS[kind])
    rules = list(spec.get("x-kubernetes-validations", []))
    if with_webhook:
        rules += [{"rule": r, "message": f"{m} (slurm-operator webhook)"} for r, m in WEBHOOK_RULES[kind]]
    if rules:
        spec["x-kubernetes-validations"] = rules
    return spec


def open_api_schema(kind: str, with_webhook: bool = True) -> Schema:
    """The kind's openAPIV3Schema, as the release's CRD has it (plus the webhook's rules)."""
    return {"type": "object", "properties": {
        "apiVersion": STRING, "kind": STRING, "metadata": {"type": "object"},
        "spec": spec_schema(kind, with_webhook), "status": STATUSES[kind],
    }}


def plural(kind: str) -> str:
    return kind.lower() + "s"


def crd_manifest(kind: str, with_webhook: bool = True) -> dict:
    """The CustomResourceDefinition of one kind: the release's, labelled as gpufleet's copy."""
    subresources: dict[str, Any] = {"status": {}}
    if kind in SCALED:
        subresources["scale"] = {"labelSelectorPath": ".status.selector", "specReplicasPath": ".spec.replicas",
                                 "statusReplicasPath": ".status.replicas"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural(kind)}.{GROUP}", "labels": {
            "app.kubernetes.io/part-of": "gpufleet", "gpufleet.io/slinky-definitions": "crds-only",
            "gpufleet.io/slinky-release": RELEASE}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural(kind), "shortNames": SHORT_NAMES[kind],
                      "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "additionalPrinterColumns": PRINTER_COLUMNS[kind],
                "subresources": subresources,
                "schema": {"openAPIV3Schema": open_api_schema(kind, with_webhook)},
            }],
        },
    }


# --- the same schema as plain JSON Schema (unit tests and the render check) -------------------------

def strict_json_schema(schema: Schema) -> Schema:
    """`schema` as plain JSON Schema, unknown fields refused where the API server refuses them under
    strict field validation (everywhere but the preserved parts); CEL rules and defaults dropped."""
    if not isinstance(schema, dict):
        return schema
    skip = ("nullable", "default", "format")
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k not in skip}
    if schema.get("nullable") and "type" in schema:
        out["type"] = [schema["type"], "null"]
    if "properties" in schema:
        out["properties"] = {k: strict_json_schema(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = strict_json_schema(schema[key])
    if "anyOf" in schema:
        out["anyOf"] = [strict_json_schema(s) for s in schema["anyOf"]]
    if schema.get("x-kubernetes-int-or-string") and "pattern" in schema:
        # A pattern applies to the string form only (a quantity may be an integer).
        out.pop("pattern")
        out["anyOf"] = [{"type": "integer"}, {"type": "string", "pattern": schema["pattern"]}]
    return out
