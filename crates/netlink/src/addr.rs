//! Interface addresses.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use super::socket::{self, Socket};

#[derive(Debug, thiserror::Error)]
#[error("address {addr} on interface #{index}: {source}")]
pub struct Error {
    pub addr: String,
    pub index: u32,
    #[source]
    pub source: socket::Error,
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

pub fn message(index: u32, net: IpNet) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = family(net.addr());
    msg.header.prefix_len = net.prefix_len();
    msg.header.index = index;
    msg.attributes.push(AddressAttribute::Local(net.addr()));
    msg.attributes.push(AddressAttribute::Address(net.addr()));
    if net.addr().is_ipv6() {
        // Our addresses are unique by construction (IPAM, or the subnet's gateway):
        // duplicate address detection would only keep them tentative for a second or two.
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    msg
}

/// Adds `net` (address/prefix) to the interface; an address already there is replaced.
pub fn add(sock: &mut Socket, index: u32, net: IpNet) -> Result<(), Error> {
    sock.request(
        "add address",
        RouteNetlinkMessage::NewAddress(message(index, net)),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
    .map(drop)
    .map_err(|source| Error {
        addr: net.to_string(),
        index,
        source,
    })
}

/// Removes `net`; an address that is not there is success.
pub fn delete(sock: &mut Socket, index: u32, net: IpNet) -> Result<(), Error> {
    match sock.request(
        "delete address",
        RouteNetlinkMessage::DelAddress(message(index, net)),
        0,
    ) {
        Ok(_) => Ok(()),
        Err(e) if e.is(Errno::EADDRNOTAVAIL) || e.is(Errno::ENOENT) => Ok(()),
        Err(source) => Err(Error {
            addr: net.to_string(),
            index,
            source,
        }),
    }
}

/// Every address on interface `index` (both families). The request names the index, so a
/// socket that checks strictly (ours do) gets only that interface's addresses, not the node's;
/// the others are dropped here if a kernel sent them anyway.
pub fn list(sock: &mut Socket, index: u32) -> Result<Vec<IpNet>, Error> {
    Ok(dump(sock, index)?
        .into_iter()
        .filter(|(i, _)| *i == index)
        .map(|(_, net)| net)
        .collect())
}

/// Every address of the namespace, with the index of the interface holding it.
pub fn list_all(sock: &mut Socket) -> Result<Vec<(u32, IpNet)>, Error> {
    dump(sock, 0)
}

/// The addresses of interface `index` (0: of every interface), with their interface's index.
fn dump(sock: &mut Socket, index: u32) -> Result<Vec<(u32, IpNet)>, Error> {
    let mut msg = AddressMessage::default();
    msg.header.index = index;
    let found = sock
        .dump("list addresses", RouteNetlinkMessage::GetAddress(msg))
        .map_err(|source| Error {
            addr: "*".into(),
            index,
            source,
        })?;
    Ok(found
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => {
                let ip = a.attributes.iter().find_map(|attr| match attr {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    a.attributes.iter().find_map(|attr| match attr {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })?;
                Some((a.header.index, IpNet::new(ip, a.header.prefix_len).ok()?))
            }
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};

    #[test]
    fn message_has_family_prefix_and_local() {
        let msg = message(4, "10.244.1.1/24".parse().unwrap());
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        let back = AddressMessage::parse(buf.as_slice()).unwrap();
        assert_eq!(back.header.family, AddressFamily::Inet);
        assert_eq!(back.header.prefix_len, 24);
        assert_eq!(back.header.index, 4);
        assert!(
            back.attributes
                .contains(&AddressAttribute::Local("10.244.1.1".parse().unwrap()))
        );
        let v6 = message(4, "fd00::1/64".parse().unwrap());
        assert_eq!(v6.header.family, AddressFamily::Inet6);
    }
}
