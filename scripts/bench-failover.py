#!/usr/bin/env python3
"""Sites failover (issue 29): how long pods of site A are cut off from the cloud and from site B
when A's active gateway loses its link with the API away, over several runs, and the median.

Each run is the netns test `sites_failover::sites_failover_within_15s_with_the_api_away`
(crates/agent/tests/agent/sites_failover.rs, on crates/testkit/src/sites_support.rs with a3 as
site A's standby): the API server stopped, a1's underlay link cut, the time until a2's pod
answers pings to c2's and b2's pods again (the test prints it). Every namespace is
removed by the test's drop guards, also on failure. Needs root and wireguard-tools (`wg`).
The time is protocol-bound (probes every 1 s, dead after 3 missed, the 2 s round), not
crypto-bound, so the debug build is used unless --release is given.

    scripts/bench-failover.py [--runs 5] [--release]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEST = "sites_failover::sites_failover_within_15s_with_the_api_away"
LINE = re.compile(r"^failover: .* again ([0-9.]+)(m?s) after a1's cut")


def one_run(profile):
    out = subprocess.run(
        ["cargo", "test", "--locked", *profile, "-p", "sticky-vxlan-agent", "--test", "agent",
         "--", "--ignored", "--nocapture", "--exact", TEST],
        cwd=ROOT, capture_output=True, text=True)
    for line in (out.stdout + out.stderr).splitlines():
        m = LINE.match(line)
        if m:
            value = float(m.group(1))
            return value / 1000 if m.group(2) == "ms" else value
    sys.exit(f"bench-failover: the test printed no failover time:\n{out.stdout}\n{out.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--release", action="store_true")
    args = ap.parse_args()
    profile = ["--release"] if args.release else []
    build = ["cargo", "build", "--locked", *profile, "-p", "sticky-vxlan", "-p",
             "sticky-vxlan-agent", "-p", "sticky-wg"]
    subprocess.run(build, cwd=ROOT, check=True)
    runs = []
    for i in range(args.runs):
        t = one_run(profile)
        runs.append(t)
        print(f"run {i + 1}: failover {t:.2f} s", flush=True)
    print(f"failover over {len(runs)} runs: median {statistics.median(runs):.2f} s "
          f"(min {min(runs):.2f}, max {max(runs):.2f})")


if __name__ == "__main__":
    main()
