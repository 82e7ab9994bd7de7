#!/usr/bin/env bash
# Builds the release binaries as they ship, statically linked against musl at a fixed address,
# into target/release/sticky-ipam, sticky-vxlan, sticky-vxlan-agent and sticky-wg (or
# $CARGO_TARGET_DIR/release/). The agent and sticky-wg (the sites gateway's WireGuard data path)
# are daemons, not per-call plugins, so start-up speed matters less for them, but they ship the
# same way: one static binary for every node, and the image (scripts/build-image.sh) needs no
# C library.
#
#   scripts/build-release.sh [cargo options, e.g. --quiet]
#
# Why musl: a plugin is a new process for every CNI call, and what a process pays before main
# is most of a call. glibc's start-up reads the CPU's features and cache sizes with `cpuid`,
# dozens of times, and in a virtual machine each `cpuid` traps to the hypervisor: on the
# development VM a static glibc `int main(){}` costs 0.74 ms to spawn, a static musl one 0.26 ms,
# a program with no libc at all 0.25 ms (`perf stat -r 500`). musl does none of that. Measured
# with `scripts/ab-ipam.py` (200 rounds, both builds taking turns): VERSION 0.82 -> 0.29 ms,
# ADD 1.52 -> 0.97 ms, DEL 1.25 -> 0.73 ms; sticky-vxlan's pod ADD 3.70 -> 3.39 ms
# (`scripts/ab-vxlan.py --runs 100`).
# Why static: one binary runs on any x86_64 Linux node, whatever its libc.
# Why not PIE: a static-pie binary relocates itself at every start (3,900 relocations, 13 more
# page faults copying the pages they touch): 25-90 µs of each call with glibc. The reference
# plugins ship the same way (Go builds non-PIE executables; Debian's /usr/lib/cni/host-local is
# one); the stack, heap and mappings are still randomized.
# Host names (the agent's API server) resolve through /etc/hosts and DNS (musl's resolver;
# there is no NSS).
#
# The musl target comes from rustup (`rustup target add x86_64-unknown-linux-musl`, done here
# when missing). Its only C is ring's (the agent's TLS), which cc-rs compiles with the target's C
# compiler: `x86_64-linux-musl-gcc` when one is installed, else the host's `gcc`, which this
# script names itself (CC_x86_64_unknown_linux_musl; a value you set wins). ring's C includes
# no libc header that differs between the two, and the choice was measured: built with the host
# gcc and with Debian's musl-tools (`musl-gcc`), both binaries came out byte for byte identical
# (`cmp`, 2026-11-26), so no extra package is installed for it.
# If the musl build still fails (no rustup, offline, a broken toolchain), this builds a static
# glibc binary instead, which works the same and starts about 0.5 ms slower per call, and says
# so in one line.
#
# Why `cargo rustc` per binary and not RUSTFLAGS: the flags would also apply to the proc-macro
# crates (serde's derive), which must stay host libraries; given to the final rustc call only,
# they shape just the binary. Each binary's package has the binary's name (`-p sticky-ipam`, ...:
# a workspace, docs/design.md "Crates").
set -euo pipefail
cd "$(dirname "$0")/.."
musl=x86_64-unknown-linux-musl
out=${CARGO_TARGET_DIR:-target}
bins=(sticky-ipam sticky-vxlan sticky-vxlan-agent sticky-wg)
mkdir -p "$out/release"

has_musl() {
    [[ -d $(rustc --print sysroot)/lib/rustlib/$musl/lib ]]
}
if ! has_musl && command -v rustup >/dev/null; then
    echo "build-release.sh: adding the $musl target (rustup target add $musl)" >&2
    rustup target add "$musl" >&2 || true
fi
if [[ -z ${CC_x86_64_unknown_linux_musl:-} ]] && ! command -v x86_64-linux-musl-gcc >/dev/null; then
    export CC_x86_64_unknown_linux_musl=gcc
fi

build_musl() {
    has_musl || return 1
    local bin
    for bin in "${bins[@]}"; do
        cargo rustc --release --locked --target "$musl" -p "$bin" --bin "$bin" "$@" -- -C relocation-model=static || return 1
        install -m 0755 "$out/$musl/release/$bin" "$out/release/$bin" || return 1
    done
}

build_glibc() {
    local bin
    for bin in "${bins[@]}"; do
        cargo rustc --release --locked -p "$bin" --bin "$bin" "$@" -- -C target-feature=+crt-static -C relocation-model=static
    done
}

if ! build_musl "$@"; then
    echo "build-release.sh: the $musl build failed or its target is missing: building static glibc binaries instead (they start about 0.5 ms slower per call)" >&2
    build_glibc "$@"
fi
