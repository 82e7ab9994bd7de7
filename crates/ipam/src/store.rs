//! What the allocator needs from persistence, and nothing more.
//!
//! The allocator (pure policy) reaches the data dir only through [`Store`];
//! [`crate::disk`] is the real one and `mem::MemStore` (test builds only) a fake for unit
//! tests. Every store keeps an [`Index`] of record file names, read once per call: which
//! addresses are taken and which files belong to a pod is known without opening a file.

use std::cell::RefCell;
#[cfg(any(test, feature = "testing"))]
use std::collections::BTreeMap;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::index::{Bucket, Family, Hashes, Stored};
use super::record::{Record, parse_name};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The record files of one address.
#[derive(Debug, Clone, Default)]
struct Files {
    /// Whether `<ip>` (host-local's format) exists.
    plain: bool,
    /// `<ip>_<ns>_<pod>` names.
    named: Vec<String>,
}

/// Record file names by address and by pod suffix.
///
/// Complete in memory (built from a listing, or in tests), or backed by the persistent
/// [`index`](super::index): then a bucket is read the first time a question needs it, and a
/// bucket that fails its check makes the index list the directory instead. Either way every
/// answer is exact. Changes are made after the file operation succeeded and mark their
/// buckets for rewriting.
#[derive(Debug, Clone, Default)]
pub struct Index {
    names: RefCell<Names>,
}

#[derive(Debug, Clone, Default)]
struct Names {
    by_ip: HashMap<IpAddr, Files>,
    by_suffix: HashMap<String, BTreeSet<IpAddr>>,
    /// `None`: complete. Else the stored index and the buckets read so far.
    backing: Option<Backing>,
    /// Buckets whose stored copy is out of date.
    dirty: BTreeSet<Bucket>,
    /// Rebuilt from a listing: every bucket must be rewritten.
    rebuilt: bool,
    /// A damaged bucket was met and the directory could not be listed.
    unlistable: bool,
}

#[derive(Debug, Clone)]
struct Backing {
    stored: Stored,
    /// Where to list names when a bucket fails its check.
    dir: PathBuf,
    /// Buckets whose names are in the maps.
    loaded: HashSet<Bucket>,
    /// Buckets read and checked but not put in the maps: a question about one address or one
    /// pod is answered from the text, and a change is a line added or removed, without a map
    /// entry (allocations) for each of the hundreds of names a bucket of a large directory
    /// holds. A bucket is in `loaded` or here, never both.
    texts: HashMap<Bucket, String>,
}

impl Names {
    fn add(&mut self, name: &str) -> Option<(IpAddr, Option<String>)> {
        let (ip, suffix) = parse_name(name)?;
        self.add_ip(ip, name, suffix);
        if let Some(s) = suffix {
            self.add_suffix(s, ip);
        }
        Some((ip, suffix.map(str::to_string)))
    }

    fn add_ip(&mut self, ip: IpAddr, name: &str, suffix: Option<&str>) {
        let files = self.by_ip.entry(ip).or_default();
        match suffix {
            None => files.plain = true,
            Some(_) if !files.named.iter().any(|n| n == name) => files.named.push(name.to_string()),
            Some(_) => {}
        }
    }

    fn add_suffix(&mut self, suffix: &str, ip: IpAddr) {
        self.by_suffix
            .entry(suffix.to_string())
            .or_default()
            .insert(ip);
    }

    /// Makes `bucket` known; on a failed check, lists the directory instead.
    fn ensure(&mut self, bucket: Bucket) {
        let Some(backing) = &mut self.backing else {
            return;
        };
        if !backing.loaded.insert(bucket) {
            return;
        }
        let Some(text) = backing
            .texts
            .remove(&bucket)
            .or_else(|| backing.stored.load(bucket))
        else {
            let dir = backing.dir.clone();
            self.relist(&dir);
            return;
        };
        for name in text.lines() {
            let Some((ip, suffix)) = parse_name(name) else {
                continue;
            };
            // A bucket feeds only its own map: the other is complete only for buckets read.
            match bucket.0 {
                Family::Ip => {
                    let files = self.by_ip.entry(ip).or_default();
                    match suffix {
                        None => files.plain = true,
                        Some(_) if !files.named.iter().any(|n| n == name) => {
                            files.named.push(name.to_string())
                        }
                        Some(_) => {}
                    }
                }
                Family::Pod => {
                    if let Some(s) = suffix {
                        self.by_suffix.entry(s.to_string()).or_default().insert(ip);
                    }
                }
            }
        }
    }

