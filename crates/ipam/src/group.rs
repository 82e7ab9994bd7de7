//! One address's records, with what a crash left behind resolved.
//!
//! Several files for one address exist only after a crash between two steps of one operation
//! (or when something other than this plugin wrote the data dir). [`group`] reads them all and
//! removes the ones the interrupted operation meant to remove.

use std::net::IpAddr;

use super::record::{Body, Lease, Record, State};
use super::store::{Store, StoreError};

/// Reads every record of `ip` and removes what a crash left behind: a released lease, marker
/// or old host-local file shadowed by an attached lease; a host-local file whose lease
/// conversion finished; a released lease under a live host-local attachment.
pub fn group<S: Store>(store: &mut S, ip: IpAddr) -> Result<Vec<Record>, StoreError> {
    let mut records = Vec::new();
    for name in store.index().names(ip) {
        if let Some(r) = store.read(&name)? {
            records.push(r);
        }
    }
    if records.len() > 1 {
        let stale = stale_names(&records);
        for name in &stale {
            store.remove(name)?;
        }
        records.retain(|r| !stale.contains(&r.name));
    }
    Ok(records)
}

fn stale_names(records: &[Record]) -> Vec<String> {
    let leases: Vec<&Lease> = records.iter().filter_map(Record::lease_ref).collect();
    let host_ids: Vec<&str> = records
        .iter()
        .filter_map(|r| match &r.body {
            Body::HostLocal { container_id, .. } => Some(container_id.as_str()),
            _ => None,
        })
        .collect();
    let attached = leases.iter().any(|l| l.state == State::Attached);
    records
        .iter()
        .filter(|r| match (&r.body, attached) {
            (Body::Lease(l), true) => l.state == State::Released,
            (Body::Marker, true) => true,
            // Only a takeover of `<ip>` + marker (its sandbox judged dead) writes an attached
            // lease beside a host-local file, and it removes that file next: whatever
            // container the file names, it is the leftover, never the lease.
            (Body::HostLocal { .. }, true) => true,
            (Body::HostLocal { container_id, .. }, false) => {
                leases.iter().any(|l| l.container_id == *container_id)
            }
            (Body::Lease(l), false) => {
                !host_ids.is_empty() && !host_ids.contains(&l.container_id.as_str())
            }
            (Body::Marker, false) => false,
            // Unreadable: not known to be a leftover, so never removed.
            (Body::Held(_), _) => false,
        })
        .map(|r| r.name.clone())
        .collect()
}
