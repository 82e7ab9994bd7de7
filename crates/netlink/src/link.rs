//! Links: bridge, veth (peer created directly in another netns), vxlan; set up, master, MTU,
//! address; delete; look up by name or index.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{
    NLM_F_CREATE, NLM_F_EXCL, parse_string, parse_u8, parse_u16_be, parse_u32,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo,
    LinkMessage,
};
use nix::errno::Errno;

use super::decode::{self, attributes};
use super::socket::{self, Socket};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("link {name:?}: {source}")]
    Netlink {
        name: String,
        #[source]
        source: socket::Error,
    },
    #[error("link {0:?} does not exist")]
    NotFound(String),
    #[error("turning on hairpin mode on {name:?}: {source}")]
    Hairpin {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { source, .. } => source.errno(),
            Error::NotFound(_) => Some(Errno::ENODEV as i32),
            Error::Hairpin { source, .. } => source.raw_os_error(),
        }
    }
}

fn ctx(name: &str) -> impl FnOnce(socket::Error) -> Error + '_ {
    move |source| Error::Netlink {
        name: name.to_string(),
        source,
    }
}

/// VXLAN parameters as the kernel reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VxlanInfo {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub local: Option<IpAddr>,
    pub underlay: Option<u32>,
    pub learning: Option<bool>,
    /// The outer packets' TTL; 0 (`ttl auto`) is the route's hop limit.
    pub ttl: Option<u8>,
}

/// What we need to know about one link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    pub up: bool,
    pub master: Option<u32>,
    pub alias: Option<String>,
    pub kind: Option<String>,
    pub vxlan: Option<VxlanInfo>,
}

// The attributes `Link::from_bytes` reads (linux/if_link.h).
const IFF_UP: u32 = 1;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_IFALIAS: u16 = 20;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_VXLAN_ID: u16 = 1;
const IFLA_VXLAN_LINK: u16 = 3;
const IFLA_VXLAN_LOCAL: u16 = 4;
const IFLA_VXLAN_TTL: u16 = 5;
const IFLA_VXLAN_LEARNING: u16 = 7;
const IFLA_VXLAN_PORT: u16 = 15;
const IFLA_VXLAN_LOCAL6: u16 = 17;
/// `RTM_NEWLINK`, the type of every link in a reply.
const RTM_NEWLINK: u16 = 16;
/// `struct ifinfomsg`: family, pad, type, index, flags, change.
const IFINFOMSG_LEN: usize = 16;

impl Link {
    /// A [`Link`] straight from an `RTM_NEWLINK` payload: only the attributes a
    /// [`Link`] holds are read. A link message carries dozens more (statistics, per-family
    /// settings, a bridge port's state), and decoding all of them for every link of a
    /// node's dump cost more than everything else ADD computes. The tests hold it to the full
    /// decoding of `netlink-packet-route`, on built messages and on the kernel's own.
    pub(crate) fn from_bytes(payload: &[u8]) -> Result<Link, decode::Error> {
        let field = |range: std::ops::Range<usize>| {
            payload
                .get(range)
                .ok_or(decode::Error::ShortLink(payload.len()))
        };
        let text = |v: &[u8]| parse_string(v).map_err(decode::Error::Attribute);
        let number = |v: &[u8]| parse_u32(v).map_err(decode::Error::Attribute);
        let mut link = Link {
            index: number(field(4..8)?)?,
            up: number(field(8..12)?)? & IFF_UP != 0,
            ..Link::default()
        };
        for attribute in attributes(field(IFINFOMSG_LEN..payload.len())?) {
            let (kind, value) = attribute?;
            match kind {
                IFLA_IFNAME => link.name = text(value)?,
                IFLA_IFALIAS => link.alias = Some(text(value)?),
                IFLA_ADDRESS => link.mac = <[u8; 6]>::try_from(value).ok(),
                IFLA_MTU => link.mtu = Some(number(value)?),
                IFLA_MASTER => link.master = Some(number(value)?),
                IFLA_LINKINFO => {
                    let mut data = None;
                    for info in attributes(value) {
                        match info? {
                            (IFLA_INFO_KIND, v) => link.kind = Some(text(v)?),
                            (IFLA_INFO_DATA, v) => data = Some(v),
                            _ => {}
                        }
                    }
                    if let (Some("vxlan"), Some(data)) = (link.kind.as_deref(), data) {
                        link.vxlan = Some(vxlan_from_bytes(data)?);
                    }
                }
                _ => {}
            }
        }
        Ok(link)
    }
}

