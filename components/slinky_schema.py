"""Structural schemas of the Slinky v1beta1 kinds, for clusters without the operator's CRD chart.

Field names and types follow SchedMD slurm-operator's `api/v1beta1` types for every field gpufleet
sets: a misspelt or misplaced field is unknown here as it is there, so the API server rejects it
under strict field validation (kubectl's default) instead of the operator refusing it in production.
Where the operator keeps a Kubernetes type open (containers, pod specs, service specs, statuses), so
does this: those are `x-kubernetes-preserve-unknown-fields`, exactly as in its CRDs.
"""
from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
OPEN: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
STRING_MAP: Schema = {"type": "object", "additionalProperties": STRING}


def obj(required: tuple[str, ...] = (), rules: tuple[tuple[str, str], ...] = (), **props: Schema) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    return out


def enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


SECRET_KEY = obj(("key",), name=STRING, key=STRING, optional=BOOLEAN)
CONFIG_MAP_KEY = obj(("key",), name=STRING, key=STRING, optional=BOOLEAN)
LOCAL_REF = obj(name=STRING)
OBJECT_REF = obj(("name",), name=STRING, namespace=STRING)
METADATA = obj(labels=STRING_MAP, annotations=STRING_MAP)
CONTAINER = OPEN  # ContainerWrapper: a corev1.Container, preserved
POD_TEMPLATE = obj(metadata=METADATA, spec=OPEN)
SERVICE = obj(metadata=METADATA, spec=OPEN, port=INTEGER, nodePort=INTEGER)
EXTERNAL = obj(host=STRING, port=INTEGER)
METRICS = obj(enabled=BOOLEAN, serviceMonitor=OPEN)
REFS = {"type": "array", "items": LOCAL_REF, "nullable": True}
JWT_RULE = ("!self.external ? has(self.jwtKeyRef) || has(self.jwtHs256KeyRef) : true",
            "jwtKeyRef or jwtHs256KeyRef must be set when external is false")
KEY_RULE = ("!self.external ? has(self.slurmKeyRef) : true", "slurmKeyRef must be set when external is false")

SPECS: dict[str, Schema] = {
    "Controller": obj(
        rules=(KEY_RULE, JWT_RULE),
        clusterName=STRING, slurmKeyRef=SECRET_KEY, jwtHs256KeyRef=SECRET_KEY, jwtKeyRef=SECRET_KEY,
        jwksKeyRef=CONFIG_MAP_KEY, accountingRef=LOCAL_REF, external={**BOOLEAN, "default": False},
        externalConfig=EXTERNAL, slurmctld=CONTAINER, inplaceReconfigure=BOOLEAN, reconfigure=CONTAINER,
        logfile=CONTAINER, template=POD_TEMPLATE, extraConf=STRING, configFileRefs=REFS,
        prologScriptRefs=REFS, epilogScriptRefs=REFS, prologSlurmctldScriptRefs=REFS, epilogSlurmctldScriptRefs=REFS,
        persistence={**OPEN, "properties": {"enabled": BOOLEAN, "existingClaim": STRING}},
        service=SERVICE, metrics=METRICS,
    ),
    "NodeSet": obj(
        ("controllerRef",),
        controllerRef=OBJECT_REF, replicas=INTEGER, scalingMode=enum("DaemonSet", "StatefulSet"),
        slurmd=CONTAINER, ssh=obj(enabled=BOOLEAN, extraSshdConfig=STRING, sssdConfRef=SECRET_KEY),
        logfile=CONTAINER, template=POD_TEMPLATE, extraConf=STRING,
        partition=obj(enabled=BOOLEAN, config=STRING),
        volumeClaimTemplates={"type": "array", "nullable": True, "items": OPEN},
        updateStrategy=obj(type=enum("RollingUpdate", "OnDelete"), rollingUpdate=obj(
            maxUnavailable={"x-kubernetes-int-or-string": True, "anyOf": [INTEGER, STRING]})),
        revisionHistoryLimit=INTEGER, persistentVolumeClaimRetentionPolicy=obj(
            whenDeleted=enum("Retain", "Delete"), whenScaled=enum("Retain", "Delete")),
        minReadySeconds=INTEGER, ordinalPadding=INTEGER, taintKubeNodes=BOOLEAN, workloadDisruptionProtection=BOOLEAN,
    ),
    "LoginSet": obj(
        ("controllerRef",),
        controllerRef=LOCAL_REF, replicas=INTEGER, login=CONTAINER, initconf=CONTAINER, template=POD_TEMPLATE,
        rootSshAuthorizedKeys=STRING, extraSshdConfig=STRING, sssdConfRef=SECRET_KEY, strategy=OPEN, service=SERVICE,
    ),
    "RestApi": obj(
        ("controllerRef",),
        controllerRef=LOCAL_REF, replicas=INTEGER, slurmrestd=CONTAINER, template=POD_TEMPLATE, service=SERVICE,
    ),
    "Accounting": obj(
        rules=(KEY_RULE, JWT_RULE),
        slurmKeyRef=SECRET_KEY, jwtHs256KeyRef=SECRET_KEY, jwtKeyRef=SECRET_KEY, jwksKeyRef=CONFIG_MAP_KEY,
        external={**BOOLEAN, "default": False}, externalConfig=EXTERNAL, slurmdbd=CONTAINER, template=POD_TEMPLATE,
        storageConfig=obj(("host", "passwordKeyRef"), host=STRING, port=INTEGER, database=STRING, username=STRING,
                          passwordKeyRef=SECRET_KEY),
        extraConf=STRING, service=SERVICE,
    ),
    "Token": obj(
        ("username",),
        rules=(("has(self.jwtKeyRef) || has(self.jwtHs256KeyRef)", "jwtKeyRef or jwtHs256KeyRef must be set"),),
        jwtHs256KeyRef=SECRET_KEY, jwtKeyRef=SECRET_KEY, username=STRING, lifetime=STRING, refresh=BOOLEAN,
        secretRef=SECRET_KEY,
    ),
}


def open_api_schema(kind: str) -> Schema:
    """The kind's openAPIV3Schema: a structural spec, an open status."""
    return {"type": "object", "properties": {"spec": SPECS[kind], "status": OPEN}}


def strict_json_schema(schema: Schema) -> Schema:
    """The same schema as plain JSON Schema with unknown fields refused where the API server
    refuses them under strict field validation (everywhere but the preserved parts); CEL rules dropped."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("nullable"):
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
    return out
