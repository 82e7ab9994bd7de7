//! What the last full reconcile left, so that a pod ADD on a node whose peers are already
//! programmed does not re-derive the cluster: its cost stays flat whatever the number of peers.
//!
//! A full reconcile ([`super::reconcile`]) ends by writing `<stateDir>/<network>.stamp`: the
//! network's settings (a hash), the peers file's identity (device, inode, size, modification
//! and change times) and content hash, the VTEP's and the bridge's index, MAC and MTU, the
//! underlay device's, and what an ADD needs (this node's address and subnets, the MTU). A
//! write to the file changes its change time (no tool can set that one), except a write within
//! the same clock tick as the one before (file times are coarse): when the stamp was taken
//! less than [`FRESH`] after the file's last change, the ADD also compares the content hash,
//! and the first one that finds it unchanged once the file is older than that re-stamps
//! without the need. An ADD then checks only what a reboot, an upgrade or a changed
//! file can break: the stamp exists and was written by this release for these settings, the
//! peers file is the one reconciled, and the VTEP, the bridge and the underlay are the devices
//! it saw (three link lookups, no dump). When one differs, the ADD reconciles in full, as
//! before. What the check does not look at (an entry deleted by hand, a flushed nftables
//! table) is repaired by the next full reconcile: the node agent's periodic resync
//! (`--resync`, 60 s by default), `sticky-vxlan reconcile`, the boot unit (docs/vxlan.md).
//!
//! The stamp is a cache: losing it (a reboot empties `/run`) costs one full reconcile; it is
//! written with the same temp-file-and-rename as the last-good copy, never through a link.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::netlink::link::Link;
use crate::nofollow;

/// Bumped when the stamp's meaning changes: an older stamp is never trusted.
const VERSION: &str = concat!("1 ", env!("CARGO_PKG_VERSION"));

/// A file changed less than this before the stamp was taken may change again without its
/// times showing it (file times tick coarsely).
pub const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// A file's identity: a write to it changes one of these, unless it lands in the same clock
/// tick as the write before ([`FRESH`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileId {
    /// How long ago the file last changed (zero when the clock says it is in the future).
    pub fn age(&self) -> std::time::Duration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        std::time::Duration::from_nanos(u64::try_from(now - self.ctime_ns).unwrap_or(0))
    }

    /// The identity of the file at `path` (following links, as the peers file is read), or
    /// `None` when it cannot be stat'ed.
    pub fn of(path: &Path) -> Option<FileId> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// A device as the reconcile left it (its alias is its ownership marker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceId {
    pub index: u32,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    pub alias: Option<String>,
}

impl DeviceId {
    pub fn of(l: &Link) -> DeviceId {
        DeviceId {
            index: l.index,
            mac: l.mac,
            mtu: l.mtu,
            alias: l.alias.clone(),
        }
    }
}

/// The peers file's content, as [`crate::nofollow::read_regular`] reads a file (a FIFO or a
/// device there is not read); `None` when it cannot be read.
pub fn content(path: &Path) -> Option<Vec<u8>> {
    nofollow::read_regular(path, MAX_PEERS_FILE).ok()
}

/// Larger than any peers file (5,000 peers are about 400 KB).
const MAX_PEERS_FILE: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp<R> {
    version: String,
    settings: String,
    peers_file: Option<FileId>,
    /// The peers file's content hash, compared by ADD while `verify_content` is set.
    peers_hash: Option<String>,
    verify_content: bool,
    vtep: DeviceId,
    bridge: DeviceId,
    underlay: DeviceId,
    /// What an ADD needs of the node (each mode says what).
    pub ready: R,
}

/// A content hash, as text.
pub fn hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the check of a stamp found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The node is as the stamp says.
    Holds,
    /// So far as the file's times can tell; its content must still hash to this.
    IfContent(String),
    /// Something changed: reconcile in full.
    Stale,
}

/// The three devices a stamp names, as an ADD finds them: the VXLAN device, the bridge and
/// the underlay.
pub type Found = (Option<Link>, Option<Link>, Option<Link>);

impl<R> Stamp<R> {
    /// The stamp of a full reconcile whose settings hash to `settings` and that left these
    /// devices. `peers_file`: the file's identity and content as the reconcile read them.
    pub fn new(
        settings: String,
        peers_file: Option<(FileId, &[u8])>,
        (vtep, bridge, underlay): (&Link, &Link, &Link),
        ready: R,
    ) -> Stamp<R> {
        Stamp {
            version: VERSION.into(),
            settings,
            peers_file: peers_file.map(|(id, _)| id),
            peers_hash: peers_file.map(|(_, text)| hash(text)),
            verify_content: peers_file.is_some_and(|(id, _)| id.age() < FRESH),
            vtep: DeviceId::of(vtep),
            bridge: DeviceId::of(bridge),
            underlay: DeviceId::of(underlay),
            ready,
        }
    }

