#!/usr/bin/env python3
"""Pod ADD and DEL latency: sticky-vxlan vs Debian's bridge + host-local, with the kernel's floor.

Both run side by side, interleaved (the order of the plugins and the floor turns every round),
on the same netns "node" (a namespace with an underlay address on 192.0.2.0/24), each call
executed inside it with `ip netns exec`, as a runtime on that node would. In the same rounds, a bare `ip link del` of a veth pair whose peer sits in a
pod namespace (run the same way, with `ip netns exec`) measures what the kernel alone takes to
tear a pod's veth down: DEL's floor. Prints medians, ratios and issue 10's targets (ADD <= 0.5x
bridge + host-local; DEL <= the floor + 2 ms) and draws docs/bench-vxlan.svg. Needs root and
only python3.

    scripts/bench-vxlan.py [--runs 50] [--bin target/release/sticky-vxlan]
                           [--ipam target/release/sticky-ipam] [--segment] [--ipv6-underlay]
                           [--plot docs/bench-vxlan.svg]

With --segment, a third kind runs interleaved with the two: a sticky-vxlan segment interface
("mode": "segment", same IPAM plugin over its own subnet), the extra interface of a pod. With
--ipv6-underlay, sticky-vxlan also runs on a second node whose underlay is IPv6 only
(2001:db8::1/64, peers 2001:db8::1 to ::3), interleaved with the others: its ADD and DEL beside
the IPv4 underlay's.

Every namespace and temp file it makes is removed at the end, also on failure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchnode import CNI_DIR, clean_up, cni_bin_dir, cni_env, make_node, sh  # noqa: E402


def cni(node, binary, command, cid, netns, conf, cni_path):
    out = subprocess.run(
        ["ip", "netns", "exec", node, binary],
        input=json.dumps(conf).encode(),
        env=cni_env(command, cid, netns, cni_path),
        capture_output=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{command} with {binary} failed: {out.stdout!r} {out.stderr!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    here = os.path.dirname(os.path.abspath(__file__))
    default_bin = os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "target")), "release", "sticky-vxlan"
    )
    parser.add_argument("--bin", default=default_bin)
    parser.add_argument(
        "--ipam",
        default=os.path.join(CNI_DIR, "host-local"),
        help="IPAM plugin for sticky-vxlan (e.g. target/release/sticky-ipam); bridge always uses host-local",
    )
    parser.add_argument("--plot", default=os.path.join(here, "..", "docs", "bench-vxlan.svg"),
                        help="SVG file to draw ('' for none)")
    parser.add_argument("--segment", action="store_true", help="also time a segment-mode interface")
    parser.add_argument("--ipv6-underlay", action="store_true",
                        help="also time sticky-vxlan on a node with an IPv6-only underlay")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-vxlan: needs root (it creates network namespaces)")
    sticky = os.path.abspath(args.bin)
    if not os.path.exists(sticky):
        sys.exit(f"bench-vxlan: {sticky} not found: scripts/build-release.sh first, or pass --bin")

    tag = f"bench{os.getpid()}"
    node = f"{tag}-node"
    namespaces = []
    tmp = tempfile.mkdtemp(prefix="bench-vxlan-")
    try:
        bindir = os.path.join(tmp, "bin")
        ipam_type = cni_bin_dir(bindir, args.ipam, plugins=("bridge", "host-local"))
        os.symlink(sticky, os.path.join(bindir, "sticky-vxlan"))
        make_node(node, namespaces)

        confs = {
            "sticky-vxlan": {
                "cniVersion": "1.0.0",
                "name": "bench-sticky",
                "type": "sticky-vxlan",
                "vni": 1,
                "isDefaultGateway": True,
                "stateDir": os.path.join(tmp, "state"),
                "peers": [
                    {"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                    {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]},
                    {"ip": "192.0.2.3", "subnets": ["10.244.3.0/24"]},
                ],
                "ipam": {
                    "type": ipam_type,
                    "dataDir": os.path.join(tmp, "ipam"),
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                },
            },
            "bridge": {
                "cniVersion": "1.0.0",
                "name": "bench-bridge",
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": os.path.join(tmp, "ipam"),
                    "ranges": [[{"subnet": "10.245.1.0/24"}]],
                },
            },
        }
        binaries = {"sticky-vxlan": sticky, "bridge": os.path.join(CNI_DIR, "bridge")}
        nodes = {}  # a kind's node when it is not the shared one
        if args.ipv6_underlay:
            node6 = f"{tag}-node6"
            make_node(node6, namespaces, underlay="2001:db8::1/64")
            conf6 = json.loads(json.dumps(confs["sticky-vxlan"]))
            conf6["name"] = "bench-sticky6"
            conf6["stateDir"] = os.path.join(tmp, "state6")
            conf6["ipam"]["dataDir"] = os.path.join(tmp, "ipam6")
            for i, p in enumerate(conf6["peers"], start=1):
                p["ip"] = f"2001:db8::{i}"
            confs["ipv6 underlay"] = conf6
            binaries["ipv6 underlay"] = sticky
            nodes["ipv6 underlay"] = node6
        if args.segment:
            confs["segment"] = {
                "cniVersion": "1.0.0",
                "name": "bench-segment",
                "type": "sticky-vxlan",
                "mode": "segment",
                "vni": 101,
                "stateDir": os.path.join(tmp, "state"),
                "peers": confs["sticky-vxlan"]["peers"],
                "ipam": {
                    "type": ipam_type,
                    "dataDir": os.path.join(tmp, "ipam"),
                    "ranges": [[{"subnet": "192.168.10.0/24"}]],
                },
            }
            binaries["segment"] = sticky
        times = {k: [] for k in confs}
        adds = {k: [] for k in confs}
        dels = {k: [] for k in confs}
        floor = []
        def pod_round(kind, i):
            pod = f"{tag}-{kind[:3]}{i}"
            sh("ip", "netns", "add", pod)
            namespaces.append(pod)
            cid = f"{tag}{kind[:3]}{i}"
            netns = f"/run/netns/{pod}"
            start = time.perf_counter()
            cni(nodes.get(kind, node), binaries[kind], "ADD", cid, netns, confs[kind], bindir)
            added = time.perf_counter()
            cni(nodes.get(kind, node), binaries[kind], "DEL", cid, netns, confs[kind], bindir)
            elapsed = time.perf_counter() - start
            sh("ip", "netns", "del", pod)
            namespaces.remove(pod)
            if i > 0:
                times[kind].append(elapsed)
                adds[kind].append(added - start)
                dels[kind].append(elapsed - (added - start))

        def floor_round(i):
            # The kernel's floor for DEL: a pod-like veth pair, deleted with nothing else.
            pod = f"{tag}-fl{i}"
            sh("ip", "netns", "add", pod)
            namespaces.append(pod)
            sh("ip", "-n", node, "link", "add", "flveth", "type", "veth", "peer", "name", "eth0",
               "netns", pod)
            sh("ip", "-n", node, "link", "set", "flveth", "up")
            start = time.perf_counter()
            sh("ip", "netns", "exec", node, "ip", "link", "del", "flveth")
            elapsed = time.perf_counter() - start
            sh("ip", "netns", "del", pod)
            namespaces.remove(pod)
            if i > 0:
                floor.append(elapsed)

        # One warm-up round (creates the shared bridge/VTEP), then the measured ones. The order
        # of the kinds and the floor turns each round, so that each follows each other alike:
        # a call right after a veth teardown and a namespace removal finds the kernel still
        # finishing them (RCU grace periods, the namespace's clean-up), which costs an fsync
        # (sticky-ipam's) three times its usual time; a fixed order put that on one plugin.
        steps = [lambda i, k=kind: pod_round(k, i) for kind in confs] + [floor_round]
        for i in range(args.runs + 1):
            turn = i % len(steps)
            for step in steps[turn:] + steps[:turn]:
                step(i)

        def ms(values):
            return statistics.median(values) * 1000

        print(f"runs: {args.runs} ADD+DEL each, interleaved, same netns node")
        labels = [("sticky-vxlan", f"sticky-vxlan + {ipam_type}"), ("bridge", "bridge + host-local")]
        if args.segment:
            labels.append(("segment", f"segment + {ipam_type}"))
        if args.ipv6_underlay:
            labels.append(("ipv6 underlay", "same, IPv6 underlay"))
        for kind, label in labels:
            print(
                f"{label:26} median ADD+DEL {ms(times[kind]):6.1f} ms"
                f"  (ADD {ms(adds[kind]):5.1f} ms, DEL {ms(dels[kind]):5.1f} ms)"
            )
        print(f"{'ip link del (kernel floor)':26} DEL {ms(floor):5.1f} ms")
        print(f"ratio sticky/bridge:       ADD+DEL {ms(times['sticky-vxlan']) / ms(times['bridge']):.2f}"
              f", ADD {ms(adds['sticky-vxlan']) / ms(adds['bridge']):.2f}"
              f", DEL {ms(dels['sticky-vxlan']) / ms(dels['bridge']):.2f}")
        print()
        for ok, label, value, limit in (
            (ms(adds["sticky-vxlan"]) <= 0.5 * ms(adds["bridge"]), "ADD <= 0.5x bridge + host-local",
             ms(adds["sticky-vxlan"]), 0.5 * ms(adds["bridge"])),
            (ms(dels["sticky-vxlan"]) <= ms(floor) + 2, "DEL <= kernel floor + 2 ms",
             ms(dels["sticky-vxlan"]), ms(floor) + 2),
        ):
            print(f"{'PASS' if ok else 'MISS'} {label}: {value:.2f} ms <= {limit:.2f} ms")
        if args.plot:
            import benchplot
            sticky_label = f"sticky-vxlan + {ipam_type}"
            add_bars = [(sticky_label, ms(adds["sticky-vxlan"])),
                        ("bridge + host-local", ms(adds["bridge"]))]
            del_bars = [(sticky_label, ms(dels["sticky-vxlan"])),
                        ("bridge + host-local", ms(dels["bridge"])),
                        ("ip link del (kernel floor)", ms(floor))]
            if args.ipv6_underlay:
                add_bars.insert(1, ("same, IPv6 underlay", ms(adds["ipv6 underlay"])))
                del_bars.insert(1, ("same, IPv6 underlay", ms(dels["ipv6 underlay"])))
            benchplot.bars(
                args.plot,
                f"pod ADD and DEL, median of {args.runs} (netns node)",
                [("ADD", add_bars), ("DEL", del_bars)],
                {sticky_label: "#1f77b4", "same, IPv6 underlay": "#17becf",
                 "bridge + host-local": "#d62728", "ip link del (kernel floor)": "#888"})
            print(f"plot: {os.path.abspath(args.plot)}")
    finally:
        clean_up(namespaces, tmp)


if __name__ == "__main__":
    main()
