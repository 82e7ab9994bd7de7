//! What the last full reconcile left, so that a pod ADD on a node whose peers are already
//! programmed does not re-derive the cluster: its cost stays flat whatever the number of peers.
//!
//! A full reconcile ([`super::reconcile`]) ends by writing `<stateDir>/<network>.stamp`: the
//! network's settings (a hash), the peers file's identity (device, inode, size, modification
//! and change times) and content hash, the VTEP's and the bridge's index, MAC, MTU, marker,
//! master and VXLAN parameters (VNI, local address, learning, port, TTL, underlay device), the
//! underlay device's, what the node's pods depend on beyond the devices ([`Depends`]: the
//! VTEP's and the bridge's addresses, the forwarding sysctls) and what an ADD needs (this
//! node's address and subnets, the MTU). A
//! write to the file changes its change time (no tool can set that one), except a write within
//! the same clock tick as the one before (file times are coarse): when the stamp was taken
//! less than [`FRESH`] after the file's last change, the ADD also compares the content hash,
//! and the first one that finds it unchanged once the file is older than that re-stamps
//! without the need. An ADD then checks only what a reboot, an upgrade, a changed file or a
//! hand on the node can break in what every pod depends on: the stamp exists and was written
//! by this release for these settings, the peers file is the one reconciled, the VTEP, the
//! bridge and the underlay are the devices it saw with the same parameters (three link
//! lookups), the addresses are still on them (one filtered address request per device that
//! holds any) and the sysctls still read as set (one file each). None of it grows with the
//! peers. When one differs, the ADD reconciles in full, as before. What the check does not
//! look at (an entry deleted by hand, a flushed nftables table, a pod veth taken off the
//! bridge) is repaired by the next full reconcile: the node agent's periodic resync
//! (`--resync`, 60 s by default), `sticky-vxlan reconcile`, the boot unit (docs/vxlan.md).
//!
//! The stamp is a cache: losing it (a reboot empties `/run`) costs one full reconcile; it is
//! written with the same temp-file-and-rename as the last-good copy, never through a link.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Error;
use super::kernel::Kernel;
use sticky_netlink::link::{Link, VxlanInfo};
use sticky_primitives::nofollow;

/// Bumped when the stamp's meaning changes: an older stamp is never trusted.
const VERSION: &str = concat!("2 ", env!("CARGO_PKG_VERSION"));

/// A file changed less than this before the stamp was taken may change again without its
/// times showing it (file times tick coarsely).
pub(crate) const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

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
    pub(crate) fn age(&self) -> std::time::Duration {
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
    /// The bridge it is a port of (a segment's VXLAN device).
    pub master: Option<u32>,
    /// A VXLAN device's parameters (VNI, local address, learning, port, TTL, underlay).
    pub vxlan: Option<VxlanInfo>,
}

impl DeviceId {
    pub fn of(l: &Link) -> DeviceId {
        DeviceId {
            index: l.index,
            mac: l.mac,
            mtu: l.mtu,
            alias: l.alias.clone(),
            master: l.master,
            vxlan: l.vxlan.clone(),
        }
    }
}

/// What the node's pods depend on beyond the devices themselves, as a full reconcile left it:
/// each mode says what ([`super::reconcile`]; a segment carries frames only, and has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Depends {
    /// Addresses the VXLAN device holds (the main mode's own `/32`s: without its last IPv4
    /// address the kernel drops every route through the device).
    pub vtep_addresses: Vec<IpNet>,
    /// Addresses the bridge holds (the pods' gateways).
    pub bridge_addresses: Vec<IpNet>,
    /// Sysctls as set (`net/ipv4/ip_forward` = `1`, ...).
    pub sysctls: Vec<(String, String)>,
}

/// The peers file's content, as [`sticky_primitives::nofollow::read_regular`] reads a file (a FIFO or a
/// device there is not read); `None` when it cannot be read.
pub fn content(path: &Path) -> Option<Vec<u8>> {
    nofollow::read_regular(path, MAX_PEERS_FILE).ok()
}

