# What the scripts/build-*.sh share; each sources it at its top, with BUILD_NAME set to its name:
#   log MSG...   a progress line on stderr, "[name]   12s  MSG" (seconds since the start); none when QUIET=1
#   die MSG...   an error line on stderr, then exit 1
#   usage N      the calling script's header comment (its lines 2..N) as its --help
#   short_hash   the first 10 hex digits of the sha256 of stdin: the key in every cache folder's name
#                (never change it: every build would run again)
#   GPUFLEET_CACHE  where the caches live unless a GPUFLEET_*_CACHE says otherwise
# shellcheck shell=bash
: "${BUILD_NAME:?set BUILD_NAME before sourcing scripts/lib/build.sh}"
START=$SECONDS
GPUFLEET_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet"

log() { [[ ${QUIET:-0} == 1 ]] || printf '[%s] %4ds  %s\n' "$BUILD_NAME" "$((SECONDS - START))" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$BUILD_NAME" "$*" >&2; exit 1; }
usage() { sed -n "2,${1}p" "${BASH_SOURCE[1]}" | sed 's/^# \{0,1\}//'; }
short_hash() { sha256sum | cut -c1-10; }
