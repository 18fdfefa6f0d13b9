#!/usr/bin/env bash
# Debian's chromium + chromedriver (and the fonts the dashboard is drawn with) for the dashboard's
# browser test; installs only what is missing. Needs root or password-less sudo and apt-get.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: chromium/chromedriver missing and no apt-get here; install Chromium and its driver, or run \`make test PYTEST_ARGS=\"-k 'not chromium'\"\`" >&2
    exit 1
fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
echo "installing chromium + chromedriver with apt-get (once) ..."
$SUDO apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    chromium chromium-driver fonts-liberation fonts-dejavu-core
