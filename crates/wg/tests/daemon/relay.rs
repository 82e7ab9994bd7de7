//! The forwarding relay (issue 34), with `wg` and `ip` only. Gateways A and B cannot reach
//! each other: each has a link to R, which does not route (`ip_forward` 0). Each holds a
//! WireGuard session with R (dialing it, keepalive on: as a gateway behind NAT does) and one
//! with the other, whose endpoint is the relayed endpoint through R. R's peers for A and B have
//! no allowed IPs: its WireGuard could not hand it a packet of theirs if it could decrypt one.
//!
//! ```text
//!  A u0 198.51.100.1/25 ── ua 198.51.100.126/25  R  ub 198.51.100.254/25 ── u0 198.51.100.129/25 B
//!  tunnel 192.0.2.1                                                             tunnel 192.0.2.2
//! ```

use sticky_sites::keys::PublicKey;
use sticky_sites::relay;
use sticky_testkit::kube_support::wait_for;
use sticky_testkit::support::netns::sh;
use sticky_testkit::support::scratch::temp_dir;
use sticky_testkit::vxlan_support::Capture;
use tempfile::TempDir;

use super::{DEADLINE, Daemon, Side, prerequisites, serve};

/// A, R and B with their daemons serving, configured, and A's first ping through R answered.
struct Trio {
    a: Side,
    r: Side,
    b: Side,
    _daemons: Vec<Daemon>,
    dir: TempDir,
}

/// The relayed endpoint of `to` through `via`, as a `wg` endpoint argument.
fn relayed(via: &Side, to: &Side) -> String {
    relayed_punching(via, to, false)
}

/// The same, punching or not.
fn relayed_punching(via: &Side, to: &Side, punch: bool) -> String {
    let key = |s: &Side| PublicKey::from_base64(&s.public).expect("wg pubkey");
    relay::endpoint(&key(via), &key(to), punch).to_string()
}

/// The underlay of a trio: A's address, R's on A's link, R's on B's link, B's, the prefix.
struct Underlay {
    a: &'static str,
    r_a: &'static str,
    r_b: &'static str,
    b: &'static str,
    prefix: u8,
}

const V4: Underlay = Underlay {
    a: "198.51.100.1",
    r_a: "198.51.100.126",
    r_b: "198.51.100.254",
    b: "198.51.100.129",
    prefix: 25,
};

const V6: Underlay = Underlay {
    a: "2001:db8:a::1",
    r_a: "2001:db8:a::2",
    r_b: "2001:db8:b::2",
    b: "2001:db8:b::1",
    prefix: 64,
};

impl Underlay {
    /// `addr` added to `dev` in `side`'s namespace (IPv6 without duplicate address detection:
    /// usable at once).
    fn add(&self, side: &Side, addr: &str, dev: &str) {
        let net = format!("{addr}/{}", self.prefix);
        let mut argv = vec!["ip", "addr", "add", &net, "dev", dev];
        if addr.contains(':') {
            argv.push("nodad");
        }
        side.ns.exec(&argv);
    }

    /// `addr`:51820.
    fn endpoint(addr: &str) -> String {
        let ip: std::net::IpAddr = addr.parse().expect("an address");
        std::net::SocketAddr::new(ip, 51820).to_string()
    }
}

impl Trio {
    /// A trio of test `tag`: its namespaces and devices are named `<tag><a|r|b>`, so a tag must
    /// not be another test's tag plus one of those letters (the daemon tests run in parallel in
    /// one process); the relay tests' start with `rl`, the pair tests' with `wg` or `hb`.
    fn new(tag: &str) -> Trio {
        Trio::on(tag, &V4)
    }