/// Larger than any peers file (5,000 peers are about 400 KB).
const MAX_PEERS_FILE: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stamp<R> {
    version: String,
    settings: String,
    peers_file: Option<FileId>,
    /// The peers file's content hash, compared by ADD while `verify_content` is set.
    peers_hash: Option<String>,
    verify_content: bool,
    vtep: DeviceId,
    bridge: DeviceId,
    underlay: DeviceId,
    depends: Depends,
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

/// What an ADD finds of what a stamp names: the VXLAN device, the bridge and the underlay,
/// the addresses on the first two (read only when the stamp names some), and the value of
/// each of the stamp's sysctls, in its order.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub vtep: Option<Link>,
    pub bridge: Option<Link>,
    pub underlay: Option<Link>,
    pub vtep_addresses: Vec<IpNet>,
    pub bridge_addresses: Vec<IpNet>,
    pub sysctls: Vec<Option<String>>,
}

impl<R> Stamp<R> {
    /// The stamp of a full reconcile whose settings hash to `settings` and that left these
    /// devices and `depends`. `peers_file`: the file's identity and content as the reconcile
    /// read them.
    pub fn new(
        settings: String,
        peers_file: Option<(FileId, &[u8])>,
        (vtep, bridge, underlay): (&Link, &Link, &Link),
        depends: Depends,
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
            depends,
            ready,
        }
    }

    /// Pure: whether the node is still as this stamp says, given what the ADD found (the
    /// settings' hash, the peers file's identity now, [`Found`]). The VXLAN device and the
    /// bridge must be the very devices the reconcile left (same index: a device deleted and
    /// made again by anyone has another), with the same MAC, MTU, marker, master and VXLAN
    /// parameters, and up; every address the reconcile put on them still there (others may
    /// have come: an IPAM's own gateway); every sysctl reading as it was set.
    pub fn check(&self, settings: &str, peers_file: Option<FileId>, found: &Found) -> Check {
        let same = |want: &DeviceId, l: Option<&Link>, up: bool| {
            l.is_some_and(|l| DeviceId::of(l) == *want && (!up || l.up))
        };
        let held = |want: &[IpNet], have: &[IpNet]| want.iter().all(|a| have.contains(a));
        let d = &self.depends;
        let holds = self.version == VERSION
            && self.settings == settings
            && self.peers_file == peers_file
            && same(&self.vtep, found.vtep.as_ref(), true)
            && same(&self.bridge, found.bridge.as_ref(), true)
            && same(&self.underlay, found.underlay.as_ref(), false)
            && held(&d.vtep_addresses, &found.vtep_addresses)
            && held(&d.bridge_addresses, &found.bridge_addresses)
            && d.sysctls.len() == found.sysctls.len()
            && d.sysctls
                .iter()
                .zip(&found.sysctls)
                .all(|((_, want), have)| have.as_deref() == Some(want.as_str()));
        match (&self.peers_hash, holds) {
            (_, false) => Check::Stale,
            (Some(h), true) if self.verify_content => Check::IfContent(h.clone()),
            _ => Check::Holds,
        }
    }

    /// What the check reads through `k`, the devices named `vtep` and `bridge`: three link
    /// lookups, the addresses of a device the stamp says holds some, each sysctl. Nothing
    /// here grows with the peers.
    fn find(&self, k: &mut impl Kernel, (vtep, bridge): (&str, &str)) -> Result<Found, Error> {
        let mut found = Found {
            vtep: k.link(vtep)?,
            bridge: k.link(bridge)?,
            underlay: k.link_at(self.underlay.index)?,
            ..Found::default()
        };
        let d = &self.depends;
        if let Some(l) = found.vtep.as_ref().filter(|_| !d.vtep_addresses.is_empty()) {
            found.vtep_addresses = k.addresses_of(l.index)?;
        }
        if let Some(l) = found
            .bridge
            .as_ref()
            .filter(|_| !d.bridge_addresses.is_empty())
        {
            found.bridge_addresses = k.addresses_of(l.index)?;
        }
        for (key, _) in &d.sysctls {
            found.sysctls.push(k.read_sysctl(key)?);
        }
        Ok(found)
    }

    /// The same stamp, no longer asking ADD to compare the content: once the file is older
    /// than [`FRESH`], a later write shows in its times.
    pub fn settled(mut self) -> Stamp<R> {
        self.verify_content = false;
        self
    }
}