fn vxlan_from_bytes(data: &[u8]) -> Result<VxlanInfo, decode::Error> {
    let mut info = VxlanInfo::default();
    for attribute in attributes(data) {
        let (kind, v) = attribute?;
        let bad = |source| decode::Error::VxlanAttribute { kind, source };
        match kind {
            IFLA_VXLAN_ID => info.vni = Some(parse_u32(v).map_err(bad)?),
            IFLA_VXLAN_PORT => info.port = Some(parse_u16_be(v).map_err(bad)?),
            IFLA_VXLAN_LOCAL => {
                info.local = <[u8; 4]>::try_from(v)
                    .ok()
                    .map(|a| IpAddr::V4(Ipv4Addr::from(a)));
            }
            IFLA_VXLAN_LOCAL6 => {
                info.local = <[u8; 16]>::try_from(v)
                    .ok()
                    .map(|a| IpAddr::V6(Ipv6Addr::from(a)));
            }
            IFLA_VXLAN_LINK => info.underlay = Some(parse_u32(v).map_err(bad)?),
            IFLA_VXLAN_LEARNING => info.learning = Some(parse_u8(v).map_err(bad)? > 0),
            IFLA_VXLAN_TTL => info.ttl = Some(parse_u8(v).map_err(bad)?),
            _ => {}
        }
    }
    Ok(info)
}

/// What a new VTEP looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    /// The node's underlay address: IPv4, or IPv6 (then the UDP checksums IPv6 requires are on).
    pub local: IpAddr,
    pub underlay: Option<u32>,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Off for the main mode's VTEP (every peer is programmed); on for an L2 segment, whose
    /// pods' MACs are learned from their frames.
    pub learning: bool,
}

fn named(name: &str) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    msg
}

/// A request for links, without their statistics (nothing here reads them).
fn query(mut msg: LinkMessage) -> RouteNetlinkMessage {
    msg.attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    RouteNetlinkMessage::GetLink(msg)
}

/// Reads the links of a reply; other messages are skipped.
fn links_of(message_type: u16, payload: &[u8]) -> Result<Option<Link>, decode::Error> {
    if message_type == RTM_NEWLINK {
        Link::from_bytes(payload).map(Some)
    } else {
        Ok(None)
    }
}

fn indexed(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

/// `RTM_NEWLINK` for a VTEP: the MAC is in the creating message, so it never exists with
/// another one (udev's `MACAddressPolicy` leaves a MAC given at creation alone).
pub(crate) fn vxlan_message(spec: &VxlanSpec) -> LinkMessage {
    let mut msg = named(&spec.name);
    msg.attributes
        .push(LinkAttribute::Address(spec.mac.to_vec()));
    msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
    let mut data = vec![InfoVxlan::Id(spec.vni)];
    match spec.local {
        IpAddr::V4(a) => data.push(InfoVxlan::Local(a)),
        // IPv6 forbids a zero UDP checksum (RFC 8200): computed on send, required on receipt.
        IpAddr::V6(a) => data.extend([
            InfoVxlan::Local6(a),
            InfoVxlan::UDPZeroCsumTX(false),
            InfoVxlan::UDPZeroCsumRX(false),
        ]),
    }
    data.extend([
        InfoVxlan::Port(spec.port),
        InfoVxlan::Learning(spec.learning),
    ]);
    if let Some(underlay) = spec.underlay {
        data.push(InfoVxlan::Link(underlay));
    }
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(data)),
    ]));
    msg
}

pub(crate) fn bridge_message(name: &str, mtu: Option<u32>, mac: Option<[u8; 6]>) -> LinkMessage {
    let mut msg = named(name);
    if let Some(mac) = mac {
        // A bridge otherwise takes the lowest MAC of its ports, which changes as pods come
        // and go and leaves stale neighbour entries in every pod.
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
    }
    if let Some(mtu) = mtu {
        msg.attributes.push(LinkAttribute::Mtu(mtu));
    }
    msg.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Bridge,
        )]));
    msg
}

