//! The network configuration a runtime writes on stdin: the fields every plugin shares.
//!
//! Plugin-specific keys stay in [`NetConf::raw`] for the plugin to decode itself.

use serde_json::Value;

use super::result::ResultError;
use super::{CniResult, Version};

/// The common part of a network configuration (one plugin's entry of a conflist, as libcni
/// hands it over: `name` and `cniVersion` injected, `prevResult` and `runtimeConfig` added).
#[derive(Debug, Clone)]
pub struct NetConf {
    pub version: Version,
    pub name: String,
    pub plugin_type: String,
    pub prev_result: Option<CniResult>,
    /// `runtimeConfig`, or an empty object.
    pub runtime_config: Value,
    /// The whole document.
    pub raw: Value,
}

/// Whether `name` is a network name as the spec's pattern has it: a letter or digit, then
/// letters, digits, `_`, `.` or `-`. It becomes a directory under `dataDir` and a file name
/// in `stateDir`, and the pattern keeps it there (no `/`, no leading `.`). Every path built
/// from a network name, in the plugins and the operator tools, is checked with this.
pub fn is_network_name(name: &str) -> bool {
    // The spec gives network names the container id's pattern.
    crate::env::validate_container_id(name).is_ok()
}

#[derive(Debug, thiserror::Error)]
pub enum NetConfError {
    #[error("network config is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("network config must be a JSON object")]
    NotAnObject,
    #[error("{key} must be a string")]
    NotAString { key: &'static str },
    /// The skeleton's words; the details say which versions are supported.
    #[error("incompatible CNI versions")]
    UnsupportedVersion(String),
    #[error("network name is missing")]
    NoName,
    #[error(
        "network name {0:?} is invalid: it must start with a letter or digit, followed by letters, digits, '_', '.' or '-'"
    )]
    BadName(String),
    #[error("prevResult is not a valid CNI result: {0}")]
    PrevResult(#[from] ResultError),
}

impl NetConf {
    pub fn parse(stdin: &[u8]) -> Result<NetConf, NetConfError> {
        let raw: Value = serde_json::from_slice(stdin)?;
        let obj = raw.as_object().ok_or(NetConfError::NotAnObject)?;
        let string = |key: &'static str| -> Result<Option<String>, NetConfError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(NetConfError::NotAString { key }),
            }
        };
        // A config without cniVersion is a 0.1.0 config, as libcni reads it.
        let version_text = string("cniVersion")?.unwrap_or_else(|| "0.1.0".into());
        let version =
            Version::parse(&version_text).ok_or(NetConfError::UnsupportedVersion(version_text))?;
        let name = string("name")?.ok_or(NetConfError::NoName)?;
        if !is_network_name(&name) {
            return Err(NetConfError::BadName(name));
        }
        let plugin_type = string("type")?.unwrap_or_default();
        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => Some(CniResult::from_json(v)?),
        };
        let runtime_config = obj
            .get("runtimeConfig")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(Default::default()));
        Ok(NetConf {
            version,
            name,
            plugin_type,
            prev_result,
            runtime_config,
            raw,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_common_fields() {
        let c = NetConf::parse(
            br#"{"cniVersion":"0.3.1","name":"net","type":"x","runtimeConfig":{"ips":["10.0.0.2"]},
                 "prevResult":{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}}"#,
        )
        .unwrap();
        assert_eq!(c.version, Version::V031);
        assert_eq!(c.name, "net");
        assert_eq!(c.runtime_config["ips"][0], "10.0.0.2");
        assert_eq!(
            c.prev_result.unwrap().ips[0].address.to_string(),
            "10.0.0.2/24"
        );
    }

    #[test]
    fn missing_version_means_010() {
        assert_eq!(
            NetConf::parse(br#"{"name":"n"}"#).unwrap().version,
            Version::V010
        );
    }

    #[test]
    fn cni_versions_in_a_plugin_config_leave_the_runtime_choice_alone() {
        // The runtime negotiates (libcni >= 1.2 for a conflist) and passes its choice as
        // cniVersion; a .conf hands the plugin its cniVersions as written. The plugin answers
        // in cniVersion, never in a version picked from the list.
        for (doc, want) in [
            (
                r#"{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"n"}"#,
                Version::V100,
            ),
            (
                r#"{"cniVersion":"1.1.0","cniVersions":["1.0.0","1.1.0"],"name":"n"}"#,
                Version::V110,
            ),
        ] {
            assert_eq!(
                NetConf::parse(doc.as_bytes()).unwrap().version,
                want,
                "{doc}"
            );
        }
    }

    #[test]
    fn refusals() {
        assert!(matches!(NetConf::parse(b"{"), Err(NetConfError::Json(_))));
        assert!(matches!(
            NetConf::parse(b"[]"),
            Err(NetConfError::NotAnObject)
        ));
        assert!(matches!(
            NetConf::parse(br#"{"cniVersion":"9.9.9","name":"n"}"#),
            Err(NetConfError::UnsupportedVersion(_))
        ));
        assert!(matches!(
            NetConf::parse(br#"{"cniVersion":"1.0.0"}"#),
            Err(NetConfError::NoName)
        ));
        for bad in ["../x", "a/b", "", ".hidden"] {
            let doc = format!(r#"{{"cniVersion":"1.0.0","name":{bad:?}}}"#);
            assert!(
                matches!(
                    NetConf::parse(doc.as_bytes()),
                    Err(NetConfError::BadName(_))
                ),
                "{bad}"
            );
        }
    }
}
