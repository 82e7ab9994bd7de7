//! Opening the files sticky-cni creates or rewrites without following links.
//!
//! The data dir, the metrics directory and `stateDir` are written by root. Someone who can
//! write there too (a careless operator, a compromised container with a host mount) can plant a
//! symbolic link at a name the plugin is about to write, or a FIFO that blocks a read forever.
//! Every open here uses `O_NOFOLLOW` (a link at the last component is `ELOOP`, never followed)
//! and `O_NONBLOCK` (a FIFO cannot block), and checks that what it opened is a regular file.
//! Temp files are created `O_EXCL` under a name nobody can guess, so no link can wait there.
//!
//! What the callers do with a refusal: a record that is not a regular file is *held* (never
//! handed out, never removed); a bookkeeping file or the lock is an I/O error naming the path.

use std::fs::{File, Metadata, OpenOptions};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a path was refused, as the `io::Error` it travels in.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("is a symbolic link (never followed: sticky-cni did not make it)")]
    Link,
    #[error("is a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("has {0} hard links (a file rewritten in place must be this directory's alone)")]
    HardLinked(u64),
}

impl From<Refused> for io::Error {
    fn from(r: Refused) -> io::Error {
        io::Error::new(ErrorKind::InvalidData, r)
    }
}

/// The refusal inside an error from this module, if that is what it is.
pub fn refusal(err: &io::Error) -> Option<&Refused> {
    err.get_ref().and_then(|e| e.downcast_ref::<Refused>())
}

fn flags() -> i32 {
    nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC
}

/// `ELOOP` from an `O_NOFOLLOW` open is a link at the last component, `ENXIO` from an
/// `O_NONBLOCK` one a FIFO without a reader: both become a [`Refused`] (for an `openat` made
/// elsewhere with the same flags, too).
pub fn explain(err: io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(nix::libc::ELOOP) => Refused::Link.into(),
        Some(nix::libc::ENXIO) => Refused::NotRegular("FIFO or socket").into(),
        _ => err,
    }
}

