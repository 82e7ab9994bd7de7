//! `sticky-vxlan`: pod networking over a VXLAN overlay whose VTEP MAC never changes.
//!
//! flannel's L3 data path (one VTEP and one bridge per node, a veth per pod, per peer a
//! permanent neighbour + FDB entry and an onlink route) with two differences that matter on
//! nodes cut off from the control plane: the VTEP MAC is a pure function of the node's
//! underlay address ([`mac`]), so it survives any restart and every node can compute its
//! peers' MACs offline; and peers come from local config ([`peers`]), not an API server.
//!
//! [`config`] reads the network config, [`node`] works out the underlay and peers,
//! [`datapath`] programs the node (VTEP, bridge, peers),
//! [`pod`] does one pod's veth, [`delegate`] runs the IPAM plugin, [`plugin`] ties them to the
//! CNI commands, [`firewall`] holds the optional nftables rules and [`cli`] the operator's
//! entry points.

pub mod cli;
pub mod config;
pub mod datapath;
pub mod delegate;
pub mod firewall;
pub mod mac;
pub mod node;
pub mod peers;
pub mod plugin;
pub mod pod;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::netlink;

/// The route protocol number (`proto 118` in `ip route`) that tags the routes this plugin
/// owns, so stale ones can be found and removed without touching anyone else's.
pub const ROUTE_PROTOCOL: u8 = 118;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid sticky-vxlan config: {0}")]
    Config(#[from] config::Error),
    #[error("invalid peer list: {0}")]
    Peers(String),
    #[error(transparent)]
    PeersFile(#[from] peers::FileError),
    #[error(transparent)]
    Attachments(#[from] crate::cni::AttachmentsError),
    #[error("cannot tell which underlay to use: {0}")]
    Underlay(String),
    #[error(
        "no peer entry names this node: none of the peers' ips is a local address (underlay {local}); add {{\"ip\": \"{local}\", \"subnets\": [<this node's pod subnet>]}} to peers or the peers file"
    )]
    NoLocalEntry { local: Ipv4Addr },
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
        "the IPAM plugin handed out {address}, outside this node's pod subnets ({subnets}): other nodes route it elsewhere; give the IPAM section this node's ranges (or none, to have them filled in from its peer entry)"
    )]
    ForeignAddress {
        address: ipnet::IpNet,
        subnets: String,
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
    #[error("lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("IPAM plugin {plugin:?} was not found in CNI_PATH ({path})")]
    IpamNotFound { plugin: String, path: String },
    #[error("running IPAM plugin {plugin}: {source}")]
    IpamExec {
        plugin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("IPAM plugin {plugin} failed: {msg}")]
    Ipam {
        plugin: PathBuf,
        code: u32,
        msg: String,
        details: String,
    },
    #[error("IPAM plugin {plugin} printed something that is not a CNI result: {reason}")]
    IpamOutput { plugin: PathBuf, reason: String },
    #[error("nftables: {0}")]
    Firewall(String),
    #[error("CHECK: {0}")]
    Check(String),
    #[error("not ready: {0}")]
    NotReady(String),
    #[error("config file {path}: {reason}")]
    ConfigFile { path: PathBuf, reason: String },
    /// A command-line mistake; the text includes the help.
    #[error("{0}")]
    Usage(String),
}
