//! The CNI commands of sticky-ipam: validate everything, then lock, then act.

use std::net::IpAddr;

use serde_json::Value;

use super::allocator::{self, Request};
use super::config::IpamConfig;
use super::disk::DiskStore;
use super::host::{current_boot, wall_clock};
use super::identity::{KNOWN_ARGS, Pod};
use super::lifecycle::{self, LeaseClock};
use super::metrics;
use super::{Error, resolv};
use super::{check, del};
use cni_protocol::{Call, CniResult, Command, Dns, IpConfig, Plugin, attachments};

/// sticky-ipam: the binary's plugin, and what sticky-vxlan runs in its own process for `ipam.type`
/// `sticky-ipam` (its IPAM delegation, `vxlan::delegate`, which sits above this layer).
#[derive(Debug, Clone, Copy, Default)]
pub struct IpamPlugin;

/// What every command reads before it touches the data dir.
struct Prepared {
    config: IpamConfig,
    pod: Option<Pod>,
    boot: String,
    wall: u64,
}

impl Prepared {
    fn new(call: &Call) -> Result<Prepared, Error> {
        call.env.args.check_known(&KNOWN_ARGS)?;
        let config = match call.env.command {
            Command::Del => IpamConfig::for_release(&call.conf, &call.env.args)?,
            _ => IpamConfig::from_netconf(&call.conf, &call.env.args)?,
        };
        let pod = Pod::from_args(&call.env.args);
        Ok(Prepared {
            config,
            pod,
            boot: current_boot(),
            wall: wall_clock(),
        })
    }

    fn request<'a>(&'a self, call: &'a Call, clock: &LeaseClock) -> Request<'a> {
        Request {
            container_id: &call.env.container_id,
            ifname: &call.env.ifname,
            pod: self.pod.as_ref(),
            sticky: self.config.sticky,
            boot: &self.boot,
            lease_clock: clock.now,
        }
    }

    fn hold(&self) -> Option<u64> {
        self.config.lease_hold.map(|d| d.as_secs())
    }

    /// Lock the data dir and read the lease clock.
    fn open(&self) -> Result<(DiskStore, LeaseClock), Error> {
        let store = DiskStore::open(&self.config.network_dir())?;
        let clock = LeaseClock::advance(&store, self.wall);
        Ok((store, clock))
    }

    /// Saves the lease clock (a hint, written in place) and makes the command's changes
    /// durable.
    fn finish(&self, store: &mut DiskStore, clock: &LeaseClock) -> Result<(), Error> {
        clock.save(store)?;
        store.sync()?;
        Ok(())
    }

    /// What runs at every ADD and GC: earlier boots swept, expired leases freed.
    fn recover(&self, store: &mut DiskStore, clock: &mut LeaseClock) -> Result<(), Error> {
        let swept = match self.config.sticky {
            true => lifecycle::sweep_earlier_boots(store, &self.boot, clock.now)?,
            false => 0,
        };
        if let Some(hold) = self.hold() {
            if swept > 0 {
                clock.released_one(hold);
            }
            lifecycle::expire(store, hold, clock)?;
        }
        Ok(())
    }
}

fn prev_ips(call: &Call) -> Vec<IpAddr> {
    call.conf
        .prev_result
        .as_ref()
        .map(|r| r.ips.iter().map(|ip| ip.address.addr()).collect())
        .unwrap_or_default()
}

impl Plugin for IpamPlugin {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let prepared = Prepared::new(call)?;
        let config = &prepared.config;
        let requested = allocator::assign_requested(config)?;
        let dns = match &config.resolv_conf {
            Some(path) => resolv::read(path)?,
            None => Dns::default(),
        };
        let (mut store, mut clock) = prepared.open()?;
        prepared.recover(&mut store, &mut clock)?;
        let allocations = allocator::add(
            &mut store,
            config,
            &prepared.request(call, &clock),
            &requested,
        )?;
        prepared.finish(&mut store, &clock)?;
        metrics::after_add(config, &mut store, prepared.pod.is_some(), &allocations);
        let ips = allocations
            .iter()
            .map(|a| IpConfig {
                address: ipnet::IpNet::new(a.ip, a.range.subnet.prefix_len())
                    .unwrap_or(a.range.subnet),
                gateway: Some(a.range.gateway),
                interface: None,
            })
            .collect();
        Ok(CniResult {
            interfaces: Vec::new(),
            ips,
            routes: config.routes.clone(),
            dns,
        })
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        let prepared = Prepared::new(call)?;
        let (mut store, mut clock) = prepared.open()?;
        let released = del::del(
            &mut store,
            &prepared.request(call, &clock),
            &prev_ips(call),
            prepared.config.range_sets.len(),
        )?;
        if let (Some(hold), true) = (prepared.hold(), released > 0) {
            clock.released_one(hold);
        }
        prepared.finish(&mut store, &clock)?;
        metrics::after_call(&prepared.config, &mut store, 0, 0);
        Ok(())
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let prepared = Prepared::new(call)?;
        let (mut store, clock) = prepared.open()?;
        check::check(
            &mut store,
            &prepared.config,
            &prepared.request(call, &clock),
            &prev_ips(call),
        )?;
        store.sync()?;
        metrics::after_call(&prepared.config, &mut store, 0, 0);
        Ok(())
    }

    fn gc(&self, call: &Call) -> Result<(), Error> {
        let prepared = Prepared::new(call)?;
        if call.conf.raw.get("disableGC").and_then(Value::as_bool) == Some(true) {
            return Ok(());
        }
        let valid =
            attachments::valid_attachments(&call.conf.raw)?.ok_or(Error::GcWithoutAttachments)?;
        let (mut store, mut clock) = prepared.open()?;
        prepared.recover(&mut store, &mut clock)?;
        let (changes, mut errors) = lifecycle::plan_gc(&mut store, &valid, prepared.config.sticky);
        errors.extend(lifecycle::apply(&mut store, &changes, clock.now));
        let released = |c: &lifecycle::Change| c.action == lifecycle::Action::Release;
        if let (Some(hold), true) = (prepared.hold(), changes.iter().any(released)) {
            clock.released_one(hold);
        }
        prepared.finish(&mut store, &clock)?;
        metrics::after_call(&prepared.config, &mut store, 0, 0);
        match errors.into_iter().next() {
            Some(first) => Err(first.into()),
            None => Ok(()),
        }
    }

    fn status(&self, call: &Call) -> Result<(), Error> {
        let not_ready = |e: &dyn std::fmt::Display| Error::NotReady(e.to_string());
        let config = IpamConfig::from_netconf(&call.conf, &call.env.args)
            .map_err(|e| not_ready(&format!("config invalid: {e}")))?;
        let mut store = DiskStore::open(&config.network_dir())
            .and_then(|mut s| s.probe_writable().map(|()| s))
            .map_err(|e| not_ready(&format!("data dir unusable: {e}")))?;
        if config.status_fails_when_full {
            for (index, set) in config.range_sets.iter().enumerate() {
                if !allocator::has_room(&mut store, set, index, config.when_exhausted)? {
                    return Err(Error::NotReady(format!(
                        "range set {set} is full (statusFailsWhenFull)"
                    )));
                }
            }
        }
        metrics::after_call(&config, &mut store, 0, 0);
        Ok(())
    }
}
