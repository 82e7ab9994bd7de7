//! Routes in the main table, tagged with a route protocol number so ours can be found again.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use super::socket::{self, Socket};

#[derive(Debug, thiserror::Error)]
#[error("route {route}: {source}")]
pub struct Error {
    pub route: String,
    #[source]
    pub source: socket::Error,
}

/// One route in the main table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// `onlink`: the gateway is reachable on `oif` whatever the interface's addresses.
    pub onlink: bool,
    /// Its priority (`metric` in `ip route`). 0 is the family's default: the kernel makes an
    /// IPv6 route's 0 into 1024, which reads back as 0 here, so a route reads as written.
    pub metric: u32,
    /// The route protocol number (`proto` in `ip route`); 0 means unspecified.
    pub protocol: u8,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev #{oif}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        write!(f, " proto {}", self.protocol)?;
        if self.metric != 0 {
            write!(f, " metric {}", self.metric)?;
        }
        Ok(())
    }
}

fn address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn from_address(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

pub fn message(route: &Route) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(route.dst.addr());
    msg.header.destination_prefix_length = route.dst.prefix_len();
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = RouteProtocol::from(route.protocol);
    msg.header.kind = RouteType::Unicast;
    msg.header.scope = if route.gateway.is_some() {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    if route.onlink {
        msg.header.flags = RouteFlags::Onlink;
    }
    msg.attributes
        .push(RouteAttribute::Destination(address(route.dst.network())));
    if let Some(gw) = route.gateway {
        msg.attributes.push(RouteAttribute::Gateway(address(gw)));
    }
    if let Some(oif) = route.oif {
        msg.attributes.push(RouteAttribute::Oif(oif));
    }
    if route.metric != 0 {
        msg.attributes.push(RouteAttribute::Priority(route.metric));
    }
    msg
}

/// IPv6's default metric: the kernel's for a route written with none.
const IPV6_DEFAULT_METRIC: u32 = 1024;

fn parse(msg: &RouteMessage) -> Option<Route> {
    if msg.header.table != RouteHeader::RT_TABLE_MAIN || msg.header.kind != RouteType::Unicast {
        return None;
    }
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut metric = 0;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = from_address(a),
            RouteAttribute::Gateway(a) => gateway = from_address(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => metric = *p,
            _ => {}
        }
    }
    let dst = match dst {
        Some(ip) => IpNet::new(ip, msg.header.destination_prefix_length).ok()?,
        None if msg.header.address_family == AddressFamily::Inet6 => {
            IpNet::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0).ok()?
        }
        None => IpNet::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0).ok()?,
    };
    Some(Route {
        dst,
        gateway,
        oif,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
        metric: match msg.header.address_family {
            AddressFamily::Inet6 if metric == IPV6_DEFAULT_METRIC => 0,
            _ => metric,
        },
        protocol: u8::from(msg.header.protocol),
    })
}

/// Adds the route, replacing one with the same destination.
pub fn replace(sock: &mut Socket, route: &Route) -> Result<(), Error> {
    Write::Replace(route).answer(sock.write(Write::Replace(route).request()))
}

/// Removes the route; one that is already gone is success.
pub fn delete(sock: &mut Socket, route: &Route) -> Result<(), Error> {
    Write::Delete(route).answer(sock.write(Write::Delete(route).request()))
}

/// One write of a route, alone ([`replace`], [`delete`]) or in a batch
/// ([`Socket::request_batch`]): its request, and what the kernel's answer means.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    Replace(&'a Route),
    /// One already gone is success.
    Delete(&'a Route),
}

impl Write<'_> {
    pub fn request(self) -> socket::Request {
        match self {
            Write::Replace(route) => socket::Request {
                what: "replace route",
                message: RouteNetlinkMessage::NewRoute(message(route)),
                flags: NLM_F_CREATE | NLM_F_REPLACE,
            },
            Write::Delete(route) => socket::Request {
                what: "delete route",
                message: RouteNetlinkMessage::DelRoute(message(route)),
                flags: 0,
            },
        }
    }

    /// The outcome of the write, from the kernel's answer to [`Write::request`].
    pub fn answer(self, answer: Result<(), socket::Error>) -> Result<(), Error> {
        let (Write::Replace(route) | Write::Delete(route)) = self;
        match answer {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(self, Write::Delete(_))
                    && (e.is(Errno::ESRCH) || e.is(Errno::ENOENT)) =>
            {
                Ok(())
            }
            Err(source) => Err(Error {
                route: route.to_string(),
                source,
            }),
        }
    }
}

/// `ip route get <ip>`: the outgoing interface and preferred source address towards `ip`.
pub fn lookup(sock: &mut Socket, ip: IpAddr) -> Result<(Option<u32>, Option<IpAddr>), Error> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(ip);
    msg.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(address(ip)));
    let found = sock
        .request("look up route", RouteNetlinkMessage::GetRoute(msg), 0)
        .map_err(|source| Error {
            route: format!("to {ip}"),
            source,
        })?;
    let mut oif = None;
    let mut src = None;
    for m in &found {
        if let RouteNetlinkMessage::NewRoute(r) = m {
            for attr in &r.attributes {
                match attr {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::PrefSource(a) => src = from_address(a),
                    _ => {}
                }
            }
        }
    }
    Ok((oif, src))
}

/// The request that dumps `family`'s routes of the main table (the kernel leaves the other
/// tables out when the socket checks strictly; [`parse`] drops them otherwise).
fn dump_message(family: AddressFamily) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family;
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg
}

/// Every unicast route of the main table, both families.
pub fn list(sock: &mut Socket) -> Result<Vec<Route>, Error> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let found = sock
            .dump(
                "list routes",
                RouteNetlinkMessage::GetRoute(dump_message(family)),
            )
            .map_err(|source| Error {
                route: "*".into(),
                source,
            })?;
        out.extend(found.iter().filter_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => parse(r),
            _ => None,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};

    #[test]
    fn onlink_tagged_route_round_trips() {
        let route = Route {
            dst: "10.244.2.0/24".parse().unwrap(),
            gateway: Some("10.244.2.0".parse().unwrap()),
            oif: Some(9),
            onlink: true,
            metric: 0x00f4_0200,
            protocol: 77,
        };
        let msg = message(&route);
        assert_eq!(msg.header.scope, RouteScope::Universe);
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        let back = RouteMessage::parse(buf.as_slice()).unwrap();
        assert_eq!(parse(&back), Some(route));
    }

    #[test]
    fn dumps_ask_for_the_main_table_only() {
        let msg = dump_message(AddressFamily::Inet6);
        assert_eq!(msg.header.table, RouteHeader::RT_TABLE_MAIN);
        assert!(msg.attributes.is_empty());
        // Strict checking refuses these set in a dump request.
        assert_eq!(msg.header.destination_prefix_length, 0);
        assert_eq!(msg.header.scope, RouteScope::Universe);
    }

    #[test]
    fn v6_route_through_a_link() {
        let route = Route {
            dst: "fd00:2::/64".parse().unwrap(),
            gateway: None,
            oif: Some(3),
            onlink: false,
            metric: 0,
            protocol: 0,
        };
        let mut msg = message(&route);
        assert_eq!(msg.header.address_family, AddressFamily::Inet6);
        assert_eq!(msg.header.scope, RouteScope::Link);
        assert_eq!(parse(&msg), Some(route.clone()));
        // As the kernel shows it: its default metric, which reads as the 0 written.
        msg.attributes.push(RouteAttribute::Priority(1024));
        assert_eq!(parse(&msg), Some(route));
    }
}
