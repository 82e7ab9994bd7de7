#!/usr/bin/env bash
# A hub gateway of 10,000 sites (issue 37, docs/benchmarks.md "A hub of 10,000 sites"), as root:
# - the agent on the cloud gateway with 10,000 edge sites in the test API server: configured from
#   nothing, one site's change, a read-back, idle CPU and memory of the agent and sticky-wg
#   (crates/agent/tests/agent/sites_hub.rs);
# - sticky-wg alone with 10,000 peers and a load generator speaking WireGuard: 1,000 sites
#   handshaking at once while 50 established sites ping (crates/wg/tests/daemon/hub.rs).
# Takes about five minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins
cargo test --release --locked -p sticky-vxlan-agent --test agent -- --ignored --nocapture --test-threads 1 bench_hub_ 2>&1 |
    grep -o 'BENCH.*'
cargo test --release --locked -p sticky-wg --test daemon -- --ignored --nocapture --test-threads 1 bench_hub_ 2>&1 |
    grep -o 'BENCH.*'
