//! sticky-vxlan's errors as CNI error codes: the spec's where they fit (7 config, 50 not
//! available), its own from 120 up (listed in the README); an IPAM error keeps its own code.

use cni_protocol::CniError;
use cni_protocol::error::code;

/// sticky-vxlan plugin codes:
/// 120 underlay/node cannot be worked out (no local entry, no underlay, MTU too large, an
/// IPAM address or gateway outside the node's subnets),
/// 121 something not ours is in the way (VNI+port taken, wrong kind, a device without our
/// marker or with another network's, the uplink as bridge, a foreign route on a peer subnet),
/// 122 netlink/sysctl refused,
/// 123 the pod's network namespace cannot be used, 124 peers invalid or peers file unsafe,
/// 125 the IPAM plugin cannot be run or printed garbage (an IPAM error keeps its own code),
/// 126 nftables rules refused, 127 CHECK found a difference, 128 the peer lock failed.
pub mod vxlan_code {
    pub const NODE: u32 = 120;
    pub const IN_THE_WAY: u32 = 121;
    pub const NETLINK: u32 = 122;
    pub const NETNS: u32 = 123;
    pub(crate) const PEERS: u32 = 124;
    pub(crate) const IPAM_EXEC: u32 = 125;
    pub(crate) const FIREWALL: u32 = 126;
    pub const CHECK: u32 = 127;
    pub(crate) const LOCK: u32 = 128;
}

impl From<crate::Error> for CniError {
    fn from(err: crate::Error) -> CniError {
        use crate::Error as E;
        use vxlan_code::*;
        let code = match &err {
            E::Ipam(cni_protocol::delegate::Error::Failed {
                code, msg, details, ..
            }) => {
                return CniError::new(*code, format!("IPAM: {msg}")).with_details(details.clone());
            }
            E::Config(_) | E::Attachments(_) => code::INVALID_CONFIG,
            E::Peers(_) | E::PeersFile(_) => PEERS,
            E::NoDevice { .. }
            | E::DeviceWithoutAddress { .. }
            | E::LocalIpNotHere { .. }
            | E::NoRemotePeer
            | E::NoRouteToPeer { .. }
            | E::UnderlayNotNamed { .. }
            | E::NoLocalEntry { .. }
            | E::MtuTooLarge { .. }
            | E::MtuAboveWan { .. }
            | E::ForeignAddress { .. }
            | E::ForeignGateway { .. } => NODE,
            E::VniTaken { .. }
            | E::WrongKind { .. }
            | E::NotOurs { .. }
            | E::OtherNetwork { .. }
            | E::UnderlayBridge { .. }
            | E::ForeignRoute { .. } => IN_THE_WAY,
            E::Socket(_)
            | E::Link(_)
            | E::Addr(_)
            | E::Route(_)
            | E::Neigh(_)
            | E::Sysctl(_)
            | E::Vanished { .. } => NETLINK,
            E::Netns(_) => NETNS,
            E::Lock(_) => LOCK,
            E::Ipam(_) => IPAM_EXEC,
            E::Firewall(_) => FIREWALL,
            E::Check(_) => CHECK,
            E::NotReady(_) => code::NOT_AVAILABLE,
        };
        CniError::new(code, err.to_string())
    }
}

// ---- sticky-vxlan segment mode ----