    fn on(tag: &str, under: &Underlay) -> Trio {
        prerequisites("sticky-wg relay");
        let dir = temp_dir();
        let a = Side::new(tag, "a", (under.a, "192.0.2.1"), dir.path());
        let r = Side::new(tag, "r", (under.r_a, "192.0.2.3"), dir.path());
        let b = Side::new(tag, "b", (under.b, "192.0.2.2"), dir.path());
        for (side, r_end, r_addr) in [(&a, "ua", under.r_a), (&b, "ub", under.r_b)] {
            veth((side, "u0"), (&r, r_end));
            under.add(side, side.under, "u0");
            under.add(&r, r_addr, r_end);
        }
        for forwarding in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            assert_eq!(
                r.ns.exec(&["sysctl", "-n", forwarding]).trim(),
                "0",
                "R must not route between A and B"
            );
        }
        let daemons = vec![
            serve(&a, dir.path(), "a"),
            serve(&r, dir.path(), "r"),
            serve(&b, dir.path(), "b"),
        ];
        let trio = Trio {
            a,
            r,
            b,
            _daemons: daemons,
            dir,
        };
        trio.configure(under);
        wait_for("A's first ping to B through R", DEADLINE, || {
            trio.a.ping_once(trio.b.inner)
        });
        trio
    }

    /// R: a key and the two peers, nothing else. A and B: R at its address on their link, the
    /// other through R; the tunnel address, the route to the other's.
    fn configure(&self, under: &Underlay) {
        let (a, r, b) = (&self.a, &self.r, &self.b);
        let r_key = r.key.to_string_lossy();
        r.wg_ok(&[
            "set",
            &r.ifname,
            "private-key",
            &r_key,
            "listen-port",
            "51820",
            "peer",
            &a.public,
            "peer",
            &b.public,
        ]);
        // Up, as a gateway's device is: what its WireGuard hands it would show there.
        r.ns.exec(&["ip", "link", "set", &r.ifname, "up"]);
        for (me, other, r_addr) in [(a, b, under.r_a), (b, a, under.r_b)] {
            let key = me.key.to_string_lossy();
            me.wg_ok(&[
                "set",
                &me.ifname,
                "private-key",
                &key,
                "listen-port",
                "51820",
                "peer",
                &r.public,
                "endpoint",
                &Underlay::endpoint(r_addr),
                "persistent-keepalive",
                "25",
                "allowed-ips",
                &format!("{}/32", r.inner),
                "peer",
                &other.public,
                "endpoint",
                &relayed(r, other),
                "allowed-ips",
                &format!("{}/32", other.inner),
            ]);
            me.address_and_route(other);
        }
    }

    /// A's peer for B given `endpoint` (what the agent does when a path moves).
    fn a_to_b_at(&self, endpoint: &str) {
        let (a, b) = (&self.a, &self.b);
        a.wg_ok(&["set", &a.ifname, "peer", &b.public, "endpoint", endpoint]);
    }

    /// (A, B) and (B, A).
    fn both_ways(&self) -> [(&Side, &Side); 2] {
        [(&self.a, &self.b), (&self.b, &self.a)]
    }

    fn log(&self, n: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("sticky-wg-{n}.log.0")))
            .unwrap_or_default()
    }
}

/// A veth between two sides' namespaces, named `a.1` in `a.0`'s and `b.1` in `b.0`'s, up.
fn veth(a: (&Side, &str), b: (&Side, &str)) {
    sh(&[
        "ip",
        "link",
        "add",
        a.1,
        "netns",
        &a.0.ns.name,
        "type",
        "veth",
        "peer",
        "name",
        b.1,
        "netns",
        &b.0.ns.name,
    ]);
    for (side, name) in [a, b] {
        side.ns.exec(&["ip", "link", "set", name, "up"]);
    }
}

