//! The node's shared data path: the VTEP with its kept MAC, the bridge with the gateway
//! address, and every peer's neighbour + FDB entry + onlink route.
//!
//! Everything here is idempotent and runs in the host namespace: every ADD and every
//! `sticky-vxlan reconcile` brings the node to the configured state.

use std::collections::HashSet;
use std::fs::File;
use std::net::IpAddr;

use ipnet::IpNet;
use nix::errno::Errno;

use super::config::Config;
use super::mac::{pod_mac, vtep_mac};
use super::node::{Node, gateway_of, resolve};
use super::peers::Peer;
use super::{Error, ROUTE_PROTOCOL, firewall};
use crate::netlink::link::{self, Link, VxlanSpec, format_mac};
use crate::netlink::neigh::{self, Fdb, Neighbour};
use crate::netlink::route::{self, Route};
use crate::netlink::{Socket, addr, sysctl};

fn spec(cfg: &Config, node: &Node) -> VxlanSpec {
    VxlanSpec {
        name: cfg.vtep_name.clone(),
        vni: cfg.vni,
        port: cfg.port,
        local: node.local_ip,
        underlay: Some(node.underlay.index),
        mac: vtep_mac(node.local_ip, cfg.vni),
        mtu: node.mtu,
        learning: false,
    }
}

/// An existing device can be kept if only its MAC or MTU drifted (both are repaired).
fn compatible(existing: &Link, want: &VxlanSpec) -> bool {
    let Some(v) = &existing.vxlan else {
        return false;
    };
    existing.kind.as_deref() == Some("vxlan")
        && v.vni == Some(want.vni)
        && v.port == Some(want.port)
        && v.local == Some(want.local)
        && v.underlay == want.underlay
        && v.learning != Some(true)
}

/// The VTEP, with the kept MAC: created with it, repaired if something rewrote it, recreated
/// if its parameters changed.
pub fn ensure_vtep(sock: &mut Socket, cfg: &Config, node: &Node) -> Result<Link, Error> {
    let want = spec(cfg, node);
    let existing = link::get(sock, &want.name)?;
    let current = match existing {
        Some(l) if compatible(&l, &want) => {
            if l.mac != Some(want.mac) {
                eprintln!(
                    "sticky-vxlan: {} had MAC {}, restoring {}",
                    l.name,
                    l.mac.map(|m| format_mac(&m)).unwrap_or_default(),
                    format_mac(&want.mac)
                );
                link::set_mac(sock, &l, want.mac)?;
            }
            if l.mtu != Some(want.mtu) {
                link::set_mtu(sock, &l, want.mtu)?;
            }
            l
        }
        other => {
            if let Some(old) = other {
                if old.kind.as_deref() != Some("vxlan") {
                    return Err(Error::WrongKind {
                        name: old.name,
                        kind: old.kind.unwrap_or_else(|| "plain".into()),
                        expected: "vxlan",
                    });
                }
                eprintln!(
                    "sticky-vxlan: {} does not match the config, recreating it",
                    old.name
                );
                link::delete(sock, &old.name)?;
            }
            if let Some(holder) = link::list(sock)?.into_iter().find(|l| {
                l.vxlan.as_ref().is_some_and(|v| {
                    v.vni == Some(want.vni)
                        && v.port.unwrap_or(crate::vxlan::config::DEFAULT_PORT) == want.port
                })
            }) {
                return Err(Error::VniTaken {
                    device: holder.name,
                    vni: want.vni,
                    port: want.port,
                });
            }
            match link::add_vxlan(sock, &want) {
                Err(e) if e.errno() == Some(Errno::EEXIST as i32) => {
                    // Someone else created it concurrently: use theirs if it fits.
                    let l = link::require(sock, &want.name)?;
                    if !compatible(&l, &want) {
                        return Err(e.into());
                    }
                }
                other => other?,
            }
            link::require(sock, &want.name)?
        }
    };
    if !current.up {
        link::set_up(sock, &current)?;
    }
    Ok(current)
}

