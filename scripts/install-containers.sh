#!/usr/bin/env bash
# Install the container tooling the local environment builds and runs its images with:
# podman, buildah, containerd, runc, debootstrap and the CNI plugins, from Debian's packages.
#
# Usage: scripts/install-containers.sh [--check] [--help]
#   --check   install nothing: exit 0 when everything is there, else 1 (names what is missing)
#
# Idempotent: exits at once when the tools are there. Must run as root to install.
# APT::Get::Upgrade-By-Source-Package=false keeps apt from upgrading unrelated installed packages
# (without it, installing podman also upgrades `login` and `passwd`). No daemon is started:
# the local environment runs its own containerd with its own root, state and socket, and podman /
# buildah read the project's own configuration (tools/containers/, see localenv/containers.py).
set -euo pipefail

CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-containers: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# command -> Debian package that ships it
declare -A PKG=(
  [podman]=podman [buildah]=buildah [containerd]=containerd [ctr]=containerd [runc]=runc
  [debootstrap]=debootstrap [newuidmap]=uidmap [slirp4netns]=slirp4netns [fuse-overlayfs]=fuse-overlayfs
)
# files -> package (the CNI plugins are not on PATH)
declare -A FILES=( [/usr/lib/cni/bridge]=containernetworking-plugins [/usr/lib/cni/host-local]=containernetworking-plugins
                   [/usr/lib/cni/loopback]=containernetworking-plugins [/usr/lib/cni/portmap]=containernetworking-plugins )

missing=()
for cmd in "${!PKG[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${PKG[$cmd]}")
done
for f in "${!FILES[@]}"; do [ -x "$f" ] || missing+=("${FILES[$f]}"); done
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

versions() {
  printf 'install-containers: podman %s, buildah %s, containerd %s, runc %s, debootstrap %s\n' \
    "$(dpkg-query -W -f='${Version}' podman)" "$(dpkg-query -W -f='${Version}' buildah)" \
    "$(dpkg-query -W -f='${Version}' containerd)" "$(dpkg-query -W -f='${Version}' runc)" \
    "$(dpkg-query -W -f='${Version}' debootstrap)"
}

if [ ${#missing[@]} -eq 0 ]; then
  [ $CHECK = 1 ] || versions
  exit 0
fi
if [ $CHECK = 1 ]; then echo "install-containers: missing packages: ${missing[*]}" >&2; exit 1; fi
echo "install-containers: missing packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then echo "install-containers: must run as root to apt-get install" >&2; exit 1; fi

export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting daemons (containerd ships a service). Restore what was there.
prc=/usr/sbin/policy-rc.d
backup=""
if [ -e "$prc" ]; then backup="$(mktemp)"; cp -p "$prc" "$backup"; fi
restore_prc() { if [ -n "$backup" ]; then cp -p "$backup" "$prc"; rm -f "$backup"; else rm -f "$prc"; fi; }
trap restore_prc EXIT
printf '#!/bin/sh\nexit 101\n' >"$prc"
chmod 0755 "$prc"

echo "install-containers: apt-get update"
apt-get update -q -o DPkg::Lock::Timeout=300
echo "install-containers: apt-get install ${missing[*]}"
apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 \
  -o APT::Get::Upgrade-By-Source-Package=false \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  podman buildah containerd runc uidmap slirp4netns fuse-overlayfs debootstrap containernetworking-plugins </dev/null

# A containerd started by the package anyway (systemd hosts) is not ours: stop it by its pid file.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl stop containerd >/dev/null 2>&1 || true
  systemctl disable containerd >/dev/null 2>&1 || true
fi
"$0" --check
versions
