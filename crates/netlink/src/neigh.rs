//! Neighbour (ARP/NDP) entries and bridge FDB entries, both permanent.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use super::socket::{self, Socket};

#[derive(Debug, thiserror::Error)]
#[error("{entry} on interface #{index}: {source}")]
pub struct Error {
    pub entry: String,
    pub index: u32,
    #[source]
    pub source: socket::Error,
}

/// A neighbour entry: `ip` is at `mac` on interface `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub index: u32,
    pub ip: IpAddr,
    pub mac: [u8; 6],
    pub permanent: bool,
}

/// A bridge FDB entry on a VTEP: frames for `mac` go to underlay address `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fdb {
    pub index: u32,
    pub mac: [u8; 6],
    pub dst: IpAddr,
    pub permanent: bool,
}

fn ip_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

pub(crate) fn neighbour_message(n: &Neighbour) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = if n.ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    msg.header.ifindex = n.index;
    msg.header.state = NeighbourState::Permanent;
    msg.header.kind = RouteType::Unicast;
    msg.attributes
        .push(NeighbourAttribute::Destination(ip_address(n.ip)));
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(n.mac.to_vec()));
    msg
}

pub(crate) fn fdb_message(f: &Fdb) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    msg.header.ifindex = f.index;
    msg.header.state = NeighbourState::Permanent;
    msg.header.flags = NeighbourFlags::Own;
    msg.header.kind = RouteType::Unicast;
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(f.mac.to_vec()));
    msg.attributes
        .push(NeighbourAttribute::Destination(ip_address(f.dst)));
    msg
}

/// Adds or replaces a permanent neighbour entry.
pub fn replace(sock: &mut Socket, n: &Neighbour) -> Result<(), Error> {
    Write::ReplaceNeighbour(n).answer(sock.write(Write::ReplaceNeighbour(n).request()))
}

pub fn delete(sock: &mut Socket, n: &Neighbour) -> Result<(), Error> {
    Write::DeleteNeighbour(n).answer(sock.write(Write::DeleteNeighbour(n).request()))
}

/// Adds a permanent FDB entry (`bridge fdb append`: one MAC may have several destinations,
/// so the entry for another MAC is never disturbed).
pub fn add_fdb(sock: &mut Socket, f: &Fdb) -> Result<(), Error> {
    Write::AddFdb(f).answer(sock.write(Write::AddFdb(f).request()))
}

pub fn delete_fdb(sock: &mut Socket, f: &Fdb) -> Result<(), Error> {
    Write::DeleteFdb(f).answer(sock.write(Write::DeleteFdb(f).request()))
}

/// One write of an entry, alone ([`replace`], [`add_fdb`], ...) or in a batch
/// ([`Socket::request_batch`]): its request, and what the kernel's answer means.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    ReplaceNeighbour(&'a Neighbour),
    /// One already gone is success.
    DeleteNeighbour(&'a Neighbour),
    /// One already there is success.
    AddFdb(&'a Fdb),
    /// One already gone is success.
    DeleteFdb(&'a Fdb),
}

impl Write<'_> {
    pub fn request(self) -> socket::Request {
        let (what, message, flags) = match self {
            Write::ReplaceNeighbour(n) => (
                "replace neighbour",
                RouteNetlinkMessage::NewNeighbour(neighbour_message(n)),
                NLM_F_CREATE | NLM_F_REPLACE,
            ),
            Write::DeleteNeighbour(n) => (
                "delete neighbour",
                RouteNetlinkMessage::DelNeighbour(neighbour_message(n)),
                0,
            ),
            Write::AddFdb(f) => (
                "add fdb entry",
                RouteNetlinkMessage::NewNeighbour(fdb_message(f)),
                NLM_F_CREATE | NLM_F_APPEND,
            ),
            Write::DeleteFdb(f) => (
                "delete fdb entry",
                RouteNetlinkMessage::DelNeighbour(fdb_message(f)),
                0,
            ),
        };
        socket::Request {
            what,
            message,
            flags,
        }
    }

    /// The outcome of the write, from the kernel's answer to [`Write::request`].
    pub fn answer(self, answer: Result<(), socket::Error>) -> Result<(), Error> {
        let Err(source) = answer else {
            return Ok(());
        };
        let (entry, index, fine) = match self {
            Write::ReplaceNeighbour(n) => (format!("neighbour {}", n.ip), n.index, None),
            Write::DeleteNeighbour(n) => {
                (format!("neighbour {}", n.ip), n.index, Some(Errno::ENOENT))
            }
            Write::AddFdb(f) => (fdb_entry(f), f.index, Some(Errno::EEXIST)),
            Write::DeleteFdb(f) => (fdb_entry(f), f.index, Some(Errno::ENOENT)),
        };
        if fine.is_some_and(|errno| source.is(errno)) {
            return Ok(());
        }
        Err(Error {
            entry,
            index,
            source,
        })
    }
}

fn fdb_entry(f: &Fdb) -> String {
    format!("fdb {} dst {}", super::link::format_mac(&f.mac), f.dst)
}

/// The request that dumps the entries of `family` on interface `index`. The kernel filters
/// by it (FDB: the header's index, with strict checking; neighbours: `NDA_IFINDEX`); callers
/// filter again, for kernels that do not.
fn dump_message(family: AddressFamily, index: u32) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = family;
    if family == AddressFamily::Bridge {
        msg.header.ifindex = index;
    } else {
        msg.attributes.push(NeighbourAttribute::IfIndex(index));
    }
    msg
}

