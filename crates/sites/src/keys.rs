//! A gateway's WireGuard key pair, made once and kept: a key that changes at every start is
//! what breaks Raven's and flannel's tunnels after an offline restart (issue 28, "Keys that
//! outlive everything"). The private key lives in one file under a directory the caller names
//! (`/var/lib/sticky-cni/` on a node), in `wg genkey`'s format (base64 of 32 bytes and a
//! newline) so `wg set IF private-key FILE` reads it too.
//!
//! The file is never silently replaced: one that is a symlink, not a regular file, not mode
//! 0600, not owned by the expected user or not exactly one base64 key is refused with an
//! error naming it. A new file is written crash-safe (temp file created 0600 with O_EXCL,
//! written, fsynced, renamed into place, directory fsynced). The private key never appears in
//! `Debug` output (there is no `Display`) and is zeroed when dropped.

use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

/// Length of a key in `wg genkey`'s base64 (32 bytes, padded).
const BASE64_LEN: usize = 44;

/// Errors of the key file and key parsing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("key {value:?} is not base64 of 32 bytes (like `wg pubkey` prints)")]
    NotAKey { value: String },
    #[error("key {value:?} is all zeros: not a usable WireGuard key")]
    ZeroKey { value: String },
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
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// A WireGuard public key (Curve25519, 32 bytes). Shown as base64, as `wg` shows it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// Parses base64 of 32 bytes (surrounding white space ignored); the all-zero key is refused.
    pub fn from_base64(text: &str) -> Result<Self, Error> {
        let bytes = decode_key(text.trim()).ok_or_else(|| Error::NotAKey {
            value: text.to_string(),
        })?;
        if bytes.iter().all(|b| *b == 0) {
            return Err(Error::ZeroKey {
                value: text.to_string(),
            });
        }
        Ok(Self(*bytes))
    }

    /// Base64, as published in the Node annotation.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

fn decode_key(text: &str) -> Option<Zeroizing<[u8; 32]>> {
    if text.len() != BASE64_LEN {
        return None;
    }
    let bytes = Zeroizing::new(STANDARD.decode(text).ok()?);
    let mut key = Zeroizing::new([0u8; 32]);
    if bytes.len() != 32 {
        return None;
    }
    key.copy_from_slice(&bytes);
    Some(key)
}

/// A WireGuard private key: redacted in `Debug`, zeroed on drop, no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey(Zeroizing<[u8; 32]>);

