//! A recording fake of [`Kernel`] for unit tests: a small in-memory node (links, addresses,
//! routes, VTEP entries) that every write changes as the kernel would, and that records each
//! write in order, so the plan's decisions are tested without root.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde_json::{Value, json};

use super::Error;
use super::config::Config;
use super::kernel::{EntryWrite, Kernel, LinkChange, write_each};
use super::node::{LocalNode, Observed};
use super::peers::Peer;
use sticky_netlink::link::{Link, VxlanInfo, VxlanSpec};
use sticky_netlink::neigh::{Fdb, Neighbour};
use sticky_netlink::route::Route;
use sticky_netlink::socket;

#[derive(Debug, Default)]
pub struct Fake {
    pub seen: Observed,
    /// Every FDB and neighbour entry, of any link.
    pub fdb: Vec<Fdb>,
    pub neighbours: Vec<Neighbour>,
    /// Each write, in order, as text.
    pub writes: Vec<String>,
    /// How many writes each [`Kernel::write_entries`] call (one batch) had, in order.
    pub batches: Vec<usize>,
    /// Each `route_to` question.
    pub queries: Vec<String>,
    /// A write whose text starts with this fails with this errno.
    pub fail: Option<(String, i32)>,
    /// The container ends of the veths made through [`super::pods::Pods`]
    /// (`super::fake_pods`).
    pub containers: Vec<FakeContainer>,
    /// Each sysctl as last written (a key never written reads as missing).
    pub sysctls: std::collections::BTreeMap<String, String>,
}

/// A container end the fake made (the `Pods` side of the fake is in `fake_pods`).
#[derive(Debug, Clone)]
pub struct FakeContainer {
    pub netns: PathBuf,
    /// The host end it is paired with.
    pub host: String,
    pub link: Link,
    pub addresses: Vec<ipnet::IpNet>,
}

impl Fake {
    /// A node whose `eth0` (MTU 1500) holds `underlay` (e.g. `192.0.2.1/24`).
    pub fn node(underlay: &str) -> Fake {
        let mut k = Fake::default();
        k.add_link("eth0", "veth");
        k.add_address("eth0", underlay);
        k
    }

    pub fn add_link(&mut self, name: &str, kind: &str) -> u32 {
        let index = self.seen.links.iter().map(|l| l.index).max().unwrap_or(1) + 1;
        self.seen.links.push(Link {
            index,
            name: name.into(),
            mtu: Some(1500),
            up: true,
            kind: Some(kind.into()),
            ..Link::default()
        });
        index
    }

    pub fn link_mut(&mut self, name: &str) -> &mut Link {
        self.seen
            .links
            .iter_mut()
            .find(|l| l.name == name)
            .expect("fake link")
    }

    pub fn add_address(&mut self, name: &str, net: &str) {
        let index = self.link_mut(name).index;
        self.seen.addresses.push((index, net.parse().unwrap()));
    }

    /// Records a write, or fails it as [`Fake::fail`] says.
    pub(super) fn write(&mut self, what: String) -> Result<(), Error> {
        let failing = self
            .fail
            .as_ref()
            .filter(|(prefix, _)| what.starts_with(prefix.as_str()));
        if let Some((_, errno)) = failing {
            return Err(Error::Link(sticky_netlink::link::Error::Netlink {
                name: what,
                source: socket::Error::Kernel {
                    what: "fake",
                    errno: *errno,
                },
            }));
        }
        self.writes.push(what);
        Ok(())
    }

    fn by_index(&mut self, index: u32) -> &mut Link {
        self.seen
            .links
            .iter_mut()
            .find(|l| l.index == index)
            .expect("fake link index")
    }
}