/// What a full reconcile left applied, as its stamp says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The VXLAN device it left.
    pub vtep: DeviceId,
    /// The content hash of the peers file it applied (`None`: there was none).
    pub peers_hash: Option<String>,
}

/// A stamp that still holds but for the peers file ([`StampFile::standing`]), with the two
/// devices it names as they are.
#[derive(Debug)]
pub struct Standing<R> {
    stamp: Stamp<R>,
    pub vtep: Link,
    pub bridge: Link,
}

impl<R> Standing<R> {
    /// The content hash of the peers file it was taken for.
    pub fn peers_hash(&self) -> Option<&str> {
        self.stamp.peers_hash.as_deref()
    }

    /// What an ADD needs, as the stamp keeps it.
    pub fn ready(&self) -> &R {
        &self.stamp.ready
    }

    /// Whether the stamp counts `key` among the sysctls set.
    pub fn sets(&self, key: &str) -> bool {
        self.stamp.depends.sysctls.iter().any(|(k, _)| k == key)
    }
}

/// The peers file as a full reconcile found it before reading it: `None` when there is no
/// peers file; `Some(None)` when it could not be read (then nothing is stamped, and every ADD
/// looks again).
pub(crate) type Before = Option<Option<(FileId, Vec<u8>)>>;

/// One network's stamp: where it is kept and what it is checked against.
pub struct StampFile<'a> {
    /// The stamp file, in the network's state directory.
    pub path: PathBuf,
    /// The hash of the settings that shape the node's programming (not those of one pod).
    pub settings: String,
    /// The peers file the network reads, if any.
    pub peers_file: Option<&'a Path>,
}

