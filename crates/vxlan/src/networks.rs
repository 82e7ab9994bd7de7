//! sticky-vxlan's networks, whatever their mode (the config's `"mode"`: absent for the main,
//! L3 mode, [`crate::vxlan`]; `"segment"` for an L2 segment, [`crate::segment`]): the CNI plugin
//! that runs each call in its network's mode ([`StickyVxlan`]), and a network config file
//! loaded and reconciled for the programs on top (the operator's `sticky-vxlan reconcile` and
//! the node agent).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::main_mode::plugin::MainMode as Main;
use crate::segment::plugin::Segment;
use cni_protocol::conflist::{self, ConflistError, Loaded};
use cni_protocol::error::code;
use cni_protocol::{Call, CniError, CniResult, Plugin};
use sticky_netlink::link::format_mac;
use sticky_overlay::config::{self, Config};
use sticky_overlay::mac::vtep_mac;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("\"mode\" {0} is not known: leave it out for the main (L3) mode, or use \"segment\"")]
    Mode(String),
    #[error("--config {0}")]
    Conflist(#[from] ConflistError),
    #[error("--config {path}: {source}")]
    Config {
        path: PathBuf,
        source: config::Error,
    },
    #[error(
        "--config {0}: not a segment network (its sticky-vxlan entry has no \"mode\": \"segment\")"
    )]
    NotSegment(PathBuf),
    #[error(transparent)]
    Vxlan(#[from] sticky_overlay::Error),
    #[error(transparent)]
    Segment(#[from] crate::segment::Error),
}

impl Error {
    /// Whether the file itself is unusable (a usage error for the operator's tool), rather
    /// than the node's work failing.
    pub(crate) fn is_config(&self) -> bool {
        match self {
            Error::Vxlan(_) => false,
            Error::Segment(s) => matches!(s, crate::segment::Error::Config(_)),
            _ => true,
        }
    }

    /// The message, naming the file it is about when it does not already.
    pub fn about(&self, path: &Path) -> String {
        match self {
            Error::Conflist(_) | Error::Config { .. } | Error::NotSegment(_) => self.to_string(),
            _ => format!("--config {}: {self}", path.display()),
        }
    }
}

/// An unknown mode is a config error (7); everything else keeps its mode's code.
impl From<Error> for CniError {
    fn from(err: Error) -> CniError {
        match err {
            Error::Vxlan(e) => e.into(),
            Error::Segment(e) => e.into(),
            other => CniError::new(code::INVALID_CONFIG, other.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Main,
    Segment,
}

/// The mode a network config (a plugin entry) asks for.
pub fn mode(conf: &Value) -> Result<Mode, Error> {
    match conf.get("mode") {
        None | Some(Value::Null) => Ok(Mode::Main),
        Some(Value::String(s)) if s == "segment" => Ok(Mode::Segment),
        Some(v) => Err(Error::Mode(v.to_string())),
    }
}

/// The plugin `sticky-vxlan` runs: each call in its network's mode.
pub struct StickyVxlan;

/// Runs `op` on the plugin of the call's mode.
fn by_mode<T>(
    call: &Call,
    main: impl FnOnce(&Main) -> Result<T, sticky_overlay::Error>,
    segment: impl FnOnce(&Segment) -> Result<T, crate::segment::Error>,
) -> Result<T, CniError> {
    match mode(&call.conf.raw)? {
        Mode::Main => Ok(main(&Main)?),
        Mode::Segment => Ok(segment(&Segment)?),
    }
}

impl Plugin for StickyVxlan {
    type Error = CniError;

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        by_mode(call, |p| p.add(call), |p| p.add(call))
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.del(call), |p| p.del(call))
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.check(call), |p| p.check(call))
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.gc(call), |p| p.gc(call))
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        by_mode(call, |p| p.status(call), |p| p.status(call))
    }
}

/// The `sticky-vxlan` entry of a `.conf` or `.conflist`, either mode.
fn load_entry(path: &Path) -> Result<Loaded, Error> {
    Ok(conflist::load(
        path,
        sticky_primitives::nofollow::read_regular,
        "with type \"sticky-vxlan\"",
        |p| conflist::has_type(p, "sticky-vxlan"),
    )?)
}

