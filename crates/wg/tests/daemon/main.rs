//! sticky-wg driven as its systemd unit and the agent drive it: the binary in network
//! namespaces, configured only through Debian's `wg` (the standard UAPI socket) and `ip`.
//! Two namespaces joined by a veth (198.51.100.1/.2), one sticky-wg in each, tunnel addresses
//! 192.0.2.1 <-> 192.0.2.2. Root tests are `#[ignore = "needs root: ..."]`: without
//! `--include-ignored` they are reported as skipped; with it, a missing root or `wg`
//! (wireguard-tools) fails them with what to install.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

mod hub;
mod relay;
mod uapi;

use sticky_testkit::kube_support::wait_for;
use sticky_testkit::support::bins::{assert_installed, assert_root};
use sticky_testkit::support::netns::{Netns, sh};
use sticky_testkit::support::scratch::temp_dir;
use tempfile::TempDir;

/// Where Debian's `wg` looks for userspace sockets (compiled in; it has no option for it).
const SOCKET_DIR: &str = "/var/run/wireguard";
/// Generous for a loaded 2-core machine: these events take milliseconds.
const DEADLINE: Duration = Duration::from_secs(60);

/// The daemon these tests drive: this build, or the one `STICKY_WG_BIN` names (an older build,
/// to see a test fail where the fix is missing).
fn bin() -> String {
    std::env::var("STICKY_WG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sticky-wg").to_string())
}

fn prerequisites(what: &str) {
    assert_root(what);
    assert_installed("wg", "wireguard-tools");
}

/// A running sticky-wg in a namespace, its stderr in a file; killed (SIGKILL) on drop, and its
/// socket file removed (the socket directory is the host's /var/run/wireguard).
struct Daemon {
    child: Child,
    log: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start(ns: &Netns, ifname: &str, log: PathBuf) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, &bin(), ifname])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("daemon log"))
            .spawn()
            .expect("spawning sticky-wg");
        let socket = Path::new(SOCKET_DIR).join(format!("{ifname}.sock"));
        Daemon { child, log, socket }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).expect("signalling sticky-wg");
    }

    /// SIGKILL, as a crash: the socket file stays behind (stale) for the next daemon to find.
    fn crash(mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait_exit();
        self.socket = PathBuf::new();
    }

    /// Waits (with the deadline) for the process to exit.
    fn wait_exit(&mut self) -> ExitStatus {
        let mut status = None;
        wait_for("sticky-wg to exit", DEADLINE, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        status.expect("exited")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One end: a namespace, its underlay address, its TUN's name and address, its key.
/// Debian's `wg <args>` in namespace `ns`.
fn wg_in(ns: &Netns, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &ns.name, "wg"])
        .args(args)
        .output()
        .expect("running wg")
}

struct Side {
    ns: Netns,
    ifname: String,
    under: &'static str,
    inner: &'static str,
    key: PathBuf,
    public: String,
}

impl Side {
    /// Side `n` of test `tag`: a namespace with loopback up, underlay and tunnel addresses
    /// `(under, inner)`, a key made with `wg genkey` in `dir`.
    fn new(tag: &str, n: &str, (under, inner): (&'static str, &'static str), dir: &Path) -> Side {
        let ns = Netns::new(&format!("{tag}{n}"));
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        let key = dir.join(format!("{n}.key"));
        let key_file = key.display();
        sh(&["sh", "-c", &format!("umask 077; wg genkey > {key_file}")]);
        let public = sh(&["sh", "-c", &format!("wg pubkey < {key_file}")]);
        Side {
            ns,
            // Unique per test and process: the socket directory is the host's, shared by all
            // namespaces.
            ifname: format!("{tag}{n}{}", std::process::id()),
            under,
            inner,
            key,
            public: public.trim().to_string(),
        }
    }

    fn wg(&self, args: &[&str]) -> Output {
        wg_in(&self.ns, args)
    }

