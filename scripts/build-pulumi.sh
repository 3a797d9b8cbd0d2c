#!/usr/bin/env bash
# Build the Pulumi engine pieces gpufleet needs from Go modules (no download sites needed):
#   pulumi                       CLI/engine      tools/pulumi/go.mod
#   pulumi-language-python       language host   tools/pulumi/cmd/pulumi-language-python
#   pulumi-resource-kubernetes   k8s provider    tools/pulumi/k8s/go.mod
# into a cache outside the clone, keyed by the versions pinned in tools/pulumi/versions.env:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools/pulumi-<cli>-k8s-<provider>/bin
# and symlink them into <repo>/.tools/bin. A warm cache takes no go invocation.
#
# Usage: scripts/build-pulumi.sh [--force]
#   --force      rebuild even if the cache is complete
# Env:   GPUFLEET_TOOLS_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools)
#        GPUFLEET_PULUMI_HOME  PULUMI_HOME to register the provider in (default <repo>/.tools/pulumi-home)
#        GO_BUILD_P            go build -p (default: nproc)
#        PULUMI_BUILD_CLI=1    build the CLI even if a compatible pulumi is on PATH
# Then:  export PATH="<repo>/.tools/bin:$PATH" PULUMI_HOME="<repo>/.tools/pulumi-home" \
#               PULUMI_SKIP_UPDATE_CHECK=true
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO/tools/pulumi"
# shellcheck source=../tools/pulumi/versions.env
source "$TOOLS/versions.env"

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# versions.env documents the pins; the go.mod files are what go builds: keep them in step.
grep -q "github.com/pulumi/pulumi/pkg/v3 $PULUMI_CLI_VERSION\$" "$TOOLS/go.mod" ||
  { echo "tools/pulumi/go.mod does not require pulumi/pkg/v3 $PULUMI_CLI_VERSION (versions.env)" >&2; exit 1; }
grep -q "github.com/pulumi/pulumi-kubernetes/provider/v4 $K8S_PROVIDER_MODULE_VERSION\$" "$TOOLS/k8s/go.mod" ||
  { echo "tools/pulumi/k8s/go.mod does not require provider/v4 $K8S_PROVIDER_MODULE_VERSION (versions.env)" >&2; exit 1; }

START=$SECONDS
step() { printf '[build-pulumi +%3ds] %s\n' "$((SECONDS - START))" "$*"; }
die() { printf '[build-pulumi +%3ds] ERROR: %s\n' "$((SECONDS - START))" "$*" >&2; exit 1; }

CACHE_ROOT="${GPUFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools}"
CACHE="$CACHE_ROOT/pulumi-${PULUMI_CLI_VERSION}-k8s-${K8S_PROVIDER_VERSION}"
BIN="$CACHE/bin"
LINKS="$REPO/.tools/bin"
PULUMI_HOME_DIR="${GPUFLEET_PULUMI_HOME:-$REPO/.tools/pulumi-home}"

# Recipe hash per component: a change to its pins or sources invalidates its cached binary.
recipe_hash() { (cd "$REPO" && cat "$@" | sha256sum | cut -c1-16); }
# shellcheck disable=SC2046
CLI_HASH=$(recipe_hash tools/pulumi/versions.env tools/pulumi/go.mod tools/pulumi/go.sum)
# shellcheck disable=SC2046
LANG_HASH=$(recipe_hash tools/pulumi/versions.env tools/pulumi/go.mod tools/pulumi/go.sum \
  $(cd "$REPO" && find tools/pulumi/cmd -type f -name '*.go' | LC_ALL=C sort))
# shellcheck disable=SC2046
K8S_HASH=$(recipe_hash tools/pulumi/versions.env \
  $(cd "$REPO" && find tools/pulumi/k8s -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) | LC_ALL=C sort))

fresh() { # fresh NAME HASH: cached binary exists and was built from this recipe
  [[ $FORCE == 0 && -x "$BIN/$1" && -f "$BIN/.$1.recipe" && "$(cat "$BIN/.$1.recipe")" == "$2" ]]
}
semver_ge() { # semver_ge A B: A >= B (numeric x.y.z, leading v and suffixes ignored)
  local a b
  a=$(sed -E 's/^v//; s/[-+].*$//' <<<"$1"); b=$(sed -E 's/^v//; s/[-+].*$//' <<<"$2")
  [[ "$(printf '%s\n%s\n' "$a" "$b" | sort -t. -k1,1n -k2,2n -k3,3n | head -n1)" == "$b" ]]
}

step "cache: $CACHE"
mkdir -p "$BIN" "$LINKS"
# One build at a time per cache (e.g. a developer's shell and a test run).
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.pulumi.lock"
  flock -n 9 || { step "waiting for another build-pulumi.sh run to finish"; flock 9; }
