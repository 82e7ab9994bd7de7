//! The sites cache, `<stateDir>/<network>.sites.json`: what this node last learnt of the
//! Nodes that matter to sites (every placed Node's site, gateway label, endpoint, public key,
//! pod subnets and underlay address) and the current active gateway of each site. A restart
//! with the API away (an agent restart, a reboot) computes the same plan from it, so the
//! tunnel, its peers and its routes come back with no API. It holds public keys only, never a
//! private one; it is written atomically (a crash leaves the old or the new file) and only
//! when what it holds changed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use sticky_overlay::config::Config;
use sticky_primitives::nofollow;
use sticky_sites::model::{NodeInput, SiteName};

use crate::files;

/// The cache file's format version.
const VERSION: u32 = 1;

/// The largest cache read back: as large as the peers file may be, a few hundred bytes per Node
/// for far more Nodes than a cluster has.
const MAX_FILE: u64 = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a sites cache of version {VERSION}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Write(#[from] files::Error),
}

/// One Node as the cache keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CachedNode {
    name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
    pod_cidrs: Vec<IpNet>,
    underlay: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    nodes: Vec<CachedNode>,
    /// Site name → its active gateway's Node name.
    current: BTreeMap<String, String>,
}

/// What the cache holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cache {
    pub inputs: Vec<NodeInput>,
    pub current: BTreeMap<SiteName, String>,
}

/// The cache file of the network `cfg` configures.
pub fn path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(format!("{}.sites.json", cfg.name))
}

/// The cache at `path`; `None` when there is none yet.
/// A link at `path` is refused, never followed, and so is a FIFO or a file over [`MAX_FILE`]
/// ([`nofollow::read_bounded`]): the state directory is root's, but what the agent reads back
/// from it must be what it wrote.
pub fn load(path: &Path) -> Result<Option<Cache>, Error> {
    let read = nofollow::read_bounded(path, MAX_FILE).map_err(|source| Error::Read {
        path: path.into(),
        source,
    })?;
    let Some(text) = read else {
        return Ok(None);
    };
    let file: File = serde_json::from_slice(&text).map_err(|source| Error::Format {
        path: path.into(),
        source,
    })?;
    if file.version != VERSION {
        return Err(Error::Format {
            path: path.into(),
            source: serde::de::Error::custom(format!("version {}", file.version)),
        });
    }
    let inputs = file
        .nodes
        .into_iter()
        .map(|n| NodeInput {
            name: n.name,
            labels: n.labels,
            annotations: n.annotations,
            pod_cidrs: n.pod_cidrs,
            underlay: n.underlay,
        })
        .collect();
    // A site name that no longer parses is dropped: the rule then picks its gateway afresh.
    let current = file
        .current
        .into_iter()
        .filter_map(|(s, g)| SiteName::parse("site", &s).ok().map(|s| (s, g)))
        .collect();
    Ok(Some(Cache { inputs, current }))
}

/// Writes `cache` to `path` (atomically, 0644: it holds no secret), through
/// [`files::write_atomic`] ([`nofollow::replace_through`]: a link planted at `path` is replaced,
/// never written through).
pub fn save(path: &Path, cache: &Cache) -> Result<(), Error> {
    let file = File {
        version: VERSION,
        nodes: cache
            .inputs
            .iter()
            .map(|n| CachedNode {
                name: n.name.clone(),
                labels: n.labels.clone(),
                annotations: n.annotations.clone(),
                pod_cidrs: n.pod_cidrs.clone(),
                underlay: n.underlay,
            })
            .collect(),
        current: cache
            .current
            .iter()
            .map(|(s, g)| (s.as_str().to_string(), g.clone()))
            .collect(),
    };
    let mut text = serde_json::to_vec_pretty(&file).map_err(|source| Error::Format {
        path: path.into(),
        source,
    })?;
    text.push(b'\n');
    files::write_atomic(path, &text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("net.sites.json");
        assert_eq!(load(&p).unwrap(), None);
        let cache = Cache {
            inputs: vec![NodeInput {
                name: "a1".into(),
                labels: BTreeMap::from([("sticky-cni.io/site".into(), "site-a".into())]),
                annotations: BTreeMap::new(),
                pod_cidrs: vec!["198.18.11.0/24".parse().unwrap()],
                underlay: Some("192.0.2.1".parse().unwrap()),
            }],
            current: BTreeMap::from([(SiteName::parse("site", "site-a").unwrap(), "a1".into())]),
        };
        save(&p, &cache).unwrap();
        assert_eq!(load(&p).unwrap(), Some(cache));
        std::fs::write(&p, b"{\"version\": 9, \"nodes\": [], \"current\": {}}").unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("version 9"));
        std::fs::write(&p, b"[").unwrap();
        assert!(matches!(load(&p), Err(Error::Format { .. })));
    }

    /// A link planted at the cache's name is refused on reading (not followed, even to a good
    /// cache), and replaced on writing: what it points to is never read nor written.
    #[test]
    fn a_link_at_the_cache_path_is_refused_and_not_followed() {
        use sticky_primitives::nofollow::{Refused, refusal};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("net.sites.json");
        let elsewhere = dir.path().join("elsewhere.json");
        let cache = Cache {
            inputs: Vec::new(),
            current: BTreeMap::from([(SiteName::parse("site", "site-a").unwrap(), "a1".into())]),
        };
        save(&elsewhere, &cache).unwrap();
        let kept = std::fs::read(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        let err = load(&p).unwrap_err();
        assert!(
            matches!(&err, Error::Read { source, .. } if matches!(refusal(source), Some(Refused::Link))),
            "{err}"
        );
        assert!(err.to_string().contains("symbolic link"), "{err}");
        save(&p, &Cache::default()).unwrap();
        assert!(!std::fs::symlink_metadata(&p).unwrap().is_symlink());
        assert_eq!(std::fs::read(&elsewhere).unwrap(), kept);
        assert_eq!(load(&p).unwrap(), Some(Cache::default()));
    }
}
