//! The node's shared data path as a plan: what the kernel must be told, worked out as pure
//! data from the node ([`LocalNode`]) and what the kernel holds ([`Observed`]), the ownership rules
//! applied. [`super::apply`] carries it out; nothing here touches the kernel.
//!
//! Ownership: sticky-vxlan changes only what it made. Its VTEP and bridge carry a marker,
//! their alias `sticky-vxlan:vtep <network>` / `sticky-vxlan:bridge <network>` ([`marker`]).
//! A device of the configured name without the marker, or with another network's, is refused
//! ([`sticky_overlay::devices`]); routes, neighbours and FDB entries are only changed on the
//! VTEP, addresses only on the VTEP and the bridge, and a route on a peer's subnet that goes
//! through any other device is refused, named, and left alone.
//!
//! Order (so any earlier state converges, issue 8 rule 2): the devices first (a VTEP whose
//! parameters changed is recreated, which drops its entries; this network's pod veths off
//! the bridge go back on it); then every stale entry is
//! removed (an own address or gateway of an earlier subnet, peers no longer listed), so a new
//! peer taking this node's old subnet never meets its old `/32` or connected route; then the
//! wanted entries; then sysctls and nftables. While the peers file cannot be used nothing is
//! removed.

use foldhash::{HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::firewall;
use sticky_overlay::config::Config;
use sticky_overlay::devices;
use sticky_overlay::mac::vtep_mac;
use sticky_overlay::node::{LocalNode, Observed};
use sticky_overlay::peers::Peer;
use sticky_overlay::pod::gateway_of;
use sticky_overlay::step::Dev;
pub use sticky_overlay::step::Step;
use sticky_overlay::{Error, ROUTE_PROTOCOL};

use sticky_netlink::route::Route;

pub use sticky_overlay::devices::marker;

/// Everything to do, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// What the VTEP must hold for the current peer set.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Desired {
    /// (peer VTEP MAC, peer underlay address).
    pub fdb: Vec<([u8; 6], IpAddr)>,
    /// (peer subnet network address, peer VTEP MAC).
    pub neighbours: Vec<(IpAddr, [u8; 6])>,
    /// Peer subnets (their own, and those a site gateway carries), each routed onlink through
    /// the VTEP via the network address of the peer's own subnet of its family.
    pub routes: Vec<(IpNet, IpAddr)>,
    /// This node's own `/32`s on the VTEP (the network address of each IPv4 subnet).
    pub own: Vec<IpNet>,
    /// The bridge's gateway addresses (first address of each local subnet, with its prefix).
    pub gateways: Vec<IpNet>,
}

/// Pure: what the VTEP and the bridge hold for this node and its peers (flannel's entries).
pub(crate) fn desired(vni: u32, node: &LocalNode) -> Desired {
    let mut d = Desired::default();
    for p in &node.remote {
        d.add_peer(vni, p);
    }
    (d.own, d.gateways) = local_addresses(node);
    d
}

impl Desired {
    /// Adds the entries of the remote peer `p`: its FDB entry, a neighbour per subnet, a route
    /// per subnet routed to it.
    pub(crate) fn add_peer(&mut self, vni: u32, p: &Peer) {
        let mac = p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni));
        self.fdb.push((mac, p.ip));
        for s in &p.subnets {
            self.neighbours.push((s.network(), mac));
        }
        for s in p.routed() {
            if let Some(via) = p.next_hop(s) {
                self.routes.push((*s, via));
            }
        }
    }
}

/// This node's own `/32`s on the VTEP (the network address of each IPv4 subnet) and the
/// bridge's gateways (the first address of each local subnet, with its prefix).
pub(crate) fn local_addresses(node: &LocalNode) -> (Vec<IpNet>, Vec<IpNet>) {
    let (mut own, mut gateways) = (Vec::new(), Vec::new());
    for s in &node.local.subnets {
        if s.addr().is_ipv4()
            && let Ok(net) = IpNet::new(s.network(), 32)
        {
            own.push(net);
        }
        // Same family and prefix as a valid subnet, so `IpNet::new` cannot fail.
        if let Some(gw) = gateway_of(s)
            && let Ok(net) = IpNet::new(gw, s.prefix_len())
        {
            gateways.push(net);
        }
    }
    (own, gateways)
}

/// The route [`Step::ReplaceRoute`] installs for `dst` via `via` through the VTEP `vtep`,
/// with [`metric_for`] `via`.
pub(crate) fn route_for(dst: IpNet, via: IpAddr, vtep: u32) -> Route {
    Route {
        dst,
        gateway: Some(via),
        oif: Some(vtep),
        onlink: true,
        metric: metric_for(via),
        protocol: ROUTE_PROTOCOL,
    }
}

/// The metric of the routes via `via`: for IPv4, the gateway's low 24 bits (unique inside a
/// /8 of pod subnets, whatever their size), so that no two peers' routes share a bucket of the
/// kernel's `fib_info` hash; IPv6 keeps its default.
///
/// Why: the kernel keeps one `fib_info` per distinct gateway and hashes it on the protocol,
/// scope, source, metric and device, never the gateway. Peer routes differ only in their
/// gateway, so all of them landed in one bucket and each insert walked all the others:
/// programming 100,000 peers took 19 minutes (issue 37). With the metric apart, the same
/// routes take 2.2 s, and taking the VTEP down 0.2 s (nexthop objects spread them too, but
/// removing 100,000 of them with the device flushes the table once per object: 528 s). The
/// metric orders only routes of the same destination, and a peer subnet has one route, ours
/// (another is refused, [`Error::ForeignRoute`]). IPv6 keeps no such hash.
pub(crate) fn metric_for(via: IpAddr) -> u32 {
    match via {
        IpAddr::V4(v4) => u32::from(v4) & 0x00ff_ffff,
        IpAddr::V6(_) => 0,
    }
}

