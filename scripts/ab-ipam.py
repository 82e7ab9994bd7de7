#!/usr/bin/env python3
"""A/B of two (or more) sticky-ipam binaries: VERSION, ADD and DEL, taking turns, medians.

For judging one change to sticky-ipam's per-call cost on a shared, noisy machine: every round
runs /bin/true (the exec floor), then each binary's VERSION (process start and exit alone),
ADD of a new pod and DEL of it, the binaries in turn, so load that comes and goes falls on all
alike. Each binary has its own empty data dir (0 records, the case where process start and
fsync are most of a call) in a temp dir on the same filesystem as `--workdir`. Prints each
binary's medians with first and third quartiles.

    scripts/ab-ipam.py [--rounds 200] [--workdir target/bench] [--version-only] OLD NEW

--version-only times VERSION alone, so the binaries may be any CNI plugins (sticky-vxlan's
exec cost, say: its size is what the loader maps at every call).

Needs only python3; no root. The temp dirs are removed at the end, also on failure.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(argv, env, stdin):
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True)
    elapsed = (time.perf_counter() - start) * 1000.0
    if done.returncode != 0:
        raise SystemExit("%s %s failed: %s" % (argv[0], env.get("CNI_COMMAND"),
                                               done.stdout.decode() + done.stderr.decode()))
    return elapsed


def cni_env(command, n):
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "ab%06d" % n,
        "CNI_NETNS": "/var/run/netns/ab%06d" % n,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "CNI_ARGS": "K8S_POD_NAMESPACE=ab;K8S_POD_NAME=pod-%d" % n,
    }


def quartiles(ms):
    ms = sorted(ms)
    return "%6.3f ms (p25 %6.3f, p75 %6.3f)" % (statistics.median(ms), ms[len(ms) // 4],
                                                 ms[3 * len(ms) // 4])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--workdir", default=os.path.join(ROOT, "target", "bench"))
    parser.add_argument("--version-only", action="store_true",
                        help="time VERSION only (any CNI plugin binary)")
    parser.add_argument("binaries", nargs="+")
    opts = parser.parse_args()
    binaries = [os.path.abspath(b) for b in opts.binaries]
    os.makedirs(opts.workdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ab-ipam-", dir=opts.workdir)
    try:
        confs = []
        for i, _ in enumerate(binaries):
            confs.append(json.dumps({
                "cniVersion": "1.0.0", "name": "ab", "type": "bridge",
                "ipam": {"type": "sticky-ipam", "dataDir": os.path.join(work, str(i)),
                         "ranges": [[{"subnet": "10.128.0.0/16"}]]},
            }).encode())
        version = (b'{"cniVersion":"1.0.0"}', {"CNI_COMMAND": "VERSION"})
        commands = () if opts.version_only else ("ADD", "DEL")
        times = {(b, op): [] for b in range(len(binaries)) for op in ("VERSION",) + commands}
        floor = []
        # One ADD and DEL each first: creates the data dir and its index, not timed.
        for b, binary in enumerate(binaries):
            for command in commands:
                timed([binary], cni_env(command, 999999), confs[b])
        for n in range(opts.rounds):
            floor.append(timed(["/bin/true"], {}, b""))
            order = range(len(binaries)) if n % 2 == 0 else reversed(range(len(binaries)))
            for b in order:
                times[(b, "VERSION")].append(timed([binaries[b]], version[1], version[0]))
                for command in commands:
                    times[(b, command)].append(timed([binaries[b]], cni_env(command, n), confs[b]))
        print("/bin/true   %s" % quartiles(floor))
        for b, binary in enumerate(binaries):
            print("%s (%d bytes)" % (binary, os.path.getsize(binary)))
            for op in ("VERSION",) + commands:
                print("  %-8s %s" % (op, quartiles(times[(b, op)])))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
