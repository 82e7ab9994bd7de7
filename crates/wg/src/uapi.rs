//! WireGuard's configuration protocol (wireguard.com/xplatform), read by sticky-wg itself before
//! gotatun sees anything: one request's lines become a typed [`Request`], or an [`Error`] that
//! carries the `errno=` the answer gives. Everything is checked here, before anything is
//! applied, so a refused request changes nothing (gotatun's own parser closes the connection
//! without an answer on bad input, and applies `fwmark` before it finds it cannot).
//!
//! The bounds a client can hit are here too: a line, a request, the peers of a device.
//!
//! The errno values are wireguard-go's where it has one (EINVAL for a value or key the protocol
//! does not take, EPROTO for a line that is not `key=value`); E2BIG for a line or request over
//! its bound and ENOSPC for a device that would hold more than [`MAX_PEERS`] peers are ours.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The longest line taken, without its newline. The longest valid one is an IPv6 endpoint with
/// a scope (under 80 bytes); anything longer is refused with E2BIG and the connection closed.
pub const MAX_LINE: usize = 1024;
/// The largest request taken (its lines with their newlines): 65,536 peers of a typical
/// agent request (key, endpoint, keepalive, two allowed IPs: about 200 bytes each) fit in 16 MiB
/// with room to spare. Over it: E2BIG, connection closed.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;
/// The most peers a device holds (issue 37's hub needs 10,000). A request that would leave
/// more is refused with ENOSPC and changes nothing.
pub const MAX_PEERS: usize = 65_536;
/// The most connections served at once; one more is accepted and closed at once.
pub const MAX_CONNECTIONS: usize = 16;
/// A connection that sends no complete line for this long is closed (an idle client, or one
/// stalled in the middle of a request, which holds the configuration lock meanwhile).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most time a `set` body may take (the configuration lock is held while it is read); a
/// 16 MiB request over a Unix socket takes well under a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// errno values of the answers (Linux's numbers, as `wg` expects).
pub mod errno {
    /// A request or value the protocol does not take.
    pub const EINVAL: i32 = libc::EINVAL;
    /// A line that is not `key=value`.
    pub const EPROTO: i32 = libc::EPROTO;
    /// A line or request over its bound.
    pub const E2BIG: i32 = libc::E2BIG;
    /// More peers than [`super::MAX_PEERS`].
    pub const ENOSPC: i32 = libc::ENOSPC;
    /// The device could not do it (gotatun's configuration task is gone, or it refused a
    /// checked request).
    pub const EIO: i32 = libc::EIO;
    /// The listen port is taken (wireguard-go's answer too).
    pub const EADDRINUSE: i32 = libc::EADDRINUSE;
}

/// A 32-byte WireGuard key (private, public or preshared).
pub type Key = [u8; 32];

/// One request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `get=1`: the device's configuration and peers.
    Get,
    /// `set=1` and its keys.
    Set(Set),
}

/// A `set=1` request. `None` (or `false`) leaves a setting as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Set {
    /// All zero: remove the key.
    pub private_key: Option<Key>,
    pub listen_port: Option<u16>,
    /// 0: remove the mark.
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerChange>,
}

/// The keys after one `public_key=` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerChange {
    pub public_key: Key,
    pub remove: bool,
    pub update_only: bool,
    /// All zero: remove the preshared key.
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    /// 0: keepalive off.
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<AllowedIp>,
}

