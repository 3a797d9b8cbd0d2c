"""The local stack deploys the digests build-images.sh recorded; other stacks keep their stack config."""
from __future__ import annotations

import json
from pathlib import Path

import pulumi
import pytest

from fleetspec import load_stack_file
from infra.program import with_built_images

ROOT = Path(__file__).resolve().parents[2]
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


@pytest.fixture
def images_json(tmp_path, monkeypatch):
    doc = {"key": "k", "storage_conf": str(tmp_path / "storage.conf"), "images": {}}
    for name, digest in (("reconciler", D1), ("agent", D2), ("pause", D1)):
        (tmp_path / f"{name}.oci.tar").write_bytes(b"")
        doc["images"][name] = {"repository": f"localhost/gpufleet/{name}", "tag": "k", "digest": digest,
                               "archive": str(tmp_path / f"{name}.oci.tar")}
    path = tmp_path / "images.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("GPUFLEET_IMAGES_JSON", str(path))
    return path


def test_local_stack_takes_the_built_digests(images_json):
    spec = with_built_images(load_stack_file(ROOT / "Pulumi.local.yaml").fleet)
    assert spec.healing.reconciler.image == f"localhost/gpufleet/reconciler@{D1}"
    assert spec.healing.reconciler.agent_image == f"localhost/gpufleet/agent@{D2}"


def test_an_image_the_stack_file_names_is_kept(images_json):
    fleet = load_stack_file(ROOT / "Pulumi.local.yaml").fleet.model_dump(mode="json", exclude_unset=True)
    fleet["healing"]["reconciler"] = {"image": "ghcr.io/gpufleet/reconciler:latest"}
    from fleetspec.models import FleetSpec

    spec = with_built_images(FleetSpec.model_validate(fleet))
    assert spec.healing.reconciler.image == "ghcr.io/gpufleet/reconciler:latest"
    assert spec.healing.reconciler.agent_image == f"localhost/gpufleet/agent@{D2}"


def test_other_stacks_keep_their_config(images_json):
    spec = load_stack_file(ROOT / "Pulumi.staging.yaml").fleet
    assert with_built_images(spec) is spec


def test_no_build_is_an_error_naming_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_IMAGES_JSON", str(tmp_path / "missing.json"))
    with pytest.raises(pulumi.RunError, match="run scripts/build-images.sh"):
        with_built_images(load_stack_file(ROOT / "Pulumi.local.yaml").fleet)
