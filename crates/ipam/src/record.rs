//! One allocation file: its name (`<ip>` or `<ip>_<namespace>_<pod>`) and its body.
//!
//! Bodies, by file name:
//! - `<ip>`: host-local's format, byte for byte: `<containerID>\r\n<ifname>` (no newline at the
//!   end). Very old host-local wrote only the container id; that is read too.
//! - `<ip>_<ns>_<pod>`: a lease, one JSON object and a newline:
//!   `{"format":"sticky-ipam/v1","containerId":…,"ifname":…,"namespace":…,"pod":…,
//!   "podUid":…,"boot":…,"state":"attached"|"released","releaseSeq":…,"releasedAt":…}`.
//!   An empty body (OpenYurt's marker file) or host-local's body (a conversion interrupted
//!   after its rename) is a *marker*: identity from the name, nothing else known.
//! - Anything else under an identity name — a lease of a newer format, a damaged body — and a
//!   record that is not a regular file (a planted link, a FIFO) is *held*: the address is
//!   taken, never handed out, reclaimed or expired, until an operator looks (`list` shows it).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::identity;

/// The format tag of lease bodies written by this version.
pub const LEASE_FORMAT: &str = "sticky-ipam/v1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Attached,
    Released,
}

/// A sticky lease: the body of an `<ip>_<ns>_<pod>` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub format: String,
    pub container_id: String,
    pub ifname: String,
    pub namespace: String,
    pub pod: String,
    #[serde(default)]
    pub pod_uid: String,
    /// The kernel boot id when the lease was last attached.
    #[serde(default)]
    pub boot: String,
    pub state: State,
    /// Position in the data dir's release order (0 while attached): lowest is reclaimed first.
    #[serde(default)]
    pub release_seq: u64,
    /// The data dir's lease clock at release, in its seconds ([`super::lifecycle::LeaseClock`];
    /// 0 while attached); only for `leaseHold`. Stored as `releasedAt`, the name the format
    /// has had since its first release.
    #[serde(default, rename = "releasedAt")]
    pub release_clock: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    HostLocal {
        container_id: String,
        ifname: Option<String>,
    },
    Lease(Lease),
    Marker,
    /// Unreadable by this version: why, for the operator.
    Held(String),
}

/// A record file, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub ip: IpAddr,
    /// The file name, exactly as on disk.
    pub name: String,
    pub body: Body,
}

/// Splits a file name into its IP and, for identity records, the `_<ns>_<pod>` suffix.
/// `None` for anything that is not a record name (lock, hints, temp files).
pub fn parse_name(name: &str) -> Option<(IpAddr, Option<&str>)> {
    // Byte searches: `_` is ASCII, and a char searcher was a fifth of a DEL's instructions
    // when a bucket of a large directory is read.
    let (ip_text, suffix) = match name.bytes().position(|b| b == b'_') {
        Some(i) => (&name[..i], Some(&name[i..])),
        None => (name, None),
    };
    let ip: IpAddr = ip_text.parse().ok()?;
    // Only the canonical spelling is a record name (IPv4's parser already refuses leading
    // zeros; IPv6 has many spellings).
    if ip.is_ipv6() && ip.to_string() != ip_text {
        return None;
    }
    if suffix.is_some_and(|s| s.bytes().filter(|&b| b == b'_').count() != 2) {
        return None;
    }
    Some((ip, suffix))
}

/// The namespace and pod spelled by a suffix, when it is not shortened.
pub(crate) fn suffix_identity(suffix: &str) -> Option<(String, String)> {
    let (ns, pod) = suffix.strip_prefix('_')?.split_once('_')?;
    Some((identity::decode(ns)?, identity::decode(pod)?))
}

