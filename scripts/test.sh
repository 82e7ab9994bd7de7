#!/usr/bin/env bash
# The whole test suite: unit tests, process-level tests of both plugins, network-namespace
# tests, cnitool end to end, packaging checks. Run it as root: the network and packaging tests
# need root; without root they say what they skip (and fail when CI is set).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

status=0
step() {
  echo "==> $*"
  "$@" || status=1
}

if command -v shellcheck >/dev/null 2>&1; then
  step shellcheck -S warning scripts/*.sh .ci/run packaging/debian/* packaging/rpm/*.sh
fi
step cargo fmt --check
step cargo clippy --all-targets --locked -- -D warnings
step cargo build --all-targets --locked
# The crash-safety tests drive a build with crash points, which release builds never have.
step cargo build --locked --features crash-points --target-dir target/crash --bin sticky-ipam

if [[ $(id -u) -eq 0 ]]; then
  # sticky-vxlan's crash test needs the crash points compiled into the binary it drives.
  step cargo test --locked --features crash-points --target-dir target/crash --test vxlan_crash
  step scripts/test-packages.sh
else
  echo "==> skipping scripts/test-packages.sh: it installs and purges a .deb, which needs root"
  [[ -n ${CI:-} ]] && status=1
fi

if command -v cargo-nextest >/dev/null 2>&1; then
  step cargo nextest run --locked --no-fail-fast
else
  step cargo test --locked --no-fail-fast
fi
exit $status