    /// `wg <args>`, which must succeed: its stdout.
    fn wg_ok(&self, args: &[&str]) -> String {
        let out = self.wg(args);
        assert!(
            out.status.success(),
            "wg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wg_answers(&self) -> bool {
        self.wg(&["show", &self.ifname]).status.success()
    }

    fn index(&self) -> Option<u32> {
        let out = Command::new("ip")
            .args([
                "-n",
                &self.ns.name,
                "-o",
                "link",
                "show",
                "dev",
                &self.ifname,
            ])
            .output()
            .expect("ip link");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split(':').next()?.trim().parse().ok()
    }

    fn ping_once(&self, to: &str) -> bool {
        self.ns.try_exec(&["ping", "-c", "1", "-W", "1", to])
    }

    /// What the agent does over UAPI, with `wg set`: key, port, the one peer.
    fn configure(&self, peer: &Side) {
        let endpoint = format!("{}:51820", peer.under);
        let allowed = format!("{}/32", peer.inner);
        let key = self.key.to_string_lossy();
        let out = self.wg(&[
            "set",
            &self.ifname,
            "private-key",
            &key,
            "listen-port",
            "51820",
            "peer",
            &peer.public,
            "endpoint",
            &endpoint,
            "allowed-ips",
            &allowed,
        ]);
        assert!(
            out.status.success(),
            "wg set {}: {}",
            self.ifname,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What the agent does with netlink: address, MTU, up, the route to the other side.
    fn address_and_route(&self, peer: &Side) {
        let ns = &self.ns;
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/32", self.inner),
            "dev",
            &self.ifname,
        ]);
        ns.exec(&["ip", "link", "set", &self.ifname, "mtu", "1420", "up"]);
        ns.exec(&[
            "ip",
            "route",
            "add",
            &format!("{}/32", peer.inner),
            "dev",
            &self.ifname,
        ]);
    }
}

/// Two namespaces, a veth between them, a sticky-wg in each, configured and talking.
struct Pair {
    a: Side,
    b: Side,
    da: Option<Daemon>,
    db: Option<Daemon>,
    dir: TempDir,
}

impl Pair {
    /// Two sides configured and talking (a ping crossed).
    fn new(tag: &str) -> Pair {
        let pair = Pair::started(tag);
        pair.a.configure(&pair.b);
        pair.b.configure(&pair.a);
        pair.a.address_and_route(&pair.b);
        pair.b.address_and_route(&pair.a);
        pair.wait_ping("the first ping through the tunnel");
        pair
    }

    /// Two sides with their daemons serving empty devices.
    fn started(tag: &str) -> Pair {
        let dir = temp_dir();
        let a = Side::new(tag, "a", ("198.51.100.1", "192.0.2.1"), dir.path());
        let b = Side::new(tag, "b", ("198.51.100.2", "192.0.2.2"), dir.path());
        sh(&[
            "ip", "link", "add", "u0", "netns", &a.ns.name, "type", "veth", "peer", "name", "u0",
            "netns", &b.ns.name,
        ]);
        for s in [&a, &b] {
            s.ns.exec(&["ip", "addr", "add", &format!("{}/24", s.under), "dev", "u0"]);
            s.ns.exec(&["ip", "link", "set", "u0", "up"]);
        }
        let mut pair = Pair {
            a,
            b,
            da: None,
            db: None,
            dir,
        };
        pair.da = Some(pair.start(true));
        pair.db = Some(pair.start(false));
        pair
    }

    /// Starts the daemon of side a (or b) (see [`serve`]).
    fn start(&self, a: bool) -> Daemon {
        let (side, n) = if a { (&self.a, "a") } else { (&self.b, "b") };
        serve(side, self.dir.path(), n)
    }