/// Runs `python3 -c code` in `side`'s namespace; its trimmed stdout.
fn python(side: &Side, code: &str) -> String {
    side.ns.exec(&["python3", "-c", code]).trim().to_string()
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_relay_forwards_an_end_to_end_session_it_cannot_read() {
    let t = Trio::new("rly");
    // The session is A's and B's own: each shows a handshake with the other, at the relayed
    // endpoint.
    for (me, other) in t.both_ways() {
        let f = peer_fields(me, other);
        assert_eq!(f[2], relayed(&t.r, other), "{}: {f:?}", me.ifname);
        assert_ne!(
            f[4], "0",
            "{}: no handshake with the other side: {f:?}",
            me.ifname
        );
    }
    // What R sees of a UDP message and pings with a known payload: on its links and its TUN.
    let file = |n: &str| t.dir.path().join(format!("{n}.pcap"));
    let ua = Capture::start(&t.r.ns.name, "ua", file("ua"));
    let ub = Capture::start(&t.r.ns.name, "ub", file("ub"));
    let tun = Capture::start(&t.r.ns.name, &t.r.ifname, file("tun"));
    const MARK: &str = "sticky-relay-plaintext-marker";
    let mut receive = std::process::Command::new("ip")
        .args(["netns", "exec", &t.b.ns.name, "python3", "-c"])
        .arg(
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.bind(('192.0.2.2', 7001)); s.settimeout(60); print(s.recv(200).decode())",
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    // Sent again until the receiver (bound a moment after it started) has one.
    wait_for("B to receive A's UDP message through R", DEADLINE, || {
        python(
            &t.a,
            &format!(
                "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                 s.sendto(b'{MARK}', ('192.0.2.2', 7001))"
            ),
        );
        receive.try_wait().ok().flatten().is_some()
    });
    let out = receive.wait_with_output().expect("receiver");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        MARK,
        "B got A's message"
    );
    assert!(
        t.a.ns.try_exec(&[
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-p",
            "5354494b59434e49",
            t.b.inner
        ]),
        "pings A -> B through R"
    );
    let frames = ua.frames() + &ub.frames();
    let tun_frames = tun.frames();
    let mut raw = std::fs::read(file("ua")).expect("R's capture on ua");
    raw.extend(std::fs::read(file("ub")).expect("R's capture on ub"));
    assert!(
        frames.contains("198.51.100.1.51820 > 198.51.100.126.51820")
            && frames.contains("198.51.100.254.51820 > 198.51.100.129.51820"),
        "A's datagrams went to R and on to B: {frames}"
    );
    assert!(
        !contains(&raw, MARK.as_bytes()),
        "R's links carried the message in clear"
    );
    assert!(
        !contains(&raw, &[0x53, 0x54, 0x49, 0x4b, 0x59, 0x43, 0x4e, 0x49]),
        "R's links carried the ping payload in clear"
    );
    for inner in [[192u8, 0, 2, 1], [192, 0, 2, 2]] {
        assert!(
            !contains(&raw, &inner),
            "R's links carried a tunnel address {inner:?} in clear"
        );
    }
    assert!(
        !frames.contains("192.0.2."),
        "R's links show a tunnel address: {frames}"
    );
    assert!(
        tun_frames.trim().is_empty(),
        "R's WireGuard handed it a packet of A's or B's: {tun_frames}"
    );
    wait_for("R to log what it forwarded", DEADLINE, || {
        t.log("r").contains("datagram(s) forwarded between peers")
    });
}

/// The same over an IPv6 underlay: the relay forwards between IPv6 endpoints, and names an
/// IPv6 address on the handshakes it forwards.
#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_relay_forwards_over_an_ipv6_underlay() {
    let t = Trio::on("rl6", &V6);
    for (me, other) in t.both_ways() {
        let f = peer_fields(me, other);
        assert_eq!(f[2], relayed(&t.r, other), "{}: {f:?}", me.ifname);
        assert_ne!(f[4], "0", "{}: no handshake with the other side", me.ifname);
    }
    assert!(
        t.a.ns
            .try_exec(&["ping", "-c", "3", "-i", "0.2", t.b.inner]),
        "pings A -> B through R"
    );
    wait_for("R to log what it forwarded", DEADLINE, || {
        t.log("r").contains("datagram(s) forwarded between peers")
    });
}

/// `me`'s peer line for `other` in `wg show dump`, split: [key, psk, endpoint, allowed IPs,
/// latest handshake, rx, tx, keepalive].
fn peer_fields(me: &Side, other: &Side) -> Vec<String> {
    let dump = me.wg_ok(&["show", &me.ifname, "dump"]);
    let line = dump
        .lines()
        .find(|l| l.starts_with(&other.public))
        .unwrap_or_else(|| panic!("{}: no peer {}: {dump}", me.ifname, other.public));
    line.split('\t').map(str::to_string).collect()
}

/// Direct and relayed paths are the same peer, with the same keys: A's peer for B moved to a
/// direct link and back is a change of its endpoint only, and B, not told anything, follows
/// each move on A's first datagram (WireGuard's roaming). (gotatun makes a peer anew on any
/// UAPI `set`, so A's move costs one handshake, a round trip.)
#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_move_between_relayed_and_direct_is_a_change_of_endpoint_only() {
    let t = Trio::new("rlm");
    let b_config = |t: &Trio| {
        let f = peer_fields(&t.b, &t.a);
        (
            f[0].clone(),
            f[3].clone(),
            t.b.wg_ok(&["show", &t.b.ifname, "peers"]),
        )
    };
    let before = b_config(&t);
    veth((&t.a, "ud"), (&t.b, "ud"));
    for (side, addr) in [(&t.a, "203.0.113.1/24"), (&t.b, "203.0.113.2/24")] {
        side.ns.exec(&["ip", "addr", "add", addr, "dev", "ud"]);
    }
    t.a_to_b_at("203.0.113.2:51820");
    wait_for("A's pings to B on the direct link", DEADLINE, || {
        t.a.ping_once(t.b.inner) && peer_fields(&t.b, &t.a)[2] == "203.0.113.1:51820"
    });
    // Back through R, and the direct link gone: B follows A's first relayed datagram.
    t.a_to_b_at(&relayed(&t.r, &t.b));
    t.a.ns.exec(&["ip", "link", "del", "ud"]);
    wait_for("A's pings to B through R again", DEADLINE, || {
        t.a.ping_once(t.b.inner) && peer_fields(&t.b, &t.a)[2] == relayed(&t.r, &t.a)
    });
    assert_eq!(b_config(&t), before, "B's peers were changed");
}

