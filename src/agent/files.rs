//! The files the agent writes: the peers file (crash-safe, only when its peers change) and a
//! small status file `sticky-vxlan show` reads.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
/// a temp file created new (`O_EXCL`, never through anything planted at its name), mode 0644,
/// fsynced, renamed over `path`, then the directory fsynced.
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
    let tmp = dir.join(format!(".{name}.agent-{}.tmp", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
        _ => {}
    }
    let result = (|| {
        let mut f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        // The umask may have taken bits away; the mode must be exactly 0644.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        f.write_all(text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// The peers in the file now (none when it is missing or invalid: then anything may replace
/// it, as the plugin keeps its own last good copy).
pub fn current_peers(path: &Path) -> Option<Vec<Peer>> {
    std::fs::read(path)
        .ok()
        .and_then(|t| peers::parse_file(&t).ok())
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

    #[test]
    fn written_whole_with_mode_0644_never_through_a_planted_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let tmp = dir
            .path()
            .join(format!(".peers.json.agent-{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        write_atomic(&path, b"[]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"[]\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        assert!(!tmp.exists());
        let before = fingerprint(&path).unwrap();
        write_atomic(&path, b"[ ]\n").unwrap();
        assert_ne!(fingerprint(&path).unwrap(), before);
    }
}
