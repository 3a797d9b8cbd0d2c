"""The `Remediation` custom resource definition: one object per healed (or held) node.

Plain data, shared by the stack (which installs it), the reconciler (which writes it) and the CLI.
Cluster-scoped like the nodes it is about, so `kubectl get remediations` lists them all.

`spec` says what happened (node, pool, XID); the reconciler never changes it. `status` is the
reconciler's memory and is written only through the status subresource, so a person's edit of the spec
and the reconciler's status writes never race; the schema is structural, so `kubectl explain
remediation.status` describes it and the API server refuses a hand edit that would not read back.

Conditions follow Kubernetes' metav1.Condition (as Cluster API's health checks use them), with the
typed reasons below:
- `Contained`: cordoned, drained in Slurm, its jobs checkpointed and requeued;
- `RemediationAllowed`: admission let it be replaced (False: `TooManyUnhealthy` is the storm brake for the
  node's pool, with the counts in the message; `MaxConcurrent`; `OptedOut`; `AttemptsExhausted`);
- `Replaced`: a spare took its place and runs its Slurm nodes (False with `ReplacementFailed` while it takes
  another spare because the one promoted broke; the message says which, and `status.failedReplacements` keeps
  each, with why);
- `Refilled`: the node asked for to refill the pool's spares came (`RefillAnswered`), is awaited
  (`RefillRequested`), or did not (`RefillFailed`: the provider had no room, or nobody answered in time).
`kubectl get remediations` shows the admission column, so a held pool is one command away:
`kubectl get rem -l gpufleet.io/pool=<pool>`.
"""
from __future__ import annotations

from enum import StrEnum

from . import labels
from .faults.catalogue import FaultAction, Kind

PLURAL = "remediations"
KIND = "Remediation"
VERSION = "v1alpha1"
NAME = f"{PLURAL}.{labels.GROUP}"

# The phases of a remediation (the reconciler's state machine, reconciler/core/phases.py, uses these words).
PHASES = ("Diagnosing", "Detected", "SlurmDraining", "Checkpointing", "Requeued", "Held", "OptedOut", "Evicting", "Replacing",
          "WaitingForSpare", "Resuming", "Succeeded", "Escalated", "Failed")
# The phases of the node's repair once its heal is over (reconciler/core/repair_phases.py, issue 25).
REPAIR_PHASES = ("Repairing", "Validating", "Returned", "Retired", "Stopped", "Gone", "Waiting")
# The stages of a diagnosis while the phase is Diagnosing (reconciler/core/diagnosis_stages.py).
DIAGNOSIS_STAGES = ("Draining", "Clearing", "Checking", "Returning", "Passed", "Failed", "Cleared")


class ConditionType(StrEnum):
    CONTAINED = "Contained"
    REMEDIATION_ALLOWED = "RemediationAllowed"
    REPLACED = "Replaced"
    REFILLED = "Refilled"


class Reason(StrEnum):
    """Why a condition is what it is; also the gates' reasons in metrics and logs."""

    CONTAINING = "Containing"  # cordoned; draining in Slurm, checkpointing
    CONTAINED = "Contained"
    ADMISSION_PENDING = "AdmissionPending"  # contained, admission not decided yet (the admission hold)
    ADMITTED = "Admitted"
    TOO_MANY_UNHEALTHY = "TooManyUnhealthy"  # the storm brake holds the pool
    MAX_CONCURRENT = "MaxConcurrent"
    OPTED_OUT = "OptedOut"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"  # escalated to a human
    HEALING_DISABLED = "HealingDisabled"  # no remediation starts (a gate only; never on an object)
    REPLACING = "Replacing"  # evicting, choosing, taking back or promoting a spare
    WAITING_FOR_SPARE = "WaitingForSpare"
    RESUMING = "Resuming"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REPLACEMENT_FAILED = "ReplacementFailed"  # the spare promoted for it broke; another is taken
    STOOD_IN = "StoodIn"  # this node stood in for another's and broke: quarantined, that one takes another spare
    REFILL_REQUESTED = "RefillRequested"
    REFILL_ANSWERED = "RefillAnswered"
    REFILL_FAILED = "RefillFailed"


def _time(**kw) -> dict:
    return {"type": "string", "format": "date-time", **kw}


def _strings() -> dict:
    return {"type": "array", "items": {"type": "string"}}


