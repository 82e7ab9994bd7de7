//! A node with 100,000 peers in the kernel (issue 37): what drifted is repaired by the next
//! reconcile, and only that is written.

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
    let mut peers: Vec<Value> = vec![json!({"ip": Topo::node_ip(1), "subnets": [Topo::subnet(1)]})];
    peers.extend((1..=PEERS).map(|i| {
        let (ip, subnet) = peer(i);
        json!({"ip": ip.to_string(), "subnets": [subnet]})
    }));
    let file = topo.write_peers_file("peers.json", &Value::Array(peers));
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
    let fdb_there = || {
        let out = sh(&[
            "bridge", "-n", &ns, "fdb", "get", &fdb_mac, "dev", "sticky.1", "self",
        ]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&fdb_ip.to_string())
    };
    assert!(!fdb_there(), "the FDB entry is gone");

    let events = topo.route_events(1, || topo.reconciled(1, &conf));
    assert!(
        matches!(&events[..], [only] if only.starts_with(&format!("{route_subnet} via "))),
        "only the deleted route is written again: {events:?}"
    );
    let neigh = topo.ip(1, &["neigh", "show", &neigh_ip, "dev", "sticky.1"]);
    assert!(neigh.contains("PERMANENT"), "{neigh}");
    assert!(fdb_there(), "the FDB entry is back");
}
