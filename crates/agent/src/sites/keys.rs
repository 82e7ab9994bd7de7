//! The gateway's key file: its WireGuard private key, made once and kept (a key that changes
//! at every start is what breaks Raven's and flannel's tunnels after an offline restart, issue
//! 28, "Keys that outlive everything"). The key lives in one file under a directory the caller
//! names (`--key-dir`, `/var/lib/sticky-cni/wireguard` on a node), in `wg genkey`'s format
//! ([`PrivateKey::to_file_text`]). The key types are `sticky_sites::keys`'; the files are here,
//! so the decision crate does no I/O.
//!
//! The file is never silently replaced: one that is a symlink, not a regular file, not mode
//! 0600, not owned by the expected user or not exactly one base64 key is refused with an
//! error naming it. It is opened without following links and checked on what was opened
//! ([`nofollow::open`], then `fstat`), so a link swapped in between a check and the read is
//! never followed. A new file is written crash-safe ([`nofollow::replace_through`]: a temp
//! file created new under an unguessable name, mode 0600, fsynced, renamed into place, the
//! directory fsynced); a link planted at the name is replaced, never written through.

use std::fs::{self, DirBuilder, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use sticky_primitives::nofollow::{self, Durability};
use sticky_sites::keys::{BASE64_LEN, PrivateKey, PublicKey};
use zeroize::Zeroizing;

/// The most a key file holds: one base64 key and a newline.
const FILE_LEN: usize = BASE64_LEN + 1;

/// Errors of the key files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("key file {path}: {what}; refusing to use or replace it (fix or remove it by hand)")]
    BadFile { path: PathBuf, what: String },
    #[error("key directory {path}: {what}")]
    BadDir { path: PathBuf, what: String },
    #[error("key file name {name:?} is not a plain file name")]
    BadName { name: String },
    #[error(
        "{path} exists: a rotation is not finished (publish the new public key, then forget the previous one)"
    )]
    RotationPending { path: PathBuf },
    #[error("no key file {path} to rotate")]
    NothingToRotate { path: PathBuf },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    Key(#[from] sticky_sites::keys::Error),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// The directory that holds key files, and the user that must own them.
#[derive(Debug, Clone)]
pub struct KeyDir {
    dir: PathBuf,
    owner: u32,
}

/// What a rotation did: the new key (to apply and publish) and the public key it replaced.
#[derive(Debug)]
pub struct Rotated {
    /// The new private key, now in `<name>`.
    pub new: PrivateKey,
    /// The public key of the old one, now in `<name>.previous`.
    pub previous: PublicKey,
}

impl KeyDir {
    /// Keys under `dir`, owned by uid `owner` (0 on a node: the agent runs as root).
    pub fn new(dir: impl Into<PathBuf>, owner: u32) -> Self {
        Self {
            dir: dir.into(),
            owner,
        }
    }

    fn path(&self, name: &str) -> Result<PathBuf, Error> {
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.starts_with('.');
        if !plain {
            return Err(Error::BadName {
                name: name.to_string(),
            });
        }
        Ok(self.dir.join(name))
    }

    fn previous_path(&self, name: &str) -> Result<PathBuf, Error> {
        self.path(&format!("{name}.previous"))
    }

    /// The key in `<dir>/<name>`, made (and the directory, mode 0700) when there is none.
    pub fn load_or_create(&self, name: &str) -> Result<PrivateKey, Error> {
        let path = self.path(name)?;
        self.check_dir()?;
        if let Some(key) = self.load(&path)? {
            return Ok(key);
        }
        self.ensure_dir()?;
        remove_leftovers(&path)?;
        let key = PrivateKey::generate()?;
        write_new(&path, &key)?;
        Ok(key)
    }

    /// Replaces the key in `<name>` with a new one, the old kept in `<name>.previous` until
    /// [`KeyDir::forget_previous`]; refused while a `.previous` exists (or anything at its
    /// name, a link too).
    pub fn rotate(&self, name: &str) -> Result<Rotated, Error> {
        let path = self.path(name)?;
        let previous_path = self.previous_path(name)?;
        self.check_dir()?;
        if fs::symlink_metadata(&previous_path).is_ok() {
            return Err(Error::RotationPending {
                path: previous_path,
            });
        }
        let Some(old) = self.load(&path)? else {
            return Err(Error::NothingToRotate { path });
        };
        remove_leftovers(&previous_path)?;
        remove_leftovers(&path)?;
        // Old copied aside first: a crash between the steps leaves both files holding the
        // old key, never a lost key.
        write_new(&previous_path, &old)?;
        let new = PrivateKey::generate()?;
        write_new(&path, &new)?;
        Ok(Rotated {
            new,
            previous: old.public_key(),
        })
    }

    /// Deletes `<name>.previous` once the new public key is published; absent is fine.
    pub fn forget_previous(&self, name: &str) -> Result<(), Error> {
        let path = self.previous_path(name)?;
        self.check_dir()?;
        if self.load(&path)?.is_none() {
            return Ok(());
        }
        fs::remove_file(&path).map_err(io_err("remove", &path))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync directory", &self.dir))
    }

    /// An existing directory must be a real directory (not a link to one) of the owner that
    /// nobody else can write to (else another user could swap the key file); a missing one
    /// is made later.
    fn check_dir(&self) -> Result<(), Error> {
        let bad = |what: String| Error::BadDir {
            path: self.dir.clone(),
            what,
        };
        match nofollow::ensure_real_dir(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(refused(e, bad, "stat", &self.dir)),
        }
        let meta = fs::symlink_metadata(&self.dir).map_err(io_err("stat", &self.dir))?;
        if meta.uid() != self.owner {
            return Err(bad(format!(
                "is owned by uid {}, expected {}",
                meta.uid(),
                self.owner
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(bad(format!(
                "has mode {:04o}: group or others may write to it",
                meta.mode() & 0o7777
            )));
        }
        Ok(())
    }

    fn ensure_dir(&self) -> Result<(), Error> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io_err("create directory", &self.dir))?;
        self.check_dir()
    }

    /// The key in `path`, None when there is no file; every other oddity is an error. The
    /// checks are made on the file opened (never following a link), not on its name.
    fn load(&self, path: &Path) -> Result<Option<PrivateKey>, Error> {
        let bad = |what: String| Error::BadFile {
            path: path.to_path_buf(),
            what,
        };
        let file = match nofollow::open(path, OpenOptions::new().read(true)) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused(e, bad, "open", path)),
        };
        let meta = file.metadata().map_err(io_err("stat", path))?;
        self.check_file(&meta).map_err(bad)?;
        let mut text = Zeroizing::new(Vec::with_capacity(FILE_LEN + 1));
        nofollow::read_limited(&file, FILE_LEN as u64, &mut text)
            .map_err(|e| refused(e, bad, "read", path))?;
        let body = text.strip_suffix(b"\n").unwrap_or(&text);
        if body.len() != BASE64_LEN {
            return Err(bad(wrong_length(text.len())));
        }
        std::str::from_utf8(body)
            .ok()
            .and_then(PrivateKey::from_base64)
            .map(Some)
            .ok_or_else(|| bad("is not base64 of a 32-byte key".into()))
    }

    /// What is wrong with the key file `meta` describes (mode and owner), as the error says it.
    fn check_file(&self, meta: &Metadata) -> Result<(), String> {
        let mode = meta.mode() & 0o7777;
        if mode != 0o600 {
            return Err(format!("has mode {mode:04o}, expected 0600"));
        }
        if meta.uid() != self.owner {
            return Err(format!(
                "is owned by uid {}, expected {}",
                meta.uid(),
                self.owner
            ));
        }
        if meta.len() > FILE_LEN as u64 {
            return Err(wrong_length(meta.len()));
        }
        Ok(())
    }
}

