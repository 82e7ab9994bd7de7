//! Links: bridge, veth (peer created directly in another netns), vxlan; set up, master, MTU,
//! address; delete; look up by name or index.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use nix::errno::Errno;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VxlanInfo {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub local: Option<Ipv4Addr>,
    pub underlay: Option<u32>,
    pub learning: Option<bool>,
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

impl Link {
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
            InfoVxlan::Local(l) => info.local = Some(*l),
            InfoVxlan::Link(l) => info.underlay = Some(*l),
            InfoVxlan::Learning(l) => info.learning = Some(*l),
            _ => {}
        }
    }
    info
}

/// What a new VTEP looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: Ipv4Addr,
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

fn indexed(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

/// `RTM_NEWLINK` for a VTEP: the MAC is in the creating message, so it never exists with
/// another one (udev's `MACAddressPolicy` leaves a MAC given at creation alone).
pub fn vxlan_message(spec: &VxlanSpec) -> LinkMessage {
    let mut msg = named(&spec.name);
    msg.attributes
        .push(LinkAttribute::Address(spec.mac.to_vec()));
    msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
    let mut data = vec![
        InfoVxlan::Id(spec.vni),
        InfoVxlan::Local(spec.local),
        InfoVxlan::Port(spec.port),
        InfoVxlan::Learning(spec.learning),
    ];
    if let Some(underlay) = spec.underlay {
        data.push(InfoVxlan::Link(underlay));
    }
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(data)),
    ]));
    msg
}

pub fn bridge_message(name: &str, mtu: Option<u32>, mac: Option<[u8; 6]>) -> LinkMessage {
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

pub fn veth_message(spec: &VethSpec<'_>) -> LinkMessage {
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
    match sock.request("get link", RouteNetlinkMessage::GetLink(named(name)), 0) {
        Ok(found) => Ok(found.iter().find_map(as_link)),
        Err(e) if e.is(Errno::ENODEV) => Ok(None),
        Err(e) => Err(ctx(name)(e)),
    }
}

/// Like [`get`], but a missing link is an error.
pub fn require(sock: &mut Socket, name: &str) -> Result<Link, Error> {
    get(sock, name)?.ok_or_else(|| Error::NotFound(name.to_string()))
}

pub fn list(sock: &mut Socket) -> Result<Vec<Link>, Error> {
    let found = sock
        .dump(
            "list links",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
        )
        .map_err(ctx("*"))?;
    Ok(found.iter().filter_map(as_link).collect())
}

fn as_link(msg: &RouteNetlinkMessage) -> Option<Link> {
    match msg {
        RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
        _ => None,
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

    fn round_trip(msg: &LinkMessage) -> LinkMessage {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        LinkMessage::parse(buf.as_slice()).unwrap()
    }

    #[test]
    fn vxlan_message_carries_mac_vni_port_local_and_no_learning() {
        let spec = VxlanSpec {
            name: "vtep0".into(),
            vni: 7,
            port: 8472,
            local: Ipv4Addr::new(192, 0, 2, 1),
            underlay: Some(3),
            mac: [0x0a, 0x07, 192, 0, 2, 1],
            mtu: 1450,
            learning: false,
        };
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
