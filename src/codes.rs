//! The one place where errors become CNI error codes.
//!
//! Spec codes where they fit (1 version, 4 environment, 5 I/O, 6 decode, 7 config, 11 try
//! again, 50 not available); plugin-specific codes from 100 up, listed here and in the README.

use crate::cni::error::code;
use crate::cni::{CniError, EnvError, NetConfError};

impl From<EnvError> for CniError {
    fn from(err: EnvError) -> CniError {
        CniError::new(code::INVALID_ENV, err.to_string())
    }
}

impl From<NetConfError> for CniError {
    fn from(err: NetConfError) -> CniError {
        let code = match &err {
            NetConfError::Json(_) | NetConfError::NotAnObject | NetConfError::PrevResult(_) => {
                code::DECODE
            }
            NetConfError::UnsupportedVersion(_) => code::INCOMPATIBLE_VERSION,
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
        let code = match &err {
            Error::Args(_) => code::INVALID_ENV,
            Error::Config(_) | Error::GcWithoutAttachments | Error::BadAttachments(_) => {
                code::INVALID_CONFIG
            }
            Error::Alloc(AllocError::Exhausted { .. }) => RANGE_EXHAUSTED,
            Error::Alloc(
                AllocError::RequestedUnavailable { .. } | AllocError::RequestedOutside(_),
            ) => REQUESTED_UNAVAILABLE,
            Error::Alloc(AllocError::NotRecorded { .. } | AllocError::NoAttachment { .. }) => {
                NOT_RECORDED
            }
            Error::Alloc(AllocError::Store(_)) | Error::Store(_) | Error::Resolv(_) => code::IO,
            Error::NotReady(_) => code::NOT_AVAILABLE,
        };
        CniError::new(code, err.to_string())
    }
}

// ---- sticky-vxlan ----
