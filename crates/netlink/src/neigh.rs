//! Neighbour (ARP/NDP) entries and bridge FDB entries, both permanent.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use super::decode::{self, attributes};
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

fn dump(sock: &mut Socket, family: AddressFamily, index: u32) -> Result<Vec<Entry>, Error> {
    let found = sock
        .dump_with(
            "list neighbours",
            RouteNetlinkMessage::GetNeighbour(dump_message(family, index)),
            &mut entry_of,
        )
        .map_err(|source| Error {
            entry: "neighbours".into(),
            index,
            source,
        })?;
    Ok(found.into_iter().filter(|e| e.index == index).collect())
}

/// `RTM_NEWNEIGH`, the type of every entry in a reply.
const RTM_NEWNEIGH: u16 = 28;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// `struct ndmsg`: family, two pads, index, state, flags, type.
const NDMSG_LEN: usize = 12;
const NUD_PERMANENT: u16 = 0x80;

/// One entry of a reply (a neighbour or an FDB entry), as far as [`Neighbour`] and [`Fdb`]
/// need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    index: u32,
    permanent: bool,
    /// `NDA_DST`: the neighbour's address, an FDB entry's destination.
    ip: Option<IpAddr>,
    /// `NDA_LLADDR`, when it is an Ethernet address.
    mac: Option<[u8; 6]>,
}

/// An [`Entry`] straight from an `RTM_NEWNEIGH` payload (other messages are skipped): a dump
/// of 100,000 entries decoded whole by `netlink-packet-route` cost more than the kernel took
/// to send it. The tests hold it to that full decoding.
fn entry_of(message_type: u16, payload: &[u8]) -> Result<Option<Entry>, decode::Error> {
    if message_type != RTM_NEWNEIGH {
        return Ok(None);
    }
    let short = || decode::Error::ShortNeighbour(payload.len());
    let header = payload.get(..NDMSG_LEN).ok_or_else(short)?;
    let index = <[u8; 4]>::try_from(&header[4..8]).map_err(|_| short())?;
    let state = <[u8; 2]>::try_from(&header[8..10]).map_err(|_| short())?;
    let mut entry = Entry {
        index: u32::from_ne_bytes(index),
        permanent: u16::from_ne_bytes(state) == NUD_PERMANENT,
        ip: None,
        mac: None,
    };
    for attribute in attributes(&payload[NDMSG_LEN..]) {
        let (kind, value) = attribute?;
        match kind {
            // The bridge family's NDA_DST is an IPv4 or IPv6 address too: its length says which.
            NDA_DST => {
                entry.ip = match value.len() {
                    4 => <[u8; 4]>::try_from(value).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(value).ok().map(IpAddr::from),
                    _ => None,
                }
            }
            NDA_LLADDR => entry.mac = <[u8; 6]>::try_from(value).ok(),
            _ => {}
        }
    }
    Ok(Some(entry))
}

/// Neighbour entries (both families, one dump: `AF_UNSPEC` covers ARP and NDP) on interface
/// `index`.
pub fn list(sock: &mut Socket, index: u32) -> Result<Vec<Neighbour>, Error> {
    Ok(dump(sock, AddressFamily::Unspec, index)?
        .into_iter()
        .filter_map(|e| {
            Some(Neighbour {
                index,
                ip: e.ip?,
                mac: e.mac?,
                permanent: e.permanent,
            })
        })
        .collect())
}

/// FDB entries with a destination (an underlay address, IPv4 or IPv6) on interface `index`
/// (a VTEP). One dump: the VXLAN driver starts each 32 KiB part of it from its first entry,
/// so its cost grows with the square of the entries (1.3 s at 100,000); [`fdb_of`] reads
/// known MACs for a cost that grows with them.
pub fn list_fdb(sock: &mut Socket, index: u32) -> Result<Vec<Fdb>, Error> {
    Ok(dump(sock, AddressFamily::Bridge, index)?
        .into_iter()
        .filter_map(|e| fdb_of_entry(index, e))
        .collect())
}

/// The FDB entries of `macs` on interface `index` (a VTEP), one GET each (`bridge fdb get
/// <mac> dev <vtep> self`, Linux 5.0+), sent as batches: a MAC with no entry is left out. The
/// kernel answers a GET with the entry's first destination only; a MAC with several is seen
/// with one. Where the kernel or the device has no FDB GET (`EOPNOTSUPP`: Linux before 5.0),
/// every entry, as [`list_fdb`] reads them.
pub fn fdb_of(sock: &mut Socket, index: u32, macs: &[[u8; 6]]) -> Result<Vec<Fdb>, Error> {
    let error = |source| Error {
        entry: "fdb entries".into(),
        index,
        source,
    };
    let requests = macs
        .iter()
        .map(|mac| socket::Request {
            what: "get fdb entry",
            message: RouteNetlinkMessage::GetNeighbour(get_fdb_message(index, *mac)),
            flags: 0,
        })
        .collect();
    let answers = sock.get_batch(requests, &mut entry_of).map_err(error)?;
    let mut found = Vec::new();
    for answer in answers {
        match answer {
            Ok(Some(e)) if e.index == index => found.extend(fdb_of_entry(index, e)),
            Ok(_) => {}
            Err(e) if e.is(Errno::ENOENT) => {}
            Err(e) if e.is(Errno::EOPNOTSUPP) => return list_fdb(sock, index),
            Err(e) => return Err(error(e)),
        }
    }
    Ok(found)
}