impl StampFile<'_> {
    /// The peers file as it is before a full reconcile reads it: a write after this shows in
    /// the stamp's check.
    pub fn before(&self) -> Before {
        self.peers_file.map(|p| Some((FileId::of(p)?, content(p)?)))
    }

    /// After a full reconcile that left these devices (VXLAN device, bridge, underlay) and
    /// `depends`: stamps it, or forgets the stamp when the peers file could not be read.
    pub fn after<R: Serialize>(
        &self,
        before: &Before,
        devices: (&Link, &Link, &Link),
        depends: Depends,
        ready: R,
    ) {
        let file = match before {
            Some(None) => return self.forget(),
            Some(Some((id, text))) => Some((*id, text.as_slice())),
            None => None,
        };
        self.write(&Stamp::new(
            self.settings.clone(),
            file,
            devices,
            depends,
            ready,
        ));
    }

    /// What the stamp says an ADD needs, and the bridge, if the stamp still holds, reading
    /// through `k` the devices named `devices` (VXLAN device, bridge) and what the stamp
    /// names ([`Stamp::check`]). `None`: reconcile in full.
    pub fn holding<R>(
        &self,
        k: &mut impl Kernel,
        devices: (&str, &str),
    ) -> Result<Option<(R, Link)>, Error>
    where
        R: Serialize + DeserializeOwned,
    {
        let Some(s) = self.read::<R>() else {
            return Ok(None);
        };
        let found = s.find(k, devices)?;
        let bridge = found.bridge.clone();
        let file = self.peers_file.and_then(FileId::of);
        let holds = match s.check(&self.settings, file, &found) {
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

    /// What a change of the peers file may build on: the last reconcile's stamp, while
    /// everything it names but the peers file still holds (the same checks as
    /// [`StampFile::holding`], through `k`). `None`: reconcile in full.
    pub fn standing<R>(
        &self,
        k: &mut impl Kernel,
        devices: (&str, &str),
    ) -> Result<Option<Standing<R>>, Error>
    where
        R: DeserializeOwned,
    {
        let Some(s) = self.read::<R>() else {
            return Ok(None);
        };
        let found = s.find(k, devices)?;
        if s.check(&self.settings, s.peers_file, &found) == Check::Stale {
            return Ok(None);
        }
        Ok(match (found.vtep, found.bridge) {
            (Some(vtep), Some(bridge)) => Some(Standing {
                stamp: s,
                vtep,
                bridge,
            }),
            _ => None,
        })
    }

    /// After a change of the peers file applied on top of `standing`: the same stamp, for the
    /// file as it is now (`id`, `text`).
    pub fn moved_on<R: Serialize>(&self, standing: Standing<R>, (id, text): (FileId, &[u8])) {
        let stamp = Stamp {
            peers_file: Some(id),
            peers_hash: Some(hash(text)),
            verify_content: id.age() < FRESH,
            ..standing.stamp
        };
        self.write(&stamp);
    }

    /// What the last full reconcile left applied, if its stamp is one of this release for
    /// these settings (whether the devices are still as it left them is not checked here).
    pub fn applied(&self) -> Option<Applied> {
        let s = self.read::<serde::de::IgnoredAny>()?;
        (s.version == VERSION && s.settings == self.settings).then_some(Applied {
            vtep: s.vtep,
            peers_hash: s.peers_hash,
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
    use crate::fake::Fake;

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

    fn found(v: &Link, b: &Link, u: &Link) -> Found {
        Found {
            vtep: Some(v.clone()),
            bridge: Some(b.clone()),
            underlay: Some(u.clone()),
            ..Found::default()
        }
    }

    fn stamp() -> (Stamp<u32>, Link, Link, Link) {
        let (v, b, u) = (link(7, 1, true), link(8, 2, true), link(2, 3, true));
        let s = Stamp::new("s".into(), None, (&v, &b, &u), Depends::default(), 1450);
        (s, v, b, u)
    }

    #[test]
    fn the_stamp_holds_only_while_everything_it_names_is_as_it_was() {
        let (s, v, b, u) = stamp();
        let holds = |s: &Stamp<u32>, f, found: Found| s.check("s", f, &found) == Check::Holds;
        assert!(holds(&s, None, found(&v, &b, &u)));
        // A VTEP deleted (a reboot), or made again by anyone (a new index), or down.
        let without_vtep = Found {
            vtep: None,
            ..found(&v, &b, &u)
        };
        assert!(!holds(&s, None, without_vtep));
        assert!(!holds(&s, None, found(&link(9, 1, true), &b, &u)));
        assert!(!holds(&s, None, found(&link(7, 1, false), &b, &u)));
        // A MAC rewritten; the underlay's MTU lowered.
        assert!(!holds(&s, None, found(&link(7, 9, true), &b, &u)));
        let mut lower = u.clone();
        lower.mtu = Some(1400);
        assert!(!holds(&s, None, found(&v, &b, &lower)));
        // Other settings; a peers file where there was none.
        assert_eq!(s.check("other", None, &found(&v, &b, &u)), Check::Stale);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[]").unwrap();
        assert!(!holds(&s, FileId::of(&f), found(&v, &b, &u)));
    }

    #[test]
    fn every_setting_the_pods_depend_on_is_part_of_the_check() {
        let mut v = link(7, 1, true);
        v.vxlan = Some(VxlanInfo {
            vni: Some(1),
            port: Some(8472),
            local: Some("192.0.2.1".parse().unwrap()),
            underlay: Some(2),
            learning: Some(false),
            ttl: Some(0),
        });
        let (b, u) = (link(8, 2, true), link(2, 3, true));
        let depends = Depends {
            vtep_addresses: vec!["10.244.1.0/32".parse().unwrap()],
            bridge_addresses: vec!["10.244.1.1/24".parse().unwrap()],
            sysctls: vec![("net/ipv4/ip_forward".into(), "1".into())],
        };
        let s = Stamp::new("s".into(), None, (&v, &b, &u), depends.clone(), 1450u32);
        let good = || Found {
            vtep_addresses: depends.vtep_addresses.clone(),
            // Another address on the bridge (an IPAM's own gateway) is not a change.
            bridge_addresses: vec![
                "fe80::1/64".parse().unwrap(),
                "10.244.1.1/24".parse().unwrap(),
            ],
            sysctls: vec![Some("1".into())],
            ..found(&v, &b, &u)
        };
        assert_eq!(s.check("s", None, &good()), Check::Holds);
        let tunnel = |change: fn(&mut VxlanInfo)| {
            let mut l = v.clone();
            change(l.vxlan.as_mut().unwrap());
            Found {
                vtep: Some(l),
                ..good()
            }
        };
        let broken: Vec<(&str, Found)> = vec![
            (
                "local",
                tunnel(|t| t.local = Some("192.0.2.9".parse().unwrap())),
            ),
            ("learning", tunnel(|t| t.learning = Some(true))),
            ("port", tunnel(|t| t.port = Some(4789))),
            ("ttl", tunnel(|t| t.ttl = Some(1))),
            ("underlay device", tunnel(|t| t.underlay = Some(5))),
            (
                "master",
                Found {
                    vtep: Some(Link {
                        master: Some(8),
                        ..v.clone()
                    }),
                    ..good()
                },
            ),
            (
                "the VTEP's address",
                Found {
                    vtep_addresses: vec![],
                    ..good()
                },
            ),
            (
                "the bridge's gateway",
                Found {
                    bridge_addresses: vec!["fe80::1/64".parse().unwrap()],
                    ..good()
                },
            ),
            (
                "ip_forward",
                Found {
                    sysctls: vec![Some("0".into())],
                    ..good()
                },
            ),
            (
                "ip_forward unreadable",
                Found {
                    sysctls: vec![None],
                    ..good()
                },
            ),
        ];
        for (what, found) in broken {
            assert_eq!(s.check("s", None, &found), Check::Stale, "{what}");
        }
    }

    #[test]
    fn a_file_stamped_fresh_is_compared_by_content_until_settled() {
        let (_, v, b, u) = stamp();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[1]").unwrap();
        let id = FileId::of(&f).unwrap();
        let depends = Depends::default();
        let s = Stamp::new("s".into(), Some((id, b"[1]")), (&v, &b, &u), depends, 1450);
        // Just written: its times may not show a write in the same tick.
        assert_eq!(
            s.check("s", Some(id), &found(&v, &b, &u)),
            Check::IfContent(hash(b"[1]"))
        );
        let settled = s.settled();
        assert_eq!(
            settled.check("s", Some(id), &found(&v, &b, &u)),
            Check::Holds
        );
    }

    #[test]
    fn a_stamp_file_gives_back_what_it_stamped_until_something_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut k = Fake::node("192.0.2.1/24");
        k.add_link("vtep", "vxlan");
        k.add_link("br", "bridge");
        k.add_address("br", "10.244.1.1/24");
        k.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
        let get = |k: &Fake, name: &str| k.seen.link(name).cloned().unwrap();
        let (v, b, u) = (get(&k, "vtep"), get(&k, "br"), get(&k, "eth0"));
        let f = dir.path().join("peers.json");
        std::fs::write(&f, "[1]").unwrap();
        let file = StampFile {
            path: dir.path().join("n.stamp"),
            settings: "s".into(),
            peers_file: Some(&f),
        };
        let names = ("vtep", "br");
        assert_eq!(
            file.holding::<u32>(&mut k, names).unwrap(),
            None,
            "nothing stamped yet"
        );
        let depends = Depends {
            bridge_addresses: vec!["10.244.1.1/24".parse().unwrap()],
            sysctls: vec![("net/ipv4/ip_forward".into(), "1".into())],
            ..Depends::default()
        };
        let before = file.before();
        file.after(&before, (&v, &b, &u), depends.clone(), 1450u32);
        k.queries.clear();
        assert_eq!(
            file.holding::<u32>(&mut k, names).unwrap(),
            Some((1450, b.clone()))
        );
        // The bridge's addresses and the sysctl are read; the VTEP's, which the stamp does
        // not name, are not.
        assert_eq!(
            k.queries,
            [
                format!("addresses of #{}", b.index),
                "read sysctl net/ipv4/ip_forward".into()
            ]
        );
        k.sysctls.insert("net/ipv4/ip_forward".into(), "0".into());
        assert_eq!(file.holding::<u32>(&mut k, names).unwrap(), None);
        k.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
        // The same size, rewritten at once (possibly in the same clock tick): the content tells.
        std::fs::write(&f, "[2]").unwrap();
        assert_eq!(file.holding::<u32>(&mut k, names).unwrap(), None);
        // A peers file that could not be read is never stamped.
        let missing = dir.path().join("missing.json");
        let gone = StampFile {
            peers_file: Some(&missing),
            ..file
        };
        let before = gone.before();
        assert_eq!(before, Some(None));
        gone.after(&before, (&v, &b, &u), depends, 1450u32);
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
