//! A segment's devices on this node: the bridge, the VXLAN device for the VNI (learning on,
//! enslaved to the bridge) and one all-zero FDB entry per other node, so broadcast, unknown
//! unicast and multicast frames are flooded to every node of the segment and pods' MACs are
//! learned from their frames.
//!
//! Both devices carry the network's marker as their alias; a device of the same name
//! without it is someone else's and is refused, never adopted. Everything is idempotent and
//! runs under the segment's lock.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::Ipv4Addr;

use nix::errno::Errno;

use super::Error;
use super::config::Config;
use super::node::Node;
use crate::netlink::link::{self, Link, VxlanSpec};
use crate::netlink::neigh::{self, Fdb};
use crate::netlink::{Socket, sysctl};
use crate::vxlan::mac::vtep_mac;

/// The flood entries' MAC.
pub const FLOOD: [u8; 6] = [0; 6];

/// Holds the segment's lock.
pub struct Lock {
    _file: File,
}

pub fn lock(cfg: &Config) -> Result<Lock, Error> {
    let path = cfg.lock_path();
    let err = |source| {
        Error::Vxlan(crate::vxlan::Error::Lock(
            crate::vxlan::state_dir::LockError {
                path: path.clone(),
                source,
            },
        ))
    };
    std::fs::create_dir_all(&cfg.state_dir).map_err(err)?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    file.lock().map_err(err)?;
    Ok(Lock { _file: file })
}

fn spec(cfg: &Config, node: &Node) -> VxlanSpec {
    VxlanSpec {
        name: cfg.vxlan(),
        vni: cfg.vni,
        port: cfg.port,
        local: node.local_ip,
        underlay: Some(node.underlay.index),
        mac: vtep_mac(node.local_ip, cfg.vni),
        mtu: node.mtu,
        learning: true,
    }
}

/// Keeps the node itself off the segment: no IPv6 link-local address, router solicitation or
/// MLD report from the bridge, the VXLAN device or a host veth (none of them has an IPv4
/// address either). The segment is the pods' L2 domain; the node only carries it. Done
/// before the device comes up; nothing to do on a kernel without IPv6.
pub fn keep_node_off(name: &str) -> Result<(), Error> {
    let key = format!("net/ipv6/conf/{name}/disable_ipv6");
    if sysctl::path(&key).is_ok_and(|p| p.exists()) {
        sysctl::write(&key, "1")?;
    }
    Ok(())
}

/// Whether an existing device of ours can be kept as it is (MTU aside).
fn compatible(existing: &Link, want: &VxlanSpec) -> bool {
    existing.vxlan.as_ref().is_some_and(|v| {
        v.vni == Some(want.vni)
            && v.port == Some(want.port)
            && v.local == Some(want.local)
            && v.underlay == want.underlay
            && v.learning == Some(true)
    })
}

/// Refuses a device that is not ours or not of the expected kind.
fn owned(cfg: &Config, l: &Link, kind: &'static str) -> Result<(), Error> {
    let expected = cfg.marker();
    if l.alias.as_deref() != Some(expected.as_str()) {
        return Err(Error::NotOurs {
            device: l.name.clone(),
            alias: l.alias.clone().unwrap_or_default(),
            expected,
        });
    }
    if l.kind.as_deref() != Some(kind) {
        return Err(Error::Vxlan(crate::vxlan::Error::WrongKind {
            name: l.name.clone(),
            kind: l.kind.clone().unwrap_or_else(|| "plain".into()),
            expected: kind,
        }));
    }
    Ok(())
}