impl PeerChange {
    /// A change that only names the peer (adds it when absent).
    pub fn new(public_key: Key) -> PeerChange {
        PeerChange {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// An allowed IP: an address and a prefix length that fits its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllowedIp {
    pub addr: IpAddr,
    pub prefix: u8,
}

/// Why a request is refused; [`Error::errno`] is what the answer says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("unknown operation {line:?} (expected \"get=1\" or \"set=1\")")]
    UnknownOperation { line: String },
    #[error("line {line:?} is not key=value")]
    NotKeyValue { line: String },
    #[error("\"get=1\" takes no keys, got {line:?}")]
    KeyInGet { line: String },
    #[error("key {key:?} is not taken {place}")]
    UnknownKey { key: String, place: &'static str },
    #[error("{key}={value:?}: expected {expected}")]
    BadValue {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A key's value is never quoted: it may be a private key with one typo.
    #[error("{key}: expected 64 hex digits (the value is not repeated: it may be secret)")]
    BadKey { key: &'static str },
    #[error("{key} given twice {place}")]
    Twice {
        key: &'static str,
        place: &'static str,
    },
    #[error("peer {} named twice in one request", hex_prefix(.public_key))]
    PeerTwice { public_key: Key },
    #[error("a line longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("a request longer than {MAX_REQUEST_BYTES} bytes")]
    RequestTooLong,
    #[error("the device would hold {peers} peers, more than {MAX_PEERS}")]
    TooManyPeers { peers: usize },
    #[error("the request is not valid UTF-8")]
    NotUtf8,
}

impl Error {
    /// The `errno=` of the answer.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotKeyValue { .. } => errno::EPROTO,
            Error::LineTooLong | Error::RequestTooLong => errno::E2BIG,
            Error::TooManyPeers { .. } => errno::ENOSPC,
            _ => errno::EINVAL,
        }
    }

    /// After this error the connection is closed: the rest of the stream cannot be read as
    /// requests (a line cut short) or is not worth reading.
    pub fn closes(&self) -> bool {
        matches!(self, Error::LineTooLong | Error::RequestTooLong)
    }
}

/// The first 8 hex digits of a public key, for messages.
pub fn hex_prefix(key: &Key) -> String {
    key[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// What a request's first line opens.
#[derive(Debug)]
pub enum Opening {
    /// `get=1`: the next line must be the empty one.
    Get,
    /// `set=1`: feed the following lines to the reader until the empty one.
    Set(SetReader),
}

/// Reads a request's first line.
pub fn open(line: &str) -> Result<Opening, Error> {
    match line {
        "get=1" => Ok(Opening::Get),
        "set=1" => Ok(Opening::Set(SetReader::default())),
        _ => Err(Error::UnknownOperation {
            line: shorten(line),
        }),
    }
}

/// Checks the line after `get=1` (the empty line ends the request).
pub fn get_line(line: &str) -> Result<(), Error> {
    if line.is_empty() {
        Ok(())
    } else {
        Err(Error::KeyInGet {
            line: shorten(line),
        })
    }
}

/// The bytes of one request so far, bounded by [`MAX_REQUEST_BYTES`].
#[derive(Debug, Default)]
pub struct Budget {
    bytes: usize,
}

impl Budget {
    /// Counts one line (and its newline).
    pub fn take(&mut self, line: &str) -> Result<(), Error> {
        self.bytes += line.len() + 1;
        if self.bytes > MAX_REQUEST_BYTES {
            Err(Error::RequestTooLong)
        } else {
            Ok(())
        }
    }
}

/// A `set=1` request read line by line, so a long one is never held as text.
#[derive(Debug, Default)]
pub struct SetReader {
    set: Set,
    seen: HashSet<Key>,
    protocol_version: bool,
}

impl SetReader {
    /// Takes one line (without its newline; not the empty line that ends the request).
    pub fn line(&mut self, line: &str) -> Result<(), Error> {
        let Some((key, value)) = line.split_once('=') else {
            return Err(Error::NotKeyValue {
                line: shorten(line),
            });
        };
        if key == "public_key" {
            let public_key = parse_key("public_key", value)?;
            if !self.seen.insert(public_key) {
                return Err(Error::PeerTwice { public_key });
            }
            if self.set.peers.len() >= MAX_PEERS {
                return Err(Error::TooManyPeers {
                    peers: self.set.peers.len() + 1,
                });
            }
            self.set.peers.push(PeerChange::new(public_key));
            return Ok(());
        }
        match self.set.peers.last_mut() {
            None => self.device_key(key, value),
            Some(peer) => peer_key(peer, key, value),
        }
    }

    /// The request, once its empty line has come.
    pub fn finish(self) -> Set {
        self.set
    }

    fn device_key(&mut self, key: &str, value: &str) -> Result<(), Error> {
        const PLACE: &str = "before the first public_key";
        let set = &mut self.set;
        match key {
            "private_key" => once(&mut set.private_key, "private_key", PLACE, || {
                parse_key("private_key", value)
            }),
            "listen_port" => once(&mut set.listen_port, "listen_port", PLACE, || {
                number("listen_port", value, "a port, 0 to 65535")
            }),
            "fwmark" => once(&mut set.fwmark, "fwmark", PLACE, || {
                if value.is_empty() {
                    Ok(0)
                } else {
                    number("fwmark", value, "a mark, 0 to 4294967295")
                }
            }),
            "replace_peers" => flag(&mut set.replace_peers, "replace_peers", value, PLACE),
            "protocol_version" => {
                if self.protocol_version {
                    return Err(Error::Twice {
                        key: "protocol_version",
                        place: PLACE,
                    });
                }
                self.protocol_version = true;
                protocol_version(value)
            }
            _ => Err(unknown_key(key, PLACE)),
        }
    }
}

fn peer_key(peer: &mut PeerChange, key: &str, value: &str) -> Result<(), Error> {
    const PLACE: &str = "for a peer";
    match key {
        "remove" => flag(&mut peer.remove, "remove", value, PLACE),
        "update_only" => flag(&mut peer.update_only, "update_only", value, PLACE),
        "replace_allowed_ips" => flag(
            &mut peer.replace_allowed_ips,
            "replace_allowed_ips",
            value,
            PLACE,
        ),
        "preshared_key" => once(&mut peer.preshared_key, "preshared_key", PLACE, || {
            if value.is_empty() {
                Ok([0; 32])
            } else {
                parse_key("preshared_key", value)
            }
        }),
        "endpoint" => once(&mut peer.endpoint, "endpoint", PLACE, || {
            value.parse::<SocketAddr>().map_err(|_| {
                bad(
                    "endpoint",
                    value,
                    "an address and port, a.b.c.d:port or [v6]:port (no host names)",
                )
            })
        }),
        "persistent_keepalive_interval" => once(
            &mut peer.persistent_keepalive,
            "persistent_keepalive_interval",
            PLACE,
            || {
                number(
                    "persistent_keepalive_interval",
                    value,
                    "seconds, 0 to 65535",
                )
            },
        ),
        "allowed_ip" => {
            peer.allowed_ips.push(allowed_ip(value)?);
            Ok(())
        }
        "protocol_version" => protocol_version(value),
        _ => Err(unknown_key(key, PLACE)),
    }
}

/// `protocol_version`, for the device or a peer: only WireGuard's version 1.
fn protocol_version(value: &str) -> Result<(), Error> {
    if value == "1" {
        Ok(())
    } else {
        Err(bad("protocol_version", value, "1"))
    }
}

/// A key the protocol does not have `place` (the key shortened: it may be a secret).
fn unknown_key(key: &str, place: &'static str) -> Error {
    Error::UnknownKey {
        key: shorten(key),
        place,
    }
}

/// Sets an option that may be given once.
fn once<T>(
    slot: &mut Option<T>,
    key: &'static str,
    place: &'static str,
    parse: impl FnOnce() -> Result<T, Error>,
) -> Result<(), Error> {
    if slot.is_some() {
        return Err(Error::Twice { key, place });
    }
    *slot = Some(parse()?);
    Ok(())
}

/// `key=true`, the only value the protocol has for its flags.
fn flag(slot: &mut bool, key: &'static str, value: &str, place: &'static str) -> Result<(), Error> {
    if value != "true" {
        return Err(bad(key, value, "true"));
    }
    if *slot {
        return Err(Error::Twice { key, place });
    }
    *slot = true;
    Ok(())
}

fn number<T: std::str::FromStr>(
    key: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<T, Error> {
    // Digits only: `+1` and ` 1` are not the protocol's numbers.
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(key, value, expected));
    }
    value.parse().map_err(|_| bad(key, value, expected))
}

fn parse_key(key: &'static str, value: &str) -> Result<Key, Error> {
    let bytes = value.as_bytes();
    if bytes.len() != 64 {
        return Err(Error::BadKey { key });
    }
    let mut out = [0u8; 32];
    for (b, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let digit = |c: u8| (c as char).to_digit(16).ok_or(Error::BadKey { key });
        *b = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Ok(out)
}

fn allowed_ip(value: &str) -> Result<AllowedIp, Error> {
    const EXPECTED: &str = "address/prefix, the prefix at most 32 (IPv4) or 128 (IPv6)";
    let refuse = || bad("allowed_ip", value, EXPECTED);
    let (addr, prefix) = value.split_once('/').ok_or_else(refuse)?;
    let addr: IpAddr = addr.parse().map_err(|_| refuse())?;
    let prefix: u8 = number("allowed_ip", prefix, EXPECTED).map_err(|_| refuse())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(refuse());
    }
    Ok(AllowedIp { addr, prefix })
}

fn bad(key: &'static str, value: &str, expected: &'static str) -> Error {
    Error::BadValue {
        key,
        value: shorten(value),
        expected,
    }
}

/// Input quoted in a message, cut to a readable length.
fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// Reads a whole request from text (the lines and the empty line), as the connection does
/// line by line: for tests and for callers that hold a request in memory.
pub fn parse(text: &str) -> Result<Request, Error> {
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    match open(first)? {
        Opening::Get => {
            get_line(lines.next().unwrap_or_default())?;
            Ok(Request::Get)
        }
        Opening::Set(mut reader) => {
            let mut budget = Budget::default();
            for line in lines {
                if line.is_empty() {
                    return Ok(Request::Set(reader.finish()));
                }
                if line.len() > MAX_LINE {
                    return Err(Error::LineTooLong);
                }
                budget.take(line)?;
                reader.line(line)?;
            }
            Ok(Request::Set(reader.finish()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const K2: &str = "0202020202020202020202020202020202020202020202020202020202020202";

    fn set(body: &str) -> Result<Set, Error> {
        match parse(&format!("set=1\n{body}\n"))? {
            Request::Set(s) => Ok(s),
            Request::Get => panic!("a set parsed as get"),
        }
    }

    #[test]
    fn what_wg_sends_is_read_into_the_typed_request() {
        let s = set(&format!(
            "private_key={K1}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\
             public_key={K2}\nendpoint=[2001:db8::1]:51820\npersistent_keepalive_interval=25\n\
             replace_allowed_ips=true\nallowed_ip=192.0.2.0/24\nallowed_ip=2001:db8::/32\n\
             public_key={K1}\nremove=true\n"
        ))
        .unwrap();
        assert_eq!(s.private_key, Some([1; 32]));
        assert_eq!(s.listen_port, Some(51820));
        assert_eq!(s.fwmark, Some(0));
        assert!(s.replace_peers);
        assert_eq!(s.peers.len(), 2);
        let p = &s.peers[0];
        assert_eq!(p.public_key, [2; 32]);
        assert_eq!(p.endpoint, Some("[2001:db8::1]:51820".parse().unwrap()));
        assert_eq!(p.persistent_keepalive, Some(25));
        assert!(p.replace_allowed_ips && !p.remove);
        assert_eq!(
            p.allowed_ips,
            vec![
                AllowedIp {
                    addr: "192.0.2.0".parse().unwrap(),
                    prefix: 24
                },
                AllowedIp {
                    addr: "2001:db8::".parse().unwrap(),
                    prefix: 32
                }
            ]
        );
        assert!(s.peers[1].remove);
        assert_eq!(parse("get=1\n\n"), Ok(Request::Get));
        // An empty fwmark and preshared key remove them, as gotatun reads them.
        let s = set(&format!("fwmark=\npublic_key={K2}\npreshared_key=\n")).unwrap();
        assert_eq!(s.fwmark, Some(0));
        assert_eq!(s.peers[0].preshared_key, Some([0; 32]));
    }

    /// (request body, errno, what the error says) for every malformed value.
    fn malformed_values() -> Vec<(String, i32, &'static str)> {
        let bad_hex = "zz".repeat(32);
        vec![
            (
                format!("private_key={bad_hex}"),
                22,
                "private_key: expected 64 hex",
            ),
            (format!("private_key={}", &K1[..62]), 22, "private_key"),
            (format!("public_key={}é", &K1[..62]), 22, "public_key"),
            ("listen_port=70000".into(), 22, "listen_port=\"70000\""),
            ("listen_port=-1".into(), 22, "listen_port=\"-1\""),
            ("listen_port=+1".into(), 22, "listen_port=\"+1\""),
            ("fwmark=4294967296".into(), 22, "fwmark=\"4294967296\""),
            (
                format!("public_key={K1}\nendpoint=gw.example.com:51820"),
                22,
                "no host names",
            ),
            (
                format!("public_key={K1}\nendpoint=192.0.2.1"),
                22,
                "endpoint=\"192.0.2.1\"",
            ),
            (
                format!("public_key={K1}\nallowed_ip=192.0.2.0/99"),
                22,
                "\"192.0.2.0/99\"",
            ),
            (
                format!("public_key={K1}\nallowed_ip=2001:db8::/129"),
                22,
                "/129",
            ),
            (
                format!("public_key={K1}\nallowed_ip=192.0.2.0"),
                22,
                "address/prefix",
            ),
            (format!("public_key={K1}\nallowed_ip=192.0.2.0/x"), 22, "/x"),
        ]
    }

    /// Malformed requests as a whole: versions, repeats, keys in the wrong place, lines.
    fn malformed_requests() -> Vec<(String, i32, &'static str)> {
        vec![
            ("protocol_version=2".into(), 22, "protocol_version=\"2\""),
            (
                format!("public_key={K1}\nprotocol_version=2"),
                22,
                "protocol_version",
            ),
            ("replace_peers=false".into(), 22, "expected true"),
            (format!("public_key={K1}\nremove=1"), 22, "remove=\"1\""),
            (
                format!("public_key={K1}\npersistent_keepalive_interval=65536"),
                22,
                "65536",
            ),
            (
                format!("public_key={K1}\npreshared_key=abc"),
                22,
                "preshared_key",
            ),
            (
                "listen_port=1\nlisten_port=2".into(),
                22,
                "listen_port given twice",
            ),
            (
                format!("public_key={K1}\nendpoint=192.0.2.1:1\nendpoint=192.0.2.1:2"),
                22,
                "twice",
            ),
            (
                format!("public_key={K1}\npublic_key={K2}\npublic_key={K1}"),
                22,
                "01010101 named twice",
            ),
            (
                "hello=1".into(),
                22,
                "\"hello\" is not taken before the first public_key",
            ),
            (
                format!("public_key={K1}\nlisten_port=1"),
                22,
                "\"listen_port\" is not taken for a peer",
            ),
            ("listen_port".into(), 71, "not key=value"),
            ("x".repeat(MAX_LINE + 1), 7, "longer than 1024"),
        ]
    }

    #[test]
    fn every_malformed_input_is_refused_with_its_errno_and_the_bad_part_quoted() {
        for (body, errno, says) in &[malformed_values(), malformed_requests()].concat() {
            let err = set(body).unwrap_err();
            assert_eq!(err.errno(), *errno, "{body:?}: {err}");
            assert!(err.to_string().contains(says), "{body:?}: {err}");
        }
        for (text, says) in [
            ("get=2\n\n", "unknown operation \"get=2\""),
            ("show\n\n", "\"show\""),
            ("get=1\nprivate_key=x\n\n", "takes no keys"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.errno(), 22, "{text:?}");
            assert!(err.to_string().contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_bad_private_key_is_never_quoted() {
        let secret = format!("{}zz", &K1[..62]);
        let err = set(&format!("private_key={secret}"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains(&K1[..62]), "{err}");
    }

    #[test]
    fn a_request_over_its_bounds_is_refused_before_it_is_held() {
        let mut r = SetReader::default();
        let line = format!("public_key={K1}");
        let mut refused = None;
        for i in 0..(MAX_REQUEST_BYTES / line.len() + 2) {
            // Same key twice is refused first: vary it.
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            if let Err(e) = r.line(&format!("public_key={hex}")) {
                refused = Some((i, e));
                break;
            }
        }
        let (at, err) = refused.expect("refused");
        assert_eq!(
            err,
            Error::TooManyPeers {
                peers: MAX_PEERS + 1
            }
        );
        assert_eq!(at, MAX_PEERS);
        assert_eq!(err.errno(), errno::ENOSPC);
        let mut budget = Budget::default();
        let line = "allowed_ip=192.0.2.0/24";
        let taken = (0..).take_while(|_| budget.take(line).is_ok()).count();
        assert_eq!(taken, MAX_REQUEST_BYTES / (line.len() + 1));
        let err = budget.take(line).unwrap_err();
        assert_eq!(err, Error::RequestTooLong);
        assert!(err.closes() && err.errno() == errno::E2BIG);
    }
}
