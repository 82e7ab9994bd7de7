//! Byte-for-byte snapshots of a data dir, for "nothing changed" assertions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every file and directory under `root` (relative path → bytes; directories end in `/` and
/// map to nothing), for "byte-for-byte unchanged" assertions.
pub type Snapshot = BTreeMap<String, Vec<u8>>;

pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    if root.exists() {
        walk(root, root, &mut out);
    }
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        // sticky-ipam's name index is derived data, restamped by every call that writes.
        if e.file_name() == super::ipam_disk::INDEX_DIR {
            continue;
        }
        let path = e.path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.insert(format!("{rel}/"), Vec::new());
            walk(root, &path, out);
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            out.insert(
                format!("{rel}@"),
                target.to_string_lossy().into_owned().into_bytes(),
            );
        } else {
            out.insert(rel, std::fs::read(&path).unwrap());
        }
    }
}

/// Asserts two snapshots are equal except for `lease_clock`, naming the differences.
///
/// `lease_clock` is the clamped clock's memory (`<clock> <wall> <next expiry>`): any call that
/// opens the store may advance it when a second has passed, so it is not part of "nothing
/// changed" for calls that reach the store. [`assert_same_strict`] compares it too.
pub fn assert_same(before: &Snapshot, after: &Snapshot, what: &str) {
    let strip = |s: &Snapshot| -> Snapshot {
        s.iter()
            .filter(|(k, _)| !k.ends_with("/lease_clock"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_same_strict(&strip(before), &strip(after), what);
}

/// Asserts two snapshots are byte-for-byte equal, naming the differences.
pub fn assert_same_strict(before: &Snapshot, after: &Snapshot, what: &str) {
    if before == after {
        return;
    }
    let mut diffs = Vec::new();
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for k in keys {
        match (before.get(k), after.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => diffs.push(format!(
                "changed {k}: {:?} -> {:?}",
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b)
            )),
            (Some(_), None) => diffs.push(format!("removed {k}")),
            (None, Some(b)) => diffs.push(format!("added {k}: {:?}", String::from_utf8_lossy(b))),
            (None, None) => {}
        }
    }
    panic!("{what}: data dir changed:\n  {}", diffs.join("\n  "));
}
