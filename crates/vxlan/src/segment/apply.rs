//! Carries out a segment's [`Plan`] through a [`Kernel`], step by step, stopping at the first
//! error; a run of flood entries goes to the kernel as one batch. No decision is made here: the indexes of the two devices are the only thing it
//! works out (from what was read, or by looking a device up once it was made).

use std::net::IpAddr;

use super::Error;
use super::config::Config;
use super::plan::{Dev, Devices, FLOOD, Observed, Plan, Step};
use sticky_netlink::link::{self, Link};
use sticky_netlink::neigh::Fdb;
use sticky_overlay::kernel::{EntryWrite, Kernel, LinkChange};

/// The link called `name`, which must exist.
fn require<K: Kernel>(k: &mut K, name: &str) -> Result<Link, Error> {
    k.link(name)?.ok_or_else(|| {
        Error::Vxlan(sticky_overlay::Error::Link(link::Error::NotFound(
            name.to_string(),
        )))
    })
}

/// The two devices as far as they are known: as read, or looked up once made.
struct Known<'a> {
    cfg: &'a Config,
    bridge: Option<Link>,
    vxlan: Option<Link>,
}

impl Known<'_> {
    fn get(&mut self, k: &mut impl Kernel, dev: Dev) -> Result<Link, Error> {
        let (slot, name) = match dev {
            Dev::Bridge => (&mut self.bridge, self.cfg.bridge()),
            Dev::Vxlan => (&mut self.vxlan, self.cfg.vxlan()),
        };
        if let Some(l) = slot {
            return Ok(l.clone());
        }
        let l = require(k, &name)?;
        *slot = Some(l.clone());
        Ok(l)
    }
}

fn flood(index: u32, dst: IpAddr) -> Fdb {
    Fdb {
        index,
        mac: FLOOD,
        dst,
        permanent: true,
    }
}

/// Applies `plan`; `seen` is what it was computed from. Returns both devices as they are
/// afterwards (up, MTU, master), for the stamp.
pub fn apply<K: Kernel>(
    k: &mut K,
    cfg: &Config,
    plan: &Plan,
    seen: &Observed,
) -> Result<Devices, Error> {
    let mut known = Known {
        cfg,
        bridge: seen.bridge.clone(),
        vxlan: seen.vxlan.clone(),
    };
    // A run of flood entries goes out as one batch, in plan order, before the next step.
    let mut floods = Vec::new();
    for step in &plan.steps {
        if !floods.is_empty() && !matches!(step, Step::AddFlood(_) | Step::DeleteFlood(_)) {
            k.write_entries(&floods)?;
            floods.clear();
        }
        match step {
            Step::CreateBridge { name, mtu } => {
                k.create_bridge(name, *mtu, None)?;
                known.bridge = None;
            }
            Step::DeleteVxlan { name } => {
                eprintln!(
                    "sticky-vxlan: segment {}: {name} does not match the config, recreating it",
                    cfg.name
                );
                k.delete_link(name)?;
                known.vxlan = None;
            }
            Step::CreateVxlan(spec) => {
                k.create_vxlan(spec)?;
                known.vxlan = None;
            }
            Step::Change { dev, change } => {
                let l = known.get(k, *dev)?;
                k.change_link(&l, change)?;
            }
            Step::EnslaveVxlan => {
                let bridge = known.get(k, Dev::Bridge)?.index;
                let l = known.get(k, Dev::Vxlan)?;
                k.change_link(&l, &LinkChange::Master(bridge))?;
            }
            Step::Reattach(l) => {
                let bridge = known.get(k, Dev::Bridge)?.index;
                k.change_link(l, &LinkChange::Master(bridge))?;
            }
            Step::KeepNodeOff(dev) => {
                let name = known.get(k, *dev)?.name;
                k.disable_ipv6(&name)?;
            }
            Step::AddFlood(dst) => {
                let index = known.get(k, Dev::Vxlan)?.index;
                floods.push(EntryWrite::AddFdb(flood(index, *dst)));
            }
            Step::DeleteFlood(dst) => {
                let index = known.get(k, Dev::Vxlan)?.index;
                floods.push(EntryWrite::DeleteFdb(flood(index, *dst)));
            }
        }
    }
    if !floods.is_empty() {
        k.write_entries(&floods)?;
    }
    Ok(Devices {
        bridge: require(k, &cfg.bridge())?,
        vxlan: require(k, &cfg.vxlan())?,
    })
}
