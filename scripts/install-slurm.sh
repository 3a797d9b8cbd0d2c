#!/usr/bin/env bash
# Install Slurm (Debian 12: 22.05) and MUNGE for the local multi-node Slurm
# (gpufleet/localenv/slurm.py) and the reconciler's Slurm integration tests.
#
# Idempotent and non-interactive: exits at once when the tools are already there.
# Must run as root (CI runs as root). After installing it makes sure that no
# system munged/slurmctld/slurmd started by the package scripts is left running:
# LocalSlurm starts its own daemons with its own config, sockets and ports.
set -euo pipefail

need=(slurmctld slurmd munged munge unmunge sbatch scontrol squeue sinfo scancel)
missing=()
for b in "${need[@]}"; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-slurm: slurm and munge already installed (slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo "?"))"
  exit 0
fi
echo "install-slurm: missing: ${missing[*]}"

if [ "$(id -u)" -ne 0 ]; then
  echo "install-slurm: must run as root to apt-get install" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting daemons (no systemd here; policy-rc.d may
# already forbid it, as in Docker-like images). Restore whatever was there.
prc=/usr/sbin/policy-rc.d
backup=""
if [ -e "$prc" ]; then backup="$(mktemp)"; cp -p "$prc" "$backup"; fi
restore_prc() {
  if [ -n "$backup" ]; then cp -p "$backup" "$prc"; rm -f "$backup"; else rm -f "$prc"; fi
}
trap restore_prc EXIT
printf '#!/bin/sh\nexit 101\n' >"$prc"
chmod 0755 "$prc"

echo "install-slurm: apt-get update"
apt-get update -q -o DPkg::Lock::Timeout=300
echo "install-slurm: apt-get install slurmctld slurmd slurm-client munge"
apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  slurmctld slurmd slurm-client munge </dev/null

# Stop any system daemon that got started anyway (by pid file, never by name
# pattern across the machine: only the system instances' own pid files).
for svc in slurmctld slurmd munge; do
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl stop "$svc" >/dev/null 2>&1 || true
    systemctl disable "$svc" >/dev/null 2>&1 || true
  fi
done
for pidf in /run/slurmctld.pid /run/slurmd.pid /var/run/slurmctld.pid /var/run/slurmd.pid \
            /run/munge/munged.pid /var/run/munge/munged.pid; do
  if [ -f "$pidf" ]; then
    pid="$(cat "$pidf" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "install-slurm: stopping system daemon pid $pid ($pidf)"
      kill "$pid" 2>/dev/null || true
    fi
  fi
done

for b in "${need[@]}"; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { echo "install-slurm: $b still missing" >&2; exit 1; }
done
echo "install-slurm: installed slurm $(dpkg-query -W -f='${Version}' slurm-client)"
