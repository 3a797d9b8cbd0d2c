"""The images scripts/build-images.sh built here: what the local stack deploys and the kubelet node imports.

The build's output (`.tools/images.json`, linked to the cache) is the only source of the local digests:
nothing types them by hand. podman and buildah get the project's own configuration
(tools/containers/*.conf and the cache's storage.conf), never the host's /etc/containers.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localenv.paths import PROJECT_DIR

BUILD_SCRIPT = PROJECT_DIR / "scripts" / "build-images.sh"
INSTALL_SCRIPT = PROJECT_DIR / "scripts" / "install-containers.sh"
IMAGES_JSON = PROJECT_DIR / ".tools" / "images.json"
CONTAINERS_DIR = PROJECT_DIR / "tools" / "containers"


class ImagesError(RuntimeError):
    """The images are not built, or the build's output is unreadable."""


@dataclass(frozen=True)
class Image:
    name: str          # reconciler | agent | pause
    repository: str    # localhost/gpufleet/<name>
    tag: str
    digest: str        # sha256:... of the manifest in the OCI archive (what containerd sees)
    archive: Path      # the OCI archive

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"

    @property
    def tagged(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class BuiltImages:
    key: str
    reconciler: Image
    agent: Image
    pause: Image
    storage_conf: Path

    def all(self) -> list[Image]:
        return [self.reconciler, self.agent, self.pause]

    def podman_env(self) -> dict[str, str]:
        """Environment for podman/buildah with the project's configuration and image storage."""
        return {**os.environ, **containers_env(self.storage_conf)}


def containers_env(storage_conf: Path) -> dict[str, str]:
    return {
        "CONTAINERS_CONF": str(CONTAINERS_DIR / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(CONTAINERS_DIR / "registries.conf"),
        "CONTAINERS_STORAGE_CONF": str(storage_conf),
    }


def load(path: Path | None = None) -> BuiltImages:
    """Read the build's output; a clear error naming the script when there is none."""
    path = Path(path or os.environ.get("GPUFLEET_IMAGES_JSON") or IMAGES_JSON)
    try:
        doc = json.loads(path.read_text())
        imgs = {
            name: Image(name, d["repository"], d["tag"], d["digest"], Path(d["archive"]))
            for name, d in doc["images"].items()
        }
        built = BuiltImages(doc["key"], imgs["reconciler"], imgs["agent"], imgs["pause"], Path(doc["storage_conf"]))
    except FileNotFoundError:
        raise ImagesError(f"no built images ({path} is missing): run scripts/build-images.sh") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ImagesError(f"{path}: not the output of scripts/build-images.sh ({e!r}); run it again") from None
    missing = [str(i.archive) for i in built.all() if not i.archive.is_file()]
    if missing:
        raise ImagesError(f"{path} names archives that are gone ({', '.join(missing)}): run scripts/build-images.sh")
    return built


def build(quiet: bool = True, timeout: float = 1800) -> BuiltImages:
    """Install the container tools if needed and build the images (seconds when cached)."""
    for argv in (["bash", str(INSTALL_SCRIPT)], ["bash", str(BUILD_SCRIPT), "--print-json", *(["--quiet"] if quiet else [])]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise ImagesError(f"{' '.join(argv[1:])} failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-3000:]}")
    return load(Path(r.stdout.strip().splitlines()[-1]))


def archive_digest(archive: Path) -> str:
    """The manifest digest recorded in an OCI archive's index.json."""
    import tarfile

    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        if f is None:
            raise ImagesError(f"{archive}: no index.json (not an OCI archive)")
        return json.load(f)["manifests"][0]["digest"]
