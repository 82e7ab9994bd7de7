//! WireGuard's cross-platform userspace API (wireguard.com/xplatform), the text protocol
//! `wg(8)` speaks to a userspace implementation over `/var/run/wireguard/<if>.sock`: a request
//! is `get=1` or `set=1` followed by `key=value` lines and an empty line; the answer to `get`
//! is the device's `key=value` lines, and every answer ends with `errno=N` and an empty line.
//! Keys are lowercase hex; endpoints `a.b.c.d:port` or `[v6]:port`; `allowed_ip=` lines are
//! CIDRs. Encoding and decoding are pure functions; [`Uapi`] is the small client over the
//! socket (no dependency on the tunnel implementation: the agent links no tunnel code).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use ipnet::IpNet;
use zeroize::Zeroizing;

use sticky_sites::keys::{PrivateKey, PublicKey};
use sticky_sites::tunnel::{DeviceState, PeerChange, PeerState};

/// The most peer changes one `set` request carries (gotatun takes about 0.16 s for 1,000).
pub const SET_CHUNK: usize = 1_000;

/// The most an answer may hold (a device with thousands of peers stays far below).
const MAX_ANSWER: usize = 16 << 20;

/// Errors of the protocol and the socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("interface name {0:?} is not 1-15 characters without '/' or white space")]
    BadIfname(String),
    #[error("connect to {path}: {source} (is the tunnel daemon running?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{op} on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("answer line {line:?}: {why}")]
    Protocol { line: String, why: &'static str },
    #[error("answer has no errno line (truncated)")]
    Truncated,
    #[error("answer over {MAX_ANSWER} bytes")]
    TooLong,
    #[error("the tunnel refused the request: errno={0}")]
    Errno(i64),
}

/// True when `answer` ends with its `errno=N` line and the empty line (checks only the tail,
/// so reading a long answer stays linear).
fn is_complete(answer: &[u8]) -> bool {
    let Some(body) = answer.strip_suffix(b"\n\n") else {
        return false;
    };
    body.rsplit(|b| *b == b'\n')
        .next()
        .is_some_and(|last| last.starts_with(b"errno="))
}

/// The request for a device's state.
pub const GET: &str = "get=1\n\n";

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A `set=1` request: the private key and listen port when given, then the changes in order.
/// The text holds the private key in hex: it is zeroed when dropped.
pub fn encode_set(
    private_key: Option<&PrivateKey>,
    listen_port: Option<u16>,
    changes: &[PeerChange],
) -> Zeroizing<String> {
    let mut s = Zeroizing::new(String::from("set=1\n"));
    if let Some(k) = private_key {
        s.push_str("private_key=");
        s.push_str(&Zeroizing::new(hex(k.bytes())));
        s.push('\n');
    }
    if let Some(p) = listen_port {
        s.push_str(&format!("listen_port={p}\n"));
    }
    for change in changes {
        match change {
            PeerChange::Remove(key) => {
                s.push_str(&format!("public_key={}\nremove=true\n", hex(&key.0)));
            }
            PeerChange::Upsert {
                peer,
                replace_allowed_ips,
            } => {
                s.push_str(&format!("public_key={}\n", hex(&peer.public_key.0)));
                if let Some(ep) = peer.endpoint {
                    s.push_str(&format!("endpoint={ep}\n"));
                }
                s.push_str(&format!(
                    "persistent_keepalive_interval={}\n",
                    peer.keepalive_secs.unwrap_or(0)
                ));
                if *replace_allowed_ips {
                    s.push_str("replace_allowed_ips=true\n");
                    for ip in &peer.allowed_ips {
                        s.push_str(&format!("allowed_ip={ip}\n"));
                    }
                }
            }
        }
    }
    s.push('\n');
    s
}

/// The `errno=N` of an answer: Ok for 0.
pub fn decode_errno(answer: &str) -> Result<(), Error> {
    let errno = answer
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("errno="))
        .ok_or(Error::Truncated)?;
    match errno.trim().parse::<i64>() {
        Ok(0) => Ok(()),
        Ok(n) => Err(Error::Errno(n)),
        Err(_) => Err(Error::Protocol {
            line: format!("errno={errno}"),
            why: "errno is not a number",
        }),
    }
}

