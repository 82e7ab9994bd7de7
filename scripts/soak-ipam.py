#!/usr/bin/env python3
"""Soak test for sticky-ipam: many mixed ADD/DEL/GC calls from parallel workers over pods that
keep restarting, with the data dir checked under the plugin's own lock.

Model (python3 stdlib only; the plugin binary is run exactly as a runtime runs it):

- One network (cniVersion 1.1.0, so GC is allowed) with one IPv4 range a quarter larger than
  the number of pods, so the range never runs out and no lease is ever reclaimed: every pod
  must keep the first address it got, for the whole run.
- Each pod has a fixed namespace, name and UID for its whole life (UID policy: kubelet
  recreating a pod's sandbox keeps K8S_POD_UID; only the container id changes). Every ADD uses
  a new 64-hex container id, as containerd does. One worker at a time acts on a pod (a per-pod
  lock), as kubelet serializes a pod's sandbox operations; workers act on different pods in
  parallel.
- Operations on a pod:
    start          ADD a new container (pod not running)
    restart        DEL the old container, then ADD a new one
    crash-restart  ADD a new container without DEL of the old one (the new sandbox takes the
                   lease over: same UID), then the late DEL of the old container, with the old
                   result as prevResult; it must release nothing
    stop           DEL; the lease stays as a released lease for the pod
    vanish         the container disappears without any DEL (a missed DEL); a later GC or the
                   pod's next ADD must recover the address
  and GC with cni.dev/valid-attachments = every running container. As libcni does, GC never
  runs concurrently with ADD/DEL of the network (the workers hold a shared lock around ADD
  and DEL, GC an exclusive one), so its list cannot miss an ADD that completes before it.
- Every ADD must return the pod's first address. Every call must succeed.
- Periodically, while workers run, the checker takes the plugin's flock on
  <dataDir>/<net>/lock (fcntl.flock, the same flock(2) the plugin takes) and reads every file:
  no temp file, every record parses, no address recorded twice, no pod with two records, no
  container attached twice, every record's address is its pod's address.
- Less often, and at the end, the workers are paused (no call in flight) and the data dir must
  match the model exactly: every running pod has exactly one record, attached to its current
  container, on its address; a pod that is not running has its released lease (or an attached
  one whose container vanished and no GC has run since); nothing else. At the end a GC with the
  running containers runs first, so nothing may remain attached outside them (nothing leaks).

Prints a summary with ops/s; the last line is `N passed, M failed` (N invariant checks passed,
M violations). Exits non-zero on any violation.
"""

import argparse
import fcntl
import ipaddress
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

NET = "soak"
FORMAT = "sticky-ipam/v1"


class Violation(Exception):
    pass


class Pod:
    def __init__(self, idx):
        self.idx = idx
        self.ns = "soak-ns%d" % (idx % 5)
        self.name = "web-%d" % idx
        self.uid = "uid-%08d" % idx
        self.lock = threading.Lock()
        self.cid = None  # current container id while running
        self.result = None  # its ADD result (libcni's cache, sent as prevResult on DEL)
        self.ip = None  # the first address the pod got: it must keep it forever

    def args(self, cid):
        return (
            "K8S_POD_UID=%s;IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;"
            "K8S_POD_INFRA_CONTAINER_ID=%s" % (self.uid, self.ns, self.name, cid)
        )


class Gate:
    """Workers hold it around each call; the checker closes it to see a quiet data dir."""

    def __init__(self):
        self.cond = threading.Condition()
        self.active = 0
        self.paused = False

    def enter(self):
        with self.cond:
            while self.paused:
                self.cond.wait()
            self.active += 1

    def exit(self):
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def pause(self):
        with self.cond:
            self.paused = True
            while self.active:
                self.cond.wait()

    def resume(self):
        with self.cond:
            self.paused = False
            self.cond.notify_all()