    fn wait_ping(&self, what: &str) -> Duration {
        wait_for(what, DEADLINE, || self.a.ping_once(self.b.inner))
    }
}

/// Starts `side`'s daemon (its log `sticky-wg-<n>.log` in `dir`) and waits until it says it
/// serves, then until `wg show` answers on its socket. (Not `wg show` first: on a stale socket
/// `wg` unlinks the file itself, racing the daemon's own stale-socket check.)
fn serve(side: &Side, dir: &Path, n: &str) -> Daemon {
    let log = unique(dir.join(format!("sticky-wg-{n}.log")));
    let daemon = Daemon::start(&side.ns, &side.ifname, log);
    wait_for("sticky-wg to say it serves", DEADLINE, || {
        daemon.log().contains("sticky-wg: serving")
    });
    wait_for(
        &format!("`wg show {}` to answer", side.ifname),
        DEADLINE,
        || side.wg_answers(),
    );
    daemon
}

/// A path that does not exist yet (`path`, or `path.N`).
fn unique(path: PathBuf) -> PathBuf {
    (0..)
        .map(|i| PathBuf::from(format!("{}.{i}", path.display())))
        .find(|p| !p.exists())
        .expect("a free name")
}

/// A TCP round trip through the tunnel: a one-shot echo server in b, a client in a.
fn tcp_echo(pair: &Pair) -> String {
    let server = "import socket\n\
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        s.bind(('192.0.2.2', 7000)); s.listen(1); print('ready', flush=True)\n\
        c, _ = s.accept(); c.sendall(b'echo:' + c.recv(100)); c.close()\n";
    let mut child = Command::new("ip")
        .args(["netns", "exec", &pair.b.ns.name, "python3", "-c", server])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (apt-get install python3)");
    let mut ready = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut ready)
        .expect("server's first line");
    let client = "import socket\n\
        s = socket.create_connection(('192.0.2.2', 7000), timeout=20)\n\
        s.sendall(b'over-the-tunnel'); print(s.recv(100).decode())\n";
    let out = Command::new("ip")
        .args(["netns", "exec", &pair.a.ns.name, "python3", "-c", client])
        .output()
        .expect("python3");
    let _ = child.kill();
    let _ = child.wait();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `wg show IF dump`'s peer line: (latest handshake, rx bytes, tx bytes).
fn peer_stats(side: &Side) -> (u64, u64, u64) {
    let out = side.wg(&["show", &side.ifname, "dump"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let peer = text
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no peer in dump: {text:?}"));
    let f: Vec<&str> = peer.split('\t').collect();
    let num = |i: usize| {
        f[i].parse::<u64>()
            .unwrap_or_else(|_| panic!("field {i} of {peer:?}"))
    };
    (num(4), num(5), num(6))
}

#[test]
fn help_version_and_usage_errors() {
    let run = |args: &[&str]| Command::new(bin()).args(args).output().expect("sticky-wg");
    let help = run(&["--help"]);
    assert!(help.status.success());
    assert!(
        String::from_utf8_lossy(&help.stdout)
            .contains("Usage: sticky-wg [--socket-dir DIR] IFNAME")
    );
    let version = run(&["--version"]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("sticky-wg {}", env!("CARGO_PKG_VERSION"))
    );
    for (args, says) in [
        (&[][..], "needs IFNAME"),
        (&["--bogus", "wg0"][..], "\"--bogus\""),
        (&["a", "b"][..], "\"b\""),
        (&["this-name-is-too-long"][..], "\"this-name-is-too-long\""),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.contains("sticky-wg --help"),
            "{args:?}: {err}"
        );
    }
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn two_namespaces_talk_through_sticky_wg_configured_only_with_wg_and_ip() {
    prerequisites("sticky-wg tunnel");
    let pair = Pair::new("wgt");
    assert_eq!(tcp_echo(&pair), "echo:over-the-tunnel");
    for side in [&pair.a, &pair.b] {
        let (handshake, rx, tx) = peer_stats(side);
        assert!(
            handshake > 0,
            "{}: no handshake in wg show dump",
            side.ifname
        );
        assert!(rx > 0 && tx > 0, "{}: rx {rx} tx {tx}", side.ifname);
    }
    let kind = pair
        .a
        .ns
        .exec(&["ip", "-d", "link", "show", &pair.a.ifname]);
    assert!(
        kind.contains("tun type tun pi off") && kind.contains("persist on"),
        "{kind}"
    );
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_deleted_device_is_made_again_and_serves_wg_show_again() {
    prerequisites("sticky-wg device deleted");
    let pair = Pair::new("wgd");
    let before = pair.a.index().expect("the TUN's index");
    pair.a.ns.exec(&["ip", "link", "del", &pair.a.ifname]);
    let back = wait_for("the TUN made again with a new index", DEADLINE, || {
        pair.a.index().is_some_and(|i| i != before)
    });
    wait_for("`wg show` to answer again", DEADLINE, || {
        pair.a.wg_answers()
    });
    let out = pair.a.wg(&["show", &pair.a.ifname, "peers"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "a fresh device has no peers"
    );
    eprintln!("device back after {back:?} (the watch polls every 200 ms)");
    let log = pair.da.as_ref().expect("daemon a").log();
    assert!(
        log.contains("lost (the link was deleted)") && log.contains("is back"),
        "{log}"
    );
    pair.a.configure(&pair.b);
    pair.a.address_and_route(&pair.b);
    pair.wait_ping("a ping after the device was made again and configured");
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_restarted_sticky_wg_finds_its_tun_with_address_and_route_and_traffic_resumes() {
    prerequisites("sticky-wg restart");
    let mut pair = Pair::new("wgr");
    let index = pair.a.index().expect("the TUN's index");
    // b pings a at 100/s for 8 s while a's daemon is killed, started again and reconfigured.
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pair.b.ns.name,
            "ping",
            "-c",
            "800",
            "-i",
            "0.01",
            "-W",
            "1",
        ])
        .arg(pair.a.inner)
        .stdout(Stdio::piped())
        .spawn()
        .expect("ping");
    wait_for("b's ping to get replies", DEADLINE, || {
        peer_stats(&pair.b).1 > 1000
    });
    pair.da.take().expect("daemon a").crash();
    let stale = Path::new(SOCKET_DIR).join(format!("{}.sock", pair.a.ifname));
    assert!(stale.exists(), "a crashed daemon leaves its socket file");
    let route = pair
        .a
        .ns
        .exec(&["ip", "route", "show", "dev", &pair.a.ifname]);
    let addr = pair
        .a
        .ns
        .exec(&["ip", "-o", "addr", "show", "dev", &pair.a.ifname]);
    assert_eq!(pair.a.index(), Some(index), "the TUN outlives its daemon");
    assert!(
        route.contains("192.0.2.2") && addr.contains("192.0.2.1/32"),
        "{route} {addr}"
    );
    let restarted = Instant::now();
    pair.da = Some(pair.start(true));
    let serving = restarted.elapsed();
    let log = pair.da.as_ref().expect("daemon a").log();
    assert!(log.contains("removed stale socket"), "{log}");
    pair.a.configure(&pair.b);
    pair.wait_ping("a ping after the restart and wg set");
    let resumed = restarted.elapsed();
    let out = ping.wait_with_output().expect("ping's output");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {text}"));
    let nums: Vec<u64> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .take(2)
        .collect();
    assert_eq!(
        pair.a.index(),
        Some(index),
        "the restart reused the same TUN"
    );
    eprintln!(
        "restart loss: {} of {} pings at 100/s lost ({summary}); after the kill, the new daemon \
         answered `wg show` in {serving:?}, and a ping crossed {resumed:?} after (wg set between)",
        nums[0] - nums[1],
        nums[0],
    );
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn a_second_sticky_wg_on_the_same_device_is_refused_and_the_first_keeps_working() {
    prerequisites("sticky-wg twice");
    let pair = Pair::new("wg2");
    let out = Command::new("ip")
        .args(["netns", "exec", &pair.a.ns.name, &bin(), &pair.a.ifname])
        .output()
        .expect("second sticky-wg");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("another sticky-wg already serves this device"),
        "{err}"
    );
    assert!(
        pair.a.wg_answers(),
        "the first daemon's socket still answers"
    );
    pair.wait_ping("a ping through the first daemon");
}

#[test]
#[ignore = "needs root: network namespaces, TUN devices, /var/run/wireguard"]
fn sigterm_removes_the_socket_and_leaves_the_tun() {
    prerequisites("sticky-wg SIGTERM");
    let mut pair = Pair::new("wgs");
    let index = pair.a.index();
    let daemon = pair.da.as_mut().expect("daemon a");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_exit();
    assert!(status.success(), "{status}: {}", daemon.log());
    assert!(
        !daemon.socket.exists(),
        "{} is left behind",
        daemon.socket.display()
    );
    assert_eq!(pair.a.index(), index, "the TUN stays");
    assert!(!pair.a.wg_answers(), "nothing answers any more");
}
