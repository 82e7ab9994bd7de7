//! Reading a network config file as libcni does, for the operator tools: a `.conf` (one
//! plugin) or a `.conflist` (the entry of `plugins` a tool is about), with the list's `name`
//! and `cniVersion` injected into that entry, then parsed and checked by the same
//! [`NetConf::parse`] the plugins run on stdin. So a name the plugins refuse (`../../x`,
//! which would put files outside the data dir or `stateDir`) is refused here too.
//!
//! The version injected is the one a runtime on libcni ≥ 1.2 (containerd ≥ 2.0.1, CRI-O)
//! sends: the highest of the list's `cniVersion` and its `cniVersions` (CNI 1.1.0: every
//! version the config supports) that this crate speaks. A runtime on an older libcni
//! (containerd 1.6/1.7) ignores `cniVersions` and sends `cniVersion`; both read the same
//! plugin config, so the tools see what the newer runtimes hand the plugins.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{NetConf, NetConfError, Version};

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
    #[error("{path}: \"cniVersions\" must be a list of version strings, not {found}")]
    BadVersions { path: PathBuf, found: String },
}

/// How a config file is read: its path and the largest size accepted in, its bytes out.
pub type Reader = fn(&Path, u64) -> std::io::Result<Vec<u8>>;

/// The largest config file read (a conflist with thousands of inline peers is a few MB).
pub const MAX_CONFIG: u64 = 16 * 1024 * 1024;

/// A config file's bytes, read by `read` (given the path and [`MAX_CONFIG`]; it answers
/// `ErrorKind::FileTooLarge` beyond that): the caller chooses how a file is opened (sticky-cni
/// reads regular files only, never through a link, never blocking on a FIFO).
fn read_config(path: &Path, read: Reader) -> Result<Vec<u8>, ConflistError> {
    read(path, MAX_CONFIG).map_err(|source| {
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
    read: Reader,
    what: &'static str,
    wanted: impl Fn(&Value) -> bool,
) -> Result<Loaded, ConflistError> {
    let path_buf = || path.to_path_buf();
    let bytes = read_config(path, read)?;
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
            // libcni injects the list's name and (negotiated) version into each plugin's
            // config; `cniVersions` itself is not passed on.
            let version = negotiated_version(&doc).map_err(|found| ConflistError::BadVersions {
                path: path_buf(),
                found,
            })?;
            if let Value::Object(map) = &mut entry {
                if let Some(name) = doc.get("name") {
                    map.insert("name".to_string(), name.clone());
                }
                if let Some(version) = version {
                    map.insert("cniVersion".to_string(), version);
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

/// The `cniVersion` a runtime on libcni ≥ 1.2 sends the plugins of conflist `doc`: the highest
/// version this crate speaks among `cniVersion` and the `cniVersions` entries (versions it does
/// not speak are skipped, as libcni skips versions newer than its own); `cniVersion` as written
/// when none is spoken or there is no `cniVersions`; `None` when the list has no version at
/// all. Err quotes a `cniVersions` that is not a list of strings.
fn negotiated_version(doc: &Value) -> Result<Option<Value>, String> {
    let declared = doc.get("cniVersion");
    let Some(list) = doc.get("cniVersions") else {
        return Ok(declared.cloned());
    };
    let Value::Array(entries) = list else {
        return Err(list.to_string());
    };
    let mut best = declared.and_then(Value::as_str).and_then(Version::parse);
    for entry in entries {
        let Value::String(text) = entry else {
            return Err(list.to_string());
        };
        best = best.max(Version::parse(text));
    }
    Ok(best
        .map(|v| Value::from(v.as_str()))
        .or_else(|| declared.cloned()))
}

/// Whether a plugin entry has `type` `plugin`.
pub fn has_type(entry: &Value, plugin: &str) -> bool {
    entry.get("type").and_then(Value::as_str) == Some(plugin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain read with the size limit (the programs use `nofollow::read_regular`).
    fn read(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
        let bytes = std::fs::read(path)?;
        if bytes.len() as u64 > max {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        Ok(bytes)
    }

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
        let l = load(&list, read, "with type sticky-vxlan", vx).unwrap();
        assert_eq!(l.conf.name, "edge");
        assert_eq!(l.entry["cniVersion"], "1.1.0");
        assert_eq!(l.entry["vni"], 7);
        let one = write(
            dir.path(),
            "b.conf",
            r#"{"name":"one","type":"sticky-vxlan"}"#,
        );
        assert_eq!(load(&one, read, "x", vx).unwrap().conf.name, "one");
        let other = write(dir.path(), "c.conf", r#"{"name":"one","type":"bridge"}"#);
        assert!(matches!(
            load(&other, read, "x", vx),
            Err(ConflistError::NoPlugin { .. })
        ));
    }

    #[test]
    fn cni_versions_pick_the_highest_version_spoken_as_libcni_1_2_does() {
        let dir = tempfile::tempdir().unwrap();
        let vx = |v: &Value| has_type(v, "sticky-vxlan");
        let cases = [
            // The shipped form: 1.0.0 for old runtimes, 1.1.0 negotiated by new ones.
            (
                r#""cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"]"#,
                "1.1.0",
            ),
            // Order does not matter; versions not spoken (newer, malformed) are skipped.
            (
                r#""cniVersion":"1.0.0","cniVersions":["1.1.0","0.4.0","9.9.9","x"]"#,
                "1.1.0",
            ),
            (r#""cniVersion":"0.4.0","cniVersions":["0.3.1"]"#, "0.4.0"),
            (r#""cniVersions":["0.4.0","1.0.0"]"#, "1.0.0"),
            (r#""cniVersion":"1.0.0","cniVersions":[]"#, "1.0.0"),
        ];
        for (versions, want) in cases {
            let list = write(
                dir.path(),
                "v.conflist",
                &format!(r#"{{{versions},"name":"edge","plugins":[{{"type":"sticky-vxlan"}}]}}"#),
            );
            let l = load(&list, read, "x", vx).unwrap_or_else(|e| panic!("{versions}: {e}"));
            assert_eq!(l.entry["cniVersion"], want, "{versions}");
            assert_eq!(l.conf.version.as_str(), want, "{versions}");
            assert!(l.entry.get("cniVersions").is_none(), "{versions}");
        }
        for bad in [r#""cniVersions":"1.1.0""#, r#""cniVersions":["1.0.0",110]"#] {
            let list = write(
                dir.path(),
                "b.conflist",
                &format!(
                    r#"{{"cniVersion":"1.0.0",{bad},"name":"edge","plugins":[{{"type":"sticky-vxlan"}}]}}"#
                ),
            );
            let got = load(&list, read, "x", vx);
            assert!(
                matches!(&got, Err(e @ ConflistError::BadVersions { .. }) if e.to_string().contains("cniVersions")),
                "{bad}: {got:?}"
            );
        }
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
            let got = load(&p, read, "x", |v| has_type(v, "sticky-vxlan"));
            assert!(
                matches!(got, Err(ConflistError::Invalid { .. })),
                "{name:?}: {got:?}"
            );
        }
    }
}
