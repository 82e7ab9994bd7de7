//! Reading a network config file as libcni does, for the operator tools: a `.conf` (one
//! plugin) or a `.conflist` (the entry of `plugins` a tool is about), with the list's `name`
//! and `cniVersion` injected into that entry, then parsed and checked by the same
//! [`NetConf::parse`] the plugins run on stdin. So a name the plugins refuse (`../../x`,
//! which would put files outside the data dir or `stateDir`) is refused here too.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cni::{NetConf, NetConfError};

#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_CONFIG} bytes: not a network config")]
    TooLarge { path: PathBuf },
    #[error("{path} is not valid JSON: {source}")]
    NotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: \"plugins\" must be an array")]
    PluginsNotArray { path: PathBuf },
    #[error("{path}: no plugin {wanted}")]
    NoPlugin { path: PathBuf, wanted: &'static str },
    #[error("{path}: {source}")]
    Invalid { path: PathBuf, source: NetConfError },
}

/// The largest config file read (a conflist with thousands of inline peers is a few MB).
pub const MAX_CONFIG: u64 = 16 * 1024 * 1024;

/// A config file's bytes ([`crate::nofollow::read_regular`]: a regular file, at most
/// [`MAX_CONFIG`] bytes, never read forever).
fn read_config(path: &Path) -> Result<Vec<u8>, ConflistError> {
    crate::nofollow::read_regular(path, MAX_CONFIG).map_err(|source| {
        if source.kind() == std::io::ErrorKind::FileTooLarge {
            ConflistError::TooLarge {
                path: path.to_path_buf(),
            }
        } else {
            ConflistError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// One plugin's config out of a file: the entry as libcni would send it, and its parse.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub entry: Value,
    pub conf: NetConf,
}

/// Loads `path` and picks the first plugin for which `wanted` holds (`what` names it in
/// errors, e.g. `with type "sticky-vxlan"`).
pub fn load(
    path: &Path,
    what: &'static str,
    wanted: impl Fn(&Value) -> bool,
) -> Result<Loaded, ConflistError> {
    let path_buf = || path.to_path_buf();
    let bytes = read_config(path)?;
    let doc: Value = serde_json::from_slice(&bytes).map_err(|source| ConflistError::NotJson {
        path: path_buf(),
        source,
    })?;
    let mut entry = match doc.get("plugins") {
        Some(Value::Array(plugins)) => {
            let mut entry =
                plugins
                    .iter()
                    .find(|p| wanted(p))
                    .cloned()
                    .ok_or(ConflistError::NoPlugin {
                        path: path_buf(),
                        wanted: what,
                    })?;
            // libcni injects the list's name and version into each plugin's config.
            for key in ["name", "cniVersion"] {
                if let (Some(v), Value::Object(map)) = (doc.get(key), &mut entry) {
                    map.insert(key.to_string(), v.clone());
                }
            }
            entry
        }
        Some(_) => return Err(ConflistError::PluginsNotArray { path: path_buf() }),
        None if wanted(&doc) => doc,
        None => {
            return Err(ConflistError::NoPlugin {
                path: path_buf(),
                wanted: what,
            });
        }
    };
    if let Value::Object(map) = &mut entry {
        map.remove("prevResult");
    }
    let conf =
        NetConf::parse(entry.to_string().as_bytes()).map_err(|source| ConflistError::Invalid {
            path: path_buf(),
            source,
        })?;
    Ok(Loaded { entry, conf })
}

/// Whether a plugin entry has `type` `plugin`.
pub fn has_type(entry: &Value, plugin: &str) -> bool {
    entry.get("type").and_then(Value::as_str) == Some(plugin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn conf_and_conflist_with_name_and_version_injected() {
        let dir = tempfile::tempdir().unwrap();
        let vx = |v: &Value| has_type(v, "sticky-vxlan");
        let list = write(
            dir.path(),
            "a.conflist",
            r#"{"cniVersion":"1.1.0","name":"edge","plugins":[{"type":"portmap"},{"type":"sticky-vxlan","vni":7}]}"#,
        );
        let l = load(&list, "with type sticky-vxlan", vx).unwrap();
        assert_eq!(l.conf.name, "edge");
        assert_eq!(l.entry["cniVersion"], "1.1.0");
        assert_eq!(l.entry["vni"], 7);
        let one = write(
            dir.path(),
            "b.conf",
            r#"{"name":"one","type":"sticky-vxlan"}"#,
        );
        assert_eq!(load(&one, "x", vx).unwrap().conf.name, "one");
        let other = write(dir.path(), "c.conf", r#"{"name":"one","type":"bridge"}"#);
        assert!(matches!(
            load(&other, "x", vx),
            Err(ConflistError::NoPlugin { .. })
        ));
    }

    #[test]
    fn a_name_the_plugins_refuse_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["../../x", "a/b", "", ".hidden"] {
            let p = write(
                dir.path(),
                "n.conflist",
                &format!(
                    r#"{{"cniVersion":"1.0.0","name":{name:?},"plugins":[{{"type":"sticky-vxlan"}}]}}"#
                ),
            );
            let got = load(&p, "x", |v| has_type(v, "sticky-vxlan"));
            assert!(
                matches!(got, Err(ConflistError::Invalid { .. })),
                "{name:?}: {got:?}"
            );
        }
    }
}
