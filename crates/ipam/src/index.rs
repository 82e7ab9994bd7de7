//! The persistent name index: `<network dir>/sticky-index/`, derived data that lets a call
//! answer "is this address free?" and "which addresses does this pod hold?" without listing
//! the network directory.
//!
//! Record names are split over [`BUCKETS`] files by address (`ip.XX`) and as many by pod
//! suffix (`pod.XX`); a call reads only the buckets it asks about and rewrites only those it
//! changed. `stamp` ties the buckets to the directory they describe:
//!
//! ```text
//! sticky-index/1 <dev> <ino> <mtime s> <mtime ns> <ctime s> <ctime ns>
//! <FNV-1a 64 of ip.00> … <of ip.ff> <of pod.00> … <of pod.ff>
//! sum <FNV-1a 64 of the two lines above>
//! ```
//!
//! **The rule.** The index is trusted only when the stamp parses, its sum holds, the network
//! directory's device, inode, mtime and ctime equal the stamp's, and each bucket read matches
//! its hash; otherwise the directory is listed and every bucket rewritten. Any create, rename
//! or unlink in the directory — by host-local, an older sticky-ipam, OpenYurt, an operator, or
//! a call of ours that died — changes its mtime, so it is seen. Timestamps are coarse (one
//! clock tick) on kernels before 6.13, so a change in the same tick as our last one could
//! leave the mtime equal; that is why [`save`] finally sets the directory's mtime itself to
//! just *before* the current coarse clock: every later change, in any tick, writes a newer
//! mtime. Only a directory whose mtime is set back to the stamp's exact nanosecond after its
//! entries changed (a clock stepped back onto that nanosecond) could fool it.
//!
//! Bucket and stamp files are written in place without fsync: after a power cut, a bucket
//! that did not reach the disk fails its hash, a stamp that did not fails its sum or names an
//! older mtime, and the directory is listed again. Nothing is ever written through a link: a
//! symlink or a hard-linked file (or a FIFO) at a bucket's or the stamp's name is replaced by
//! a new file of ours (the index directory is ours; what the name led to is not).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, futimens};
use nix::sys::time::TimeSpec;
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{UnlinkatFlags, unlinkat};

use sticky_primitives::{crash, nofollow};

/// The index directory, inside the network directory.
pub const DIR: &str = "sticky-index";
const STAMP: &str = "stamp";
const MAGIC: &str = "sticky-index/1";
/// Buckets per family.
pub(crate) const BUCKETS: usize = 256;

/// What a bucket is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Names by address: every record of an address is in one bucket.
    Ip,
    /// Pod record names by their `_<ns>_<pod>` suffix.
    Pod,
}

/// One bucket file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket(pub Family, pub u8);

impl Bucket {
    pub(crate) fn of_ip(ip: std::net::IpAddr) -> Bucket {
        let bytes = match ip {
            std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
            std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        Bucket(Family::Ip, fnv(&bytes) as u8)
    }

    pub(crate) fn of_suffix(suffix: &str) -> Bucket {
        Bucket(Family::Pod, fnv(suffix.as_bytes()) as u8)
    }

    /// Every bucket, in stamp order.
    pub fn all() -> impl Iterator<Item = Bucket> {
        [Family::Ip, Family::Pod]
            .into_iter()
            .flat_map(|f| (0..=255u8).map(move |n| Bucket(f, n)))
    }

    fn slot(self) -> usize {
        match self.0 {
            Family::Ip => self.1 as usize,
            Family::Pod => BUCKETS + self.1 as usize,
        }
    }

    fn file_name(self) -> String {
        match self.0 {
            Family::Ip => format!("ip.{:02x}", self.1),
            Family::Pod => format!("pod.{:02x}", self.1),
        }
    }
}

/// FNV-1a, 64 bit: a checksum against torn and lost writes, not against an adversary.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Appends `h` as 16 lowercase hex digits. The stamp holds 512 of them and is written by every
/// call that changes the directory: `format!` per hash was a third of an ADD's instructions.
fn push_hex(out: &mut Vec<u8>, h: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut word = [0u8; 16];
    for (i, digit) in word.iter_mut().enumerate() {
        *digit = DIGITS[((h >> ((15 - i) * 4)) & 0xf) as usize];
    }
    out.extend_from_slice(&word);
}

/// Exactly 16 lowercase hex digits, as [`push_hex`] writes them; anything else is `None`.
fn parse_hex(bytes: &[u8]) -> Option<u64> {
    if bytes.len() != 16 {
        return None;
    }
    bytes.iter().try_fold(0u64, |h, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(h << 4 | u64::from(digit))
    })
}

/// The stamp's line of bucket hashes, kept as the text it is: `2 * BUCKETS` words of
/// [`push_hex`], one space between. A call reads two or three buckets, so a word is parsed
/// when its bucket is read, and the words of buckets not rewritten are copied, never parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashes(Vec<u8>);

const WORD: usize = 17;