class RWLock:
    """Many holders in shared mode, or one in exclusive mode (writer preferred)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting_writers = 0

    def acquire_shared(self):
        with self.cond:
            while self.writer or self.waiting_writers:
                self.cond.wait()
            self.readers += 1

    def release_shared(self):
        with self.cond:
            self.readers -= 1
            self.cond.notify_all()

    def acquire_exclusive(self):
        with self.cond:
            self.waiting_writers += 1
            while self.writer or self.readers:
                self.cond.wait()
            self.waiting_writers -= 1
            self.writer = True

    def release_exclusive(self):
        with self.cond:
            self.writer = False
            self.cond.notify_all()


class Soak:
    def __init__(self, opts, data_dir):
        self.opts = opts
        self.binary = opts.binary
        self.data_dir = data_dir
        self.net_dir = os.path.join(data_dir, NET)
        self.rng_lock = threading.Lock()
        self.rng = random.Random(opts.seed)
        self.pods = [Pod(i) for i in range(opts.pods)]
        first = ipaddress.ip_address("10.200.0.10")
        size = opts.pods + max(4, opts.pods // 4)
        self.range_start, self.range_end = first, first + (size - 1)
        self.base_conf = {
            "cniVersion": "1.1.0",
            "name": NET,
            "type": "bridge",
            "ipam": {
                "type": "sticky-ipam",
                "dataDir": data_dir,
                "ranges": [
                    [
                        {
                            "subnet": "10.200.0.0/16",
                            "rangeStart": str(self.range_start),
                            "rangeEnd": str(self.range_end),
                        }
                    ]
                ],
            },
        }
        self.state = threading.Lock()  # guards everything below
        self.live = {}  # cid -> pod, running containers
        self.inflight = set()  # cids whose ADD is running
        self.vanished = set()  # cids gone without DEL, possibly still attached
        self.ip_owner = {}  # ip -> pod idx, first assignment
        self.budget = opts.ops
        self.counts = {k: 0 for k in ("ADD", "DEL", "GC")}
        self.kinds = {}
        self.durations = []
        self.violations = []
        self.passed = 0
        self.gate = Gate()
        # libcni never runs GC concurrently with ADD/DEL of the same network: ADD and DEL
        # hold this shared, GC exclusive (its valid list cannot miss an ADD that finishes
        # before it). The plugin processes still overlap with the checker's flock.
        self.runtime = RWLock()
        self.stop = threading.Event()

    # ---- running the plugin ----------------------------------------------------------------

    def take_budget(self, n):
        with self.state:
            if self.budget < n:
                return False
            self.budget -= n
            return True

    def run(self, command, conf, cid=None, pod=None, netns="/var/run/netns/x", ifname="eth0"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env["CNI_COMMAND"] = command
        env["CNI_PATH"] = "/opt/cni/bin"
        if cid is not None:
            env["CNI_CONTAINERID"] = cid
            env["CNI_IFNAME"] = ifname
            env["CNI_NETNS"] = netns
        if pod is not None:
            env["CNI_ARGS"] = pod.args(cid)
        started = time.monotonic()
        try:
            out = subprocess.run(
                [self.binary],
                input=json.dumps(conf).encode(),
                env=env,
                capture_output=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            raise Violation("%s %s: no answer in 300 s" % (command, cid))
        elapsed = time.monotonic() - started
        with self.state:
            self.counts[command] += 1
            self.durations.append(elapsed)
        text = out.stdout.decode(errors="replace").strip()
        if out.returncode != 0:
            raise Violation(
                "%s %s (%s): exit %d, stdout %s, stderr %s"
                % (
                    command,
                    cid,
                    pod.name if pod else "-",
                    out.returncode,
                    text,
                    out.stderr.decode(errors="replace").strip(),
                )
            )
        return json.loads(text) if text else None

    def add(self, pod):
        self.runtime.acquire_shared()
        try:
            return self._add(pod)
        finally:
            self.runtime.release_shared()

    def _add(self, pod):
        cid = os.urandom(32).hex()
        with self.state:
            self.inflight.add(cid)
        try:
            result = self.run("ADD", self.base_conf, cid, pod)
            ips = [i["address"].split("/")[0] for i in (result or {}).get("ips", [])]
            if len(ips) != 1:
                raise Violation("ADD %s for %s: expected one address: %s" % (cid, pod.name, result))
            ip = ipaddress.ip_address(ips[0])
            if not self.range_start <= ip <= self.range_end:
                raise Violation("ADD for %s: %s outside the range" % (pod.name, ip))
            # One step from "in flight" to "running": a GC never sees the container in neither.
            with self.state:
                self.inflight.discard(cid)
                if pod.ip is None:
                    owner = self.ip_owner.get(ip)
                    if owner is not None and owner != pod.idx:
                        raise Violation(
                            "ADD for %s got %s, which is web-%d's address" % (pod.name, ip, owner)
                        )
                    self.ip_owner[ip] = pod.idx
                    pod.ip = ip
                elif ip != pod.ip:
                    raise Violation(
                        "%s restarted on %s instead of its address %s" % (pod.name, ip, pod.ip)
                    )
                old = pod.cid
                if old is not None:
                    self.live.pop(old, None)
                self.vanished.discard(old)
                pod.cid, pod.result = cid, result
                self.live[cid] = pod
            return old
        finally:
            with self.state:
                self.inflight.discard(cid)

    def delete(self, pod, cid, result, late=False):
        conf = dict(self.base_conf)
        with self.rng_lock:
            with_prev = late or self.rng.random() < 0.5
            empty_netns = self.rng.random() < 0.3
        if with_prev and result is not None:
            conf["prevResult"] = result
        self.runtime.acquire_shared()
        try:
            self.run("DEL", conf, cid, pod, netns="" if empty_netns else "/var/run/netns/x")
        finally:
            self.runtime.release_shared()
        if not late:
            with self.state:
                self.live.pop(cid, None)
                pod.cid, pod.result = None, None

    def gc(self):
        self.runtime.acquire_exclusive()
        try:
            self._gc()
        finally:
            self.runtime.release_exclusive()

    def _gc(self):
        with self.state:
            valid = sorted(set(self.live) | self.inflight)
            gone_before = set(self.vanished)
        conf = dict(self.base_conf)
        conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": "eth0"} for c in valid]
        out = self.run("GC", conf)
        if out is not None:
            raise Violation("GC printed %s (must print nothing on success)" % out)
        with self.state:
            # Every container that vanished before the GC started is released now.
            self.vanished -= gone_before

    # ---- workers -----------------------------------------------------------------------------

    def pick(self):
        with self.rng_lock:
            r = self.rng.random()
            order = self.rng.sample(self.pods, min(16, len(self.pods)))
        if r < self.opts.gc_share:
            return "gc", None, r
        for pod in order:
            if pod.lock.acquire(blocking=False):
                return "pod", pod, r
        return None, None, r

    def unit(self, fn, *a):
        self.gate.enter()
        try:
            return fn(*a)
        finally:
            self.gate.exit()

    def worker(self):
        while not self.stop.is_set():
            kind, pod, _ = self.pick()
            if kind is None:
                # Every sampled pod is busy with another worker: wait for any call to end.
                self.stop.wait(0.001)
                continue
            try:
                if kind == "gc":
                    if not self.take_budget(1):
                        break
                    self.unit(self.gc)
                    self.note("gc")
                    continue
                try:
                    self.pod_op(pod)
                finally:
                    pod.lock.release()
            except Violation as v:
                self.fail(str(v))
            except Exception as e:  # a bug in the harness is a failure too
                self.fail("harness error: %r" % e)
        self.stop.set()

    def pod_op(self, pod):
        with self.rng_lock:
            r = self.rng.random()
        if pod.cid is None:
            if not self.take_budget(1):
                self.stop.set()
                return
            self.unit(self.add, pod)
            self.note("start")
            return
        if r < 0.75 and self.take_budget(2):
            if r < 0.55:
                cid, result = pod.cid, pod.result
                self.unit(self.delete, pod, cid, result)
                self.unit(self.add, pod)
                self.note("restart")
            else:
                old_result = pod.result
                old = self.unit(self.add, pod)
                self.unit(self.delete, pod, old, old_result, True)
                self.note("crash-restart")
        elif r < 0.93:
            if not self.take_budget(1):
                self.stop.set()
                return
            self.unit(self.delete, pod, pod.cid, pod.result)
            self.note("stop")
        else:
            with self.state:
                self.live.pop(pod.cid, None)
                self.vanished.add(pod.cid)
                pod.cid, pod.result = None, None
            self.note("vanish")

    def note(self, kind):
        with self.state:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def fail(self, msg):
        with self.state:
            self.violations.append(msg)
        self.stop.set()

    # ---- checks ------------------------------------------------------------------------------

    def read_dir(self):
        """Every record, read while holding the plugin's lock."""
        lock_path = os.path.join(self.net_dir, "lock")
        if not os.path.exists(lock_path):
            return {}
        with open(lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                return self.parse_dir()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def parse_dir(self):
        problems = []
        records = {}  # name -> (ip, ns, pod, body dict or None)
        for name in sorted(os.listdir(self.net_dir)):
            path = os.path.join(self.net_dir, name)
            if name.startswith(".tmp."):
                problems.append("stray temp file %s under the lock" % name)
                continue
            head = name.split("_", 1)[0]
            try:
                ip = ipaddress.ip_address(head)
            except ValueError:
                continue  # lock and bookkeeping
            with open(path, "rb") as f:
                body = f.read()
            parts = name.split("_")
            if len(parts) == 1:
                problems.append("record without identity %s: %r" % (name, body))
                continue
            if len(parts) != 3:
                problems.append("bad record name %s" % name)
                continue
            try:
                lease = json.loads(body)
                assert lease["format"] == FORMAT and lease["state"] in ("attached", "released")
                assert (lease["namespace"], lease["pod"]) == (parts[1], parts[2])
            except Exception:
                problems.append("%s: not a lease record: %r" % (name, body))
                continue
            records[name] = (ip, parts[1], parts[2], lease)
        if problems:
            raise Violation("; ".join(problems))
        return records

    def check_locked(self, records):
        """Invariants that hold whenever nobody holds the lock."""
        problems = []
        by_ip, by_pod, by_cid = {}, {}, {}
        for name, (ip, ns, pod_name, lease) in records.items():
            by_ip.setdefault(ip, []).append(name)
            by_pod.setdefault((ns, pod_name), []).append(name)
            if lease["state"] == "attached":
                by_cid.setdefault((lease["containerId"], lease["ifname"]), []).append(name)
            if not self.range_start <= ip <= self.range_end:
                problems.append("%s outside the range" % name)
        for ip, names in by_ip.items():
            if len(names) > 1:
                problems.append("%s recorded twice: %s" % (ip, names))
        for key, names in by_pod.items():
            if len(names) > 1:
                problems.append("pod %s/%s holds several records: %s" % (key + (names,)))
        for key, names in by_cid.items():
            if len(names) > 1:
                problems.append("container %s/%s attached twice: %s" % (key + (names,)))
        with self.state:
            known = {(p.ns, p.name): p.ip for p in self.pods if p.ip is not None}
        for name, (ip, ns, pod_name, _) in records.items():
            want = known.get((ns, pod_name))
            if want is not None and want != ip:
                problems.append("%s: the pod's address is %s" % (name, want))
        if problems:
            raise Violation("locked check: " + "; ".join(problems))

    def check_exact(self, records):
        """With no call in flight: the data dir is exactly the model."""
        problems = []
        by_pod = {(ns, p): (name, ip, lease) for name, (ip, ns, p, lease) in records.items()}
        with self.state:
            vanished = set(self.vanished)
            live = dict(self.live)
        for pod in self.pods:
            rec = by_pod.pop((pod.ns, pod.name), None)
            if pod.ip is None:
                if rec:
                    problems.append("%s never got an address but holds %s" % (pod.name, rec[0]))
                continue
            if rec is None:
                problems.append("%s lost its lease on %s" % (pod.name, pod.ip))
                continue
            name, ip, lease = rec
            if ip != pod.ip:
                problems.append("%s holds %s, not its address %s" % (pod.name, name, pod.ip))
            attached = lease["state"] == "attached"
            if pod.cid is not None:
                if not attached or lease["containerId"] != pod.cid:
                    problems.append(
                        "%s is running %s but %s is %s for %s"
                        % (pod.name, pod.cid, name, lease["state"], lease["containerId"])
                    )
            elif attached and lease["containerId"] not in vanished:
                problems.append(
                    "%s is not running but %s is attached to %s (leak)"
                    % (pod.name, name, lease["containerId"])
                )
        for key, (name, _, _) in by_pod.items():
            problems.append("record of an unknown pod: %s" % name)
        attached = {l["containerId"] for (_, _, _, l) in records.values() if l["state"] == "attached"}
        leaked = attached - set(live) - vanished
        if leaked:
            problems.append("attached to containers nobody runs: %s" % sorted(leaked))
        if problems:
            raise Violation("exact check: " + "; ".join(problems))

    def checker(self):
        last_locked = last_exact = 0
        while not self.stop.is_set():
            done = sum(self.counts.values())
            try:
                if done - last_exact >= self.opts.exact_every:
                    last_exact = done
                    self.gate.pause()
                    try:
                        records = self.read_dir()
                        self.check_locked(records)
                        self.check_exact(records)
                    finally:
                        self.gate.resume()
                    self.passed += 2
                elif done - last_locked >= self.opts.check_every:
                    last_locked = done
                    self.check_locked(self.read_dir())
                    self.passed += 1
            except Violation as v:
                self.fail(str(v))
                return
            self.stop.wait(0.05)

    def final(self):
        self.gc()
        with self.state:
            if self.vanished:
                raise Violation("vanished containers not released by GC: %s" % self.vanished)
        records = self.read_dir()
        self.check_locked(records)
        self.check_exact(records)
        self.passed += 2
        running = [p for p in self.pods if p.cid is not None]
        attached = sum(1 for (_, _, _, l) in records.values() if l["state"] == "attached")
        if attached != len(running):
            raise Violation("%d attached records for %d running pods" % (attached, len(running)))
        self.passed += 1
        return records


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10000, help="plugin calls in total (default 10000)")
    ap.add_argument("--workers", type=int, default=8, help="parallel workers (default 8)")
    ap.add_argument("--pods", type=int, default=200, help="pods that keep restarting (default 200)")
    ap.add_argument(
        "--binary",
        default=os.path.join(repo, "target", "debug", "sticky-ipam"),
        help="the sticky-ipam binary (default target/debug/sticky-ipam)",
    )
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--data-dir", default=None, help="parent of the data dir (default: a temp dir)")
    ap.add_argument("--check-every", type=int, default=200, help="calls between locked checks")
    ap.add_argument("--exact-every", type=int, default=1000, help="calls between exact checks")
    ap.add_argument("--gc-share", type=float, default=0.03, help="share of steps that are a GC")
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    opts = ap.parse_args()
    opts.binary = os.path.abspath(opts.binary)
    if opts.data_dir is not None:
        opts.data_dir = os.path.abspath(opts.data_dir)
    if opts.seed is None:
        opts.seed = int.from_bytes(os.urandom(4), "big")
    if not os.access(opts.binary, os.X_OK):
        print("soak-ipam: %s is not an executable (build it first)" % opts.binary, file=sys.stderr)
        return 2
    if opts.ops < 1 or opts.workers < 1 or opts.pods < 1:
        print("soak-ipam: --ops, --workers and --pods must be positive", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="soak-ipam-", dir=opts.data_dir)
    data_dir = os.path.join(tmp, "data")
    soak = Soak(opts, data_dir)
    print(
        "soak-ipam: %d ops, %d workers, %d pods, range %s-%s, seed %d, binary %s, data %s"
        % (
            opts.ops,
            opts.workers,
            opts.pods,
            soak.range_start,
            soak.range_end,
            opts.seed,
            opts.binary,
            data_dir,
        ),
        flush=True,
    )
    started = time.monotonic()
    threads = [threading.Thread(target=soak.worker, daemon=True) for _ in range(opts.workers)]
    checker = threading.Thread(target=soak.checker, daemon=True)
    for t in threads:
        t.start()
    checker.start()
    for t in threads:
        t.join()
    soak.stop.set()
    checker.join()
    elapsed = time.monotonic() - started
    counts = dict(soak.counts)
    ops = sum(counts.values())
    records = {}
    if not soak.violations:
        try:
            records = soak.final()
        except Violation as v:
            soak.violations.append(str(v))
    d = sorted(soak.durations)
    pct = lambda q: d[min(len(d) - 1, int(q * len(d)))] * 1000 if d else 0.0
    started_pods = sum(1 for p in soak.pods if p.ip is not None)
    print(
        "ops: %d (ADD %d, DEL %d, GC %d) in %.1f s: %.0f ops/s"
        % (ops, counts["ADD"], counts["DEL"], counts["GC"], elapsed, ops / elapsed)
    )
    print("latency ms: p50 %.1f, p99 %.1f, max %.1f" % (pct(0.5), pct(0.99), pct(1.0)))
    print(
        "pod operations: %s"
        % ", ".join("%s %d" % (k, v) for k, v in sorted(soak.kinds.items()))
    )
    print(
        "pods: %d started, %d running at the end, %d records; every ADD returned the pod's first address"
        % (started_pods, sum(1 for p in soak.pods if p.cid), len(records))
        if not soak.violations
        else "pods: %d started" % started_pods
    )
    for v in soak.violations[:20]:
        print("VIOLATION: %s" % v)
    if soak.violations or opts.keep:
        print("data dir kept: %s" % data_dir)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (soak.passed, len(soak.violations)))
    return 1 if soak.violations else 0


if __name__ == "__main__":
    sys.exit(main())
