"""The local stack deploys the digests the local environment passes in its stack config; other stacks keep
their stack config; without them an update stops, a preview warns."""
from __future__ import annotations

from pathlib import Path

import pulumi
import pytest

from gpufleet.fleetspec import load_stack_file
from gpufleet.fleetspec.models import FleetSpec
from infra.program import LocalEnvironment, host_network_api, with_local_images
from gpufleet.components.reconciler import HostNetworkApi

ROOT = Path(__file__).resolve().parents[2]
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
LOCAL = LocalEnvironment.model_validate({
    "kubeconfig": "/tmp/kc", "apiServer": {"host": "127.0.0.1", "port": 40123},
    "slurmRestUrl": "http://127.0.0.1:26820",
    "images": {"reconciler": f"localhost/gpufleet/reconciler@{D1}", "agent": f"localhost/gpufleet/agent@{D2}"}})


def test_local_stack_takes_the_built_digests():
    spec = with_local_images(load_stack_file(ROOT / "Pulumi.local.yaml").fleet, LOCAL)
    assert spec.healing.reconciler.image == f"localhost/gpufleet/reconciler@{D1}"
    assert spec.healing.reconciler.agent_image == f"localhost/gpufleet/agent@{D2}"


def test_an_image_the_stack_file_names_is_kept():
    fleet = load_stack_file(ROOT / "Pulumi.local.yaml").fleet.model_dump(mode="json", exclude_unset=True)
    fleet["healing"]["reconciler"] = {"image": "ghcr.io/gpufleet/reconciler:latest"}
    spec = with_local_images(FleetSpec.model_validate(fleet), LOCAL)
    assert spec.healing.reconciler.image == "ghcr.io/gpufleet/reconciler:latest"
    assert spec.healing.reconciler.agent_image == f"localhost/gpufleet/agent@{D2}"


def test_other_stacks_keep_their_config():
    spec = load_stack_file(ROOT / "Pulumi.staging.yaml").fleet
    assert with_local_images(spec, LOCAL) is spec


def test_no_built_images_stop_an_update_naming_the_script(monkeypatch):
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    for local in (None, LOCAL.model_copy(update={"images": {}})):
        with pytest.raises(pulumi.RunError, match="run scripts/build-images.sh"):
            with_local_images(spec, local)


def test_a_preview_without_them_keeps_the_spec_images(monkeypatch):
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: True)
    warned = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    spec = load_stack_file(ROOT / "Pulumi.local.yaml").fleet
    assert with_local_images(spec, None) is spec and "scripts/build-images.sh" in warned[0]


def test_the_host_network_api_is_the_one_passed_in():
    assert host_network_api(LOCAL) == HostNetworkApi("127.0.0.1", 40123, "http://127.0.0.1:26820")
    assert host_network_api(None) is None


def test_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match="extra"):
        LocalEnvironment.model_validate({**LOCAL.model_dump(by_alias=True), "apiserverr": 1})
