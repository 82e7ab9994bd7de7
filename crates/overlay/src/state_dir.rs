//! `stateDir`: the directory and the per-network lock (the last valid peers file kept there is
//! [`super::peers`]' own: `keep_last_good`, `last_good`).
//!
//! Security model: the directory is root's (created 0700 when missing). Nothing here is ever
//! written through a link someone planted: the lock is opened `O_NOFOLLOW` (a link at its
//! name is an error, never followed to create or truncate its target), the copy is written to
//! a temp file created `O_EXCL | O_NOFOLLOW` under an unpredictable name and renamed over the
//! copy (a rename replaces a link, it never writes through it), and the copy is read
//! `O_NOFOLLOW`. The network name in every path is checked by the config (the CNI name
//! pattern: no `/`, no `..`).

use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use sticky_primitives::nofollow;

#[derive(Debug, thiserror::Error)]
#[error("lock {path}: {source}")]
pub struct LockError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Holds the per-network lock that serializes node reconciliation (parallel ADDs all
/// reconcile, one at a time). Released when dropped.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// Creates `dir` (0700) if missing; it must be a directory itself, not a link to one. The
/// one way a `stateDir` is made, by the plugin and the node agent alike.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    nofollow::ensure_real_dir(dir)
}

/// Takes the lock file `path` in `state_dir` (created 0700 when missing, never through a
/// link), waiting for it: the one way a network's state is locked, whatever its mode (the
/// segment mode has a lock file of its own name).
pub fn lock_at(state_dir: &Path, path: &Path) -> Result<Lock, LockError> {
    let err = |source| LockError {
        path: path.to_path_buf(),
        source,
    };
    create_dir(state_dir).map_err(err)?;
    let file = nofollow::open_for_rewrite(path, 0o600).map_err(err)?;
    file.lock().map_err(err)?;
    Ok(Lock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::{keep_last_good, last_good};

    #[test]
    fn keeping_the_copy_never_writes_through_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("net.peers.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        // A link at the copy itself is replaced, never written through.
        std::os::unix::fs::symlink(&victim, &copy).unwrap();
        keep_last_good(&copy, b"[]");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read(&copy).unwrap(), b"[]");
        assert!(!std::fs::symlink_metadata(&copy).unwrap().is_symlink());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&nofollow::temp_prefix(&copy)))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_link_at_the_copy_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("elsewhere.json");
        std::fs::write(
            &real,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]}]"#,
        )
        .unwrap();
        let copy = dir.path().join("net.peers.json");
        std::os::unix::fs::symlink(&real, &copy).unwrap();
        assert!(last_good(&copy).is_empty());
    }
}