    /// Pure: whether the node is still as this stamp says, given what the ADD found (the
    /// settings' hash, the peers file's identity now, the three devices now). The VXLAN
    /// device and the bridge must be the very devices the reconcile left (same index: a
    /// device deleted and made again by anyone has another), with the same MAC and MTU, and up.
    pub fn check(
        &self,
        settings: &str,
        peers_file: Option<FileId>,
        (vtep, bridge, underlay): (Option<&Link>, Option<&Link>, Option<&Link>),
    ) -> Check {
        let same = |want: &DeviceId, l: Option<&Link>, up: bool| {
            l.is_some_and(|l| DeviceId::of(l) == *want && (!up || l.up))
        };
        let holds = self.version == VERSION
            && self.settings == settings
            && self.peers_file == peers_file
            && same(&self.vtep, vtep, true)
            && same(&self.bridge, bridge, true)
            && same(&self.underlay, underlay, false);
        match (&self.peers_hash, holds) {
            (_, false) => Check::Stale,
            (Some(h), true) if self.verify_content => Check::IfContent(h.clone()),
            _ => Check::Holds,
        }
    }

    /// The same stamp, no longer asking ADD to compare the content: once the file is older
    /// than [`FRESH`], a later write shows in its times.
    pub fn settled(mut self) -> Stamp<R> {
        self.verify_content = false;
        self
    }
}

/// The peers file as a full reconcile found it before reading it: `None` when there is no
/// peers file; `Some(None)` when it could not be read (then nothing is stamped, and every ADD
/// looks again).
pub type Before = Option<Option<(FileId, Vec<u8>)>>;

/// One network's stamp: where it is kept and what it is checked against.
pub struct Keeper<'a> {
    /// The stamp file, in the network's state directory.
    pub path: PathBuf,
    /// The hash of the settings that shape the node's programming (not those of one pod).
    pub settings: String,
    /// The peers file the network reads, if any.
    pub peers_file: Option<&'a Path>,
}