/// The bridge, up, with a stable MAC (derived from the gateway) and the gateway address of
/// each local subnet.
pub fn ensure_bridge(sock: &mut Socket, cfg: &Config, node: &Node) -> Result<Link, Error> {
    let gw_v4 = node.subnet_v4().and_then(|s| gateway_of(&s));
    let mac = match gw_v4 {
        Some(IpAddr::V4(gw)) => Some(pod_mac(gw)),
        _ => None,
    };
    let bridge = match link::get(sock, &cfg.bridge)? {
        Some(b) => b,
        None => {
            match link::add_bridge(sock, &cfg.bridge, Some(node.mtu), mac) {
                Err(e) if e.errno() == Some(Errno::EEXIST as i32) => {}
                other => other?,
            }
            link::require(sock, &cfg.bridge)?
        }
    };
    if bridge.kind.as_deref() != Some("bridge") {
        return Err(Error::WrongKind {
            name: bridge.name,
            kind: bridge.kind.unwrap_or_else(|| "plain".into()),
            expected: "bridge",
        });
    }
    if let Some(mac) = mac
        && bridge.mac != Some(mac)
    {
        link::set_mac(sock, &bridge, mac)?;
    }
    let have = addr::list(sock, bridge.index)?;
    for subnet in &node.local.subnets {
        // Same family and prefix as a valid subnet, so `IpNet::new` cannot fail.
        if let Some(gw) = gateway_of(subnet)
            && let Ok(net) = IpNet::new(gw, subnet.prefix_len())
            && !have.contains(&net)
        {
            addr::add(sock, bridge.index, net)?;
        }
    }
    if !bridge.up {
        link::set_up(sock, &bridge)?;
    }
    Ok(bridge)
}

/// What the VTEP must hold for the current peer set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub fdb: Vec<Fdb>,
    pub neighbours: Vec<Neighbour>,
    pub routes: Vec<Route>,
    pub own: Vec<IpNet>,
}

/// Pure: the entries for `remote` peers on VTEP `vtep` for VNI `vni`.
pub fn desired(vtep: u32, vni: u32, local: &Peer, remote: &[Peer]) -> Desired {
    let mut d = Desired::default();
    for p in remote {
        let mac = p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni));
        d.fdb.push(Fdb {
            index: vtep,
            mac,
            dst: p.ip,
            permanent: true,
        });
        for s in &p.subnets {
            d.neighbours.push(Neighbour {
                index: vtep,
                ip: s.network(),
                mac,
                permanent: true,
            });
            d.routes.push(Route {
                dst: *s,
                gateway: Some(s.network()),
                oif: Some(vtep),
                onlink: true,
                protocol: ROUTE_PROTOCOL,
            });
        }
    }
    for s in local.subnets.iter().filter(|s| s.addr().is_ipv4()) {
        if let Ok(net) = IpNet::new(s.network(), 32) {
            d.own.push(net);
        }
    }
    d
}

/// Holds the per-network lock that serializes node reconciliation (parallel ADDs all
/// reconcile, one at a time).
pub struct PeerLock {
    _file: File,
}

