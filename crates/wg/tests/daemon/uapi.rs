//! sticky-wg never wedges (issue 36): what a client sends on the UAPI socket, through Debian's
//! `wg` and a raw Unix socket, never panics it, never leaves it alive and deaf, is answered with
//! `errno=` when refused (and changes nothing), and never costs it memory or threads beyond its
//! bounds. Each test ran first against main's build (`STICKY_WG_BIN`) and failed there.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Output};

use sticky_testkit::kube_support::wait_for;
use sticky_testkit::support::netns::{Netns, sh};
use sticky_testkit::support::scratch::temp_dir;
use tempfile::TempDir;

use super::{DEADLINE, Daemon, Pair, SOCKET_DIR, prerequisites, unique};

/// A public key for peers that never answer (32 bytes of 7, base64 and hex).
const PEER: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const PEER_HEX: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const OTHER_HEX: &str = "0808080808080808080808080808080808080808080808080808080808080808";

/// One namespace, one sticky-wg serving an empty device. Dropped in field order: the daemon is
/// killed (and its socket removed) before the namespace, and with it the TUN, goes.
struct Lone {
    daemon: Option<Daemon>,
    ns: Netns,
    ifname: String,
    dir: TempDir,
}

impl Lone {
    fn started(tag: &str) -> Lone {
        let ns = Netns::new(tag);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        let mut lone = Lone {
            daemon: None,
            ifname: format!("{tag}{}", std::process::id()),
            ns,
            dir: temp_dir(),
        };
        lone.daemon = Some(lone.start());
        lone
    }

    /// Starts a daemon on the device and waits until `wg show` answers on its socket.
    fn start(&self) -> Daemon {
        let log = unique(self.dir.path().join("sticky-wg.log"));
        let daemon = Daemon::start(&self.ns, &self.ifname, log);
        wait_for("sticky-wg to say it serves", DEADLINE, || {
            daemon.log().contains("sticky-wg: serving")
        });
        wait_for("`wg show` to answer", DEADLINE, || self.wg_answers());
        daemon
    }

    /// Key, port and one peer, with Debian's `wg`, as the agent configures a gateway.
    fn keyed(tag: &str) -> Lone {
        let lone = Lone::started(tag);
        let key = lone.dir.path().join("wg.key");
        let key_file = key.display();
        sh(&["sh", "-c", &format!("umask 077; wg genkey > {key_file}")]);
        let key = key.to_string_lossy();
        lone.wg_ok(&[
            "set",
            &lone.ifname,
            "private-key",
            &key,
            "listen-port",
            "51820",
            "peer",
            PEER,
            "endpoint",
            "198.51.100.2:51820",
            "allowed-ips",
            "192.0.2.2/32",
        ]);
        lone
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("a daemon")
    }

    fn pid(&self) -> u32 {
        self.daemon().child.id()
    }

    fn socket(&self) -> PathBuf {
        PathBuf::from(SOCKET_DIR).join(format!("{}.sock", self.ifname))
    }

    fn wg(&self, args: &[&str]) -> Output {
        super::wg_in(&self.ns, args)
    }