fn number<T: std::str::FromStr>(line: &str, value: &str) -> Result<T, Error> {
    value.parse().map_err(|_| Error::Protocol {
        line: line.to_string(),
        why: "not a number",
    })
}

/// The device state in a `get=1` answer. Unknown keys are skipped (newer implementations may
/// add some); the device's private key is read only to derive its public key.
pub fn decode_get(answer: &str) -> Result<DeviceState, Error> {
    decode_errno(answer)?;
    let mut dev = DeviceState::default();
    let mut handshake: (u64, u32) = (0, 0);
    let finish = |p: &mut PeerState, hs: (u64, u32)| {
        p.last_handshake = (hs != (0, 0)).then(|| {
            UNIX_EPOCH + Duration::from_secs(hs.0) + Duration::from_nanos(u64::from(hs.1))
        });
    };
    for line in answer.lines() {
        if line.is_empty() {
            break;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(Error::Protocol {
                line: line.to_string(),
                why: "not key=value",
            });
        };
        let bad_key = || Error::Protocol {
            line: if key == "private_key" {
                "private_key=<redacted>".into()
            } else {
                line.to_string()
            },
            why: "not a 64-digit hex key",
        };
        if key == "public_key" {
            if let Some(p) = dev.peers.last_mut() {
                finish(p, handshake);
            }
            handshake = (0, 0);
            dev.peers
                .push(PeerState::new(PublicKey(unhex(value).ok_or_else(bad_key)?)));
            continue;
        }
        let Some(peer) = dev.peers.last_mut() else {
            match key {
                "private_key" => {
                    let bytes = Zeroizing::new(unhex(value).ok_or_else(bad_key)?);
                    if bytes.iter().any(|b| *b != 0) {
                        dev.public_key = Some(PrivateKey::from_bytes(*bytes).public_key());
                    }
                }
                "listen_port" => dev.listen_port = number(line, value)?,
                _ => {}
            }
            continue;
        };
        match key {
            "endpoint" => {
                let ep: SocketAddr = value.parse().map_err(|_| Error::Protocol {
                    line: line.to_string(),
                    why: "not an address:port",
                })?;
                peer.endpoint = Some(ep);
            }
            "allowed_ip" => {
                let ip: IpNet = value.parse().map_err(|_| Error::Protocol {
                    line: line.to_string(),
                    why: "not a CIDR",
                })?;
                peer.allowed_ips.push(ip);
            }
            "persistent_keepalive_interval" => {
                let k: u16 = number(line, value)?;
                peer.keepalive_secs = (k != 0).then_some(k);
            }
            "last_handshake_time_sec" => handshake.0 = number(line, value)?,
            "last_handshake_time_nsec" => handshake.1 = number(line, value)?,
            "rx_bytes" => peer.rx_bytes = number(line, value)?,
            "tx_bytes" => peer.tx_bytes = number(line, value)?,
            _ => {}
        }
    }
    if let Some(p) = dev.peers.last_mut() {
        finish(p, handshake);
    }
    Ok(dev)
}

/// A client of the UAPI socket `<socket_dir>/<ifname>.sock`.
#[derive(Debug, Clone)]
pub struct Uapi {
    socket_dir: PathBuf,
    timeout: Duration,
}

