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
    let attached = leases.iter().find(|l| l.state == State::Attached);
    records
        .iter()
        .filter(|r| match (&r.body, attached) {
            (Body::Lease(l), Some(_)) => l.state == State::Released,
            (Body::Marker, Some(_)) => true,
            (Body::HostLocal { container_id, .. }, Some(owner)) => {
                *container_id == owner.container_id
            }
            (Body::HostLocal { container_id, .. }, None) => {
                leases.iter().any(|l| l.container_id == *container_id)
            }
            (Body::Lease(l), None) => {
                !host_ids.is_empty() && !host_ids.contains(&l.container_id.as_str())
            }
            (Body::Marker, None) => false,
        })
        .map(|r| r.name.clone())
        .collect()
}