impl Kernel for Fake {
    fn links(&mut self) -> Result<Vec<Link>, Error> {
        self.queries.push("dump links".into());
        Ok(self.seen.links.clone())
    }
    fn vxlan_links(&mut self) -> Result<Vec<Link>, Error> {
        self.queries.push("dump vxlan links".into());
        let vxlan = |l: &&Link| l.kind.as_deref() == Some("vxlan");
        Ok(self.seen.links.iter().filter(vxlan).cloned().collect())
    }
    fn veth_links(&mut self) -> Result<Vec<Link>, Error> {
        self.queries.push("dump veth links".into());
        let veth = |l: &&Link| l.kind.as_deref() == Some("veth");
        Ok(self.seen.links.iter().filter(veth).cloned().collect())
    }
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error> {
        Ok(self.seen.link(name).cloned())
    }
    fn link_at(&mut self, index: u32) -> Result<Option<Link>, Error> {
        Ok(self.seen.link_index(index).cloned())
    }
    fn addresses(&mut self) -> Result<Vec<(u32, IpNet)>, Error> {
        self.queries.push("dump addresses".into());
        Ok(self.seen.addresses.clone())
    }
    fn addresses_of(&mut self, index: u32) -> Result<Vec<IpNet>, Error> {
        self.queries.push(format!("addresses of #{index}"));
        Ok(self.seen.addresses_of(index))
    }
    fn routes(&mut self) -> Result<Vec<Route>, Error> {
        self.queries.push("dump routes".into());
        Ok(self.seen.routes.clone())
    }
    fn neighbours(&mut self, index: u32) -> Result<Vec<Neighbour>, Error> {
        self.queries.push("dump neighbours".into());
        Ok(self
            .neighbours
            .iter()
            .filter(|n| n.index == index)
            .cloned()
            .collect())
    }
    fn fdb(&mut self, index: u32) -> Result<Vec<Fdb>, Error> {
        self.queries.push("dump fdb".into());
        Ok(self
            .fdb
            .iter()
            .filter(|f| f.index == index)
            .cloned()
            .collect())
    }
    fn fdb_of(&mut self, index: u32, macs: &[[u8; 6]]) -> Result<Vec<Fdb>, Error> {
        self.queries.push(format!("get {} fdb entries", macs.len()));
        let asked: std::collections::HashSet<&[u8; 6]> = macs.iter().collect();
        let mut seen = std::collections::HashSet::new();
        Ok(self
            .fdb
            .iter()
            .filter(|f| f.index == index && asked.contains(&f.mac) && seen.insert(f.mac))
            .cloned()
            .collect())
    }
    fn route_to(&mut self, ip: IpAddr) -> Result<(Option<u32>, Option<IpAddr>), Error> {
        self.queries.push(format!("route to {ip}"));
        Ok(self
            .seen
            .addresses
            .iter()
            .find(|(_, n)| n.addr().is_ipv4() && n.trunc().contains(&ip))
            .map(|(i, n)| (Some(*i), Some(n.addr())))
            .unwrap_or((None, None)))
    }

    fn route_on(&mut self, dst: IpNet) -> Result<Option<Route>, Error> {
        self.queries.push(format!("route on {dst}"));
        Ok(self.seen.routes.iter().find(|r| r.dst == dst).cloned())
    }

