#!/usr/bin/env bash
# The whole test suite: unit tests, process-level tests of both plugins, network-namespace
# tests, cnitool end to end, packaging checks. Run it as root.
#
# Tests that need root (network namespaces, mounts, podman) are `#[ignore = "needs root: ..."]`.
# As root this script runs them too (`--run-ignored all`) and fails unless the only tests
# skipped are the benchmark and demo entry points below, which their own scripts run. Without
# root the runner reports the root-only tests as skipped, never as passed (nextest lists each
# as SKIP; `cargo test` prints its reason), and under CI (env CI set) the run fails. A test
# that runs and lacks a tool fails and says what to install (`.ci/run` installs all of it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# Ignored on purpose and run on their own: scripts/bench-agent.sh, scripts/demo-agent.sh,
# scripts/bench-sites.py, scripts/bench-hub.sh, and the agent at 100,000 Nodes
# (docs/benchmarks.md).
entry_points=(cluster::bench_node_change_to_programmed_peers cluster::bench_idle_with_500_nodes cluster::bench_5000_nodes cluster::bench_100000_nodes cluster::demo_agent_adds_a_node sites::bench_sites sites_nat::bench_sites_nat sites_hub::bench_hub_10000_sites hub::bench_hub_of_10000_sites relay::bench_relay_forwarding_vs_two_legs)

status=0
step() {
  echo "==> $*"
  "$@" || status=1
}

root=false
[[ $(id -u) -eq 0 ]] && root=true

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Runs a test command, its output also kept in $log for the skip check that follows.
logged() {
  echo "==> $*"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || status=1
}

# The lines of $log matching the regex $1, colours stripped.
log_lines() {
  sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E "$1"
}

# libtest's summaries in $log: fails the step when a test was ignored, or when other than
# $1 tests were filtered out (the entry points, left out with --skip).
check_libtest_skips() {
  local want=$1 results ignored filtered
  results=$(log_lines '^test result:')
  ignored=$(grep -oE '[0-9]+ ignored' <<<"$results" | awk '{n += $1} END {print n + 0}')
  filtered=$(grep -oE '[0-9]+ filtered out' <<<"$results" | awk '{n += $1} END {print n + 0}')
  if ((ignored != 0 || filtered != want)); then
    echo "==> FAILED: as root every test must run, but $ignored were ignored and $filtered" \
      "filtered out; expected 0 ignored and $want filtered out (the entry points)"
    status=1
  fi
}

# Without root the root-only tests did not run: under CI that is a failure.
fail_under_ci() {
  if [[ -n ${CI:-} ]]; then
    echo "==> FAILED: CI is set, and without root $1 did not run"
    status=1
  fi
}

# The agent's sites simulation (crates/agent/src/sites/simulation) as an unprivileged user with
# no capabilities: its test binary copied where nobody can run it, at least its seven scenarios
# passing.
simulation_unprivileged() {
  local bin dir out
  bin=$(cargo test --locked -p sticky-vxlan-agent --lib --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable"):
        print(m["executable"])' | tail -n 1)
  [[ -n $bin ]] || { echo "no test binary of sticky-vxlan-agent's library"; return 1; }
  dir=$(mktemp -d)
  cp "$bin" "$dir/agent-lib-tests" && chmod 755 "$dir" "$dir/agent-lib-tests"
  out=$(cd "$dir" && setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
    --bounding-set=-all env -i PATH=/usr/bin:/bin HOME=/tmp TMPDIR=/tmp \
    ./agent-lib-tests simulation_ 2>&1)
  local rc=$?
  rm -rf "$dir"
  echo "$out" | tail -n 3
  [[ $rc -eq 0 ]] && grep -qE 'test result: ok\. ([7-9]|[1-9][0-9]+) passed' <<<"$out"
}

if command -v shellcheck >/dev/null 2>&1; then
  step shellcheck -S warning scripts/*.sh .ci/run packaging/debian/* packaging/rpm/*.sh
fi
step cargo fmt --check
# --workspace: also the test support crate (crates/testkit), which no default member is.
step cargo clippy --workspace --all-targets --locked -- -D warnings
step cargo build --workspace --all-targets --locked
# The crate docs' examples (nextest does not run doc tests): cni-protocol's plugin example.
step cargo test --locked --doc
# The crash-safety tests drive a build with crash points, which release builds never have.
step cargo build --locked -p sticky-ipam --features crash-points --target-dir target/crash --bin sticky-ipam

if $root; then
  # sticky-vxlan's crash test needs the crash points compiled into the binary it drives; it
  # needs root (network namespaces), so it is ignored unless asked for.
  logged cargo test --locked -p sticky-vxlan --features crash-points --target-dir target/crash --test vxlan_crash \
    -- --include-ignored
  check_libtest_skips 0
  # sticky-wg's daemon tests with its test-only panic (crash-points): a panic ends the process
  # and a new daemon takes over the device. The benchmarks are scripts/bench-hub.sh's and
  # scripts/bench-relay.py's.
  logged cargo test --locked -p sticky-wg --features crash-points --target-dir target/crash --test daemon \
    -- --include-ignored --skip hub::bench_hub_of_10000_sites --skip relay::bench_relay_forwarding_vs_two_legs
  check_libtest_skips 2
  step scripts/test-packages.sh
  # The sites simulation needs no privilege (issue 33): run it as nobody with no capabilities.
  step simulation_unprivileged
else
  echo "==> skipping scripts/test-packages.sh: it installs and purges a .deb, which needs root"
  fail_under_ci "scripts/test-packages.sh"
fi

if command -v cargo-nextest >/dev/null 2>&1; then
  if $root; then
    filter=""
    for t in "${entry_points[@]}"; do
      filter+="${filter:+ | }test(=$t)"
    done
    logged cargo nextest run --locked --no-fail-fast --run-ignored all -E "not ($filter)"
    # nextest counts the tests the filter leaves out as skipped: exactly the entry points.
    summary=$(log_lines '^ *Summary ' | tail -n 1)
    skipped=$(grep -oE '[0-9]+ skipped' <<<"$summary" | awk '{print $1}')
    skipped=${skipped:-0}
    if [[ -z $summary ]]; then
      echo "==> FAILED: no nextest summary line to check the skipped tests against"
      status=1
    elif ((skipped != ${#entry_points[@]})); then
      echo "==> FAILED: as root every test must run, but $skipped were skipped where" \
        "${#entry_points[@]} were expected (only ${entry_points[*]}): $summary"
      status=1
    fi
  else
    echo "==> not root: the tests that need root are reported as SKIP (#[ignore = \"needs root: ...\"]);" \
      "run as root with --run-ignored all to run them"
    step cargo nextest run --locked --no-fail-fast --status-level skip
    fail_under_ci "the root-only tests"
  fi
else
  if $root; then
    skips=()
    for t in "${entry_points[@]}"; do
      skips+=(--skip "$t")
    done
    # Best effort, as with nextest: nothing ignored, only the entry points left out. Doc tests
    # are not run (nextest does not run them either), so an `ignore` block there is no skip.
    logged cargo test --locked --no-fail-fast --tests -- --include-ignored "${skips[@]}"
    check_libtest_skips "${#entry_points[@]}"
  else
    echo "==> not root: the tests that need root are reported as ignored, with their reason;" \
      "run as root with -- --include-ignored to run them"
    step cargo test --locked --no-fail-fast
    fail_under_ci "the root-only tests"
  fi
fi
exit $status