fn dump(
    sock: &mut Socket,
    family: AddressFamily,
    index: u32,
) -> Result<Vec<NeighbourMessage>, Error> {
    let found = sock
        .dump(
            "list neighbours",
            RouteNetlinkMessage::GetNeighbour(dump_message(family, index)),
        )
        .map_err(|source| Error {
            entry: "neighbours".into(),
            index,
            source,
        })?;
    Ok(found
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) if n.header.ifindex == index => Some(n),
            _ => None,
        })
        .collect())
}

fn mac_of(msg: &NeighbourMessage) -> Option<[u8; 6]> {
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
        _ => None,
    })
}

/// Neighbour entries (both families, one dump: `AF_UNSPEC` covers ARP and NDP) on interface
/// `index`.
pub fn list(sock: &mut Socket, index: u32) -> Result<Vec<Neighbour>, Error> {
    Ok(dump(sock, AddressFamily::Unspec, index)?
        .into_iter()
        .filter_map(|msg| {
            let ip = msg.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                _ => None,
            })?;
            Some(Neighbour {
                index,
                ip,
                mac: mac_of(&msg)?,
                permanent: msg.header.state == NeighbourState::Permanent,
            })
        })
        .collect())
}

/// FDB entries with a destination (an underlay address, IPv4 or IPv6) on interface `index`
/// (a VTEP).
pub fn list_fdb(sock: &mut Socket, index: u32) -> Result<Vec<Fdb>, Error> {
    Ok(dump(sock, AddressFamily::Bridge, index)?
        .into_iter()
        .filter_map(|msg| {
            let dst = msg.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                // The bridge family's NDA_DST comes back undecoded: its length says which.
                NeighbourAttribute::Destination(NeighbourAddress::Other(raw)) => match raw.len() {
                    4 => <[u8; 4]>::try_from(raw.as_slice())
                        .ok()
                        .map(|a| IpAddr::V4(a.into())),
                    16 => <[u8; 16]>::try_from(raw.as_slice())
                        .ok()
                        .map(|a| IpAddr::V6(a.into())),
                    _ => None,
                },
                _ => None,
            })?;
            Some(Fdb {
                index,
                mac: mac_of(&msg)?,
                dst,
                permanent: msg.header.state == NeighbourState::Permanent,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    fn round_trip(msg: &NeighbourMessage) -> NeighbourMessage {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        NeighbourMessage::parse(buf.as_slice()).unwrap()
    }

    #[test]
    fn fdb_entry_is_permanent_self_bridge_family() {
        let f = Fdb {
            index: 5,
            mac: [0x0a, 1, 192, 0, 2, 2],
            dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
            permanent: true,
        };
        let back = round_trip(&fdb_message(&f));
        assert_eq!(back.header.family, AddressFamily::Bridge);
        assert_eq!(back.header.state, NeighbourState::Permanent);
        assert!(back.header.flags.contains(NeighbourFlags::Own));
        assert_eq!(mac_of(&back), Some(f.mac));
    }

    #[test]
    fn dumps_ask_the_kernel_for_one_interface_only() {
        let fdb = round_trip(&dump_message(AddressFamily::Bridge, 9));
        assert_eq!(
            fdb.header.ifindex, 9,
            "the FDB dump filters by the header's index"
        );
        assert!(fdb.attributes.is_empty(), "{fdb:?}");
        let neigh = round_trip(&dump_message(AddressFamily::Unspec, 9));
        assert_eq!(
            neigh.header.family,
            AddressFamily::Unspec,
            "ARP and NDP at once"
        );
        assert_eq!(
            neigh.header.ifindex, 0,
            "strict checking refuses an index here"
        );
        assert_eq!(neigh.attributes, vec![NeighbourAttribute::IfIndex(9)]);
        // Strict checking refuses any other header field in a dump request.
        for m in [&fdb, &neigh] {
            assert_eq!(m.header.state, NeighbourState::None);
            assert_eq!(m.header.kind, RouteType::Unspec);
            assert!(m.header.flags.is_empty());
        }
    }

    #[test]
    fn neighbour_entry_is_permanent() {
        let n = Neighbour {
            index: 5,
            ip: "10.244.2.0".parse().unwrap(),
            mac: [0x0a, 1, 192, 0, 2, 2],
            permanent: true,
        };
        let back = round_trip(&neighbour_message(&n));
        assert_eq!(back.header.family, AddressFamily::Inet);
        assert_eq!(back.header.state, NeighbourState::Permanent);
        assert_eq!(mac_of(&back), Some(n.mac));
    }
}
