#!/usr/bin/env bash
# The whole test suite: unit tests, process-level tests of both plugins, netns tests (as root),
# packaging checks. Run as root for the network tests; without root they say what they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --all-targets --locked
# The crash-safety tests drive a build with crash points, which release builds never have.
cargo build --locked --features crash-points --target-dir target/crash --bin sticky-ipam

if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast
else
  cargo test --locked --no-fail-fast
fi