impl PrivateKey {
    /// A new key from the operating system's randomness (clamped as Curve25519 wants).
    pub fn generate() -> Result<Self, Error> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut *bytes).map_err(|e| Error::Random(e.to_string()))?;
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        Ok(Self(bytes))
    }

    /// A key from its 32 bytes (as read back from a device).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The raw bytes, for the one place that sends them to the tunnel.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public key to publish.
    pub fn public_key(&self) -> PublicKey {
        let secret = x25519_dalek::StaticSecret::from(*self.0);
        PublicKey(*x25519_dalek::PublicKey::from(&secret).as_bytes())
    }

    fn to_file_text(&self) -> Zeroizing<String> {
        let mut text = Zeroizing::new(STANDARD.encode(*self.0));
        text.push('\n');
        text
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
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
        let key = PrivateKey::generate()?;
        self.write_new(&path, &key)?;
        Ok(key)
    }

    /// Replaces the key in `<name>` with a new one, the old kept in `<name>.previous` until
    /// [`KeyDir::forget_previous`]; refused while a `.previous` exists.
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
        // Old copied aside first: a crash between the steps leaves both files holding the
        // old key, never a lost key.
        self.write_new(&previous_path, &old)?;
        let new = PrivateKey::generate()?;
        self.write_new(&path, &new)?;
        Ok(Rotated {
            new,
            previous: old.public_key(),
        })
    }

    /// The previous key kept by a rotation, if any (checked as the key file is).
    pub fn previous(&self, name: &str) -> Result<Option<PrivateKey>, Error> {
        self.check_dir()?;
        self.load(&self.previous_path(name)?)
    }

    /// Deletes `<name>.previous` once the new public key is published; absent is fine.
    pub fn forget_previous(&self, name: &str) -> Result<(), Error> {
        let path = self.previous_path(name)?;
        self.check_dir()?;
        if self.load(&path)?.is_none() {
            return Ok(());
        }
        fs::remove_file(&path).map_err(io_err("remove", &path))?;
        sync_dir(&self.dir)
    }

    /// An existing directory must be a real directory of the owner that nobody else can
    /// write to (else another user could swap the key file); a missing one is made later.
    fn check_dir(&self) -> Result<(), Error> {
        let meta = match fs::symlink_metadata(&self.dir) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("stat", &self.dir)(e)),
        };
        let bad = |what: String| Error::BadDir {
            path: self.dir.clone(),
            what,
        };
        if !meta.is_dir() {
            return Err(bad("is not a directory (or is a symlink)".into()));
        }
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
        let meta = fs::symlink_metadata(&self.dir).map_err(io_err("stat", &self.dir))?;
        if !meta.is_dir() {
            return Err(Error::BadDir {
                path: self.dir.clone(),
                what: "is not a directory".into(),
            });
        }
        Ok(())
    }

    /// The key in `path`, None when there is no file; every other oddity is an error.
    fn load(&self, path: &Path) -> Result<Option<PrivateKey>, Error> {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("stat", path)(e)),
        };
        let bad = |what: String| Error::BadFile {
            path: path.to_path_buf(),
            what,
        };
        if meta.file_type().is_symlink() {
            return Err(bad("is a symlink".into()));
        }
        if !meta.is_file() {
            return Err(bad("is not a regular file".into()));
        }
        let mode = meta.mode() & 0o7777;
        if mode != 0o600 {
            return Err(bad(format!("has mode {mode:04o}, expected 0600")));
        }
        if meta.uid() != self.owner {
            return Err(bad(format!(
                "is owned by uid {}, expected {}",
                meta.uid(),
                self.owner
            )));
        }
        let text = Zeroizing::new(fs::read(path).map_err(io_err("read", path))?);
        let body = text.strip_suffix(b"\n").unwrap_or(&text);
        if body.len() != BASE64_LEN {
            return Err(bad(format!(
                "holds {} bytes, expected one base64 key ({BASE64_LEN} characters and a newline)",
                text.len()
            )));
        }
        let key = std::str::from_utf8(body)
            .ok()
            .and_then(decode_key)
            .ok_or_else(|| bad("is not base64 of a 32-byte key".into()))?;
        Ok(Some(PrivateKey(key)))
    }

    /// Writes `key` to `path` crash-safe, replacing what is there.
    fn write_new(&self, path: &Path, key: &PrivateKey) -> Result<(), Error> {
        let tmp = path.with_file_name(format!(
            ".{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("key")
        ));
        // A temp file left by a crash is ours and never the key itself.
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &tmp)(e)),
        }
        let mut file: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        file.write_all(key.to_file_text().as_bytes())
            .map_err(io_err("write", &tmp))?;
        file.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(file);
        fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
        sync_dir(&self.dir)
    }
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn dir() -> (tempfile::TempDir, KeyDir) {
        let t = tempfile::tempdir().unwrap();
        let uid = fs::metadata(t.path()).unwrap().uid();
        let k = KeyDir::new(t.path().join("keys"), uid);
        (t, k)
    }

    #[test]
    fn public_key_parse_table() {
        let good = STANDARD.encode([7u8; 32]);
        let zero = STANDARD.encode([0u8; 32]);
        let short = STANDARD.encode([7u8; 31]);
        let cases: &[(&str, bool)] = &[
            (&good, true),
            (&format!(" {good}\n"), true),
            (&zero, false),
            (&short, false),
            ("not base64 at all, not base64 at all, xxxxx", false),
            ("", false),
        ];
        for (text, ok) in cases {
            assert_eq!(PublicKey::from_base64(text).is_ok(), *ok, "{text:?}");
        }
        assert!(matches!(
            PublicKey::from_base64(&zero),
            Err(Error::ZeroKey { .. })
        ));
    }

    #[test]
    fn public_key_matches_rfc7748_vector() {
        // RFC 7748 section 6.1: Alice's private and public key.
        let private: [u8; 32] =
            hex32("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(
            PrivateKey::from_bytes(private).public_key(),
            PublicKey(public)
        );
    }

    fn hex32(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    #[test]
    fn private_key_is_redacted_in_debug() {
        let k = PrivateKey::from_bytes([0xab; 32]);
        let shown = format!("{k:?}");
        assert_eq!(shown, "PrivateKey(<redacted>)");
        assert!(!shown.contains(&STANDARD.encode([0xab; 32])));
        let r = Rotated {
            new: k.clone(),
            previous: k.public_key(),
        };
        assert!(!format!("{r:?}").contains(&STANDARD.encode([0xab; 32])));
    }

    #[test]
    fn created_once_then_kept() {
        let (_t, k) = dir();
        let a = k.load_or_create("wg0.key").unwrap();
        let path = k.dir.join("wg0.key");
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(fs::metadata(&k.dir).unwrap().mode() & 0o777, 0o700);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 45);
        assert!(text.ends_with('\n'));
        let b = k.load_or_create("wg0.key").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.public_key(), b.public_key());
        // No temp file left behind.
        let names: Vec<_> = fs::read_dir(&k.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("wg0.key")]);
    }

    #[test]
    fn stale_temp_file_is_replaced() {
        let (_t, k) = dir();
        fs::create_dir_all(&k.dir).unwrap();
        fs::write(k.dir.join(".wg0.key.tmp"), "half").unwrap();
        let a = k.load_or_create("wg0.key").unwrap();
        assert_eq!(k.load_or_create("wg0.key").unwrap(), a);
        assert!(!k.dir.join(".wg0.key.tmp").exists());
    }

    #[test]
    fn bad_files_are_refused_and_kept() {
        let (t, k) = dir();
        fs::create_dir_all(&k.dir).unwrap();
        let path = k.dir.join("wg0.key");
        let good = format!("{}\n", STANDARD.encode([9u8; 32]));
        type Setup = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Setup, &str)> = vec![
            (
                "mode 0644",
                Box::new({
                    let g = good.clone();
                    move |p: &Path| {
                        fs::write(p, &g).unwrap();
                        fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
                    }
                }),
                "mode 0644",
            ),
            (
                "a directory",
                Box::new(|p: &Path| fs::create_dir(p).unwrap()),
                "not a regular file",
            ),
            (
                "a symlink",
                Box::new({
                    let target = t.path().join("elsewhere");
                    let g = good.clone();
                    move |p: &Path| {
                        fs::write(&target, &g).unwrap();
                        fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
                        symlink(&target, p).unwrap();
                    }
                }),
                "symlink",
            ),
            (
                "short",
                Box::new(|p: &Path| {
                    fs::write(p, "abc\n").unwrap();
                    fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
                }),
                "holds 4 bytes",
            ),
            (
                "not base64",
                Box::new(|p: &Path| {
                    fs::write(p, format!("{}\n", "!".repeat(44))).unwrap();
                    fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
                }),
                "not base64",
            ),
        ];
        for (name, setup, expect) in cases {
            let _ = fs::remove_file(&path);
            let _ = fs::remove_dir(&path);
            setup(&path);
            let before = fs::symlink_metadata(&path).unwrap();
            let err = k.load_or_create("wg0.key").unwrap_err();
            assert!(matches!(err, Error::BadFile { .. }), "{name}: {err}");
            assert!(err.to_string().contains(expect), "{name}: {err}");
            assert!(err.to_string().contains("wg0.key"), "{name}: {err}");
            let after = fs::symlink_metadata(&path).unwrap();
            assert_eq!(before.ino(), after.ino(), "{name}: file replaced");
        }
    }

    #[test]
    fn unsafe_directory_is_refused() {
        let (t, k) = dir();
        fs::create_dir(&k.dir).unwrap();
        fs::set_permissions(&k.dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = k.load_or_create("wg0.key").unwrap_err();
        assert!(
            matches!(err, Error::BadDir { .. }) && err.to_string().contains("0777"),
            "{err}"
        );
        assert!(!k.dir.join("wg0.key").exists());
        fs::remove_dir(&k.dir).unwrap();
        let real = t.path().join("real");
        fs::create_dir(&real).unwrap();
        symlink(&real, &k.dir).unwrap();
        let err = k.load_or_create("wg0.key").unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        let other = KeyDir::new(real, k.owner + 1);
        assert!(
            other
                .load_or_create("wg0.key")
                .unwrap_err()
                .to_string()
                .contains("owned by uid")
        );
    }

    #[test]
    fn wrong_owner_is_refused() {
        let (_t, k) = dir();
        k.load_or_create("wg0.key").unwrap();
        let path = k.dir.join("wg0.key");
        // Giving the file away needs root (the suite runs as root); as another user the
        // directory-owner case in `unsafe_directory_is_refused` covers the rule.
        if std::os::unix::fs::chown(&path, Some(k.owner + 1), None).is_err() {
            return;
        }
        let err = k.load_or_create("wg0.key").unwrap_err();
        assert!(matches!(err, Error::BadFile { .. }), "{err}");
        assert!(err.to_string().contains("owned by uid"), "{err}");
    }

    #[test]
    fn names_must_be_plain() {
        let (_t, k) = dir();
        for name in ["", ".", "..", "a/b", ".hidden"] {
            assert!(
                matches!(k.load_or_create(name), Err(Error::BadName { .. })),
                "{name:?}"
            );
        }
    }

    #[test]
    fn rotation_keeps_previous_until_forgotten() {
        let (_t, k) = dir();
        assert!(matches!(
            k.rotate("wg0.key"),
            Err(Error::NothingToRotate { .. })
        ));
        let old = k.load_or_create("wg0.key").unwrap();
        let r = k.rotate("wg0.key").unwrap();
        assert_eq!(r.previous, old.public_key());
        assert_ne!(r.new, old);
        assert_eq!(k.load_or_create("wg0.key").unwrap(), r.new);
        assert_eq!(k.previous("wg0.key").unwrap(), Some(old));
        let meta = fs::symlink_metadata(k.dir.join("wg0.key.previous")).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert!(matches!(
            k.rotate("wg0.key"),
            Err(Error::RotationPending { .. })
        ));
        k.forget_previous("wg0.key").unwrap();
        assert_eq!(k.previous("wg0.key").unwrap(), None);
        k.forget_previous("wg0.key").unwrap();
        assert!(k.rotate("wg0.key").is_ok());
    }

    #[test]
    fn generated_keys_differ_and_are_clamped() {
        let a = PrivateKey::generate().unwrap();
        let b = PrivateKey::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.bytes()[0] & 7, 0);
        assert_eq!(a.bytes()[31] & 0xc0, 0x40);
    }
}
