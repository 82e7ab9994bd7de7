//! Nexthop objects (Linux 5.3+, `ip nexthop`): a gateway and a device with an id of their own,
//! which routes name (`nhid`) instead of carrying the gateway themselves.
//!
//! Why they exist here: the kernel keeps one `fib_info` per distinct IPv4 route gateway, hashed
//! without the gateway, so N routes each via its own gateway share one hash bucket and every
//! insert walks the others (N² to program a node). A route naming a nexthop object is hashed
//! by the object's id: the same routes cost O(N) (docs/benchmarks.md, issue 37).
//!
//! `netlink-packet-route` has no nexthop messages, so they are encoded and read here, by hand:
//! `struct nhmsg` (family, scope, protocol, reserved, flags) and its `NHA_*` attributes.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE, parse_ip, parse_u32};
use nix::errno::Errno;

use super::decode::{self, attributes};
use super::socket::{self, Body, Socket};

const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;
const NHA_ID: u16 = 1;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
/// `struct nhmsg`.
const NHMSG_LEN: usize = 8;
/// `RTNH_F_ONLINK` in `nh_flags`.
const ONLINK: u32 = 4;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

#[derive(Debug, thiserror::Error)]
#[error("nexthop {nexthop}: {source}")]
pub struct Error {
    pub nexthop: String,
    #[source]
    pub source: socket::Error,
}

/// One nexthop object: a single gateway on a device (groups and blackholes are read as
/// having no gateway).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexthop {
    pub id: u32,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// The gateway is reachable on `oif` whatever the interface's addresses.
    pub onlink: bool,
    /// Its protocol number (`proto` in `ip nexthop`), as routes have one.
    pub protocol: u8,
}

impl std::fmt::Display for Nexthop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "id {}", self.id)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev #{oif}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        write!(f, " proto {}", self.protocol)
    }
}