fn kind_name(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// Opens with `options` plus `O_NOFOLLOW | O_NONBLOCK`, and only a regular file; with the
/// metadata that check read, so a caller needs no second fstat.
fn open_regular(path: &Path, options: &mut OpenOptions) -> io::Result<(File, Metadata)> {
    let file = options.custom_flags(flags()).open(path).map_err(explain)?;
    let meta = file.metadata()?;
    let t = meta.file_type();
    if t.is_file() {
        Ok((file, meta))
    } else {
        Err(Refused::NotRegular(kind_name(t)).into())
    }
}

/// Opens with `options` plus `O_NOFOLLOW | O_NONBLOCK`, and only a regular file.
pub fn open(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    open_regular(path, options).map(|(file, _)| file)
}

/// As [`open`], for writing in place: a file with another hard link is refused, since
/// writing in place would write the other name's file too. Returns the file's metadata.
pub fn open_single_link(path: &Path, options: &mut OpenOptions) -> io::Result<(File, Metadata)> {
    let (file, meta) = open_regular(path, options)?;
    only_link(file, meta)
}

/// The check [`open_single_link`] makes, for a file opened otherwise (an `openat` in a
/// directory held open, with `O_NOFOLLOW | O_NONBLOCK`): only a regular file with no other
/// hard link may be written in place.
pub fn single_link(file: File) -> io::Result<(File, Metadata)> {
    let meta = file.metadata()?;
    let t = meta.file_type();
    if !t.is_file() {
        return Err(Refused::NotRegular(kind_name(t)).into());
    }
    only_link(file, meta)
}

fn only_link(file: File, meta: Metadata) -> io::Result<(File, Metadata)> {
    match meta.nlink() {
        1 => Ok((file, meta)),
        n => Err(Refused::HardLinked(n).into()),
    }
}

/// The whole content of a regular file; `None` when it does not exist.
pub fn read(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match open(path, OpenOptions::new().read(true)) {
        Ok(mut file) => {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(Some(bytes))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// As [`read`], at most `max` bytes (more is an error of kind `FileTooLarge`): for a file in
/// a directory others could write to, which could have been made to fill the memory.
pub fn read_bounded(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    match open(path, OpenOptions::new().read(true)) {
        Ok(file) => {
            let mut bytes = Vec::new();
            read_limited(file, max, &mut bytes)?;
            Ok(Some(bytes))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads `file` to its end into `into`, at most `max` bytes (more is an error of kind
/// `FileTooLarge`); for a file opened here first, whose metadata the caller checks.
pub fn read_limited(file: impl Read, max: u64, into: &mut Vec<u8>) -> io::Result<()> {
    let start = into.len();
    file.take(max + 1).read_to_end(into)?;
    if (into.len() - start) as u64 > max {
        return Err(io::Error::new(
            ErrorKind::FileTooLarge,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(())
}

/// Opens (creating with `mode` if absent) a regular file for writing in place, never
/// truncating it first. A file with another hard link is refused: writing in place would
/// write the other name's file too.
pub fn open_for_rewrite(path: &Path, mode: u32) -> io::Result<File> {
    open_single_link(
        path,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode),
    )
    .map(|(file, _)| file)
}

/// Fails when `path` exists and is anything but a regular file (a link that a rename would
/// replace, a directory, a FIFO): what the caller is about to replace must be its own.
pub fn ensure_replaceable(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(Refused::Link.into()),
        Ok(m) if !m.file_type().is_file() => {
            Err(Refused::NotRegular(kind_name(m.file_type())).into())
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Fails unless `dir` is a directory itself, not a link to one.
pub fn ensure_real_dir(dir: &Path) -> io::Result<()> {
    let t = std::fs::symlink_metadata(dir)?.file_type();
    if t.is_symlink() {
        Err(Refused::Link.into())
    } else if !t.is_dir() {
        Err(Refused::NotRegular(kind_name(t)).into())
    } else {
        Ok(())
    }
}

/// 64 bits nobody can predict: std's `RandomState` keys come from the OS's random source.
pub fn unpredictable() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// Creates a new temp file `<dir>/<prefix><random>` (`O_EXCL`, mode `mode`): no link or file
/// can be waiting at a name that did not exist a moment ago and cannot be guessed.
pub fn create_temp(dir: &Path, prefix: &str, mode: u32) -> io::Result<(File, PathBuf)> {
    let mut last = None;
    for _ in 0..4 {
        let path = dir.join(format!("{prefix}{:016x}", unpredictable()));
        match open(
            &path,
            OpenOptions::new().write(true).create_new(true).mode(mode),
        ) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(ErrorKind::AlreadyExists)))
}

/// A small file read whole, such as a config, a CA or a token: links followed (ConfigMap and
/// Secret volumes present their files through links), opened without blocking so a FIFO or a
/// device is refused rather than read forever, a regular file only, and at most `max` bytes
/// (more is an error of kind `FileTooLarge`).
pub fn read_regular(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    read_limited(file, max, &mut bytes)?;
    Ok(bytes)
}

/// How far a [`replace`] must go before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Whole or not at all for every reader, but may be lost in a power cut: a cache that is
    /// rebuilt when missing.
    Cache,
    /// The new content is on disk before the rename; the rename itself is on disk only once
    /// the caller fsyncs the directory, which it must do before it reports success. For a
    /// store that makes several replaces (and unlinks) in one directory per command and syncs
    /// the directory once for all of them.
    FileSynced,
    /// Also on disk before it returns (file and directory fsynced): state that must survive a
    /// power cut.
    Durable,
}

/// The temp files of a [`replace`] of `path` are named this plus 16 random hex digits
/// (`.<name>.`): hidden, and never ending as a reader's glob (`*.prom`, `*.json`) does.
pub fn temp_prefix(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    format!(".{name}.")
}

/// Replaces `path` with `bytes` so that a reader sees the old file or the new one, whole: a
/// temp file [`temp_prefix`]`<random>` created new beside it ([`create_temp`], never through
/// anything planted), mode exactly `mode`, renamed over `path` (a link planted at `path` is
/// replaced, not followed). A failed replace leaves no temp file; a killed one may leave it,
/// for the caller's next start or listing to remove.
pub fn replace(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> io::Result<()> {
    replace_through(&temp_prefix(path), path, bytes, mode, durability)
}

/// As [`replace`], the temp file named `<temp_prefix><random>` instead: for a directory whose
/// leftovers are recognised by a prefix of their own (the IPAM data dir's `.tmp.`).
pub fn replace_through(
    temp_prefix: &str,
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    if path.file_name().is_none() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "names no file to replace",
        ));
    }
    let dir = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    };
    let (mut file, tmp) = create_temp(dir, temp_prefix, mode)?;
    let synced = durability != Durability::Cache;
    let result = (|| {
        // The umask may have taken bits away; the mode must be exactly `mode`.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        crate::crash::point("temp file written");
        if synced {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durability == Durability::Durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn replace_swaps_the_whole_file_and_never_writes_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let path = tmp.path().join("state");
        symlink(&victim, &path).unwrap();
        for d in [Durability::Cache, Durability::Durable] {
            replace(&path, b"new", 0o640, d).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"new");
            assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o640);
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temp file left");
        // Into a directory that does not exist: an error, nothing made.
        assert!(replace(&tmp.path().join("no/such"), b"x", 0o600, Durability::Cache).is_err());
    }

    #[test]
    fn a_failed_replace_leaves_no_temp_file_and_a_path_naming_no_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.prom");
        assert_eq!(temp_prefix(&path), ".m.prom.");
        // A replace that fails after its temp file was made (the target is a directory, which
        // a rename of a file cannot replace) leaves no temp file, whatever its durability.
        std::fs::create_dir(&path).unwrap();
        for d in [
            Durability::Cache,
            Durability::FileSynced,
            Durability::Durable,
        ] {
            assert!(replace_through(".tmp.", &path, b"x", 0o644, d).is_err());
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        let other = tmp.path().join("record");
        replace_through(".tmp.", &other, b"x", 0o644, Durability::FileSynced).unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"x");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2);
        // A path naming no file is refused before anything is made.
        let e = replace(&tmp.path().join(".."), b"x", 0o644, Durability::Cache).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2);
    }

    #[test]
    fn links_and_fifos_are_refused_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = tmp.path().join("link");
        symlink(&victim, &link).unwrap();
        let dangling = tmp.path().join("dangling");
        symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        for path in [&link, &dangling] {
            let e = open_for_rewrite(path, 0o644).unwrap_err();
            assert!(matches!(refusal(&e), Some(Refused::Link)), "{e}");
            assert!(matches!(
                refusal(&read(path).unwrap_err()),
                Some(Refused::Link)
            ));
            assert!(ensure_replaceable(path).is_err());
        }
        assert!(!tmp.path().join("nowhere").exists());
        let hard = tmp.path().join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        let e = open_for_rewrite(&hard, 0o644).unwrap_err();
        assert!(matches!(refusal(&e), Some(Refused::HardLinked(2))), "{e}");
        let e = single_link(File::open(&hard).unwrap()).unwrap_err();
        assert!(matches!(refusal(&e), Some(Refused::HardLinked(2))), "{e}");
        let e = single_link(File::open(tmp.path()).unwrap()).unwrap_err();
        assert!(matches!(refusal(&e), Some(Refused::NotRegular(_))), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read(&fifo).unwrap_err();
        assert!(
            matches!(refusal(&e), Some(Refused::NotRegular("FIFO"))),
            "{e}"
        );
        assert!(open_for_rewrite(&fifo, 0o644).is_err());
        assert!(ensure_real_dir(&link).is_err());
        assert!(ensure_real_dir(tmp.path()).is_ok());
        assert_eq!(read(&tmp.path().join("absent")).unwrap(), None);
    }

    #[test]
    fn a_bounded_read_refuses_links_and_files_over_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"four").unwrap();
        let link = tmp.path().join("link");
        symlink(&victim, &link).unwrap();
        let e = read_bounded(&link, 100).unwrap_err();
        assert!(matches!(refusal(&e), Some(Refused::Link)), "{e}");
        assert_eq!(read_bounded(&victim, 4).unwrap(), Some(b"four".to_vec()));
        let e = read_bounded(&victim, 3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FileTooLarge);
        assert_eq!(read_bounded(&tmp.path().join("absent"), 3).unwrap(), None);
    }

    #[test]
    fn temp_names_are_new_and_unpredictable() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, a) = create_temp(tmp.path(), ".t.", 0o600).unwrap();
        let (_, b) = create_temp(tmp.path(), ".t.", 0o600).unwrap();
        assert_ne!(a, b);
        assert_ne!(unpredictable(), unpredictable());
    }
}
