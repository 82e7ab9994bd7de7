//! What the allocator needs from persistence, and nothing more.
//!
//! The allocator (pure policy) reaches the data dir only through [`Store`]; [`crate::ipam::disk`]
//! is the real one and [`mem::MemStore`] a fake for unit tests. Every store keeps an [`Index`] of
//! record file names, read once per call: which addresses are taken and which files belong to a
//! pod is known without opening a file.

#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

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

/// Record file names by address.
#[derive(Debug, Clone, Default)]
pub struct Index {
    by_ip: HashMap<IpAddr, Files>,
}

impl Index {
    /// Adds a name if it is a record name; returns whether it was.
    pub fn insert(&mut self, name: &str) -> bool {
        let Some((ip, suffix)) = parse_name(name) else {
            return false;
        };
        let files = self.by_ip.entry(ip).or_default();
        match suffix {
            None => files.plain = true,
            Some(_) if !files.named.iter().any(|n| n == name) => files.named.push(name.to_string()),
            Some(_) => {}
        }
        true
    }

    pub fn remove(&mut self, name: &str) {
        let Some((ip, suffix)) = parse_name(name) else {
            return;
        };
        if let Some(files) = self.by_ip.get_mut(&ip) {
            match suffix {
                None => files.plain = false,
                Some(_) => files.named.retain(|n| n != name),
            }
            if !files.plain && files.named.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
    }

    /// Whether any record, of any kind, holds `ip`.
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.by_ip.contains_key(&ip)
    }

    pub fn names(&self, ip: IpAddr) -> Vec<String> {
        let Some(files) = self.by_ip.get(&ip) else {
            return Vec::new();
        };
        let plain = files.plain.then(|| ip.to_string());
        plain
            .into_iter()
            .chain(files.named.iter().cloned())
            .collect()
    }

    fn sorted_ips(&self, keep: impl Fn(&Files) -> bool) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
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

    /// Addresses with a file named `<ip><suffix>`.
    pub fn ips_with_suffix(&self, suffix: &str) -> Vec<IpAddr> {
        // Indexed names hold exactly two '_', as does a suffix: a name ending in the
        // suffix is `<ip><suffix>`.
        self.sorted_ips(|f| f.named.iter().any(|n| n.ends_with(suffix)))
    }

    /// Addresses with a plain `<ip>` file (host-local's format).
    pub fn ips_without_identity(&self) -> Vec<IpAddr> {
        self.sorted_ips(|f| f.plain)
    }

    /// Addresses with at least one `<ip>_<ns>_<pod>` file.
    pub fn ips_with_identity(&self) -> Vec<IpAddr> {
        self.sorted_ips(|f| !f.named.is_empty())
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
    pub fn durable(self) -> bool {
        self == Note::Boot
    }
}

#[cfg(test)]
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
}