/// A veth pair whose peer is created directly inside the namespace `peer_netns`, with its
/// name and MAC, so it never appears in the host namespace; with `master`, the host end is
/// made a port of that bridge in the same request (the kernel removes the new pair again if
/// that fails).
#[derive(Debug)]
pub struct VethSpec<'a> {
    pub host: &'a str,
    pub peer: &'a str,
    pub peer_netns: BorrowedFd<'a>,
    pub peer_mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub master: Option<u32>,
}

pub(crate) fn veth_message(spec: &VethSpec<'_>) -> LinkMessage {
    let mut msg = named(spec.host);
    msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
    if let Some(master) = spec.master {
        msg.attributes.push(LinkAttribute::Controller(master));
    }
    let mut peer_msg = named(spec.peer);
    peer_msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
    peer_msg
        .attributes
        .push(LinkAttribute::NetNsFd(spec.peer_netns.as_raw_fd()));
    if let Some(mac) = spec.peer_mac {
        peer_msg
            .attributes
            .push(LinkAttribute::Address(mac.to_vec()));
    }
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
    ]));
    msg
}

fn create(sock: &mut Socket, name: &str, msg: LinkMessage) -> Result<(), Error> {
    sock.request(
        "create link",
        RouteNetlinkMessage::NewLink(msg),
        NLM_F_CREATE | NLM_F_EXCL,
    )
    .map(drop)
    .map_err(ctx(name))
}

pub fn add_vxlan(sock: &mut Socket, spec: &VxlanSpec) -> Result<(), Error> {
    create(sock, &spec.name, vxlan_message(spec))
}

pub fn add_bridge(
    sock: &mut Socket,
    name: &str,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
) -> Result<(), Error> {
    create(sock, name, bridge_message(name, mtu, mac))
}

/// Turns hairpin mode on for a bridge port (through sysfs, which shows the network namespace
/// it was mounted in: run from the namespace's own mount, as `ip netns exec` provides).
pub fn set_hairpin(name: &str) -> Result<(), Error> {
    let path = format!("/sys/class/net/{name}/brport/hairpin_mode");
    std::fs::write(&path, "1").map_err(|e| Error::Hairpin {
        name: name.to_string(),
        source: e,
    })
}

pub fn add_veth(sock: &mut Socket, spec: &VethSpec<'_>) -> Result<(), Error> {
    create(sock, spec.host, veth_message(spec))
}

/// The link called `name`, or `None` if there is none.
pub fn get(sock: &mut Socket, name: &str) -> Result<Option<Link>, Error> {
    match sock.request_with("get link", query(named(name)), 0, &mut links_of) {
        Ok(found) => Ok(found.into_iter().next()),
        Err(e) if e.is(Errno::ENODEV) => Ok(None),
        Err(e) => Err(ctx(name)(e)),
    }
}

/// Like [`get`], but a missing link is an error.
pub fn require(sock: &mut Socket, name: &str) -> Result<Link, Error> {
    get(sock, name)?.ok_or_else(|| Error::NotFound(name.to_string()))
}

pub fn list(sock: &mut Socket) -> Result<Vec<Link>, Error> {
    sock.dump_with("list links", query(LinkMessage::default()), &mut links_of)
        .map_err(ctx("*"))
}

/// The links of one kind (`vxlan`, `bridge`): the kernel leaves the others out of the dump
/// (when it knows the kind), and they are dropped here if it did not.
pub fn list_kind(sock: &mut Socket, kind: InfoKind) -> Result<Vec<Link>, Error> {
    let name = kind.to_string();
    let mut msg = LinkMessage::default();
    msg.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(kind)]));
    let found = sock
        .dump_with("list links", query(msg), &mut links_of)
        .map_err(ctx("*"))?;
    Ok(found
        .into_iter()
        .filter(|l| l.kind.as_deref() == Some(name.as_str()))
        .collect())
}

/// The link of index `index`, or `None` if there is none.
pub fn get_at(sock: &mut Socket, index: u32) -> Result<Option<Link>, Error> {
    match sock.request_with("get link", query(indexed(index)), 0, &mut links_of) {
        Ok(found) => Ok(found.into_iter().next()),
        Err(e) if e.is(Errno::ENODEV) => Ok(None),
        Err(e) => Err(ctx(&format!("#{index}"))(e)),
    }
}

