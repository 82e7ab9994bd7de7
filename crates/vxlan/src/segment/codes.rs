//! Segment mode's errors as CNI error codes (the main mode's, [`sticky_overlay::codes`]).

use cni_protocol::CniError;
use cni_protocol::error::code;
use sticky_overlay::codes::vxlan_code;

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
            E::Config(_) | E::Mac { .. } | E::RuntimeConfig { .. } | E::Slice(_) => {
                code::INVALID_CONFIG
            }
            E::ArgsMac(_) => code::INVALID_ENV,
            E::NoLocalEntry | E::NotInSegment { .. } => vxlan_code::NODE,
            E::NotOurs { .. } => vxlan_code::IN_THE_WAY,
        };
        CniError::new(code, err.to_string())
    }
}
