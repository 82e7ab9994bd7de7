//! A segment's devices on this node: the bridge, the VXLAN device for the VNI (learning on,
//! enslaved to the bridge) and one all-zero FDB entry per other node, so broadcast, unknown
//! unicast and multicast frames are flooded to every node of the segment and pods' MACs are
//! learned from their frames.
//!
//! Both devices carry the network's marker as their alias; a device of the same name
//! without it is someone else's and is refused, never adopted. Everything is idempotent and
//! runs under the segment's lock.
//!
//! As in the main mode: read once ([`Observed`]), decide ([`super::plan`], pure), apply
//! ([`super::apply`]).

use super::config::Config;
use super::node::SegmentNode;
use super::plan::{self, Devices, FLOOD, Observed};
use super::{Error, apply};
use sticky_overlay::kernel::Kernel;
use sticky_overlay::state_dir;

/// Takes the segment's lock, `<stateDir>/<name>.segment.lock`, the way the main mode takes
/// its own ([`state_dir::lock_at`]: no link followed, a FIFO refused).
pub fn lock(cfg: &Config) -> Result<state_dir::Lock, Error> {
    state_dir::lock_at(&cfg.state_dir, &cfg.lock_path())
        .map_err(|e| Error::Vxlan(sticky_overlay::Error::Lock(e)))
}

/// What the kernel holds of the segment's devices ([`Observed`]), as much as [`plan::plan`] needs: two link lookups, the flood entries of a device that is
/// kept, and every link when a device is to be made.
pub fn read<K: Kernel>(k: &mut K, cfg: &Config, node: &SegmentNode) -> Result<Observed, Error> {
    let want = plan::spec(cfg, node);
    let bridge = k.link(&cfg.bridge())?;
    let vxlan = k.link(&want.name)?;
    let flood = match vxlan.as_ref().filter(|l| plan::keeps(l, &want)) {
        Some(l) => k
            .fdb(l.index)?
            .into_iter()
            .filter(|f| f.mac == FLOOD && f.permanent)
            .map(|f| f.dst)
            .collect(),
        None => Vec::new(),
    };
    let links = if plan::makes_a_device(bridge.as_ref(), vxlan.as_ref(), &want) {
        k.links()?
    } else {
        Vec::new()
    };
    Ok(Observed {
        bridge,
        vxlan,
        flood,
        links,
    })
}

/// Bridge, VXLAN device and flood entries for this segment on this node: read ([`Observed`]),
/// decide ([`plan::plan`], pure), apply ([`apply::apply`]). The caller holds the segment's
/// [`lock`].
pub fn ensure<K: Kernel>(k: &mut K, cfg: &Config, node: &SegmentNode) -> Result<Devices, Error> {
    let seen = read(k, cfg, node)?;
    let plan = plan::plan(cfg, node, &seen)?;
    apply::apply(k, cfg, &plan, &seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};
    use sticky_overlay::fake::Fake;
    use sticky_overlay::mac::vtep_mac;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))
    }

    /// Segment `vxeth1` (VNI 101) with its state in `dir`.
    fn cfg(dir: &tempfile::TempDir) -> Config {
        let raw = json!({"type": "sticky-vxlan", "mode": "segment", "vni": 101,
                         "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}],
                         "stateDir": dir.path()});
        Config::from_json("vxeth1", &raw).unwrap()
    }

    /// Node 1 of a segment on nodes 1 to 3 (node 3 left out with `remote`).
    fn node(k: &Fake, remote: &[u8]) -> SegmentNode {
        SegmentNode {
            local_ip: ip(1),
            underlay: k.seen.link("eth0").cloned().unwrap(),
            mtu: 1450,
            members: [1].iter().chain(remote).map(|n| ip(*n)).collect(),
            remote: remote.iter().map(|n| ip(*n)).collect(),
            peers_file_error: None,
        }
    }

    fn flood_of(k: &Fake) -> Vec<IpAddr> {
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
        assert!(
            k.queries.contains(&"dump links".to_string()),
            "devices made"
        );
        // Idempotent: a second ADD changes nothing (IPv6 is kept off every time), and reads
        // two links and the flood entries, not every link of the node.
        let before = k.writes.len();
        k.queries.clear();
        ensure(&mut k, &c, &n).unwrap();
        assert_eq!(k.queries, ["dump fdb"]);
        assert_eq!(
            k.writes[before..],
            ["disable ipv6 segbr101", "disable ipv6 segvx101"]
        );
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
        k.link_mut("theirs").vxlan = Some(sticky_netlink::link::VxlanInfo {
            vni: Some(101),
            port: Some(8472),
            ..Default::default()
        });
        let err = ensure(&mut k, &c, &n).unwrap_err();
        assert!(
            matches!(err, Error::Vxlan(sticky_overlay::Error::VniTaken { .. })),
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
}
