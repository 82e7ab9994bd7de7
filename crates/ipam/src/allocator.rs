//! Allocation policy: which address a call gets, which lease it keeps, what DEL releases.
//!
//! Pure policy over [`Store`]: no paths, no clock, no environment. Per range set, ADD takes the
//! first that applies:
//! 1. the attachment (container id, ifname) already recorded (ADD is idempotent);
//! 2. a requested address: free, or the pod's own lease;
//! 3. the pod's lease: a released one is simply taken; an attached one only when it cannot
//!    belong to a live sandbox (same pod UID, attached in an earlier boot, or no UID on either
//!    side); a lease outside the ranges, or on an address now reserved (a moved gateway), is
//!    dropped;
//! 4. the next never-held address, round-robin from `last_reserved_ip.<N>` as host-local;
//! 5. if the policy allows, the lease released longest ago (lowest release number);
//! 6. else "range exhausted".
//!
//! The whole ADD is planned before anything is written, so a failure in one range set changes
//! nothing. DEL and CHECK live in [`super::del`] and [`super::check`].

use std::net::IpAddr;

use super::config::{IpamConfig, WhenExhausted};
use super::group::group;
use super::identity::Pod;
use super::range::{Range, RangeSet};
use super::record::{Body, LEASE_FORMAT, Lease, Record, State};
use super::store::{Store, StoreError};
use sticky_primitives::crash;

/// Who is asking, and when.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// The pod named in CNI_ARGS, if any.
    pub pod: Option<&'a Pod>,
    /// Whether released attachments with a pod identity are kept as leases.
    pub sticky: bool,
    /// The current kernel boot id ("" if unknown).
    pub boot: &'a str,
    /// The data dir's lease clock now, in its seconds ([`super::lifecycle::LeaseClock`]): what a
    /// lease released by this call records.
    pub lease_clock: u64,
}

impl Request<'_> {
    /// The pod whose leases this call works with: none when stickiness is off, so ADD then
    /// behaves exactly as host-local.
    pub(crate) fn sticky_pod(&self) -> Option<&Pod> {
        self.pod.filter(|_| self.sticky)
    }

    /// `pod`'s lease, attached to this request's sandbox.
    pub(crate) fn lease(&self, pod: &Pod) -> Lease {
        Lease {
            format: LEASE_FORMAT.into(),
            container_id: self.container_id.into(),
            ifname: self.ifname.into(),
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            pod_uid: pod.uid.clone(),
            boot: self.boot.into(),
            state: State::Attached,
            release_seq: 0,
            release_clock: 0,
        }
    }
}

/// One address handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub ip: IpAddr,
    pub range: Range,
    /// The attachment already existed or the pod took its own lease back (a sticky hit).
    pub kept: bool,
}

