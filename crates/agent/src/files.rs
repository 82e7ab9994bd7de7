//! The files the agent writes: the peers file (crash-safe, only when its peers change) and a
//! small status file `sticky-vxlan show` reads.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sticky_overlay::peers::{self, Peer};
use sticky_overlay::state_dir;
use sticky_primitives::nofollow::{self, Durability};
use sticky_vxlan::status::{Status, status_path};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `text` to `path` so that a reader sees either the old file or the new one, whole
/// ([`nofollow::replace_through`]: a temp file [`temp_prefix`]`<random>` created new beside
/// it, mode 0644, renamed over `path`; a link planted at `path` is replaced, not followed).
/// [`Durability::Durable`]: the file and the directory are fsynced before it returns, since
/// the agent writes the peers file only when its peers change, and a node rebooted after a
/// power cut is programmed from it before the API server is reachable.
pub fn write_atomic(path: &Path, text: &[u8]) -> Result<(), Error> {
    nofollow::replace_through(&temp_prefix(path), path, text, 0o644, Durability::Durable).map_err(
        |source| Error::Write {
            path: path.to_path_buf(),
            source,
        },
    )
}

/// The agent's temp files beside `path`: `.<name>.agent.` plus random hex digits, told apart
/// from anyone else's temp files of the same name.
fn temp_prefix(path: &Path) -> String {
    format!("{}agent.", nofollow::temp_prefix(path))
}

/// Removes the temp files a writer of `path` killed half-way left beside it
/// ([`temp_prefix`], see [`write_atomic`]); a link is removed, never followed.
pub fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(_)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = temp_prefix(path);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Writes the status file of `status.network` in `state_dir` ([`write_atomic`]). The
/// directory is created as the plugin creates it ([`state_dir::create_dir`]: 0700, and a link
/// at its name is refused, so nothing is written where it points).
pub fn write_status(state_dir: &Path, status: &Status) -> Result<(), Error> {
    let text = serde_json::to_vec(status).unwrap_or_default();
    let path = status_path(state_dir, &status.network);
    state_dir::create_dir(state_dir)
        .map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })
        .and_then(|()| write_atomic(&path, &text))
}

/// The peers in the file now, read by the plugin's own rules (none when it is missing,
/// unsafe or invalid: then the agent's next write replaces it, and the plugin keeps its own
/// last good copy meanwhile).
pub fn current_peers(path: &Path) -> Option<Vec<Peer>> {
    peers::read_file(path).ok().map(|(peers, _)| peers)
}

/// A peers file's peers, read again only when the file's [`Fingerprint`] changed: the agent
/// compares with the file and with the plugin's last-good copy after every burst of events,
/// and at 100,000 peers each read is 50 ms of JSON.
#[derive(Debug, Default)]
pub struct PeersCache {
    fingerprint: Option<Fingerprint>,
    peers: Option<Vec<Peer>>,
    /// The content hash of the file the peers were read from ([`PeersCache::file`]).
    hash: Option<String>,
}

impl PeersCache {
    /// The peers at `path` as `read` reads them, from the cache while the file is unchanged.
    pub fn get(
        &mut self,
        path: &Path,
        read: impl FnOnce(&Path) -> Option<Vec<Peer>>,
    ) -> Option<&[Peer]> {
        let now = fingerprint(path);
        if now.is_none() || now != self.fingerprint {
            self.peers = read(path);
            self.hash = None;
            self.fingerprint = now;
        }
        self.peers.as_deref()
    }

    /// The peers file at `path` as [`current_peers`] reads it, with the hash of its content
    /// ([`sticky_overlay::stamp::hash`]), from the cache while the file is unchanged.
    pub fn file(&mut self, path: &Path) -> Option<(&[Peer], &str)> {
        let now = fingerprint(path);
        if now.is_none() || now != self.fingerprint || self.hash.is_none() {
            let read = peers::read_file(path).ok();
            self.hash = read
                .as_ref()
                .map(|(_, text)| sticky_overlay::stamp::hash(text));
            self.peers = read.map(|(peers, _)| peers);
            self.fingerprint = now;
        }
        Some((self.peers.as_deref()?, self.hash.as_deref()?))
    }

    /// The file at `path` was just written with `peers`, whose text hashes to `hash`: kept as
    /// read, so the write costs no read.
    pub fn written(&mut self, path: &Path, peers: Vec<Peer>, hash: String) {
        self.fingerprint = fingerprint(path);
        self.peers = Some(peers);
        self.hash = Some(hash);
    }
}

/// What identifies one version of a file without reading it: a hand edit changes one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

pub fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        ino: m.ino(),
        size: m.size(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// What a writer killed between creating its temp file and renaming it leaves is what the
    /// next start removes; anything else beside the file stays.
    #[test]
    fn the_temp_files_write_atomic_makes_are_the_ones_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        write_atomic(&path, b"[]\n").unwrap();
        // The temp file replace_through makes for write_atomic, left as a kill would leave it.
        let (_, left) = nofollow::create_temp(dir.path(), &temp_prefix(&path), 0o644).unwrap();
        let other = dir.path().join(".peers.json.rpmsave");
        let plain = dir.path().join(format!(".peers.json.{:016x}", 7));
        for p in [&other, &plain] {
            std::fs::write(p, "keep").unwrap();
        }
        remove_stale_temps(&path);
        assert!(!left.exists());
        assert!(other.exists() && plain.exists() && path.exists());
    }

    #[test]
    fn written_whole_with_mode_0644_replacing_a_planted_link_never_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_atomic(&path, b"[]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"[]\n");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temp file left");
        let before = fingerprint(&path).unwrap();
        write_atomic(&path, b"[ ]\n").unwrap();
        assert_ne!(fingerprint(&path).unwrap(), before);
    }

    /// The agent's `stateDir` is created as the plugin creates it (0700), and a link planted at
    /// its name is refused: no status file is written where it points.
    #[test]
    fn the_status_dir_is_created_0700_and_a_link_planted_there_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let status = Status {
            network: "sticky".into(),
            ..Status::default()
        };
        let fresh = tmp.path().join("run").join("sticky-vxlan");
        write_status(&fresh, &status).unwrap();
        let meta = std::fs::symlink_metadata(&fresh).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
        assert!(status_path(&fresh, "sticky").is_file());

        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = tmp.path().join("state-link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = write_status(&link, &status).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let written: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
        assert!(written.is_empty(), "{written:?}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }
}
