//! Peers from a peers file: added on the next ADD/reconcile, removed ones cleaned up, a file
//! that fails to parse (or is unsafe) never removes programmed peers.

use sticky_testkit::vxlan_support;

use serde_json::json;
use vxlan_support::*;

fn show(topo: &Topo, n: u8) -> String {
    String::from_utf8_lossy(&topo.tool(n, &["show"]).stdout).into_owned()
}

fn vtep_state(topo: &Topo, n: u8) -> (String, String, String) {
    let ns = topo.node_ns(n);
    (
        ok(&["ip", "-n", &ns, "route", "show", "proto", "118"]),
        ok(&["ip", "-n", &ns, "neigh", "show", "dev", "sticky.1"]),
        ok(&["bridge", "-n", &ns, "fdb", "show", "dev", "sticky.1"]),
    )
}

#[test]
#[ignore = "needs root: network namespaces"]
fn peers_file_add_remove_and_bad_file_keeps_peers() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    for n in 1..=3 {
        topo.add_node(n, 1500);
    }
    // One cluster-wide file: every node finds itself in it by its own address.
    let file = topo.write_peers_file(
        "peers.json",
        &json!([Topo::peer(1, false), Topo::peer(2, false)]),
    );
    let confs: Vec<_> = (1..=3)
        .map(|n| topo.conf(n, json!({"peersFile": file})))
        .collect();
    let (a, ip_b) = topo.pods_a_and_b(&confs[0], &confs[1]);
    assert!(topo.reaches(&a, &ip_b));
    assert!(!show(&topo, 1).contains("192.0.2.3"));

    // Node 3 joins: written to the file; node 3 gets its pod; node 1 learns it on its next
    // ADD.
    topo.write_peers_file(
        "peers.json",
        &json!({"peers": [Topo::peer(1, false), Topo::peer(2, false), Topo::peer(3, false)]}),
    );
    let c = topo.new_pod(3, "c");
    let ip_c = ip_of(&topo.add(&c, &confs[2]), false);
    let a2 = topo.new_pod(1, "a2");
    topo.add(&a2, &confs[0]);
    assert!(show(&topo, 1).contains("peer 192.0.2.3 mac 0a:01:c0:00:02:03 subnets 10.244.3.0/24"));
    assert!(topo.reaches(&a, &ip_c));

    // A half-written file: ADD still works, node 1 keeps every programmed peer.
    let before = vtep_state(&topo, 1);
    std::fs::write(&file, r#"[{"ip": "192.0.2.1", "subnets": ["10.244.1"#).unwrap();
    let a3 = topo.new_pod(1, "a3");
    topo.add(&a3, &confs[0]);
    assert_eq!(vtep_state(&topo, 1), before);
    assert!(topo.reaches(&a, &ip_c));

    // A file writable by others is refused the same way: nothing removed.
    topo.write_peers_file("peers.json", &json!([Topo::peer(1, false)]));
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let conf_file = topo.dir.path().join("n1.conf");
    std::fs::write(&conf_file, confs[0].to_string()).unwrap();
    let out = topo.tool(1, &["reconcile", "--config", conf_file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("warning") && text.contains("not writable"),
        "{text}"
    );
    assert_eq!(vtep_state(&topo, 1), before);

    // Node 3 removed from a valid file: reconcile on node 1 removes its route, neighbour and
    // FDB entry, and leaves node 2's.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    topo.write_peers_file(
        "peers.json",
        &json!([Topo::peer(1, false), Topo::peer(2, false)]),
    );
    let out = topo.tool(1, &["reconcile", "--config", conf_file.to_str().unwrap()]);
    succeeded(&out, "reconcile");
    let (routes, neigh, fdb) = vtep_state(&topo, 1);
    assert!(
        !routes.contains("10.244.3.0") && routes.contains("10.244.2.0/24"),
        "{routes}"
    );
    assert!(
        !neigh.contains("10.244.3.0") && neigh.contains("10.244.2.0"),
        "{neigh}"
    );
    assert!(
        !fdb.contains("192.0.2.3") && fdb.contains("192.0.2.2"),
        "{fdb}"
    );
    assert!(!topo.ping(&a, &ip_c));
    assert!(topo.reaches(&a, &ip_b));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn overlapping_subnets_and_missing_local_entry_are_clear_errors() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let pod = topo.new_pod(1, "a");
    let overlap = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false), {"ip": "192.0.2.9", "subnets": ["10.244.0.0/16"]}]}),
    );
    let out = topo.try_add(&pod, &overlap);
    expect_error(&out, 7, "overlaps");

    let no_local = topo.conf(1, json!({"peers": [Topo::peer(2, false)]}));
    let out = topo.try_add(&pod, &no_local);
    expect_error(&out, 120, "no peer entry names this node");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn bad_peers_file_without_a_kept_copy_never_closes_the_vxlan_port_to_programmed_peers() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    for n in 1..=2 {
        topo.add_node(n, 1500);
    }
    // Node 1 names itself in its config and learns the others from the file.
    let file = topo.write_peers_file("peers.json", &json!([Topo::peer(2, false)]));
    let conf1 = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false)], "peersFile": file, "peerOnlyPort": true}),
    );
    let conf2 = topo.conf(
        2,
        json!({"peers": [Topo::peer(1, false), Topo::peer(2, false)]}),
    );
    let (a, ip_b) = topo.pods_a_and_b(&conf1, &conf2);
    assert!(topo.reaches(&a, &ip_b));

    // A reboot wiped stateDir (a tmpfs by default) and the file is now half written: the
    // boot-time reconcile and later ADDs keep node 2 programmed, and its VXLAN packets must
    // still be accepted.
    std::fs::remove_file(topo.state_dir(1).join(format!("{}.peers.json", topo.net))).unwrap();
    std::fs::write(&file, r#"[{"ip": "192.0.2.2", "subnets": ["10.2"#).unwrap();
    let conf_file = topo.dir.path().join("n1.conf");
    std::fs::write(&conf_file, conf1.to_string()).unwrap();
    let out = topo.tool(1, &["reconcile", "--config", conf_file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("warning"), "{text}");
    let a2 = topo.new_pod(1, "a2");
    topo.add(&a2, &conf1);
    let table = topo.nft_table(1);
    assert!(table.contains("192.0.2.2"), "{table}");
    assert!(topo.reaches(&a, &ip_b));
    assert!(topo.reaches(&a2, &ip_b));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn two_peers_behind_one_vtep_mac_are_refused() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let pod = topo.new_pod(1, "a");
    // A flannel MAC pasted twice, and an explicit MAC that is another peer's kept MAC: the
    // FDB would send one peer's traffic to both nodes.
    let kept2 = ok(&[bin(), "mac", "--local", "192.0.2.2", "--vni", "1"]);
    for (dup, mac) in [
        ("192.0.2.4", "6e:3c:8a:11:22:33"),
        ("192.0.2.2", kept2.trim()),
    ] {
        let conf = topo.conf(
            1,
            json!({"peers": [
                Topo::peer(1, false),
                {"ip": dup, "subnets": [if dup == "192.0.2.4" { "10.244.4.0/24" } else { "10.244.2.0/24" }],
                 "mac": if dup == "192.0.2.4" { Some("6e:3c:8a:11:22:33") } else { None }},
                {"ip": "192.0.2.5", "subnets": ["10.244.5.0/24"], "mac": mac},
            ]}),
        );
        let out = topo.try_add(&pod, &conf);
        expect_error(&out, 124, mac);
        let ns = topo.node_ns(1);
        let routes = ok(&["ip", "-n", &ns, "route", "show", "proto", "118"]);
        let fdb = ok(&["bridge", "-n", &ns, "fdb", "show"]);
        assert!(
            !routes.contains("10.244.5.0") && !fdb.contains(mac),
            "{routes}{fdb}"
        );
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_pod_subnet_holding_an_underlay_address_is_refused_before_it_cuts_the_node_off() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let pod = topo.new_pod(1, "a");
    // A typo: node 2's pod subnet written as the underlay network. Routed through the VTEP, it
    // would take the node's own underlay traffic (VXLAN and ssh alike) with it.
    let conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false), {"ip": "192.0.2.2", "subnets": ["192.0.2.0/24"]}]}),
    );
    let out = topo.try_add(&pod, &conf);
    expect_error(&out, 7, "192.0.2.0/24");
    let underlay = topo.in_ns(
        &topo.node_ns(1),
        &["ping", "-c", "1", "-W", "2", "192.0.2.2"],
    );
    assert!(underlay.status.success(), "node 1 lost its underlay");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn with_device_set_the_underlay_address_is_the_one_this_nodes_entry_names() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    // Node 1's underlay device also carries another address, listed first.
    topo.ip(1, &["addr", "del", "192.0.2.1/24", "dev", "eth0"]);
    topo.ip(1, &["addr", "add", "198.51.100.1/24", "dev", "eth0"]);
    topo.ip(1, &["addr", "add", "192.0.2.1/24", "dev", "eth0"]);
    let peers = json!([Topo::peer(1, false), Topo::peer(2, false)]);
    let conf1 = topo.conf(1, json!({"peers": peers, "device": "eth0"}));
    let conf2 = topo.conf(2, json!({"peers": peers}));
    let (a, ip_b) = topo.pods_a_and_b(&conf1, &conf2);
    let vtep = topo.ip(1, &["-d", "link", "show", "sticky.1"]);
    let kept = ok(&[bin(), "mac", "--local", "192.0.2.1", "--vni", "1"]);
    assert!(
        vtep.contains("local 192.0.2.1 ") && vtep.contains(kept.trim()),
        "{vtep}"
    );
    assert!(topo.reaches(&a, &ip_b));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_underlay_other_than_the_address_this_nodes_entry_names_is_refused() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.ip(
        1,
        &[
            "link", "add", "mgmt", "type", "veth", "peer", "name", "mgmt-p",
        ],
    );
    topo.ip(1, &["addr", "add", "198.51.100.1/24", "dev", "mgmt"]);
    topo.ip(1, &["link", "set", "mgmt", "up"]);
    let pod = topo.new_pod(1, "a");
    // The peers reach node 1 at 192.0.2.1 and compute its MAC from it: a VTEP on another
    // address (with another MAC) would never see their traffic.
    for extra in [
        json!({"localIp": "198.51.100.1"}),
        json!({"device": "mgmt"}),
    ] {
        let mut conf = topo.conf(
            1,
            json!({"peers": [Topo::peer(1, false), Topo::peer(2, false)]}),
        );
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let out = topo.try_add(&pod, &conf);
        expect_error(&out, 120, "192.0.2.1");
    }
}
