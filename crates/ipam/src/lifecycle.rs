//! Keeping the address space healthy without a control plane: earlier boots, lease expiry
//! and GC.
//!
//! - After a reboot no sandbox of the earlier boot is alive: its attached leases become
//!   released leases, once per boot, at the first ADD or GC (GC may never come).
//! - `leaseHold` frees a lease released longer ago than the hold. Time is the data dir's
//!   *lease clock*: it advances with the wall clock between calls, but never backwards and by
//!   at most [`MAX_CLOCK_STEP`] per call, so an NTP catch-up on a box without an RTC cannot
//!   expire every lease at once (a long idle period counts short: leases are kept longer,
//!   never shorter).
//! - GC releases attachments the runtime no longer knows; leases are kept as released leases.
//!
//! Each pass first *plans* its [`Change`]s, so the operator's tool can show them without
//! applying them.

use std::net::IpAddr;

use super::del::release_lease;
use super::group::group;
use super::record::{Body, Record, State};
use super::store::{Note, Store, StoreError};
use cni_protocol::Attachment;

/// The most the lease clock advances in one call, in seconds.
pub(crate) const MAX_CLOCK_STEP: u64 = 3600;

/// What a pass would do to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub record: Record,
    pub action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Attached lease → released lease (kept for its pod).
    Release,
    /// File removed: the address is free again.
    Remove,
}

/// Applies planned changes (a lease released at `lease_clock`); keeps going after an error and
/// returns every error.
pub fn apply<S: Store>(store: &mut S, changes: &[Change], lease_clock: u64) -> Vec<StoreError> {
    let mut errors = Vec::new();
    for change in changes {
        let result = match (&change.action, &change.record.body) {
            (Action::Release, Body::Lease(lease)) => {
                release_lease(store, &change.record, lease, lease_clock)
            }
            _ => store.remove(&change.record.name),
        };
        errors.extend(result.err());
    }
    errors
}

/// The data dir's lease clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseClock {
    /// Lease-clock seconds now; `releasedAt` of a lease is on this clock.
    pub now: u64,
    wall: u64,
    /// The clock value at which the next lease expires; `None` when unknown.
    pub next_expiry: Option<u64>,
}

impl LeaseClock {
    /// Reads the clock and advances it to `wall` (Unix seconds), clamped.
    pub fn advance<S: Store>(store: &S, wall: u64) -> LeaseClock {
        let saved = store.note(Note::LeaseClock).and_then(|text| {
            let mut parts = text.split_whitespace();
            let now: u64 = parts.next()?.parse().ok()?;
            let last_wall: u64 = parts.next()?.parse().ok()?;
            let next = parts.next().and_then(|t| t.parse().ok());
            Some((now, last_wall, next))
        });
        match saved {
            Some((now, last_wall, next_expiry)) => LeaseClock {
                now: now + wall.saturating_sub(last_wall).min(MAX_CLOCK_STEP),
                wall,
                next_expiry,
            },
            None => LeaseClock {
                now: 0,
                wall,
                next_expiry: None,
            },
        }
    }

    pub(crate) fn save<S: Store>(&self, store: &mut S) -> Result<(), StoreError> {
        let next = self
            .next_expiry
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into());
        store.set_note(
            Note::LeaseClock,
            &format!("{} {} {next}", self.now, self.wall),
        )
    }

    /// Records that a lease released now expires after `hold`.
    pub(crate) fn released_one(&mut self, hold: u64) {
        self.next_expiry = self
            .next_expiry
            .map(|n| n.min(self.now.saturating_add(hold)));
    }

    /// Whether an expiry pass could free anything.
    pub(crate) fn expiry_due(&self) -> bool {
        self.next_expiry.is_none_or(|due| self.now >= due)
    }
}

/// Attached leases of an earlier boot, unless this boot was already swept.
pub(crate) fn plan_boot_sweep<S: Store>(
    store: &mut S,
    boot: &str,
) -> Result<Vec<Change>, StoreError> {
    if boot.is_empty() || store.note(Note::Boot).as_deref() == Some(boot) {
        return Ok(Vec::new());
    }
    let mut changes = Vec::new();
    for ip in store.index().ips_with_identity() {
        for record in group(store, ip)? {
            if let Body::Lease(lease) = &record.body
                && lease.state == State::Attached
                && lease.boot != boot
            {
                changes.push(Change {
                    record,
                    action: Action::Release,
                });
            }
        }
    }
    Ok(changes)
}

