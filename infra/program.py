"""The stack program, importable so tests can set Pulumi's mocks first and then run it."""
from __future__ import annotations

import os
from pathlib import Path

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gpufleet.components import GpuFleet, GpuFleetArgs, pool_summaries
from gpufleet.components.cluster import local_kubeconfig_path
from gpufleet.components.reconciler import HostNetworkApi
from gpufleet.fleetspec import SpecError, parse_fleet
from gpufleet.fleetspec.load import CONFIG_KEY, PROJECT

PROJECT_DIR = Path(__file__).resolve().parents[1]


def load_spec():
    """Validate the stack's fleet before any resource is declared; a bad spec stops here."""
    config = pulumi.Config(PROJECT)
    try:
        return parse_fleet(config.get_object("fleet"), source=f"stack {pulumi.get_stack()} ({CONFIG_KEY})")
    except SpecError as e:
        raise pulumi.RunError(str(e)) from None


class ApiServer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str
    port: int = Field(ge=1, le=65535)


class LocalEnvironment(BaseModel):
    """`gpufleet:localEnvironment`: what the local stack needs from the local environment on this machine.
    The environment writes it into the stack configuration it generates for the local stack
    (localenv/stack_config.py); nothing here reads the environment itself."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    kubeconfig: str
    api_server: ApiServer                      # where its API server listens (the pods' host network)
    slurm_rest_url: str | None = None          # its slurmrestd on loopback (the RestApi's Service has no DNS there)
    images: dict[str, str] = Field(default_factory=dict)  # reconciler, agent: the images built here, by digest


def local_environment(spec) -> LocalEnvironment | None:
    """The local environment's part of the stack configuration (a local cluster only)."""
    doc = pulumi.Config(PROJECT).get_object("localEnvironment")
    if spec.cluster.kind != "local" or doc is None:
        return None
    try:
        return LocalEnvironment.model_validate(doc)
    except ValidationError as e:
        raise pulumi.RunError(f"stack {pulumi.get_stack()}: {PROJECT}:localEnvironment: {e}") from None


def with_local_images(spec, local: LocalEnvironment | None):
    """The local stack deploys the images built on this machine, by the digests the environment passed in
    (never typed by hand); an image the stack file names explicitly is kept. Other stacks take theirs
    from their stack config (recorded by the release workflow)."""
    dep = spec.healing.reconciler
    wanted = {"image", "agent_image"} - dep.model_fields_set
    if spec.cluster.kind != "local" or not wanted:
        return spec
    refs = {"image": (local.images if local else {}).get("reconciler"),
            "agent_image": (local.images if local else {}).get("agent")}
    if not all(refs[k] for k in wanted):
        msg = (f"stack {pulumi.get_stack()}: no built images from the local environment ({PROJECT}:localEnvironment."
               f"images): run scripts/build-images.sh, then pulumi through the local environment (`gpufleet local up`, "
               f"then `gpufleet pulumi -s local up`)")
        if not pulumi.runtime.is_dry_run():
            raise pulumi.RunError(msg)
        pulumi.log.warn(msg + "; previewing with the spec's images")
        return spec
    new_dep = dep.model_copy(update={k: refs[k] for k in wanted})
    healing = spec.healing.model_copy(update={"reconciler": new_dep})
    return spec.model_copy(update={"healing": healing})


def host_network_api(local: LocalEnvironment | None) -> HostNetworkApi | None:
    """Where the local stack's host-network pods reach the API server and slurmrestd."""
    if local is None:
        return None
    return HostNetworkApi(local.api_server.host, local.api_server.port, local.slurm_rest_url)


def build() -> GpuFleet:
    spec = load_spec()
    local = local_environment(spec)
    spec = with_local_images(spec, local)
    config = pulumi.Config(PROJECT)
    secrets = {k: v for k in spec.secret_keys() if (v := config.get_secret(k)) is not None}
    missing = [k for k in spec.secret_keys() if k not in secrets]
    if missing:
        raise pulumi.RunError(
            "secrets not set for stack " + pulumi.get_stack() + ": "
            + ", ".join(f"`pulumi config set --secret {k} ...`" for k in missing)
        )
    kubeconfig = None
    if spec.cluster.kind == "local":
        if local is None:
            pulumi.log.warn(f"stack {pulumi.get_stack()}: no {PROJECT}:localEnvironment (the local environment "
                            f"supplies it); the reconciler's pods are placed as on a cluster")
        kubeconfig = local.kubeconfig if local else local_kubeconfig_path(PROJECT_DIR)
    fleet = GpuFleet(
        spec.environment,
        GpuFleetArgs(
            spec, secrets,
            local_kubeconfig=kubeconfig,
            render_dir=os.environ.get("GPUFLEET_RENDER_DIR") or None,
            operator_chart=not os.environ.get("GPUFLEET_WITHOUT_OPERATOR_CHART"),
            host_network_api=host_network_api(local),
        ),
    )
    pulumi.export("environment", spec.environment)
    pulumi.export("kubeconfig", fleet.cluster.kubeconfig)
    pulumi.export("context", fleet.cluster.context)
    pulumi.export("login_endpoint", fleet.slurm.login_endpoint)
    pulumi.export("slurm_namespace", fleet.slurm.namespace)
    pulumi.export("reconciler_namespace", fleet.reconciler.namespace)
    pulumi.export("slinky_operator", fleet.slurm.operator_mode)
    pulumi.export("pools", pool_summaries(spec))
    return fleet