/// Creates a device with `create`, marks it, and reads it back. One that appeared meanwhile
/// is used only if it is ours.
fn make(
    sock: &mut Socket,
    cfg: &Config,
    (name, kind): (&str, &'static str),
    create: impl FnOnce(&mut Socket) -> Result<(), link::Error>,
) -> Result<Link, Error> {
    match create(sock) {
        Err(e) if e.errno() == Some(Errno::EEXIST as i32) => {
            let l = link::require(sock, name)?;
            owned(cfg, &l, kind)?;
            return Ok(l);
        }
        other => other?,
    }
    let l = link::require(sock, name)?;
    link::set_alias(sock, &l, &cfg.marker())?;
    Ok(link::require(sock, name)?)
}

fn ensure_bridge(sock: &mut Socket, cfg: &Config, node: &Node) -> Result<Link, Error> {
    let name = cfg.bridge();
    let bridge = match link::get(sock, &name)? {
        Some(b) => {
            owned(cfg, &b, "bridge")?;
            b
        }
        None => {
            let bridge = make(sock, cfg, (&name, "bridge"), |s| {
                link::add_bridge(s, &name, Some(node.mtu), None)
            })?;
            reattach(sock, cfg, &bridge)?;
            bridge
        }
    };
    if bridge.mtu != Some(node.mtu) {
        link::set_mtu(sock, &bridge, node.mtu)?;
    }
    keep_node_off(&name)?;
    if !bridge.up {
        link::set_up(sock, &bridge)?;
    }
    Ok(bridge)
}

/// Puts this network's pod veths (found by their alias) back on a bridge that was just
/// recreated: deleting a bridge releases its ports, and the pods behind them are still there.
fn reattach(sock: &mut Socket, cfg: &Config, bridge: &Link) -> Result<(), Error> {
    for l in link::list(sock)? {
        let ours = l
            .alias
            .as_deref()
            .and_then(crate::vxlan::pod::parse_alias)
            .is_some_and(|(network, _, _)| network == cfg.name);
        if ours && l.master != Some(bridge.index) {
            link::set_master(sock, &l, bridge.index)?;
        }
    }
    Ok(())
}

fn ensure_vxlan(
    sock: &mut Socket,
    cfg: &Config,
    node: &Node,
    bridge: &Link,
) -> Result<Link, Error> {
    let want = spec(cfg, node);
    let existing = link::get(sock, &want.name)?;
    if let Some(l) = &existing {
        owned(cfg, l, "vxlan")?;
    }
    let dev = match existing {
        Some(l) if compatible(&l, &want) => l,
        other => {
            if let Some(old) = other {
                eprintln!(
                    "sticky-vxlan: segment {}: {} does not match the config, recreating it",
                    cfg.name, old.name
                );
                link::delete(sock, &old.name)?;
            }
            if let Some(holder) = link::list(sock)?.into_iter().find(|l| {
                l.vxlan.as_ref().is_some_and(|v| {
                    v.vni == Some(want.vni)
                        && v.port.unwrap_or(crate::vxlan::config::DEFAULT_PORT) == want.port
                })
            }) {
                return Err(Error::Vxlan(crate::vxlan::Error::VniTaken {
                    device: holder.name,
                    vni: want.vni,
                    port: want.port,
                }));
            }
            make(sock, cfg, (&want.name, "vxlan"), |s| {
                link::add_vxlan(s, &want)
            })?
        }
    };
    if dev.mtu != Some(want.mtu) {
        link::set_mtu(sock, &dev, want.mtu)?;
    }
    keep_node_off(&dev.name)?;
    if dev.master != Some(bridge.index) {
        link::set_master(sock, &dev, bridge.index)?;
    }
    if !dev.up {
        link::set_up(sock, &dev)?;
    }
    Ok(dev)
}

/// The flood entries to add and to remove, given those present (pure).
pub fn flood_plan(
    have: &[Ipv4Addr],
    want: &[Ipv4Addr],
    keep_stale: bool,
) -> (Vec<Ipv4Addr>, Vec<Ipv4Addr>) {
    let have: BTreeSet<_> = have.iter().copied().collect();
    let want: BTreeSet<_> = want.iter().copied().collect();
    let add = want.difference(&have).copied().collect();
    let remove = if keep_stale {
        Vec::new()
    } else {
        have.difference(&want).copied().collect()
    };
    (add, remove)
}

fn reconcile_flood(sock: &mut Socket, node: &Node, dev: &Link) -> Result<(), Error> {
    let present: Vec<Fdb> = neigh::list_fdb(sock, dev.index)?
        .into_iter()
        .filter(|f| f.mac == FLOOD && f.permanent)
        .collect();
    let have: Vec<Ipv4Addr> = present.iter().map(|f| f.dst).collect();
    let (add, remove) = flood_plan(&have, &node.remote, node.peers_file_error.is_some());
    let entry = |dst: Ipv4Addr| Fdb {
        index: dev.index,
        mac: FLOOD,
        dst,
        permanent: true,
    };
    for dst in add {
        neigh::add_fdb(sock, &entry(dst))?;
    }
    for dst in remove {
        neigh::delete_fdb(sock, &entry(dst))?;
    }
    Ok(())
}

/// Bridge, VXLAN device and flood entries for this segment on this node. Returns the bridge.
pub fn ensure(sock: &mut Socket, cfg: &Config, node: &Node) -> Result<Link, Error> {
    let _guard = lock(cfg)?;
    let bridge = ensure_bridge(sock, cfg, node)?;
    let dev = ensure_vxlan(sock, cfg, node, &bridge)?;
    reconcile_flood(sock, node, &dev)?;
    Ok(bridge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flood_entries_follow_the_nodes_unless_the_peers_file_is_broken() {
        let ip = |n: u8| Ipv4Addr::new(192, 0, 2, n);
        let (add, remove) = flood_plan(&[ip(2), ip(4)], &[ip(2), ip(3)], false);
        assert_eq!((add, remove), (vec![ip(3)], vec![ip(4)]));
        let (add, remove) = flood_plan(&[ip(2), ip(4)], &[ip(3)], true);
        assert_eq!((add, remove), (vec![ip(3)], vec![]));
    }

    #[test]
    fn only_a_learning_device_of_the_same_vni_port_and_underlay_is_kept() {
        let want = VxlanSpec {
            name: "segvx101".into(),
            vni: 101,
            port: 8472,
            local: Ipv4Addr::new(192, 0, 2, 1),
            underlay: Some(2),
            mac: [0; 6],
            mtu: 1450,
            learning: true,
        };
        let info = crate::netlink::link::VxlanInfo {
            vni: Some(101),
            port: Some(8472),
            local: Some(want.local),
            underlay: Some(2),
            learning: Some(true),
        };
        let l = |info| Link {
            vxlan: Some(info),
            ..Link::default()
        };
        assert!(compatible(&l(info.clone()), &want));
        for changed in [
            crate::netlink::link::VxlanInfo {
                learning: Some(false),
                ..info.clone()
            },
            crate::netlink::link::VxlanInfo {
                vni: Some(102),
                ..info.clone()
            },
            crate::netlink::link::VxlanInfo {
                underlay: Some(3),
                ..info.clone()
            },
        ] {
            assert!(!compatible(&l(changed), &want));
        }
    }
}
