//! Doing work inside another network namespace without ever leaving the caller in it.
//!
//! Work for a namespace runs on a dedicated thread that enters it with `setns(2)` and ends
//! when the work is done: a thread's namespace dies with the thread, so a failure half way
//! (or a panic) can never leave the main thread in the wrong namespace.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{CloneFlags, setns};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entering network namespace {path}: {errno}")]
    Enter { path: PathBuf, errno: Errno },
    #[error("the thread working in network namespace {path} panicked")]
    Panicked { path: PathBuf },
}

/// Opens a namespace file (`/var/run/netns/x`, `/proc/<pid>/ns/net`).
pub fn open(path: &Path) -> Result<File, Error> {
    File::open(path).map_err(|source| Error::Open {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs `work` on a fresh thread inside the namespace at `path` and returns its result.
pub fn run_in<T, F>(path: &Path, work: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let ns = open(path)?;
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || -> Result<T, Errno> {
            // Only this thread changes namespace; it ends right after `work`.
            setns(&ns, CloneFlags::CLONE_NEWNET)?;
            Ok(work())
        });
        match handle.join() {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(errno)) => Err(Error::Enter {
                path: path.to_path_buf(),
                errno,
            }),
            Err(_) => Err(Error::Panicked {
                path: path.to_path_buf(),
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_gone() {
        let err = run_in(Path::new("/nonexistent/netns"), || ()).unwrap_err();
        assert!(
            matches!(&err, Error::Open { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_namespace_cannot_be_entered() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = run_in(file.path(), || ()).unwrap_err();
        // EINVAL for a regular file; EPERM when the tests run without privileges.
        assert!(matches!(err, Error::Enter { .. }), "{err}");
    }
}
