//! sticky-vxlan on an IPv6-only underlay (issue 22): the nodes' underlay carries no IPv4
//! address at all (`2001:db8::<n>/64`); pods are dual-stack (`10.244.<n>.0/24`,
//! `fd00:<n>::/64`) and both families cross it, encapsulated in UDP over IPv6.

use sticky_testkit::support;
use sticky_testkit::vxlan_support;

use serde_json::{Value, json};
use vxlan_support::*;

fn ipam() -> &'static str {
    sticky_testkit::support::bins::built("sticky-ipam")
}

/// Nodes 1 to `n` on an IPv6-only underlay; every node's config (dual-stack pods, the peers
/// in the config).
fn ipv6_nodes(topo: &mut Topo, n: u8) -> Vec<Value> {
    for i in 1..=n {
        topo.add_node(i, 1500);
    }
    let peers: Vec<Value> = (1..=n).map(|i| topo.peer_of(i, true)).collect();
    (1..=n)
        .map(|i| topo.conf(i, json!({"peers": peers, "v6": true})))
        .collect()
}

#[test]
#[ignore = "needs root: network namespaces"]
fn both_pod_families_cross_an_ipv6_only_underlay_in_udp_over_ipv6() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    let confs = ipv6_nodes(&mut topo, 2);
    for n in 1..=2 {
        let v4 = topo.ip(n, &["-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(v4.trim().is_empty(), "no IPv4 on the underlay: {v4}");
    }
    let a = topo.new_pod(1, "a");
    topo.add(&a, &confs[0]);
    let b = topo.new_pod(2, "b");
    let rb = topo.add(&b, &confs[1]);
    let (b4, b6) = (ip_of(&rb, false), ip_of(&rb, true));
    assert!(
        b4.starts_with("10.244.2.") && b6.starts_with("fd00:2::"),
        "{rb}"
    );

    // The VTEP sits on the node's IPv6 address, UDP checksums on, MTU 1500 - 70.
    let vtep = topo.ip(1, &["-d", "link", "show", "sticky.1"]);
    assert!(vtep.contains("local 2001:db8::1"), "{vtep}");
    assert!(
        vtep.contains("noudp6zerocsumtx") && vtep.contains("noudp6zerocsumrx"),
        "{vtep}"
    );
    assert!(vtep.contains("mtu 1430"), "{vtep}");
    // The peer's FDB entry points at its IPv6 address.
    let fdb = topo.ip(1, &["neigh"]);
    let fdb_bridge = ok(&[
        "ip",
        "netns",
        "exec",
        &topo.node_ns(1),
        "bridge",
        "fdb",
        "show",
        "dev",
        "sticky.1",
    ]);
    assert!(
        fdb_bridge.contains("dst 2001:db8::2"),
        "{fdb_bridge}\n{fdb}"
    );

    // `show` names the IPv6 underlay, checks the kept MAC against it, lists the peer.
    let show = topo.tool(
        1,
        &["show", "--state-dir", topo.state_dir(1).to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("local 2001:db8::1") && text.contains("mac 06:be:aa:cc:39:99 (kept"),
        "{text}"
    );
    assert!(text.contains("2001:db8::2"), "{text}");

    let capture = Capture::start(&topo.underlay, "n1", topo.dir.path().join("underlay.pcap"));
    assert!(
        topo.reaches(&a, &b4),
        "IPv4 pod to pod over the IPv6 underlay"
    );
    assert!(
        topo.reaches(&a, &b6),
        "IPv6 pod to pod over the IPv6 underlay"
    );
    // What the closing note of issue 22 shows: one ping each way of each family, as printed.
    for to in [&b4, &b6] {
        let out = topo.in_ns(&a.ns, &["ping", "-c", "1", "-W", "2", to]);
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let frames = capture.frames();
    let vxlan: Vec<&str> = frames.lines().filter(|l| l.contains(".8472")).collect();
    assert!(!vxlan.is_empty(), "{frames}");
    println!("a frame on the underlay: {}", vxlan[0]);
    for line in &vxlan {
        assert!(
            line.contains("IPv6") && line.contains("2001:db8::"),
            "encapsulated in IPv6: {line}"
        );
    }
    // Every frame on the underlay is IPv6 (tcpdump prints an encapsulated frame on a line of
    // its own, without a timestamp, after the outer one: that one is IPv4 or IPv6), the
    // kernel's own IGMP reports from 0.0.0.0 aside (a link joins multicast groups even
    // without an IPv4 address).
    let outer = |l: &&str| l.as_bytes().get(8) == Some(&b'.');
    for line in frames.lines().filter(outer).filter(|l| !l.contains("igmp")) {
        assert!(
            line.contains("ethertype IPv6"),
            "not IPv6 on the underlay: {line}"
        );
    }
    let inner_v4 = frames
        .lines()
        .filter(|l| !outer(l) && l.contains("ethertype IPv4"))
        .count();
    assert!(
        inner_v4 > 0,
        "IPv4 pods' frames inside UDP over IPv6:\n{frames}"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_vtep_deleted_comes_back_with_its_mac_and_the_other_node_needs_nothing() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    let confs = ipv6_nodes(&mut topo, 3);
    let mut pods = Vec::new();
    let mut ips = Vec::new();
    for n in 1..=3u8 {
        let pod = topo.new_pod(n, &format!("p{n}"));
        let r = topo.add(&pod, &confs[usize::from(n) - 1]);
        ips.push((ip_of(&r, false), ip_of(&r, true)));
        pods.push(pod);
    }
    for (i, from) in pods.iter().enumerate() {
        for (j, (v4, v6)) in ips.iter().enumerate() {
            if i != j {
                assert!(topo.reaches(from, v4), "{} to {v4}", from.ns);
                assert!(topo.reaches(from, v6), "{} to {v6}", from.ns);
            }
        }
    }
    let node2 = topo.node_ns(2);
    let before = topo.link_mac(&node2, "sticky.1");
    let computed = ok(&[bin(), "mac", "--local", "2001:db8::2", "--vni", "1"]);
    assert_eq!(before, computed.trim(), "the kept MAC, computed offline");
    println!("VTEP of node 2 (2001:db8::2, VNI 1) before: {before}");

    ok(&["ip", "-n", &node2, "link", "del", "sticky.1"]);
    assert!(!topo.ping(&pods[0], &ips[1].0));
    // One ADD on node 2 alone: nodes 1 and 3 are not touched.
    let extra = topo.new_pod(2, "p2b");
    topo.add(&extra, &confs[1]);
    let after = topo.link_mac(&node2, "sticky.1");
    println!("VTEP of node 2 after its deletion and one ADD: {after}");
    assert_eq!(after, before);
    for from in [&pods[0], &pods[2]] {
        assert!(topo.reaches(from, &ips[1].0), "{} to {}", from.ns, ips[1].0);
        assert!(topo.reaches(from, &ips[1].1), "{} to {}", from.ns, ips[1].1);
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn peer_only_port_drops_vxlan_from_an_ipv6_address_that_is_not_a_peer() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    let mut confs = ipv6_nodes(&mut topo, 2);
    // Node 3 is on the underlay but in no peer list.
    topo.add_node(3, 1500);
    confs[0]["peerOnlyPort"] = json!(true);
    let a = topo.new_pod(1, "a");
    let ra = topo.add(&a, &confs[0]);
    let b = topo.new_pod(2, "b");
    topo.add(&b, &confs[1]);
    let table = topo.nft_table_of_family(1, "ip6");
    assert!(
        table.contains("udp dport 8472 ip6 saddr != 2001:db8::2 counter packets 0"),
        "{table}"
    );
    assert!(
        topo.reaches(&b, &ip_of(&ra, true)),
        "the peer still gets in"
    );
    let send = "echo x > /dev/udp/2001:db8::1/8472";
    let out = topo.in_ns(&topo.node_ns(3), &["bash", "-c", send]);
    succeeded(&out, "a datagram from node 3");
    let table = topo.nft_table_of_family(1, "ip6");
    assert!(
        table.contains("ip6 saddr != 2001:db8::2 counter packets 1 "),
        "node 3's datagram is dropped: {table}"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_pod_recreated_under_its_name_keeps_both_addresses_and_is_reached_untouched() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    let mut confs = ipv6_nodes(&mut topo, 2);
    std::os::unix::fs::symlink(ipam(), topo.cni_path.join("sticky-ipam")).expect("symlink");
    for c in &mut confs {
        c["ipam"]["type"] = json!("sticky-ipam");
    }
    let client = topo.new_pod(1, "client");
    let client_id = support::Pod::new("shop", "client", "uid-client");
    topo.add_args(&client, &confs[0], &client_id.kubelet_args(&client.id));
    let web_id = support::Pod::new("shop", "web", "uid-web-1");
    let web = topo.new_pod(2, "web");
    let first = topo.add_args(&web, &confs[1], &web_id.kubelet_args(&web.id));
    let (v4, v6) = (ip_of(&first, false), ip_of(&first, true));
    assert!(topo.reaches(&client, &v4) && topo.reaches(&client, &v6));
    let mac = topo.link_mac(&web.ns, "eth0");

    let del = topo.cni(
        2,
        "DEL",
        &web,
        &web.path(),
        &confs[1],
        &web_id.kubelet_args(&web.id),
    );
    succeeded(&del, "DEL web");
    let old = web.ns.clone();
    topo.drop_ns(&old);
    // Another pod meanwhile gets neither address.
    let other = topo.new_pod(2, "other");
    let other_id = support::Pod::new("shop", "other", "uid-other");
    let r = topo.add_args(&other, &confs[1], &other_id.kubelet_args(&other.id));
    assert!(ip_of(&r, false) != v4 && ip_of(&r, true) != v6, "{r}");

    let web2 = topo.new_pod(2, "web2");
    let web_id2 = support::Pod::new("shop", "web", "uid-web-2");
    let second = topo.add_args(&web2, &confs[1], &web_id2.kubelet_args(&web2.id));
    assert_eq!(
        (ip_of(&second, false), ip_of(&second, true)),
        (v4.clone(), v6.clone())
    );
    assert_eq!(
        topo.link_mac(&web2.ns, "eth0"),
        mac,
        "same addresses, same MAC"
    );
    // Node 1 ran nothing since: both families reach the recreated pod.
    assert!(topo.reaches(&client, &v4));
    assert!(topo.reaches(&client, &v6));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_segment_floods_to_its_ipv6_nodes_and_its_pods_talk_in_both_families() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    for n in 1..=3 {
        topo.add_node(n, 1500);
    }
    std::os::unix::fs::symlink("/usr/lib/cni/static", topo.cni_path.join("static")).unwrap();
    let peers: Vec<Value> = (1..=3).map(|n| topo.peer_of(n, false)).collect();
    let dir = topo.dir.path().to_path_buf();
    let conf = |n: u8, ips: &[&str]| {
        json!({
            // Debian's static (plugins 1.1.1) speaks up to 1.0.0.
            "cniVersion": "1.0.0",
            "name": "seg6",
            "type": "sticky-vxlan",
            "mode": "segment",
            "vni": 106,
            "peers": peers,
            "stateDir": dir.join(format!("seg-state-{n}")),
            "capabilities": {"ips": true},
            "ipam": {"type": "static"},
            "runtimeConfig": {"ips": ips},
        })
    };
    let k8s = |name: &str| {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID=u-{name}"
        )
    };
    let mut p = topo.new_pod(1, "p");
    p.ifname = "net1".into();
    topo.add_args(
        &p,
        &conf(1, &["192.168.16.1/24", "fd00:16::1/64"]),
        &k8s("p"),
    );
    let mut q = topo.new_pod(2, "q");
    q.ifname = "net1".into();
    topo.add_args(
        &q,
        &conf(2, &["192.168.16.2/24", "fd00:16::2/64"]),
        &k8s("q"),
    );
    assert_eq!(topo.flood(1, "segvx106"), ["2001:db8::2", "2001:db8::3"]);
    let dev = topo.ip(1, &["-d", "link", "show", "segvx106"]);
    assert!(
        dev.contains("local 2001:db8::1") && dev.contains("mtu 1430"),
        "{dev}"
    );
    assert!(topo.reaches(&p, "192.168.16.2"));
    assert!(topo.reaches(&p, "fd00:16::2"));
}

/// Issue 27, defect 5: `peerOnlyPort` and `ipMasq` on an IPv6 underlay, then `peerOnlyPort`
/// removed and peer 2001:db8::3 added: the `ip6` table that dropped every other source goes
/// with the option (a datagram from ::3 passes); the masquerade stays; with neither option,
/// no table of the network is left.
#[test]
#[ignore = "needs root: network namespaces"]
fn removing_an_option_leaves_no_rule_behind_in_the_ip6_table() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    for i in 1..=3 {
        topo.add_node(i, 1500);
    }
    let peers = |n: u8| (1..=n).map(|i| topo.peer_of(i, true)).collect::<Vec<_>>();
    let table = format!("sticky_vxlan_{}", topo.net);
    let both = json!({"peers": peers(2), "v6": true, "peerOnlyPort": true,
                      "ipMasq": true, "clusterCIDR": "10.244.0.0/16"});
    topo.reconciled(1, &topo.conf(1, both));
    let v6 = topo.nft_table_of_family(1, "ip6");
    assert!(v6.contains("ip6 saddr != 2001:db8::2 counter"), "{v6}");

    let masq = json!({"peers": peers(3), "v6": true,
                      "ipMasq": true, "clusterCIDR": "10.244.0.0/16"});
    topo.reconciled(1, &topo.conf(1, masq));
    let tables = topo.nft_tables(1);
    assert!(
        !tables.contains(&format!("table ip6 {table}\n")),
        "peerOnlyPort is off: the ip6 table must be gone: {tables}"
    );
    assert!(topo.nft_table(1).contains("masquerade"), "{tables}");
    topo.add_udp_probe(1, "ip6", "2001:db8::3", 8472);
    topo.udp_probe_sees_a_datagram(3, 1, "2001:db8::1", "ip6");

    topo.reconciled(1, &topo.conf(1, json!({"peers": peers(3), "v6": true})));
    let tables = topo.nft_tables(1);
    assert!(
        !tables.contains("sticky_vxlan_"),
        "neither option: no table of the network is left: {tables}"
    );
}

/// Issue 27, defect 7: peer 2001:db8:: while this node is 2001:db8::1/64 is the underlay
/// prefix's subnet-router anycast address, which a forwarding node holds itself (the VXLAN
/// traffic for that "peer" would be delivered here). It is refused, by ADD and `reconcile`,
/// with an error naming it, as the IPv4 network address is; so is a reserved subnet anycast
/// address (RFC 2526), and nothing is programmed.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_subnet_router_anycast_peer_is_refused_naming_it() {
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    topo.add_node(1, 1500);
    for (ip, what) in [
        ("2001:db8::", "subnet-router anycast"),
        ("2001:db8::fdff:ffff:ffff:ff80", "reserved subnet anycast"),
    ] {
        let peers = json!([topo.peer_of(1, true), {"ip": ip, "subnets": ["10.244.9.0/24"]}]);
        let conf = topo.conf(1, json!({"peers": peers, "v6": true}));
        let out = topo.reconcile(1, &conf);
        let err = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{ip} accepted as a peer: {err}");
        assert!(
            err.contains(&format!("peer ip {ip} is")) && err.contains(what),
            "the error names {ip} and why: {err}"
        );
        let pod = topo.new_pod(1, &format!("p{}", ip.len()));
        let out = topo.try_add(&pod, &conf);
        assert!(!out.status.success(), "ADD with {ip} as a peer exited 0");
        let add: Value = serde_json::from_slice(&out.stdout).expect("the CNI error is JSON");
        assert!(
            add["code"].is_number() && add["msg"].as_str().is_some_and(|m| m.contains(ip)),
            "ADD refuses {ip} naming it: {add}"
        );
    }
    assert!(
        topo.ip(1, &["-6", "route", "show", "proto", "118"])
            .trim()
            .is_empty(),
        "nothing programmed"
    );
}
