#!/usr/bin/env bash
# Install Prometheus and promtool from Debian's package, for the tests that check gpufleet's metrics, alert
# rules and dashboard queries against the real thing (tests/integration/test_prometheus.py).
#
# Usage: scripts/install-prometheus.sh [--check] [--help]
#   --check   install nothing: exit 0 when both are there, else 1
#
# Idempotent: exits at once when they are there. Must run as root to install. No daemon is started (the
# package's service is not used; the tests run their own server on a free loopback port).
set -euo pipefail
case "${1:-}" in
  --check) command -v prometheus >/dev/null && command -v promtool >/dev/null; exit $? ;;
  -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "install-prometheus: unknown argument: $1" >&2; exit 2 ;;
esac
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  echo "[install-prometheus] present: $(prometheus --version 2>&1 | head -1)"
  exit 0
fi
echo "[install-prometheus] installing Debian's prometheus (prometheus, promtool)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends -o APT::Get::Upgrade-By-Source-Package=false prometheus >/dev/null
# the package's postinst may start its service where an init system runs: the tests need none of it
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "[install-prometheus] $(prometheus --version 2>&1 | head -1)"
