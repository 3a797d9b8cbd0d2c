#!/usr/bin/env bash
# Build the root filesystem the local Slurm runs from: Debian's unstable suite (sid)
# with Slurm 26.05 (slurmctld, slurmd, slurmrestd, slurmdbd, the JWT plugin, munge),
# MariaDB (the accounting database the stack declares: slurmdbd writes to it) and python3
# (the demo job localenv/train.py runs as a Slurm batch job inside it).
# No Debian suite but sid has the Slurm that Slinky 1.x needs (>= 25.11).
#
# The root goes to a cache folder outside the clone, keyed by the suite and the
# versions of the packages actually installed:
#   ${GPUFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools}/slurm-root-<suite>-<slurm>-<hash>/
# (<hash> covers the recipe and every installed package version; both are in its
# .complete file). A re-run with a complete root for the same recipe only checks it.
#
# Usage: scripts/build-slurm-root.sh [--force] [--check] [--print-root] [--quiet]
#   --force       build a new root even if a complete one exists (sid may have moved on)
#   --check       build nothing: exit 0 and print the root if a complete one exists, else 1
#   --print-root  print only the root folder on stdout (progress goes to stderr)
#   --quiet       no progress lines (errors are still shown)
# Env:  GPUFLEET_TOOLS_CACHE (cache root), GPUFLEET_SLURM_SUITE (default sid),
#       GPUFLEET_DEBIAN_MIRROR (debootstrap's mirror, default debootstrap's own).
# Cold: about two minutes (debootstrap ~100 s, apt-get ~25 s); needs root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FORCE=0; CHECK=0; PRINT_ROOT=0; QUIET=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --check) CHECK=1 ;;
    --print-root) PRINT_ROOT=1 ;;
    --quiet) QUIET=1 ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-slurm-root: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

START=$SECONDS
log() {
  [[ $QUIET == 1 ]] && return 0
  printf '[build-slurm-root] %4ds  %s\n' "$((SECONDS - START))" "$*" >&2
}
die() { printf '[build-slurm-root] ERROR: %s\n' "$*" >&2; exit 1; }

SUITE="${GPUFLEET_SLURM_SUITE:-sid}"
PACKAGES=(slurmctld slurmd slurmrestd slurmdbd munge slurm-client slurm-wlm-jwt-plugin mariadb-server python3)
# The user slurmrestd runs as (it refuses root) and Slurm's own SlurmUser stays root.
REST_USER=slurmrest
# Users the local tests and the stack need to resolve in the root (slurmctld and slurmdbd look a JWT's
# user up by name): the reconciler's dedicated Slurm user (Pulumi.local.yaml slurm.reconciler_user)
# and an ordinary user whose token may change nothing.
ROOT_USERS=(gpufleet tenant)
# Bump when the recipe below changes in a way the package list does not show.
BUILD_REV=1
RECIPE="$(printf '%s\n' "$SUITE" "${PACKAGES[*]}" "$REST_USER" "${ROOT_USERS[*]}" "$BUILD_REV" | sha256sum | cut -c1-10)"
CACHE_ROOT="${GPUFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/tools}"
BINARIES=(usr/sbin/slurmctld usr/sbin/slurmd usr/sbin/slurmrestd usr/sbin/slurmdbd usr/sbin/munged usr/bin/sbatch
          usr/bin/scontrol usr/bin/squeue usr/bin/sinfo usr/bin/scancel usr/bin/sacctmgr usr/sbin/mariadbd
          usr/bin/mariadb-install-db usr/bin/python3)

# Checked inside the root: its /usr/sbin/slurmctld etc. are absolute alternatives links.
has_binaries() { # dir
  local b
  for b in "${BINARIES[@]}"; do chroot "$1" /usr/bin/test -x "/$b" || return 1; done
}

root_complete() { # dir
  [[ -f "$1/.complete" ]] && grep -qx "RECIPE=$RECIPE" "$1/.complete" || return 1
  has_binaries "$1" || return 1
  compgen -G "$1/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null
}

# The newest complete root of this recipe (there is one unless --force built a second).
find_root() {
  local d best="" t bt=0
  for d in "$CACHE_ROOT"/slurm-root-"$SUITE"-*/; do
    d="${d%/}"
    [[ -d $d ]] && root_complete "$d" || continue
    t="$(stat -c %Y "$d/.complete")"
    if (( t > bt )); then best="$d"; bt=$t; fi
  done
  [[ -n $best ]] && echo "$best"
}

finish() { # dir
  ln -sfn "$1" "$ROOT/.tools/slurm-root" 2>/dev/null || { mkdir -p "$ROOT/.tools" && ln -sfn "$1" "$ROOT/.tools/slurm-root"; }
  if [[ $QUIET == 0 ]]; then
    {
      echo "[build-slurm-root] root in $1 (linked from .tools/slurm-root):"
      grep -E '^(SUITE|SLURM|MUNGE|MARIADB|PYTHON)=' "$1/.complete" | sed 's/^/  /'
    } >&2
  fi
  log "done"
  if [[ $PRINT_ROOT == 1 ]]; then echo "$1"; fi
}

if [[ $CHECK == 1 ]]; then
  if dir="$(find_root)"; then echo "$dir"; exit 0; fi
  echo "build-slurm-root: not built yet: no complete $CACHE_ROOT/slurm-root-$SUITE-* for recipe $RECIPE" >&2
  exit 1
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.slurm-root-$SUITE.lock"
if ! flock -n 9; then
  log "another build of the $SUITE Slurm root is running; waiting for it"
  flock 9
fi

