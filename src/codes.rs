//! The one place where errors become CNI error codes.
//!
//! Spec codes where they fit (1 version, 4 environment, 5 I/O, 6 decode, 7 config, 11 try
//! again, 50 not available); plugin-specific codes from 100 up, listed here and in the README.

use crate::cni::error::code;
use crate::cni::{CniError, EnvError, NetConfError};

impl From<EnvError> for CniError {
    fn from(err: EnvError) -> CniError {
        let error = CniError::new(code::INVALID_ENV, err.to_string());
        match err.details() {
            Some(details) => error.with_details(details),
            None => error,
        }
    }
}

impl From<NetConfError> for CniError {
    fn from(err: NetConfError) -> CniError {
        let code = match &err {
            NetConfError::Json(_) | NetConfError::NotAnObject | NetConfError::PrevResult(_) => {
                code::DECODE
            }
            NetConfError::UnsupportedVersion(v) => {
                return CniError::new(code::INCOMPATIBLE_VERSION, err.to_string()).with_details(
                    format!(
                        "config is {v:?}, plugin supports [\"0.1.0\" \"0.2.0\" \"0.3.0\" \"0.3.1\" \"0.4.0\" \"1.0.0\" \"1.1.0\"]"
                    ),
                );
            }
            NetConfError::NotAString { .. } | NetConfError::NoName | NetConfError::BadName(_) => {
                code::INVALID_CONFIG
            }
        };
        CniError::new(code, err.to_string())
    }
}

// ---- sticky-ipam ----

/// No address left in a range set (and no released lease may be reclaimed).
pub const RANGE_EXHAUSTED: u32 = 100;
/// A requested address is held, reserved, or outside the ranges.
pub const REQUESTED_UNAVAILABLE: u32 = 101;
/// CHECK: an address of prevResult is not recorded for the attachment.
pub const NOT_RECORDED: u32 = 102;

impl From<crate::ipam::Error> for CniError {
    fn from(err: crate::ipam::Error) -> CniError {
        use crate::ipam::Error;
        use crate::ipam::allocator::AllocError;
        use crate::ipam::check::CheckError;
        let code = match &err {
            Error::Args(_) => code::INVALID_ENV,
            Error::Config(_) | Error::GcWithoutAttachments | Error::BadAttachments(_) => {
                code::INVALID_CONFIG
            }
            Error::Alloc(AllocError::Exhausted { .. }) => RANGE_EXHAUSTED,
            Error::Alloc(
                AllocError::RequestedGateway { .. }
                | AllocError::RequestedTaken { .. }
                | AllocError::RequestedUnavailable { .. }
                | AllocError::RequestedUnfulfilled(_),
            ) => REQUESTED_UNAVAILABLE,
            Error::Check(CheckError::NotRecorded { .. } | CheckError::NoAttachment { .. }) => {
                NOT_RECORDED
            }
            Error::Alloc(AllocError::Store(_))
            | Error::Check(CheckError::Store(_))
            | Error::Store(_)
            | Error::Resolv(_) => code::IO,
            Error::NotReady(_) => code::NOT_AVAILABLE,
        };
        CniError::new(code, err.to_string())
    }
}

// ---- sticky-vxlan ----

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
    pub const PEERS: u32 = 124;
    pub const IPAM_EXEC: u32 = 125;
    pub const FIREWALL: u32 = 126;
    pub const CHECK: u32 = 127;
    pub const LOCK: u32 = 128;
}

impl From<crate::vxlan::Error> for CniError {
    fn from(err: crate::vxlan::Error) -> CniError {
        use crate::vxlan::Error as E;
        use vxlan_code::*;
        let code = match &err {
            E::Ipam(crate::cni::delegate::Error::Failed {
                code, msg, details, ..
            }) => {
                return CniError::new(*code, format!("IPAM: {msg}")).with_details(details.clone());
            }
            E::Config(_) | E::Attachments(_) => code::INVALID_CONFIG,
            E::Peers(_) | E::PeersFile(_) => PEERS,
            E::NoDevice { .. }
            | E::DeviceWithoutIpv4 { .. }
            | E::LocalIpNotHere { .. }
            | E::NoRemotePeer
            | E::NoRouteToPeer { .. }
            | E::UnderlayNotNamed { .. }
            | E::NoLocalEntry { .. }
            | E::MtuTooLarge { .. }
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

/// Segment errors: config, mode, MAC and address requests and the node slice are 7, a bad
/// CNI_ARGS `MAC=` is 4, this node outside the segment is 120, a device of the segment's name
/// that is not ours is 121; everything shared with the main mode keeps the main mode's code.
impl From<crate::segment::Error> for CniError {
    fn from(err: crate::segment::Error) -> CniError {
        use crate::segment::Error as E;
        let err = match err {
            E::Vxlan(inner) => return CniError::from(inner),
            other => other,
        };
        let code = match &err {
            E::Vxlan(_) => vxlan_code::NETLINK, // returned above
            E::Config(_) | E::Mode(_) | E::Mac { .. } | E::RuntimeConfig { .. } | E::Slice(_) => {
                code::INVALID_CONFIG
            }
            E::ArgsMac(_) => code::INVALID_ENV,
            E::NoLocalEntry | E::NotInSegment { .. } => vxlan_code::NODE,
            E::NotOurs { .. } => vxlan_code::IN_THE_WAY,
        };
        CniError::new(code, err.to_string())
    }
}
