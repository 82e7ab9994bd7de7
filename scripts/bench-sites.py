#!/usr/bin/env python3
"""Sites (issue 28): cross-site pod-to-pod TCP throughput and round trips, beside the same
WireGuard tunnel node to node and beside VXLAN inside a site, in one run.

The figures come from the sites tests' own topology (crates/testkit/src/sites_support.rs: a
cloud site and two edge sites behind masquerading routers, an "internet" between them, an agent
on every node and sticky-wg on every gateway), measured by the ignored test
`sites::bench_sites` (crates/agent/tests/agent/sites.rs) so that no namespace setup is written
twice. Four paths:

  tunnel c1 -> a1        the cloud gateway to the site-A gateway, bridge address to bridge
                         address: the raw tunnel, no VXLAN leg
  pods c2 -> a2          cross-site, direct: VXLAN c2 -> c1, tunnel c1 -> a1, VXLAN a1 -> a2
  pods a2 -> a1 (VXLAN)  inside site A, no tunnel

With --nat (issue 29), `sites_nat::bench_sites_nat` (crates/agent/tests/agent/sites_nat.rs)
instead: A and B are both behind NAT; a2 pod -> b2 pod first relayed (a1 -> c1 -> b1, the
direct path blocked on the internet), then direct once a1 and b1 have punched a tunnel, in one
run; printed side by side with the ratios direct / relayed, drawn as docs/bench-sites-nat.svg
and docs/bench-sites-nat-rtt.svg.

Throughput is iperf3 (one TCP stream, --seconds each), round trip the average of 500 pings at
100/s; --rounds rounds interleave the paths (a busy moment of the machine falls on all of them)
and each figure is the median of its rounds, the rounds' range printed beside it. Prints each
path's figures and their ratios (cross-site / raw tunnel: issue 28's target
is >= 0.8; with --nat, direct / relayed), and draws docs/bench-sites.svg (throughput) and
docs/bench-sites-rtt.svg (round trips). Needs root, cargo, iperf3 and wireguard-tools (`wg`);
builds the binaries with --release first (the userspace tunnel's crypto is far slower in a debug
build). Every namespace and temp file is removed by the test's drop guards, also on failure.

    scripts/bench-sites.py [--seconds 10] [--rounds 3] [--debug] [--nat] [--plot docs/bench-sites.svg]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchplot import bars  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGES = ["sticky-vxlan", "sticky-vxlan-agent", "sticky-wg"]
COLOURS = {
    "tunnel c1 -> a1": "#4c72b0",
    "pods c2 -> a2": "#55a868",
    "pods a2 -> b2 relayed": "#c44e52",
    "pods a2 -> b2 direct": "#55a868",
    "pods a2 -> a1 (VXLAN)": "#8172b2",
}


def run_bench(seconds, rounds, release, test="sites::bench_sites", tag="BENCH-SITES "):
    profile = ["--release"] if release else []
    build = ["cargo", "build", "--locked", *profile]
    for p in PACKAGES:
        build += ["-p", p]
    subprocess.run(build, cwd=ROOT, check=True)
    out = subprocess.run(
        ["cargo", "test", "--locked", *profile, "-p", "sticky-vxlan-agent", "--test", "agent", "--",
         "--ignored", "--nocapture", "--exact", test],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "STICKY_BENCH_SECS": str(seconds), "STICKY_BENCH_ROUNDS": str(rounds)})
    for line in out.stdout.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    sys.exit(f"bench-sites: the bench printed no figures:\n{out.stdout}\n{out.stderr}")


def plot(path, cases, title, rtt_title):
    """Throughput bars into `path`, round trips into `path` with -rtt before .svg."""
    order = list(cases)
    bars(path, f"sites: {title}",
         [(name, [(name, cases[name]["mbps"])]) for name in order], COLOURS,
         ylabel="Mbit/s (iperf3, one stream)")
    rtt_plot = path[:-len(".svg")] + "-rtt.svg" if path.endswith(".svg") else path + "-rtt.svg"
    bars(rtt_plot, f"sites: {rtt_title}",
         [(name, [(name, cases[name]["rtt_ms"])]) for name in order], COLOURS,
         ylabel="average round trip, ms")
    print(f"plots: {path}, {rtt_plot}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="iperf3 seconds per path")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--debug", action="store_true",
                        help="debug build (quicker to build; the tunnel's figures mean little)")
    parser.add_argument("--nat", action="store_true",
                        help="A <-> B relayed and then direct (punched), side by side")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-sites: needs root (it creates network namespaces)")
    if args.nat:
        return nat(args)
    args.plot = args.plot or os.path.join(ROOT, "docs", "bench-sites.svg")
    figures = run_bench(args.seconds, args.rounds, not args.debug)
    cases = {c["case"]: c for c in figures["cases"]}
    raw = cases["tunnel c1 -> a1"]
    direct = cases["pods c2 -> a2"]
    build = "debug" if args.debug else "release"
    print(f"{build} build, iperf3 {figures['seconds']} s per path, 500 pings at 100/s, "
          f"medians of {figures['rounds']} interleaved rounds (range in brackets)")
    print(f"{'path':24} {'Mbit/s':>9} {'':15} {'x tunnel':>8} {'rtt ms':>7} {'':15} {'x tunnel':>8}")
    for name, c in cases.items():
        mbps_range = f"[{min(c['mbps_runs']):.0f}-{max(c['mbps_runs']):.0f}]"
        rtt_range = f"[{min(c['rtt_ms_runs']):.3f}-{max(c['rtt_ms_runs']):.3f}]"
        print(f"{name:24} {c['mbps']:9.0f} {mbps_range:15} {c['mbps'] / raw['mbps']:8.2f} "
              f"{c['rtt_ms']:7.3f} {rtt_range:15} {c['rtt_ms'] / raw['rtt_ms']:8.2f}")
    ratio = direct["mbps"] / raw["mbps"]
    verdict = "meets" if ratio >= 0.8 else "MISSES"
    print(f"cross-site pods / raw tunnel throughput: {ratio:.2f} ({verdict} issue 28's >= 0.8)")
    plot(args.plot, cases, f"TCP throughput per path ({build})",
         f"ping round trip per path ({build})")


def nat(args):
    """--nat: A <-> B relayed, then direct once punched (one run)."""
    figures = run_bench(args.seconds, args.rounds, not args.debug, "sites_nat::bench_sites_nat",
                        "BENCH-SITES-NAT ")
    cases = {c["case"]: c for c in figures["cases"]}
    relayed = cases["pods a2 -> b2 relayed"]
    direct = cases["pods a2 -> b2 direct"]
    build = "debug" if args.debug else "release"
    print(f"{build} build, iperf3 {figures['seconds']} s per path, 500 pings at 100/s")
    print(f"{'a2 pod -> b2 pod':18} {'relayed':>10} {'direct':>10} {'direct/relayed':>15}")
    print(f"{'Mbit/s':18} {relayed['mbps']:10.0f} {direct['mbps']:10.0f} "
          f"{direct['mbps'] / relayed['mbps']:15.2f}")
    print(f"{'round trip ms':18} {relayed['rtt_ms']:10.3f} {direct['rtt_ms']:10.3f} "
          f"{direct['rtt_ms'] / relayed['rtt_ms']:15.2f}")
    # The relay gateway's sticky-wg while iperf3 ran: its share of a core, and that share per
    # Gbit/s it carried (relayed only: on the direct path it carries nothing of A <-> B).
    cpu = relayed["relay_cpu_percent"]
    print(f"{'relay CPU % core':18} {cpu:10.1f} {direct['relay_cpu_percent']:10.1f}")
    print(f"the relay's sticky-wg: {cpu / (relayed['mbps'] / 1000):.0f} % of a core per Gbit/s relayed")
    plot(args.plot or os.path.join(ROOT, "docs", "bench-sites-nat.svg"), cases,
         f"A <-> B TCP throughput, relayed vs punched ({build})",
         f"A <-> B ping round trip, relayed vs punched ({build})")


if __name__ == "__main__":
    main()