pub fn lock(cfg: &Config) -> Result<PeerLock, Error> {
    let path = cfg.lock_path();
    let err = |source| Error::Lock {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(&cfg.state_dir).map_err(err)?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    file.lock().map_err(err)?;
    Ok(PeerLock { _file: file })
}

/// Programs every peer and removes what belongs to peers no longer configured. Unless the
/// peers file could not be read: then nothing is removed. The caller holds [`lock`].
pub fn reconcile_peers(
    sock: &mut Socket,
    cfg: &Config,
    node: &Node,
    vtep: &Link,
) -> Result<(), Error> {
    let want = desired(vtep.index, cfg.vni, &node.local, &node.remote);
    let have_addrs = addr::list(sock, vtep.index)?;
    for net in &want.own {
        if !have_addrs.contains(net) {
            addr::add(sock, vtep.index, *net)?;
        }
    }
    let have_fdb = neigh::list_fdb(sock, vtep.index)?;
    for f in &want.fdb {
        if !have_fdb.contains(f) {
            neigh::add_fdb(sock, f)?;
        }
    }
    for n in &want.neighbours {
        neigh::replace(sock, n)?;
    }
    for r in &want.routes {
        route::replace(sock, r)?;
    }
    let v6 = node
        .local
        .subnets
        .iter()
        .chain(node.remote.iter().flat_map(|p| &p.subnets))
        .any(|s| s.addr().is_ipv6());
    sysctl::write("net/ipv4/ip_forward", "1")?;
    if v6 {
        sysctl::write("net/ipv6/conf/all/forwarding", "1")?;
    }
    if node.peers_file_error.is_some() {
        // Nothing programmed is removed, so every peer still on the VTEP stays allowed
        // through the peer-only rule as well (without a kept copy of the file, `node.remote`
        // may be much shorter than what is programmed).
        let kept: Vec<_> = have_fdb.iter().map(|f| f.dst).collect();
        firewall::apply(cfg, node, &kept)?;
        return Ok(());
    }
    firewall::apply(cfg, node, &[])?;
    // Stale entries: ours (on our VTEP / with our protocol) and not wanted any more.
    let fdb: HashSet<_> = want.fdb.iter().map(|f| (f.mac, f.dst)).collect();
    for f in have_fdb {
        if !fdb.contains(&(f.mac, f.dst)) {
            neigh::delete_fdb(sock, &f)?;
        }
    }
    for n in neigh::list(sock, vtep.index)? {
        let wanted = want
            .neighbours
            .iter()
            .any(|w| w.ip == n.ip && w.mac == n.mac);
        if n.permanent && !wanted {
            neigh::delete(sock, &n)?;
        }
    }
    // An own /32 left from an earlier local subnet.
    for a in have_addrs {
        if a.addr().is_ipv4() && a.prefix_len() == 32 && !want.own.contains(&a) {
            addr::delete(sock, vtep.index, a)?;
        }
    }
    for r in route::list(sock)? {
        if r.protocol == ROUTE_PROTOCOL && r.oif == Some(vtep.index) && !want.routes.contains(&r) {
            route::delete(sock, &r)?;
        }
    }
    Ok(())
}

/// VTEP, bridge and peers: what `sticky-vxlan reconcile` and every ADD do first.
///
/// All of it runs under the network's lock: parallel ADDs then never race to create the
/// VTEP (one would see the other's half-made device as "another device holding the VNI")
/// and reconcile peers one at a time.
pub fn ensure_node(sock: &mut Socket, cfg: &Config) -> Result<(Node, Link, Link), Error> {
    let _guard = lock(cfg)?;
    let node = resolve(sock, cfg)?;
    node.check(cfg.vni)?;
    let vtep = ensure_vtep(sock, cfg, &node)?;
    let bridge = ensure_bridge(sock, cfg, &node)?;
    reconcile_peers(sock, cfg, &node, &vtep)?;
    Ok((node, vtep, bridge))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ip: &str, subnets: &[&str], mac: Option<[u8; 6]>) -> Peer {
        Peer {
            ip: ip.parse().unwrap(),
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            mac,
        }
    }

    #[test]
    fn desired_entries_are_what_flannel_programs() {
        let local = peer("192.0.2.1", &["10.244.1.0/24"], None);
        let remote = vec![
            peer("192.0.2.2", &["10.244.2.0/24", "fd00:2::/64"], None),
            peer("192.0.2.4", &["10.244.4.0/24"], Some([2, 0x42, 0, 0, 0, 4])),
        ];
        let d = desired(9, 1, &local, &remote);
        assert_eq!(d.own, vec!["10.244.1.0/32".parse::<IpNet>().unwrap()]);
        assert_eq!(d.fdb[0].mac, [0x0a, 1, 192, 0, 2, 2]);
        assert_eq!(d.fdb[1].mac, [2, 0x42, 0, 0, 0, 4], "explicit mac wins");
        assert_eq!(d.routes.len(), 3);
        let r = &d.routes[0];
        assert_eq!(
            r.to_string(),
            "10.244.2.0/24 via 10.244.2.0 dev #9 onlink proto 118"
        );
        assert_eq!(d.neighbours[1].ip, "fd00:2::".parse::<IpAddr>().unwrap());
    }
}
