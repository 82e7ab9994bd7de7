//! This node as the overlay sees it: underlay address and device, MTU, its own subnets
//! and the remote peers, worked out from config, the peers file and the host's addresses.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::Error;
use super::config::{Config, IPV4_OVERHEAD};
use super::peers::{self, Peer};
use crate::netlink::link::{self, Link};
use crate::netlink::route;
use crate::netlink::{Socket, addr};

/// This node, as far as the overlay is concerned.
#[derive(Debug, Clone)]
pub struct Node {
    pub local_ip: Ipv4Addr,
    pub underlay: Link,
    /// MTU of the VTEP, the bridge and every pod interface.
    pub mtu: u32,
    /// This node's own entry: its pod subnets.
    pub local: Peer,
    pub remote: Vec<Peer>,
    /// Why the peers file could not be used, if it could not: the programmed peers must
    /// then be left as they are.
    pub peers_file_error: Option<String>,
}

impl Node {
    /// What programming the node needs beyond [`resolve`] (ADD, `reconcile`, STATUS): the
    /// underlay address is the one this node's entry names, and every peer has a VTEP MAC of
    /// its own. DEL, CHECK and GC only need the local subnets and do not ask.
    pub fn check(&self, vni: u32) -> Result<(), Error> {
        if self.local.ip != self.local_ip {
            return Err(Error::Underlay(format!(
                "the VTEP would use {} (from localIp/device) but this node's peer entry names {}: peers send to {} and compute this node's VTEP MAC from it; set localIp/device to match the entry",
                self.local_ip, self.local.ip, self.local.ip
            )));
        }
        peers::check_macs(vni, self.local_ip, &self.remote).map_err(Error::Peers)
    }

    /// The node's IPv4 pod subnet (every entry has exactly one).
    pub fn subnet_v4(&self) -> Option<IpNet> {
        self.local
            .subnets
            .iter()
            .copied()
            .find(|s| s.addr().is_ipv4())
    }
}

/// The gateway of a pod subnet: its first address (what host-local hands out by default).
pub fn gateway_of(subnet: &IpNet) -> Option<IpAddr> {
    subnet
        .hosts()
        .next()
        .filter(|h| *h != subnet.network())
        .or_else(|| match subnet {
            // IPv6 `hosts()` starts at the network address itself.
            IpNet::V6(n) => n.hosts().nth(1).map(IpAddr::V6),
            IpNet::V4(_) => None,
        })
}

/// Works out the underlay, the MTU and the peers from config, peers file and the host.
pub fn resolve(sock: &mut Socket, cfg: &Config) -> Result<Node, Error> {
    let mut peers_file_error = None;
    let from_file = match &cfg.peers_file {
        None => Vec::new(),
        Some(path) => match peers::load_and_keep(path, &cfg.last_good_peers_path()) {
            Ok(list) => list,
            Err(e) => {
                eprintln!(
                    "sticky-vxlan: {e}; using the last peers file that was valid and removing no peer"
                );
                peers_file_error = Some(e.to_string());
                peers::load_last_good(&cfg.last_good_peers_path())
            }
        },
    };
    let all = peers::merge(&cfg.peers, &from_file).map_err(Error::Peers)?;
    let addrs = addr::list_all(sock)?;
    let local_addrs: Vec<IpAddr> = addrs.iter().map(|(_, n)| n.addr()).collect();

    let (local_ip, underlay) = underlay(sock, cfg, &addrs, &all, &local_addrs)?;
    let (local, remote) = match cfg.local_ip {
        Some(ip) => peers::split_local(&all, &[IpAddr::V4(ip)]),
        None => peers::split_local(&all, &[IpAddr::V4(local_ip)]),
    };
    let local = match local {
        Some(l) => l,
        None => {
            let (l, _) = peers::split_local(&all, &local_addrs);
            l.ok_or(Error::NoLocalEntry { local: local_ip })?
        }
    };
    let remote: Vec<Peer> = remote.into_iter().filter(|p| p.ip != local.ip).collect();
    let underlay_mtu = underlay.mtu.unwrap_or(1500);
    let max = underlay_mtu.saturating_sub(IPV4_OVERHEAD);
    let mtu = match cfg.mtu {
        Some(m) if m > max => {
            return Err(Error::MtuTooLarge {
                mtu: m,
                max,
                underlay: underlay_mtu,
                device: underlay.name.clone(),
            });
        }
        Some(m) => m,
        None => max,
    };
    Ok(Node {
        local_ip,
        underlay,
        mtu,
        local,
        remote,
        peers_file_error,
    })
}

