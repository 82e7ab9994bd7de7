//! Netns topology for the sticky-vxlan tests (see DESIGN.md, "Test topology").
//!
//! An underlay namespace holds a bridge; each `node` namespace is joined to it by a veth and
//! gets `192.0.2.<n>/24`; pods are namespaces whose veth the plugin creates. The plugin runs
//! inside the node namespace through `ip netns exec`, exactly as a runtime on that node
//! would run it. Every name carries the test's pid and a counter; [`Topo`]'s `Drop` deletes
//! every namespace (and with them every link) and the temp dir, also when the test panics.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

/// sticky-vxlan as built for this test run ([`crate::support::bins::built`]).
pub fn bin() -> &'static str {
    crate::support::bins::built("sticky-vxlan")
}
pub const HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// Asserts that a netns test can run: root, and Debian's reference host-local (the IPAM these
/// tests chain). The tests that call it are `#[ignore = "needs root: network namespaces"]`, so
/// without root they are reported as skipped; when they do run (as root, with
/// `cargo nextest run --run-ignored all`), a missing prerequisite fails them with what to do.
pub fn assert_can_run() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "netns tests need root: run the suite as root (scripts/test.sh), or leave out \
         --run-ignored / --include-ignored to have them reported as skipped"
    );
    assert!(
        Path::new(HOST_LOCAL).exists(),
        "{HOST_LOCAL} is missing: apt-get install containernetworking-plugins (.ci/run installs it)"
    );
}

pub fn sh(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {args:?}: {e}"))
}

