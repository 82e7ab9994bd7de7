//! Carries out a [`Plan`] through a [`Kernel`], step by step, stopping at the first error;
//! a run of entry steps (FDB, neighbours, routes) goes to the kernel as one batch.
//! No decision is made here: the indexes of the two devices are the only thing it works out
//! (from what was observed, or by looking the device up once it was created).

use super::plan::{Plan, route_for};
use sticky_netlink::link::Link;
use sticky_netlink::neigh::{Fdb, Neighbour};
use sticky_overlay::Error;
use sticky_overlay::config::Config;
use sticky_overlay::kernel::{EntryWrite, Kernel, LinkChange};
use sticky_overlay::node::Observed;
use sticky_overlay::step::Dev;
use sticky_overlay::step::Step;

/// The node's two devices as they are after the plan.
#[derive(Debug, Clone)]
pub struct Devices {
    pub vtep: Link,
    pub bridge: Link,
}

struct Resolved<'a> {
    cfg: &'a Config,
    vtep: Option<Link>,
    bridge: Option<Link>,
    /// A device changed since it was read: read it again at the end.
    stale: [bool; 2],
}

impl Resolved<'_> {
    fn name(&self, dev: Dev) -> &str {
        match dev {
            Dev::Vtep => &self.cfg.vtep_name,
            Dev::Bridge => &self.cfg.bridge,
        }
    }

    fn slot(&mut self, dev: Dev) -> &mut Option<Link> {
        match dev {
            Dev::Vtep => &mut self.vtep,
            Dev::Bridge => &mut self.bridge,
        }
    }

    fn get(&mut self, k: &mut impl Kernel, dev: Dev) -> Result<Link, Error> {
        if let Some(l) = self.slot(dev) {
            return Ok(l.clone());
        }
        let name = self.name(dev).to_string();
        let l = k.link(&name)?.ok_or(Error::Vanished { device: name })?;
        *self.slot(dev) = Some(l.clone());
        Ok(l)
    }

    fn vtep_index(&mut self, k: &mut impl Kernel) -> Result<u32, Error> {
        match &self.vtep {
            Some(l) => Ok(l.index),
            None => Ok(self.get(k, Dev::Vtep)?.index),
        }
    }

    fn changed(&mut self, dev: Dev) {
        self.stale[dev as usize] = true;
    }
}

/// Applies `plan`; `seen` is what it was computed from.
pub fn apply(
    k: &mut impl Kernel,
    cfg: &Config,
    plan: &Plan,
    seen: &Observed,
) -> Result<Devices, Error> {
    let mut r = Resolved {
        cfg,
        vtep: seen.link(&cfg.vtep_name).cloned(),
        bridge: seen.link(&cfg.bridge).cloned(),
        stale: [false; 2],
    };
    // A run of entry writes (FDB, neighbours, routes) goes out as one batch, in plan order,
    // before the next step of another kind (which may need them made, or change what they
    // apply to).
    let mut entries = Vec::new();
    for step in &plan.steps {
        if !entries.is_empty() && !step.is_entry() {
            k.write_entries(&entries)?;
            entries.clear();
        }
        match step {
            Step::DeleteLink { name } => {
                k.delete_link(name)?;
                r.vtep = None;
            }
            Step::CreateVtep(spec) => {
                k.create_vxlan(spec)?;
                r.vtep = None;
            }
            Step::CreateBridge { name, mtu, mac } => {
                k.create_bridge(name, *mtu, *mac)?;
                r.bridge = None;
            }
            Step::Change { dev, change } => {
                let l = r.get(k, *dev)?;
                k.change_link(&l, change)?;
                r.changed(*dev);
            }
            Step::AddAddress { dev, net } => {
                let l = r.get(k, *dev)?;
                k.add_address(l.index, *net)?;
            }
            Step::DeleteAddress { dev, net } => {
                let l = r.get(k, *dev)?;
                k.delete_address(l.index, *net)?;
            }
            Step::AddFdb { mac, dst } => {
                let index = r.vtep_index(k)?;
                entries.push(EntryWrite::AddFdb(fdb(index, *mac, *dst)));
            }
            Step::DeleteFdb { mac, dst } => {
                let index = r.vtep_index(k)?;
                entries.push(EntryWrite::DeleteFdb(fdb(index, *mac, *dst)));
            }
            Step::ReplaceNeighbour { ip, mac } => {
                let index = r.vtep_index(k)?;
                entries.push(EntryWrite::ReplaceNeighbour(neighbour(index, *ip, *mac)));
            }
            Step::DeleteNeighbour { ip, mac } => {
                let index = r.vtep_index(k)?;
                entries.push(EntryWrite::DeleteNeighbour(neighbour(index, *ip, *mac)));
            }
            Step::ReplaceRoute { dst, via } => {
                let index = r.vtep_index(k)?;
                entries.push(EntryWrite::ReplaceRoute(route_for(*dst, *via, index)));
            }
            Step::DeleteRoute(route) => entries.push(EntryWrite::DeleteRoute(route.clone())),
            Step::Reattach { link, hairpin } => {
                let bridge = r.get(k, Dev::Bridge)?.index;
                let put_back = k
                    .change_link(link, &LinkChange::Master(bridge))
                    .and_then(|()| match hairpin {
                        true => k.set_hairpin(&link.name),
                        false => Ok(()),
                    });
                match put_back {
                    // Its pod was deleted since the veths were read: nothing to put back.
                    Err(Error::Link(e)) if gone(&e) => {}
                    other => other?,
                }
            }
            Step::Sysctl { key, value } => k.sysctl(key, value)?,
            Step::Firewall { script } => k.nft(script)?,
            Step::RemoveTables { tables } => k.nft_remove(tables)?,
        }
    }
    if !entries.is_empty() {
        k.write_entries(&entries)?;
    }
    for dev in [Dev::Vtep, Dev::Bridge] {
        if r.stale[dev as usize] {
            *r.slot(dev) = None;
        }
    }
    Ok(Devices {
        vtep: r.get(k, Dev::Vtep)?,
        bridge: r.get(k, Dev::Bridge)?,
    })
}

/// Whether a link error says the device is no longer there.
fn gone(e: &sticky_netlink::link::Error) -> bool {
    let errno = e.errno();
    errno == Some(nix::errno::Errno::ENODEV as i32)
        || errno == Some(nix::errno::Errno::ENOENT as i32)
}

fn fdb(index: u32, mac: [u8; 6], dst: std::net::IpAddr) -> Fdb {
    Fdb {
        index,
        mac,
        dst,
        permanent: true,
    }
}

fn neighbour(index: u32, ip: std::net::IpAddr, mac: [u8; 6]) -> Neighbour {
    Neighbour {
        index,
        ip,
        mac,
        permanent: true,
    }
}
