//! Measuring: the node's state through the overlay's [`Kernel`] seam (links, addresses,
//! sysctls: reads only), the counters and firewall through [`Host`], the probes through
//! [`Prober`]; the result is the facts [`super::decide`] reads. Nothing here writes.

#[path = "measure_sites.rs"]
pub mod sites;

use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use sticky_overlay::config::Config;
use sticky_overlay::devices::marker;
use sticky_overlay::kernel::Kernel;
use sticky_overlay::node::{self, FdbRead, LocalNode, Observed};
use sticky_overlay::step::Dev;

use super::decide::{Bridge, DropChain, NodeFacts, PeerFacts, Vtep};
use super::probe::{Probe, Prober};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Node(#[from] sticky_overlay::Error),
    #[error(transparent)]
    Probe(#[from] super::probe::Error),
    #[error("reading {path}: {source}")]
    Counters {
        path: &'static str,
        source: std::io::Error,
    },
}

/// Counters that only move when packets are dropped, read before and after the probes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `Udp: InCsumErrors` (/proc/net/snmp) and `Udp6InCsumErrors` (/proc/net/snmp6).
    pub udp_csum_errors: u64,
    /// `TcpExt: IPReversePathFilter` (/proc/net/netstat).
    pub rp_filter_drops: u64,
}

/// What doctor reads of the node besides links and sysctls.
pub trait Host {
    fn counters(&mut self) -> Result<Counters, Error>;
    /// The IPv4 forward-hook chains with policy drop; `Err` with why they cannot be read.
    fn drop_chains(&mut self) -> Result<Vec<DropChain>, String>;
}

/// The facts, and what could not be checked (said, never silently passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    pub node: NodeFacts,
    pub peers: Vec<PeerFacts>,
    pub local_ip: IpAddr,
    pub unchecked: Vec<String>,
    /// With sites: this node's site, its remote sites and what was found of each.
    pub sites: Option<super::decide::sites::SitesFacts>,
}

/// The smaller sizes tried when the pod MTU does not cross: steps of 50 bytes (one VXLAN
/// header's worth), down to this.
const LADDER_STEP: u32 = 50;
const LADDER_STEPS: u32 = 5;
/// An echo's size for the small probes (what `ping` sends).
const SMALL: u16 = 84;

/// Measures everything [`super::decide::decide`] needs for the network `cfg`.
pub fn measure(
    k: &mut impl Kernel,
    host: &mut impl Host,
    prober: &mut impl Prober,
    cfg: &Config,
    config_path: &str,
) -> Result<Measured, Error> {
    let seen = Observed::read(k, cfg, &FdbRead::Whole)?;
    let gathered = node::peer_list(cfg)?;
    let local = node::resolve(k, cfg, &seen, &gathered)?;
    let mut unchecked = Vec::new();
    let mut facts = node_facts(k, cfg, &seen, &local, config_path)?;
    match host.drop_chains() {
        Ok(chains) => facts.forward_drop = chains,
        Err(why) => unchecked.push(format!("forward chains: {why}")),
    }
    let before = host.counters()?;
    let mut peers = probe_peers(prober, &local, facts.pod_mtu)?;
    let after = host.counters()?;
    for p in &mut peers {
        p.route_dev = route_dev(k, p.peer)?;
    }
    facts.csum_errors = after.udp_csum_errors.saturating_sub(before.udp_csum_errors);
    facts.rp_filter_drops = after.rp_filter_drops.saturating_sub(before.rp_filter_drops);
    Ok(Measured {
        node: facts,
        peers,
        local_ip: local.local_ip,
        unchecked,
        sites: None,
    })
}

