//! The files the agent writes: the peers file (crash-safe, only when its peers change) and a
//! small status file `sticky-vxlan show` reads.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::nofollow;
use crate::vxlan::peers::{self, Peer};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `text` to `path` so that a reader sees either the old file or the new one, whole:
/// a temp file created new beside it under a name nobody can guess (`O_EXCL`, never through
/// anything planted), mode 0644, fsynced, renamed over `path` (a link planted at `path` is
/// replaced, not followed), then the directory fsynced.
pub fn write_atomic(path: &Path, text: &[u8]) -> Result<(), Error> {
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (mut file, tmp) =
        nofollow::create_temp(dir, &format!(".{name}.agent."), 0o644).map_err(err)?;
    let result = (|| {
        // The umask may have taken bits away; the mode must be exactly 0644.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.write_all(text)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// The peers in the file now, read by the plugin's own rules (none when it is missing,
/// unsafe or invalid: then the agent's next write replaces it, and the plugin keeps its own
/// last good copy meanwhile).
pub fn current_peers(path: &Path) -> Option<Vec<Peer>> {
    peers::read_file(path).ok().map(|(peers, _)| peers)
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
}