fn set(sock: &mut Socket, link: &Link, msg: LinkMessage) -> Result<(), Error> {
    sock.request("change link", RouteNetlinkMessage::SetLink(msg), 0)
        .map(drop)
        .map_err(ctx(&link.name))
}

pub fn set_up(sock: &mut Socket, link: &Link) -> Result<(), Error> {
    let mut msg = indexed(link.index);
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    set(sock, link, msg)
}

/// Sets the alias (when given) and brings the link up, in one request (the kernel sets the
/// alias first).
pub fn set_up_with_alias(sock: &mut Socket, link: &Link, alias: Option<&str>) -> Result<(), Error> {
    set(sock, link, up_with_alias(link.index, alias))
}

fn up_with_alias(index: u32, alias: Option<&str>) -> LinkMessage {
    let mut msg = indexed(index);
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    if let Some(alias) = alias {
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
    }
    msg
}

pub fn set_master(sock: &mut Socket, link: &Link, master: u32) -> Result<(), Error> {
    let mut msg = indexed(link.index);
    msg.attributes.push(LinkAttribute::Controller(master));
    set(sock, link, msg)
}

pub fn set_mtu(sock: &mut Socket, link: &Link, mtu: u32) -> Result<(), Error> {
    let mut msg = indexed(link.index);
    msg.attributes.push(LinkAttribute::Mtu(mtu));
    set(sock, link, msg)
}

/// Sets the alias `ip link` shows (the kernel ignores it in a creating message).
pub fn set_alias(sock: &mut Socket, link: &Link, alias: &str) -> Result<(), Error> {
    let mut msg = indexed(link.index);
    msg.attributes
        .push(LinkAttribute::IfAlias(alias.to_string()));
    set(sock, link, msg)
}

pub fn set_mac(sock: &mut Socket, link: &Link, mac: [u8; 6]) -> Result<(), Error> {
    let mut msg = indexed(link.index);
    msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
    set(sock, link, msg)
}