def condition_schema() -> dict:
    """metav1.Condition's schema (k8s.io/apimachinery pkg/apis/meta/v1 types.go, v0.34)."""
    return {
        "type": "object",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": {"type": "string", "maxLength": 316,
                     "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "lastTransitionTime": _time(),
            "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                       "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
            "message": {"type": "string", "maxLength": 32768},
        },
    }


def repair_schema() -> dict:
    """`status.repair`: the node's repair, with its history (reconciler/adapters/repair_records.py writes it)."""
    time = _time()
    return {
        "type": "object",
        "description": "The node's repair once its heal is over: reset, reboot, health check, back or retired.",
        "required": ["phase", "started"],
        "properties": {
            "phase": {"type": "string", "enum": list(REPAIR_PHASES)},
            "started": time,
            "step": {"type": "string", "description": "The rung being climbed (reset-gpu, reboot), or validate."},
            "phases": {"type": "array", "items": {"type": "object", "required": ["phase", "at"],
                                                  "properties": {"phase": {"type": "string"}, "at": time}}},
            "attempt": {"type": "integer", "minimum": 0},
            "request": {"type": "string", "description": "The id of the reset or reboot asked for (acted on once)."},
            "requestedAt": time,
            "bootID": {"type": "string", "description": "The node's boot id when the step began."},
            "deadline": time,
            "job": {"type": "string", "description": "The health-check Job of this attempt."},
            "reason": {"type": "string"},
            "history": {"type": "array", "description": "Every step tried, and how it went.", "items": {
                "type": "object", "required": ["step", "outcome", "at"],
                "properties": {"step": {"type": "string"}, "outcome": {"type": "string"}, "at": time,
                               "message": {"type": "string"}}}},
            "stoppedFrom": {"type": "string"},
            "gpus": _strings(),
            "rungs": _strings(),
            "resent": {"type": "boolean"},
            "inPlace": {"type": "boolean"},
            "error": {"type": "string", "description": "Stopped by an error a person must fix (then gpufleet return)."},
        },
    }


def diagnosis_schema() -> dict:
    """`status.diagnosis`: the health check a repeated application fault asks for while the node stays in service."""
    time = _time()
    return {
        "type": "object",
        "description": "Diagnostics asked (NVIDIA's RUN_DCGMEUD): drained in Slurm, checked once idle, back if it passes.",
        "required": ["stage", "started"],
        "properties": {
            "stage": {"type": "string", "enum": list(DIAGNOSIS_STAGES)},
            "started": time,
            "stages": {"type": "array", "items": {"type": "object", "required": ["stage", "at"],
                                                  "properties": {"stage": {"type": "string"}, "at": time}}},
            "drained": {**_strings(), "description": "The Slurm nodes gpufleet drained for it."},
            "job": {"type": "string", "description": "The health-check Job."},
            "deadline": time,
            "held": {"type": "string", "description": "Why a person holds it now."},
            "needs": {"type": "string", "description": "Failed: what the node needs now."},
            "message": {"type": "string"},
        },
    }


