//! A hub of 10,000 sites (issue 37, docs/benchmarks.md "A hub of 10,000 sites"): sticky-wg
//! in namespace a holds a peer for each, configured over its UAPI socket in one request as the
//! agent does; namespace b is the sites' side of the internet, each site a source address of
//! its own (198.18.0.0/15, as sites behind different NATs) speaking WireGuard with gotatun's
//! own protocol state machine (`noise::Tunn`: the load generator). A ping through a site's
//! tunnel is an ICMP echo to the hub's tunnel address, answered by the hub's kernel.

use super::*;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use bytes::BytesMut;
use gotatun::noise::index_table::IndexTable;
use gotatun::noise::rate_limiter::RateLimiter;
use gotatun::noise::{Tunn, TunnResult};
use gotatun::packet::{Packet, WgKind};
use gotatun::x25519::{PublicKey, StaticSecret};

/// The hub's peers.
const SITES: u32 = 10_000;
/// Sites with a tunnel up before the burst, pinging all through it.
const ESTABLISHED: u32 = 50;
/// Sites handshaking at once.
const BURST: u32 = 1_000;
/// WireGuard's REKEY_TIMEOUT: an initiator with no answer sends again after it.
const REKEY_TIMEOUT: Duration = Duration::from_secs(5);

fn secret(i: u32) -> StaticSecret {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&i.to_be_bytes());
    k[31] = 0x40;
    StaticSecret::from(k)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Site `i`'s pod subnet: the `i`-th /26 of 10.64.0.0/10.
fn pod_net(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a40_0000 + (i << 6))
}

/// Site `i`'s public address, in 198.18.0.0/15.
fn public_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc612_0001 + i)
}

/// One request on a UAPI socket; the answer up to its final empty line.
fn uapi(socket: &Path, request: &str) -> String {
    use std::io::Write;
    let mut s = UnixStream::connect(socket).expect("the UAPI socket");
    s.write_all(request.as_bytes()).expect("write the request");
    super::uapi::read_answer(&mut s)
}

/// The Internet checksum of `bytes`.
fn checksum(bytes: &[u8]) -> [u8; 2] {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    (!(sum as u16)).to_be_bytes()
}

/// An ICMP echo request from `src` to `dst`, its sequence number `seq`.
fn echo(src: Ipv4Addr, dst: Ipv4Addr, seq: u16) -> Vec<u8> {
    let mut p = vec![0u8; 36];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&36u16.to_be_bytes());
    p[8] = 64;
    p[9] = 1;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let c = checksum(&p[..20]);
    p[10..12].copy_from_slice(&c);
    p[20] = 8;
    p[24..26].copy_from_slice(&0x5354u16.to_be_bytes());
    p[26..28].copy_from_slice(&seq.to_be_bytes());
    p[28..36].copy_from_slice(b"stickycn");
    let c = checksum(&p[20..]);
    p[22..24].copy_from_slice(&c);
    p
}

/// One site of the load generator.
struct Site {
    i: u32,
    tunn: Tunn,
    sock: UdpSocket,
    /// When its last handshake initiation went out, and how many it sent.
    initiated: Option<Instant>,
    initiations: u32,
    /// When its session came up.
    up: Option<Instant>,
    echoes_sent: u32,
    echoes_answered: u32,
}

impl Site {
    fn send(&self, packet: impl Into<Packet>, hub: SocketAddr) {
        let packet: Packet = packet.into();
        // A full send buffer is a lost datagram, as on a wire.
        let _ = self.sock.send_to(&packet, hub);
    }

    fn initiate(&mut self, hub: SocketAddr) {
        if let Some(p) = self.tunn.format_handshake_initiation(true) {
            self.send(p, hub);
            self.initiated = Some(Instant::now());
            self.initiations += 1;
        }
    }

    fn ping(&mut self, hub: SocketAddr, to: Ipv4Addr) {
        let src = Ipv4Addr::from(u32::from(pod_net(self.i)) + 1);
        let bytes = echo(src, to, self.echoes_sent as u16);
        let packet = Packet::from_bytes(BytesMut::from(&bytes[..]));
        if let Ok(p) = self.tunn.encapsulate_with_session(packet) {
            self.send(p, hub);
            self.echoes_sent += 1;
        }
    }

