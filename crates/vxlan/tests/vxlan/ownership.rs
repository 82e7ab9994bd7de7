//! Never touch what is not ours (issue 8, rules 3, 4, 5 and 9): foreign routes, devices
//! sticky-vxlan did not make, nftables tables of other networks, gateways of other nodes,
//! peer entries that would make a node mistake who it is, links planted in `stateDir`, a FIFO
//! at the peers file, two networks on one VTEP.

use sticky_testkit::vxlan_support;

use std::time::{Duration, Instant};

/// What "did not block" means: a blocked plugin waits forever, an unblocked one ends in
/// milliseconds; a minute holds on a loaded 2-core machine and still tells the two apart.
const NOT_BLOCKED: Duration = Duration::from_secs(60);

use serde_json::json;
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn a_foreign_route_on_a_peer_subnet_is_an_error_naming_it_and_is_left_alone() {
    assert_can_run();
    let (mut topo, _) = one_node();
    topo.ip(
        1,
        &["route", "add", "198.51.100.0/24", "via", "192.0.2.254"],
    );
    let before = topo.ip(1, &["route", "show", "198.51.100.0/24"]);
    let peers = json!([Topo::peer(1, false), {"ip": "192.0.2.2", "subnets": ["198.51.100.0/24"]}]);
    let conf = topo.conf(1, json!({"peers": peers}));
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &conf);
    let err = expect_error(&out, 121, "198.51.100.0/24 via 192.0.2.254");
    // eth0 is not one of the links ADD reads (VXLAN devices, the VTEP's and the bridge's
    // names): it is asked for by index to name it.
    assert!(err["msg"].as_str().unwrap().contains("(dev eth0)"), "{err}");
    assert_eq!(topo.ip(1, &["route", "show", "198.51.100.0/24"]), before);
    // The peer goes away: the route is still not ours to delete.
    let conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    topo.add(&a, &conf);
    assert_eq!(topo.ip(1, &["route", "show", "198.51.100.0/24"]), before);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_device_of_another_kind_under_the_vteps_name_is_refused_and_left_alone() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    // ADD reads VXLAN devices by kind, and the VTEP's name whatever its kind.
    topo.ip(1, &["link", "add", "sticky.1", "type", "bridge"]);
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &conf);
    expect_error(
        &out,
        121,
        "\"sticky.1\" exists but is a bridge device, not a vxlan",
    );
    let still = topo.ip(1, &["-d", "link", "show", "sticky.1"]);
    assert!(still.contains("bridge"), "{still}");
    assert_eq!(topo.pod_veths(1), 0);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_bridge_or_vtep_we_did_not_make_is_refused_and_left_as_it_was() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    // Another plugin's bridge.
    topo.ip(1, &["link", "add", "cni0", "type", "bridge"]);
    let before = topo.ip(1, &["addr", "show", "cni0"]);
    let mut c = conf.clone();
    c["bridge"] = json!("cni0");
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &c);
    expect_error(&out, 121, "cni0");
    assert_eq!(topo.ip(1, &["addr", "show", "cni0"]), before);
    assert_eq!(topo.pod_veths(1), 0);

    // A VXLAN device of the VTEP's name with another VNI: refused, not recreated.
    topo.ip(
        1,
        &[
            "link",
            "add",
            "sticky.1",
            "type",
            "vxlan",
            "id",
            "77",
            "dstport",
            "4789",
            "local",
            "192.0.2.1",
        ],
    );
    let before = topo.ip(1, &["-d", "link", "show", "sticky.1"]);
    let out = topo.try_add(&a, &conf);
    expect_error(&out, 121, "sticky.1");
    assert_eq!(topo.ip(1, &["-d", "link", "show", "sticky.1"]), before);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_uplink_bridge_holding_the_underlay_address_is_never_used() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    // The node's uplink is a bridge holding the underlay address, as on many hosts.
    topo.ip(1, &["link", "add", "br0", "type", "bridge"]);
    topo.ip(1, &["addr", "add", "198.51.100.1/24", "dev", "br0"]);
    topo.ip(1, &["link", "set", "br0", "up"]);
    let before = topo.ip(1, &["addr", "show", "br0"]);
    let conf = topo.conf(
        1,
        json!({"bridge": "br0", "localIp": "198.51.100.1",
               "peers": [{"ip": "198.51.100.1", "subnets": ["10.244.1.0/24"]}]}),
    );
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &conf);
    expect_error(&out, 121, "br0");
    assert_eq!(topo.ip(1, &["addr", "show", "br0"]), before);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn devices_we_make_carry_a_marker_and_a_previous_release_node_is_adopted() {
    assert_can_run();
    let (mut topo, conf) = one_node_with_pod();
    for dev in ["sticky.1", "stickybr0"] {
        let shown = topo.ip(1, &["-d", "link", "show", dev]);
        assert!(shown.contains("alias sticky-vxlan"), "{dev}: {shown}");
        assert!(shown.contains(&topo.net), "{dev}: {shown}");
    }
    // A node set up by the previous release: the same devices without the marker.
    for dev in ["sticky.1", "stickybr0"] {
        topo.ip(1, &["link", "set", dev, "alias", ""]);
    }
    let b = topo.new_pod(1, "b");
    topo.add(&b, &conf);
    for dev in ["sticky.1", "stickybr0"] {
        let shown = topo.ip(1, &["-d", "link", "show", dev]);
        assert!(shown.contains(&topo.net), "{dev} adopted: {shown}");
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_add_result_reports_the_mac_the_bridge_really_has() {
    assert_can_run();
    let (mut topo, conf) = one_node_with_pod();
    topo.ip(
        1,
        &["link", "set", "stickybr0", "address", "02:00:00:00:00:99"],
    );
    let b = topo.new_pod(1, "b");
    let rb = topo.add(&b, &conf);
    let real = topo.link_mac(&topo.node_ns(1), "stickybr0");
    assert_eq!(rb["interfaces"][0]["mac"], real, "{rb}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn network_names_that_differ_only_in_punctuation_get_their_own_tables() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    let mut confs = Vec::new();
    for (i, name) in ["edge-1", "edge_1"].iter().enumerate() {
        let mut c = conf.clone();
        c["name"] = json!(format!("{}{name}", topo.tag));
        c["vni"] = json!(10 + i);
        c["bridge"] = json!(format!("sbr{i}"));
        c["peerOnlyPort"] = json!(true);
        c["port"] = json!(4800 + i);
        c["peers"] = json!([{"ip": "192.0.2.1", "subnets": [format!("10.24{i}.1.0/24")]},
                            {"ip": "192.0.2.2", "subnets": [format!("10.24{i}.2.0/24")]}]);
        c["ipam"]["ranges"] = json!([[{"subnet": format!("10.24{i}.1.0/24")}]]);
        let p = topo.new_pod(1, &format!("p{i}"));
        topo.add(&p, &c);
        confs.push(c);
    }
    let tables = ok(&[
        "ip",
        "netns",
        "exec",
        &topo.node_ns(1),
        "nft",
        "list",
        "tables",
    ]);
    let ours: Vec<&str> = tables.lines().filter(|l| l.contains(&topo.tag)).collect();
    assert_eq!(ours.len(), 2, "{tables}");
    let all = ok(&[
        "ip",
        "netns",
        "exec",
        &topo.node_ns(1),
        "nft",
        "list",
        "ruleset",
    ]);
    assert!(
        all.contains("udp dport 4800") && all.contains("udp dport 4801"),
        "{all}"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_ipam_gateway_outside_the_nodes_subnets_is_not_put_on_the_bridge() {
    assert_can_run();
    let (mut topo, mut conf) = one_node();
    use std::os::unix::fs::PermissionsExt;
    let fake = topo.cni_path.join("gw-ipam");
    let answer =
        r#"{"cniVersion":"1.0.0","ips":[{"address":"10.244.1.9/24","gateway":"10.244.2.1"}]}"#;
    std::fs::write(
        &fake,
        format!("#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = ADD ] && printf '%s' '{answer}'\nexit 0\n"),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    conf["ipam"] = json!({"type": "gw-ipam"});
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &conf);
    expect_error(&out, 120, "10.244.2.1");
    let bridge = topo.ip(1, &["addr", "show", "stickybr0"]);
    assert!(!bridge.contains("10.244.2."), "{bridge}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_peer_entry_cannot_make_the_node_mistake_who_it_is() {
    assert_can_run();
    let (mut topo, _) = one_node_with_pod();
    let identity = |topo: &Topo| topo.ip(1, &["-d", "link", "show", "sticky.1"]);
    let before = identity(&topo);
    for (i, bad) in [
        json!({"ip": "127.0.0.1", "subnets": ["10.244.9.0/24"]}),
        json!({"ip": "169.254.0.7", "subnets": ["10.244.9.0/24"]}),
        json!({"ip": "192.0.2.255", "subnets": ["10.244.9.0/24"]}),
        json!({"ip": "192.0.2.0", "subnets": ["10.244.9.0/24"]}),
        json!({"ip": "224.0.0.1", "subnets": ["10.244.9.0/24"]}),
    ]
    .into_iter()
    .enumerate()
    {
        let c = topo.conf(1, json!({"peers": [Topo::peer(1, false), bad]}));
        let b = topo.new_pod(1, &format!("b{i}"));
        let out = topo.try_add(&b, &c);
        assert!(!out.status.success(), "{bad} accepted");
        assert_eq!(identity(&topo), before, "{bad}");
        topo_drop(&topo, &b);
    }
    // A second address of this node named by a second entry: which one is this node?
    topo.ip(1, &["addr", "add", "192.0.2.101/24", "dev", "eth0"]);
    let c = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false), {"ip": "192.0.2.101", "subnets": ["10.244.9.0/24"]}]}),
    );
    let b = topo.new_pod(1, "two");
    let out = topo.try_add(&b, &c);
    expect_error(&out, 124, "192.0.2.101");
    assert_eq!(identity(&topo), before);
}

fn topo_drop(topo: &Topo, pod: &Pod) {
    let _ = topo.del(
        pod,
        &pod.path(),
        &topo.conf(1, json!({"peers": [Topo::peer(1, false)]})),
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn state_dir_links_and_network_names_never_lead_outside_it() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    let state = topo.state_dir(1);
    std::fs::create_dir_all(&state).unwrap();
    // A dangling link planted at the lock: following it would create the victim.
    let victim = topo.dir.path().join("victim");
    std::os::unix::fs::symlink(&victim, state.join(format!("{}.lock", topo.net))).unwrap();
    let a = topo.new_pod(1, "a");
    let out = topo.try_add(&a, &conf);
    assert!(!victim.exists(), "the lock followed a planted link");
    expect_error(&out, 128, "lock");

    // reconcile --config with a network name that climbs out of stateDir.
    let mut c = conf.clone();
    c["name"] = json!("../../escape");
    let file = topo.dir.path().join("bad.conf");
    std::fs::write(&file, c.to_string()).unwrap();
    let out = topo.tool(1, &["reconcile", "--config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!topo.dir.path().join("escape.lock").exists());
    assert!(!state.parent().unwrap().join("escape.lock").exists());
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_fifo_at_the_peers_file_does_not_block_add() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let fifo = topo.dir.path().join("peers.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false)], "peersFile": fifo}),
    );
    let a = topo.new_pod(1, "a");
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let out = topo.try_add(&a, &conf);
            let _ = tx.send(out);
        });
        let out = rx.recv_timeout(NOT_BLOCKED);
        if out.is_err() {
            // Unblock the plugin so the test can end.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        let out = out.expect("ADD blocked on a FIFO at the peers file");
        succeeded(&out, "ADD");
        assert!(started.elapsed() < NOT_BLOCKED);
    });
}

#[test]
#[ignore = "needs root: network namespaces"]
fn two_networks_on_one_vtep_are_refused_and_the_first_keeps_its_peers() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false), Topo::peer(2, false)]}),
    );
    let a = topo.new_pod(1, "a");
    topo.add(&a, &conf);
    let routes = |topo: &Topo| topo.ip(1, &["route", "show", "proto", "118"]);
    let before = routes(&topo);
    assert!(before.contains("10.244.2.0/24"), "{before}");
    let mut other = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    other["name"] = json!(format!("{}-two", topo.net));
    other["bridge"] = json!("sbr2");
    let b = topo.new_pod(1, "b");
    let out = topo.try_add(&b, &other);
    expect_error(&out, 121, &topo.net);
    assert_eq!(routes(&topo), before);
}
