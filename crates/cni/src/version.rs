//! Spec versions this crate speaks, and the VERSION reply.

use std::fmt;

/// A CNI spec version that both plugins implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V010,
    V020,
    V030,
    V031,
    V040,
    V100,
    V110,
}

/// Every version, oldest first: what VERSION advertises.
pub const SUPPORTED: [Version; 7] = [
    Version::V010,
    Version::V020,
    Version::V030,
    Version::V031,
    Version::V040,
    Version::V100,
    Version::V110,
];

impl Version {
    /// The newest version: used for replies when the config's version is unknown.
    pub const LATEST: Version = Version::V110;

    /// Parses a `cniVersion` string; `None` for a version this crate does not speak.
    pub fn parse(text: &str) -> Option<Version> {
        SUPPORTED.into_iter().find(|v| v.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V010 => "0.1.0",
            Version::V020 => "0.2.0",
            Version::V030 => "0.3.0",
            Version::V031 => "0.3.1",
            Version::V040 => "0.4.0",
            Version::V100 => "1.0.0",
            Version::V110 => "1.1.0",
        }
    }

    /// 0.1.0 and 0.2.0 results carry `ip4`/`ip6` instead of `ips`.
    pub fn is_legacy(self) -> bool {
        self <= Version::V020
    }

    /// 0.3.x and 0.4.0 tag every IP with `"version": "4"|"6"`.
    pub fn tags_ip_version(self) -> bool {
        (Version::V030..=Version::V040).contains(&self)
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Version::V040
    }

    /// GC, STATUS and the extra route/interface fields exist from 1.1.0 on.
    pub fn has_gc_status(self) -> bool {
        self >= Version::V110
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON printed for the VERSION command.
pub fn version_reply() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": Version::LATEST.as_str(),
        "supportedVersions": SUPPORTED.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version_and_nothing_else() {
        for v in SUPPORTED {
            assert_eq!(Version::parse(v.as_str()), Some(v));
        }
        assert_eq!(Version::parse("0.5.0"), None);
        assert_eq!(Version::parse("1.0"), None);
        assert_eq!(Version::parse(""), None);
    }

    #[test]
    fn format_families() {
        assert!(Version::V020.is_legacy() && !Version::V030.is_legacy());
        assert!(Version::V031.tags_ip_version() && !Version::V100.tags_ip_version());
        assert!(!Version::V031.has_check() && Version::V040.has_check());
        assert!(Version::V110.has_gc_status() && !Version::V100.has_gc_status());
    }
}