    fn wg_ok(&self, args: &[&str]) -> String {
        let out = self.wg(args);
        assert!(
            out.status.success(),
            "wg {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.daemon().log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wg_answers(&self) -> bool {
        self.wg(&["show", &self.ifname]).status.success()
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(self.socket()).expect("connecting to the UAPI socket");
        s.set_read_timeout(Some(DEADLINE)).expect("read timeout");
        s
    }

    /// One raw request; the answer up to its empty line (or what came before the close).
    fn request(&self, text: &str) -> String {
        let mut s = self.connect();
        s.write_all(text.as_bytes()).expect("writing the request");
        read_answer(&mut s)
    }
}

/// Reads until an answer's `errno=N` line and empty line, the close, or an error. Looks at
/// the answer's tail only: a hub's answer is megabytes (tests/daemon/hub.rs).
pub(super) fn read_answer(s: &mut UnixStream) -> String {
    let complete = |out: &[u8]| {
        out.strip_suffix(b"\n\n").is_some_and(|body| {
            body.rsplit(|b| *b == b'\n')
                .next()
                .is_some_and(|last| last.starts_with(b"errno="))
        })
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while !complete(&out) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A number from /proc/PID/status (`VmRSS:` in kB, `Threads:`).
pub(super) fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_peer_set_before_the_key_is_kept_and_the_tunnel_comes_up_with_the_key() {
    prerequisites("sticky-wg peer before key");
    let pair = Pair::started("wgk");
    let (a, b) = (&pair.a, &pair.b);
    // A node before the agent's round: the peer first, no key yet (wireguard-go takes it).
    a.wg_ok(&[
        "set",
        &a.ifname,
        "peer",
        &b.public,
        "endpoint",
        "198.51.100.2:51820",
        "allowed-ips",
        "192.0.2.2/32",
    ]);
    let show = a.wg(&["show", &a.ifname, "allowed-ips"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.status.success() && text.contains(&b.public) && text.contains("192.0.2.2/32"),
        "wg show after a peer before the key: {text} {}",
        String::from_utf8_lossy(&show.stderr)
    );
    // Then the key and port: the held peer is configured with them, and traffic flows.
    let key = a.key.to_string_lossy();
    a.wg_ok(&[
        "set",
        &a.ifname,
        "private-key",
        &key,
        "listen-port",
        "51820",
    ]);
    b.configure(a);
    a.address_and_route(b);
    b.address_and_route(a);
    pair.wait_ping("a ping through a tunnel whose peer came before its key");
    let log = pair.da.as_ref().expect("daemon a").log();
    assert!(
        log.contains("1 peer(s) held until then are configured"),
        "{log}"
    );
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_new_port_or_fwmark_on_a_running_tunnel_is_applied_on_a_fresh_device_and_traffic_resumes() {
    prerequisites("sticky-wg running settings");
    let pair = Pair::new("wgf");
    let a = &pair.a;
    let before = a.index();
    for (args, shows, says) in [
        (["fwmark", "7"], "fwmark", "0x7"),
        (["listen-port", "51821"], "listen-port", "51821"),
    ] {
        a.wg_ok(&[&["set", a.ifname.as_str()][..], &args[..]].concat());
        let shown = wait_for(
            &format!("`wg show {shows}` to say {says}"),
            DEADLINE,
            || {
                let out = a.wg(&["show", &a.ifname, shows]);
                String::from_utf8_lossy(&out.stdout).trim() == says
            },
        );
        let pinged = pair.wait_ping(&format!("a ping after wg set {args:?}"));
        eprintln!("wg set {args:?}: shown after {shown:?}, a ping crossed {pinged:?} later");
    }
    // The same TUN, the peer kept with its allowed IP.
    assert_eq!(a.index(), before);
    let ips = a.wg(&["show", &a.ifname, "allowed-ips"]);
    assert!(String::from_utf8_lossy(&ips.stdout).contains("192.0.2.2/32"));
    let log = pair.da.as_ref().expect("daemon a").log();
    assert!(
        log.contains("the fwmark changes") && log.contains("the listen port changes"),
        "{log}"
    );
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn malformed_requests_answer_errno_change_nothing_and_the_daemon_answers_after() {
    prerequisites("sticky-wg malformed UAPI");
    let lone = Lone::keyed("wgm");
    let before = lone.wg_ok(&["show", &lone.ifname, "dump"]);
    let cases: Vec<(&str, String, i32)> = vec![
        (
            "bad hex",
            format!("set=1\nprivate_key={}\n\n", "zz".repeat(32)),
            22,
        ),
        ("port 70000", "set=1\nlisten_port=70000\n\n".into(), 22),
        (
            "a host name as endpoint",
            format!("set=1\npublic_key={PEER_HEX}\nendpoint=gw.example.com:51820\n\n"),
            22,
        ),
        (
            "/99",
            format!("set=1\npublic_key={PEER_HEX}\nallowed_ip=192.0.2.0/99\n\n"),
            22,
        ),
        (
            "protocol_version=2",
            "set=1\nprotocol_version=2\n\n".into(),
            22,
        ),
        ("not key=value", "set=1\nlisten_port\n\n".into(), 71),
        ("an unknown operation", "hello=1\n\n".into(), 22),
        ("a key in get", "get=1\nlisten_port=1\n\n".into(), 22),
        // A mark and a port for the running tunnel (main applied the mark, answered 22 and
        // left the tunnel down) with a bad endpoint: nothing, and no fresh device either.
        (
            "fwmark=7 and a new port with a host name",
            format!(
                "set=1\nfwmark=7\nlisten_port=51821\npublic_key={PEER_HEX}\n\
                 endpoint=gw.example.com:1\n\n"
            ),
            22,
        ),
        (
            "a good peer, then a bad one: neither is applied",
            format!(
                "set=1\npublic_key={OTHER_HEX}\nallowed_ip=192.0.2.8/32\n\
                 public_key={PEER_HEX}\nallowed_ip=192.0.2.7/33\n\n"
            ),
            22,
        ),
    ];
    for (what, text, errno) in &cases {
        let answer = lone.request(text);
        assert_eq!(
            answer,
            format!("errno={errno}\n\n"),
            "{what}: {text:?}\n{}",
            lone.daemon().log()
        );
        assert!(lone.wg_answers(), "{what}: `wg show` no longer answers");
    }
    // Debian's wg fails too (it prints a positive errno as "Unknown error -22", wireguard-go's
    // as well).
    let out = lone.wg(&[
        "set",
        &lone.ifname,
        "peer",
        PEER,
        "allowed-ips",
        "192.0.2.0/99",
    ]);
    assert!(!out.status.success());
    assert_eq!(
        lone.wg_ok(&["show", &lone.ifname, "dump"]),
        before,
        "a refused request changed the device"
    );
    assert_eq!(lone.wg_ok(&["show", &lone.ifname, "fwmark"]).trim(), "off");
    // The same key and port again (the agent sends them every round) are fine.
    let get = lone.request("get=1\n\n");
    let key_line = get
        .lines()
        .find(|l| l.starts_with("private_key="))
        .expect("a private_key line")
        .to_string();
    assert_eq!(
        lone.request(&format!("set=1\n{key_line}\nlisten_port=51820\n\n")),
        "errno=0\n\n"
    );
}

/// A process holding a UDP port in a namespace; killed on drop.
struct PortHolder(std::process::Child);

impl PortHolder {
    fn hold(ns: &Netns, port: u16) -> PortHolder {
        use std::io::{BufRead, BufReader};
        let script = format!(
            "import socket, time\n\
             s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
             s.bind(('::', {port})); print('ready', flush=True); time.sleep(600)\n"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 (apt-get install python3)");
        let mut ready = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut ready)
            .expect("the holder's first line");
        assert_eq!(ready.trim(), "ready");
        PortHolder(child)
    }
}

impl Drop for PortHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_key_whose_port_is_taken_is_refused_with_eaddrinuse_and_not_applied() {
    prerequisites("sticky-wg port in use");
    let lone = Lone::started("wgu");
    let holder = PortHolder::hold(&lone.ns, 51820);
    let key = "4".repeat(64);
    let text = format!("set=1\nprivate_key={key}\nlisten_port=51820\npublic_key={PEER_HEX}\n\n");
    assert_eq!(lone.request(&text), "errno=98\n\n");
    // Nothing applied: no key, and the peer still waits for one.
    assert_eq!(
        lone.wg_ok(&["show", &lone.ifname, "private-key"]).trim(),
        "(none)"
    );
    drop(holder);
    assert_eq!(lone.request(&text), "errno=0\n\n");
    assert_eq!(
        lone.wg_ok(&["show", &lone.ifname, "listen-port"]).trim(),
        "51820"
    );
    assert_eq!(lone.wg_ok(&["show", &lone.ifname, "peers"]).trim(), PEER);
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_200_mb_line_is_refused_with_e2big_and_memory_stays_bounded() {
    prerequisites("sticky-wg huge line");
    let lone = Lone::started("wgh");
    let pid = lone.pid();
    let rss_before = proc_status(pid, "VmRSS:");
    let mut s = lone.connect();
    let chunk = vec![b'1'; 1 << 20];
    let mut sent = 0usize;
    let mut write = |bytes: &[u8]| s.write_all(bytes).is_ok();
    if write(b"set=1\nlisten_port=") {
        while sent < 200 << 20 && write(&chunk) {
            sent += chunk.len();
        }
    }
    let rss_after = proc_status(pid, "VmRSS:");
    let answer = read_answer(&mut s);
    eprintln!(
        "huge line: {} MiB written before the daemon closed; VmRSS {rss_before} kB before, \
         {rss_after} kB after",
        sent >> 20
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "VmRSS grew from {rss_before} kB to {rss_after} kB on one line"
    );
    assert_eq!(answer, "errno=7\n\n");
    assert!(sent < 200 << 20, "the daemon read all 200 MiB of one line");
    assert!(lone.wg_answers(), "`wg show` after the huge line");
}

/// `set=1` adding peers `from..to` (distinct keys from their numbers), each with an allowed IP.
fn peers_request(from: u32, to: u32) -> String {
    let mut text = String::from("set=1\n");
    for i in from..to {
        let [_, x, y, z] = i.to_be_bytes();
        let key = format!("{i:08x}").repeat(8);
        text.push_str(&format!("public_key={key}\nallowed_ip=10.{x}.{y}.{z}/32\n"));
    }
    text.push('\n');
    text
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn the_peer_cap_refuses_with_enospc_and_changes_nothing() {
    prerequisites("sticky-wg peer cap");
    let lone = Lone::started("wgn");
    // One request over the cap, then one at it, then one more peer (held: no key yet).
    assert_eq!(lone.request(&peers_request(0, 65_537)), "errno=28\n\n");
    assert_eq!(lone.request(&peers_request(0, 65_536)), "errno=0\n\n");
    assert_eq!(lone.request(&peers_request(65_536, 65_537)), "errno=28\n\n");
    let peers = lone.wg_ok(&["show", &lone.ifname, "peers"]);
    assert_eq!(peers.lines().count(), 65_536);
    eprintln!(
        "peer cap: VmHWM {} kB, VmRSS {} kB after 65,536 peers held",
        proc_status(lone.pid(), "VmHWM:"),
        proc_status(lone.pid(), "VmRSS:")
    );
    // Replacing them all is fine at the cap.
    let replace = peers_request(0, 1).replacen("set=1\n", "set=1\nreplace_peers=true\n", 1);
    assert_eq!(lone.request(&replace), "errno=0\n\n");
    assert_eq!(
        lone.wg_ok(&["show", &lone.ifname, "peers"]).lines().count(),
        1
    );
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn idle_connections_are_capped_without_threads_and_time_out() {
    prerequisites("sticky-wg idle connections");
    let lone = Lone::started("wgi");
    let pid = lone.pid();
    let threads_before = proc_status(pid, "Threads:");
    let conns: Vec<UnixStream> = (0..2000).map(|_| lone.connect()).collect();
    for c in &conns {
        c.set_nonblocking(true).expect("nonblocking");
    }
    let closed = || conns.iter().filter(|c| is_closed(c)).count();
    // Either the daemon closes those over the cap, or (main) it spawns a thread for each.
    let mut threads = threads_before;
    wait_for("the daemon to take the 2000 connections", DEADLINE, || {
        threads = proc_status(pid, "Threads:");
        closed() >= 2000 - 16 || threads > threads_before + 100
    });
    eprintln!("2000 idle connections: Threads {threads_before} before, {threads} after");
    assert!(
        threads <= threads_before + 2,
        "Threads grew from {threads_before} to {threads}"
    );
    // The 16 it serves are closed when idle, and then `wg show` answers again.
    let back = wait_for("`wg show` once the idle ones time out", DEADLINE, || {
        lone.wg_answers()
    });
    eprintln!("`wg show` answered again {back:?} after");
    wait_for("every idle connection closed", DEADLINE, || {
        closed() == 2000
    });
    assert!(
        lone.daemon()
            .log()
            .contains("UAPI connections open; closed")
    );
}

/// True when the daemon closed this non-blocking stream (a read does not block).
fn is_closed(mut c: &UnixStream) -> bool {
    match c.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[cfg(feature = "crash-points")]
#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_panic_ends_the_process_and_a_new_daemon_takes_over_the_device() {
    use std::os::unix::process::ExitStatusExt;
    prerequisites("sticky-wg panic");
    let mut lone = Lone::started("wgp");
    let mut s = lone.connect();
    s.write_all(b"panic=1\n").expect("writing");
    let mut daemon = lone.daemon.take().expect("daemon");
    let status = daemon.wait_exit();
    // Its socket file is the next daemon's path: not removed when this one is dropped.
    daemon.socket = PathBuf::new();
    let log = daemon.log();
    assert_eq!(status.signal(), Some(libc_sigabrt()), "{status}: {log}");
    assert!(
        log.contains("crash point: panic=1") && log.contains("aborting so that it is restarted"),
        "{log}"
    );
    assert!(
        lone.socket().exists(),
        "the dead daemon's socket file stays"
    );
    lone.daemon = Some(lone.start());
    let log = lone.daemon().log();
    assert!(log.contains("removed stale socket"), "{log}");
}

#[cfg(feature = "crash-points")]
fn libc_sigabrt() -> i32 {
    nix::sys::signal::Signal::SIGABRT as i32
}
