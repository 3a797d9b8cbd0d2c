#!/usr/bin/env bash
# Build gpufleet's container images here, with no registry: the reconciler, the node agent and the
# pause image the local kubelet node's containerd runs pod sandboxes with.
#
#   1. a Debian root (debootstrap, tools/containers/versions.env), cached as a tarball under
#      ${GPUFLEET_IMAGES_CACHE:-~/.cache/gpufleet/images}/rootfs/, keyed by suite, packages and versions;
#   2. that root committed with buildah as the base image (and as the pause image: `sleep infinity`);
#   3. the gpufleet wheel and its dependencies at the versions and hashes of requirements/runtime.lock
#      (pip wheel --require-hashes, from PyPI through pip's cache);
#   4. the targets `reconciler` and `agent` of images/Containerfile built with buildah on that base
#      (the same Containerfile a user with a registry builds on the pinned Python base);
#   5. each image saved as an OCI archive to <cache>/<key>/, and its manifest digest recorded in
#      <cache>/<key>/images.json, linked from .tools/images.json; the JSON is printed on stdout.
# The local stack deploys the digests of .tools/images.json (infra/program.py); the local kubelet node
# imports the archives into its containerd (localenv/node.py).
#
# Usage: scripts/build-images.sh [--force] [--check] [--print-json] [--quiet]
#   --force       rebuild the images (the Debian root is kept; delete <cache>/rootfs to redo it)
#   --check       build nothing: exit 0 and print the JSON path if the images of this tree are built
#   --print-json  print only the path of images.json on stdout
#   --quiet       no progress lines
# podman and buildah read tools/containers/containers.conf and a storage.conf in the cache
# (never the host's /etc/containers). Needs root and scripts/install-containers.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_NAME=build-images
# shellcheck source=lib/build.sh
source "$ROOT/scripts/lib/build.sh"
FORCE=0; CHECK=0; PRINT_JSON=0; QUIET=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --check) CHECK=1 ;;
    --print-json) PRINT_JSON=1 ;;
    --quiet) QUIET=1 ;;
    -h|--help) usage 22; exit 0 ;;
    *) echo "build-images: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# shellcheck source=../tools/containers/versions.env
source "$ROOT/tools/containers/versions.env"
: "${DEBIAN_SUITE:?}" "${DEBIAN_VARIANT:?}" "${DEBIAN_PACKAGES:?}" "${IMAGES_BUILD_REV:?}"

CACHE_ROOT="${GPUFLEET_IMAGES_CACHE:-$GPUFLEET_CACHE/images}"
mkdir -p "$CACHE_ROOT/rootfs" "$CACHE_ROOT/containers"

# --- podman/buildah configuration of the project's own --------------------------------------
export CONTAINERS_CONF="$ROOT/tools/containers/containers.conf"
export CONTAINERS_STORAGE_CONF="$CACHE_ROOT/containers/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$ROOT/tools/containers/registries.conf"
cat >"$CONTAINERS_STORAGE_CONF.tmp" <<EOF
# Written by scripts/build-images.sh: gpufleet's own image storage (not the host's).
[storage]
driver = "overlay"
graphroot = "$CACHE_ROOT/containers/storage"
runroot = "$CACHE_ROOT/containers/run"
EOF
mv "$CONTAINERS_STORAGE_CONF.tmp" "$CONTAINERS_STORAGE_CONF"

# --- cache keys -----------------------------------------------------------------------------
have() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 ]]; }
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
ROOTFS_KEY="$(printf '%s\n' "$DEBIAN_SUITE" "$DEBIAN_VARIANT" "$DEBIAN_PACKAGES" "$IMAGES_BUILD_REV" \
  "$(pkgver debootstrap)" | short_hash)"
ROOTFS_TAR="$CACHE_ROOT/rootfs/debian-$DEBIAN_SUITE-$DEBIAN_VARIANT-$ROOTFS_KEY.tar"
# The images: the root's key, the Containerfiles and every file the wheel is built from.
SOURCE_HASH="$(cd "$ROOT" && git ls-files -co --exclude-standard -- pyproject.toml images fleetspec components \
  reconciler policies gpufleet | LC_ALL=C sort | while read -r f; do [[ -f $f ]] && printf '%s  %s\n' \
  "$(sha256sum <"$f" | cut -c1-64)" "$f"; done | short_hash)"
