#!/usr/bin/env bash
# Builds cnitool from Debian's own golang-github-appc-cni sources (libcni 1.1.2, the code path
# containerd and CRI-O use) and prints the binary's path. The binary is cached outside the
# checkout; the machine's apt configuration is not changed (a private sources list is used).
# Needs: golang-go, golang-github-appc-cni-dev (installed by .ci/run).
set -euo pipefail

cache=${STICKY_CNITOOL_CACHE:-/var/cache/sticky-cni-test}
bin=$cache/cnitool
if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [[ -z $uri ]]; then
  uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
echo "deb-src $uri bookworm main" >"$work/sources.list"
mkdir -p "$work/lists/partial"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root -qq)
apt-get "${apt_opts[@]}" update >&2
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only golang-github-appc-cni >&2)
tar -C "$work" -xf "$work"/golang-github-appc-cni_*.orig.tar.xz
src=$(find "$work" -maxdepth 2 -type d -name cnitool | head -n 1)
(cd "$src" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$work/gocache" go build -o "$bin.tmp" .) >&2
mv "$bin.tmp" "$bin"
echo "$bin"
