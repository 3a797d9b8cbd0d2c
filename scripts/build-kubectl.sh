#!/usr/bin/env bash
# Build kubectl at the version of the local control plane (K8S_STAGING_VERSION of
# tools/kube/versions.env: k8s.io/kubectl v0.X.Y is kubectl v1.X.Y) from tools/kube/kubectl,
# into a cache folder of its own outside the clone, keyed by the version and a hash of that module:
#   ${GPUFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools}/kubectl-<k8s>-<hash>/bin/kubectl
# linked as .tools/bin/kubectl. What an on-call engineer reads the local reconciler pods with
# (`kubectl logs`, `kubectl exec`). Its own cache, so building it never rebuilds the control plane.
#
# Usage: scripts/build-kubectl.sh [--print-path] [--quiet]
#   --print-path  print only the binary's path on stdout (progress goes to stderr)
# A build takes under a minute when the control plane's Go build cache is warm.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_NAME=build-kubectl
# shellcheck source=lib/build.sh
source "$ROOT/scripts/lib/build.sh"
SRC="$ROOT/tools/kube/kubectl"
PRINT=0; QUIET=0
for arg in "$@"; do
  case "$arg" in
    --print-path) PRINT=1 ;;
    --quiet) QUIET=1 ;;
    -h|--help) usage 11; exit 0 ;;
    *) echo "build-kubectl: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
# shellcheck source=../tools/kube/versions.env
source "$ROOT/tools/kube/versions.env"
: "${K8S_VERSION:?}" "${K8S_STAGING_VERSION:?}"
grep -Eq "^[[:space:]]*k8s.io/kubectl[[:space:]]+$K8S_STAGING_VERSION([[:space:]]|$)" "$SRC/go.mod" \
  || die "tools/kube/kubectl/go.mod does not require k8s.io/kubectl $K8S_STAGING_VERSION (versions.env says so)"

HASH="$(cd "$SRC" && cat go.mod go.sum ./*.go | short_hash)"
CACHE_ROOT="${GPUFLEET_TOOLS_CACHE:-$GPUFLEET_CACHE/tools}"
DIR="$CACHE_ROOT/kubectl-$K8S_VERSION-$HASH"
BIN="$DIR/bin/kubectl"

finish() {
  mkdir -p "$ROOT/.tools/bin"
  ln -sfn "$BIN" "$ROOT/.tools/bin/kubectl"
  log "$("$BIN" version --client 2>/dev/null | head -1) in $BIN (linked from .tools/bin)"
  if [[ $PRINT == 1 ]]; then echo "$BIN"; fi
}

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.kubectl-$K8S_VERSION-$HASH.lock"
flock 9
if [[ -x "$BIN" ]]; then finish; exit 0; fi

command -v go >/dev/null || die "go is not on PATH (Go >= 1.24 is needed to build kubectl)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
log "building kubectl $K8S_VERSION ..."
rm -rf "$DIR/bin.partial"; mkdir -p "$DIR/bin.partial"
(cd "$SRC" && go build -p "${KUBE_BUILD_JOBS:-2}" -ldflags "$ldflags" -o "$DIR/bin.partial/kubectl" .) \
  >"$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log" >&2; die "building kubectl failed; log: $DIR/build.log"; }
rm -rf "$DIR/bin"; mv "$DIR/bin.partial" "$DIR/bin"
log "built in $((SECONDS - START))s"
finish
