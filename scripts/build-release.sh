#!/usr/bin/env bash
# Builds the release binaries as they ship: target/release/sticky-ipam and sticky-vxlan,
# statically linked (glibc included), at a fixed address (not PIE).
#
#   scripts/build-release.sh [cargo options, e.g. --quiet]
#
# Why static: a plugin is exec'd for every CNI call, and the dynamic loader's relocations and
# symbol lookups were a quarter of a sticky-ipam call's instructions (0.3 ms of a 2 ms ADD on
# the development VM); a static binary also runs on any x86_64 Linux node, whatever its glibc.
# Why not PIE: a static-pie binary relocates itself at every start (3,900 relocations, 13 more
# page faults copying the pages they touch): 25-90 µs of each call (`scripts/ab-ipam.py` of
# the two builds, 150 rounds: VERSION 0.78 -> 0.75 ms, ADD 1.45 -> 1.36 ms, DEL 1.20 ->
# 1.15 ms). The reference plugins ship the same way (Go builds non-PIE executables;
# Debian's /usr/lib/cni/host-local is one); the stack, heap and libraries' mappings are still
# randomized.
# Host names (the agent's API server) resolve through /etc/hosts and DNS, which glibc links in;
# other NSS modules named in /etc/nsswitch.conf are not loaded.
#
# Why `cargo rustc` per binary and not RUSTFLAGS: `-C target-feature=+crt-static` for the whole
# build would also apply to the proc-macro crates (serde's derive), which cannot be built
# static; given to the final rustc call only, it links just the binary static. A later plain
# `cargo build --release` relinks them dynamically (they work the same, and need glibc 2.34+).
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in sticky-ipam sticky-vxlan; do
    cargo rustc --release --locked --bin "$bin" "$@" -- -C target-feature=+crt-static -C relocation-model=static
done