/// The body of an `<ip>_<ns>_<pod>` file.
fn identity_body(body: &[u8]) -> Body {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return Body::Marker;
    }
    if !text.starts_with('{') {
        // host-local's `<containerID>\r\n<ifname>`, renamed by a conversion a crash cut short.
        let id = text.split_once("\r\n").map_or(text, |(id, _)| id);
        return match cni_protocol::env::validate_container_id(id.trim()) {
            Ok(()) => Body::Marker,
            Err(_) => Body::Held("damaged: neither a lease nor host-local's format".into()),
        };
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match v.get("format").and_then(serde_json::Value::as_str) {
            Some(LEASE_FORMAT) => match serde_json::from_value::<Lease>(v) {
                Ok(lease) => Body::Lease(lease),
                Err(e) => Body::Held(format!("damaged {LEASE_FORMAT} lease: {e}")),
            },
            Some(other) => Body::Held(format!(
                "lease format {other:?}, which this version ({LEASE_FORMAT}) cannot read"
            )),
            None => Body::Held("damaged: a JSON body without a lease format".into()),
        },
        Err(e) => Body::Held(format!("damaged lease: {e}")),
    }
}

impl Record {
    /// Parses a file's body according to its name.
    pub fn parse(name: &str, body: &[u8]) -> Option<Record> {
        let (ip, suffix) = parse_name(name)?;
        let body = match suffix {
            Some(_) => identity_body(body),
            None => {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                match text.split_once("\r\n") {
                    Some((id, ifname)) => Body::HostLocal {
                        container_id: id.trim().to_string(),
                        ifname: Some(ifname.trim().to_string()),
                    },
                    None => Body::HostLocal {
                        container_id: text.to_string(),
                        ifname: None,
                    },
                }
            }
        };
        Some(Record {
            ip,
            name: name.to_string(),
            body,
        })
    }

    /// A record this version cannot read (`why`), when `name` is a record name.
    pub fn held(name: &str, why: &str) -> Option<Record> {
        let (ip, _) = parse_name(name)?;
        Some(Record {
            ip,
            name: name.to_string(),
            body: Body::Held(why.to_string()),
        })
    }

    /// A host-local record for an attachment without pod identity.
    pub fn host_local(ip: IpAddr, container_id: &str, ifname: &str) -> Record {
        Record {
            ip,
            name: ip.to_string(),
            body: Body::HostLocal {
                container_id: container_id.into(),
                ifname: Some(ifname.into()),
            },
        }
    }

    /// A lease record for `pod` at `ip`.
    pub fn lease(ip: IpAddr, pod: &identity::Pod, lease: Lease) -> Record {
        Record {
            ip,
            name: format!("{ip}{}", pod.suffix()),
            body: Body::Lease(lease),
        }
    }

