#!/usr/bin/env python3
"""The forwarding relay (issue 34) against the two-leg relay it replaces, in one run.

Three network namespaces, each with sticky-wg configured only with `wg` and `ip`
(crates/wg/tests/daemon/relay.rs): gateways A and B cannot reach each other, relay R can reach
both and does not route. First A and B hold a WireGuard session with each other through R's
forwarding (R holds no key that decrypts it); then, in the same run, the relay as it was before
issue 34: A and B each have a session with R only, and R decrypts each packet and encrypts it
again for the other leg. Measured by the ignored test `relay::bench_relay_forwarding_vs_two_legs`
so that no namespace setup is written twice.

Throughput is iperf3 A -> B (one TCP stream, --seconds), round trip the average of 500 pings at
100/s, and R's sticky-wg CPU while iperf3 ran (its share of a core, and that share per Gbit/s
relayed). Prints the two side by side with the ratios forwarding / two-leg and draws
docs/bench-relay.svg (throughput) and docs/bench-relay-rtt.svg (round trips). Needs root,
cargo, iperf3 and wireguard-tools (`wg`); builds --release first (the userspace tunnel's crypto
is far slower in a debug build). Every namespace and temp file is removed by the test's drop
guards, also on failure.

    scripts/bench-relay.py [--seconds 10] [--debug] [--plot docs/bench-relay.svg]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchplot import bars  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COLOURS = {"two-leg relay": "#c44e52", "forwarding relay": "#55a868"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="iperf3 seconds per relay")
    parser.add_argument("--debug", action="store_true",
                        help="debug build (quicker to build; the tunnel's figures mean little)")
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "bench-relay.svg"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-relay: needs root (it creates network namespaces)")
    profile = [] if args.debug else ["--release"]
    out = subprocess.run(
        ["cargo", "test", "--locked", *profile, "-p", "sticky-wg", "--test", "daemon", "--",
         "--ignored", "--nocapture", "--exact", "relay::bench_relay_forwarding_vs_two_legs"],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "STICKY_BENCH_SECS": str(args.seconds)})
    figures = next((json.loads(line[len("BENCH-RELAY "):]) for line in out.stdout.splitlines()
                    if line.startswith("BENCH-RELAY ")), None)
    if figures is None:
        sys.exit(f"bench-relay: the bench printed no figures:\n{out.stdout}\n{out.stderr}")
    cases = {c["case"]: c for c in figures["cases"]}
    before, after = cases["two-leg relay"], cases["forwarding relay"]
    build = "debug" if args.debug else "release"
    print(f"{build} build, iperf3 {figures['seconds']} s per relay, 500 pings at 100/s, one run")
    print(f"{'A -> B through R':22} {'two-leg':>10} {'forwarding':>11} {'forwarding/two-leg':>19}")
    print(f"{'Mbit/s':22} {before['mbps']:10.0f} {after['mbps']:11.0f} "
          f"{after['mbps'] / before['mbps']:19.2f}")
    print(f"{'round trip ms':22} {before['rtt_ms']:10.3f} {after['rtt_ms']:11.3f} "
          f"{after['rtt_ms'] / before['rtt_ms']:19.2f}")
    per_gbit = {name: c["relay_cpu_percent"] / (c["mbps"] / 1000) for name, c in cases.items()}
    print(f"{'R CPU % of a core':22} {before['relay_cpu_percent']:10.1f} "
          f"{after['relay_cpu_percent']:11.1f} "
          f"{after['relay_cpu_percent'] / before['relay_cpu_percent']:19.2f}")
    print(f"{'R CPU % per Gbit/s':22} {per_gbit['two-leg relay']:10.0f} "
          f"{per_gbit['forwarding relay']:11.0f} "
          f"{per_gbit['forwarding relay'] / per_gbit['two-leg relay']:19.2f}")
    order = ["two-leg relay", "forwarding relay"]
    bars(args.plot, f"relay A -> B: TCP throughput ({build})",
         [(n, [(n, cases[n]["mbps"])]) for n in order], COLOURS,
         ylabel="Mbit/s (iperf3, one stream)")
    rtt_plot = args.plot[:-len(".svg")] + "-rtt.svg"
    bars(rtt_plot, f"relay A -> B: ping round trip ({build})",
         [(n, [(n, cases[n]["rtt_ms"])]) for n in order], COLOURS,
         ylabel="average round trip, ms")
    print(f"plots: {args.plot}, {rtt_plot}")


if __name__ == "__main__":
    main()
