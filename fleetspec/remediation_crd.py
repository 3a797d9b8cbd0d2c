"""The `Remediation` custom resource definition: one record per healed (or held) node.

Plain data, shared by the stack (which installs it) and the reconciler (which writes records).
Cluster-scoped like the nodes it is about, so `kubectl get remediations` lists them all.
"""
from __future__ import annotations

from . import labels
from .faults.catalogue import FaultAction, Kind

PLURAL = "remediations"
KIND = "Remediation"
VERSION = "v1alpha1"
NAME = f"{PLURAL}.{labels.GROUP}"


def manifest() -> dict:
    column = lambda name, path, typ="string", **kw: {"name": name, "type": typ, "jsonPath": path, **kw}  # noqa: E731
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/part-of": labels.PART_OF}},
        "spec": {
            "group": labels.GROUP,
            "scope": "Cluster",
            "names": {"kind": KIND, "plural": PLURAL, "singular": "remediation", "listKind": f"{KIND}List",
                      "shortNames": ["rem"], "categories": ["gpufleet"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "additionalPrinterColumns": [
                    column("Node", ".spec.node"),
                    column("Pool", ".spec.pool"),
                    column("XID", ".spec.xid", "integer"),
                    column("Needs", ".spec.fault.action"),
                    column("Phase", ".status.phase"),
                    column("Replacement", ".status.replacement"),
                    column("Age", ".metadata.creationTimestamp", "date"),
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["node", "pool", "xid"],
                            "properties": {
                                "node": {"type": "string"},
                                "pool": {"type": "string"},
                                "xid": {"type": "integer"},
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
                                    },
                                },
                            },
                        },
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    }
