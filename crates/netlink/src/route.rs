//! Routes in the main table, tagged with a route protocol number so ours can be found again.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE, parse_u32};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use super::decode::{self, attributes};
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

/// `RTM_NEWROUTE`, the type of every route in a reply.
const RTM_NEWROUTE: u16 = 24;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
/// `struct rtmsg`: family, destination length, source length, TOS, table, protocol, scope,
/// type, flags.
const RTMSG_LEN: usize = 12;
const AF_INET6: u8 = 10;
const RT_TABLE_MAIN: u8 = 254;
const RTN_UNICAST: u8 = 1;
const RTNH_F_ONLINK: u32 = 4;

/// A unicast route of the main table straight from an `RTM_NEWROUTE` payload (other routes
/// and messages are skipped): the dump of 100,000 routes decoded whole by
/// `netlink-packet-route` cost as much as the kernel took to send it. The tests hold it to
/// that full decoding.
fn route_of(message_type: u16, payload: &[u8]) -> Result<Option<Route>, decode::Error> {
    if message_type != RTM_NEWROUTE {
        return Ok(None);
    }
    let short = || decode::Error::ShortRoute(payload.len());
    let h = payload.get(..RTMSG_LEN).ok_or_else(short)?;
    let (family, prefix, table, protocol, kind) = (h[0], h[1], h[4], h[5], h[7]);
    let flags = u32::from_ne_bytes(<[u8; 4]>::try_from(&h[8..12]).map_err(|_| short())?);
    if table != RT_TABLE_MAIN || kind != RTN_UNICAST {
        return Ok(None);
    }
    let ip = |v: &[u8]| match v.len() {
        4 => <[u8; 4]>::try_from(v).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(v).ok().map(IpAddr::from),
        _ => None,
    };
    let number = |v: &[u8]| parse_u32(v).map_err(decode::Error::Attribute);
    let (mut dst, mut gateway, mut oif, mut metric) = (None, None, None, 0);
    for attribute in attributes(&payload[RTMSG_LEN..]) {
        let (kind, value) = attribute?;
        match kind {
            RTA_DST => dst = ip(value),
            RTA_GATEWAY => gateway = ip(value),
            RTA_OIF => oif = Some(number(value)?),
            RTA_PRIORITY => metric = number(value)?,
            _ => {}
        }
    }
    let v6 = family == AF_INET6;
    let dst = match dst {
        Some(ip) => IpNet::new(ip, prefix).ok(),
        None if v6 => IpNet::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0).ok(),
        None => IpNet::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0).ok(),
    };
    Ok(dst.map(|dst| Route {
        dst,
        gateway,
        oif,
        onlink: flags & RTNH_F_ONLINK != 0,
        metric: if v6 && metric == IPV6_DEFAULT_METRIC {
            0
        } else {
            metric
        },
        protocol,
    }))
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

/// The main table's route of exactly `dst`, if the kernel has one: `ip route get fibmatch
/// <dst's network address>`, which answers with the route that address matches (the most
/// specific one); it is `dst`'s own only when its prefix is `dst`'s. One request, whatever the
/// table holds. `None` when the address matches no route, or a route of another prefix.
pub fn exactly(sock: &mut Socket, dst: IpNet) -> Result<Option<Route>, Error> {
    let ip = dst.network();
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(ip);
    msg.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
    msg.header.flags = RouteFlags::FibMatch;
    msg.attributes
        .push(RouteAttribute::Destination(address(ip)));
    let found = sock.request_with(
        "look up route",
        RouteNetlinkMessage::GetRoute(msg),
        0,
        &mut route_of,
    );
    match found {
        Ok(found) => Ok(found.into_iter().find(|r| r.dst == dst)),
        Err(e) if e.is(Errno::ENETUNREACH) || e.is(Errno::EHOSTUNREACH) => Ok(None),
        Err(source) => Err(Error {
            route: format!("{dst}"),
            source,
        }),
    }
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
            .dump_with(
                "list routes",
                RouteNetlinkMessage::GetRoute(dump_message(family)),
                &mut route_of,
            )
            .map_err(|source| Error {
                route: "*".into(),
                source,
            })?;
        out.extend(found);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};

    fn bytes(msg: &RouteMessage) -> Vec<u8> {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        buf
    }

    /// `msg` as the dump reads it, from its bytes.
    fn parse(msg: &RouteMessage) -> Option<Route> {
        route_of(RTM_NEWROUTE, &bytes(msg)).unwrap()
    }

    /// What `netlink-packet-route`'s full decoding of `msg` says of it.
    fn decoded_whole(msg: &RouteMessage) -> Option<Route> {
        if msg.header.table != RouteHeader::RT_TABLE_MAIN || msg.header.kind != RouteType::Unicast {
            return None;
        }
        let (mut dst, mut gateway, mut oif, mut metric) = (None, None, None, 0);
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

    #[test]
    fn routes_read_from_their_bytes_as_the_full_decoding_reads_them() {
        let on = |dst: &str, gw: Option<&str>, metric: u32| Route {
            dst: dst.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
            oif: Some(4),
            onlink: gw.is_some(),
            metric,
            protocol: 77,
        };
        let mut messages: Vec<RouteMessage> = [
            on("10.244.2.0/24", Some("10.244.2.0"), 0x00f4_0200),
            on("2001:db8:1::/64", Some("2001:db8:1::"), 1024),
            on("2001:db8:2::/64", None, 300),
            on("198.51.100.0/24", None, 0),
        ]
        .iter()
        .map(message)
        .collect();
        // The default route (no destination), another table, a blackhole, extra attributes.
        let mut default = message(&on("0.0.0.0/0", Some("192.0.2.1"), 0));
        default
            .attributes
            .retain(|a| !matches!(a, RouteAttribute::Destination(_)));
        default.attributes.push(RouteAttribute::Table(254));
        let mut local = message(&on("192.0.2.7/32", None, 0));
        local.header.table = 255;
        let mut blackhole = message(&on("203.0.113.0/24", None, 0));
        blackhole.header.kind = RouteType::BlackHole;
        messages.extend([default, local, blackhole]);
        for msg in &messages {
            let whole = RouteMessage::parse(bytes(msg).as_slice()).unwrap();
            assert_eq!(parse(msg), decoded_whole(&whole), "{msg:?}");
        }
        assert_eq!(parse(&messages[4]).map(|r| r.dst), "0.0.0.0/0".parse().ok());
        assert_eq!(parse(&messages[5]), None, "another table");
        assert_eq!(parse(&messages[6]), None, "not unicast");
        assert_eq!(route_of(RTM_NEWROUTE + 1, &[]).unwrap(), None);
        assert!(
            route_of(RTM_NEWROUTE, &[0; RTMSG_LEN - 1]).is_err(),
            "cut short"
        );
    }

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
        assert_eq!(decoded_whole(&back), Some(route.clone()));
        assert_eq!(parse(&msg), Some(route));
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