if [[ $FORCE == 0 ]] && dir="$(find_root)"; then
  log "cache hit: $dir"
  finish "$dir"
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "must run as root (debootstrap and chroot)"
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap on the host (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q -o DPkg::Lock::Timeout=300 >&2
  apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 debootstrap </dev/null >&2
fi

STAGE="$CACHE_ROOT/slurm-root-$SUITE.partial"
# A half-built stage may still have bind mounts from an interrupted run.
for m in proc dev; do mountpoint -q "$STAGE/$m" 2>/dev/null && umount -l "$STAGE/$m"; done
# A stage whose debootstrap finished (same day) is reused; anything else starts again.
if [[ ! -f $STAGE/.debootstrap-done ]] || [[ $FORCE == 1 ]] \
   || [[ "$(cat "$STAGE/.debootstrap-done")" != "$SUITE $(date -u +%F)" ]]; then
  rm -rf "$STAGE"
fi
mkdir -p "$STAGE"
cleanup() {
  for m in proc dev; do mountpoint -q "$STAGE/$m" 2>/dev/null && umount -l "$STAGE/$m"; done
  true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

BLOG="$CACHE_ROOT/slurm-root-$SUITE.build.log"
: >"$BLOG"
# Run a long step with a heartbeat line every 30 s.
step() { # label cmd...
  local label="$1" t0=$SECONDS pid rc; shift
  log "$label ..."
  "$@" >>"$BLOG" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do sleep 1; kill -0 "$pid" 2>/dev/null || break; done
    kill -0 "$pid" 2>/dev/null && log "  ... $label ($((SECONDS - t0))s, $(wc -l <"$BLOG") log lines)"
  done
  rc=0; wait "$pid" || rc=$?
  if [[ $rc != 0 ]]; then tail -30 "$BLOG" >&2; die "$label failed (exit $rc); full log: $BLOG"; fi
  log "$label: $((SECONDS - t0))s"
}

MIRROR=()
[[ -n ${GPUFLEET_DEBIAN_MIRROR:-} ]] && MIRROR=("$GPUFLEET_DEBIAN_MIRROR")
if [[ -f $STAGE/.debootstrap-done ]]; then
  log "reusing today's debootstrap of $SUITE in $STAGE"
else
  step "debootstrap --variant=minbase $SUITE" debootstrap --variant=minbase "$SUITE" "$STAGE" "${MIRROR[@]}"
  echo "$SUITE $(date -u +%F)" >"$STAGE/.debootstrap-done"
fi
# Signatures are checked as always; the Release file's Valid-Until is not, since a mirror
# snapshot of sid can be older than its one-week validity on a machine whose clock runs on.
echo 'Acquire::Check-Valid-Until "false";' >"$STAGE/etc/apt/apt.conf.d/99gpufleet-valid-until"

# Package scripts must start no daemon (the host has no systemd for the root anyway).
printf '#!/bin/sh\nexit 101\n' >"$STAGE/usr/sbin/policy-rc.d"
chmod 0755 "$STAGE/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$STAGE/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$STAGE/proc"
mount --rbind /dev "$STAGE/dev"
in_root() { chroot "$STAGE" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
step "apt-get update (in the root)" in_root apt-get update -q
step "apt-get install ${PACKAGES[*]}" in_root apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${PACKAGES[@]}"
in_root sh -c "getent passwd $REST_USER >/dev/null || useradd --system --no-create-home --shell /usr/sbin/nologin $REST_USER"
for u in "${ROOT_USERS[@]}"; do
  in_root sh -c "getent passwd $u >/dev/null || useradd --no-create-home --shell /usr/sbin/nologin $u"
done
in_root apt-get clean
cleanup

# What got installed: the key of the cache folder.
VERSIONS="$(chroot "$STAGE" dpkg-query -W -f='${Package}=${Version}\n' | sort)"
SLURM_V="$(chroot "$STAGE" dpkg-query -W -f='${Version}' slurmctld)"
SLURM_UP="${SLURM_V#*:}"; SLURM_UP="${SLURM_UP%%-*}"
HASH="$(printf '%s\n%s\n' "$RECIPE" "$VERSIONS" | sha256sum | cut -c1-10)"
DIR="$CACHE_ROOT/slurm-root-$SUITE-$SLURM_UP-$HASH"
{
  echo "SUITE=$SUITE"; echo "RECIPE=$RECIPE"; echo "BUILD_REV=$BUILD_REV"; echo "HASH=$HASH"
  echo "SLURM=$SLURM_V"
  echo "MUNGE=$(chroot "$STAGE" dpkg-query -W -f='${Version}' munge)"
  echo "MARIADB=$(chroot "$STAGE" dpkg-query -W -f='${Version}' mariadb-server)"
  echo "PYTHON=$(chroot "$STAGE" dpkg-query -W -f='${Version}' python3)"
  echo "REST_USER=$REST_USER"
  echo "ROOT_USERS=${ROOT_USERS[*]}"
  echo "PACKAGES=${PACKAGES[*]}"
  echo "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "BUILD_SECONDS=$((SECONDS - START))"
  echo "# installed package versions:"
  sed 's/^/# /' <<<"$VERSIONS"
} >"$STAGE/.complete.partial"
has_binaries "$STAGE" || die "missing after install: one of ${BINARIES[*]}"
if root_complete "$DIR"; then
  # Same suite, recipe and package versions as a root that may be in use: keep that one.
  log "the rebuilt root equals $DIR: keeping the existing one"
  rm -rf "$STAGE"
  finish "$DIR"
  exit 0
fi
rm -rf "$DIR"
mv "$STAGE" "$DIR"
rm -f "$DIR/.debootstrap-done"
mv "$DIR/.complete.partial" "$DIR/.complete"
log "root complete in $((SECONDS - START))s; $(du -sh "$DIR" | cut -f1)"
finish "$DIR"