/// Applies the boot sweep and remembers this boot. Returns how many leases it released.
pub(crate) fn sweep_earlier_boots<S: Store>(
    store: &mut S,
    boot: &str,
    lease_clock: u64,
) -> Result<usize, StoreError> {
    if boot.is_empty() || store.note(Note::Boot).as_deref() == Some(boot) {
        return Ok(0);
    }
    let changes = plan_boot_sweep(store, boot)?;
    if let Some(err) = apply(store, &changes, lease_clock).into_iter().next() {
        return Err(err);
    }
    store.set_note(Note::Boot, boot)?;
    Ok(changes.len())
}

/// Released leases (and OpenYurt markers) older than `hold` on the lease clock. Also
/// computes when the next one will be due.
pub(crate) fn plan_expiry<S: Store>(
    store: &mut S,
    hold: u64,
    clock: &mut LeaseClock,
) -> Result<Vec<Change>, StoreError> {
    let mut changes = Vec::new();
    let mut next = u64::MAX;
    for ip in store.index().ips_with_identity() {
        let records = group(store, ip)?;
        let attached = records.iter().any(is_attached);
        for record in records {
            let released = match &record.body {
                Body::Lease(l) if l.state == State::Released => l.release_clock,
                Body::Marker if !attached => 0,
                _ => continue,
            };
            let due = released.saturating_add(hold);
            if clock.now >= due {
                changes.push(Change {
                    record,
                    action: Action::Remove,
                });
            } else {
                next = next.min(due);
            }
        }
    }
    clock.next_expiry = Some(next);
    Ok(changes)
}

/// Frees expired leases when one may be due. Returns how many it freed.
pub fn expire<S: Store>(
    store: &mut S,
    hold: u64,
    clock: &mut LeaseClock,
) -> Result<usize, StoreError> {
    if !clock.expiry_due() {
        return Ok(0);
    }
    let changes = plan_expiry(store, hold, clock)?;
    match apply(store, &changes, clock.now).into_iter().next() {
        Some(err) => Err(err),
        None => Ok(changes.len()),
    }
}

fn is_attached(record: &Record) -> bool {
    match &record.body {
        Body::HostLocal { .. } => true,
        Body::Lease(l) => l.state == State::Attached,
        Body::Marker => false,
        // It may be a live sandbox's lease of a newer format.
        Body::Held(_) => true,
    }
}