/// The main mode's config of a loaded entry.
fn config_of(path: &Path, loaded: &Loaded) -> Result<Config, Error> {
    Config::from_json(&loaded.conf.name, &loaded.entry).map_err(|source| Error::Config {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a `.conf` (one plugin) or `.conflist` (the `sticky-vxlan` entry of its `plugins`) as
/// a main-mode network.
pub fn load(path: &Path) -> Result<Config, Error> {
    config_of(path, &load_entry(path)?)
}

/// Brings the network in `path` (either mode) to what its peers say, and says what it did.
pub fn reconcile(path: &Path) -> Result<String, Error> {
    let loaded = load_entry(path)?;
    match mode(&loaded.entry)? {
        Mode::Segment => Ok(format!("{}\n", segment_network(&loaded)?)),
        Mode::Main => main_node(&config_of(path, &loaded)?),
    }
}

/// [`reconcile`] for a file that must be a segment network (the agent's `--segment-config`).
pub fn reconcile_segment(path: &Path) -> Result<crate::segment::reconcile::Reconciled, Error> {
    let loaded = load_entry(path)?;
    match mode(&loaded.entry)? {
        Mode::Segment => segment_network(&loaded),
        Mode::Main => Err(Error::NotSegment(path.to_path_buf())),
    }
}

/// Reconciles the segment network of `loaded`.
fn segment_network(loaded: &Loaded) -> Result<crate::segment::reconcile::Reconciled, Error> {
    Ok(crate::segment::reconcile::network(
        &loaded.conf.name,
        &loaded.entry,
    )?)
}

/// The peers file of the segment network in `path`; `None` for a main-mode file, one without
/// a peers file, or one that does not load (its reconcile says why).
pub fn segment_peers_file(path: &Path) -> Option<PathBuf> {
    let loaded = load_entry(path).ok()?;
    match mode(&loaded.entry).ok()? {
        Mode::Segment => {
            crate::segment::config::Config::from_json(&loaded.conf.name, &loaded.entry)
                .ok()?
                .peers_file
        }
        Mode::Main => None,
    }
}

/// Creates or repairs the main mode's node (VTEP, bridge, peers) and says what it did.
fn main_node(cfg: &Config) -> Result<String, Error> {
    let report = crate::main_mode::reconcile::run(cfg)?;
    let (node, vtep, bridge) = (&report.node, &report.vtep, &report.bridge);
    let mut out = format!(
        "{} up with MAC {} (local {}, vni {}, port {}), bridge {}, {} remote peer(s)\n",
        vtep.name,
        format_mac(&vtep_mac(node.local_ip, cfg.vni)),
        node.local_ip,
        cfg.vni,
        cfg.port,
        bridge.name,
        node.remote.len()
    );
    if let Some(e) = report.peers_file_error() {
        let _ = writeln!(out, "warning: {e}; programmed peers were left as they are");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn modes() {
        assert_eq!(mode(&json!({})).unwrap(), Mode::Main);
        assert_eq!(mode(&json!({"mode": "segment"})).unwrap(), Mode::Segment);
        for bad in [json!("Segment"), json!("l2"), json!(1)] {
            assert!(matches!(mode(&json!({"mode": bad})), Err(Error::Mode(_))));
        }
    }

    #[test]
    fn load_reads_conf_and_conflist() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("10-edge.conflist");
        std::fs::write(
            &list,
            r#"{"cniVersion":"1.0.0","name":"edge","plugins":[
                {"type":"sticky-vxlan","vni":7,"ipam":{"type":"sticky-ipam"}},
                {"type":"portmap"}]}"#,
        )
        .unwrap();
        let c = load(&list).unwrap();
        assert_eq!((c.name.as_str(), c.vni), ("edge", 7));
        let conf = dir.path().join("10-edge.conf");
        std::fs::write(
            &conf,
            r#"{"cniVersion":"1.0.0","name":"one","type":"sticky-vxlan","vni":2,"ipam":{"type":"x"}}"#,
        )
        .unwrap();
        assert_eq!(load(&conf).unwrap().vni, 2);
        std::fs::write(&conf, r#"{"name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert!(matches!(load(&conf), Err(Error::Conflist(_))));
    }
}
