//! CHECK: a previous result against the data dir.
//!
//! Every address of `prevResult` that belongs to this network must be recorded for the
//! attachment (container id, ifname). What belongs to this network: an address in its ranges,
//! or one any record of its data dir holds (the ranges may have moved since the ADD).
//! Addresses of other networks in a chained result are not this plugin's to judge.

use std::net::IpAddr;

use super::allocator::Request;
use super::config::IpamConfig;
use super::group::group;
use super::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{ip} is not recorded for container {container_id} interface {ifname}")]
    NotRecorded {
        ip: IpAddr,
        container_id: String,
        ifname: String,
    },
    // host-local says "host-local: Failed to find address added by container <id>".
    #[error("sticky-ipam: Failed to find address added by container {container_id}")]
    NoAttachment {
        container_id: String,
        ifname: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// CHECK: every address of `prev_ips` that belongs to this network (in its ranges, or held by
/// any record of its data dir, e.g. after the ranges moved) is recorded for the attachment;
/// without a previous result, at least one address is.
pub fn check<S: Store>(
    store: &mut S,
    config: &IpamConfig,
    req: &Request,
    prev_ips: &[IpAddr],
) -> Result<(), CheckError> {
    let ours: Vec<IpAddr> = prev_ips
        .iter()
        .copied()
        .filter(|ip| {
            config.range_sets.iter().any(|s| s.contains(*ip)) || store.index().is_taken(*ip)
        })
        .collect();
    let recorded = |store: &mut S, ip: IpAddr| -> Result<bool, StoreError> {
        Ok(group(store, ip)?
            .iter()
            .any(|r| r.is_attachment(req.container_id, req.ifname)))
    };
    if !ours.is_empty() {
        for ip in ours {
            if !recorded(store, ip)? {
                return Err(CheckError::NotRecorded {
                    ip,
                    container_id: req.container_id.into(),
                    ifname: req.ifname.into(),
                });
            }
        }
        return Ok(());
    }
    let mut candidates = req
        .pod
        .map(|p| store.index().ips_with_suffix(&p.suffix()))
        .unwrap_or_default();
    candidates.extend(store.index().ips_without_identity());
    for ip in candidates {
        if recorded(store, ip)? {
            return Ok(());
        }
    }
    Err(CheckError::NoAttachment {
        container_id: req.container_id.into(),
        ifname: req.ifname.into(),
    })
}
