//! sticky-ipam's errors as CNI error codes: the spec's where they fit (4 environment, 5 I/O,
//! 7 config, 50 not available), its own from 100 up (listed in the README).

use cni_protocol::CniError;
use cni_protocol::error::code;

/// No address left in a range set (and no released lease may be reclaimed).
pub(crate) const RANGE_EXHAUSTED: u32 = 100;
/// A requested address is held, reserved, or outside the ranges.
pub(crate) const REQUESTED_UNAVAILABLE: u32 = 101;
/// CHECK: an address of prevResult is not recorded for the attachment.
pub(crate) const NOT_RECORDED: u32 = 102;

impl From<crate::Error> for CniError {
    fn from(err: crate::Error) -> CniError {
        use crate::Error;
        use crate::allocator::AllocError;
        use crate::check::CheckError;
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
