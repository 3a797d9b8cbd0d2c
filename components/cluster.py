"""Cluster access: one Kubernetes provider for the environment, which every other component uses."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.fleetspec.models import ClusterSpec


@dataclass
class ClusterAccessArgs:
    cluster: ClusterSpec
    local_kubeconfig: str | None = None  # where `gpufleet local up` wrote it (kind: local)
    render_dir: str | None = None  # write manifests here instead of applying them (GitOps)


def local_kubeconfig_path(project_dir: str | Path) -> str:
    """The local environment's kubeconfig (GPUFLEET_LOCAL_DIR moves it; tests use their own cluster)."""
    local = os.environ.get("GPUFLEET_LOCAL_DIR") or str(Path(project_dir) / ".local")
    return str(Path(local).resolve() / "kube" / "kubeconfig")


class ClusterAccess(pulumi.ComponentResource):
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    context: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:cluster:ClusterAccess", name, None, opts)
        c = args.cluster
        if c.kind == "local":
            kubeconfig, context = args.local_kubeconfig, "gpufleet-local"
        else:
            kubeconfig, context = os.path.expanduser(c.kubeconfig or "~/.kube/config"), c.context
        # Mutable ConfigMaps and Secrets: a policy change updates them in place instead of
        # replacing them (and the Deployment that mounts them) on every `pulumi up`.
        provider_args: dict = {"enable_server_side_apply": True, "enable_config_map_mutable": True,
                               "enable_secret_mutable": True}
        if args.render_dir:
            provider_args["render_yaml_to_directory"] = args.render_dir
        else:
            provider_args["kubeconfig"] = kubeconfig
            if context:
                provider_args["context"] = context
        self.provider = k8s.Provider(f"{name}-k8s", **provider_args, opts=pulumi.ResourceOptions(parent=self))
        self.kubeconfig = pulumi.Output.from_input(kubeconfig or "")
        self.context = pulumi.Output.from_input(context or "")
        self.register_outputs({"kubeconfig": self.kubeconfig, "context": self.context})
