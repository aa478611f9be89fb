#!/usr/bin/env bash
# Make sure Debian's chromium is installed (the browser test drives it with Playwright; Playwright's
# own browser downloads are not reachable here). Idempotent: does nothing when it is already there.
# Usage: scripts/ensure-chromium.sh  -> prints the path of the chromium binary.
set -euo pipefail

BIN="${STATEKEEPER_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo -n"
else
    SUDO=""
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing chromium (apt-get)..." >&2
# several sessions may install at once: wait for dpkg's lock instead of failing
for attempt in 1 2 3 4 5; do
    if $SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 \
        && $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >&2; then
        break
    fi
    echo "apt-get failed (attempt $attempt); retrying" >&2
    sleep $((attempt * 5))
done
if [ ! -x "$BIN" ]; then
    echo "chromium is still missing at $BIN after apt-get install" >&2
    exit 1
fi
echo "$BIN"