fn wrong_length(len: impl std::fmt::Display) -> String {
    format!("holds {len} bytes, expected one base64 key ({BASE64_LEN} characters and a newline)")
}

/// A refusal of [`nofollow`] (a link, not a regular file, too large) as `bad` says it; any
/// other error as the I/O error of `op` on `path`.
fn refused(
    e: io::Error,
    bad: impl FnOnce(String) -> Error,
    op: &'static str,
    path: &Path,
) -> Error {
    if let Some(r) = nofollow::refusal(&e) {
        return bad(r.to_string());
    }
    if e.kind() == io::ErrorKind::FileTooLarge {
        return bad(wrong_length(format!("more than {FILE_LEN}")));
    }
    io_err(op, path)(e)
}

/// The temp files of a write of `path`: `.<name>.new.` and random hex digits.
fn temp_prefix(path: &Path) -> String {
    format!("{}new.", nofollow::temp_prefix(path))
}

/// Writes `key` to `path` crash-safe, replacing what is there (a link is replaced, never
/// followed), mode 0600, the file and the directory fsynced.
fn write_new(path: &Path, key: &PrivateKey) -> Result<(), Error> {
    let text = key.to_file_text();
    nofollow::replace_through(
        &temp_prefix(path),
        path,
        text.as_bytes(),
        0o600,
        Durability::Durable,
    )
    .map_err(io_err("write", path))
}

/// Removes the temp files a write of `path` killed half-way left (they may hold a private
/// key), and `.<name>.tmp`, the temp file of the versions before; a link is removed, never
/// followed.
fn remove_leftovers(path: &Path) -> Result<(), Error> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    let prefix = temp_prefix(path);
    let legacy = format!("{}tmp", nofollow::temp_prefix(path));
    let entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    for entry in entries {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) || name == legacy {
            fs::remove_file(entry.path()).map_err(io_err("remove", &entry.path()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
