#!/usr/bin/env bash
# The agent's figures (docs/agent.md, docs/benchmarks.md): time from a Node object change to
# programmed peers on the other nodes (median over 20 changes); resident memory and CPU when idle
# with 500 nodes in the API; and at 5,000 real-sized nodes (bench_5000_nodes: first list to
# programmed, a change, a 1,000-Node burst, idle CPU, watch bytes). All run against the test API
# server (crates/testkit/src/kube_support.rs), with agents in node namespaces, as root. Takes about five minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --locked -p sticky-vxlan-agent --test agent -- --ignored --nocapture --test-threads 1 bench_ --skip bench_100000_nodes 2>&1 |
    grep -o 'BENCH.*'
