"""Shared storage mounted in every Slurm pod; checkpoints live here."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec.models import StorageSpec

from .meta import metadata


@dataclass
class SharedStorageArgs:
    storage: StorageSpec
    namespace: pulumi.Input[str]
    environment: str


class SharedStorage(pulumi.ComponentResource):
    claim_name: pulumi.Output[str]
    mount_path: str

    def __init__(self, name: str, args: SharedStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:storage:SharedStorage", name, None, opts)
        s = args.storage
        child = pulumi.ResourceOptions(parent=self)
        claim: dict = {
            "accessModes": [s.access_mode],
            "resources": {"requests": {"storage": s.size}},
        }
        if s.storage_class:
            claim["storageClassName"] = s.storage_class
        else:
            # NFS or a host folder: a static volume bound to exactly this claim.
            source = {"nfs": s.nfs.model_dump()} if s.nfs else {"hostPath": {"path": s.host_path, "type": "DirectoryOrCreate"}}
            pv_name = f"gpufleet-{args.environment}-{s.name}"
            k8s.core.v1.PersistentVolume(
                f"{name}-pv",
                metadata=metadata(pv_name, "storage", args.environment),
                spec={
                    "capacity": {"storage": s.size},
                    "accessModes": [s.access_mode],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {"namespace": args.namespace, "name": s.name},
                    **source,
                },
                opts=child,
            )
            claim.update(storageClassName="", volumeName=pv_name)
        pvc = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-pvc",
            metadata=metadata(s.name, "storage", args.environment, args.namespace,
                              annotations={"pulumi.com/skipAwait": "true"}),
            spec=claim,
            opts=child,
        )
        self.claim_name = pvc.metadata.name
        self.mount_path = s.mount_path
        self.register_outputs({"claim_name": self.claim_name, "mount_path": s.mount_path, "size": s.size})