/// Everything about the node but the firewall and the counters.
fn node_facts(
    k: &mut impl Kernel,
    cfg: &Config,
    seen: &Observed,
    local: &LocalNode,
    config_path: &str,
) -> Result<NodeFacts, Error> {
    let vtep_link = seen.link(&cfg.vtep_name);
    let vtep = match vtep_link {
        None => Vtep::Missing,
        Some(l) if l.alias.as_deref() != Some(marker(Dev::Vtep, &cfg.name).as_str()) => {
            Vtep::NotOurs
        }
        Some(l) if !l.up => Vtep::Down,
        Some(_) => Vtep::Ready,
    };
    let ip_forward = number(k, "net/ipv4/ip_forward")?.map(|v| v == 1);
    let count = number(k, "net/netfilter/nf_conntrack_count")?;
    let max = number(k, "net/netfilter/nf_conntrack_max")?;
    let all = number(k, "net/ipv4/conf/all/rp_filter")?.unwrap_or(0);
    let mut strict_rp_filter = Vec::new();
    // Reverse-path filtering is IPv4's: on an IPv6 underlay only the pods' devices have it.
    let underlay = Some(&local.underlay.name).filter(|_| local.local_ip.is_ipv4());
    for dev in underlay.into_iter().chain([&cfg.vtep_name, &cfg.bridge]) {
        let key = format!("net/ipv4/conf/{dev}/rp_filter");
        if number(k, &key)?.is_some_and(|own| own.max(all) == 1) {
            strict_rp_filter.push(dev.clone());
        }
    }
    Ok(NodeFacts {
        vtep_name: cfg.vtep_name.clone(),
        vtep,
        bridge_name: cfg.bridge.clone(),
        bridge: bridge(cfg, seen, local),
        ip_forward,
        forward_drop: Vec::new(),
        strict_rp_filter,
        underlay_dev: local.underlay.name.clone(),
        underlay: local.local_ip,
        conntrack: count.zip(max),
        csum_errors: 0,
        rp_filter_drops: 0,
        port: cfg.port,
        pod_mtu: vtep_link.and_then(|l| l.mtu).unwrap_or(local.mtu),
        config: config_path.to_string(),
        pod_subnet: local.subnet_v4().and_then(|s| match s {
            ipnet::IpNet::V4(n) => Some(n),
            ipnet::IpNet::V6(_) => None,
        }),
        cluster: cluster(cfg, local),
    })
}

/// The pods of the whole network: `clusterCIDR`, else the shortest prefix holding every IPv4
/// pod subnet of this node and its peers.
fn cluster(cfg: &Config, local: &LocalNode) -> String {
    if let Some(c) = cfg.cluster_cidr {
        return c.to_string();
    }
    let subnets: Vec<Ipv4Net> = std::iter::once(&local.local)
        .chain(&local.remote)
        .flat_map(|p| &p.subnets)
        .filter_map(|s| match s {
            ipnet::IpNet::V4(n) => Some(*n),
            ipnet::IpNet::V6(_) => None,
        })
        .collect();
    let Some(first) = subnets.first() else {
        return "<cluster CIDR>".into();
    };
    let mut len = first.prefix_len();
    while len > 0
        && !subnets
            .iter()
            .all(|s| Ipv4Net::new(first.network(), len).is_ok_and(|n| n.contains(&s.network())))
    {
        len -= 1;
    }
    Ipv4Net::new(first.network(), len)
        .map(|n| n.trunc().to_string())
        .unwrap_or_else(|_| "<cluster CIDR>".into())
}

/// A sysctl's number; `None` when it is absent (the module not loaded, no such device).
fn number(k: &mut impl Kernel, key: &str) -> Result<Option<u64>, Error> {
    Ok(k.read_sysctl(key)?.and_then(|v| v.parse().ok()))
}

/// The bridge matters once pods hang on it: then it must hold an address of the pod subnet.
fn bridge(cfg: &Config, seen: &Observed, local: &LocalNode) -> Bridge {
    if seen.pods.is_empty() {
        return Bridge::Ready;
    }
    let Some(link) = seen.link(&cfg.bridge) else {
        return Bridge::Missing;
    };
    let Some(subnet) = local.subnet_v4() else {
        return Bridge::Ready;
    };
    if seen
        .addresses_of(link.index)
        .iter()
        .any(|a| subnet.contains(&a.addr()))
    {
        Bridge::Ready
    } else {
        Bridge::NoAddress {
            subnet: subnet.to_string(),
        }
    }
}

/// A peer's probes: underlay, small through the overlay, the pod MTU, then the ladder below.
struct Planned {
    peer: IpAddr,
    first: usize,
    ladder: Vec<u32>,
}

