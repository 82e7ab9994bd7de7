//! The CNI error object printed on stdout when a command fails.

use serde::Serialize;

use super::{EnvError, NetConfError, Version};

/// Spec-defined error codes (SPEC.md, "Error"). Each plugin maps its own errors (its codes from
/// 100 up) in its own `codes` module.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
}

/// `{"cniVersion","code","msg","details"}`: what a runtime reads from a failed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CniError {
    #[serde(rename = "cniVersion")]
    pub cni_version: &'static str,
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            cni_version: Version::LATEST.as_str(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// Answers in the caller's version, as the spec asks.
    pub fn in_version(mut self, version: Version) -> CniError {
        self.cni_version = version.as_str();
        self
    }

    pub fn to_json(&self) -> String {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

/// The protocol's own errors: a bad environment is 4; a config that is not JSON or not an
/// object 6, a version this plugin does not speak 1, a bad name 7.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_omits_empty_details_and_uses_given_version() {
        let e = CniError::new(7, "bad").in_version(Version::V031);
        assert_eq!(
            e.to_json(),
            r#"{"cniVersion":"0.3.1","code":7,"msg":"bad"}"#
        );
        let e = e.with_details("more");
        assert!(e.to_json().ends_with(r#""details":"more"}"#));
    }
}
