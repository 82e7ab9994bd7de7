//! DEL: finding an attachment without reading every file, and releasing it into a lease.
//!
//! DEL looks at `prevResult`'s addresses, then the pod's file names; only when they do not
//! find one address per range set (a lease the attachment released before counts, so a
//! repeated DEL reads nothing more) does it read every record without identity (host-local's
//! full scan), and the leases too when the call carried neither a previous result nor a pod
//! name. The container id is always verified, so a late DEL of a dead sandbox releases
//! nothing of its replacement.

use std::net::IpAddr;

use super::allocator::Request;
use super::group::group;
use super::identity::Pod;
use super::record::{Body, Lease, Record, State};
use super::store::{Store, StoreError};

/// Turns an attached lease into a released one, next in the release order.
pub(crate) fn release_lease<S: Store>(
    store: &mut S,
    record: &Record,
    lease: &Lease,
    lease_clock: u64,
) -> Result<(), StoreError> {
    let seq = store.next_release_seq()?;
    let released = Lease {
        state: State::Released,
        release_seq: seq,
        release_clock: lease_clock,
        ..lease.clone()
    };
    store.write(&Record {
        body: Body::Lease(released),
        ..record.clone()
    })
}

/// DEL: releases the attachment (container id, ifname), which holds at most one address in
/// each of the config's `range_sets` (`0` when the config names no ranges: then how many it
/// holds is unknown). Returns how many records it released.
pub fn del<S: Store>(
    store: &mut S,
    req: &Request,
    prev_ips: &[IpAddr],
    range_sets: usize,
) -> Result<usize, StoreError> {
    let mut ips = prev_ips.to_vec();
    if let Some(pod) = req.pod {
        ips.extend(store.index().ips_with_suffix(&pod.suffix()));
    }
    ips.sort();
    ips.dedup();
    let (mut released, mut before) = (0, 0);
    for ip in ips {
        let found = release_in_group(store, req, ip)?;
        released += found.now;
        before += found.before;
    }
    // Fewer than one address per range set, or no ranges to count with: the rest (a previous
    // result that lists only some of them) can only be records without identity. A lease this
    // attachment released before counts as found: a repeated DEL (kubelet sends one when it
    // stops a sandbox and again when it removes it) must not read every host-local record.
    if released + before < range_sets || range_sets == 0 {
        for ip in store.index().ips_without_identity() {
            if store
                .read(&ip.to_string())?
                .is_some_and(|r| r.is_attachment(req.container_id, req.ifname))
            {
                released += release_in_group(store, req, ip)?.now;
            }
        }
    }
    // A DEL with neither a previous result nor a pod name (a runtime that sends neither) can
    // only find a lease by reading every one; runtimes that matter send both.
    if released == 0 && req.pod.is_none() && prev_ips.is_empty() {
        for ip in store.index().ips_with_identity() {
            let names = store.index().names(ip);
            for name in names.iter().filter(|n| n.contains('_')) {
                if store
                    .read(name)?
                    .is_some_and(|r| r.is_attachment(req.container_id, req.ifname))
                {
                    released += release_in_group(store, req, ip)?.now;
                    break;
                }
            }
        }
    }
    Ok(released)
}

/// What [`release_in_group`] found of the attachment at one address.
struct Found {
    /// Records released by this call.
    now: usize,
    /// Leases of the attachment released by an earlier DEL.
    before: usize,
}

fn release_in_group<S: Store>(
    store: &mut S,
    req: &Request,
    ip: IpAddr,
) -> Result<Found, StoreError> {
    let records = group(store, ip)?;
    let before = records
        .iter()
        .filter(|r| {
            r.lease_ref().is_some_and(|l| {
                l.state == State::Released
                    && l.container_id == req.container_id
                    && l.ifname == req.ifname
            })
        })
        .count();
    let mut released = 0;
    for record in records
        .iter()
        .filter(|r| r.is_attachment(req.container_id, req.ifname))
    {
        match (&record.body, req.sticky_pod()) {
            (Body::Lease(lease), _) if req.sticky => {
                release_lease(store, record, lease, req.lease_clock)?
            }
            (Body::HostLocal { .. }, Some(pod)) => {
                // An adopted host-local attachment becomes the pod's released lease, so a
                // migrated pod keeps its address on its first restart. The file is renamed
                // first: a crash in between leaves one `<ip>_<ns>_<pod>` file whose body is
                // not a lease, which reads as a released lease of that pod (a marker), never
                // as two records.
                let name = format!("{ip}{}", pod.suffix());
                store.rename(&record.name, &name)?;
                write_released_lease(store, ip, pod, req)?;
                // An OpenYurt marker naming another pod is superseded by what the DEL said.
                for other in records
                    .iter()
                    .filter(|r| r.body == Body::Marker && r.name != name)
                {
                    store.remove(&other.name)?;
                }
            }
            _ => store.remove(&record.name)?,
        }
        released += 1;
    }
    // The pod's lone marker (OpenYurt's, or a conversion above interrupted after its rename)
    // is already its released lease; a DEL naming the pod gives it a proper lease body.
    if let Some(pod) = req.sticky_pod()
        && released == 0
        && !records
            .iter()
            .any(|r| matches!(r.body, Body::HostLocal { .. }))
        && records
            .iter()
            .any(|r| r.body == Body::Marker && r.name == format!("{ip}{}", pod.suffix()))
    {
        write_released_lease(store, ip, pod, req)?;
    }
    Ok(Found {
        now: released,
        before,
    })
}

/// Writes `pod`'s lease at `ip` as released by this request, next in the release order.
fn write_released_lease<S: Store>(
    store: &mut S,
    ip: IpAddr,
    pod: &Pod,
    req: &Request,
) -> Result<(), StoreError> {
    let lease = Lease {
        state: State::Released,
        release_seq: store.next_release_seq()?,
        release_clock: req.lease_clock,
        ..req.lease(pod)
    };
    store.write(&Record::lease(ip, pod, lease))
}