fi

# --- Is a compatible pulumi already on PATH (outside .tools)? ---------------------------
EXTERNAL_PULUMI=""
if [[ "${PULUMI_BUILD_CLI:-0}" != 1 ]]; then
  while IFS= read -r cand; do
    [[ -n "$cand" ]] || continue
    real=$(readlink -f "$cand")
    case "$real" in "$REPO"/.tools/*|"$CACHE_ROOT"/*) continue ;; esac
    ver=$(PULUMI_SKIP_UPDATE_CHECK=true "$cand" version 2>/dev/null | head -n1 || true)
    if [[ "$ver" =~ ^v?3\.[0-9]+\.[0-9]+ ]] && semver_ge "$ver" "$PULUMI_CLI_MIN_VERSION"; then
      EXTERNAL_PULUMI="$cand"
      step "pulumi $ver found on PATH at $cand (>= $PULUMI_CLI_MIN_VERSION): using it, not building the CLI"
      break
    else
      step "pulumi on PATH at $cand reports '${ver:-?}' (< $PULUMI_CLI_MIN_VERSION or unparsable): ignoring it"
    fi
  done < <(type -ap pulumi 2>/dev/null || true)
fi

NEED_CLI=0; NEED_LANG=0; NEED_K8S=0
[[ -n "$EXTERNAL_PULUMI" ]] || fresh pulumi "$CLI_HASH" || NEED_CLI=1
fresh pulumi-language-python "$LANG_HASH" && [[ -f "$BIN/pulumi-language-python-exec" ]] || NEED_LANG=1
fresh pulumi-resource-kubernetes "$K8S_HASH" || NEED_K8S=1

if (( NEED_CLI + NEED_LANG + NEED_K8S > 0 )); then
  command -v go >/dev/null || die "go is not on PATH (needed to build; see tools/pulumi/go.mod for the version)"
  P="${GO_BUILD_P:-$(nproc 2>/dev/null || echo 2)}"
  GOBUILD=(go build -p "$P" -trimpath -buildvcs=false)
  step "building with $(go version | cut -d' ' -f3-) (-p $P); a cold build takes ~30 min on 2 cores"
  # Module source dir (downloads the module first: `go list -m` alone leaves .Dir empty).
  moddir() { (cd "$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2"); }
  WORK=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT

  if (( NEED_CLI )); then
    step "pulumi CLI $PULUMI_CLI_VERSION: go build github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
    (cd "$TOOLS" && "${GOBUILD[@]}" \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_CLI_VERSION" \
      -o "$WORK/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
    mv -f "$WORK/pulumi" "$BIN/pulumi"; echo "$CLI_HASH" > "$BIN/.pulumi.recipe"
    step "pulumi CLI built"
  fi

  if (( NEED_LANG )); then
    step "python language host $PULUMI_LANGUAGE_PYTHON_VERSION: go build ./cmd/pulumi-language-python"
    (cd "$TOOLS" && "${GOBUILD[@]}" \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_LANGUAGE_PYTHON_VERSION" \
      -o "$WORK/pulumi-language-python" ./cmd/pulumi-language-python)
    SDKDIR=$(moddir "$TOOLS" github.com/pulumi/pulumi/sdk/v3)
    # The Python shims ship in the sdk/v3 module: the program runner and the dynamic-provider plugin.
    install -m 0755 "$SDKDIR/python/cmd/pulumi-language-python-exec" "$BIN/pulumi-language-python-exec"
    install -m 0755 "$SDKDIR/python/dist/pulumi-resource-pulumi-python" "$BIN/pulumi-resource-pulumi-python"
    mv -f "$WORK/pulumi-language-python" "$BIN/pulumi-language-python"
    echo "$LANG_HASH" > "$BIN/.pulumi-language-python.recipe"
    step "python language host built"
  fi

  if (( NEED_K8S )); then
    K8S="$TOOLS/k8s"
    MODDIR=$(moddir "$K8S" github.com/pulumi/pulumi-kubernetes/provider/v4)
    step "kubernetes provider $K8S_PROVIDER_VERSION: schema from $(basename "$MODDIR")"
    (cd "$K8S" && go run -trimpath -buildvcs=false ./internal/genschema \
      -src "$MODDIR/cmd/pulumi-resource-kubernetes" -out "$WORK/embed" -version "$K8S_PROVIDER_VERSION")
    # The provider's main embeds generated files that are not in the module: overlay them.
    PKG="$K8S/cmd/pulumi-resource-kubernetes"
    printf '{"Replace":{"%s":"%s","%s":"%s"}}\n' \
      "$PKG/schema-embed.json" "$WORK/embed/schema-embed.json" \
      "$PKG/terraform-mapping-embed.json" "$WORK/embed/terraform-mapping-embed.json" > "$WORK/overlay.json"
    step "kubernetes provider: go build ./cmd/pulumi-resource-kubernetes"
    (cd "$K8S" && "${GOBUILD[@]}" -overlay "$WORK/overlay.json" \
      -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$K8S_PROVIDER_VERSION" \
      -o "$WORK/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes)
    mv -f "$WORK/pulumi-resource-kubernetes" "$BIN/pulumi-resource-kubernetes"
    echo "$K8S_HASH" > "$BIN/.pulumi-resource-kubernetes.recipe"
    step "kubernetes provider built"
  fi
else
  step "cache complete for this recipe: nothing to build"
fi

# --- Link into .tools/bin --------------------------------------------------------------
step "linking into $LINKS"
link() { ln -sfn "$BIN/$1" "$LINKS/$1"; }
if [[ -n "$EXTERNAL_PULUMI" ]]; then
  rm -f "$LINKS/pulumi"
  # An upstream install bundles its own language host next to pulumi; prefer it (an ambient
  # one on PATH would shadow it, with a warning from the engine).
  ext_dir=$(dirname "$(readlink -f "$EXTERNAL_PULUMI")")
  if [[ -x "$ext_dir/pulumi-language-python" ]]; then
    rm -f "$LINKS/pulumi-language-python" "$LINKS/pulumi-language-python-exec" "$LINKS/pulumi-resource-pulumi-python"
    step "using the language host bundled with $EXTERNAL_PULUMI"
  else
    link pulumi-language-python; link pulumi-language-python-exec; link pulumi-resource-pulumi-python
  fi
else
  link pulumi; link pulumi-language-python; link pulumi-language-python-exec; link pulumi-resource-pulumi-python
fi

# --- Register the provider in a project-local PULUMI_HOME ------------------------------
# The engine resolves a resource plugin from $PATH first ("ambient": any version, but every
# preview/up then warns "using pulumi-resource-kubernetes from $PATH"), then from
# $PULUMI_HOME/plugins/resource-<name>-v<version>/. So the provider is NOT linked into
# .tools/bin; it is registered in .tools/pulumi-home under the version the SDK requests
# (a symlink to the cache: same layout `pulumi plugin install --file` makes, without a
# 300 MB copy). Without it the engine would try to download the plugin.
PLUGDIR="$PULUMI_HOME_DIR/plugins/resource-kubernetes-v$K8S_PROVIDER_VERSION"
if [[ "$(readlink "$PLUGDIR/pulumi-resource-kubernetes" 2>/dev/null)" != "$BIN/pulumi-resource-kubernetes" ]]; then
  step "registering kubernetes $K8S_PROVIDER_VERSION in PULUMI_HOME=$PULUMI_HOME_DIR"
  rm -rf "$PLUGDIR" "$PLUGDIR.partial" "$PLUGDIR.lock"
  mkdir -p "$PLUGDIR"
  ln -s "$BIN/pulumi-resource-kubernetes" "$PLUGDIR/pulumi-resource-kubernetes"
fi
rm -f "$LINKS/pulumi-resource-kubernetes"

PULUMI_CMD="${EXTERNAL_PULUMI:-$LINKS/pulumi}"
# --- Versions ---------------------------------------------------------------------------
step "done"
export PULUMI_HOME="$PULUMI_HOME_DIR" PULUMI_SKIP_UPDATE_CHECK=true
echo "  pulumi                      $("$PULUMI_CMD" version)  ($(readlink -f "$PULUMI_CMD"))"
if [[ -e "$LINKS/pulumi-language-python" ]]; then
  echo "  pulumi-language-python      $("$LINKS/pulumi-language-python" -version)  ($BIN)"
fi
# Ask the engine to load the provider from PULUMI_HOME and report its schema version.
k8s_ver=$("$PULUMI_CMD" package get-schema "kubernetes@$K8S_PROVIDER_VERSION" 2>/dev/null \
  | head -c 4096 | grep -o '"version": *"[^"]*"' | head -n1 | sed -E 's/.*"([^"]*)"$/\1/' || true)
[[ -n "$k8s_ver" ]] || die "the engine could not load pulumi-resource-kubernetes from $PLUGDIR"
echo "  pulumi-resource-kubernetes  v$k8s_ver  ($PLUGDIR -> $BIN; module $K8S_PROVIDER_MODULE_VERSION)"
echo
echo "  export PATH=\"$LINKS:\$PATH\" PULUMI_HOME=\"$PULUMI_HOME_DIR\" PULUMI_SKIP_UPDATE_CHECK=true"