    /// The names of `bucket` that `keep` selects, from the bucket's text, when the bucket is
    /// not in the maps; `None` when the maps answer (the bucket is in them, the index is
    /// complete, or the bucket failed its check and the directory was listed).
    fn scan(&mut self, bucket: Bucket, keep: impl Fn(&str) -> bool) -> Option<Vec<String>> {
        let text = self.text_of(bucket)?;
        Some(
            text.lines()
                .filter(|n| keep(n))
                .map(str::to_string)
                .collect(),
        )
    }

    /// The text of `bucket`, read and checked if need be, when the bucket is not in the maps;
    /// `None` when the maps answer (as [`Names::scan`]).
    fn text_of(&mut self, bucket: Bucket) -> Option<&mut String> {
        let backing = self.backing.as_mut()?;
        if backing.loaded.contains(&bucket) {
            return None;
        }
        if !backing.texts.contains_key(&bucket) {
            let Some(text) = backing.stored.load(bucket) else {
                let dir = backing.dir.clone();
                self.relist(&dir);
                return None;
            };
            backing.texts.insert(bucket, text);
        }
        self.backing.as_mut()?.texts.get_mut(&bucket)
    }

    /// Adds or removes the line `name` in `bucket`'s text, keeping the lines sorted as a
    /// saved bucket has them; `false` when the bucket is in the maps instead.
    fn edit_text(&mut self, bucket: Bucket, name: &str, add: bool) -> bool {
        let Some(text) = self.text_of(bucket) else {
            return false;
        };
        let mut lines: Vec<&str> = text.lines().collect();
        match (lines.iter().position(|l| *l == name), add) {
            (None, true) => {
                let at = lines.iter().position(|l| *l > name).unwrap_or(lines.len());
                lines.insert(at, name);
            }
            (Some(at), false) => {
                lines.remove(at);
            }
            _ => return true,
        }
        let mut edited = String::with_capacity(text.len() + name.len() + 1);
        for line in lines {
            edited.push_str(line);
            edited.push('\n');
        }
        *text = edited;
        true
    }

    /// The names of `ip`'s records, `<ip>` first: from the maps or its bucket's text.
    fn of_ip(&mut self, ip: IpAddr) -> Vec<String> {
        let text = ip.to_string();
        let of_ip = |n: &str| n.starts_with(&text) && parse_name(n).is_some_and(|(i, _)| i == ip);
        if let Some(mut found) = self.scan(Bucket::of_ip(ip), of_ip) {
            // Sorted in the bucket, so `<ip>` is already first; kept explicit.
            found.sort_by_key(|n| n.contains('_'));
            return found;
        }
        let Some(files) = self.by_ip.get(&ip) else {
            return Vec::new();
        };
        files
            .plain
            .then_some(text)
            .into_iter()
            .chain(files.named.iter().cloned())
            .collect()
    }

    fn ensure_all_ips(&mut self) {
        for n in 0..=255u8 {
            self.ensure(Bucket(Family::Ip, n));
        }
    }

    /// Replaces everything by the names listed in `dir` (a damaged or missing bucket).
    fn relist(&mut self, dir: &Path) {
        *self = match list(dir) {
            Ok(listed) => {
                let mut names = Names {
                    rebuilt: true,
                    ..Names::default()
                };
                for name in listed {
                    names.add(&name);
                }
                names
            }
            Err(e) => {
                // Unlistable after it was opened: every address counts as taken rather than
                // guessed free, and nothing is saved.
                eprintln!("sticky-ipam: {e}");
                Names {
                    unlistable: true,
                    ..Names::default()
                }
            }
        };
    }
}

