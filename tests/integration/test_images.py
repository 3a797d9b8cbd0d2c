"""The images scripts/build-images.sh builds: each runs `gpufleet --help` from its OCI archive (what
the kubelet node's containerd imports), as the non-root user, with gpufleet as its entry point."""
from __future__ import annotations

import json
import subprocess

import pytest

from localenv.images import archive_digest

pytestmark = pytest.mark.integration


def podman(built, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=built.podman_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name,command", [("reconciler", "reconcile"), ("agent", "agent")])
def test_image_runs_gpufleet_as_non_root(built_images, name, command):
    img = getattr(built_images, name)
    assert img.digest == archive_digest(img.archive)  # the digest the stack deploys is the archive's
    src = f"oci-archive:{img.archive}"
    r = podman(built_images, "run", "--rm", "--pull=never", "--network=none", src, "--help")
    assert r.returncode == 0, r.stderr
    assert "reconcile" in r.stdout and "agent" in r.stdout
    r = podman(built_images, "run", "--rm", "--pull=never", "--network=none", "--entrypoint", "id", src)
    assert r.returncode == 0 and r.stdout.startswith("uid=65532(gpufleet) gid=65532(gpufleet)"), r.stdout + r.stderr
    r = podman(built_images, "image", "inspect", img.tagged)
    config = json.loads(r.stdout)[0]["Config"]
    assert config["Entrypoint"] == ["gpufleet"] and config["Cmd"] == [command]


def test_build_is_cached(built_images):
    r = subprocess.run(["bash", "scripts/build-images.sh", "--print-json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "cache hit" in r.stderr, r.stderr
    assert r.stdout.strip() == str(built_images.reconciler.archive.parent / "images.json")