/// Punching through the relay: A and B start relayed with punching asked for (and a keepalive
/// every second, as the agent sets on a punch), and a direct link appears on which each
/// reaches the address R sees the other at. Each learns that address from the handshakes R
/// forwards, sends its keepalives there, and both peers roam to it: the pair is direct, with
/// no change to either side's configuration, and R forwards nothing of it any more.
#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn punching_through_the_relay_moves_the_pair_to_a_direct_path() {
    let t = Trio::new("rlp");
    for (me, other) in t.both_ways() {
        me.wg_ok(&[
            "set",
            &me.ifname,
            "peer",
            &other.public,
            "endpoint",
            &relayed_punching(&t.r, other, true),
            "persistent-keepalive",
            "1",
        ]);
    }
    veth((&t.a, "ud"), (&t.b, "ud"));
    for (side, other) in [(&t.a, &t.b), (&t.b, &t.a)] {
        side.ns.exec(&[
            "ip",
            "route",
            "add",
            &format!("{}/32", other.under),
            "dev",
            "ud",
        ]);
    }
    let direct =
        |me: &Side, other: &Side| peer_fields(me, other)[2] == format!("{}:51820", other.under);
    wait_for(
        "A and B to roam to each other's direct address",
        DEADLINE,
        || t.a.ping_once(t.b.inner) && direct(&t.a, &t.b) && direct(&t.b, &t.a),
    );
    let file = t.dir.path().join("ub.pcap");
    let ub = Capture::start(&t.r.ns.name, "ub", file);
    assert!(
        t.a.ns
            .try_exec(&["ping", "-c", "10", "-i", "0.1", t.b.inner]),
        "pings A -> B on the direct path"
    );
    let frames = ub.frames();
    assert!(
        !frames.contains("198.51.100.254.51820 > 198.51.100.129.51820"),
        "R still forwarded to B: {frames}"
    );
}

impl Trio {
    /// Today's relay instead (before issue 34): R decrypts each leg and encrypts it again. A and
    /// B lose their peer for each other; R's peers for them get their tunnel addresses, and R
    /// routes between them through its TUN.
    fn two_legs(&self) {
        let (a, r, b) = (&self.a, &self.r, &self.b);
        for (me, other) in [(a, b), (b, a)] {
            me.wg_ok(&["set", &me.ifname, "peer", &other.public, "remove"]);
            me.wg_ok(&[
                "set",
                &me.ifname,
                "peer",
                &r.public,
                "allowed-ips",
                &format!("{}/32,{}/32", r.inner, other.inner),
            ]);
            r.wg_ok(&[
                "set",
                &r.ifname,
                "peer",
                &me.public,
                "allowed-ips",
                &format!("{}/32", me.inner),
            ]);
            r.ns.exec(&[
                "ip",
                "route",
                "add",
                &format!("{}/32", me.inner),
                "dev",
                &r.ifname,
            ]);
        }
        r.ns.exec(&["ip", "link", "set", &r.ifname, "mtu", "1420"]);
        r.ns.exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        wait_for("A's first ping to B through R's two legs", DEADLINE, || {
            a.ping_once(b.inner)
        });
    }
}

/// The forwarding relay against today's two-leg relay, in one run: A -> B TCP throughput
/// (iperf3), round trip (500 pings at 100/s), and R's sticky-wg CPU while iperf3 ran. Prints
/// `BENCH-RELAY {json}` for scripts/bench-relay.py, which prints the ratios and draws the plots.
#[test]
#[ignore = "benchmark: scripts/bench-relay.py"]
fn bench_relay_forwarding_vs_two_legs() {
    use sticky_testkit::kube_support::cpu_ticks;
    use sticky_testkit::sites_support::{bench_secs, iperf3_mbps, rtt_ms};
    let secs = bench_secs();
    let t = Trio::new("rlb");
    let relay = t._daemons[1].child.id();
    let mut cases = Vec::new();
    let mut measure = |what: &str| {
        let ticks = cpu_ticks(relay);
        let mbps = iperf3_mbps(&t.a.ns.name, None, &t.b.ns.name, t.b.inner, secs);
        let cpu = (cpu_ticks(relay) - ticks) as f64 / 100.0 / f64::from(secs) * 100.0;
        let rtt = rtt_ms(&t.a.ns.name, None, t.b.inner, 500);
        eprintln!("{what}: {mbps:.0} Mbit/s, {rtt:.3} ms, R's sticky-wg {cpu:.1} % of a core");
        cases.push(serde_json::json!({
            "case": what, "mbps": mbps, "rtt_ms": rtt, "relay_cpu_percent": cpu,
        }));
    };
    measure("forwarding relay");
    t.two_legs();
    measure("two-leg relay");
    println!(
        "BENCH-RELAY {}",
        serde_json::json!({"seconds": secs, "cases": cases})
    );
}
