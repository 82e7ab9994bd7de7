//! A segment's devices on this node: the bridge, the VXLAN device for the VNI (learning on,
//! enslaved to the bridge) and one all-zero FDB entry per other node, so broadcast, unknown
//! unicast and multicast frames are flooded to every node of the segment and pods' MACs are
//! learned from their frames.
//!
//! Both devices carry the network's marker as their alias; a device of the same name
//! without it is someone else's and is refused, never adopted. Everything is idempotent and
//! runs under the segment's lock.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use super::Error;
use super::config::Config;
use super::node::Node;
use crate::netlink::link::{self, Link, VxlanSpec};
use crate::netlink::neigh::Fdb;
use crate::netlink::sysctl;
use crate::vxlan::devices;
use crate::vxlan::kernel::{Kernel, LinkChange};
use crate::vxlan::mac::vtep_mac;
use crate::vxlan::state_dir;

/// The flood entries' MAC.
pub const FLOOD: [u8; 6] = [0; 6];

/// Takes the segment's lock, `<stateDir>/<name>.segment.lock`, the way the main mode takes
/// its own ([`state_dir::lock_at`]: no link followed, a FIFO refused).
pub fn lock(cfg: &Config) -> Result<state_dir::Lock, Error> {
    state_dir::lock_at(&cfg.state_dir, &cfg.lock_path())
        .map_err(|e| Error::Vxlan(crate::vxlan::Error::Lock(e)))
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
    devices::check_kind(l, kind).map_err(Error::Vxlan)
}

/// The link called `name`, which must exist.
fn require<K: Kernel>(k: &mut K, name: &str) -> Result<Link, Error> {
    k.link(name)?.ok_or_else(|| {
        Error::Vxlan(crate::vxlan::Error::Link(link::Error::NotFound(
            name.to_string(),
        )))
    })
}

/// Marks a device just created (the kernel ignores an alias in the creating message) and
/// reads it back. Under the segment's lock no other call of this network races it.
fn mark<K: Kernel>(k: &mut K, cfg: &Config, name: &str) -> Result<Link, Error> {
    let l = require(k, name)?;
    k.change_link(&l, &LinkChange::Alias(cfg.marker()))?;
    require(k, name)
}

fn ensure_bridge<K: Kernel>(k: &mut K, cfg: &Config, node: &Node) -> Result<Link, Error> {
    let name = cfg.bridge();
    let bridge = match k.link(&name)? {
        Some(b) => {
            owned(cfg, &b, "bridge")?;
            b
        }
        None => {
            k.create_bridge(&name, node.mtu, None)?;
            let bridge = mark(k, cfg, &name)?;
            reattach(k, cfg, &bridge)?;
            bridge
        }
    };
    if bridge.mtu != Some(node.mtu) {
        k.change_link(&bridge, &LinkChange::Mtu(node.mtu))?;
    }
    keep_node_off(&name)?;
    if !bridge.up {
        k.change_link(&bridge, &LinkChange::Up)?;
    }
    Ok(bridge)
}

/// Puts this network's pod veths (found by their alias) back on a bridge that was just
/// recreated: deleting a bridge releases its ports, and the pods behind them are still there.
fn reattach<K: Kernel>(k: &mut K, cfg: &Config, bridge: &Link) -> Result<(), Error> {
    for l in k.links()? {
        let ours = l
            .alias
            .as_deref()
            .and_then(crate::vxlan::pod::parse_alias)
            .is_some_and(|(network, _, _)| network == cfg.name);
        if ours && l.master != Some(bridge.index) {
            k.change_link(&l, &LinkChange::Master(bridge.index))?;
        }
    }
    Ok(())
}