    /// Takes every datagram waiting on its socket.
    fn receive(&mut self, hub: SocketAddr) {
        let mut buf = [0u8; 2048];
        while let Ok(n) = self.sock.recv(&mut buf) {
            let packet = Packet::from_bytes(BytesMut::from(&buf[..n]));
            let Ok(kind) = packet.try_into_wg() else {
                continue;
            };
            let response = matches!(kind, WgKind::HandshakeResp(_));
            match self.tunn.handle_incoming_packet(kind) {
                TunnResult::WriteToNetwork(p) => {
                    if response && self.up.is_none() {
                        self.up = Some(Instant::now());
                    }
                    self.send(p, hub);
                }
                TunnResult::WriteToTunnel(p) => {
                    let b: &[u8] = &p;
                    if b.len() >= 28 && b[9] == 1 && b[20] == 0 {
                        self.echoes_answered += 1;
                    }
                }
                TunnResult::Done | TunnResult::Err(_) => {}
            }
        }
    }
}

/// Runs the generator's loop until `done` or `deadline`: every socket read, every site with a
/// handshake unanswered for [`REKEY_TIMEOUT`] initiating again, every established site pinging
/// every 50 ms.
fn drive(
    sites: &mut [Site],
    hub: SocketAddr,
    to: Ipv4Addr,
    pingers: std::ops::Range<usize>,
    deadline: Duration,
    mut done: impl FnMut(&[Site]) -> bool,
) -> bool {
    let start = Instant::now();
    let ping_every = Duration::from_millis(50);
    let mut pinged = Instant::now();
    while start.elapsed() < deadline {
        for s in sites.iter_mut() {
            s.receive(hub);
            if s.up.is_none() && s.initiated.is_some_and(|t| t.elapsed() >= REKEY_TIMEOUT) {
                s.initiate(hub);
            }
        }
        if pinged.elapsed() >= ping_every {
            for s in &mut sites[pingers.clone()] {
                s.ping(hub, to);
            }
            pinged = Instant::now();
        }
        if done(sites) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// `cargo test --release -p sticky-wg --test daemon -- --ignored --nocapture
/// bench_hub_of_10000_sites`, as root (scripts/bench-hub.sh).
#[test]
#[ignore = "benchmark: scripts/bench-hub.sh"]
fn bench_hub_of_10000_sites() {
    prerequisites("bench_hub_of_10000_sites");
    let pair = Pair::started("hb");
    let (a, b) = (&pair.a, &pair.b);
    let socket = Path::new(SOCKET_DIR).join(format!("{}.sock", a.ifname));
    let hub_secret = StaticSecret::from([7u8; 32]);
    let hub_public = PublicKey::from(&hub_secret);

    // Configured from nothing: key, port and 10,000 peers in one request.
    let mut request = format!(
        "set=1\nprivate_key={}\nlisten_port=51820\n",
        hex(hub_secret.as_bytes())
    );
    let publics: Vec<PublicKey> = (0..SITES).map(|i| PublicKey::from(&secret(i))).collect();
    for (i, p) in (0..SITES).zip(&publics) {
        request.push_str(&format!(
            "public_key={}\nreplace_allowed_ips=true\nallowed_ip={}/26\n",
            hex(p.as_bytes()),
            pod_net(i)
        ));
    }
    request.push('\n');
    let t = Instant::now();
    let answer = uapi(&socket, &request);
    let configured = t.elapsed();
    assert!(answer.ends_with("errno=0\n\n"), "{answer}");
    let t = Instant::now();
    let state = uapi(&socket, "get=1\n\n");
    let read_back = t.elapsed();
    let peers = state
        .lines()
        .filter(|l| l.starts_with("public_key="))
        .count();
    assert_eq!(peers, SITES as usize);

    // The hub's tunnel address, the sites' subnets into the tunnel, the sites' public side.
    a.ns.exec(&["ip", "addr", "add", "192.0.2.1/32", "dev", &a.ifname]);
    a.ns.exec(&["ip", "link", "set", &a.ifname, "mtu", "1420", "up"]);
    a.ns.exec(&["ip", "route", "add", "10.64.0.0/10", "dev", &a.ifname]);
    a.ns.exec(&["ip", "route", "add", "198.18.0.0/15", "via", "198.51.100.2"]);
    let batch = pair.dir.path().join("addresses");
    let lines: String = (0..ESTABLISHED + BURST)
        .map(|i| format!("address add {}/32 dev u0\n", public_ip(i)))
        .collect();
    std::fs::write(&batch, lines).expect("the address batch");
    b.ns.exec(&["ip", "-batch", batch.to_str().expect("a path")]);

    let hub: SocketAddr = (Ipv4Addr::new(198, 51, 100, 1), 51820).into();
    let to = Ipv4Addr::new(192, 0, 2, 1);
    let table = IndexTable::from_os_rng();
    let mut sites: Vec<Site> = sticky_netlink::netns::run_in(Path::new(&b.ns.path()), || {
        (0..ESTABLISHED + BURST)
            .map(|i| {
                let sock = UdpSocket::bind((public_ip(i), 0)).expect("a site's socket");
                sock.set_nonblocking(true).expect("nonblocking");
                let own = secret(i);
                let limiter = Arc::new(RateLimiter::new(&PublicKey::from(&own), 100));
                Site {
                    i,
                    tunn: Tunn::new(own, hub_public, None, None, table.clone(), limiter),
                    sock,
                    initiated: None,
                    initiations: 0,
                    up: None,
                    echoes_sent: 0,
                    echoes_answered: 0,
                }
            })
            .collect()
    })
    .expect("the sites' namespace");
    let established = 0..ESTABLISHED as usize;
    let burst = ESTABLISHED as usize..sites.len();

    // The established sites: up, and answering pings.
    for s in &mut sites[established.clone()] {
        s.initiate(hub);
    }
    let ok = drive(&mut sites, hub, to, established.clone(), DEADLINE, |s| {
        s[established.clone()].iter().all(|s| s.echoes_answered > 0)
    });
    assert!(
        ok,
        "the established sites' tunnels came up and answered pings"
    );
    let before: Vec<(u32, u32)> = sites[established.clone()]
        .iter()
        .map(|s| (s.echoes_sent, s.echoes_answered))
        .collect();

    // 1,000 sites at once.
    let wg_pid = pair.da.as_ref().expect("the hub's daemon").child.id();
    let cpu_ticks = sticky_testkit::kube_support::cpu_ticks;
    let (ticks0, t0) = (cpu_ticks(wg_pid), Instant::now());
    for s in &mut sites[burst.clone()] {
        s.initiate(hub);
    }
    let ok = drive(
        &mut sites,
        hub,
        to,
        established.clone(),
        Duration::from_secs(120),
        |s| s[burst.clone()].iter().all(|s| s.up.is_some()),
    );
    let all_up = t0.elapsed();
    let cpu = (cpu_ticks(wg_pid) - ticks0) as f64 / 100.0;
    let up = sites[burst.clone()]
        .iter()
        .filter(|s| s.up.is_some())
        .count();
    assert!(
        ok,
        "{up} of {BURST} sites' handshakes answered within 120 s"
    );
    // The established keep pinging for a second after, then the last answers come in.
    let settle = Duration::from_secs(1);
    drive(&mut sites, hub, to, established.clone(), settle, |_| false);
    drive(&mut sites, hub, to, 0..0, settle, |_| false);
    let retried = sites[burst.clone()]
        .iter()
        .filter(|s| s.initiations > 1)
        .count();
    let mut latencies: Vec<Duration> = sites[burst.clone()]
        .iter()
        .filter_map(|s| Some(s.up? - t0))
        .collect();
    latencies.sort();
    let (sent, answered) = sites[established.clone()]
        .iter()
        .zip(&before)
        .map(|(s, b)| (s.echoes_sent - b.0, s.echoes_answered - b.1))
        .fold((0, 0), |(x, y), (s, a)| (x + s, y + a));

    // Every site's tunnel carries a ping: the burst's and the established ones', no new
    // handshake for the established.
    for s in &mut sites {
        s.echoes_answered = 0;
    }
    let everyone = 0..sites.len();
    let ok = drive(&mut sites, hub, to, everyone, DEADLINE, |s| {
        s.iter().all(|s| s.echoes_answered > 0)
    });
    let silent = sites.iter().filter(|s| s.echoes_answered == 0).count();
    assert!(ok, "{silent} sites' tunnels answer no ping after the burst");
    let rehandshaked = sites[established.clone()]
        .iter()
        .filter(|s| s.initiations > 1)
        .count();
    assert_eq!(
        rehandshaked, 0,
        "no established site needed a new handshake"
    );
    let rss = super::uapi::proc_status(wg_pid, "VmRSS:");
    println!(
        "BENCH sticky-wg hub of {SITES} peers: configured from nothing in one UAPI request {:.0} ms; \
         read back {:.0} ms ({} bytes); {BURST} sites handshaking at once all up in {:.2} s \
         (median {:.0} ms, slowest {:.0} ms, {retried} sent again after {REKEY_TIMEOUT:?}), \
         sticky-wg CPU {cpu:.2} s meanwhile; {ESTABLISHED} established sites' pings during it and \
         1 s after: {answered} of {sent} answered, none handshaked again; resident {rss} kB",
        configured.as_secs_f64() * 1000.0,
        read_back.as_secs_f64() * 1000.0,
        state.len(),
        all_up.as_secs_f64(),
        latencies[latencies.len() / 2].as_secs_f64() * 1000.0,
        latencies[latencies.len() - 1].as_secs_f64() * 1000.0,
    );
}