/// Attachments not in `valid`: leases are released (kept) when `keep_leases`, anything else
/// removed. Errors reading one address do not stop the others.
pub(crate) fn plan_gc<S: Store>(
    store: &mut S,
    valid: &[Attachment],
    keep_leases: bool,
) -> (Vec<Change>, Vec<StoreError>) {
    let mut changes = Vec::new();
    let mut errors = Vec::new();
    let ips: Vec<IpAddr> = store.index().ips().collect();
    for ip in ips {
        let records = match group(store, ip) {
            Ok(records) => records,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for record in records {
            let (container_id, ifname) = match &record.body {
                Body::HostLocal {
                    container_id,
                    ifname,
                } => (container_id.clone(), ifname.clone()),
                Body::Lease(l) if l.state == State::Attached => {
                    (l.container_id.clone(), Some(l.ifname.clone()))
                }
                _ => continue,
            };
            let known = valid.iter().any(|a| {
                a.container_id == container_id && ifname.as_deref().is_none_or(|i| i == a.ifname)
            });
            if !known {
                let action = match record.body {
                    Body::Lease(_) if keep_leases => Action::Release,
                    _ => Action::Remove,
                };
                changes.push(Change { record, action });
            }
        }
    }
    (changes, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    fn lease(cid: &str, state: &str, released_at: u64) -> String {
        format!(
            r#"{{"format":"sticky-ipam/v1","containerId":"{cid}","ifname":"eth0","namespace":"ns","pod":"{cid}","podUid":"","boot":"boot1","state":"{state}","releaseSeq":1,"releasedAt":{released_at}}}"#
        )
    }

    #[test]
    fn clock_never_runs_backwards_and_clamps_jumps() {
        let mut s = MemStore::default();
        let c = LeaseClock::advance(&s, 1_000);
        assert_eq!(c.now, 0);
        c.save(&mut s).unwrap();
        let c = LeaseClock::advance(&s, 1_100);
        assert_eq!(c.now, 100);
        c.save(&mut s).unwrap();
        let c = LeaseClock::advance(&s, 50);
        assert_eq!(c.now, 100, "wall clock went back");
        c.save(&mut s).unwrap();
        let c = LeaseClock::advance(&s, 50 + 1_000_000_000);
        assert_eq!(c.now, 100 + MAX_CLOCK_STEP, "NTP catch-up");
    }

    #[test]
    fn boot_sweep_releases_attached_leases_of_earlier_boots_once() {
        let mut s = MemStore::default();
        s.put_raw("10.0.0.2_ns_a", lease("a", "attached", 0).as_bytes());
        s.put_raw("10.0.0.3", b"anon\r\neth0");
        assert_eq!(sweep_earlier_boots(&mut s, "boot2", 7).unwrap(), 1);
        assert_eq!(sweep_earlier_boots(&mut s, "boot2", 7).unwrap(), 0);
        let r = s
            .records()
            .into_iter()
            .find(|r| r.name == "10.0.0.2_ns_a")
            .unwrap();
        assert!(
            matches!(r.body, Body::Lease(ref l) if l.state == State::Released && l.release_clock == 7)
        );
        assert!(
            s.files.contains_key("10.0.0.3"),
            "host-local records carry no boot: kept"
        );
    }

    #[test]
    fn expiry_frees_old_releases_only_and_knows_when_to_look_again() {
        let mut s = MemStore::default();
        s.put_raw("10.0.0.2_ns_a", lease("a", "released", 10).as_bytes());
        s.put_raw("10.0.0.3_ns_b", lease("b", "released", 550).as_bytes());
        s.put_raw("10.0.0.4_ns_c", lease("c", "attached", 0).as_bytes());
        let mut clock = LeaseClock {
            now: 600,
            wall: 0,
            next_expiry: None,
        };
        assert_eq!(expire(&mut s, 100, &mut clock).unwrap(), 1);
        assert!(!s.files.contains_key("10.0.0.2_ns_a"));
        assert_eq!(clock.next_expiry, Some(650));
        assert!(!clock.expiry_due());
        assert_eq!(expire(&mut s, 100, &mut clock).unwrap(), 0);
        assert_eq!(s.files.len(), 2);
        clock.now = 650;
        assert_eq!(expire(&mut s, 100, &mut clock).unwrap(), 1);
        assert_eq!(s.files.keys().collect::<Vec<_>>(), ["10.0.0.4_ns_c"]);
    }

    #[test]
    fn gc_releases_unknown_attachments_and_keeps_leases() {
        let mut s = MemStore::default();
        s.put_raw("10.0.0.2_ns_a", lease("a", "attached", 0).as_bytes());
        s.put_raw("10.0.0.3_ns_b", lease("b", "attached", 0).as_bytes());
        s.put_raw("10.0.0.4", b"anon\r\neth0");
        s.put_raw("10.0.0.5", b"kept\r\neth0");
        let valid = [
            Attachment {
                container_id: "b".into(),
                ifname: "eth0".into(),
            },
            Attachment {
                container_id: "kept".into(),
                ifname: "eth0".into(),
            },
        ];
        let (changes, errors) = plan_gc(&mut s, &valid, true);
        assert!(errors.is_empty());
        let names: Vec<(&str, Action)> = changes
            .iter()
            .map(|c| (c.record.name.as_str(), c.action))
            .collect();
        assert_eq!(
            names,
            [
                ("10.0.0.2_ns_a", Action::Release),
                ("10.0.0.4", Action::Remove)
            ]
        );
        assert!(apply(&mut s, &changes, 3).is_empty());
        assert_eq!(
            s.files.keys().collect::<Vec<_>>(),
            ["10.0.0.2_ns_a", "10.0.0.3_ns_b", "10.0.0.5"]
        );
    }
}