SOURCE_HASH="$(printf '%s %s\n' "$SOURCE_HASH" "$(sha256sum <"$ROOT/requirements/runtime.lock" | cut -c1-64)" \
  | short_hash)"  # the locked dependencies are sources of the images too
KEY="$ROOTFS_KEY-$SOURCE_HASH"
OUT="$CACHE_ROOT/$KEY"
JSON="$OUT/images.json"
IMAGES=(reconciler agent)
PAUSE_REPO=localhost/gpufleet/pause
BASE_REPO=localhost/gpufleet/debian-base

complete() {
  [[ -f $JSON ]] || return 1
  local i; for i in "${IMAGES[@]}" pause; do [[ -f $OUT/$i.oci.tar ]] || return 1; done
}
link() { mkdir -p "$ROOT/.tools"; ln -sfn "$JSON" "$ROOT/.tools/images.json"; }
finish() {
  link
  if [[ $PRINT_JSON == 1 ]]; then echo "$JSON"; else cat "$JSON"; fi
}

if [[ $CHECK == 1 ]]; then
  if complete; then link; echo "$JSON"; exit 0; fi
  echo "build-images: not built yet: $OUT" >&2; exit 1
fi

for t in buildah podman debootstrap; do have "$t" || die "$t is missing: run scripts/install-containers.sh"; done
[[ $(id -u) == 0 ]] || die "must run as root (debootstrap, buildah with overlay storage)"

exec 9>"$CACHE_ROOT/.build.lock"
if ! flock -n 9; then log "another build-images is running; waiting for it"; flock 9; fi

if [[ $FORCE == 0 ]] && complete; then
  log "cache hit: $OUT"
  finish; exit 0
fi

# --- 1. the Debian root ---------------------------------------------------------------------
if [[ ! -f $ROOTFS_TAR ]]; then
  stage="$CACHE_ROOT/rootfs/.stage-$ROOTFS_KEY"
  rm -rf "$stage"; mkdir -p "$stage"
  log "debootstrap --variant=$DEBIAN_VARIANT --include=$DEBIAN_PACKAGES $DEBIAN_SUITE (about 90 s) ..."
  # DEBIAN_MIRROR overrides debootstrap's default mirror.
  debootstrap --variant="$DEBIAN_VARIANT" --include="$DEBIAN_PACKAGES" "$DEBIAN_SUITE" "$stage/root" \
    ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$stage/debootstrap.log" 2>&1 \
    || { tail -20 "$stage/debootstrap.log" >&2; die "debootstrap failed; log: $stage/debootstrap.log"; }
  # Smaller and reproducible enough: no apt lists, caches or logs.
  rm -rf "$stage/root/var/lib/apt/lists/"* "$stage/root/var/cache/apt/"*.bin "$stage/root/var/cache/apt/archives/"*.deb \
         "$stage/root/var/log/"*.log "$stage/root/var/log/apt" "$stage/root/tmp/"*
  : >"$stage/root/etc/resolv.conf"
  tar --numeric-owner --xattrs -C "$stage/root" -cf "$ROOTFS_TAR.partial" .
  mv "$ROOTFS_TAR.partial" "$ROOTFS_TAR"
  rm -rf "$stage"
  log "root filesystem: $ROOTFS_TAR ($(du -h "$ROOTFS_TAR" | cut -f1))"
else
  log "root filesystem cached: $ROOTFS_TAR"
fi

# --- 2. base and pause images from that root --------------------------------------------------
if ! buildah inspect --type image "$BASE_REPO:$ROOTFS_KEY" >/dev/null 2>&1; then
  log "committing $BASE_REPO:$ROOTFS_KEY and $PAUSE_REPO:$ROOTFS_KEY"
  ctr="$(buildah from --pull=never scratch)"
  mnt="$(buildah mount "$ctr")"
  tar --numeric-owner --xattrs -C "$mnt" -xf "$ROOTFS_TAR"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "org.opencontainers.image.title=gpufleet Debian $DEBIAN_SUITE base" "$ctr"
  buildah commit -q --rm "$ctr" "$BASE_REPO:$ROOTFS_KEY" >/dev/null
  # The pod sandbox's process: it only holds the pod's namespaces (containerd kills it with SIGKILL).
  ctr="$(buildah from --pull=never "$BASE_REPO:$ROOTFS_KEY")"
  buildah config --entrypoint '["/bin/sleep", "infinity"]' --cmd '' --user 65535:65535 \
    --label "org.opencontainers.image.title=gpufleet pause" "$ctr"
  buildah commit -q --rm "$ctr" "$PAUSE_REPO:$ROOTFS_KEY" >/dev/null
