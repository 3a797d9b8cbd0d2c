"""The stack program, importable so tests can set Pulumi's mocks first and then run it."""
from __future__ import annotations

import os
from pathlib import Path

import pulumi

from components import GpuFleet, GpuFleetArgs, pool_summaries
from components.cluster import local_kubeconfig_path
from components.reconciler import HostNetworkApi
from fleetspec import SpecError, parse_fleet
from fleetspec.load import CONFIG_KEY, PROJECT

PROJECT_DIR = Path(__file__).resolve().parents[1]


def load_spec():
    """Validate the stack's fleet before any resource is declared; a bad spec stops here."""
    config = pulumi.Config(PROJECT)
    try:
        return parse_fleet(config.get_object("fleet"), source=f"stack {pulumi.get_stack()} ({CONFIG_KEY})")
    except SpecError as e:
        raise pulumi.RunError(str(e)) from None


def with_built_images(spec):
    """The local stack deploys the images scripts/build-images.sh built here, by the digests its output
    records (never typed by hand); an image the stack file names explicitly is kept. Other stacks take
    theirs from their stack config (recorded by the release workflow)."""
    from localenv.images import ImagesError, load

    dep = spec.healing.reconciler
    wanted = {"image", "agent_image"} - dep.model_fields_set
    if spec.cluster.kind != "local" or not wanted:
        return spec
    try:
        built = load()
    except ImagesError as e:
        raise pulumi.RunError(f"stack {pulumi.get_stack()}: {e}") from None
    refs = {"image": built.reconciler.reference, "agent_image": built.agent.reference}
    new_dep = dep.model_copy(update={k: refs[k] for k in wanted})
    healing = spec.healing.model_copy(update={"reconciler": new_dep})
    return spec.model_copy(update={"healing": healing})


def local_api(kubeconfig: str) -> HostNetworkApi:
    """Where the local environment's API server listens (its kubeconfig's server; the default port of
    `gpufleet local up` before one is written): the host-network pods of the local stack go there."""
    from urllib.parse import urlparse

    import yaml

    from localenv.control_plane import DEFAULT_PORTS

    from gpufleet.paths import local_slurm_rest

    rest = local_slurm_rest()  # the local slurmrestd on loopback (the RestApi's Service has no DNS here)
    slurm_url = rest[0] if rest else None
    try:
        server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
        url = urlparse(server)
        return HostNetworkApi(url.hostname or "127.0.0.1", url.port or 443, slurm_url)
    except (OSError, KeyError, IndexError, TypeError):
        return HostNetworkApi("127.0.0.1", DEFAULT_PORTS["apiserver"], slurm_url)


def build() -> GpuFleet:
    spec = with_built_images(load_spec())
    config = pulumi.Config(PROJECT)
    secrets = {k: v for k in spec.secret_keys() if (v := config.get_secret(k)) is not None}
    missing = [k for k in spec.secret_keys() if k not in secrets]
    if missing:
        raise pulumi.RunError(
            "secrets not set for stack " + pulumi.get_stack() + ": "
            + ", ".join(f"`pulumi config set --secret {k} ...`" for k in missing)
        )
    local = spec.cluster.kind == "local"
    kubeconfig = local_kubeconfig_path(PROJECT_DIR) if local else None
    fleet = GpuFleet(
        spec.environment,
        GpuFleetArgs(
            spec, secrets,
            local_kubeconfig=kubeconfig,
            render_dir=os.environ.get("GPUFLEET_RENDER_DIR") or None,
            operator_chart=not os.environ.get("GPUFLEET_WITHOUT_OPERATOR_CHART"),
            host_network_api=local_api(kubeconfig) if kubeconfig else None,
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