/// Where host-local refuses the same request, the words are host-local's (1.1.1): scripts and
/// tests written against it grep for them. `index` is the range set's position.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("failed to allocate for range {index}: no IP addresses available in range set: {set}")]
    Exhausted { index: usize, set: String },
    #[error("failed to allocate for range {index}: requested ip {ip} is subnet's gateway")]
    RequestedGateway { index: usize, ip: IpAddr },
    #[error(
        "failed to allocate for range {index}: requested IP address {ip} is not available in range set {set}"
    )]
    RequestedTaken {
        index: usize,
        ip: IpAddr,
        set: String,
    },
    #[error("requested IP address {ip} is not available: {why}")]
    RequestedUnavailable { ip: IpAddr, why: &'static str },
    /// Requested addresses no range set can serve: outside every range, or a second one for
    /// the same range set.
    #[error("failed to allocate all requested IPs:{}", list(.0))]
    RequestedUnfulfilled(Vec<IpAddr>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter().map(|ip| format!(" {ip}")).collect()
}

/// Matches requested addresses to range sets, before anything on disk is touched.
pub(crate) fn assign_requested(config: &IpamConfig) -> Result<Vec<Option<IpAddr>>, AllocError> {
    let mut per_set = vec![None; config.range_sets.len()];
    let mut unfulfilled = Vec::new();
    for &ip in &config.requested {
        let Some((index, range)) = config
            .range_sets
            .iter()
            .enumerate()
            .find_map(|(i, set)| set.range_for(ip).map(|r| (i, r)))
        else {
            unfulfilled.push(ip);
            continue;
        };
        if ip == range.gateway {
            return Err(AllocError::RequestedGateway { index, ip });
        }
        if range.is_reserved(ip) {
            return Err(AllocError::RequestedUnavailable {
                ip,
                why: "it is the network or broadcast address",
            });
        }
        match per_set[index] {
            Some(_) => unfulfilled.push(ip),
            None => per_set[index] = Some(ip),
        }
    }
    match unfulfilled.is_empty() {
        true => Ok(per_set),
        false => Err(AllocError::RequestedUnfulfilled(unfulfilled)),
    }
}

/// A pod's hold on one address.
#[derive(Debug, Clone)]
struct Hold {
    ip: IpAddr,
    /// Every file of the address (all replaced when the pod takes it).
    names: Vec<String>,
    state: HoldState,
}

#[derive(Debug, Clone)]
enum HoldState {
    Attached {
        container_id: String,
        ifname: Option<String>,
        uid: String,
        boot: Option<String>,
    },
    Released {
        seq: u64,
    },
}

impl Hold {
    fn is_attachment(&self, req: &Request) -> bool {
        matches!(&self.state, HoldState::Attached { container_id, ifname, .. }
            if container_id == req.container_id && ifname.as_deref().is_none_or(|i| i == req.ifname))
    }

    /// Whether `req` may take this hold: never from a sandbox that may still be alive.
    fn can_take(&self, req: &Request) -> bool {
        let uid = req.pod.map(|p| p.uid.as_str()).unwrap_or_default();
        match &self.state {
            HoldState::Released { .. } => true,
            HoldState::Attached {
                uid: held_uid,
                boot,
                ..
            } => {
                // A lease from an earlier boot cannot be alive; with no boot id known on
                // either side, nothing is judged to be from an earlier boot.
                let earlier_boot = boot
                    .as_deref()
                    .is_some_and(|b| !b.is_empty() && !req.boot.is_empty() && b != req.boot);
                (!uid.is_empty() && held_uid == uid)
                    || earlier_boot
                    || (uid.is_empty() && held_uid.is_empty())
            }
        }
    }

    /// Preference among a pod's takeable holds: an attached one (the sandbox being replaced),
    /// then the most recently released.
    fn rank(&self) -> (bool, u64) {
        match self.state {
            HoldState::Attached { .. } => (true, 0),
            HoldState::Released { seq } => (false, seq),
        }
    }
}

/// Every hold of `pod` on interface `ifname`, found by file name.
fn holds<S: Store>(store: &mut S, pod: &Pod, ifname: &str) -> Result<Vec<Hold>, StoreError> {
    let suffix = pod.suffix();
    let mut out = Vec::new();
    for ip in store.index().ips_with_suffix(&suffix) {
        let records = group(store, ip)?;
        let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
        let own_name = format!("{ip}{suffix}");
        let host_local = records.iter().find_map(|r| match &r.body {
            Body::HostLocal {
                container_id,
                ifname,
            } => Some((container_id.clone(), ifname.clone())),
            _ => None,
        });
        for r in records.iter().filter(|r| r.name == own_name) {
            let state = match &r.body {
                Body::Lease(l)
                    if l.namespace == pod.namespace && l.pod == pod.name && l.ifname == ifname =>
                {
                    match l.state {
                        State::Attached => HoldState::Attached {
                            container_id: l.container_id.clone(),
                            ifname: Some(l.ifname.clone()),
                            uid: l.pod_uid.clone(),
                            boot: Some(l.boot.clone()),
                        },
                        State::Released => HoldState::Released { seq: l.release_seq },
                    }
                }
                // OpenYurt's layout: the marker names the pod, `<ip>` holds the attachment.
                Body::Marker => match &host_local {
                    Some((container_id, ifname)) => HoldState::Attached {
                        container_id: container_id.clone(),
                        ifname: ifname.clone(),
                        uid: String::new(),
                        boot: None,
                    },
                    None => HoldState::Released { seq: 0 },
                },
                _ => continue,
            };
            out.push(Hold {
                ip,
                names: names.clone(),
                state,
            });
        }
    }
    Ok(out)
}

/// The attachment without pod identity for (container id, ifname): host-local's full scan.
fn find_host_local<S: Store>(
    store: &mut S,
    req: &Request,
    set: &RangeSet,
) -> Result<Option<IpAddr>, StoreError> {
    for ip in store.index().ips_without_identity() {
        if set.contains(ip)
            && store
                .read(&ip.to_string())?
                .is_some_and(|r| r.is_attachment(req.container_id, req.ifname))
        {
            return Ok(Some(ip));
        }
    }
    Ok(None)
}

/// What ADD will do in one range set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The attachment is already recorded.
    Existing(IpAddr),
    /// The pod's own lease (released, or attached to a sandbox that cannot be alive).
    Take { ip: IpAddr, replaces: Vec<String> },
    /// A never-held (or requested free) address.
    New(IpAddr),
    /// Another pod's lease, released longest ago.
    Reclaim { ip: IpAddr, victims: Vec<String> },
}