/// Every record name and everything else in `dir` (temp files included).
pub fn list(dir: &Path) -> Result<Vec<String>, StoreError> {
    let err = |source| StoreError::Io {
        action: "listing",
        path: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        if let Some(name) = entry.map_err(err)?.file_name().to_str() {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

impl Index {
    /// An index backed by a verified stored index of `dir`.
    pub fn stored(stored: Stored, dir: &Path) -> Index {
        Index {
            names: RefCell::new(Names {
                backing: Some(Backing {
                    stored,
                    dir: dir.to_path_buf(),
                    loaded: HashSet::new(),
                    texts: HashMap::new(),
                }),
                ..Names::default()
            }),
        }
    }

    /// Marks a complete index built from a listing: the stored copy is rewritten whole.
    pub(crate) fn mark_rebuilt(&mut self) {
        self.names.get_mut().rebuilt = true;
    }

    /// Adds a name if it is a record name; returns whether it was.
    pub fn insert(&mut self, name: &str) -> bool {
        let Some((ip, suffix)) = parse_name(name) else {
            return false;
        };
        let names = self.names.get_mut();
        // A name already listed changes no bucket (a lease rewritten under its own name): known
        // from the address's bucket text, without putting either bucket in the maps.
        if names.of_ip(ip).iter().any(|n| n == name) {
            return true;
        }
        let by_ip = Bucket::of_ip(ip);
        if !names.edit_text(by_ip, name, true) {
            names.ensure(by_ip);
            names.add_ip(ip, name, suffix);
        }
        names.dirty.insert(by_ip);
        if let Some(s) = suffix {
            let by_pod = Bucket::of_suffix(s);
            if !names.edit_text(by_pod, name, true) {
                names.ensure(by_pod);
                names.add_suffix(s, ip);
            }
            names.dirty.insert(by_pod);
        }
        true
    }

    pub fn remove(&mut self, name: &str) {
        let Some((ip, suffix)) = parse_name(name) else {
            return;
        };
        let names = self.names.get_mut();
        let by_ip = Bucket::of_ip(ip);
        if !names.edit_text(by_ip, name, false) {
            names.ensure(by_ip);
            if let Some(files) = names.by_ip.get_mut(&ip) {
                match suffix {
                    None => files.plain = false,
                    Some(_) => files.named.retain(|n| n != name),
                }
                if !files.plain && files.named.is_empty() {
                    names.by_ip.remove(&ip);
                }
            }
        }
        names.dirty.insert(by_ip);
        if let Some(s) = suffix {
            // `<ip><s>` is this very name: the address leaves the suffix's set with it.
            let by_pod = Bucket::of_suffix(s);
            if !names.edit_text(by_pod, name, false) {
                names.ensure(by_pod);
                if let Some(ips) = names.by_suffix.get_mut(s) {
                    ips.remove(&ip);
                    if ips.is_empty() {
                        names.by_suffix.remove(s);
                    }
                }
            }
            names.dirty.insert(by_pod);
        }
    }

    /// Whether any record, of any kind, holds `ip`.
    pub(crate) fn is_taken(&self, ip: IpAddr) -> bool {
        let mut names = self.names.borrow_mut();
        let held = !names.of_ip(ip).is_empty();
        names.unlistable || held
    }

    pub fn names(&self, ip: IpAddr) -> Vec<String> {
        self.names.borrow_mut().of_ip(ip)
    }

    fn sorted_ips(&self, keep: impl Fn(&Files) -> bool) -> Vec<IpAddr> {
        let mut names = self.names.borrow_mut();
        names.ensure_all_ips();
        let mut ips: Vec<IpAddr> = names
            .by_ip
            .iter()
            .filter(|(_, f)| keep(f))
            .map(|(ip, _)| *ip)
            .collect();
        ips.sort_unstable();
        ips
    }

    /// Every address that has a record, in order.
    pub fn ips(&self) -> std::vec::IntoIter<IpAddr> {
        self.sorted_ips(|_| true).into_iter()
    }

    /// Addresses with a file named `<ip><suffix>`: one bucket read, however many records.
    pub(crate) fn ips_with_suffix(&self, suffix: &str) -> Vec<IpAddr> {
        let mut names = self.names.borrow_mut();
        let with_suffix =
            |n: &str| n.ends_with(suffix) && parse_name(n).is_some_and(|(_, s)| s == Some(suffix));
        if let Some(found) = names.scan(Bucket::of_suffix(suffix), with_suffix) {
            let ips: BTreeSet<IpAddr> = found
                .iter()
                .filter_map(|n| parse_name(n).map(|(ip, _)| ip))
                .collect();
            return ips.into_iter().collect();
        }
        names
            .by_suffix
            .get(suffix)
            .map(|ips| ips.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Addresses with a plain `<ip>` file (host-local's format).
    pub(crate) fn ips_without_identity(&self) -> Vec<IpAddr> {
        self.sorted_ips(|f| f.plain)
    }

    /// Addresses with at least one `<ip>_<ns>_<pod>` file.
    pub(crate) fn ips_with_identity(&self) -> Vec<IpAddr> {
        self.sorted_ips(|f| !f.named.is_empty())
    }

    /// What the stored index needs: the hashes of buckets kept (`None`: rewrite all), and
    /// the buckets to rewrite with their names. `None` when nothing changed.
    #[allow(clippy::type_complexity)]
    pub(crate) fn to_save(&self) -> Option<(Option<Hashes>, Vec<(Bucket, Vec<String>)>)> {
        let names = self.names.borrow();
        if names.unlistable {
            return None;
        }
        let known = match (&names.backing, names.rebuilt) {
            (Some(b), false) => Some(b.stored.hashes().clone()),
            _ => None,
        };
        if known.is_some() && names.dirty.is_empty() {
            return Some((known, Vec::new()));
        }
        let mut out: HashMap<Bucket, Vec<String>> = HashMap::new();
        let wanted = |b: &Bucket| known.is_none() || names.dirty.contains(b);
        for (ip, files) in &names.by_ip {
            let b = Bucket::of_ip(*ip);
            if wanted(&b) {
                let list = out.entry(b).or_default();
                list.extend(files.plain.then(|| ip.to_string()));
                list.extend(files.named.iter().cloned());
            }
        }
        for (suffix, ips) in &names.by_suffix {
            let b = Bucket::of_suffix(suffix);
            if wanted(&b) {
                out.entry(b)
                    .or_default()
                    .extend(ips.iter().map(|ip| format!("{ip}{suffix}")));
            }
        }
        if let Some(backing) = &names.backing {
            for (b, text) in &backing.texts {
                if wanted(b) {
                    out.entry(*b)
                        .or_default()
                        .extend(text.lines().map(str::to_string));
                }
            }
        }
        if known.is_some() {
            for b in &names.dirty {
                out.entry(*b).or_default();
            }
        }
        let mut changed: Vec<(Bucket, Vec<String>)> = out.into_iter().collect();
        for (_, list) in &mut changed {
            list.sort_unstable();
        }
        changed.sort_unstable_by_key(|(b, _)| *b);
        Some((known, changed))
    }
}

/// The allocator's view of one network's data dir, held under its lock.
pub trait Store {
    fn index(&self) -> &Index;
    /// Reads one record; `None` if the file is gone.
    fn read(&mut self, name: &str) -> Result<Option<Record>, StoreError>;
    /// Creates or replaces `record.name` atomically.
    fn write(&mut self, record: &Record) -> Result<(), StoreError>;
    /// Removes a record file; a missing file is not an error.
    fn remove(&mut self, name: &str) -> Result<(), StoreError>;
    /// Renames a record file atomically, replacing `to` if it exists.
    fn rename(&mut self, from: &str, to: &str) -> Result<(), StoreError>;
    /// The round-robin hint of range set `set`.
    fn last_reserved(&self, set: usize) -> Option<IpAddr>;
    fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), StoreError>;
    /// The next number in the data dir's release order.
    fn next_release_seq(&mut self) -> Result<u64, StoreError>;
    /// A bookkeeping value of the data dir.
    fn note(&self, note: Note) -> Option<String>;
    /// Sets a bookkeeping value; `durable` ones are fsynced like records.
    fn set_note(&mut self, note: Note, value: &str) -> Result<(), StoreError>;
}

/// Bookkeeping kept beside the records, each in a file of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Note {
    /// The boot id the last sweep of earlier boots ran in (`boot_id`).
    Boot,
    /// The lease clock: `<clock> <wall> <next expiry>` (`lease_clock`), see `lifecycle`.
    LeaseClock,
    /// Sticky hit and miss counters for metrics: `<hits> <misses>` (`sticky_counters`).
    Counters,
}

impl Note {
    pub fn file_name(self) -> &'static str {
        match self {
            Note::Boot => "boot_id",
            Note::LeaseClock => "lease_clock",
            Note::Counters => "sticky_counters",
        }
    }

    /// Whether a lost update matters: the boot id does (a repeated sweep is harmless, a
    /// skipped one is not); the clock and counters are hints.
    pub(crate) fn durable(self) -> bool {
        self == Note::Boot
    }
}

#[cfg(any(test, feature = "testing"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: the memory store panics where a test misuses it"
)]
pub mod mem {
    //! An in-memory store for allocator tests.

    use super::*;

    #[derive(Debug, Default)]
    pub struct MemStore {
        pub index: Index,
        pub files: BTreeMap<String, Vec<u8>>,
        pub last: BTreeMap<usize, IpAddr>,
        pub seq: u64,
        pub notes: BTreeMap<Note, String>,
    }

    impl MemStore {
        pub fn put_raw(&mut self, name: &str, body: &[u8]) {
            self.index.insert(name);
            self.files.insert(name.to_string(), body.to_vec());
        }

        pub fn records(&self) -> Vec<Record> {
            self.files
                .iter()
                .filter_map(|(n, b)| Record::parse(n, b))
                .collect()
        }
    }

    impl Store for MemStore {
        fn index(&self) -> &Index {
            &self.index
        }
        fn read(&mut self, name: &str) -> Result<Option<Record>, StoreError> {
            Ok(self.files.get(name).and_then(|b| Record::parse(name, b)))
        }
        fn write(&mut self, record: &Record) -> Result<(), StoreError> {
            self.put_raw(&record.name, &record.to_bytes());
            Ok(())
        }
        fn remove(&mut self, name: &str) -> Result<(), StoreError> {
            self.files.remove(name);
            self.index.remove(name);
            Ok(())
        }
        fn rename(&mut self, from: &str, to: &str) -> Result<(), StoreError> {
            if let Some(body) = self.files.remove(from) {
                self.index.remove(from);
                self.put_raw(to, &body);
            }
            Ok(())
        }
        fn last_reserved(&self, set: usize) -> Option<IpAddr> {
            self.last.get(&set).copied()
        }
        fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), StoreError> {
            self.last.insert(set, ip);
            Ok(())
        }
        fn next_release_seq(&mut self) -> Result<u64, StoreError> {
            self.seq += 1;
            Ok(self.seq)
        }
        fn note(&self, note: Note) -> Option<String> {
            self.notes.get(&note).cloned()
        }
        fn set_note(&mut self, note: Note, value: &str) -> Result<(), StoreError> {
            self.notes.insert(note, value.to_string());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_answers_from_names_alone() {
        let mut ix = Index::default();
        for name in [
            "10.0.0.2",
            "10.0.0.3_ns_a",
            "10.0.0.4_ns_a",
            "10.0.0.4",
            "lock",
            ".tmp.1.0",
        ] {
            ix.insert(name);
        }
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(ix.is_taken(ip("10.0.0.2")) && !ix.is_taken(ip("10.0.0.5")));
        assert_eq!(
            ix.ips_with_suffix("_ns_a"),
            [ip("10.0.0.3"), ip("10.0.0.4")]
        );
        assert_eq!(ix.ips_with_suffix("_s_a"), Vec::<IpAddr>::new());
        assert_eq!(ix.ips_without_identity(), [ip("10.0.0.2"), ip("10.0.0.4")]);
        assert_eq!(ix.ips_with_identity(), [ip("10.0.0.3"), ip("10.0.0.4")]);
        ix.remove("10.0.0.2");
        assert!(!ix.is_taken(ip("10.0.0.2")));
    }

    /// A stored index answers questions about one address or one pod from a bucket's text
    /// (nothing put in the maps); the answers must be those of the complete index, for names
    /// that share a prefix or a suffix with the question, before and after a change.
    #[test]
    fn answers_from_bucket_text_are_the_complete_index_answers() {
        // An address whose text starts with another's, in the same bucket: the one answer a
        // bucket's text could get wrong. (IPv4 has none: such addresses differ only in their
        // last byte, which always moves the bucket.)
        let (short, long) = (1..=0xffu16)
            .flat_map(|x| (1..=0xfffu16).map(move |y| (x, y)))
            .map(|(x, y)| (format!("2001:db8::{x:x}"), format!("2001:db8::{x:x}:{y:x}")))
            .find(|(a, b)| {
                let bucket = |s: &str| Bucket::of_ip(s.parse().unwrap());
                b.len() > a.len() && b.starts_with(a.as_str()) && bucket(a) == bucket(b)
            })
            .unwrap();
        let names = [
            short.clone(),
            format!("{short}_ns_a"),
            format!("{short}_ns_b"),
            long.clone(),
            format!("{long}_ns_a"),
            "10.0.0.1".into(),
            "10.0.0.1_ns_a".into(),
            "10.0.0.10_ns_a".into(),
            "10.0.0.100_x_ns_a".into(),
            "10.0.0.2_x_a".into(),
            "10.0.0.3_a".into(),
            "2001:db8::1".into(),
            "2001:db8::1_ns_a".into(),
            "2001:db8::10_ns_a".into(),
        ];
        let mut complete = Index::default();
        for n in &names {
            complete.insert(n);
        }
        let tmp = tempfile::tempdir().unwrap();
        let (_, changed) = complete.to_save().unwrap();
        super::super::index::save(tmp.path(), None, &changed).unwrap();
        let stored = || Index::stored(Stored::open(tmp.path()).unwrap(), tmp.path());
        let ips: Vec<IpAddr> = [&short, &long, "10.0.0.1", "10.0.0.10", "10.0.0.100"]
            .into_iter()
            .chain([
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.4",
                "2001:db8::1",
                "2001:db8::10",
            ])
            .map(|s| s.parse().unwrap())
            .collect();
        let suffixes = ["_ns_a", "_ns_b", "_x_a", "_s_a", "_a", "_x_ns_a"];
        let same = |ix: &Index, complete: &Index, when: &str| {
            for ip in &ips {
                assert_eq!(ix.names(*ip), complete.names(*ip), "names({ip}) {when}");
                assert_eq!(
                    ix.is_taken(*ip),
                    complete.is_taken(*ip),
                    "is_taken({ip}) {when}"
                );
            }
            for s in suffixes {
                assert_eq!(
                    ix.ips_with_suffix(s),
                    complete.ips_with_suffix(s),
                    "ips_with_suffix({s}) {when}"
                );
            }
        };
        same(&stored(), &complete, "from bucket text");
        let mut changed = stored();
        let _ = changed.ips_with_suffix("_ns_a");
        for ix in [&mut changed, &mut complete] {
            ix.insert("10.0.0.4_ns_a");
            ix.remove(&format!("{short}_ns_a"));
        }
        same(&changed, &complete, "after an insert and a removal");
        // The changed buckets, saved from their edited text, read back the same.
        let (known, buckets) = changed.to_save().unwrap();
        assert!(known.is_some() && !buckets.is_empty());
        super::super::index::save(tmp.path(), known.as_ref(), &buckets).unwrap();
        same(&stored(), &complete, "saved and read back");
        let whole = stored();
        let _ = whole.ips_with_identity();
        same(&whole, &complete, "every address bucket in the maps");
    }
}
