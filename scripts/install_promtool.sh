#!/usr/bin/env bash
# Install promtool and the Prometheus server project-locally, into .cache/tools/,
# from Debian's `prometheus` package: fetched with `apt-get download` and
# unpacked with `dpkg -x`, never installed system-wide (no service, no user,
# no /etc changes). The rule tests (tests/test_monitoring_rules.py) run the
# real promtool; the end-to-end run (python -m testkit.monitoring.e2e) runs the server.
#
# Idempotent: when .cache/tools/bin/promtool runs, it returns at once.
# Needs Debian's apt repositories (and root for `apt-get update`, which runs
# only when the package lists do not know the package yet).
#
# Usage: scripts/install_promtool.sh        prints nothing when already installed
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$(pwd)/.cache/tools"
BIN="$TOOLS/bin"

if [[ -x "$BIN/promtool" && -x "$BIN/prometheus" ]] && "$BIN/promtool" --version >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    echo "install_promtool: needs Debian's apt-get and dpkg; elsewhere install promtool and prometheus (2.42 or" \
         "newer) yourself and set FUZZSERVE_PROMTOOL / FUZZSERVE_PROMETHEUS to them" >&2
    exit 1
fi
echo "install_promtool: fetching Debian's prometheus package into $TOOLS" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `apt-get download` writes into the current directory; as root it would drop
# privileges to _apt, which cannot write into a mktemp directory.
download() { (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root prometheus >/dev/null); }
if ! download 2>/dev/null; then
    apt-get update -qq >/dev/null
    download
fi
deb=$(ls "$tmp"/prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
dest="$TOOLS/prometheus-$version"
rm -rf "$dest"
mkdir -p "$dest" "$BIN"
dpkg -x "$deb" "$dest"
# relative links: the checkout may move
ln -sfn "../prometheus-$version/usr/bin/promtool" "$BIN/promtool"
ln -sfn "../prometheus-$version/usr/bin/prometheus" "$BIN/prometheus"
"$BIN/promtool" --version 2>&1 | head -1 >&2