/// A whole ADD, planned: nothing written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddPlan {
    pub sets: Vec<Plan>,
    /// Files of the pod's leases outside every configured range, or on an address the
    /// config now reserves (the config changed).
    pub drops: Vec<String>,
}

impl Plan {
    pub fn ip(&self) -> IpAddr {
        match self {
            Plan::Existing(ip)
            | Plan::New(ip)
            | Plan::Take { ip, .. }
            | Plan::Reclaim { ip, .. } => *ip,
        }
    }
}

/// Plans an ADD: one address per range set. Reads, and removes only crash leftovers.
pub fn plan<S: Store>(
    store: &mut S,
    config: &IpamConfig,
    req: &Request,
    requested: &[Option<IpAddr>],
) -> Result<AddPlan, AllocError> {
    let holds = match req.sticky_pod() {
        Some(pod) => holds(store, pod, req.ifname)?,
        None => Vec::new(),
    };
    let drops = holds
        .iter()
        .filter(|h| {
            !config.range_sets.iter().any(|s| s.is_assignable(h.ip))
                && h.can_take(req)
                && !h.is_attachment(req)
        })
        .flat_map(|h| h.names.iter().cloned())
        .collect();

    let mut plans: Vec<Plan> = Vec::new();
    for (index, set) in config.range_sets.iter().enumerate() {
        let chosen: Vec<IpAddr> = plans.iter().map(Plan::ip).collect();
        let mine: Vec<&Hold> = holds.iter().filter(|h| set.contains(h.ip)).collect();
        let existing = match mine.iter().find(|h| h.is_attachment(req)) {
            Some(h) => Some(h.ip),
            None if req.sticky_pod().is_none() => find_host_local(store, req, set)?,
            None => None,
        };
        let take = |h: &Hold| Plan::Take {
            ip: h.ip,
            replaces: h.names.clone(),
        };
        let plan = if let Some(ip) = existing {
            Plan::Existing(ip)
        } else if let Some(ip) = requested.get(index).copied().flatten() {
            match mine.iter().find(|h| h.ip == ip && h.can_take(req)) {
                Some(h) => take(h),
                None if !store.index().is_taken(ip) => Plan::New(ip),
                None => {
                    return Err(AllocError::RequestedTaken {
                        index,
                        ip,
                        set: set.to_string(),
                    });
                }
            }
        } else if let Some(h) = mine
            .iter()
            .filter(|h| h.can_take(req) && set.is_assignable(h.ip))
            .max_by_key(|h| h.rank())
        {
            take(h)
        } else if let Some(ip) = next_free(store, set, store.last_reserved(index), &chosen) {
            Plan::New(ip)
        } else if config.when_exhausted == WhenExhausted::Reclaim {
            match oldest_released(store, set)? {
                Some((ip, victims)) => Plan::Reclaim { ip, victims },
                None => {
                    return Err(AllocError::Exhausted {
                        index,
                        set: set.to_string(),
                    });
                }
            }
        } else {
            return Err(AllocError::Exhausted {
                index,
                set: set.to_string(),
            });
        };
        plans.push(plan);
    }
    Ok(AddPlan { sets: plans, drops })
}