/// Deletes the link called `name`; a link that is already gone is success.
pub fn delete(sock: &mut Socket, name: &str) -> Result<(), Error> {
    match sock.request("delete link", RouteNetlinkMessage::DelLink(named(name)), 0) {
        Ok(_) => Ok(()),
        Err(e) if e.is(Errno::ENODEV) || e.is(Errno::ENOENT) => Ok(()),
        Err(e) => Err(ctx(name)(e)),
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (case-insensitive).
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    impl Link {
        /// Every attribute decoded by `netlink-packet-route`: the reference [`Link::from_bytes`]
        /// is tested against (on built messages and on the kernel's own).
        pub fn from_message(msg: &LinkMessage) -> Link {
            let mut link = Link {
                index: msg.header.index,
                up: msg.header.flags.contains(LinkFlags::Up),
                ..Link::default()
            };
            for attr in &msg.attributes {
                match attr {
                    LinkAttribute::IfName(n) => link.name = n.clone(),
                    LinkAttribute::IfAlias(a) => link.alias = Some(a.clone()),
                    LinkAttribute::Address(a) => link.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
                    LinkAttribute::Mtu(m) => link.mtu = Some(*m),
                    LinkAttribute::Controller(m) => link.master = Some(*m),
                    LinkAttribute::LinkInfo(infos) => {
                        for info in infos {
                            match info {
                                LinkInfo::Kind(k) => link.kind = Some(k.to_string()),
                                LinkInfo::Data(InfoData::Vxlan(v)) => {
                                    link.vxlan = Some(vxlan_info(v));
                                }
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            link
        }
    }

    fn vxlan_info(attrs: &[InfoVxlan]) -> VxlanInfo {
        let mut info = VxlanInfo::default();
        for a in attrs {
            match a {
                InfoVxlan::Id(v) => info.vni = Some(*v),
                InfoVxlan::Port(p) => info.port = Some(*p),
                InfoVxlan::Local(l) => info.local = Some(IpAddr::V4(*l)),
                InfoVxlan::Local6(l) => info.local = Some(IpAddr::V6(*l)),
                InfoVxlan::Link(l) => info.underlay = Some(*l),
                InfoVxlan::Learning(l) => info.learning = Some(*l),
                InfoVxlan::Ttl(t) => info.ttl = Some(*t),
                _ => {}
            }
        }
        info
    }

    fn bytes(msg: &LinkMessage) -> Vec<u8> {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        buf
    }

    fn round_trip(msg: &LinkMessage) -> LinkMessage {
        LinkMessage::parse(bytes(msg).as_slice()).unwrap()
    }

    /// The VTEP the tests build: node 192.0.2.1, VNI 7, on the underlay link 3.
    fn vtep_spec(learning: bool) -> VxlanSpec {
        VxlanSpec {
            name: "vtep0".into(),
            vni: 7,
            port: 8472,
            local: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            underlay: Some(3),
            mac: [0x0a, 0x07, 192, 0, 2, 1],
            mtu: 1450,
            learning,
        }
    }

    #[test]
    fn vxlan_message_carries_mac_vni_port_local_and_no_learning() {
        let spec = vtep_spec(false);
        let link = Link::from_message(&round_trip(&vxlan_message(&spec)));
        assert_eq!(link.name, "vtep0");
        assert_eq!(link.mac, Some(spec.mac));
        assert_eq!(link.mtu, Some(1450));
        assert_eq!(link.kind.as_deref(), Some("vxlan"));
        let v = link.vxlan.unwrap();
        assert_eq!(v.vni, Some(7));
        assert_eq!(v.port, Some(8472));
        assert_eq!(v.local, Some(spec.local));
        assert_eq!(v.underlay, Some(3));
        assert_eq!(v.learning, Some(false));
    }

    #[test]
    fn veth_peer_is_nested_with_netns_and_mac() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&file);
        let msg = veth_message(&VethSpec {
            host: "vh1",
            peer: "eth0",
            peer_netns: fd,
            peer_mac: Some([2, 0, 0, 0, 0, 1]),
            mtu: 1450,
            master: Some(7),
        });
        let back = round_trip(&msg);
        assert_eq!(
            Link::from_message(&back).master,
            Some(7),
            "the host end is a bridge port from the start"
        );
        let Some(LinkAttribute::LinkInfo(infos)) = back
            .attributes
            .iter()
            .find(|a| matches!(a, LinkAttribute::LinkInfo(_)))
        else {
            panic!("no link info")
        };
        let Some(LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer)))) = infos.get(1) else {
            panic!("no peer: {infos:?}")
        };
        let p = Link::from_message(peer);
        assert_eq!(p.name, "eth0");
        assert_eq!(p.mac, Some([2, 0, 0, 0, 0, 1]));
        assert!(
            peer.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::NetNsFd(_)))
        );
    }

    #[test]
    fn reading_only_our_fields_gives_what_full_decoding_gives() {
        let mut vtep = vxlan_message(&vtep_spec(true));
        vtep.header.index = 9;
        vtep.header.flags = LinkFlags::Up | LinkFlags::Running;
        vtep.attributes.extend([
            LinkAttribute::IfAlias("sticky-vxlan:vtep edge".into()),
            LinkAttribute::Controller(4),
            LinkAttribute::TxQueueLen(1000),
            LinkAttribute::Carrier(1),
        ]);
        let mut bridge = bridge_message("br0", Some(1400), Some([2, 0, 0, 0, 0, 9]));
        bridge.header.index = 4;
        let file = std::fs::File::open("/dev/null").unwrap();
        let veth = veth_message(&VethSpec {
            host: "sv0123",
            peer: "eth0",
            peer_netns: std::os::fd::AsFd::as_fd(&file),
            peer_mac: None,
            mtu: 1450,
            master: Some(4),
        });
        for msg in [&vtep, &bridge, &veth, &LinkMessage::default()] {
            let fast = Link::from_bytes(&bytes(msg)).unwrap();
            assert_eq!(fast, Link::from_message(msg), "{msg:?}");
        }
        let fast = Link::from_bytes(&bytes(&vtep)).unwrap();
        assert!(fast.up);
        assert_eq!(fast.vxlan.unwrap().learning, Some(true));
        assert_eq!(fast.kind.as_deref(), Some("vxlan"));
    }

    /// The kernel's own messages: links made by `ip` in a network namespace of this test's
    /// thread alone (gone with the thread, even when an assertion fails), listed field by
    /// field ([`list`], [`get`], ...) and decoded in full ([`Link::from_message`]) alike.
    #[test]
    #[ignore = "needs root: a network namespace"]
    fn links_read_field_by_field_are_what_full_decoding_reads_from_the_kernel() {
        let (fast, full, one) = crate::in_own_netns(
            &[
                // The underlay: a veth end (the dummy driver is not in every kernel).
                &[
                    "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
                ][..],
                crate::TEST_VTEP,
                &["link", "add", "br9", "mtu", "1400", "type", "bridge"],
                &["link", "add", "vh0", "type", "veth", "peer", "name", "vp0"],
                &["link", "set", "vh0", "master", "br9", "up"],
                &["link", "set", "vt0", "alias", "sticky-vxlan:vtep x", "up"],
            ],
            || {
                let mut sock = Socket::open().unwrap();
                let fast = list(&mut sock).unwrap();
                let full: Vec<Link> = sock
                    .dump("t", RouteNetlinkMessage::GetLink(LinkMessage::default()))
                    .unwrap()
                    .iter()
                    .filter_map(|m| match m {
                        RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                        _ => None,
                    })
                    .collect();
                let one = get(&mut sock, "vt0").unwrap();
                let vxlan = list_kind(&mut sock, InfoKind::Vxlan).unwrap();
                let at = get_at(&mut sock, one.as_ref().unwrap().index).unwrap();
                let none = get_at(&mut sock, 999_999).unwrap();
                assert_eq!(vxlan, vec![one.clone().unwrap()], "only the VXLAN device");
                assert_eq!(at, one);
                assert_eq!(none, None);
                (fast, full, one)
            },
        );
        assert_eq!(fast, full);
        let vt0 = fast.iter().find(|l| l.name == "vt0").unwrap();
        assert_eq!(one.as_ref(), Some(vt0));
        let v = vt0.vxlan.as_ref().unwrap();
        assert_eq!(
            (v.vni, v.port, v.learning),
            (Some(42), Some(8472), Some(false))
        );
        assert_eq!(vt0.alias.as_deref(), Some("sticky-vxlan:vtep x"));
        let br9 = fast.iter().find(|l| l.name == "br9").unwrap();
        let vh0 = fast.iter().find(|l| l.name == "vh0").unwrap();
        assert_eq!(vh0.master, Some(br9.index));
        assert_eq!(vh0.kind.as_deref(), Some("veth"));
    }

    #[test]
    fn a_cut_link_message_is_an_error() {
        let whole = bytes(&bridge_message("br0", Some(1400), None));
        let header = Link::from_bytes(&whole[..10]).unwrap_err();
        assert!(matches!(header, decode::Error::ShortLink(10)), "{header:?}");
        assert_eq!(header.to_string(), "link message of 10 bytes");
        assert!(matches!(
            Link::from_bytes(&whole[..whole.len() - 3]),
            Err(decode::Error::Attribute(_))
        ));
    }

    #[test]
    fn up_with_alias_is_one_message() {
        let back = round_trip(&up_with_alias(4, Some("sticky-vxlan edge c1 eth0")));
        assert_eq!(back.header.index, 4);
        assert!(back.header.flags.contains(LinkFlags::Up));
        assert!(back.header.change_mask.contains(LinkFlags::Up));
        let link = Link::from_message(&back);
        assert_eq!(link.alias.as_deref(), Some("sticky-vxlan edge c1 eth0"));
        let plain = round_trip(&up_with_alias(4, None));
        assert!(plain.header.flags.contains(LinkFlags::Up));
        assert_eq!(Link::from_message(&plain).alias, None);
    }

    #[test]
    fn macs_parse_and_print() {
        assert_eq!(parse_mac("0A:01:c0:00:02:01"), Some([10, 1, 192, 0, 2, 1]));
        assert_eq!(format_mac(&[10, 1, 192, 0, 2, 1]), "0a:01:c0:00:02:01");
        for bad in [
            "",
            "0a:01",
            "0a:01:c0:00:02:01:02",
            "0a:1:c0:00:02:01",
            "zz:01:c0:00:02:01",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
