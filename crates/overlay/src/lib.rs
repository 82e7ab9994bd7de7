//! The VXLAN data-path core both sticky-vxlan modes share (the main L3 mode and the L2
//! segment mode live a layer up, in the `sticky-vxlan` crate, and use only what is here).
//!
//! flannel's data path (one VTEP and one bridge per node, a veth per pod, per peer a
//! permanent neighbour + FDB entry) with two differences that matter on nodes cut off from the
//! control plane: the VTEP MAC is a pure function of the node's underlay address ([`mac`]),
//! so it survives any restart and every node can compute its peers' MACs offline; and peers
//! come from local config ([`peers`]), not an API server.
//!
//! [`config`] reads the network config ([`sites`] its `sites` object: the WAN's bound on the
//! pod MTU, and what the agent reads), [`node`] works out the underlay and peers from what
//! the kernel shows, [`devices`] decides the VTEP and bridge as [`step::Step`]s, the
//! [`kernel`] seam reads and writes the node (with [`nft`] for nftables), [`state_dir`] holds
//! the lock and the last good peers, [`stamp`] what the last full reconcile left, [`pod`]
//! names one pod's veth and checks it and [`pods`] (the `Pods` seam) makes and removes it.
//! With the `testing` feature, [`fake`] and [`fake_pods`] are recording fakes of both seams.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod codes;
pub mod config;
pub mod devices;
#[cfg(any(test, feature = "testing"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a fake panics where a test misuses it"
)]
pub mod fake;
#[cfg(any(test, feature = "testing"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a fake panics where a test misuses it"
)]
pub mod fake_pods;
pub mod kernel;
pub mod mac;
pub mod nft;
pub mod node;
pub mod peers;
pub mod pod;
pub mod pods;
pub mod sites;
pub mod stamp;
pub mod state_dir;
pub mod step;

use std::net::IpAddr;

use sticky_netlink as netlink;

/// `a, b, c` for an error message.
fn list(nets: &[ipnet::IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The route protocol number (`proto 118` in `ip route`) that tags the routes this plugin
/// owns, so stale ones can be found and removed without touching anyone else's.
pub const ROUTE_PROTOCOL: u8 = 118;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid sticky-vxlan config: {0}")]
    Config(#[from] config::Error),
    #[error("invalid peer list: {0}")]
    Peers(#[from] peers::Error),
    #[error(transparent)]
    PeersFile(#[from] peers::FileError),
    #[error(transparent)]
    Attachments(#[from] cni_protocol::AttachmentsError),
    #[error("underlay device {name:?} does not exist")]
    NoDevice { name: String },
    #[error("underlay device {name:?} has no {family} address (set localIp)")]
    DeviceWithoutAddress { name: String, family: &'static str },
    #[error("localIp {ip} is not an address of this node")]
    LocalIpNotHere { ip: IpAddr },
    #[error("cannot tell which underlay to use: no remote peer to route to: set localIp or device")]
    NoRemotePeer,
    #[error(
        "cannot tell which underlay to use: no route with a source address towards peer {peer}: set localIp or device"
    )]
    NoRouteToPeer { peer: IpAddr },
    #[error(
        "the VTEP would use {underlay} (from localIp/device) but this node's peer entry names {entry}: peers send to {entry} and compute this node's VTEP MAC from it; set localIp/device to match the entry"
    )]
    UnderlayNotNamed { underlay: IpAddr, entry: IpAddr },
    #[error(
        "no peer entry names this node: none of the peers' ips is a local address (underlay {local}); add {{\"ip\": \"{local}\", \"subnets\": [<this node's pod subnet>]}} to peers or the peers file"
    )]
    NoLocalEntry { local: IpAddr },
    #[error(
        "device {device:?} already uses VNI {vni} on UDP port {port}: remove it (ip link del {device}) or choose another vni/port"
    )]
    VniTaken { device: String, vni: u32, port: u16 },
    #[error(
        "{name:?} exists but is a {kind} device, not a {expected}; remove it or choose another name"
    )]
    WrongKind {
        name: String,
        kind: String,
        expected: &'static str,
    },
    #[error(
        "device {device:?} exists but sticky-vxlan did not make it (no \"sticky-vxlan:{role} <network>\" alias, and it is not what an earlier release would have made): it is left alone; choose another {role} name, or remove it if it is a leftover"
    )]
    NotOurs { device: String, role: &'static str },
    #[error(
        "device {device:?} belongs to sticky-vxlan network {network:?} (its alias says so): two networks cannot share a VTEP or bridge, each would remove the other's peers; give this network its own vni/vtepName/bridge"
    )]
    OtherNetwork { device: String, network: String },
    #[error(
        "device {device:?} holds the underlay address {underlay}: it is the node's uplink, never the pods' bridge; choose another bridge name"
    )]
    UnderlayBridge { device: String, underlay: IpAddr },
    #[error(
        "route {route}{} is not sticky-vxlan's and a peer's subnet {} needs it: it is left as it is; remove it or change the peer's subnet", device.as_ref().map(|d| format!(" (dev {d})")).unwrap_or_default(), route.dst
    )]
    ForeignRoute {
        route: netlink::route::Route,
        device: Option<String>,
    },
    #[error("device {device:?} disappeared while the node was being reconciled")]
    Vanished { device: String },
    #[error(
        "the IPAM plugin handed out gateway {gateway}, outside this node's pod subnets ({}): it is another node's, and putting it on the bridge would pull that node's subnet here",
        list(subnets)
    )]
    ForeignGateway {
        gateway: std::net::IpAddr,
        subnets: Vec<ipnet::IpNet>,
    },
    #[error(
        "the IPAM plugin handed out {address}, outside this node's pod subnets ({}): other nodes route it elsewhere; give the IPAM section this node's ranges (or none, to have them filled in from its peer entry)",
        list(subnets)
    )]
    ForeignAddress {
        address: ipnet::IpNet,
        subnets: Vec<ipnet::IpNet>,
    },
    #[error(
        "mtu {mtu} is larger than the underlay {device:?} allows ({max} = its MTU {underlay} - 50)"
    )]
    MtuTooLarge {
        mtu: u32,
        max: u32,
        underlay: u32,
        device: String,
    },
    #[error(
        "mtu {mtu} is larger than the tunnel between sites allows ({max} = sites.wanMtu {wan_mtu} - {overhead} of WireGuard and a relay's header, to a multiple of 16)"
    )]
    MtuAboveWan {
        mtu: u32,
        max: u32,
        wan_mtu: u32,
        overhead: u32,
    },
    #[error(transparent)]
    Socket(#[from] netlink::socket::Error),
    #[error(transparent)]
    Link(#[from] netlink::link::Error),
    #[error(transparent)]
    Addr(#[from] netlink::addr::Error),
    #[error(transparent)]
    Route(#[from] netlink::route::Error),
    #[error(transparent)]
    Neigh(#[from] netlink::neigh::Error),
    #[error(transparent)]
    Netns(#[from] netlink::netns::Error),
    #[error(transparent)]
    Sysctl(#[from] netlink::sysctl::Error),
    #[error(transparent)]
    Lock(#[from] state_dir::LockError),
    /// The IPAM plugin could not be run, failed (its CNI error is kept), or printed garbage.
    #[error(transparent)]
    Ipam(#[from] cni_protocol::delegate::Error),
    #[error("nftables: {0}")]
    Firewall(#[from] nft::Error),
    #[error("CHECK: {0}")]
    Check(#[from] pod::Mismatch),
    /// STATUS: the plugin cannot work, because of this error.
    #[error("not ready: {0}")]
    NotReady(Box<dyn std::error::Error + Send + Sync>),
}
