//! A node with 100,000 peers in the kernel (issue 37): what drifted is repaired by the next
//! reconcile, and only that is written; a peer gone from the file is gone from the kernel. At
//! this size a reconcile looks up the FDB entries of its peers' MACs instead of dumping them
//! (`sticky_overlay::node::fdb_read`): these are the lookups' proofs.

use sticky_testkit::vxlan_support;

use std::net::Ipv4Addr;

use serde_json::{Value, json};
use sticky_netlink::link::format_mac;
use sticky_overlay::mac::vtep_mac;
use vxlan_support::*;

const PEERS: u32 = 100_000;

/// Peer `i` (1-based): underlay 198.18.0.1 + i (198.18.0.0/15: the range for large simulated
/// underlays; nothing is sent there), pod subnet the i-th /26 of 10.0.0.0/8 (up to 10.97.x:
/// clear of node 1's 10.244.1.0/24). Its underlay address and subnet.
fn peer(i: u32) -> (Ipv4Addr, String) {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i);
    let subnet = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i << 6));
    (ip, format!("{subnet}/26"))
}

#[test]
#[ignore = "needs root: network namespaces"]
fn at_100000_peers_entries_deleted_by_hand_are_repaired_and_nothing_else_is_written() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let peers_from = |first: u32| {
        let mut peers: Vec<Value> =
            vec![json!({"ip": Topo::node_ip(1), "subnets": [Topo::subnet(1)]})];
        peers.extend((first..=PEERS).map(|i| {
            let (ip, subnet) = peer(i);
            json!({"ip": ip.to_string(), "subnets": [subnet]})
        }));
        Value::Array(peers)
    };
    let file = topo.write_peers_file("peers.json", &peers_from(1));
    let conf = topo.conf(1, json!({"peersFile": file}));
    topo.reconciled(1, &conf);
    let routes = topo.ip(1, &["route", "show", "proto", "118"]);
    assert_eq!(routes.lines().count(), PEERS as usize);

    // By hand: one peer's route, another's neighbour entry, a third's FDB entry.
    let (_, route_subnet) = peer(500);
    let (_, neigh_subnet) = peer(60_000);
    let neigh_ip = neigh_subnet.trim_end_matches("/26").to_string();
    let (fdb_ip, _) = peer(PEERS);
    let fdb_mac = format_mac(&vtep_mac(fdb_ip.into(), 1));
    topo.ip(1, &["route", "del", &route_subnet, "dev", "sticky.1"]);
    topo.ip(1, &["neigh", "del", &neigh_ip, "dev", "sticky.1"]);
    let ns = topo.node_ns(1);
    let deleted = sh(&[
        "bridge",
        "-n",
        &ns,
        "fdb",
        "del",
        &fdb_mac,
        "dev",
        "sticky.1",
        "dst",
        &fdb_ip.to_string(),
        "self",
    ]);
    assert!(deleted.status.success());
    // The FDB entry of a MAC as `bridge fdb get` shows it (its first destination), if any.
    let fdb_of = |mac: &str| {
        let out = sh(&[
            "bridge", "-n", &ns, "fdb", "get", mac, "dev", "sticky.1", "self",
        ]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let fdb_there = || fdb_of(&fdb_mac).is_some_and(|e| e.contains(&fdb_ip.to_string()));
    assert!(!fdb_there(), "the FDB entry is gone");
    // And one entry sent elsewhere: peer 70,000's MAC to peer 70,001's address.
    let (moved_ip, _) = peer(70_000);
    let moved_mac = format_mac(&vtep_mac(moved_ip.into(), 1));
    let (elsewhere, _) = peer(70_001);
    let replaced = sh(&[
        "bridge",
        "-n",
        &ns,
        "fdb",
        "replace",
        &moved_mac,
        "dev",
        "sticky.1",
        "dst",
        &elsewhere.to_string(),
        "self",
        "permanent",
    ]);
    assert!(replaced.status.success());

    let events = topo.route_events(1, || topo.reconciled(1, &conf));
    assert!(
        matches!(&events[..], [only] if only.starts_with(&format!("{route_subnet} via "))),
        "only the deleted route is written again: {events:?}"
    );
    let neigh = topo.ip(1, &["neigh", "show", &neigh_ip, "dev", "sticky.1"]);
    assert!(neigh.contains("PERMANENT"), "{neigh}");
    assert!(fdb_there(), "the FDB entry is back");
    let moved = sh(&["bridge", "-n", &ns, "-j", "fdb", "show", "dev", "sticky.1"]);
    let dsts: Vec<String> = serde_json::from_slice::<Vec<Value>>(&moved.stdout)
        .unwrap()
        .iter()
        .filter(|e| e["mac"] == moved_mac.as_str())
        .map(|e| e["dst"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        dsts,
        [moved_ip.to_string()],
        "the entry sent elsewhere goes to its peer again, and only there"
    );

    // Peer 1 leaves: its entries leave with it.
    let (gone_ip, gone_subnet) = peer(1);
    let gone_mac = format_mac(&vtep_mac(gone_ip.into(), 1));
    assert!(fdb_of(&gone_mac).is_some());
    topo.write_peers_file("peers.json", &peers_from(2));
    topo.reconciled(1, &conf);
    assert_eq!(fdb_of(&gone_mac), None, "the FDB entry of a peer gone");
    let route = topo.ip(1, &["route", "show", &gone_subnet]);
    assert!(route.trim().is_empty(), "{route}");
    let routes = topo.ip(1, &["route", "show", "proto", "118"]);
    assert_eq!(routes.lines().count(), PEERS as usize - 1);
}