    fn create_vxlan(&mut self, spec: &VxlanSpec) -> Result<(), Error> {
        self.write(format!("create vxlan {}", spec.name))?;
        let index = self.add_link(&spec.name, "vxlan");
        let l = self.by_index(index);
        l.mac = Some(spec.mac);
        l.mtu = Some(spec.mtu);
        l.up = false;
        l.vxlan = Some(VxlanInfo {
            vni: Some(spec.vni),
            port: Some(spec.port),
            local: Some(spec.local),
            underlay: spec.underlay,
            learning: Some(spec.learning),
            ttl: Some(0),
        });
        Ok(())
    }
    fn create_bridge(&mut self, name: &str, mtu: u32, mac: Option<[u8; 6]>) -> Result<(), Error> {
        self.write(format!("create bridge {name}"))?;
        let index = self.add_link(name, "bridge");
        let l = self.by_index(index);
        l.mac = mac;
        l.mtu = Some(mtu);
        l.up = false;
        Ok(())
    }
    fn delete_link(&mut self, name: &str) -> Result<(), Error> {
        self.write(format!("delete link {name}"))?;
        if let Some(index) = self.seen.link(name).map(|l| l.index) {
            self.seen.links.retain(|l| l.index != index);
            self.seen.addresses.retain(|(i, _)| *i != index);
            self.seen.routes.retain(|r| r.oif != Some(index));
            self.fdb.retain(|f| f.index != index);
            self.neighbours.retain(|n| n.index != index);
        }
        Ok(())
    }
    fn change_link(&mut self, link: &Link, change: &LinkChange) -> Result<(), Error> {
        self.write(format!("change {} {change:?}", link.name))?;
        let l = self.by_index(link.index);
        match change {
            LinkChange::Mac(m) => l.mac = Some(*m),
            LinkChange::Mtu(m) => l.mtu = Some(*m),
            LinkChange::Alias(a) => l.alias = Some(a.clone()),
            LinkChange::Master(m) => l.master = Some(*m),
            LinkChange::Up => l.up = true,
        }
        Ok(())
    }
    fn add_address(&mut self, index: u32, net: IpNet) -> Result<(), Error> {
        self.write(format!("add address {net} on #{index}"))?;
        if !self.seen.addresses.contains(&(index, net)) {
            self.seen.addresses.push((index, net));
        }
        Ok(())
    }
    fn delete_address(&mut self, index: u32, net: IpNet) -> Result<(), Error> {
        self.write(format!("delete address {net} on #{index}"))?;
        self.seen.addresses.retain(|a| *a != (index, net));
        // The connected route goes with it.
        self.seen
            .routes
            .retain(|r| !(r.oif == Some(index) && r.dst == net.trunc() && r.protocol == 2));
        Ok(())
    }
    fn add_fdb(&mut self, f: &Fdb) -> Result<(), Error> {
        self.write(format!("add fdb {:?} {}", f.mac, f.dst))?;
        if !self.fdb.contains(f) {
            self.fdb.push(f.clone());
        }
        Ok(())
    }
    fn delete_fdb(&mut self, f: &Fdb) -> Result<(), Error> {
        self.write(format!("delete fdb {:?} {}", f.mac, f.dst))?;
        self.fdb.retain(|x| x != f);
        Ok(())
    }
    fn replace_neighbour(&mut self, n: &Neighbour) -> Result<(), Error> {
        self.write(format!("replace neighbour {}", n.ip))?;
        self.neighbours
            .retain(|x| !(x.index == n.index && x.ip == n.ip));
        self.neighbours.push(n.clone());
        Ok(())
    }
    fn delete_neighbour(&mut self, n: &Neighbour) -> Result<(), Error> {
        self.write(format!("delete neighbour {}", n.ip))?;
        self.neighbours.retain(|x| x != n);
        Ok(())
    }
    fn replace_route(&mut self, r: &Route) -> Result<(), Error> {
        self.write(format!("replace route {r}"))?;
        // The kernel replaces the route of the same destination and metric; one of another
        // metric is another route.
        self.seen
            .routes
            .retain(|x| !(x.dst == r.dst && x.metric == r.metric));
        self.seen.routes.push(r.clone());
        Ok(())
    }
    fn delete_route(&mut self, r: &Route) -> Result<(), Error> {
        self.write(format!("delete route {r}"))?;
        self.seen.routes.retain(|x| x != r);
        Ok(())
    }
    fn write_entries(&mut self, writes: &[EntryWrite]) -> Result<(), Error> {
        self.batches.push(writes.len());
        write_each(self, writes)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), Error> {
        self.write(format!("sysctl {key}={value}"))?;
        self.sysctls.insert(key.into(), value.into());
        Ok(())
    }
    fn read_sysctl(&mut self, key: &str) -> Result<Option<String>, Error> {
        self.queries.push(format!("read sysctl {key}"));
        Ok(self.sysctls.get(key).cloned())
    }
    fn set_hairpin(&mut self, name: &str) -> Result<(), Error> {
        self.write(format!("hairpin {name}"))
    }
    fn disable_ipv6(&mut self, name: &str) -> Result<(), Error> {
        self.write(format!("disable ipv6 {name}"))
    }
    fn nft(&mut self, script: &str) -> Result<(), Error> {
        self.write(format!("nft {script}"))
    }
    fn nft_remove(&mut self, tables: &[super::nft::Table]) -> Result<(), Error> {
        let tables: Vec<String> = tables.iter().map(ToString::to_string).collect();
        self.write(format!("nft remove {}", tables.join(", ")))
    }
}

/// A config named `edge`, VNI 1, host-local IPAM, with `extra` keys merged in.
pub fn conf(extra: Value) -> Config {
    let mut c = json!({"cniVersion": "1.0.0", "name": "edge", "type": "sticky-vxlan", "vni": 1,
                       "ipam": {"type": "host-local"}});
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            c[k] = v.clone();
        }
    }
    Config::from_json("edge", &c).expect("test config")
}

pub fn peer(ip: &str, subnet: &str) -> Peer {
    Peer {
        carries: Vec::new(),
        ip: ip.parse().unwrap(),
        subnets: vec![subnet.parse().unwrap()],
        mac: None,
    }
}

/// A node at `ip` on `eth0` (index 2, MTU 1500) with `subnet`, and remote (ip, subnet) peers.
pub fn node_with(ip: &str, subnet: &str, remote: &[(&str, &str)]) -> LocalNode {
    LocalNode {
        local_ip: ip.parse::<IpAddr>().unwrap(),
        underlay: Link {
            index: 2,
            name: "eth0".into(),
            mtu: Some(1500),
            up: true,
            ..Link::default()
        },
        mtu: 1450,
        local: peer(ip, subnet),
        remote: remote.iter().map(|(ip, s)| peer(ip, s)).collect(),
        peers_file_error: None,
    }
}