else
  log "base image cached: $BASE_REPO:$ROOTFS_KEY"
fi

# --- 3. the wheels ------------------------------------------------------------------------------
ctx="$OUT/context"
rm -rf "$OUT"; mkdir -p "$ctx/wheels"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x $PY ]] || PY=python3
log "pip wheel: gpufleet and its locked dependencies (requirements/runtime.lock, hashes checked) ..."
{ "$PY" -m pip wheel -q --disable-pip-version-check --require-hashes --no-deps --wheel-dir "$ctx/wheels" \
    -r "$ROOT/requirements/runtime.lock" \
  && "$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir "$ctx/wheels" "$ROOT"
} >"$OUT/pip-wheel.log" 2>&1 || { tail -20 "$OUT/pip-wheel.log" >&2; die "pip wheel failed; log: $OUT/pip-wheel.log"; }
log "  $(find "$ctx/wheels" -name '*.whl' | wc -l) wheels"

# --- 4. the images ------------------------------------------------------------------------------
digest_of() { # oci-archive -> manifest digest containerd and podman see after an import
  tar -xOf "$1" index.json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])'
}
declare -A DIGEST
for img in "${IMAGES[@]}"; do
  t0=$SECONDS
  log "buildah bud --target $img images/Containerfile (BASE=$BASE_REPO:$ROOTFS_KEY) ..."
  buildah bud -q --pull=never --layers=false --network=none --build-arg "BASE=$BASE_REPO:$ROOTFS_KEY" \
    --target "$img" -f "$ROOT/images/Containerfile" -t "localhost/gpufleet/$img:$KEY" "$ctx" >"$OUT/$img.build.log" 2>&1 \
    || { tail -30 "$OUT/$img.build.log" >&2; die "building the $img image failed; log: $OUT/$img.build.log"; }
  buildah push -q "localhost/gpufleet/$img:$KEY" "oci-archive:$OUT/$img.oci.tar:localhost/gpufleet/$img:$KEY" >/dev/null
  DIGEST[$img]="$(digest_of "$OUT/$img.oci.tar")"
  log "  localhost/gpufleet/$img:$KEY ${DIGEST[$img]} ($((SECONDS - t0))s)"
done
buildah push -q "$PAUSE_REPO:$ROOTFS_KEY" "oci-archive:$OUT/pause.oci.tar:$PAUSE_REPO:$ROOTFS_KEY" >/dev/null
DIGEST[pause]="$(digest_of "$OUT/pause.oci.tar")"
rm -rf "$ctx"

"$PY" - "$JSON" <<EOF
import json, sys
from pathlib import Path
out = Path("$OUT")
doc = {
    "key": "$KEY",
    "debian": {"suite": "$DEBIAN_SUITE", "variant": "$DEBIAN_VARIANT", "packages": "$DEBIAN_PACKAGES",
               "rootfs": "$ROOTFS_TAR"},
    "containers_conf": "$CONTAINERS_CONF",
    "storage_conf": "$CONTAINERS_STORAGE_CONF",
    "images": {
        name: {"repository": repo, "tag": "$KEY" if name != "pause" else "$ROOTFS_KEY", "digest": digest,
               "reference": f"{repo}@{digest}", "archive": str(out / f"{name}.oci.tar")}
        for name, repo, digest in [
            ("reconciler", "localhost/gpufleet/reconciler", "${DIGEST[reconciler]}"),
            ("agent", "localhost/gpufleet/agent", "${DIGEST[agent]}"),
            ("pause", "$PAUSE_REPO", "${DIGEST[pause]}"),
        ]
    },
}
tmp = Path(sys.argv[1] + ".tmp")
tmp.write_text(json.dumps(doc, indent=2) + "\n")
tmp.replace(sys.argv[1])
EOF
# Keep the newest eight builds of this root (several checkouts share the cache): older ones go from the cache and the image storage.
for old in $(ls -1dt "$CACHE_ROOT/$ROOTFS_KEY"-* 2>/dev/null | tail -n +9); do
  k="$(basename "$old")"
  for img in "${IMAGES[@]}"; do buildah rmi "localhost/gpufleet/$img:$k" >/dev/null 2>&1 || true; done
  rm -rf "$old"; log "pruned the old build $k"
done
log "built in $((SECONDS - START))s: $JSON"
finish
