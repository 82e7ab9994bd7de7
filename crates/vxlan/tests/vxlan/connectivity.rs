//! Real packets across the overlay: three nodes, two pods each, all to all; the seed failure
//! (a node's VTEP deleted as a reboot would) healed by one ADD on that node alone.

use sticky_testkit::vxlan_support;

use serde_json::json;
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn three_nodes_two_pods_each_all_to_all_and_vtep_recreated_keeps_its_mac() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let (confs, pods, ips) = topo.three_nodes_with_pods(2);
    for (i, from) in pods.iter().enumerate() {
        for (j, to) in ips.iter().enumerate() {
            if i != j {
                assert!(topo.reaches(from, to), "{} cannot reach {to}", from.ns);
            }
        }
    }

    // The VTEP carries the kept MAC, the one `sticky-vxlan mac` computes offline.
    let node2 = topo.node_ns(2);
    let vtep = "sticky.1";
    let before = topo.link_mac(&node2, vtep);
    let computed = ok(&[bin(), "mac", "--local", "192.0.2.2", "--vni", "1"]);
    assert_eq!(before, computed.trim());
    assert_eq!(before, "0a:01:c0:00:02:02");

    // Reboot-like loss of node 2's VTEP: traffic to node 2 dies...
    ok(&["ip", "-n", &node2, "link", "del", vtep]);
    assert!(!topo.ping(&pods[0], &ips[2]));
    // ...and one ADD on node 2 alone brings it back with the same MAC: nodes 1 and 3 are
    // never touched.
    let extra = topo.new_pod(2, "p22");
    topo.add(&extra, &confs[1]);
    assert_eq!(topo.link_mac(&node2, vtep), before);
    for from in [&pods[0], &pods[4]] {
        for to in [&ips[2], &ips[3]] {
            assert!(
                topo.reaches(from, to),
                "{} cannot reach {to} after VTEP recreate",
                from.ns
            );
        }
    }

    // Something rewrites the MAC: reconcile repairs it, still from node 2 only.
    ok(&[
        "ip",
        "-n",
        &node2,
        "link",
        "set",
        vtep,
        "address",
        "02:11:22:33:44:55",
    ]);
    let conf_file = topo.dir.path().join("node2.conf");
    std::fs::write(&conf_file, confs[1].to_string()).unwrap();
    let out = topo.tool(2, &["reconcile", "--config", conf_file.to_str().unwrap()]);
    succeeded(&out, "reconcile");
    assert_eq!(topo.link_mac(&node2, vtep), before);
    assert!(topo.reaches(&pods[0], &ips[2]));

    // `show` names the VTEP, says its MAC is the kept one, and lists both peers.
    let show = topo.tool(2, &["show"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("sticky.1 vni 1 port 8472 local 192.0.2.2"),
        "{text}"
    );
    assert!(text.contains("(kept MAC)"), "{text}");
    assert!(
        text.contains("peer 192.0.2.1 mac 0a:01:c0:00:02:01"),
        "{text}"
    );
    assert!(text.contains("subnets 10.244.3.0/24"), "{text}");
    assert!(
        text.contains(&format!(
            "pod {} eth0 network {} host sv",
            pods[2].id, topo.net
        )),
        "{text}"
    );
    assert!(text.contains(" on stickybr0"), "{text}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn vtep_deleted_then_reconcile_without_any_pod() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let confs = topo.three_nodes();
    let (a, ip_b) = topo.pods_a_and_b(&confs[0], &confs[1]);
    assert!(topo.reaches(&a, &ip_b));
    let node2 = topo.node_ns(2);
    let mac = topo.link_mac(&node2, "sticky.1");
    ok(&["ip", "-n", &node2, "link", "del", "sticky.1"]);
    let conf_file = topo.dir.path().join("n2.conflist");
    let mut plugin = confs[1].clone();
    plugin.as_object_mut().unwrap().remove("name");
    plugin.as_object_mut().unwrap().remove("cniVersion");
    let list = json!({"cniVersion": "1.0.0", "name": topo.net, "plugins": [plugin]});
    std::fs::write(&conf_file, list.to_string()).unwrap();
    let out = topo.tool(2, &["reconcile", "--config", conf_file.to_str().unwrap()]);
    succeeded(&out, "reconcile");
    assert_eq!(topo.link_mac(&node2, "sticky.1"), mac);
    assert!(topo.reaches(&a, &ip_b));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn pod_recreated_on_its_old_ip_keeps_its_mac() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let confs = topo.three_nodes();
    let a = topo.new_pod(1, "a");
    topo.add(&a, &confs[0]);
    let web = topo.new_pod(3, "web");
    let first = topo.add_args(&web, &confs[2], "IgnoreUnknown=1;IP=10.244.3.77");
    assert_eq!(ip_of(&first, false), "10.244.3.77");
    let mac = topo.link_mac(&web.ns, "eth0");
    assert_eq!(mac, "0e:01:0a:f4:03:4d", "pod MAC is derived from its IPv4");
    assert_eq!(first["interfaces"][2]["mac"], mac);
    assert!(topo.reaches(&a, "10.244.3.77"));
    // Delete and recreate the pod (new sandbox, new netns, new container id), same IP.
    assert!(topo.del(&web, &web.path(), &confs[2]).status.success());
    let ns = web.ns.clone();
    topo.drop_ns(&ns);
    let web2 = topo.new_pod(3, "web2");
    let second = topo.add_args(&web2, &confs[2], "IgnoreUnknown=1;IP=10.244.3.77");
    assert_eq!(ip_of(&second, false), "10.244.3.77");
    assert_eq!(topo.link_mac(&web2.ns, "eth0"), mac);
    assert!(topo.reaches(&a, "10.244.3.77"));
}