impl Hashes {
    /// Every bucket empty.
    fn empty() -> Hashes {
        let mut line = Vec::with_capacity(2 * BUCKETS * WORD);
        for slot in 0..2 * BUCKETS {
            if slot > 0 {
                line.push(b' ');
            }
            push_hex(&mut line, fnv(b""));
        }
        Hashes(line)
    }

    /// The line if it has the shape [`Hashes`] writes; each word is checked when used.
    fn parse(line: &[u8]) -> Option<Hashes> {
        let shaped = line.len() == 2 * BUCKETS * WORD - 1
            && line.iter().skip(WORD - 1).step_by(WORD).all(|b| *b == b' ');
        shaped.then(|| Hashes(line.to_vec()))
    }

    fn get(&self, slot: usize) -> Option<u64> {
        parse_hex(self.0.get(slot * WORD..slot * WORD + 16)?)
    }

    fn set(&mut self, slot: usize, h: u64) {
        let mut word = Vec::with_capacity(16);
        push_hex(&mut word, h);
        self.0[slot * WORD..slot * WORD + 16].copy_from_slice(&word);
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum IndexError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} changed while it was being stamped")]
    Raced { path: PathBuf },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IndexError {
    let path = path.to_path_buf();
    move |source| IndexError::Io {
        action,
        path,
        source,
    }
}

/// The directory's identity and times: what a stamp must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirState([i64; 6]);

impl DirState {
    fn of(meta: &fs::Metadata) -> DirState {
        DirState([
            meta.dev() as i64,
            meta.ino() as i64,
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
        ])
    }
}

/// A verified stamp: the buckets' expected hashes, and the index directory it was read
/// from, kept open so that each bucket is read from it without opening it again.
#[derive(Debug, Clone)]
pub struct Stored {
    dir: Arc<File>,
    hashes: Hashes,
}

fn open_index_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags(OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW))
        .open(path)
}

fn libc_flags(flags: OFlag) -> i32 {
    flags.bits()
}

/// The content of `name` in `dir`, if it is a regular file (`O_NONBLOCK`: a FIFO there cannot
/// block the call; it is simply not an index file).
fn read_in(dir: &File, name: &str) -> Option<Vec<u8>> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut file = File::from(fd);
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Writes `bytes` as the whole of `name` in `dir`, in place. Only a regular file that is
/// this name's alone is written ([`nofollow::single_link`]): a link, a FIFO or a file with
/// another hard link at the name is not ours to write. The index directory is ours, so our
/// name is unlinked and a new file made in its place; what it led to is left as it is.
fn write_in(dir: &File, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let open = |new: OFlag| -> std::io::Result<File> {
        let fd = openat(
            dir.as_fd(),
            name,
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_CLOEXEC
                | new,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| nofollow::explain(e.into()))?;
        nofollow::single_link(File::from(fd)).map(|(file, _)| file)
    };
    let file = match open(OFlag::empty()) {
        Err(e) if nofollow::refusal(&e).is_some() => {
            unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
            open(OFlag::O_EXCL)?
        }
        opened => opened?,
    };
    file.write_all_at(bytes, 0)?;
    file.set_len(bytes.len() as u64)
}

impl Stored {
    /// The index of `net_dir`, if its stamp holds for the directory as it is now.
    pub fn open(net_dir: &Path) -> Option<Stored> {
        let index_dir = net_dir.join(DIR);
        let dir = open_index_dir(&index_dir).ok()?;
        let text = String::from_utf8(read_in(&dir, STAMP)?).ok()?;
        let (body, sum) = text.rsplit_once("sum ")?;
        if parse_hex(sum.trim_end().as_bytes())? != fnv(body.as_bytes()) {
            return None;
        }
        let mut lines = body.lines();
        let mut head = lines.next()?.split(' ');
        if head.next()? != MAGIC {
            return None;
        }
        let mut state = [0i64; 6];
        for slot in &mut state {
            *slot = head.next()?.parse().ok()?;
        }
        if DirState(state) != DirState::of(&fs::metadata(net_dir).ok()?) {
            return None;
        }
        let hashes = Hashes::parse(lines.next()?.as_bytes())?;
        Some(Stored {
            dir: Arc::new(dir),
            hashes,
        })
    }

    /// A bucket's text, one name per line, when its file matches the stamp. The caller
    /// walks the lines and copies only the names it keeps: a bucket of a 60,000-record
    /// directory holds a few hundred names, and an allocation each was most of a call.
    pub fn load(&self, bucket: Bucket) -> Option<String> {
        let bytes = read_in(&self.dir, &bucket.file_name())?;
        if Some(fnv(&bytes)) != self.hashes.get(bucket.slot()) {
            return None;
        }
        String::from_utf8(bytes).ok()
    }

    pub fn hashes(&self) -> &Hashes {
        &self.hashes
    }
}