/// Probes every peer with an IPv4 pod subnet, all at once: around the overlay in the
/// underlay's family, through it in IPv4.
fn probe_peers(
    prober: &mut impl Prober,
    local: &LocalNode,
    pod_mtu: u32,
) -> Result<Vec<PeerFacts>, Error> {
    let ladder: Vec<u32> = (1..=LADDER_STEPS)
        .filter_map(|i| pod_mtu.checked_sub(i * LADDER_STEP))
        .filter(|s| *s > u32::from(SMALL))
        .collect();
    let size = |s: u32| u16::try_from(s).unwrap_or(u16::MAX);
    let mut probes = Vec::new();
    let mut planned = Vec::new();
    for peer in &local.remote {
        let Some(vtep) = vtep_address(peer).map(IpAddr::V4) else {
            continue;
        };
        planned.push(Planned {
            peer: peer.ip,
            first: probes.len(),
            ladder: ladder.clone(),
        });
        probes.push(Probe {
            dst: peer.ip,
            size: SMALL,
        });
        probes.push(Probe {
            dst: vtep,
            size: SMALL,
        });
        probes.push(Probe {
            dst: vtep,
            size: size(pod_mtu),
        });
        probes.extend(ladder.iter().map(|s| Probe {
            dst: vtep,
            size: size(*s),
        }));
    }
    let answered = prober.run(&probes)?;
    Ok(planned.iter().map(|p| peer_facts(p, &answered)).collect())
}

fn peer_facts(p: &Planned, answered: &[bool]) -> PeerFacts {
    let got = |i: usize| answered.get(p.first + i).copied().unwrap_or(false);
    let full = got(2);
    let largest = if full {
        None
    } else {
        p.ladder
            .iter()
            .enumerate()
            .find(|(i, _)| got(3 + i))
            .map(|(_, s)| *s)
    };
    PeerFacts {
        peer: p.peer,
        underlay: got(0),
        small: got(1),
        full,
        largest,
        route_dev: None,
    }
}

/// The device the route to `peer` leaves by (`ip route get`), by name.
fn route_dev(k: &mut impl Kernel, peer: IpAddr) -> Result<Option<String>, Error> {
    let (Some(index), _) = k.route_to(peer)? else {
        return Ok(None);
    };
    Ok(k.link_at(index)?.map(|l| l.name))
}

/// The address a peer's VTEP holds: its IPv4 pod subnet's network address (what this node's
/// neighbour entry and route for it point at).
fn vtep_address(peer: &sticky_overlay::peers::Peer) -> Option<Ipv4Addr> {
    peer.subnets.iter().find_map(|s| match s {
        ipnet::IpNet::V4(n) => Some(n.network()),
        ipnet::IpNet::V6(_) => None,
    })
}

/// The counters and the firewall of the namespace this process runs in.
pub struct LiveHost;

impl Host for LiveHost {
    fn counters(&mut self) -> Result<Counters, Error> {
        let read = |path: &'static str| {
            std::fs::read_to_string(path).map_err(|source| Error::Counters { path, source })
        };
        // Absent without IPv6 in the kernel: then no IPv6 packet had a bad checksum either.
        let udp6 = std::fs::read_to_string("/proc/net/snmp6").unwrap_or_default();
        Ok(Counters {
            udp_csum_errors: counter(&read("/proc/net/snmp")?, "Udp:", "InCsumErrors")
                + counter6(&udp6, "Udp6InCsumErrors"),
            rp_filter_drops: counter(
                &read("/proc/net/netstat")?,
                "TcpExt:",
                "IPReversePathFilter",
            ),
        })
    }

    fn drop_chains(&mut self) -> Result<Vec<DropChain>, String> {
        super::forward::drop_chains().map_err(|e| e.to_string())
    }
}

/// A counter of a `/proc/net/snmp`-style table (a line of names, then a line of values, both
/// starting with `group`); 0 when the kernel does not have it.
fn counter(table: &str, group: &str, name: &str) -> u64 {
    let mut lines = table.lines().filter(|l| l.starts_with(group));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A counter of `/proc/net/snmp6` (a name and a value a line); 0 when it is not there.
fn counter6(table: &str, name: &str) -> u64 {
    table
        .lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "measure_tests.rs"]
mod tests;
