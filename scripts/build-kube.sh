#!/usr/bin/env bash
# Build the local Kubernetes control plane used by gpufleet's integration tests
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd, kwok) from Go
# modules, at the versions pinned in tools/kube/versions.env.
#
# The binaries go to a cache folder outside the clone, keyed by the pinned
# versions and a hash of the Go module files under tools/kube/:
#   ${GPUFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools}/kube-<k8s>-etcd-<etcd>-kwok-<kwok>-<hash>/bin/
# and are symlinked into <repo>/.tools/bin/ (git-ignored). A re-run with the
# cache present only checks it and refreshes the links (no go call).
#
# Usage: scripts/build-kube.sh [--force] [--check] [--print-bin-dir] [--quiet]
#   --force          rebuild even if the cache folder is complete
#   --check          build nothing: exit 0 if the cache folder is complete, else 1
#   --print-bin-dir  print only the cache bin folder on stdout (progress goes to stderr)
#   --quiet          no progress lines (errors are still shown)
# Env:  KUBE_BUILD_JOBS (go build -p, default 2), GPUFLEET_TOOLS_CACHE (cache root).
# A cold build on 2 cores takes roughly half an hour; the Go build and module
# caches (~/.cache/go-build, ~/go/pkg/mod) are reused by later builds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_NAME=build-kube
# shellcheck source=lib/build.sh
source "$ROOT/scripts/lib/build.sh"
KUBE_SRC="$ROOT/tools/kube"

FORCE=0
PRINT_BIN_DIR=0
CHECK=0
QUIET=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --print-bin-dir) PRINT_BIN_DIR=1 ;;
    --check) CHECK=1 ;;
    --quiet) QUIET=1 ;;
    -h|--help) usage 19; exit 0 ;;
    *) echo "build-kube: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# --- pinned versions -------------------------------------------------------
# shellcheck source=../tools/kube/versions.env
source "$KUBE_SRC/versions.env"
: "${K8S_VERSION:?}" "${K8S_STAGING_VERSION:?}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}"

# The go.mod files must agree with versions.env (they are what actually gets built).
check_pin() { # file module version
  grep -Eq "^[[:space:]]*(require[[:space:]]+)?$2[[:space:]]+$3([[:space:]]|$)" "$KUBE_SRC/$1" \
    || die "tools/kube/$1 does not pin $2 $3 (versions.env says so); update the go.mod"
}
check_pin k8s/go.mod k8s.io/kubernetes "$K8S_VERSION"
grep -q "k8s.io/api => k8s.io/api $K8S_STAGING_VERSION" "$KUBE_SRC/k8s/go.mod" \
  || die "tools/kube/k8s/go.mod: staging replace directives are not at $K8S_STAGING_VERSION"
check_pin etcd/go.mod go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin kwok/go.mod sigs.k8s.io/kwok "$KWOK_VERSION"

# Cache key: pinned versions + hash of the build inputs under tools/kube (versions.env
# carries BUILD_REV: bump it when this script's build flags change).
INPUT_HASH="$(cd "$KUBE_SRC" && cat versions.env k8s/go.mod k8s/go.sum etcd/go.mod etcd/go.sum etcd/*.go \
  kwok/go.mod kwok/go.sum | short_hash)"
CACHE_ROOT="${GPUFLEET_TOOLS_CACHE:-$GPUFLEET_CACHE/tools}"
NAME="kube-${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}-${INPUT_HASH}"
CACHE_DIR="$CACHE_ROOT/$NAME"
BIN_DIR="$CACHE_DIR/bin"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet etcd kwok)