fn ensure_vxlan<K: Kernel>(
    k: &mut K,
    cfg: &Config,
    node: &Node,
    bridge: &Link,
) -> Result<Link, Error> {
    let want = spec(cfg, node);
    let existing = k.link(&want.name)?;
    if let Some(l) = &existing {
        owned(cfg, l, "vxlan")?;
    }
    let dev = match existing {
        // Kept as it is (MTU aside) when the unchangeable parameters match, learning on.
        Some(l) if devices::same_tunnel(&l, &want) => l,
        other => {
            if let Some(old) = other {
                eprintln!(
                    "sticky-vxlan: segment {}: {} does not match the config, recreating it",
                    cfg.name, old.name
                );
                k.delete_link(&old.name)?;
            }
            if let Some(holder) = k
                .links()?
                .into_iter()
                .find(|l| devices::holds_vni(l, want.vni, want.port))
            {
                return Err(Error::Vxlan(crate::vxlan::Error::VniTaken {
                    device: holder.name,
                    vni: want.vni,
                    port: want.port,
                }));
            }
            k.create_vxlan(&want)?;
            mark(k, cfg, &want.name)?
        }
    };
    if dev.mtu != Some(want.mtu) {
        k.change_link(&dev, &LinkChange::Mtu(want.mtu))?;
    }
    keep_node_off(&dev.name)?;
    if dev.master != Some(bridge.index) {
        k.change_link(&dev, &LinkChange::Master(bridge.index))?;
    }
    if !dev.up {
        k.change_link(&dev, &LinkChange::Up)?;
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

fn reconcile_flood<K: Kernel>(k: &mut K, node: &Node, dev: &Link) -> Result<(), Error> {
    let present: Vec<Fdb> = k
        .fdb(dev.index)?
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
        k.add_fdb(&entry(dst))?;
    }
    for dst in remove {
        k.delete_fdb(&entry(dst))?;
    }
    Ok(())
}

/// The segment's two devices on this node, as programmed.
#[derive(Debug, Clone)]
pub struct Devices {
    pub bridge: Link,
    pub vxlan: Link,
}

/// Bridge, VXLAN device and flood entries for this segment on this node. The caller holds
/// the segment's [`lock`].
pub fn ensure<K: Kernel>(k: &mut K, cfg: &Config, node: &Node) -> Result<Devices, Error> {
    let bridge = ensure_bridge(k, cfg, node)?;
    let vxlan = ensure_vxlan(k, cfg, node, &bridge)?;
    reconcile_flood(k, node, &vxlan)?;
    // As they are now (up, MTU, master), for the stamp.
    Ok(Devices {
        bridge: require(k, &bridge.name)?,
        vxlan: require(k, &vxlan.name)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vxlan::fake::Fake;
    use serde_json::json;

    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, n)
    }

    /// Segment `vxeth1` (VNI 101) with its state in `dir`.
    fn cfg(dir: &tempfile::TempDir) -> Config {
        let raw = json!({"type": "sticky-vxlan", "mode": "segment", "vni": 101,
                         "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}],
                         "stateDir": dir.path()});
        Config::from_json("vxeth1", &raw).unwrap()
    }

    /// Node 1 of a segment on nodes 1 to 3 (node 3 left out with `remote`).
    fn node(k: &Fake, remote: &[u8]) -> Node {
        Node {
            local_ip: ip(1),
            underlay: k.seen.link("eth0").cloned().unwrap(),
            mtu: 1450,
            members: [1].iter().chain(remote).map(|n| ip(*n)).collect(),
            remote: remote.iter().map(|n| ip(*n)).collect(),
            peers_file_error: None,
        }
    }

    fn flood_of(k: &Fake) -> Vec<Ipv4Addr> {
        let index = k.seen.link("segvx101").unwrap().index;
        k.fdb
            .iter()
            .filter(|f| f.index == index && f.mac == FLOOD)
            .map(|f| f.dst)
            .collect()
    }

    #[test]
    fn a_fresh_node_gets_a_marked_bridge_a_learning_vxlan_device_and_one_flood_entry_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let (c, mut k) = (cfg(&dir), Fake::node("192.0.2.1/24"));
        let n = node(&k, &[2, 3]);
        let bridge = ensure(&mut k, &c, &n).unwrap().bridge;
        let dev = k.seen.link("segvx101").cloned().unwrap();
        let br = k.seen.link("segbr101").cloned().unwrap();
        assert_eq!(bridge.name, "segbr101");
        for l in [&dev, &br] {
            assert_eq!(
                l.alias.as_deref(),
                Some("sticky-vxlan segment vxeth1 vni 101")
            );
            assert!(l.up, "{}", l.name);
        }
        let v = dev.vxlan.unwrap();
        assert_eq!(
            (v.vni, v.port, v.learning),
            (Some(101), Some(8472), Some(true))
        );
        assert_eq!(v.underlay, Some(n.underlay.index));
        assert_eq!(dev.master, Some(br.index));
        assert_eq!(dev.mac, Some(vtep_mac(ip(1), 101)));
        assert_eq!(flood_of(&k), [ip(2), ip(3)]);
        // Idempotent: a second ADD writes nothing.
        let before = k.writes.len();
        ensure(&mut k, &c, &n).unwrap();
        assert_eq!(k.writes[before..], [] as [String; 0]);
    }

    #[test]
    fn a_device_of_the_name_without_the_marker_or_holding_the_vni_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(&dir);
        let mut k = Fake::node("192.0.2.1/24");
        k.add_link("segbr101", "bridge");
        let n = node(&k, &[2]);
        assert!(matches!(ensure(&mut k, &c, &n), Err(Error::NotOurs { .. })));
        assert!(k.writes.is_empty(), "{:?}", k.writes);

        let mut k = Fake::node("192.0.2.1/24");
        k.add_link("segbr101", "bridge");
        k.link_mut("segbr101").alias = Some("sticky-vxlan segment other vni 101".into());
        assert!(matches!(ensure(&mut k, &c, &n), Err(Error::NotOurs { .. })));

        let mut k = Fake::node("192.0.2.1/24");
        k.add_link("theirs", "vxlan");
        k.link_mut("theirs").vxlan = Some(crate::netlink::link::VxlanInfo {
            vni: Some(101),
            port: Some(8472),
            ..Default::default()
        });
        let err = ensure(&mut k, &c, &n).unwrap_err();
        assert!(
            matches!(err, Error::Vxlan(crate::vxlan::Error::VniTaken { .. })),
            "{err}"
        );
        assert!(
            !k.writes.iter().any(|w| w.contains("theirs")),
            "{:?}",
            k.writes
        );
    }

    #[test]
    fn our_device_is_recreated_when_it_no_longer_fits_and_its_mtu_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let (c, mut k) = (cfg(&dir), Fake::node("192.0.2.1/24"));
        let mut n = node(&k, &[2]);
        ensure(&mut k, &c, &n).unwrap();
        if let Some(v) = k.link_mut("segvx101").vxlan.as_mut() {
            v.learning = Some(false);
        }
        n.mtu = 1400;
        let before = k.writes.len();
        ensure(&mut k, &c, &n).unwrap();
        let writes = k.writes[before..].join("\n");
        assert!(writes.contains("delete link segvx101"), "{writes}");
        assert!(writes.contains("create vxlan segvx101"), "{writes}");
        assert!(writes.contains("change segbr101 Mtu(1400)"), "{writes}");
        assert_eq!(
            flood_of(&k),
            [ip(2)],
            "the new device gets its flood entries"
        );
    }

    #[test]
    fn a_recreated_bridge_takes_this_networks_pods_back_and_a_broken_peers_file_removes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (c, mut k) = (cfg(&dir), Fake::node("192.0.2.1/24"));
        k.add_link("sv0123456789ab", "veth");
        k.link_mut("sv0123456789ab").alias = Some("sticky-vxlan vxeth1 c1 net1".into());
        k.add_link("sv_other", "veth");
        k.link_mut("sv_other").alias = Some("sticky-vxlan other c2 net1".into());
        let mut n = node(&k, &[2, 3]);
        ensure(&mut k, &c, &n).unwrap();
        let br = k.seen.link("segbr101").unwrap().index;
        assert_eq!(k.seen.link("sv0123456789ab").unwrap().master, Some(br));
        assert_eq!(k.seen.link("sv_other").unwrap().master, None, "not ours");

        n.remote = vec![ip(2)];
        n.peers_file_error = Some("half-written".into());
        ensure(&mut k, &c, &n).unwrap();
        assert_eq!(flood_of(&k), [ip(2), ip(3)]);
        n.peers_file_error = None;
        ensure(&mut k, &c, &n).unwrap();
        assert_eq!(flood_of(&k), [ip(2)]);
    }

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
        assert!(devices::same_tunnel(&l(info.clone()), &want));
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
            assert!(!devices::same_tunnel(&l(changed), &want));
        }
    }
}