impl Uapi {
    /// A client for sockets under `socket_dir` ([`DEFAULT_SOCKET_DIR`] on a node), each
    /// exchange bounded by `timeout`.
    pub fn new(socket_dir: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket_dir: socket_dir.into(),
            timeout,
        }
    }

    fn socket(&self, ifname: &str) -> Result<PathBuf, Error> {
        let ok = !ifname.is_empty()
            && ifname.len() <= 15
            && !ifname.contains('/')
            && !ifname.chars().any(char::is_whitespace)
            && ifname != "."
            && ifname != "..";
        if !ok {
            return Err(Error::BadIfname(ifname.to_string()));
        }
        Ok(self.socket_dir.join(format!("{ifname}.sock")))
    }

    /// Sends `request` and returns the whole answer (up to its final empty line).
    fn exchange(&self, ifname: &str, request: &str) -> Result<Zeroizing<String>, Error> {
        let path = self.socket(ifname)?;
        let io = |op: &'static str, p: &Path| {
            let path = p.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        let mut s = UnixStream::connect(&path).map_err(|source| Error::Connect {
            path: path.clone(),
            source,
        })?;
        s.set_read_timeout(Some(self.timeout))
            .map_err(io("set timeout", &path))?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(io("set timeout", &path))?;
        s.write_all(request.as_bytes())
            .map_err(io("write", &path))?;
        let mut answer = Zeroizing::new(Vec::new());
        // A hub's answer is megabytes: read it in large pieces (a read each 4 KiB was 300).
        let mut buf = Zeroizing::new(vec![0u8; 64 << 10]);
        loop {
            let n = s.read(&mut buf).map_err(io("read", &path))?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(buf.get(..n).unwrap_or_default());
            if answer.len() > MAX_ANSWER {
                return Err(Error::TooLong);
            }
            if is_complete(&answer) {
                break;
            }
        }
        // Moved, not copied: the text is zeroed when dropped, as the bytes would have been.
        match String::from_utf8(std::mem::take(&mut *answer)) {
            Ok(text) => Ok(Zeroizing::new(text)),
            Err(e) => {
                drop(Zeroizing::new(e.into_bytes()));
                Err(Error::Protocol {
                    line: String::from("<not UTF-8>"),
                    why: "answer is not text",
                })
            }
        }
    }

    /// The device's state.
    pub fn get(&self, ifname: &str) -> Result<DeviceState, Error> {
        decode_get(&self.exchange(ifname, GET)?)
    }

    /// The private key and the listen port (each when given) and the peer changes, in order:
    /// one request, or one per [`SET_CHUNK`] changes (each with the key and port), so that no
    /// request outlasts the timeout (a hub's 10,000 peers took 1.6 s in one). Nothing given:
    /// no request at all.
    pub fn set(
        &self,
        ifname: &str,
        key: Option<&PrivateKey>,
        port: Option<u16>,
        changes: &[PeerChange],
    ) -> Result<(), Error> {
        if key.is_none() && port.is_none() && changes.is_empty() {
            return Ok(());
        }
        if changes.is_empty() {
            return decode_errno(&self.exchange(ifname, &encode_set(key, port, &[]))?);
        }
        for chunk in changes.chunks(SET_CHUNK) {
            decode_errno(&self.exchange(ifname, &encode_set(key, port, chunk))?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sticky_sites::tunnel::{PeerConfig, apply as apply_to, diff};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A desired peer: key bytes all `k`.
    fn peer(k: u8, ep: Option<&str>, ips: &[&str], ka: Option<u16>) -> PeerConfig {
        PeerConfig {
            public_key: PublicKey([k; 32]),
            endpoint: ep.map(|e| e.parse().unwrap()),
            allowed_ips: ips.iter().map(|s| net(s)).collect(),
            keepalive_secs: ka,
            last_seen: None,
        }
    }
    use std::os::unix::net::UnixListener;
    use std::sync::{Arc, Mutex};

    const K1: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const K2: &str = "0202020202020202020202020202020202020202020202020202020202020202";

    #[test]
    fn encode_set_table() {
        let key = PrivateKey::from_bytes([0xaa; 32]);
        let cases: Vec<(&str, Zeroizing<String>, String)> = vec![
            ("empty", encode_set(None, None, &[]), "set=1\n\n".into()),
            (
                "key and port",
                encode_set(Some(&key), Some(51820), &[]),
                format!(
                    "set=1\nprivate_key={}\nlisten_port=51820\n\n",
                    "aa".repeat(32)
                ),
            ),
            (
                "remove",
                encode_set(None, None, &[PeerChange::Remove(PublicKey([1; 32]))]),
                format!("set=1\npublic_key={K1}\nremove=true\n\n"),
            ),
            (
                "upsert v4 with allowed IPs",
                encode_set(
                    None,
                    None,
                    &[PeerChange::Upsert {
                        peer: peer(
                            1,
                            Some("203.0.113.1:51820"),
                            &["10.0.1.0/24", "fd00::/64"],
                            Some(25),
                        ),
                        replace_allowed_ips: true,
                    }],
                ),
                format!(
                    "set=1\npublic_key={K1}\nendpoint=203.0.113.1:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.1.0/24\nallowed_ip=fd00::/64\n\n"
                ),
            ),
            (
                "upsert v6 endpoint, IPs untouched",
                encode_set(
                    None,
                    None,
                    &[PeerChange::Upsert {
                        peer: peer(2, Some("[2001:db8::1]:4000"), &[], None),
                        replace_allowed_ips: false,
                    }],
                ),
                format!(
                    "set=1\npublic_key={K2}\nendpoint=[2001:db8::1]:4000\npersistent_keepalive_interval=0\n\n"
                ),
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got.as_str(), want, "{name}");
        }
    }

    #[test]
    fn decode_get_reads_the_spec_example_shape() {
        let private = PrivateKey::from_bytes([0xaa; 32]);
        let answer = format!(
            "private_key={}\nlisten_port=51820\nfwmark=0\npublic_key={K1}\npreshared_key={}\nprotocol_version=1\nendpoint=[2001:db8::9]:51820\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\ntx_bytes=38333\nrx_bytes=2224\npersistent_keepalive_interval=25\nallowed_ip=10.0.1.0/24\nallowed_ip=fd00:1::/64\nfuture_key=whatever\npublic_key={K2}\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\nallowed_ip=10.0.2.0/24\nerrno=0\n\n",
            "aa".repeat(32),
            "00".repeat(32)
        );
        let d = decode_get(&answer).unwrap();
        assert_eq!(d.public_key, Some(private.public_key()));
        assert_eq!(d.listen_port, 51820);
        assert_eq!(d.peers.len(), 2);
        let p = &d.peers[0];
        assert_eq!(p.public_key, PublicKey([1; 32]));
        assert_eq!(p.endpoint, Some("[2001:db8::9]:51820".parse().unwrap()));
        assert_eq!(
            p.last_handshake,
            Some(UNIX_EPOCH + Duration::new(1_700_000_000, 5))
        );
        assert_eq!((p.tx_bytes, p.rx_bytes), (38333, 2224));
        assert_eq!(p.keepalive_secs, Some(25));
        assert_eq!(p.allowed_ips, vec![net("10.0.1.0/24"), net("fd00:1::/64")]);
        let q = &d.peers[1];
        assert_eq!(
            (q.endpoint, q.last_handshake, q.keepalive_secs),
            (None, None, None)
        );
        assert_eq!(q.allowed_ips, vec![net("10.0.2.0/24")]);
    }

    #[test]
    fn decode_errors_table() {
        let cases: &[(&str, &str)] = &[
            ("errno=0\n\n", "ok"),
            ("listen_port=1\nerrno=0\n\n", "ok"),
            ("errno=22\n\n", "errno=22"),
            ("listen_port=1\n", "truncated"),
            ("listen_port=x\nerrno=0\n\n", "not a number"),
            ("garbage\nerrno=0\n\n", "not key=value"),
            ("public_key=zz\nerrno=0\n\n", "hex"),
            (
                concat!(
                    "public_key=",
                    "0101010101010101010101010101010101010101010101010101010101010101",
                    "\nendpoint=host:1\nerrno=0\n\n"
                ),
                "address:port",
            ),
            (
                concat!(
                    "public_key=",
                    "0101010101010101010101010101010101010101010101010101010101010101",
                    "\nallowed_ip=10.0.0.0/33\nerrno=0\n\n"
                ),
                "CIDR",
            ),
        ];
        for (answer, want) in cases {
            let got = decode_get(answer);
            match (*want, got) {
                ("ok", Ok(_)) => {}
                (w, Err(e)) => assert!(e.to_string().contains(w), "{answer:?}: {e}"),
                (w, Ok(d)) => panic!("{answer:?}: expected {w}, got {d:?}"),
            }
        }
        // A bad private key line never quotes the key.
        let e = decode_get(&format!("private_key={}zz\nerrno=0\n\n", "ab".repeat(31))).unwrap_err();
        assert!(!e.to_string().contains("abab"), "{e}");
    }

    #[test]
    fn answer_is_complete_only_after_errno_and_empty_line() {
        let cases: &[(&[u8], bool)] = &[
            (b"errno=0\n\n", true),
            (b"listen_port=1\nerrno=0\n\n", true),
            (b"listen_port=1\nerrno=0\n", false),
            (b"listen_port=1\n\n", false),
            (b"errno=0\nlisten_port=1\n\n", false),
            (b"", false),
        ];
        for (a, want) in cases {
            assert_eq!(is_complete(a), *want, "{:?}", String::from_utf8_lossy(a));
        }
    }

    /// A small UAPI server: a device in memory, answering `get` and applying `set` as the
    /// protocol says; a request with an unknown key is refused with errno=22.
    struct FakeServer {
        state: Arc<Mutex<DeviceState>>,
        requests: Arc<Mutex<Vec<String>>>,
    }

    fn answer_get(d: &DeviceState) -> String {
        let mut s = format!("listen_port={}\n", d.listen_port);
        for p in &d.peers {
            s.push_str(&format!("public_key={}\n", hex(&p.public_key.0)));
            if let Some(ep) = p.endpoint {
                s.push_str(&format!("endpoint={ep}\n"));
            }
            s.push_str(&format!(
                "persistent_keepalive_interval={}\n",
                p.keepalive_secs.unwrap_or(0)
            ));
            s.push_str(
                "last_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n",
            );
            for ip in &p.allowed_ips {
                s.push_str(&format!("allowed_ip={ip}\n"));
            }
        }
        s.push_str("errno=0\n\n");
        s
    }

    fn apply_set(d: &mut DeviceState, text: &str) -> Result<(), ()> {
        let mut changes: Vec<PeerChange> = Vec::new();
        for line in text.lines().skip(1).take_while(|l| !l.is_empty()) {
            let (k, v) = line.split_once('=').ok_or(())?;
            let last = changes.last_mut();
            match (k, last) {
                ("private_key", _) => {
                    d.public_key = Some(PrivateKey::from_bytes(unhex(v).ok_or(())?).public_key())
                }
                ("listen_port", _) => d.listen_port = v.parse().map_err(|_| ())?,
                ("public_key", _) => changes.push(PeerChange::Upsert {
                    peer: PeerConfig {
                        public_key: PublicKey(unhex(v).ok_or(())?),
                        endpoint: None,
                        allowed_ips: vec![],
                        keepalive_secs: None,
                        last_seen: None,
                    },
                    replace_allowed_ips: false,
                }),
                ("remove", Some(c)) => {
                    let PeerChange::Upsert { peer, .. } = c else {
                        return Err(());
                    };
                    *c = PeerChange::Remove(peer.public_key);
                }
                (
                    k,
                    Some(PeerChange::Upsert {
                        peer,
                        replace_allowed_ips,
                    }),
                ) => match k {
                    "endpoint" => peer.endpoint = Some(v.parse().map_err(|_| ())?),
                    "persistent_keepalive_interval" => {
                        peer.keepalive_secs = Some(v.parse().map_err(|_| ())?)
                    }
                    "replace_allowed_ips" => *replace_allowed_ips = true,
                    "allowed_ip" => peer.allowed_ips.push(v.parse().map_err(|_| ())?),
                    _ => return Err(()),
                },
                _ => return Err(()),
            }
        }
        apply_to(d, &changes);
        Ok(())
    }

    impl FakeServer {
        fn start(path: &Path) -> Self {
            let listener = UnixListener::bind(path).unwrap();
            let state = Arc::new(Mutex::new(DeviceState {
                listen_port: 51820,
                ..Default::default()
            }));
            let requests = Arc::new(Mutex::new(Vec::new()));
            let (st, rq) = (state.clone(), requests.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { return };
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.ends_with(b"\n\n") {
                        let Ok(n) = conn.read(&mut buf) else { break };
                        if n == 0 {
                            break;
                        }
                        req.extend_from_slice(&buf[..n]);
                    }
                    let text = String::from_utf8(req).unwrap();
                    rq.lock().unwrap().push(text.clone());
                    let mut d = st.lock().unwrap();
                    let reply = if text.starts_with("get=1\n") {
                        answer_get(&d)
                    } else if text.starts_with("set=1\n") && apply_set(&mut d, &text).is_ok() {
                        "errno=0\n\n".into()
                    } else {
                        "errno=22\n\n".into()
                    };
                    let _ = conn.write_all(reply.as_bytes());
                }
            });
            Self { state, requests }
        }
    }

    #[test]
    fn client_converges_a_device_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::start(&dir.path().join("wgs0.sock"));
        let t = Uapi::new(dir.path(), Duration::from_secs(60));
        let key = PrivateKey::from_bytes([0x42; 32]);
        let desired = vec![
            peer(1, Some("203.0.113.1:51820"), &["10.0.1.0/24"], Some(25)),
            peer(2, None, &["10.0.2.0/24", "10.0.3.0/24"], None),
        ];
        let changes = diff(&desired, &t.get("wgs0").unwrap());
        assert_eq!(changes.len(), 2);
        t.set("wgs0", Some(&key), Some(51821), &changes).unwrap();
        let now = t.get("wgs0").unwrap();
        assert_eq!(now.listen_port, 51821);
        assert_eq!(
            server.state.lock().unwrap().public_key,
            Some(key.public_key())
        );
        assert!(diff(&desired, &now).is_empty());
        // Nothing to change: no request at all.
        let before = server.requests.lock().unwrap().len();
        t.set("wgs0", None, None, &diff(&desired, &now)).unwrap();
        assert_eq!(server.requests.lock().unwrap().len(), before);
        // One peer gone, one moved endpoint.
        let desired2 = vec![peer(
            1,
            Some("203.0.113.2:51820"),
            &["10.0.1.0/24"],
            Some(25),
        )];
        t.set(
            "wgs0",
            None,
            None,
            &diff(&desired2, &t.get("wgs0").unwrap()),
        )
        .unwrap();
        let last = server.requests.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            last,
            format!(
                "set=1\npublic_key={K2}\nremove=true\npublic_key={K1}\nendpoint=203.0.113.2:51820\npersistent_keepalive_interval=25\n\n"
            )
        );
        assert!(diff(&desired2, &t.get("wgs0").unwrap()).is_empty());
    }

    /// A hub's peers go in requests of at most [`SET_CHUNK`] changes, each with the key and
    /// the port (a device made anew between two never has peers without its key).
    #[test]
    fn many_changes_go_in_chunks_each_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::start(&dir.path().join("wgs2.sock"));
        let t = Uapi::new(dir.path(), Duration::from_secs(60));
        let key = PrivateKey::from_bytes([0x42; 32]);
        let desired: Vec<PeerConfig> = (0..2 * SET_CHUNK + 500)
            .map(|i| {
                let mut p = peer(0, None, &[], None);
                p.public_key.0[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
                p.allowed_ips = vec![net(&format!("10.{}.{}.0/24", i / 256, i % 256))];
                p
            })
            .collect();
        let changes = diff(&desired, &t.get("wgs2").unwrap());
        let before = server.requests.lock().unwrap().len();
        t.set("wgs2", Some(&key), Some(51820), &changes).unwrap();
        let requests = server.requests.lock().unwrap()[before..].to_vec();
        assert_eq!(requests.len(), 3);
        for r in &requests {
            assert!(r.starts_with("set=1\nprivate_key=") && r.contains("listen_port=51820\n"));
            assert!(r.matches("public_key=").count() <= SET_CHUNK);
        }
        assert!(diff(&desired, &t.get("wgs2").unwrap()).is_empty());
    }

    #[test]
    fn client_errors_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let _server = FakeServer::start(&dir.path().join("wgs1.sock"));
        let t = Uapi::new(dir.path(), Duration::from_secs(60));
        let e = t.get("absent0").unwrap_err().to_string();
        assert!(e.contains("absent0.sock") && e.contains("daemon"), "{e}");
        for bad in ["", "../x", "a b", "sixteen-chars-xx"] {
            assert!(matches!(t.get(bad), Err(Error::BadIfname(_))), "{bad:?}");
        }
        // The server refuses a request it does not know: errno surfaces.
        let e = decode_errno(&t.exchange("wgs1", "set=1\nbogus=1\n\n").unwrap()).unwrap_err();
        assert!(matches!(&e, Error::Errno(22)), "{e}");
    }
}
