//! The CNI commands of sticky-ipam: validate everything, then lock, then act.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use super::allocator::{self, Request};
use super::config::IpamConfig;
use super::disk::DiskStore;
use super::identity::{KNOWN_ARGS, Pod};
use super::{Error, resolv};
use crate::cni::{Call, CniResult, Dns, IpConfig, Plugin};

/// Where the kernel publishes the current boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

pub struct IpamPlugin;

/// What every command reads before it touches the data dir.
struct Prepared {
    config: IpamConfig,
    pod: Option<Pod>,
    boot: String,
    now: u64,
}

impl Prepared {
    fn new(call: &Call) -> Result<Prepared, Error> {
        call.env.args.check_known(&KNOWN_ARGS)?;
        let config = IpamConfig::from_netconf(&call.conf, &call.env.args)?;
        let pod = Pod::from_args(&call.env.args);
        let boot = std::fs::read_to_string(BOOT_ID_PATH)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Prepared {
            config,
            pod,
            boot,
            now,
        })
    }

    fn request<'a>(&'a self, call: &'a Call) -> Request<'a> {
        Request {
            container_id: &call.env.container_id,
            ifname: &call.env.ifname,
            pod: self.pod.as_ref(),
            sticky: self.config.sticky,
            boot: &self.boot,
            now: self.now,
        }
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
        let mut store = DiskStore::open(&config.network_dir())?;
        if config.sticky {
            allocator::sweep_earlier_boots(&mut store, &prepared.boot, prepared.now)?;
        }
        let allocations = allocator::add(&mut store, config, &prepared.request(call), &requested)?;
        store.sync()?;
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
        let mut store = DiskStore::open(&prepared.config.network_dir())?;
        allocator::del(&mut store, &prepared.request(call), &prev_ips(call))?;
        store.sync()?;
        Ok(())
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let prepared = Prepared::new(call)?;
        let mut store = DiskStore::open(&prepared.config.network_dir())?;
        allocator::check(
            &mut store,
            &prepared.config,
            &prepared.request(call),
            &prev_ips(call),
        )?;
        store.sync()?;
        Ok(())
    }

    fn gc(&self, _call: &Call) -> Result<(), Error> {
        Ok(())
    }

    fn status(&self, _call: &Call) -> Result<(), Error> {
        Ok(())
    }
}