/// Writes `changed` buckets (each a list of names), then stamps the directory: its mtime set
/// just before the coarse clock, the stamp naming it and every bucket's hash. `known` are the
/// hashes of the buckets not rewritten; without them every bucket must be in `changed`.
pub(crate) fn save(
    net_dir: &Path,
    known: Option<&Hashes>,
    changed: &[(Bucket, Vec<String>)],
) -> Result<(), IndexError> {
    let index_dir = net_dir.join(DIR);
    match DirBuilder::new().mode(0o755).create(&index_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("creating", &index_dir)(e)),
    }
    let dir = open_index_dir(&index_dir).map_err(io_err("opening", &index_dir))?;
    let mut hashes = known.cloned().unwrap_or_else(Hashes::empty);
    for (bucket, names) in changed {
        let mut text = String::new();
        for name in names {
            text.push_str(name);
            text.push('\n');
        }
        let path = index_dir.join(bucket.file_name());
        write_in(&dir, &bucket.file_name(), text.as_bytes()).map_err(io_err("writing", &path))?;
        hashes.set(bucket.slot(), fnv(text.as_bytes()));
        crash::point("index bucket written");
    }
    if known.is_none() {
        // Buckets not in `changed` are empty: their files must say so.
        for bucket in Bucket::all() {
            if !changed.iter().any(|(b, _)| *b == bucket) {
                let path = index_dir.join(bucket.file_name());
                write_in(&dir, &bucket.file_name(), b"").map_err(io_err("writing", &path))?;
            }
        }
    }
    let net = File::open(net_dir).map_err(io_err("opening", net_dir))?;
    let before = stamp_time().map_err(|e| io_err("reading the clock for", net_dir)(e.into()))?;
    futimens(&net, &TimeSpec::UTIME_OMIT, &before)
        .map_err(|e| io_err("setting the mtime of", net_dir)(e.into()))?;
    let state = DirState::of(&net.metadata().map_err(io_err("reading", net_dir))?);
    if (state.0[2], state.0[3]) != (before.tv_sec(), before.tv_nsec()) {
        return Err(IndexError::Raced {
            path: net_dir.to_path_buf(),
        });
    }
    let mut body = Vec::with_capacity(128 + 2 * BUCKETS * 17 + 22);
    body.extend_from_slice(MAGIC.as_bytes());
    for n in state.0 {
        body.extend_from_slice(format!(" {n}").as_bytes());
    }
    body.push(b'\n');
    body.extend_from_slice(&hashes.0);
    body.push(b'\n');
    let sum = fnv(&body);
    body.extend_from_slice(b"sum ");
    push_hex(&mut body, sum);
    body.push(b'\n');
    let path = index_dir.join(STAMP);
    write_in(&dir, STAMP, &body).map_err(io_err("writing", &path))?;
    crash::point("index stamped");
    Ok(())
}

/// One nanosecond before the coarse clock: older than any timestamp a later change can get.
fn stamp_time() -> Result<TimeSpec, nix::Error> {
    let now = clock_gettime(ClockId::CLOCK_REALTIME_COARSE)?;
    let ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec()) - 1;
    Ok(TimeSpec::new(
        (ns.div_euclid(1_000_000_000)) as i64,
        (ns.rem_euclid(1_000_000_000)) as i64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_it_never_writes() {
        for h in [0, 1, 0xdead_beef, u64::MAX, fnv(b"10.1.2.3_ns_pod\n")] {
            let mut text = Vec::new();
            push_hex(&mut text, h);
            assert_eq!(text, format!("{h:016x}").into_bytes());
            assert_eq!(parse_hex(&text), Some(h));
        }
        for bad in [
            "",
            "0",
            "00000000000000000",
            "000000000000000G",
            "+00000000000000f",
            "00000000000000F0",
        ] {
            assert_eq!(parse_hex(bad.as_bytes()), None, "{bad:?}");
        }
        let line = (0..2 * BUCKETS as u64)
            .map(|h| format!("{h:016x}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut hashes = Hashes::parse(line.as_bytes()).unwrap();
        for slot in 0..2 * BUCKETS {
            assert_eq!(hashes.get(slot), Some(slot as u64));
        }
        hashes.set(7, u64::MAX);
        assert_eq!(hashes.get(7), Some(u64::MAX));
        assert_eq!((hashes.get(6), hashes.get(8)), (Some(6), Some(8)));
        assert_eq!(hashes.0.len(), line.len());
        assert_eq!(
            Hashes::parse(&Hashes::empty().0).unwrap().get(300),
            Some(fnv(b""))
        );
        // A word that is not hex is found when its bucket is read: that bucket is not trusted.
        let bad = line.replacen("0000000000000003", "000000000000000X", 1);
        assert_eq!(Hashes::parse(bad.as_bytes()).unwrap().get(3), None);
        for broken in [
            line.replacen(' ', "_", 1),
            line[..line.len() - 1].to_string(),
            format!("{line} "),
            line.replacen(' ', "", 1) + " ",
        ] {
            assert_eq!(Hashes::parse(broken.as_bytes()), None, "{}", &broken[..40]);
        }
    }
}
