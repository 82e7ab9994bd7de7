//! MTU and dual-stack: full-size pod packets cross a 1400-byte underlay without creating a
//! single fragment, and IPv6 pod subnets ride the same IPv4-underlay VTEP.

use sticky_testkit::vxlan_support;

use serde_json::json;
use vxlan_support::*;

/// `IpFragCreates` + `Ip6FragCreates` of a namespace (absolute counters, history untouched).
fn frag_creates(topo: &Topo, ns: &str) -> u64 {
    let out = topo.in_ns(ns, &["nstat", "-asz", "IpFragCreates", "Ip6FragCreates"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

#[test]
#[ignore = "needs root: network namespaces"]
fn full_size_pod_packets_cross_a_1400_underlay_without_fragments() {
    assert_can_run();
    let mut topo = Topo::new(1400);
    topo.add_node(1, 1400);
    topo.add_node(2, 1400);
    let peers = json!([Topo::peer(1, false), Topo::peer(2, false)]);
    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(2, "b");
    let ra = topo.add(&a, &topo.conf(1, json!({"peers": peers})));
    let ip_b = ip_of(&topo.add(&b, &topo.conf(2, json!({"peers": peers}))), false);
    // Pod MTU = underlay 1400 - 50.
    assert_eq!(ra["interfaces"][2]["mac"].as_str().map(str::len), Some(17));
    let mtu = ok(&["ip", "-n", &a.ns, "-j", "link", "show", "eth0"]);
    assert!(mtu.contains("\"mtu\":1350"), "{mtu}");
    let nodes = [topo.node_ns(1), topo.node_ns(2), topo.underlay.clone()];
    let before: Vec<u64> = nodes.iter().map(|n| frag_creates(&topo, n)).collect();
    // 1350 - 20 (IPv4) - 8 (ICMP) = 1322 bytes of payload: a full-size pod packet, DF set.
    assert!(topo.reaches(&a, &ip_b));
    let full = topo.in_ns(
        &a.ns,
        &[
            "ping", "-c", "3", "-i", "0.2", "-W", "2", "-M", "do", "-s", "1322", &ip_b,
        ],
    );
    succeeded(&full, "ping with DF set");
    // Without DF too (the inner packet fits the pod MTU, so nobody fragments it).
    let no_df = topo.in_ns(
        &a.ns,
        &[
            "ping", "-c", "3", "-i", "0.2", "-W", "2", "-M", "dont", "-s", "1322", &ip_b,
        ],
    );
    assert!(no_df.status.success());
    // A TCP-like bulk: many full-size packets both ways.
    let flood = topo.in_ns(
        &b.ns,
        &[
            "ping",
            "-c",
            "20",
            "-i",
            "0.01",
            "-W",
            "2",
            "-s",
            "1322",
            &ip_of(&ra, false),
        ],
    );
    assert!(flood.status.success());
    let after: Vec<u64> = nodes.iter().map(|n| frag_creates(&topo, n)).collect();
    assert_eq!(before, after, "fragments were created on the way");
    // One byte more than the pod MTU is refused at the pod (DF), as it must be.
    let over = topo.in_ns(
        &a.ns,
        &[
            "ping", "-c", "1", "-W", "1", "-M", "do", "-s", "1323", &ip_b,
        ],
    );
    assert!(!over.status.success());
}

#[test]
#[ignore = "needs root: network namespaces"]
fn dual_stack_pods_reach_each_other_over_ipv6_on_the_ipv4_underlay() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let peers = json!([Topo::peer(1, true), Topo::peer(2, true)]);
    let a = topo.new_pod(1, "a");
    let a2 = topo.new_pod(1, "a2");
    let b = topo.new_pod(2, "b");
    let ra = topo.add(&a, &topo.conf(1, json!({"peers": peers, "v6": true})));
    let ra2 = topo.add(&a2, &topo.conf(1, json!({"peers": peers, "v6": true})));
    let rb = topo.add(&b, &topo.conf(2, json!({"peers": peers, "v6": true})));
    let (b4, b6) = (ip_of(&rb, false), ip_of(&rb, true));
    assert!(b6.starts_with("fd00:2::"), "{rb}");
    assert!(topo.reaches(&a, &b4));
    assert!(topo.reaches(&a, &b6), "IPv6 across nodes");
    assert!(topo.reaches(&b, &ip_of(&ra, true)));
    assert!(
        topo.reaches(&a2, &ip_of(&ra, true)),
        "IPv6 on the same node"
    );
    // Only one VXLAN device on the node: IPv6 rides the IPv4-underlay VTEP.
    let links = ok(&[
        "ip",
        "-n",
        &topo.node_ns(1),
        "-d",
        "link",
        "show",
        "type",
        "vxlan",
    ]);
    assert_eq!(links.matches("vxlan id").count(), 1, "{links}");
    let routes = ok(&[
        "ip",
        "-n",
        &topo.node_ns(1),
        "-6",
        "route",
        "show",
        "proto",
        "118",
    ]);
    assert!(
        routes.contains("fd00:2::/64 via fd00:2:: dev sticky.1"),
        "{routes}"
    );
    let _ = ra2;
}