/// Asserts that a command (a plugin call, the tool, `ip`...) succeeded; on failure the panic
/// names `what` and shows its stdout and stderr.
pub fn succeeded(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The plugin run in this process's own namespace, with only `env` (and no `CNI_*` from the
/// test's environment) and `conf` on stdin: for calls refused before anything is touched, which
/// need no root.
pub fn plugin_call(env: &[(&str, &str)], conf: &Value) -> Output {
    let mut child = Command::new(bin())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sticky-vxlan");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.to_string().as_bytes())
        .expect("write the config");
    child.wait_with_output().expect("wait for sticky-vxlan")
}

/// Runs a command and panics with its output if it fails.
pub fn ok(args: &[&str]) -> String {
    let out = sh(args);
    succeeded(&out, &format!("{args:?}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub struct Topo {
    pub tag: String,
    pub underlay: String,
    pub dir: tempfile::TempDir,
    pub cni_path: PathBuf,
    namespaces: Vec<String>,
    pub net: String,
    /// Nodes on an IPv6-only underlay (`2001:db8::<n>/64`, no IPv4 on it at all).
    pub underlay6: bool,
}

pub struct Pod {
    pub ns: String,
    pub id: String,
    pub node: u8,
    pub ifname: String,
}

impl Pod {
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.ns)
    }
}

impl Topo {
    /// An underlay with the given MTU and no nodes yet.
    pub fn new(mtu: u32) -> Topo {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let tag = format!("sv{}x{n}", std::process::id());
        let dir = tempfile::tempdir().expect("tempdir");
        let cni_path = dir.path().join("bin");
        std::fs::create_dir(&cni_path).expect("bin dir");
        std::os::unix::fs::symlink(bin(), cni_path.join("sticky-vxlan")).expect("link");
        std::os::unix::fs::symlink(HOST_LOCAL, cni_path.join("host-local")).expect("link");
        let mut topo = Topo {
            underlay: format!("{tag}-ul"),
            tag: tag.clone(),
            dir,
            cni_path,
            namespaces: Vec::new(),
            net: format!("net{tag}"),
            underlay6: false,
        };
        let ul = topo.underlay.clone();
        topo.add_ns(&ul);
        ok(&[
            "ip",
            "-n",
            &ul,
            "link",
            "add",
            "br0",
            "mtu",
            &mtu.to_string(),
            "type",
            "bridge",
        ]);
        ok(&["ip", "-n", &ul, "link", "set", "br0", "up"]);
        topo
    }

    /// An IPv6-only underlay with the given MTU and no nodes yet.
    pub fn new_ipv6(mtu: u32) -> Topo {
        let mut topo = Topo::new(mtu);
        topo.underlay6 = true;
        topo
    }

    /// Node `n`'s underlay address: `192.0.2.<n>`, or `2001:db8::<n>` on an IPv6 underlay.
    pub fn node_addr(&self, n: u8) -> String {
        if self.underlay6 {
            format!("2001:db8::{n}")
        } else {
            Self::node_ip(n)
        }
    }

    /// Node `n`'s peer entry on this topology's underlay.
    pub fn peer_of(&self, n: u8, v6: bool) -> Value {
        let mut p = Self::peer(n, v6);
        p["ip"] = json!(self.node_addr(n));
        p
    }

    /// A namespace of this topology (loopback up), deleted with it.
    pub fn add_ns(&mut self, name: &str) {
        ok(&["ip", "netns", "add", name]);
        self.namespaces.push(name.to_string());
        ok(&["ip", "-n", name, "link", "set", "lo", "up"]);
    }

    pub fn node_ns(&self, n: u8) -> String {
        format!("{}-n{n}", self.tag)
    }

    pub fn node_ip(n: u8) -> String {
        format!("192.0.2.{n}")
    }

    /// Node `n`: namespace, veth into the underlay, `192.0.2.<n>/24`.
    pub fn add_node(&mut self, n: u8, mtu: u32) {
        let ns = self.node_ns(n);
        self.add_ns(&ns);
        let ul = self.underlay.clone();
        let port = format!("n{n}");
        let mtu = mtu.to_string();
        ok(&[
            "ip", "-n", &ul, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer", "name",
            "eth0", "mtu", &mtu, "netns", &ns,
        ]);
        ok(&["ip", "-n", &ul, "link", "set", &port, "master", "br0", "up"]);
        if self.underlay6 {
            // No duplicate address detection: the address is usable at once.
            let addr = format!("{}/64", self.node_addr(n));
            ok(&[
                "ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0", "nodad",
            ]);
        } else {
            let addr = format!("{}/24", Self::node_ip(n));
            ok(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
        }
        ok(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
    }

    /// A pod namespace (the runtime's job); the plugin adds its interface.
    pub fn new_pod(&mut self, node: u8, name: &str) -> Pod {
        let ns = format!("{}-{name}", self.tag);
        self.add_ns(&ns);
        Pod {
            id: format!("{}{name}", self.tag),
            ns,
            node,
            ifname: "eth0".into(),
        }
    }

    /// Deletes a pod's namespace now (as a runtime does after DEL, or a crash before it).
    pub fn drop_ns(&mut self, ns: &str) {
        ok(&["ip", "netns", "del", ns]);
        self.namespaces.retain(|x| x != ns);
    }

    pub fn state_dir(&self, node: u8) -> PathBuf {
        self.dir.path().join(format!("state-{node}"))
    }

    /// A v4 (and optionally v6) subnet per node: 10.244.<n>.0/24, fd00:<n>::/64.
    pub fn subnet(n: u8) -> String {
        format!("10.244.{n}.0/24")
    }

    pub fn subnet6(n: u8) -> String {
        format!("fd00:{n}::/64")
    }

    pub fn peer(n: u8, v6: bool) -> Value {
        let mut subnets = vec![Self::subnet(n)];
        if v6 {
            subnets.push(Self::subnet6(n));
        }
        json!({"ip": Self::node_ip(n), "subnets": subnets})
    }

    /// The network config node `n` uses; `extra` keys are merged in.
    pub fn conf(&self, n: u8, extra: Value) -> Value {
        let mut range = vec![json!([{"subnet": Self::subnet(n)}])];
        if extra.get("v6").and_then(Value::as_bool) == Some(true) {
            range.push(json!([{"subnet": Self::subnet6(n)}]));
        }
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": self.net,
            "type": "sticky-vxlan",
            "vni": 1,
            "isDefaultGateway": true,
            "stateDir": self.state_dir(n),
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir.path().join(format!("ipam-{n}")),
                "ranges": range,
            }
        });
        if let Some(obj) = extra.as_object() {
            for (k, v) in obj {
                if k != "v6" {
                    c[k] = v.clone();
                }
            }
        }
        c
    }

    /// Runs the plugin inside node `n`'s namespace.
    pub fn cni(
        &self,
        n: u8,
        command: &str,
        pod: &Pod,
        netns: &str,
        conf: &Value,
        args: &str,
    ) -> Output {
        self.cni_env(n, command, pod, netns, conf, args, &[])
    }

    /// Like [`Topo::cni`] with extra environment variables.
    #[allow(clippy::too_many_arguments)]
    pub fn cni_env(
        &self,
        n: u8,
        command: &str,
        pod: &Pod,
        netns: &str,
        conf: &Value,
        args: &str,
        extra: &[(&str, &str)],
    ) -> Output {
        let ns = self.node_ns(n);
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, bin()])
            .env_clear()
            .envs(extra.iter().copied())
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", &pod.ifname)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(conf.to_string().as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("wait plugin")
    }

    /// ADD of `pod` on its node, as a runtime there would run it; the plugin's output, for
    /// the tests that expect it to fail.
    pub fn try_add(&self, pod: &Pod, conf: &Value) -> Output {
        self.cni(pod.node, "ADD", pod, &pod.path(), conf, "")
    }

    /// ADD that must succeed; returns the result.
    pub fn add(&self, pod: &Pod, conf: &Value) -> Value {
        self.add_args(pod, conf, "")
    }

    pub fn add_args(&self, pod: &Pod, conf: &Value, args: &str) -> Value {
        let out = self.cni(pod.node, "ADD", pod, &pod.path(), conf, args);
        succeeded(&out, &format!("ADD {} on node {}", pod.ns, pod.node));
        serde_json::from_slice(&out.stdout).expect("ADD result is JSON")
    }

    pub fn del(&self, pod: &Pod, netns: &str, conf: &Value) -> Output {
        self.cni(pod.node, "DEL", pod, netns, conf, "")
    }

    /// Runs `sticky-vxlan <args>` (operator mode) inside node `n`.
    pub fn tool(&self, n: u8, args: &[&str]) -> Output {
        let ns = self.node_ns(n);
        let mut full = vec!["ip", "netns", "exec", &ns, bin()];
        full.extend_from_slice(args);
        sh(&full)
    }

    pub fn in_ns(&self, ns: &str, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", ns];
        full.extend_from_slice(args);
        sh(&full)
    }

    pub fn ping(&self, from: &Pod, to: &str) -> bool {
        let six = if to.contains(':') { "-6" } else { "-4" };
        self.in_ns(&from.ns, &["ping", six, "-c", "1", "-W", "2", to])
            .status
            .success()
    }

    /// Pings, retrying a few times (the first packet can be lost while neighbours resolve).
    pub fn reaches(&self, from: &Pod, to: &str) -> bool {
        (0..3).any(|_| self.ping(from, to))
    }

    /// Pings until one answers or `deadline` (60 s, for a loaded machine) has passed: for a
    /// pod whose ADD has just returned, neighbours still resolving.
    pub fn reaches_within(&self, from: &Pod, to: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if self.ping(from, to) {
                return true;
            }
        }
        false
    }

    /// `ip -d -j link show dev <dev>` in namespace `ns`: the link's details as JSON.
    pub fn link_details(&self, ns: &str, dev: &str) -> Value {
        let out = ok(&["ip", "-n", ns, "-d", "-j", "link", "show", "dev", dev]);
        let v: Value = serde_json::from_str(&out).expect("ip -j");
        v[0].clone()
    }

    pub fn link_mac(&self, ns: &str, dev: &str) -> String {
        let out = ok(&["ip", "-n", ns, "-j", "link", "show", "dev", dev]);
        let v: Value = serde_json::from_str(&out).expect("ip -j");
        v[0]["address"].as_str().unwrap_or_default().to_string()
    }

    /// Nodes 1 to 3 with one peer list naming all three; each node's config.
    pub fn three_nodes(&mut self) -> Vec<Value> {
        for n in 1..=3 {
            self.add_node(n, 1500);
        }
        let peers = json!([
            self.peer_of(1, self.underlay6),
            self.peer_of(2, self.underlay6),
            self.peer_of(3, self.underlay6)
        ]);
        (1..=3)
            .map(|n| self.conf(n, json!({"peers": peers})))
            .collect()
    }

    /// [`Topo::three_nodes`] with `per_node` pods added on each (`p<node><i>`): the configs,
    /// the pods and their IPv4 addresses, node by node.
    pub fn three_nodes_with_pods(
        &mut self,
        per_node: usize,
    ) -> (Vec<Value>, Vec<Pod>, Vec<String>) {
        let confs = self.three_nodes();
        let (mut pods, mut ips) = (Vec::new(), Vec::new());
        for n in 1..=3u8 {
            for i in 0..per_node {
                let pod = self.new_pod(n, &format!("p{n}{i}"));
                ips.push(ip_of(&self.add(&pod, &confs[usize::from(n) - 1]), false));
                pods.push(pod);
            }
        }
        (confs, pods, ips)
    }

    /// `ip -o monitor route` in node `n` while `during` runs: every line it printed between a
    /// start route it showed before and an end route added after (so no line is missed or
    /// waited for).
    pub fn route_events(&self, n: u8, during: impl FnOnce()) -> Vec<String> {
        use std::io::BufRead as _;
        let marker = "203.0.113.0/24";
        /// Ends the monitor however the test ends.
        struct Monitor(std::process::Child);
        impl Drop for Monitor {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut monitor = Monitor(
            std::process::Command::new("ip")
                .args(["-n", &self.node_ns(n), "-o", "monitor", "route"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("ip monitor"),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let out = monitor.0.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Duration::from_secs(60);
        // The monitor listens once it prints a change: the marker comes and goes (each a change
        // the kernel reports) until the monitor shows one.
        let start = std::time::Instant::now();
        let mut present = false;
        loop {
            let verb = if present { "del" } else { "add" };
            self.ip(n, &["route", verb, marker, "dev", "lo"]);
            present = !present;
            match rx.recv_timeout(std::time::Duration::from_millis(200)) {
                Ok(line) if line.contains(marker) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("ip monitor ended"),
                _ => assert!(start.elapsed() < deadline, "ip monitor printed nothing"),
            }
        }
        if present {
            self.ip(n, &["route", "del", marker, "dev", "lo"]);
        }
        // Adds route `to` and returns every line the monitor printed before it printed that.
        let lines_until = |to: &str| {
            self.ip(n, &["route", "add", to, "dev", "lo"]);
            let mut lines = Vec::new();
            loop {
                let line = rx
                    .recv_timeout(deadline)
                    .unwrap_or_else(|e| panic!("ip monitor never printed {to}: {e}"));
                if line.starts_with(to) {
                    return lines;
                }
                lines.push(line);
            }
        };
        // The toggling may have printed more than was read (a slow monitor on a loaded
        // machine): the record starts after a route added once the monitor is known to listen.
        let start_marker = "203.0.113.128/25";
        lines_until(start_marker);
        during();
        // A second marker ends the record: every change before it has been printed by then.
        let end = "198.51.100.0/24";
        let lines = lines_until(end);
        for route in [start_marker, end] {
            self.ip(n, &["route", "del", route, "dev", "lo"]);
        }
        lines
    }

    /// The network's nftables table on node `n`, as `nft list` prints it.
    pub fn nft_table(&self, n: u8) -> String {
        self.nft_table_of_family(n, "ip")
    }

    /// The network's nftables table of `family` (`ip`, `ip6`) on node `n`.
    pub fn nft_table_of_family(&self, n: u8, family: &str) -> String {
        let table = format!("sticky_vxlan_{}", self.net);
        let ns = self.node_ns(n);
        ok(&[
            "ip", "netns", "exec", &ns, "nft", "list", "table", family, &table,
        ])
    }

    /// Every nftables table on node `n`, one `table <family> <name>` a line.
    pub fn nft_tables(&self, n: u8) -> String {
        let ns = self.node_ns(n);
        ok(&["ip", "netns", "exec", &ns, "nft", "list", "tables"])
    }

    /// A table of the test's own on node `n` (`<family> sticky_test_probe`, gone with the
    /// namespace) counting the UDP datagrams to `port` from `saddr` that passed every input
    /// rule hooked before it (the plugin's peer-only rule sits at `filter - 1`).
    pub fn add_udp_probe(&self, n: u8, family: &str, saddr: &str, port: u16) {
        let ns = self.node_ns(n);
        let match_saddr = if family == "ip6" {
            "ip6 saddr"
        } else {
            "ip saddr"
        };
        let script = format!(
            "table {family} sticky_test_probe {{\n  chain input {{\n    type filter hook input priority filter + 10; policy accept;\n    udp dport {port} {match_saddr} {saddr} counter\n  }}\n}}\n"
        );
        self.load_nft(&ns, &format!("probe-{n}-{family}.nft"), &script);
    }

    /// Loads an nftables `script` in namespace `ns` (`nft -f`, from a file `name` in the temp
    /// dir, kept for a failing test's reader).
    pub fn load_nft(&self, ns: &str, name: &str, script: &str) {
        let file = self.dir.path().join(name);
        std::fs::write(&file, script).expect("nft script");
        ok(&[
            "ip",
            "netns",
            "exec",
            ns,
            "nft",
            "-f",
            file.to_str().expect("utf-8 path"),
        ]);
    }

    /// How many datagrams [`Topo::add_udp_probe`]'s counter on node `n` has seen.
    pub fn udp_probe_count(&self, n: u8, family: &str) -> u64 {
        let ns = self.node_ns(n);
        let out = ok(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "nft",
            "list",
            "table",
            family,
            "sticky_test_probe",
        ]);
        out.split("counter packets ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("the probe's counter")
    }

    /// Sends a UDP datagram to `to`'s VXLAN port (8472) from node `from` until node `n`'s
    /// probe ([`Topo::add_udp_probe`]) counts one (a datagram lost is sent again), within a
    /// deadline that holds on a loaded machine.
    pub fn udp_probe_sees_a_datagram(&self, from: u8, n: u8, to: &str, family: &str) {
        let send = format!("echo x > /dev/udp/{to}/8472");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.udp_probe_count(n, family) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no datagram from node {from} got past node {n}'s input rules in 60 s: {}",
                self.nft_tables(n)
            );
            let out = self.in_ns(&self.node_ns(from), &["bash", "-c", &send]);
            succeeded(&out, &format!("a datagram from node {from}"));
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Pod veths (host ends) on node `n`.
    pub fn pod_veths(&self, n: u8) -> usize {
        ok(&[
            "ip",
            "-n",
            &self.node_ns(n),
            "-o",
            "link",
            "show",
            "type",
            "veth",
        ])
        .lines()
        .filter(|l| !l.contains(" eth0@"))
        .count()
    }

    /// Record files of node `n`'s IPAM data dir, by name.
    pub fn allocations(&self, n: u8) -> Vec<String> {
        let dir = self.dir.path().join(format!("ipam-{n}")).join(&self.net);
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|f| f.starts_with("10."))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn write_peers_file(&self, name: &str, peers: &Value) -> PathBuf {
        let path = self.dir.path().join(name);
        let tmp = self.dir.path().join(format!("{name}.tmp"));
        std::fs::write(&tmp, peers.to_string()).expect("write peers");
        std::fs::rename(&tmp, &path).expect("rename peers");
        path
    }
}

/// Nodes 1 and 2 on a 1500-byte underlay and the peer list naming both (with their IPv6 pod
/// subnets when `v6`); panics when the test cannot run here ([`assert_can_run`]).
pub fn two_nodes(v6: bool) -> (Topo, Value) {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    (topo, json!([Topo::peer(1, v6), Topo::peer(2, v6)]))
}

/// One node with a config naming only itself: what most single-node tests start from.
pub fn one_node() -> (Topo, Value) {
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    (topo, conf)
}

/// [`one_node`] with a pod (`a`) added on it: the network's VTEP, bridge and table exist.
pub fn one_node_with_pod() -> (Topo, Value) {
    let (mut topo, conf) = one_node();
    let a = topo.new_pod(1, "a");
    topo.add(&a, &conf);
    (topo, conf)
}

impl Topo {
    /// The flood (all-zero MAC) entries on node `n`'s VXLAN device `dev`: the remote VTEPs
    /// its broadcast and unknown traffic goes to, sorted; none while the device does not
    /// exist (a test polling for it).
    pub fn flood(&self, n: u8, dev: &str) -> Vec<String> {
        let out = sh(&[
            "ip",
            "netns",
            "exec",
            &self.node_ns(n),
            "bridge",
            "-j",
            "fdb",
            "show",
            "dev",
            dev,
        ]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let mut dsts: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["mac"] == "00:00:00:00:00:00")
            .filter_map(|e| e["dst"].as_str().map(str::to_string))
            .collect();
        dsts.sort();
        dsts
    }

    /// Pod `a` on node 1 and pod `b` on node 2, added with `conf1` and `conf2`: `a`, and
    /// `b`'s IPv4 address, what the cross-node tests ping.
    pub fn pods_a_and_b(&mut self, conf1: &Value, conf2: &Value) -> (Pod, String) {
        let a = self.new_pod(1, "a");
        let b = self.new_pod(2, "b");
        self.add(&a, conf1);
        let ip_b = ip_of(&self.add(&b, conf2), false);
        (a, ip_b)
    }

    /// `ip -n <node n> <args>`, which must succeed; its output.
    pub fn ip(&self, n: u8, args: &[&str]) -> String {
        let ns = self.node_ns(n);
        let mut full = vec!["ip", "-n", &ns];
        full.extend_from_slice(args);
        ok(&full)
    }

    /// `sticky-vxlan reconcile --config <conf written to a file>` on node `n`.
    pub fn reconcile(&self, n: u8, conf: &Value) -> Output {
        let file = self.dir.path().join(format!("n{n}.conf"));
        std::fs::write(&file, conf.to_string()).expect("write conf");
        self.tool(
            n,
            &["reconcile", "--config", file.to_str().expect("utf-8 path")],
        )
    }

    /// [`Topo::reconcile`] that must succeed.
    pub fn reconciled(&self, n: u8, conf: &Value) {
        succeeded(&self.reconcile(n, conf), &format!("reconcile on node {n}"));
    }
}

/// The first address of a family from an ADD result, without the prefix.
pub fn ip_of(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':') == v6)
        .and_then(|a| a.split('/').next())
        .unwrap_or_default()
        .to_string()
}

/// A packet capture on one interface of a namespace, running until [`Capture::frames`].
pub struct Capture {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl Capture {
    /// Starts tcpdump and returns once it listens. Every packet is handed to it at once
    /// (`--immediate-mode`): a capture stopped a moment after its traffic still holds it.
    pub fn start(ns: &str, dev: &str, file: std::path::PathBuf) -> Capture {
        use std::io::BufRead;
        let mut child = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "tcpdump",
                "-i",
                dev,
                "-nn",
                "-U",
                "--immediate-mode",
                "-w",
            ])
            .arg(&file)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("tcpdump (apt install tcpdump)");
        let mut line = String::new();
        let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        err.read_line(&mut line).expect("tcpdump stderr");
        assert!(line.contains("listening on"), "tcpdump: {line}");
        Capture { child, file }
    }

    /// Stops the capture and returns every frame it saw, one line each (with MACs).
    pub fn frames(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("stop tcpdump");
        self.child.wait().expect("wait tcpdump");
        ok(&["tcpdump", "-r", self.file.to_str().unwrap(), "-nn", "-e"])
    }
}

/// A capture stopped by a failing test still ends (and is reaped).
impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The CNI error a failed call printed on stdout.
pub fn error_of(out: &Output) -> Value {
    assert!(!out.status.success(), "expected a failure");
    serde_json::from_slice(&out.stdout).expect("error JSON on stdout")
}

/// The CNI error a failed call printed, checked to carry `code` and a message containing
/// `says`.
pub fn expect_error(out: &Output, code: u64, says: &str) -> Value {
    let err = error_of(out);
    assert_eq!(err["code"], code, "{err}");
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(says), "{msg:?} does not say {says:?}");
    err
}
