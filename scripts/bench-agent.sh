#!/usr/bin/env bash
# The agent's figures (README, docs/agent.md): time from a Node object change to programmed
# peers on the other nodes (median over 20 changes), and resident memory and CPU when idle with
# 500 nodes in the API. Both run against the test API server (tests/kube_support), with agents
# in node namespaces, as root. Takes about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --locked --test vxlan_agent -- --ignored --nocapture --test-threads 1 bench_ 2>&1 |
    grep -o 'BENCH.*'