def status_schema() -> dict:
    return {
        "type": "object",
        "description": "The reconciler's memory of this remediation: everything a restart needs.",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES), "description": "Where the remediation is."},
            "created": _time(description="When the fault was taken up."),
            "phases": {"type": "array", "description": "Every phase entered, and when.",
                       "items": {"type": "object", "required": ["phase", "at"],
                                 "properties": {"phase": {"type": "string", "enum": list(PHASES)}, "at": _time()}}},
            "reason": {"type": "string", "description": "What happened, for a person."},
            "replacement": {"type": "string", "description": "The spare chosen to replace the node."},
            "jobs": {"type": "array", "items": {"type": "integer"}, "description": "Slurm jobs requeued off the node."},
            "graceDeadline": _time(description="Until then the jobs may checkpoint."),
            "drainDeadline": _time(description="Until then the node's pods are waited for."),
            "intents": {**_strings(), "description": "Once-only actions begun (never repeated after a crash)."},
            "retries": {"type": "integer", "minimum": 0},
            "slurmNodes": {**_strings(), "description": "The node's Slurm nodes when containment began."},
            "jobNodes": {**_strings(), "description": "Every Slurm node its jobs ran on when they were signalled."},
            "keptDrains": {**_strings(), "description": "Of those, the ones a person had drained: left alone."},
            "heldMessage": {"type": "string", "description": "Why admission holds it."},
            "heldReason": {"type": "string", "description": "The gate holding it (TooManyUnhealthy, MaxConcurrent)."},
            "reclaimStarted": _time(description="When the chosen spare's borrowers began to be evicted."),
            "delivered": {**_strings(), "description": "Of the intents, the at-least-once actions (the SIGTERM) "
                          "whose send went out; one without this mark is sent again after a crash."},
            "signalledJobs": {"type": "array", "items": {"type": "integer"},
                              "description": "The jobs this remediation sent SIGTERM (a job is signalled once, "
                                             "whatever number of remediations touch it)."},
            "failedReplacements": {
                "type": "array", "description": "Spares that broke standing in for the node, before it was healed.",
                "items": {"type": "object", "required": ["node", "at"],
                          "properties": {"node": {"type": "string"}, "at": _time(), "why": {"type": "string"}}}},
            "standsInFor": {"type": "string", "description": "The remediation whose replacement this node was when "
                            "it broke (that one takes another spare; this one replaces nothing)."},
            "refill": {"type": "object", "description": "The node asked for to refill the pool's spares.",
                       "required": ["key", "state", "at"],
                       "properties": {"key": {"type": "string"},
                                      "state": {"type": "string", "enum": ["Requested", "Answered", "Failed"]},
                                      "at": _time(), "message": {"type": "string"},
                                      "attempt": {"type": "integer", "minimum": 1,
                                                  "description": "How many times it was asked."},
                                      "retryAt": _time(description="A failed refill is asked again then, if the "
                                                       "pool still lacks a node.")}},
            "waiting": {"type": "string", "description": "Why the current phase waits."},
            "failingSince": _time(description="First failure of the current step."),
            "nextAttempt": _time(description="The failing step is tried again then."),
            "lastError": {"type": "string"},
            "revision": {"type": "integer", "minimum": 0,
                         "description": "The reconciler's writes: a cache never takes an older copy over a newer one."},
            "repair": repair_schema(),
            "diagnosis": diagnosis_schema(),
            "requestsDone": {**_strings(), "description": "A person's requests (the gpufleet.io/request annotation) "
                             "carried out, by id."},
            "conditions": {"type": "array", "items": condition_schema(),
                           "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        },
    }


def manifest() -> dict:
    column = lambda name, path, typ="string", **kw: {"name": name, "type": typ, "jsonPath": path, **kw}  # noqa: E731
    allowed = f'.status.conditions[?(@.type=="{ConditionType.REMEDIATION_ALLOWED}")].reason'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME, "labels": {labels.APP_PART_OF: labels.PART_OF}},
        "spec": {
            "group": labels.GROUP,
            "scope": "Cluster",
            "names": {"kind": KIND, "plural": PLURAL, "singular": "remediation", "listKind": f"{KIND}List",
                      "shortNames": ["rem"], "categories": ["gpufleet"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    column("Node", ".spec.node"),
                    column("Pool", ".spec.pool"),
                    column("XID", ".spec.xid", "integer"),
                    column("Needs", ".spec.fault.action"),
                    column("Phase", ".status.phase"),
                    column("Admission", allowed),
                    column("Replacement", ".status.replacement"),
                    column("Repair", ".status.repair.phase"),
                    column("Step", ".status.repair.step", priority=1),
                    column("Age", ".metadata.creationTimestamp", "date"),
                    column("Message", ".status.heldMessage", priority=1),
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "One GPU node's remediation: detected, contained, admitted, replaced.",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "description": "What happened; set once when the fault is taken up.",
                            "required": ["node", "pool", "xid"],
                            "properties": {
                                "node": {"type": "string", "description": "The faulted Kubernetes node."},
                                "pool": {"type": "string"},
                                "xid": {"type": "integer", "description": "NVIDIA's XID error number."},
                                "message": {"type": "string"},
                                "wasSpare": {"type": "boolean"},
                                "fault": {  # what the fault needs and where (fleetspec/faults)
                                    "type": "object",
                                    "properties": {
                                        "kind": {"type": "string", "enum": [k.value for k in Kind]},
                                        "code": {"type": "integer"},
                                        "action": {"type": "string", "enum": [a.value for a in FaultAction]},
                                        "pci": {"type": "string"},
                                        "gpuInstance": {"type": "integer"},
                                        "computeInstance": {"type": "integer"},
                                        "source": {"type": "string"},
                                        # who wrote the condition: its field manager on the node (managedFields)
                                        "reportedBy": {"type": "string"},
                                    },
                                },
                            },
                        },
                        "status": status_schema(),
                    },
                }},
            }],
        },
    }
