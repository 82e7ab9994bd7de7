#!/usr/bin/env python3
"""Sites healing with the shipped settings (issues 29 and 36): how long pods are cut off after
each event an edge uplink meets, over several runs: the median and the spread.

Each event is a netns test of crates/agent/tests/agent/ (on crates/testkit/src/sites_support.rs)
that prints what it measured; this script runs it --runs times and reads the figure back:
- failover: `sites_failover::sites_failover_within_15s_with_the_api_away`: the API server
  stopped, site A's active gateway a1 loses its underlay link; the time until a2's pod answers
  pings to c2's and b2's pods again (through the standby a3);
- failover with a punched path, twice: `sites_failover::sites_failover_with_a_punched_path_within_6s_twice`:
  A and B punched, the API stopped, a1 cut (punched: b1 must leave its direct path to a1 by
  itself), then a1 back and a3 cut (relayed by then); each time until a2's pod answers c2's
  and b2's pods again;
- path death: `sites_nat::sites_nat_a_new_wan_address_heals_within_30s_with_the_shipped_settings`,
  A and B punched, the API away, router B's WAN address changed (every mapping gone): the time
  until a2 reaches b2 again (the punched path declared dead, back on the relay);
- renumbering: the same run, the time until b2 reaches c2 again (the cloud roams to B's new
  address at B's next packet).
Every namespace is removed by the tests' drop guards, also on failure. Needs root and
wireguard-tools (`wg`). The times are protocol-bound (probes every 1 s, dead after 3 missed,
rounds every 2 s, or every second and punch keepalives every second while punching), not crypto-bound, so the debug build is used unless
--release is given.

Each event's figures are printed beside issue 36's budget for it (6 s for a failover, 20 s for
the others) as a ratio, and drawn as bars (median, slowest, budget) into docs/bench-failover.svg.

    scripts/bench-failover.py [--runs 5] [--release] [--plot docs/bench-failover.svg]
                              [--events failover,failover-punched,failover-again,path-death,renumbering]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchplot import bars  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FAILOVER = "sites_failover::sites_failover_within_15s_with_the_api_away"
PUNCHED = "sites_failover::sites_failover_with_a_punched_path_within_6s_twice"
RENUMBER = "sites_nat::sites_nat_a_new_wan_address_heals_within_30s_with_the_shipped_settings"
DURATION = r"([0-9.]+)(ms|s|µs)"
# event -> (test, the line it prints, the group of the duration in it)
EVENTS = {
    "failover": (FAILOVER, re.compile(r"^failover: .* again " + DURATION + r" after a1's cut"), 1),
    "failover-punched": (PUNCHED, re.compile(r"^failover with a punched path: .* again "
                                             + DURATION + r" after a1's cut"), 1),
    "failover-again": (PUNCHED, re.compile(r"^failover again: .* again " + DURATION
                                           + r" after a3's cut"), 1),
    "path-death": (RENUMBER, re.compile(r"^new WAN address on B: b2 -> c2 after " + DURATION
                                        + r", a2 -> b2 after " + DURATION), 3),
    "renumbering": (RENUMBER, re.compile(r"^new WAN address on B: b2 -> c2 after " + DURATION), 1),
}

# event -> issue 36's budget: pods talk again within it, with the shipped settings
BUDGET = {"failover": 6.0, "failover-punched": 6.0, "failover-again": 6.0, "path-death": 20.0,
          "renumbering": 20.0}


def seconds(value, unit):
    return float(value) / {"s": 1, "ms": 1000, "µs": 1_000_000}[unit]


def run_test(test, profile):
    out = subprocess.run(
        ["cargo", "test", "--locked", *profile, "-p", "sticky-vxlan-agent", "--test", "agent",
         "--", "--ignored", "--nocapture", "--exact", test],
        cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-failover: {test} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return (out.stdout + out.stderr).splitlines()


def figure(event, lines):
    _, line, group = EVENTS[event]
    for text in lines:
        m = line.match(text)
        if m:
            return seconds(m.group(group), m.group(group + 1))
    sys.exit(f"bench-failover: the test printed no figure for {event}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--release", action="store_true")
    ap.add_argument("--events", default=",".join(EVENTS))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "bench-failover.svg"))
    args = ap.parse_args()
    events = [e for e in args.events.split(",") if e]
    for e in events:
        if e not in EVENTS:
            sys.exit(f"bench-failover: unknown event {e!r} (known: {', '.join(EVENTS)})")
    profile = ["--release"] if args.release else []
    build = ["cargo", "build", "--locked", *profile, "-p", "sticky-vxlan", "-p",
             "sticky-vxlan-agent", "-p", "sticky-wg"]
    subprocess.run(build, cwd=ROOT, check=True)
    figures = {e: [] for e in events}
    tests = sorted({EVENTS[e][0] for e in events})
    for i in range(args.runs):
        for test in tests:
            lines = run_test(test, profile)
            for e in events:
                if EVENTS[e][0] == test:
                    figures[e].append(figure(e, lines))
        print(f"run {i + 1}: " + ", ".join(f"{e} {figures[e][-1]:.2f} s" for e in events),
              flush=True)
    groups = []
    for e in events:
        runs = figures[e]
        median = statistics.median(runs)
        print(f"{e} over {len(runs)} runs: median {median:.2f} s "
              f"(min {min(runs):.2f}, max {max(runs):.2f}; runs "
              + ", ".join(f"{r:.2f}" for r in runs) + f"); budget {BUDGET[e]:.0f} s, "
              f"slowest / budget {max(runs) / BUDGET[e]:.2f}")
        groups.append((e, [("median", median), ("slowest", max(runs)),
                           ("budget (issue 36)", BUDGET[e])]))
    bars(args.plot, f"Sites healing, shipped settings ({args.runs} runs each)", groups,
         {"median": "#3465a4", "slowest": "#729fcf", "budget (issue 36)": "#cc0000"},
         ylabel="seconds until pods talk again")
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
