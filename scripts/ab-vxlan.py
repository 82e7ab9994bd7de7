#!/usr/bin/env python3
"""A/B of two (or more) sticky-vxlan binaries: pod ADD and DEL, interleaved, medians.

For judging one change to sticky-vxlan on a shared, noisy machine: the binaries take turns
(A B, then B A, ...) on the same netns node that scripts/bench-vxlan.py sets up (underlay
192.0.2.1/24, the same config, every call run with `ip netns exec`), so load that comes and
goes falls on both alike. Prints each binary's median, first and third quartile.

    scripts/ab-vxlan.py [--runs 60] [--ipam target/release/sticky-ipam] [--busy 100]
                        [--burst 20] OLD NEW

--busy N keeps N pods attached on the node while measuring (a busy node: a veth per pod on
the bridge). --burst N measures instead the wall time of N ADDs started together (pods
starting at once after a node reboot), --runs bursts per binary. Needs root and only
python3; every namespace and temp file it makes is removed at the end, also on failure.
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


def quartiles(values):
    ms = sorted(v * 1000 for v in values)
    return f"median {statistics.median(ms):6.2f} ms (p25 {ms[len(ms) // 4]:6.2f}, p75 {ms[3 * len(ms) // 4]:6.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--ipam", default=os.path.join(CNI_DIR, "host-local"))
    parser.add_argument("--busy", type=int, default=0, help="pods kept on the node")
    parser.add_argument("--burst", type=int, default=0, help="ADDs started together")
    parser.add_argument("bins", nargs="+")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("ab-vxlan: needs root (it creates network namespaces)")
    bins = [os.path.abspath(b) for b in args.bins]
    tag = f"ab{os.getpid()}"
    node = f"{tag}-node"
    namespaces = []
    tmp = tempfile.mkdtemp(prefix="ab-vxlan-")

    def pod_ns(name):
        ns = f"{tag}-{name}"
        sh("ip", "netns", "add", ns)
        namespaces.append(ns)
        return ns

    def drop_ns(ns):
        sh("ip", "netns", "del", ns)
        namespaces.remove(ns)

    try:
        bindir = os.path.join(tmp, "bin")
        ipam_type = cni_bin_dir(bindir, args.ipam)
        make_node(node, namespaces)
        # scripts/bench-vxlan.py's config, with a /16 so that busy nodes and bursts fit.
        conf = json.dumps({
            "cniVersion": "1.0.0", "name": "bench-sticky", "type": "sticky-vxlan", "vni": 1,
            "isDefaultGateway": True, "stateDir": os.path.join(tmp, "state"),
            "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.0.0/16"]},
                      {"ip": "192.0.2.2", "subnets": ["10.245.0.0/16"]},
                      {"ip": "192.0.2.3", "subnets": ["10.246.0.0/16"]}],
            "ipam": {"type": ipam_type, "dataDir": os.path.join(tmp, "ipam"),
                     "ranges": [[{"subnet": "10.244.0.0/16"}]]},
        }).encode()

        def start(binary, command, ns):
            env = cni_env(command, ns, f"/run/netns/{ns}", bindir)
            proc = subprocess.Popen(["ip", "netns", "exec", node, binary], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            proc.stdin.write(conf)
            proc.stdin.close()
            return proc

        def finish(proc, what):
            out, err = proc.stdout.read(), proc.stderr.read()
            if proc.wait() != 0:
                raise RuntimeError(f"{what} failed: {out!r} {err!r}")

        for k in range(args.busy):
            finish(start(bins[0], "ADD", pod_ns(f"busy{k}")), "busy ADD")
        adds = {b: [] for b in bins}
        dels = {b: [] for b in bins}
        # One warm-up round (creates the VTEP and bridge), then the measured ones.
        for i in range(args.runs + 1):
            for b in bins if i % 2 == 0 else bins[::-1]:
                label = f"{bins.index(b)}x{i}"
                pods = [pod_ns(f"{label}p{j}") for j in range(max(args.burst, 1))]
                started = time.perf_counter()
                procs = [start(b, "ADD", ns) for ns in pods]
                for proc in procs:
                    finish(proc, f"ADD with {b}")
                added = time.perf_counter()
                for ns in pods:
                    finish(start(b, "DEL", ns), f"DEL with {b}")
                deleted = time.perf_counter()
                for ns in pods:
                    drop_ns(ns)
                if i > 0:
                    adds[b].append(added - started)
                    dels[b].append((deleted - added) / len(pods))
        what = f"{args.burst} ADDs together" if args.burst else "ADD"
        print(f"{args.runs} runs each, interleaved; IPAM {ipam_type}; {args.busy} pods kept on the node")
        for b in bins:
            line = f"{b}\n  {what:18} {quartiles(adds[b])}"
            if not args.burst:
                line += f"\n  {'DEL':18} {quartiles(dels[b])}"
            print(line)
    finally:
        clean_up(namespaces, tmp)


if __name__ == "__main__":
    main()
