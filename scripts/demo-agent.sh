#!/usr/bin/env bash
# The node agent adding a node, as root: three network-namespace "nodes", an agent in each,
# and a TEST API server written for the tests (crates/testkit/src/kube_support.rs; not a real kube-apiserver).
# Node node-3 appears in the API with a pod CIDR; nodes 1 and 2 program it with no pod ADD on
# them, and a pod on node 3 is reached from node 1. Everything lives in namespaces and a temp
# dir the test creates and removes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked -p sticky-vxlan-agent --test agent -- --ignored --nocapture demo_agent_adds_a_node 2>&1 |
    grep -o 'DEMO .*' | sed 's/^DEMO //'