    /// The bytes written to disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.body {
            Body::HostLocal {
                container_id,
                ifname: Some(ifname),
            } => format!("{container_id}\r\n{ifname}").into_bytes(),
            Body::HostLocal {
                container_id,
                ifname: None,
            } => container_id.clone().into_bytes(),
            Body::Lease(lease) => {
                // A struct of strings and integers always serializes.
                let mut text = serde_json::to_string(lease).unwrap_or_default();
                text.push('\n');
                text.into_bytes()
            }
            Body::Marker | Body::Held(_) => Vec::new(),
        }
    }

    /// The `_<ns>_<pod>` part of the name, for identity records.
    pub fn suffix(&self) -> Option<&str> {
        parse_name(&self.name).and_then(|(_, s)| s)
    }

    /// Whether this record is the attachment (container id, ifname).
    pub(crate) fn is_attachment(&self, container_id: &str, ifname: &str) -> bool {
        match &self.body {
            Body::HostLocal {
                container_id: c,
                ifname: i,
            } => c == container_id && i.as_deref().is_none_or(|i| i == ifname),
            Body::Lease(l) => {
                l.state == State::Attached && l.container_id == container_id && l.ifname == ifname
            }
            Body::Marker | Body::Held(_) => false,
        }
    }

    pub(crate) fn lease_ref(&self) -> Option<&Lease> {
        match &self.body {
            Body::Lease(l) => Some(l),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            parse_name("10.0.0.5"),
            Some(("10.0.0.5".parse().unwrap(), None))
        );
        assert_eq!(
            parse_name("2001:db8::5_ns_p"),
            Some(("2001:db8::5".parse().unwrap(), Some("_ns_p")))
        );
        assert_eq!(parse_name("10.0.0.5__p").map(|x| x.1), Some(Some("__p")));
        for not in [
            "lock",
            "last_reserved_ip.0",
            ".tmp.1",
            "10.0.0.5_a",
            "10.0.0.5_a_b_c",
            "010.0.0.5",
        ] {
            assert_eq!(parse_name(not), None, "{not}");
        }
    }

    #[test]
    fn host_local_body_round_trips_byte_for_byte() {
        let r = Record::parse("10.0.0.5", b"abc\r\neth0").unwrap();
        assert_eq!(
            r.body,
            Body::HostLocal {
                container_id: "abc".into(),
                ifname: Some("eth0".into())
            }
        );
        assert_eq!(r.to_bytes(), b"abc\r\neth0");
        assert!(r.is_attachment("abc", "eth0") && !r.is_attachment("abc", "eth1"));
        let old = Record::parse("10.0.0.5", b"abc\n").unwrap();
        assert!(
            old.is_attachment("abc", "eth1"),
            "id-only records match any interface"
        );
    }

    /// `release_clock` is stored as `releasedAt`, as every release has written it: a lease
    /// file written before the rename loads, and is written back byte for byte.
    #[test]
    fn a_lease_written_by_an_earlier_release_loads_and_is_written_back_unchanged() {
        let old = br#"{"format":"sticky-ipam/v1","containerId":"c","ifname":"eth0","namespace":"ns","pod":"p","podUid":"u","boot":"b","state":"released","releaseSeq":3,"releasedAt":9}"#;
        let r = Record::parse("10.0.0.5_ns_p", old).unwrap();
        let Body::Lease(lease) = &r.body else {
            panic!("not a lease: {:?}", r.body);
        };
        assert_eq!((lease.release_seq, lease.release_clock), (3, 9));
        let mut written = old.to_vec();
        written.push(b'\n');
        assert_eq!(r.to_bytes(), written);
    }

    #[test]
    fn lease_bodies_and_markers() {
        let lease = Lease {
            format: LEASE_FORMAT.into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            namespace: "ns".into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            boot: "b".into(),
            state: State::Released,
            release_seq: 3,
            release_clock: 9,
        };
        let pod = identity::Pod {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
        };
        let r = Record::lease("10.0.0.5".parse().unwrap(), &pod, lease.clone());
        assert_eq!(r.name, "10.0.0.5_ns_p");
        let back = Record::parse(&r.name, &r.to_bytes()).unwrap();
        assert_eq!(back.body, Body::Lease(lease));
        assert!(!back.is_attachment("c", "eth0"), "released");
        for marker in [&b""[..], b"\n", b"abc\r\neth0", b"abc"] {
            assert_eq!(
                Record::parse("10.0.0.5_ns_p", marker).unwrap().body,
                Body::Marker
            );
        }
        // Damage and newer formats are held: never read as a released lease.
        for held in [
            &b"{"[..],
            b"{\"format\":\"sticky-ipam/v2\"}",
            b"{\"format\":\"sticky-ipam/v1\",\"state\":\"gone\"}",
            b"[1]",
            b"\x00\xff",
            b"a b\r\neth0",
        ] {
            let body = Record::parse("10.0.0.5_ns_p", held).unwrap().body;
            assert!(matches!(body, Body::Held(_)), "{held:?}: {body:?}");
        }
        assert_eq!(
            suffix_identity("_ns_a%5Fb"),
            Some(("ns".into(), "a_b".into()))
        );
    }
}
