//! A [`Store`] overlay that keeps every change in memory: the real policy code (boot sweep,
//! expiry, ADD planning, even crash-leftover cleanup in `group`) runs over it unchanged, and
//! the data dir underneath is only read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::record::Record;
use crate::store::{Index, Note, Store, StoreError};

/// Release numbers handed out by the overlay start here: above any real one, so a preview
/// orders its own releases after every existing lease, as the real call would.
pub(crate) const PREVIEW_SEQ_BASE: u64 = 1 << 62;

/// Reads through to `inner`; writes stay here.
#[derive(Debug)]
pub(crate) struct DryRun<'a, S: Store> {
    inner: &'a mut S,
    index: Index,
    /// Written records, or `None` for removed files.
    changed: BTreeMap<String, Option<Record>>,
    last: BTreeMap<usize, IpAddr>,
    notes: BTreeMap<Note, String>,
    seq: u64,
}

impl<'a, S: Store> DryRun<'a, S> {
    pub fn new(inner: &'a mut S) -> DryRun<'a, S> {
        DryRun {
            index: inner.index().clone(),
            inner,
            changed: BTreeMap::new(),
            last: BTreeMap::new(),
            notes: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<S: Store> Store for DryRun<'_, S> {
    fn index(&self) -> &Index {
        &self.index
    }

    fn read(&mut self, name: &str) -> Result<Option<Record>, StoreError> {
        match self.changed.get(name) {
            Some(record) => Ok(record.clone()),
            None => self.inner.read(name),
        }
    }

    fn write(&mut self, record: &Record) -> Result<(), StoreError> {
        self.index.insert(&record.name);
        self.changed
            .insert(record.name.clone(), Some(record.clone()));
        Ok(())
    }

    fn remove(&mut self, name: &str) -> Result<(), StoreError> {
        self.index.remove(name);
        self.changed.insert(name.to_string(), None);
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), StoreError> {
        // The body is read again under its new name, as the disk would.
        if let Some(record) = self
            .read(from)?
            .and_then(|r| Record::parse(to, &r.to_bytes()))
        {
            self.remove(from)?;
            self.write(&record)?;
        }
        Ok(())
    }

    fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        self.last
            .get(&set)
            .copied()
            .or_else(|| self.inner.last_reserved(set))
    }

    fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), StoreError> {
        self.last.insert(set, ip);
        Ok(())
    }

    fn next_release_seq(&mut self) -> Result<u64, StoreError> {
        self.seq += 1;
        Ok(PREVIEW_SEQ_BASE + self.seq)
    }

    fn note(&self, note: Note) -> Option<String> {
        self.notes
            .get(&note)
            .cloned()
            .or_else(|| self.inner.note(note))
    }

    fn set_note(&mut self, note: Note, value: &str) -> Result<(), StoreError> {
        self.notes.insert(note, value.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    #[test]
    fn changes_stay_in_the_overlay() {
        let mut inner = MemStore::default();
        inner.put_raw("10.0.0.2", b"a\r\neth0");
        {
            let mut dry = DryRun::new(&mut inner);
            dry.remove("10.0.0.2").unwrap();
            dry.write(&Record::host_local(
                "10.0.0.3".parse().unwrap(),
                "b",
                "eth0",
            ))
            .unwrap();
            dry.set_note(Note::Boot, "x").unwrap();
            assert_eq!(dry.read("10.0.0.2").unwrap(), None);
            assert!(dry.read("10.0.0.3").unwrap().is_some());
            assert!(!dry.index().is_taken("10.0.0.2".parse().unwrap()));
            assert_eq!(dry.note(Note::Boot).as_deref(), Some("x"));
            assert!(dry.next_release_seq().unwrap() > PREVIEW_SEQ_BASE);
        }
        assert_eq!(inner.files.keys().collect::<Vec<_>>(), ["10.0.0.2"]);
        assert!(inner.notes.is_empty() && inner.seq == 0);
    }
}