fn link_local(net: &IpNet) -> bool {
    match net.addr() {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// A bridge address that is the gateway of a subnet this node no longer has (its subnet
/// moved, or its prefix changed). Only addresses of the shape sticky-vxlan adds (the first
/// address of its subnet) are ever removed; link-local ones, and anything inside a current
/// subnet with its prefix (an IPAM's own gateway), stay.
fn stale_gateway(net: &IpNet, own: &[IpNet]) -> bool {
    let current = own
        .iter()
        .any(|s| s.contains(&net.addr()) && s.prefix_len() == net.prefix_len());
    !current && !link_local(net) && gateway_of(&net.trunc()) == Some(net.addr())
}

/// Pure: the plan that brings the node from `seen` to what `cfg` and `node` say.
pub fn plan(cfg: &Config, node: &LocalNode, seen: &Observed) -> Result<Plan, Error> {
    let want = desired(cfg.vni, node);
    let mut steps = Vec::new();
    // A VTEP this network made under another name (its vni or vtepName changed) goes first:
    // it would keep the peers' routes.
    let retired = devices::retired_vteps(cfg, seen);
    for l in &retired {
        steps.push(Step::DeleteLink {
            name: l.name.clone(),
        });
    }
    let vtep = devices::vtep(cfg, node, seen, &mut steps)?;
    let bridge = devices::bridge(cfg, node, seen, &mut steps)?;
    // This network's pods off the bridge (all of them when it is made again) go back on it.
    let bridge_index = bridge.map(|b| b.index);
    for l in &seen.pods {
        if bridge_index.is_none() || l.master != bridge_index {
            steps.push(Step::Reattach {
                link: l.clone(),
                hairpin: cfg.hairpin_mode,
            });
        }
    }
    // Entries on a VTEP that is (re)created are gone with the old device.
    let (have_fdb, have_neigh, vtep_index) = match vtep {
        Some(l) => (&seen.vtep_fdb[..], &seen.vtep_neighbours[..], Some(l.index)),
        None => (&[][..], &[][..], None),
    };
    let vtep_addrs = vtep_index.map(|i| seen.addresses_of(i)).unwrap_or_default();
    let bridge_addrs = bridge
        .map(|b| seen.addresses_of(b.index))
        .unwrap_or_default();
    // Devices that stay ours, and ours that this plan deletes (with their routes).
    let mut gone: Vec<u32> = retired.iter().map(|l| l.index).collect();
    if vtep.is_none()
        && let Some(old) = seen.link(&cfg.vtep_name)
    {
        gone.push(old.index);
    }
    let ours = |oif: Option<u32>| {
        oif.is_some_and(|i| {
            Some(i) == vtep_index || Some(i) == bridge.map(|b| b.index) || gone.contains(&i)
        })
    };

    // Every lookup below goes through an index: the plan is O(n) in the peers (at 5,000
    // peers the searches it replaced made a reconcile 0.7 s).
    let mut foreign: HashMap<IpNet, &Route> = HashMap::default();
    for r in seen.routes.iter().filter(|r| !ours(r.oif)) {
        foreign.entry(r.dst).or_insert(r);
    }
    let seen_routes: HashSet<&Route> = seen.routes.iter().collect();
    let our_route =
        |r: &Route| r.protocol == ROUTE_PROTOCOL && vtep_index.is_some() && r.oif == vtep_index;
    let want_routes: HashMap<IpNet, IpAddr> = want.routes.iter().copied().collect();
    let want_neighbours: HashSet<(IpAddr, [u8; 6])> = want.neighbours.iter().copied().collect();
    let have_fdb_set: HashSet<([u8; 6], IpAddr)> =
        have_fdb.iter().map(|f| (f.mac, f.dst)).collect();
    let have_neigh_set: HashSet<(IpAddr, [u8; 6])> = have_neigh
        .iter()
        .filter(|n| n.permanent)
        .map(|n| (n.ip, n.mac))
        .collect();

    // A peer subnet already routed through a device that is not ours: someone else's route.
    for (dst, _) in &want.routes {
        if let Some(&r) = foreign.get(dst) {
            let device = r
                .oif
                .and_then(|i| seen.link_index(i))
                .map(|l| l.name.clone());
            return Err(Error::ForeignRoute {
                route: r.clone(),
                device,
            });
        }
    }

    // This node's own /32 first: the kernel flushes every route and neighbour of a device that
    // loses its last IPv4 address, so the old /32 must never go before the new one is there
    // (a node whose subnet moved lost all its peer routes until the next reconcile).
    for net in &want.own {
        if !vtep_addrs.contains(net) {
            steps.push(Step::AddAddress {
                dev: Dev::Vtep,
                net: *net,
            });
        }
    }
    let removing = node.peers_file_error.is_none();
    if removing {
        for net in &bridge_addrs {
            if stale_gateway(net, &node.local.subnets) {
                steps.push(Step::DeleteAddress {
                    dev: Dev::Bridge,
                    net: *net,
                });
            }
        }
        for net in &vtep_addrs {
            if net.addr().is_ipv4() && net.prefix_len() == 32 && !want.own.contains(net) {
                steps.push(Step::DeleteAddress {
                    dev: Dev::Vtep,
                    net: *net,
                });
            }
        }
        // Routes of subnets no longer wanted. One still wanted is replaced in place below, or
        // with another metric, added first and then deleted (`superseded`).
        for r in &seen.routes {
            if our_route(r) && !want_routes.contains_key(&r.dst) {
                steps.push(Step::DeleteRoute(r.clone()));
            }
        }
        for n in have_neigh {
            if n.permanent && !want_neighbours.contains(&(n.ip, n.mac)) {
                steps.push(Step::DeleteNeighbour {
                    ip: n.ip,
                    mac: n.mac,
                });
            }
        }
        let fdb: HashSet<_> = want.fdb.iter().copied().collect();
        for f in have_fdb {
            if !fdb.contains(&(f.mac, f.dst)) {
                steps.push(Step::DeleteFdb {
                    mac: f.mac,
                    dst: f.dst,
                });
            }
        }
    }

    for net in &want.gateways {
        if !bridge_addrs.contains(net) {
            steps.push(Step::AddAddress {
                dev: Dev::Bridge,
                net: *net,
            });
        }
    }
    for &(mac, dst) in &want.fdb {
        if !have_fdb_set.contains(&(mac, dst)) {
            steps.push(Step::AddFdb { mac, dst });
        }
    }
    for &(ip, mac) in &want.neighbours {
        if !have_neigh_set.contains(&(ip, mac)) {
            steps.push(Step::ReplaceNeighbour { ip, mac });
        }
    }
    for &(dst, via) in &want.routes {
        let there = vtep_index.is_some_and(|i| seen_routes.contains(&route_for(dst, via, i)));
        if !there {
            steps.push(Step::ReplaceRoute { dst, via });
        }
    }
    // Ours on a subnet still wanted, under another metric (an earlier release's 0): a route
    // of its own, so deleted only now that the wanted one is there (the subnet is never
    // without a route).
    if removing {
        for r in seen.routes.iter().filter(|r| our_route(r)) {
            let superseded = want_routes
                .get(&r.dst)
                .is_some_and(|&via| metric_for(via) != r.metric);
            if superseded {
                steps.push(Step::DeleteRoute(r.clone()));
            }
        }
    }

    steps.push(Step::Sysctl {
        key: "net/ipv4/ip_forward".into(),
        value: "1".into(),
    });
    let v6 = node
        .local
        .subnets
        .iter()
        .chain(node.remote.iter().flat_map(|p| &p.subnets))
        .any(|s| s.addr().is_ipv6());
    if v6 {
        steps.push(Step::Sysctl {
            key: "net/ipv6/conf/all/forwarding".into(),
            value: "1".into(),
        });
    }
    // While the peers file cannot be used, every peer still programmed stays allowed through
    // the peer-only rule as well (without a kept copy, `node.remote` may be much shorter).
    let mut allowed: Vec<IpAddr> = node.remote.iter().map(|p| p.ip).collect();
    if !removing {
        allowed.extend(have_fdb.iter().map(|f| f.dst));
    }
    // Every table the network owns is replaced or deleted, in both families.
    let tables = firewall::tables(cfg, node.subnet_v4(), node.local_ip, &allowed);
    match tables.script() {
        Some(script) => steps.push(Step::Firewall { script }),
        None => steps.push(Step::RemoveTables {
            tables: tables.delete,
        }),
    }
    Ok(Plan { steps })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::main_mode::apply::apply;
    use serde_json::json;
    use std::net::Ipv4Addr;
    use sticky_netlink::link::Link;
    use sticky_netlink::neigh::{Fdb, Neighbour};
    use sticky_overlay::devices::{compatible, vtep_spec};
    use sticky_overlay::fake::{Fake, conf, node_with, peer};
    use sticky_overlay::kernel::Kernel;
    use sticky_overlay::kernel::LinkChange;
    use sticky_overlay::peers::Peer;

    /// Node 192.0.2.1 (10.244.1.0/24) with peer 192.0.2.2 (10.244.2.0/24), on a fake whose
    /// `eth0` has index 2 as [`node_with`] says.
    fn setup() -> (Config, LocalNode, Fake) {
        let cfg = conf(json!({}));
        let node = node_with(
            "192.0.2.1",
            "10.244.1.0/24",
            &[("192.0.2.2", "10.244.2.0/24")],
        );
        let k = Fake::node("192.0.2.1/24");
        (cfg, node, k)
    }

    /// Plans against the fake's state and applies the plan to it; returns the plan.
    fn reconcile(cfg: &Config, node: &LocalNode, k: &mut Fake) -> Result<Plan, Error> {
        let seen = Observed::read(k, cfg, &sticky_overlay::node::FdbRead::Whole)?;
        let p = plan(cfg, node, &seen)?;
        apply(k, cfg, &p, &seen)?;
        Ok(p)
    }

    fn has(p: &Plan, f: impl Fn(&Step) -> bool) -> bool {
        p.steps.iter().any(f)
    }

    fn position(p: &Plan, f: impl Fn(&Step) -> bool) -> usize {
        p.steps.iter().position(f).expect("step in plan")
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A converged node's plan: only what every reconcile enforces (sysctls, and without
    /// nftables options the removal of any table of the network).
    fn only_always_steps(p: &Plan) -> bool {
        p.steps
            .iter()
            .all(|s| matches!(s, Step::Sysctl { .. } | Step::RemoveTables { .. }))
    }

    #[test]
    fn desired_entries_are_what_flannel_programs() {
        let mut node = node_with("192.0.2.1", "10.244.1.0/24", &[]);
        node.remote = vec![
            Peer {
                subnets: vec![net("10.244.2.0/24"), net("fd00:2::/64")],
                ..peer("192.0.2.2", "10.244.2.0/24")
            },
            Peer {
                mac: Some([2, 0x42, 0, 0, 0, 4]),
                ..peer("192.0.2.4", "10.244.4.0/24")
            },
        ];
        let d = desired(1, &node);
        assert_eq!(d.own, vec![net("10.244.1.0/32")]);
        assert_eq!(d.gateways, vec![net("10.244.1.1/24")]);
        assert_eq!(d.fdb[0].0, [0x0a, 1, 192, 0, 2, 2]);
        assert_eq!(d.fdb[1].0, [2, 0x42, 0, 0, 0, 4], "explicit mac wins");
        assert_eq!(d.routes.len(), 3);
        // IPv4 with the metric of its gateway's low 24 bits (244.2.0), IPv6 the default.
        assert_eq!(
            route_for(d.routes[0].0, d.routes[0].1, 9).to_string(),
            "10.244.2.0/24 via 10.244.2.0 dev #9 onlink proto 118 metric 15991296"
        );
        assert_eq!(
            route_for(d.routes[1].0, d.routes[1].1, 9).to_string(),
            "fd00:2::/64 via fd00:2:: dev #9 onlink proto 118"
        );
        assert_eq!(d.neighbours[1].0, "fd00:2::".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_fresh_node_is_created_marked_and_then_has_nothing_left_to_do() {
        let (cfg, node, mut k) = setup();
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        let create = position(
            &p,
            |s| matches!(s, Step::CreateVtep(v) if v.mac == [0x0a, 1, 192, 0, 2, 1]),
        );
        let mark = position(
            &p,
            |s| matches!(s, Step::Change { dev: Dev::Vtep, change: LinkChange::Alias(a) } if a == "sticky-vxlan:vtep edge"),
        );
        assert!(create < mark);
        assert!(has(&p, |s| matches!(
            s,
            Step::CreateBridge {
                mac: Some([0x0e, 1, 10, 244, 1, 1]),
                mtu: 1450,
                ..
            }
        )));
        assert!(has(&p, |s| *s
            == Step::AddAddress {
                dev: Dev::Vtep,
                net: net("10.244.1.0/32")
            }));
        assert!(has(&p, |s| *s
            == Step::AddAddress {
                dev: Dev::Bridge,
                net: net("10.244.1.1/24")
            }));
        assert!(has(&p, |s| *s
            == Step::ReplaceRoute {
                dst: net("10.244.2.0/24"),
                via: "10.244.2.0".parse().unwrap(),
            }));
        assert!(has(
            &p,
            |s| matches!(s, Step::AddFdb { dst, .. } if dst.to_string() == "192.0.2.2")
        ));
        assert!(
            !has(&p, |s| matches!(s, Step::Firewall { .. })),
            "no nft script without ipMasq/peerOnlyPort"
        );
        let vtep = k.link_mut("sticky.1").clone();
        assert_eq!(vtep.alias.as_deref(), Some("sticky-vxlan:vtep edge"));
        // Converged: the same reconcile again changes nothing.
        let again = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(only_always_steps(&again), "{again:?}");
    }

    #[test]
    fn a_drifted_mac_and_mtu_are_repaired_not_recreated() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        let l = k.link_mut("sticky.1");
        l.mac = Some([2, 0, 0, 0, 0, 9]);
        l.mtu = Some(1400);
        l.up = false;
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(!has(&p, |s| matches!(
            s,
            Step::DeleteLink { .. } | Step::CreateVtep(_)
        )));
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Vtep,
                change: LinkChange::Mac([0x0a, 1, 192, 0, 2, 1])
            }));
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Vtep,
                change: LinkChange::Mtu(1450)
            }));
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Vtep,
                change: LinkChange::Up
            }));
    }

    #[test]
    fn our_vtep_with_other_parameters_is_recreated_and_its_entries_go_with_it() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        let moved = conf(json!({"port": 4789}));
        let p = reconcile(&moved, &node, &mut k).unwrap();
        let del = position(
            &p,
            |s| matches!(s, Step::DeleteLink { name } if name == "sticky.1"),
        );
        let create = position(&p, |s| matches!(s, Step::CreateVtep(v) if v.port == 4789));
        assert!(del < create);
        assert!(
            !has(&p, |s| matches!(
                s,
                Step::DeleteFdb { .. } | Step::DeleteRoute(_) | Step::DeleteNeighbour { .. }
            )),
            "the old device's entries are gone with it: {p:?}"
        );
        assert!(has(&p, |s| *s
            == Step::ReplaceRoute {
                dst: net("10.244.2.0/24"),
                via: "10.244.2.0".parse().unwrap(),
            }));
    }

    #[test]
    fn a_vtep_we_did_not_make_is_refused_and_untouched() {
        let (cfg, node, mut k) = setup();
        // Same name, another VNI, no marker.
        let i = k.add_link("sticky.1", "vxlan");
        k.link_mut("sticky.1").vxlan = Some(sticky_netlink::link::VxlanInfo {
            vni: Some(77),
            ..Default::default()
        });
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::NotOurs { device, role: "vtep" } if device == "sticky.1"),
            "{err}"
        );
        assert!(k.writes.is_empty(), "{:?}", k.writes);
        // Marked by another network: refused, naming it.
        k.link_mut("sticky.1").alias = Some("sticky-vxlan:vtep other".into());
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::OtherNetwork { network, .. } if network == "other"),
            "{err}"
        );
        // Another kind of device.
        k.link_mut("sticky.1").kind = Some("dummy".into());
        assert!(matches!(
            reconcile(&cfg, &node, &mut k),
            Err(Error::WrongKind { .. })
        ));
        assert!(k.writes.is_empty());
        let _ = i;
    }

    #[test]
    fn another_device_holding_the_vni_and_port_is_refused() {
        let (cfg, node, mut k) = setup();
        k.add_link("flannel.1", "vxlan");
        k.link_mut("flannel.1").vxlan = Some(sticky_netlink::link::VxlanInfo {
            vni: Some(1),
            port: Some(8472),
            ..Default::default()
        });
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::VniTaken { device, .. } if device == "flannel.1"),
            "{err}"
        );
        assert!(k.writes.is_empty());
    }

    #[test]
    fn devices_of_the_previous_release_are_adopted_and_marked() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        // As a release without markers left them: exactly what this config makes.
        k.link_mut("sticky.1").alias = None;
        k.link_mut("stickybr0").alias = None;
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(
            &p,
            |s| matches!(s, Step::Change { dev: Dev::Vtep, change: LinkChange::Alias(a) } if a == "sticky-vxlan:vtep edge")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::Change { dev: Dev::Bridge, change: LinkChange::Alias(a) } if a == "sticky-vxlan:bridge edge")
        ));
        assert!(!has(&p, |s| matches!(s, Step::DeleteLink { .. })));
        // An unmarked VTEP whose MAC is not the kept one is not what we made: refused.
        k.link_mut("sticky.1").alias = None;
        k.link_mut("sticky.1").mac = Some([2, 0, 0, 0, 0, 1]);
        assert!(matches!(
            reconcile(&cfg, &node, &mut k),
            Err(Error::NotOurs { .. })
        ));
        // Nor is an unmarked bridge whose MAC is not the kept MAC of one of its addresses.
        let (cfg, node, mut k) = setup();
        k.add_link("stickybr0", "bridge");
        k.add_address("stickybr0", "10.244.1.1/24");
        k.link_mut("stickybr0").mac = Some([2, 0, 0, 0, 0, 7]);
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::NotOurs { role: "bridge", .. }),
            "{err}"
        );
    }

    #[test]
    fn the_uplink_is_never_the_bridge() {
        let (_, node, mut k) = setup();
        let cfg = conf(json!({"bridge": "eth0"}));
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::UnderlayBridge { device, .. } if device == "eth0"),
            "{err}"
        );
        // A bridge holding the underlay address, even one marked as ours.
        let (cfg, node, mut k) = setup();
        k.add_link("stickybr0", "bridge");
        k.add_address("stickybr0", "192.0.2.1/24");
        k.link_mut("stickybr0").alias = Some("sticky-vxlan:bridge edge".into());
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(matches!(err, Error::UnderlayBridge { .. }), "{err}");
    }

    /// The lengths of the runs of entry steps in `p`, in order.
    fn entry_runs(p: &Plan) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut run = 0;
        for s in &p.steps {
            if s.is_entry() {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        runs.extend((run > 0).then_some(run));
        runs
    }

    #[test]
    fn each_run_of_entry_steps_is_one_batch_written_in_plan_order() {
        let (cfg, mut node, mut k) = setup();
        node.remote.push(peer("192.0.2.3", "10.244.3.0/24"));
        let first = reconcile(&cfg, &node, &mut k).unwrap();
        assert_eq!(entry_runs(&first), [6], "{first:?}");
        assert_eq!(k.batches, [6]);
        let fdb = k
            .writes
            .iter()
            .position(|w| w.starts_with("add fdb"))
            .unwrap();
        let kinds: Vec<&str> = k.writes[fdb..fdb + 6]
            .iter()
            .filter_map(|w| w.split(' ').nth(1))
            .collect();
        let plan_order = ["fdb", "fdb", "neighbour", "neighbour", "route", "route"];
        assert_eq!(kinds, plan_order, "{:?}", k.writes);
        // This node's subnet moves, a peer goes, another comes: deletions, the new gateway,
        // then additions; each run of entries is one batch, never across an address step.
        k.batches.clear();
        node.local = peer("192.0.2.1", "10.244.5.0/24");
        node.remote.pop();
        node.remote.push(peer("192.0.2.4", "10.244.4.0/24"));
        let moved = reconcile(&cfg, &node, &mut k).unwrap();
        assert_eq!(entry_runs(&moved), [3, 3], "{moved:?}");
        assert_eq!(k.batches, [3, 3]);
    }

    #[test]
    fn peers_no_longer_listed_are_removed() {
        let (cfg, mut node, mut k) = setup();
        node.remote.push(peer("192.0.2.3", "10.244.3.0/24"));
        reconcile(&cfg, &node, &mut k).unwrap();
        node.remote.pop();
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteFdb { dst, .. } if dst.to_string() == "192.0.2.3")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteNeighbour { ip, .. } if ip.to_string() == "10.244.3.0")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteRoute(r) if r.dst == net("10.244.3.0/24"))
        ));
        assert!(!has(
            &p,
            |s| matches!(s, Step::DeleteFdb { dst, .. } if dst.to_string() == "192.0.2.2")
        ));
        assert!(only_always_steps(&reconcile(&cfg, &node, &mut k).unwrap()));
    }

    #[test]
    fn no_two_peers_routes_share_a_metric_within_a_slash_8() {
        let metrics: HashSet<u32> = (0..=255u8)
            .flat_map(|a| (0..=255u8).map(move |b| Ipv4Addr::new(10, a, b, 0)))
            .map(|via| metric_for(IpAddr::V4(via)))
            .collect();
        assert_eq!(metrics.len(), 65536);
        let v6 = "fd00:2::".parse().unwrap();
        assert_eq!(metric_for(v6), 0, "IPv6 keeps its default");
    }

    /// A node an earlier release programmed: every route with metric 0.
    fn programmed_the_old_way(cfg: &Config, node: &LocalNode, k: &mut Fake) {
        reconcile(cfg, node, k).unwrap();
        for r in &mut k.seen.routes {
            if r.protocol == ROUTE_PROTOCOL {
                r.metric = 0;
            }
        }
    }

    #[test]
    fn a_route_of_another_metric_goes_only_after_the_wanted_one_is_there() {
        let (cfg, mut node, mut k) = setup();
        node.remote.push(peer("192.0.2.3", "10.244.3.0/24"));
        programmed_the_old_way(&cfg, &node, &mut k);
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        for dst in ["10.244.2.0/24", "10.244.3.0/24"] {
            let added = position(
                &p,
                |s| matches!(s, Step::ReplaceRoute { dst: d, .. } if *d == net(dst)),
            );
            let deleted = position(
                &p,
                |s| matches!(s, Step::DeleteRoute(r) if r.dst == net(dst) && r.metric == 0),
            );
            assert!(
                added < deleted,
                "{dst} would have no route for a moment: {p:?}"
            );
        }
        let metrics: Vec<u32> = k
            .seen
            .routes
            .iter()
            .filter(|r| r.protocol == ROUTE_PROTOCOL)
            .map(|r| r.metric)
            .collect();
        assert_eq!(metrics.len(), 2, "{:?}", k.seen.routes);
        assert!(!metrics.contains(&0), "{metrics:?}");
        assert!(only_always_steps(&reconcile(&cfg, &node, &mut k).unwrap()));
    }

    #[test]
    fn while_the_peers_file_cannot_be_used_the_earlier_route_stays_beside_the_new() {
        let (cfg, mut node, mut k) = setup();
        programmed_the_old_way(&cfg, &node, &mut k);
        node.peers_file_error = Some("unreadable".into());
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(&p, |s| matches!(s, Step::ReplaceRoute { .. })));
        assert!(!has(&p, |s| matches!(s, Step::DeleteRoute(_))), "{p:?}");
    }

    /// Issue 37: one peer moved among 100,000 plans that peer's entries and nothing else (each
    /// entry step is one netlink request): what a change costs the kernel grows with the
    /// change, not with the cluster.
    #[test]
    fn one_peer_moved_among_100000_plans_only_its_own_entries() {
        let cfg = conf(json!({}));
        let mut k = Fake::node("192.0.2.1/24");
        let mut node = node_with("192.0.2.1", "10.244.1.0/24", &[]);
        reconcile(&cfg, &node, &mut k).unwrap();
        let first = u32::from(Ipv4Addr::new(198, 18, 0, 1));
        let pods = u32::from(Ipv4Addr::new(10, 0, 0, 0));
        node.remote = (1..=100_000u32)
            .map(|i| Peer {
                ip: IpAddr::V4(Ipv4Addr::from(first + i)),
                subnets: vec![IpNet::new(Ipv4Addr::from(pods + (i << 6)).into(), 26).unwrap()],
                mac: None,
                carries: Vec::new(),
            })
            .collect();
        // The node as a full reconcile leaves it, written straight into the fake (which keeps
        // its entries in lists: one write costs it all the others).
        let vtep = k.seen.link(&cfg.vtep_name).unwrap().index;
        let want = desired(cfg.vni, &node);
        k.fdb.extend(want.fdb.iter().map(|&(mac, dst)| Fdb {
            index: vtep,
            mac,
            dst,
            permanent: true,
        }));
        k.neighbours
            .extend(want.neighbours.iter().map(|&(ip, mac)| Neighbour {
                index: vtep,
                ip,
                mac,
                permanent: true,
            }));
        k.seen.routes.extend(
            want.routes
                .iter()
                .map(|&(dst, via)| route_for(dst, via, vtep)),
        );
        let seen = Observed::read(&mut k, &cfg, &sticky_overlay::node::FdbRead::Whole).unwrap();
        assert!(only_always_steps(&plan(&cfg, &node, &seen).unwrap()));

        let moved = &mut node.remote[49_999];
        let old = moved.subnets[0];
        moved.subnets = vec![net("10.200.0.0/26")];
        let p = plan(&cfg, &node, &seen).unwrap();
        let entries: Vec<&Step> = p.steps.iter().filter(|s| s.is_entry()).collect();
        let new = net("10.200.0.0/26");
        assert!(
            matches!(
                entries[..],
                [
                    Step::DeleteRoute(r),
                    Step::DeleteNeighbour { ip: gone, .. },
                    Step::ReplaceNeighbour { ip: came, .. },
                    Step::ReplaceRoute { dst, .. },
                ] if r.dst == old && *gone == old.network() && *came == new.network() && *dst == new
            ),
            "{entries:?}"
        );
    }

    #[test]
    fn other_sites_subnets_a_gateway_carries_are_routed_through_it_and_removed_with_it() {
        let (cfg, mut node, mut k) = setup();
        // 192.0.2.2 is its site's gateway: it carries two other sites' pod subnets.
        node.remote[0].carries = vec![net("198.18.21.0/24"), net("198.18.22.0/24")];
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        for dst in ["198.18.21.0/24", "198.18.22.0/24"] {
            assert!(
                has(&p, |s| *s
                    == Step::ReplaceRoute {
                        dst: net(dst),
                        via: "10.244.2.0".parse().unwrap(),
                    }),
                "{dst} is routed via the gateway's own subnet: {p:?}"
            );
        }
        assert!(
            !has(
                &p,
                |s| matches!(s, Step::ReplaceNeighbour { ip, .. } if ip.to_string().starts_with("198.18."))
            ),
            "a carried subnet needs no neighbour of its own: {p:?}"
        );
        assert!(only_always_steps(&reconcile(&cfg, &node, &mut k).unwrap()));
        // One site gone: its route goes, the other stays.
        node.remote[0].carries.pop();
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteRoute(r) if r.dst == net("198.18.22.0/24"))
        ));
        assert!(!has(
            &p,
            |s| matches!(s, Step::DeleteRoute(r) if r.dst == net("198.18.21.0/24"))
        ));
        // The carrier changes (another gateway): the route moves to it.
        node.remote[0].carries.clear();
        node.remote.push(Peer {
            carries: vec![net("198.18.21.0/24")],
            ..peer("192.0.2.3", "10.244.3.0/24")
        });
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(&p, |s| *s
            == Step::ReplaceRoute {
                dst: net("198.18.21.0/24"),
                via: "10.244.3.0".parse().unwrap(),
            }));
        assert!(only_always_steps(&reconcile(&cfg, &node, &mut k).unwrap()));
    }

    #[test]
    fn a_bad_peers_file_removes_nothing_and_keeps_programmed_peers_allowed() {
        let cfg = conf(json!({"peerOnlyPort": true}));
        let (_, mut node, mut k) = setup();
        node.remote.push(peer("192.0.2.3", "10.244.3.0/24"));
        reconcile(&cfg, &node, &mut k).unwrap();
        // The file is broken and no copy was kept: only the config's peers are known.
        node.remote.clear();
        node.peers_file_error = Some("peers file: not JSON".into());
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(
            !has(&p, |s| matches!(
                s,
                Step::DeleteFdb { .. }
                    | Step::DeleteNeighbour { .. }
                    | Step::DeleteRoute(_)
                    | Step::DeleteAddress { .. }
            )),
            "{p:?}"
        );
        let script = p
            .steps
            .iter()
            .find_map(|s| match s {
                Step::Firewall { script } => Some(script.clone()),
                _ => None,
            })
            .unwrap();
        assert!(script.contains("192.0.2.2, 192.0.2.3"), "{script}");
    }

    #[test]
    fn a_moved_subnet_is_cleared_before_a_new_peer_takes_it() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        // The bridge's connected route, as the kernel adds it.
        let bridge = k.link_mut("stickybr0").index;
        k.seen.routes.push(Route {
            dst: net("10.244.1.0/24"),
            gateway: None,
            oif: Some(bridge),
            onlink: false,
            metric: 0,
            protocol: 2,
        });
        let moved = node_with(
            "192.0.2.1",
            "10.244.5.0/24",
            &[
                ("192.0.2.2", "10.244.2.0/24"),
                ("192.0.2.3", "10.244.1.0/24"),
            ],
        );
        let p = reconcile(&cfg, &moved, &mut k).unwrap();
        let old_own = position(&p, |s| {
            *s == Step::DeleteAddress {
                dev: Dev::Vtep,
                net: net("10.244.1.0/32"),
            }
        });
        let old_gw = position(&p, |s| {
            *s == Step::DeleteAddress {
                dev: Dev::Bridge,
                net: net("10.244.1.1/24"),
            }
        });
        let route = position(&p, |s| {
            *s == Step::ReplaceRoute {
                dst: net("10.244.1.0/24"),
                via: "10.244.1.0".parse().unwrap(),
            }
        });
        assert!(old_own < route && old_gw < route, "{p:?}");
        assert!(has(&p, |s| *s
            == Step::AddAddress {
                dev: Dev::Vtep,
                net: net("10.244.5.0/32")
            }));
        assert!(has(&p, |s| *s
            == Step::AddAddress {
                dev: Dev::Bridge,
                net: net("10.244.5.1/24")
            }));
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Bridge,
                change: LinkChange::Mac([0x0e, 1, 10, 244, 5, 1])
            }));
        assert!(only_always_steps(&reconcile(&cfg, &moved, &mut k).unwrap()));
    }

    #[test]
    fn a_changed_prefix_replaces_the_gateway_and_foreign_addresses_stay() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        k.add_address("stickybr0", "192.168.50.7/24");
        let narrower = node_with(
            "192.0.2.1",
            "10.244.1.0/25",
            &[("192.0.2.2", "10.244.2.0/24")],
        );
        let p = reconcile(&cfg, &narrower, &mut k).unwrap();
        assert!(has(&p, |s| *s
            == Step::DeleteAddress {
                dev: Dev::Bridge,
                net: net("10.244.1.1/24")
            }));
        assert!(has(&p, |s| *s
            == Step::AddAddress {
                dev: Dev::Bridge,
                net: net("10.244.1.1/25")
            }));
        assert!(
            !has(
                &p,
                |s| matches!(s, Step::DeleteAddress { net, .. } if net.to_string().starts_with("192.168.50."))
            ),
            "an address we would never have added is not ours to remove: {p:?}"
        );
    }

    #[test]
    fn a_vtep_left_by_an_earlier_vni_is_deleted_and_its_routes_are_not_foreign() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        let moved = conf(json!({"vni": 2}));
        let p = reconcile(&moved, &node, &mut k).unwrap();
        assert_eq!(
            p.steps[0],
            Step::DeleteLink {
                name: "sticky.1".into()
            }
        );
        assert!(has(
            &p,
            |s| matches!(s, Step::CreateVtep(v) if v.name == "sticky.2")
        ));
        assert!(k.seen.link("sticky.1").is_none());
        // Another network's VTEP is never retired.
        let other = conf(json!({"vni": 3}));
        let mut k2 = Fake::node("192.0.2.1/24");
        reconcile(&cfg, &node, &mut k2).unwrap();
        k2.link_mut("sticky.1").alias = Some("sticky-vxlan:vtep someone-else".into());
        let err = reconcile(&other, &node, &mut k2).unwrap_err();
        assert!(
            matches!(err, Error::ForeignRoute { .. } | Error::OtherNetwork { .. }),
            "{err}"
        );
        assert!(k2.seen.link("sticky.1").is_some());
    }

    #[test]
    fn a_peer_that_moved_underlay_or_dropped_ipv6_converges() {
        let (cfg, mut node, mut k) = setup();
        node.local.subnets.push(net("fd00:1::/64"));
        node.remote[0].subnets.push(net("fd00:2::/64"));
        reconcile(&cfg, &node, &mut k).unwrap();
        // The peer's node got a new underlay address, and IPv6 went away everywhere.
        let moved = node_with(
            "192.0.2.1",
            "10.244.1.0/24",
            &[("192.0.2.9", "10.244.2.0/24")],
        );
        let p = reconcile(&cfg, &moved, &mut k).unwrap();
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteFdb { dst, .. } if dst.to_string() == "192.0.2.2")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::AddFdb { dst, .. } if dst.to_string() == "192.0.2.9")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::DeleteRoute(r) if r.dst == net("fd00:2::/64"))
        ));
        assert!(has(&p, |s| *s
            == Step::DeleteAddress {
                dev: Dev::Bridge,
                net: net("fd00:1::1/64")
            }));
        assert!(only_always_steps(&reconcile(&cfg, &moved, &mut k).unwrap()));
    }

    #[test]
    fn another_networks_bridge_is_refused() {
        let (cfg, node, mut k) = setup();
        k.add_link("stickybr0", "bridge");
        k.link_mut("stickybr0").alias = Some("sticky-vxlan:bridge other".into());
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(
            matches!(&err, Error::OtherNetwork { device, network } if device == "stickybr0" && network == "other"),
            "{err}"
        );
        assert!(
            k.writes.iter().all(|w| !w.contains("stickybr0")),
            "{:?}",
            k.writes
        );
    }

    #[test]
    fn subnets_swapped_between_two_nodes_converge() {
        let (cfg, node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        let swapped = node_with(
            "192.0.2.1",
            "10.244.2.0/24",
            &[("192.0.2.2", "10.244.1.0/24")],
        );
        let p = reconcile(&cfg, &swapped, &mut k).unwrap();
        let stale = position(
            &p,
            |s| matches!(s, Step::DeleteRoute(r) if r.dst == net("10.244.2.0/24")),
        );
        let own = position(&p, |s| {
            *s == Step::AddAddress {
                dev: Dev::Bridge,
                net: net("10.244.2.1/24"),
            }
        });
        assert!(stale < own, "{p:?}");
        assert!(only_always_steps(
            &reconcile(&cfg, &swapped, &mut k).unwrap()
        ));
    }

    #[test]
    fn a_foreign_route_on_a_peer_subnet_is_refused_and_nothing_is_done() {
        let (cfg, node, mut k) = setup();
        k.seen.routes.push(Route {
            dst: net("10.244.2.0/24"),
            gateway: Some("192.0.2.254".parse().unwrap()),
            oif: Some(2),
            onlink: false,
            metric: 0,
            protocol: 3,
        });
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        // (The plan names the route's device only when it read that link; the reconcile
        // that runs the plan asks for it otherwise.)
        assert!(
            matches!(&err, Error::ForeignRoute { route, .. } if route.oif == Some(2)),
            "{err}"
        );
        assert!(
            err.to_string().contains("10.244.2.0/24 via 192.0.2.254"),
            "{err}"
        );
        assert!(k.writes.is_empty(), "{:?}", k.writes);
    }

    #[test]
    fn a_lowered_underlay_mtu_is_followed_by_vtep_and_bridge() {
        let (cfg, mut node, mut k) = setup();
        reconcile(&cfg, &node, &mut k).unwrap();
        node.mtu = 1350;
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Vtep,
                change: LinkChange::Mtu(1350)
            }));
        assert!(has(&p, |s| *s
            == Step::Change {
                dev: Dev::Bridge,
                change: LinkChange::Mtu(1350)
            }));
    }

    #[test]
    fn sysctls_and_nft_are_steps_of_the_plan() {
        let cfg = conf(json!({"ipMasq": true, "clusterCIDR": "10.244.0.0/16"}));
        let (_, mut node, mut k) = setup();
        node.remote[0].subnets.push(net("fd00:2::/64"));
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert!(has(
            &p,
            |s| matches!(s, Step::Sysctl { key, .. } if key == "net/ipv4/ip_forward")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::Sysctl { key, .. } if key == "net/ipv6/conf/all/forwarding")
        ));
        assert!(has(
            &p,
            |s| matches!(s, Step::Firewall { script } if script.contains("masquerade"))
        ));
        assert!(k.writes.iter().any(|w| w.starts_with("nft ")));
    }

    #[test]
    fn this_networks_pods_off_the_bridge_go_back_on_it_with_hairpin() {
        let (_, node, mut k) = setup();
        let cfg = conf(json!({"hairpinMode": true}));
        let pod = |k: &mut Fake, name: &str, network: &str| {
            k.add_link(name, "veth");
            k.link_mut(name).alias = Some(format!("sticky-vxlan {network} c-{name} eth0"));
        };
        pod(&mut k, "sv01", "edge");
        pod(&mut k, "sv02", "edge");
        pod(&mut k, "sv03", "other");
        // A veth of ours without our alias (the node's uplink is one in these fakes) stays.
        let reattached = |p: &Plan| -> Vec<(String, bool)> {
            p.steps
                .iter()
                .filter_map(|s| match s {
                    Step::Reattach { link, hairpin } => Some((link.name.clone(), *hairpin)),
                    _ => None,
                })
                .collect()
        };
        // A fresh bridge: every pod of this network, none of another's.
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        let bridge = k.seen.link("stickybr0").unwrap().index;
        assert_eq!(
            reattached(&p),
            [("sv01".to_string(), true), ("sv02".to_string(), true)]
        );
        let create = position(&p, |s| matches!(s, Step::CreateBridge { .. }));
        assert!(create < position(&p, |s| matches!(s, Step::Reattach { .. })));
        assert!(
            k.writes.contains(&"hairpin sv01".to_string()),
            "{:?}",
            k.writes
        );
        assert_eq!(k.seen.link("sv01").unwrap().master, Some(bridge));
        assert_eq!(k.seen.link("sv03").unwrap().master, None, "not ours");
        // All on the bridge: nothing to do; one taken off by hand: only that one.
        assert_eq!(reattached(&reconcile(&cfg, &node, &mut k).unwrap()), []);
        k.link_mut("sv02").master = None;
        let p = reconcile(&cfg, &node, &mut k).unwrap();
        assert_eq!(reattached(&p), [("sv02".to_string(), true)]);
        // Without hairpinMode, back on the bridge without it.
        k.link_mut("sv02").master = None;
        let plain = conf(json!({}));
        let writes = k.writes.len();
        reconcile(&plain, &node, &mut k).unwrap();
        assert!(
            !k.writes[writes..].iter().any(|w| w.starts_with("hairpin")),
            "{:?}",
            &k.writes[writes..]
        );
        assert_eq!(k.seen.link("sv02").unwrap().master, Some(bridge));
        // A pod deleted between the read and its reattach: skipped, the reconcile goes on.
        k.link_mut("sv02").master = None;
        k.fail = Some(("change sv02".into(), nix::errno::Errno::ENODEV as i32));
        reconcile(&cfg, &node, &mut k).unwrap();
    }

    #[test]
    fn compatible_keeps_only_mac_and_mtu_drift() {
        let (cfg, node, _) = setup();
        let want = vtep_spec(&cfg, &node);
        let mut k = Fake::default();
        k.create_vxlan(&want).unwrap();
        let made: Link = k.link_mut("sticky.1").clone();
        assert!(compatible(&made, &want));
        let mut drift = made.clone();
        drift.mac = Some([2, 0, 0, 0, 0, 1]);
        drift.mtu = Some(1300);
        assert!(compatible(&drift, &want));
        type Edit = fn(&mut sticky_netlink::link::VxlanInfo);
        let edits: [(&str, Edit); 6] = [
            ("vni", |v| v.vni = Some(2)),
            ("port", |v| v.port = Some(4789)),
            ("local", |v| v.local = Some("192.0.2.9".parse().unwrap())),
            ("underlay", |v| v.underlay = Some(9)),
            ("learning", |v| v.learning = Some(true)),
            ("ttl", |v| v.ttl = Some(1)),
        ];
        for (what, edit) in edits {
            let mut l = made.clone();
            edit(l.vxlan.as_mut().unwrap());
            assert!(!compatible(&l, &want), "{what}");
        }
        let mut bridge = made.clone();
        bridge.kind = Some("bridge".into());
        assert!(!compatible(&bridge, &want));
    }

    #[test]
    fn a_failing_step_stops_the_plan() {
        let (cfg, node, mut k) = setup();
        k.fail = Some(("create bridge".into(), 17));
        let err = reconcile(&cfg, &node, &mut k).unwrap_err();
        assert!(err.to_string().contains("errno 17"), "{err}");
        assert!(
            !k.writes.iter().any(|w| w.starts_with("add address")),
            "{:?}",
            k.writes
        );
    }
}