cache_complete() {
  [[ -f "$CACHE_DIR/.complete" ]] || return 1
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

link_into_repo() {
  mkdir -p "$ROOT/.tools/bin"
  local b
  for b in "${BINARIES[@]}"; do ln -sfn "$BIN_DIR/$b" "$ROOT/.tools/bin/$b"; done
  ln -sfn "$CACHE_DIR" "$ROOT/.tools/kube"
}

print_versions() {
  [[ $QUIET == 1 ]] && return 0
  {
    echo "[build-kube] tools in $BIN_DIR (linked from .tools/bin):"
    printf '  %-24s %s\n' kube-apiserver "$("$BIN_DIR/kube-apiserver" --version 2>&1 | head -1)"
    printf '  %-24s %s\n' kube-controller-manager "$("$BIN_DIR/kube-controller-manager" --version 2>&1 | head -1)"
    printf '  %-24s %s\n' kube-scheduler "$("$BIN_DIR/kube-scheduler" --version 2>&1 | head -1)"
    printf '  %-24s %s\n' kubelet "$("$BIN_DIR/kubelet" --version 2>&1 | head -1)"
    printf '  %-24s %s\n' etcd "$("$BIN_DIR/etcd" --version 2>&1 | head -1)"
    printf '  %-24s %s\n' kwok "$("$BIN_DIR/kwok" --version 2>&1 | head -1)"
  } >&2
}

finish() {
  link_into_repo
  print_versions
  log "done"
  if [[ $PRINT_BIN_DIR == 1 ]]; then echo "$BIN_DIR"; fi
}

if [[ $CHECK == 1 ]]; then
  if cache_complete; then echo "$BIN_DIR"; exit 0; fi
  echo "build-kube: not built yet: $CACHE_DIR" >&2; exit 1
fi

mkdir -p "$CACHE_ROOT"
# Serialise concurrent builds of the same tools (e.g. two test sessions).
exec 9>"$CACHE_ROOT/.$NAME.lock"
if ! flock -n 9; then
  log "another build of $NAME is running; waiting for it"
  flock 9
fi

if [[ $FORCE == 0 ]] && cache_complete; then
  log "cache hit: $CACHE_DIR"
  finish
  exit 0
fi

command -v go >/dev/null || die "go is not on PATH (Go >= 1.24 is needed to build the tools)"
log "cache miss: building $NAME"
log "$(go version)"

export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
export CGO_ENABLED=0
JOBS="${KUBE_BUILD_JOBS:-2}"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
STAGE="$CACHE_DIR/bin.partial"
rm -rf "$STAGE"
mkdir -p "$STAGE" "$CACHE_DIR/logs"
rm -f "$CACHE_DIR/.complete"

# go build with a heartbeat line each minute (a cold k8s build is silent for many minutes).
BUILD_PID=""
trap '[[ -n $BUILD_PID ]] && kill "$BUILD_PID" 2>/dev/null; true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
go_build() { # label module-dir ldflags packages...
  local label="$1" dir="$2" ldflags="$3"; shift 3
  local blog="$CACHE_DIR/logs/$label.log" t0=$SECONDS pid rc
  log "building $label ($*) ..."
  (cd "$dir" && exec go build -p "$JOBS" -v -ldflags "$ldflags" -o "$STAGE/" "$@") >"$blog" 2>&1 &
  pid=$!
  BUILD_PID=$pid
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 60); do sleep 1; kill -0 "$pid" 2>/dev/null || break; done
    if kill -0 "$pid" 2>/dev/null; then
      log "  ... $label still building ($((SECONDS - t0))s, $(grep -vc '^go: downloading' "$blog" || true) packages compiled so far)"
    fi
  done
  rc=0; wait "$pid" || rc=$?
  BUILD_PID=""
  if [[ $rc != 0 ]]; then
    grep -v '^[a-zA-Z0-9._/-]*$' "$blog" | tail -40 >&2 || true
    die "building $label failed (exit $rc); full log: $blog"
  fi
  log "built $label in $((SECONDS - t0))s"
}

K8S_MINOR="${K8S_VERSION#v1.}"; K8S_MINOR="${K8S_MINOR%%.*}"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
  K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE -X $pkg.gitCommit="
done
go_build kubernetes "$KUBE_SRC/k8s" "$K8S_LDFLAGS" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet

# tools/kube/etcd is a two-line main calling etcdmain.Main (the binary is named after its dir: etcd).
go_build etcd "$KUBE_SRC/etcd" "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}-gomodule" .

go_build kwok "$KUBE_SRC/kwok" \
  "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
  sigs.k8s.io/kwok/cmd/kwok

for b in "${BINARIES[@]}"; do [[ -x "$STAGE/$b" ]] || die "missing binary after build: $b"; done
rm -rf "$BIN_DIR"
mv "$STAGE" "$BIN_DIR"
{
  echo "K8S_VERSION=$K8S_VERSION"; echo "ETCD_VERSION=$ETCD_VERSION"; echo "KWOK_VERSION=$KWOK_VERSION"
  echo "INPUT_HASH=$INPUT_HASH"; echo "BUILD_DATE=$BUILD_DATE"; echo "GO=$(go env GOVERSION)"
  echo "BUILD_SECONDS=$((SECONDS - START))"
} >"$CACHE_DIR/.complete"
log "build complete in $((SECONDS - START))s; $(du -sh "$BIN_DIR" | cut -f1) of binaries"
finish