impl Keeper<'_> {
    /// The peers file as it is before a full reconcile reads it: a write after this shows in
    /// the stamp's check.
    pub fn before(&self) -> Before {
        self.peers_file.map(|p| Some((FileId::of(p)?, content(p)?)))
    }

    /// After a full reconcile that left these devices (VXLAN device, bridge, underlay):
    /// stamps it, or forgets the stamp when the peers file could not be read.
    pub fn after<R: Serialize>(&self, before: &Before, devices: (&Link, &Link, &Link), ready: R) {
        match before {
            Some(None) => self.forget(),
            Some(Some((id, text))) => self.write(&Stamp::new(
                self.settings.clone(),
                Some((*id, text)),
                devices,
                ready,
            )),
            None => self.write(&Stamp::new(self.settings.clone(), None, devices, ready)),
        }
    }

    /// What the stamp says an ADD needs, and the bridge, if the stamp still holds: `find`
    /// looks up the three devices (given the underlay's index). `None`: reconcile in full.
    pub fn holding<R, E>(
        &self,
        find: impl FnOnce(u32) -> Result<Found, E>,
    ) -> Result<Option<(R, Link)>, E>
    where
        R: Serialize + DeserializeOwned,
    {
        let Some(s) = self.read::<R>() else {
            return Ok(None);
        };
        let (vtep, bridge, underlay) = find(s.underlay.index)?;
        let file = self.peers_file.and_then(FileId::of);
        let holds = match s.check(
            &self.settings,
            file,
            (vtep.as_ref(), bridge.as_ref(), underlay.as_ref()),
        ) {
            Check::Holds => true,
            Check::IfContent(want) => {
                let same = self
                    .peers_file
                    .and_then(content)
                    .is_some_and(|text| hash(&text) == want);
                if same && file.is_some_and(|f| f.age() >= FRESH) {
                    let settled = s.settled();
                    self.write(&settled);
                    return Ok(bridge.map(|b| (settled.ready, b)));
                }
                same
            }
            Check::Stale => false,
        };
        Ok(match (holds, bridge) {
            (true, Some(bridge)) => Some((s.ready, bridge)),
            _ => None,
        })
    }

    /// The stamp, if there is a readable one (anything else is "no stamp": a full reconcile).
    fn read<R: DeserializeOwned>(&self) -> Option<Stamp<R>> {
        let text = nofollow::read(&self.path).ok().flatten()?;
        serde_json::from_slice(&text).ok()
    }

    /// Keeps `stamp` (temp file and rename). Best effort: without it the next ADD reconciles
    /// in full, which is what it did before stamps.
    fn write<R: Serialize>(&self, stamp: &Stamp<R>) {
        let Ok(text) = serde_json::to_vec(stamp) else {
            return;
        };
        if let Err(e) = nofollow::replace(&self.path, &text, 0o600, nofollow::Durability::Cache) {
            eprintln!(
                "sticky-vxlan: keeping {}: {e} (the next ADD reconciles in full)",
                self.path.display()
            );
        }
    }

    /// Forgets the stamp: the next ADD reconciles in full.
    pub fn forget(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, mac: u8, up: bool) -> Link {
        Link {
            index,
            name: format!("l{index}"),
            mac: Some([2, 0, 0, 0, 0, mac]),
            mtu: Some(1450),
            up,
            ..Link::default()
        }
    }

    fn stamp() -> (Stamp<u32>, Link, Link, Link) {
        let (v, b, u) = (link(7, 1, true), link(8, 2, true), link(2, 3, true));
        (Stamp::new("s".into(), None, (&v, &b, &u), 1450), v, b, u)
    }

    #[test]
    fn the_stamp_holds_only_while_everything_it_names_is_as_it_was() {
        let (s, v, b, u) = stamp();
        let holds = |s: &Stamp<u32>, f, d: (Option<&Link>, Option<&Link>, Option<&Link>)| {
            s.check("s", f, d) == Check::Holds
        };
        assert!(holds(&s, None, (Some(&v), Some(&b), Some(&u))));
        // A VTEP deleted (a reboot), or made again by anyone (a new index), or down.
        assert!(!holds(&s, None, (None, Some(&b), Some(&u))));
        assert!(!holds(
            &s,
            None,
            (Some(&link(9, 1, true)), Some(&b), Some(&u))
        ));
        assert!(!holds(
            &s,
            None,
            (Some(&link(7, 1, false)), Some(&b), Some(&u))
        ));
        // A MAC rewritten; the underlay's MTU lowered.
        assert!(!holds(
            &s,
            None,
            (Some(&link(7, 9, true)), Some(&b), Some(&u))
        ));
        let mut lower = u.clone();
        lower.mtu = Some(1400);
        assert!(!holds(&s, None, (Some(&v), Some(&b), Some(&lower))));
        // Other settings; a peers file where there was none.
        assert_eq!(
            s.check("other", None, (Some(&v), Some(&b), Some(&u))),
            Check::Stale
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[]").unwrap();
        assert!(!holds(&s, FileId::of(&f), (Some(&v), Some(&b), Some(&u))));
    }

    #[test]
    fn a_file_stamped_fresh_is_compared_by_content_until_settled() {
        let (_, v, b, u) = stamp();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[1]").unwrap();
        let id = FileId::of(&f).unwrap();
        let s = Stamp::new("s".into(), Some((id, b"[1]")), (&v, &b, &u), 1450);
        // Just written: its times may not show a write in the same tick.
        assert_eq!(
            s.check("s", Some(id), (Some(&v), Some(&b), Some(&u))),
            Check::IfContent(hash(b"[1]"))
        );
        let settled = s.settled();
        assert_eq!(
            settled.check("s", Some(id), (Some(&v), Some(&b), Some(&u))),
            Check::Holds
        );
    }

    #[test]
    fn a_keeper_gives_back_what_it_stamped_until_something_changes() {
        let (_, v, b, u) = stamp();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[1]").unwrap();
        let keeper = Keeper {
            path: dir.path().join("n.stamp"),
            settings: "s".into(),
            peers_file: Some(&f),
        };
        let found =
            || -> Result<Found, ()> { Ok((Some(v.clone()), Some(b.clone()), Some(u.clone()))) };
        assert_eq!(
            keeper.holding::<u32, ()>(|_| found()),
            Ok(None),
            "nothing stamped yet"
        );
        let before = keeper.before();
        keeper.after(&before, (&v, &b, &u), 1450u32);
        assert_eq!(
            keeper.holding::<u32, ()>(|i| {
                assert_eq!(i, u.index, "the underlay is looked up by the index it had");
                found()
            }),
            Ok(Some((1450, b.clone())))
        );
        // The same size, rewritten at once (possibly in the same clock tick): the content tells.
        std::fs::write(&f, "[2]").unwrap();
        assert_eq!(keeper.holding::<u32, ()>(|_| found()), Ok(None));
        // A peers file that could not be read is never stamped.
        let missing = dir.path().join("missing.json");
        let gone = Keeper {
            peers_file: Some(&missing),
            ..keeper
        };
        let before = gone.before();
        assert_eq!(before, Some(None));
        gone.after(&before, (&v, &b, &u), 1450u32);
        assert!(!gone.path.exists());
    }

    #[test]
    fn a_write_after_the_tick_changes_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[1]").unwrap();
        let a = FileId::of(&f).unwrap();
        assert_eq!(FileId::of(&f), Some(a), "stable while untouched");
        // In place, same size, past the coarsest clock tick (the kernel's 4 ms jiffy at 250 Hz).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, "[2]").unwrap();
        let b = FileId::of(&f).unwrap();
        assert_ne!(a, b);
        // By rename.
        let t = dir.path().join("new");
        std::fs::write(&t, "[2]").unwrap();
        std::fs::rename(&t, &f).unwrap();
        assert_ne!(FileId::of(&f).unwrap(), b);
    }
}
