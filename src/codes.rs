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

// ---- sticky-vxlan ----