fn attribute(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// `struct nhmsg` then the attributes: the object's id, device and gateway.
fn payload(nh: &Nexthop) -> Vec<u8> {
    let family = match nh.gateway {
        Some(IpAddr::V4(_)) => AF_INET,
        Some(IpAddr::V6(_)) => AF_INET6,
        None => 0,
    };
    let flags = if nh.onlink { ONLINK } else { 0 };
    let mut out = vec![family, 0, nh.protocol, 0];
    out.extend_from_slice(&flags.to_ne_bytes());
    attribute(&mut out, NHA_ID, &nh.id.to_ne_bytes());
    if let Some(oif) = nh.oif {
        attribute(&mut out, NHA_OIF, &oif.to_ne_bytes());
    }
    match nh.gateway {
        Some(IpAddr::V4(a)) => attribute(&mut out, NHA_GATEWAY, &a.octets()),
        Some(IpAddr::V6(a)) => attribute(&mut out, NHA_GATEWAY, &a.octets()),
        None => {}
    }
    out
}

/// A delete, a get and a dump request carry a zeroed header (the kernel refuses anything
/// else in it) and the one attribute they filter on.
fn query(kind: u16, value: u32) -> Vec<u8> {
    let mut out = vec![0; NHMSG_LEN];
    attribute(&mut out, kind, &value.to_ne_bytes());
    out
}

/// A [`Nexthop`] from an `RTM_NEWNEXTHOP` payload.
fn parse(payload: &[u8]) -> Result<Nexthop, decode::Error> {
    let header = payload
        .get(..NHMSG_LEN)
        .ok_or(decode::Error::ShortNexthop(payload.len()))?;
    let flags = u32::from_ne_bytes([header[4], header[5], header[6], header[7]]);
    let mut nh = Nexthop {
        id: 0,
        gateway: None,
        oif: None,
        onlink: flags & ONLINK != 0,
        protocol: header[2],
    };
    for attribute in attributes(&payload[NHMSG_LEN..]) {
        let (kind, value) = attribute?;
        match kind {
            NHA_ID => nh.id = parse_u32(value).map_err(decode::Error::Attribute)?,
            NHA_OIF => nh.oif = Some(parse_u32(value).map_err(decode::Error::Attribute)?),
            NHA_GATEWAY => nh.gateway = Some(parse_ip(value).map_err(decode::Error::Attribute)?),
            _ => {}
        }
    }
    Ok(nh)
}

fn nexthops_of(message_type: u16, payload: &[u8]) -> Result<Option<Nexthop>, decode::Error> {
    if message_type == RTM_NEWNEXTHOP {
        parse(payload).map(Some)
    } else {
        Ok(None)
    }
}

/// Every nexthop object of the namespace (whose they are is the caller's to say: a route
/// names an object by id, wherever it is).
pub fn list(sock: &mut Socket) -> Result<Vec<Nexthop>, Error> {
    let request = Body::Raw {
        message_type: RTM_GETNEXTHOP,
        payload: vec![0; NHMSG_LEN],
    };
    sock.dump_with("list nexthops", request, &mut nexthops_of)
        .map_err(|source| Error {
            nexthop: "*".into(),
            source,
        })
}

/// The nexthop object of this id, if there is one (any owner, any device).
pub fn get(sock: &mut Socket, id: u32) -> Result<Option<Nexthop>, Error> {
    let request = Body::Raw {
        message_type: RTM_GETNEXTHOP,
        payload: query(NHA_ID, id),
    };
    match sock.request_with("get nexthop", request, 0, &mut nexthops_of) {
        Ok(found) => Ok(found.into_iter().next()),
        Err(e) if e.is(Errno::ENOENT) => Ok(None),
        Err(source) => Err(Error {
            nexthop: format!("id {id}"),
            source,
        }),
    }
}

/// One write of a nexthop object, alone or in a batch ([`Socket::request_batch`]): its
/// request, and what the kernel's answer means.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// Creates it, or changes the object of that id in place (the routes naming it follow).
    Replace(&'a Nexthop),
    /// Deletes it, and with it every route that names it. One already gone is success.
    Delete(&'a Nexthop),
}

impl Write<'_> {
    pub fn request(self) -> socket::Request {
        match self {
            Write::Replace(nh) => socket::Request {
                what: "replace nexthop",
                message: Body::Raw {
                    message_type: RTM_NEWNEXTHOP,
                    payload: payload(nh),
                },
                flags: NLM_F_CREATE | NLM_F_REPLACE,
            },
            Write::Delete(nh) => socket::Request {
                what: "delete nexthop",
                message: Body::Raw {
                    message_type: RTM_DELNEXTHOP,
                    payload: query(NHA_ID, nh.id),
                },
                flags: 0,
            },
        }
    }

    /// The outcome of the write, from the kernel's answer to [`Write::request`].
    pub fn answer(self, answer: Result<(), socket::Error>) -> Result<(), Error> {
        let (Write::Replace(nh) | Write::Delete(nh)) = self;
        match answer {
            Ok(()) => Ok(()),
            Err(e) if matches!(self, Write::Delete(_)) && e.is(Errno::ENOENT) => Ok(()),
            Err(source) => Err(Error {
                nexthop: nh.to_string(),
                source,
            }),
        }
    }
}

/// Creates or changes the nexthop object.
pub fn replace(sock: &mut Socket, nh: &Nexthop) -> Result<(), Error> {
    Write::Replace(nh).answer(sock.write(Write::Replace(nh).request()))
}

/// Deletes the nexthop object (and the routes naming it); one already gone is success.
pub fn delete(sock: &mut Socket, nh: &Nexthop) -> Result<(), Error> {
    Write::Delete(nh).answer(sock.write(Write::Delete(nh).request()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(id: u32) -> Nexthop {
        Nexthop {
            id,
            gateway: Some("10.244.2.0".parse().unwrap()),
            oif: Some(9),
            onlink: true,
            protocol: 118,
        }
    }

    #[test]
    fn a_replace_reads_back_as_itself() {
        let nh = ours(0x0af4_0200);
        assert_eq!(parse(&payload(&nh)).unwrap(), nh);
        let v6 = Nexthop {
            gateway: Some("2001:db8:2::".parse().unwrap()),
            onlink: false,
            ..ours(7)
        };
        assert_eq!(parse(&payload(&v6)).unwrap(), v6);
    }

    #[test]
    fn the_header_says_family_protocol_and_onlink() {
        let bytes = payload(&ours(1));
        assert_eq!(&bytes[..4], &[AF_INET, 0, 118, 0]);
        assert_eq!(u32::from_ne_bytes(bytes[4..8].try_into().unwrap()), ONLINK);
    }

    #[test]
    fn queries_carry_a_zeroed_header_and_one_attribute() {
        let bytes = query(NHA_ID, 9);
        assert_eq!(&bytes[..NHMSG_LEN], &[0; NHMSG_LEN]);
        let attrs: Vec<_> = attributes(&bytes[NHMSG_LEN..])
            .map(|a| a.unwrap())
            .collect();
        assert_eq!(attrs, vec![(NHA_ID, &9u32.to_ne_bytes()[..])]);
    }

    #[test]
    fn a_short_message_is_an_error() {
        assert!(matches!(
            parse(&[2, 0, 118]),
            Err(decode::Error::ShortNexthop(3))
        ));
    }

    /// Root: the kernel takes what [`Write`] sends, lists it back, and a route naming it
    /// carries traffic's gateway (`nexthop_compat_mode` shows it on the route as well).
    #[test]
    #[ignore = "needs root"]
    fn the_kernel_takes_lists_and_deletes_a_nexthop() {
        crate::in_own_netns(
            &[
                &[
                    "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
                ],
                &["addr", "add", "192.0.2.1/24", "dev", "eth0"],
                &["link", "set", "eth0", "up"],
                crate::TEST_VTEP,
                &["link", "set", "vt0", "up"],
            ],
            || {
                let mut sock = Socket::open().unwrap();
                let vt0 = crate::link::get(&mut sock, "vt0").unwrap().unwrap().index;
                let nh = Nexthop {
                    oif: Some(vt0),
                    ..ours(0x0af4_0200)
                };
                replace(&mut sock, &nh).unwrap();
                replace(&mut sock, &nh).unwrap();
                assert_eq!(list(&mut sock).unwrap(), vec![nh.clone()]);
                assert_eq!(get(&mut sock, nh.id).unwrap(), Some(nh.clone()));
                assert_eq!(get(&mut sock, 5).unwrap(), None);
                delete(&mut sock, &nh).unwrap();
                delete(&mut sock, &nh).unwrap();
                assert!(list(&mut sock).unwrap().is_empty());
            },
        );
    }
}