/// The GET of one MAC's entry on a VXLAN device: only the fields the kernel's strict check
/// of an FDB GET allows (the device's index, `NTF_SELF`, the MAC).
fn get_fdb_message(index: u32, mac: [u8; 6]) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    msg.header.ifindex = index;
    msg.header.flags = NeighbourFlags::Own;
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    msg
}

/// An FDB entry with a destination, as a dump or a GET gives it.
fn fdb_of_entry(index: u32, e: Entry) -> Option<Fdb> {
    Some(Fdb {
        index,
        mac: e.mac?,
        dst: e.ip?,
        permanent: e.permanent,
    })
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
        let read = entry_of(RTM_NEWNEIGH, &bytes(&fdb_message(&f))).unwrap();
        assert_eq!(read.and_then(|e| fdb_of_entry(5, e)), Some(f));
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
        let read = entry_of(RTM_NEWNEIGH, &bytes(&neighbour_message(&n))).unwrap();
        let expected = Entry {
            index: 5,
            permanent: true,
            ip: Some(n.ip),
            mac: Some(n.mac),
        };
        assert_eq!(read, Some(expected));
    }

    fn bytes(msg: &NeighbourMessage) -> Vec<u8> {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        buf
    }

    /// What `netlink-packet-route`'s full decoding of `msg` says of it.
    fn decoded_whole(msg: &NeighbourMessage) -> Entry {
        let ip = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
            NeighbourAttribute::Destination(NeighbourAddress::Other(raw)) => match raw.len() {
                4 => <[u8; 4]>::try_from(raw.as_slice()).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(raw.as_slice()).ok().map(IpAddr::from),
                _ => None,
            },
            _ => None,
        });
        let mac = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
            _ => None,
        });
        Entry {
            index: msg.header.ifindex,
            permanent: msg.header.state == NeighbourState::Permanent,
            ip,
            mac,
        }
    }

    /// The kernel's answers to FDB GETs: the entries of the MACs asked for, none for a MAC
    /// with no entry, and on a device without FDB GETs (a veth has no `ndo_fdb_get`, as no
    /// device has before Linux 5.0) every entry, as the dump reads them.
    #[test]
    #[ignore = "needs root: a network namespace"]
    fn fdb_entries_are_looked_up_by_mac_and_dumped_where_they_cannot_be() {
        crate::in_own_netns(crate::TEST_NODE, || {
            let mut sock = Socket::open().unwrap();
            let vt0 = crate::link::get(&mut sock, "vt0").unwrap().unwrap().index;
            let eth0 = crate::link::get(&mut sock, "eth0").unwrap().unwrap().index;
            let entries: Vec<Fdb> = (1..=250u8)
                .map(|i| Fdb {
                    index: vt0,
                    mac: [0x0a, 1, 198, 18, 1, i],
                    dst: IpAddr::V4(Ipv4Addr::new(198, 18, 1, i)),
                    permanent: true,
                })
                .collect();
            for f in &entries {
                add_fdb(&mut sock, f).unwrap();
            }
            // Every other one, and MACs with no entry.
            let mut macs: Vec<[u8; 6]> = entries.iter().step_by(2).map(|f| f.mac).collect();
            macs.extend((1..=50u8).map(|i| [0x0a, 1, 198, 18, 2, i]));
            let found = fdb_of(&mut sock, vt0, &macs).unwrap();
            let wanted: Vec<Fdb> = entries.iter().step_by(2).cloned().collect();
            assert_eq!(found, wanted);
            let whole = list_fdb(&mut sock, vt0).unwrap();
            assert_eq!(whole.len(), 250);
            assert_eq!(
                fdb_of(&mut sock, eth0, &macs).unwrap(),
                list_fdb(&mut sock, eth0).unwrap(),
                "no FDB GET on a veth: the dump's entries"
            );
        })
    }

    #[test]
    fn entries_read_from_their_bytes_as_the_full_decoding_reads_them() {
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let mut messages = vec![
            fdb_message(&Fdb {
                index: 7,
                mac: [2, 0, 0, 0, 0, 1],
                dst: "192.0.2.9".parse().unwrap(),
                permanent: true,
            }),
            fdb_message(&Fdb {
                index: 7,
                mac: [2, 0, 0, 0, 0, 2],
                dst: v6,
                permanent: true,
            }),
        ];
        // Learned (not permanent), with attributes the reader skips and an address that is
        // not Ethernet's; one with neither address.
        let mut learned = neighbour_message(&Neighbour {
            index: 3,
            ip: v6,
            mac: [0; 6],
            permanent: false,
        });
        learned.header.state = NeighbourState::Reachable;
        learned.attributes = vec![
            NeighbourAttribute::Probes(3),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(
                "2001:db8::8".parse().unwrap(),
            )),
            NeighbourAttribute::LinkLayerAddress(vec![1; 20]),
            NeighbourAttribute::Vni(42),
        ];
        messages.push(learned);
        let mut bare = NeighbourMessage::default();
        bare.header.ifindex = 11;
        messages.push(bare);
        for msg in &messages {
            let b = bytes(msg);
            let whole = NeighbourMessage::parse(b.as_slice()).unwrap();
            assert_eq!(
                entry_of(RTM_NEWNEIGH, &b).unwrap(),
                Some(decoded_whole(&whole)),
                "{msg:?}"
            );
        }
        assert_eq!(
            entry_of(RTM_NEWNEIGH + 1, &[]).unwrap(),
            None,
            "not an entry"
        );
        assert!(
            entry_of(RTM_NEWNEIGH, &[0; NDMSG_LEN - 1]).is_err(),
            "cut short"
        );
    }
}