/// The underlay address and device: `localIp` and/or `device` if given, else the address of
/// the peer entry naming this node, else the device (and its source address) that routes to
/// the first remote peer.
fn underlay(
    sock: &mut Socket,
    cfg: &Config,
    addrs: &[(u32, IpNet)],
    all: &[Peer],
    local_addrs: &[IpAddr],
) -> Result<(Ipv4Addr, Link), Error> {
    let v4_on = |index: u32| {
        addrs.iter().find_map(|(i, n)| match n.addr() {
            IpAddr::V4(a) if *i == index => Some(a),
            _ => None,
        })
    };
    if let Some(name) = &cfg.device {
        let dev = link::require(sock, name)?;
        // Of the device's addresses, the one this node's peer entry names: the others' FDB
        // entries point at it and their MAC for this node is computed from it.
        let named = addrs.iter().find_map(|(i, n)| match n.addr() {
            IpAddr::V4(a) if *i == dev.index && all.iter().any(|p| p.ip == a) => Some(a),
            _ => None,
        });
        let ip = match cfg.local_ip.or(named) {
            Some(ip) => ip,
            None => v4_on(dev.index).ok_or_else(|| {
                Error::Underlay(format!("device {name:?} has no IPv4 address (set localIp)"))
            })?,
        };
        return Ok((ip, dev));
    }
    if let Some(ip) = cfg.local_ip {
        let index = addrs
            .iter()
            .find(|(_, n)| n.addr() == IpAddr::V4(ip))
            .map(|(i, _)| *i)
            .ok_or_else(|| {
                Error::Underlay(format!("localIp {ip} is not an address of this node"))
            })?;
        let dev = link::get_index(sock, index)?
            .ok_or_else(|| Error::Underlay(format!("the device holding {ip} disappeared")))?;
        return Ok((ip, dev));
    }
    // The entry naming this node gives its underlay address directly.
    if let Some(own) = all.iter().find(|p| local_addrs.contains(&IpAddr::V4(p.ip))) {
        let index = addrs
            .iter()
            .find(|(_, n)| n.addr() == IpAddr::V4(own.ip))
            .map(|(i, _)| *i);
        if let Some(dev) = match index {
            Some(i) => link::get_index(sock, i)?,
            None => None,
        } {
            return Ok((own.ip, dev));
        }
    }
    let target = all
        .iter()
        .find(|p| !local_addrs.contains(&IpAddr::V4(p.ip)))
        .ok_or_else(|| {
            Error::Underlay("no remote peer to route to: set localIp or device".into())
        })?;
    let (oif, src) = route::lookup(sock, IpAddr::V4(target.ip))?;
    let (Some(oif), Some(IpAddr::V4(src))) = (oif, src) else {
        return Err(Error::Underlay(format!(
            "no route with a source address towards peer {}: set localIp or device",
            target.ip
        )));
    };
    let dev = link::get_index(sock, oif)?.ok_or_else(|| {
        Error::Underlay(format!("the device routing to {} disappeared", target.ip))
    })?;
    Ok((src, dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways() {
        assert_eq!(
            gateway_of(&"10.244.1.0/24".parse().unwrap()),
            Some("10.244.1.1".parse().unwrap())
        );
        assert_eq!(
            gateway_of(&"fd00:1::/64".parse().unwrap()),
            Some("fd00:1::1".parse().unwrap())
        );
    }
}
