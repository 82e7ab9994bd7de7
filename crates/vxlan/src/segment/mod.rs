//! Segment mode of `sticky-vxlan` (`"mode": "segment"`): pods get an extra interface on an L2
//! VXLAN segment, kube-vxlan-controller's segments without its controller.
//!
//! Per node and segment: one VXLAN device for the VNI with learning on and one all-zero
//! (flood) FDB entry per other node of the segment, one bridge, and a veth per member pod.
//! Nodes are the flood peers, not pods, so membership never has to be pushed to anyone: other
//! nodes learn a pod's MAC from its frames.
//!
//! [`config`] reads the network config, [`attachments`] the per-pod table, [`routes`] the
//! routes of both, [`slice`](mod@slice) cuts the IPAM ranges per node, [`node`] works out
//! this node and the segment's other nodes from the peers (the main mode's
//! [`sticky_overlay::peers`]), [`datapath`] programs the devices and flood entries (what it
//! reads, [`plan`] decides as pure data and [`apply`] carries out), [`pod`] keeps one pod's
//! MAC, [`plugin`] ties them to the CNI commands, [`reconcile`] programs a segment without a
//! pod (and keeps the stamp a pod ADD checks) and [`show`] lists segments for the operator.

pub mod apply;
pub mod attachments;
pub mod codes;
pub mod config;
pub mod datapath;
pub mod node;
pub mod plan;
pub mod plugin;
pub mod pod;
pub mod reconcile;
pub mod routes;
pub mod show;
pub mod slice;

use std::net::IpAddr;

use sticky_netlink as netlink;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid segment config: {0}")]
    Config(#[from] config::Error),
    #[error("{source_key} {value:?} is not a unicast MAC address such as 02:00:00:00:00:01")]
    Mac {
        source_key: &'static str,
        value: String,
    },
    #[error("{key} {value} is not valid: {reason}")]
    RuntimeConfig {
        key: &'static str,
        /// The value as JSON (a list is shown as the runtime sent it, strings quoted once).
        value: String,
        reason: attachments::Error,
    },
    #[error("CNI_ARGS MAC={0:?} is not a unicast MAC address such as 02:00:00:00:00:01")]
    ArgsMac(String),
    #[error("the IPAM ranges cannot be cut to this node's slice: {0}")]
    Slice(#[from] slice::Error),
    #[error(
        "no peer entry names this node: none of the peers' ips is a local address; add this node to peers or the peers file"
    )]
    NoLocalEntry,
    #[error(
        "this node ({local}) is not one of the segment's \"nodes\" ({nodes}): pods of this segment cannot run here"
    )]
    NotInSegment { local: IpAddr, nodes: String },
    #[error(
        "{device:?} exists but was not made by this network (its alias is {alias:?}, expected {expected:?}): remove it or choose another vni"
    )]
    NotOurs {
        device: String,
        alias: String,
        expected: String,
    },
    #[error(transparent)]
    Vxlan(#[from] sticky_overlay::Error),
}

/// Netlink, netns and sysctl errors are the main mode's, mapped to the same codes.
macro_rules! through_vxlan {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Vxlan(e.into())
            }
        }
    )*};
}
through_vxlan!(
    netlink::socket::Error,
    netlink::link::Error,
    netlink::addr::Error,
    netlink::route::Error,
    netlink::neigh::Error,
    netlink::netns::Error,
    netlink::sysctl::Error,
    sticky_overlay::peers::FileError,
    cni_protocol::delegate::Error
);