/// ADD: plans, then writes.
pub fn add<S: Store>(
    store: &mut S,
    config: &IpamConfig,
    req: &Request,
    requested: &[Option<IpAddr>],
) -> Result<Vec<Allocation>, AllocError> {
    let AddPlan { sets: plans, drops } = plan(store, config, req, requested)?;
    crash::point("add planned");
    for name in &drops {
        store.remove(name)?;
    }
    let mut out = Vec::new();
    for (index, plan) in plans.into_iter().enumerate() {
        let ip = plan.ip();
        let kept = matches!(plan, Plan::Existing(_) | Plan::Take { .. });
        match plan {
            Plan::Existing(_) => {}
            Plan::Take { replaces, .. } => {
                let record = new_record(ip, req);
                store.write(&record)?;
                for name in replaces.iter().filter(|n| **n != record.name) {
                    store.remove(name)?;
                }
            }
            Plan::New(_) => {
                store.write(&new_record(ip, req))?;
                store.set_last_reserved(index, ip)?;
            }
            Plan::Reclaim { victims, .. } => {
                // Remove first: a crash in between leaves the address free, never shared.
                for name in &victims {
                    store.remove(name)?;
                }
                store.write(&new_record(ip, req))?;
                store.set_last_reserved(index, ip)?;
            }
        }
        let range = config.range_sets[index].range_for(ip).cloned();
        // Every planned address came from this set's ranges.
        if let Some(range) = range {
            out.push(Allocation { ip, range, kept });
        }
    }
    Ok(out)
}

/// Whether range set `index` could serve one more new pod: a never-held address, or a
/// released lease when `when_exhausted` lets a new pod reclaim one.
pub(crate) fn has_room<S: Store>(
    store: &mut S,
    set: &RangeSet,
    index: usize,
    when_exhausted: WhenExhausted,
) -> Result<bool, StoreError> {
    Ok(
        next_free(store, set, store.last_reserved(index), &[]).is_some()
            || (when_exhausted == WhenExhausted::Reclaim && oldest_released(store, set)?.is_some()),
    )
}

fn next_free<S: Store>(
    store: &S,
    set: &RangeSet,
    last: Option<IpAddr>,
    chosen: &[IpAddr],
) -> Option<IpAddr> {
    set.round_robin(last)
        .map(|(ip, _)| ip)
        .find(|ip| !store.index().is_taken(*ip) && !chosen.contains(ip))
}

/// The released lease of `set` released longest ago, and its files.
fn oldest_released<S: Store>(
    store: &mut S,
    set: &RangeSet,
) -> Result<Option<(IpAddr, Vec<String>)>, StoreError> {
    let mut best: Option<((u64, u64, IpAddr), Vec<String>)> = None;
    for ip in store.index().ips_with_identity() {
        // A lease on an address the config now reserves (a moved gateway) is never handed out.
        if !set.is_assignable(ip) {
            continue;
        }
        let records = group(store, ip)?;
        let mut key: Option<(u64, u64)> = None;
        let mut held = false;
        for r in &records {
            match &r.body {
                Body::Lease(l) if l.state == State::Released => {
                    key = key
                        .min(Some((l.release_seq, l.release_clock)))
                        .or(Some((l.release_seq, l.release_clock)));
                }
                Body::Marker => key = Some((0, 0)),
                _ => held = true,
            }
        }
        if let (false, Some((seq, at))) = (held, key) {
            let candidate = (seq, at, ip);
            if best.as_ref().is_none_or(|(k, _)| candidate < *k) {
                best = Some((candidate, records.iter().map(|r| r.name.clone()).collect()));
            }
        }
    }
    Ok(best.map(|((_, _, ip), names)| (ip, names)))
}

fn new_record(ip: IpAddr, req: &Request) -> Record {
    match req.sticky_pod() {
        Some(pod) => Record::lease(ip, pod, req.lease(pod)),
        None => Record::host_local(ip, req.container_id, req.ifname),
    }
}

#[cfg(test)]
mod tests;
