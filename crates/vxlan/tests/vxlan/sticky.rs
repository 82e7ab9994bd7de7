//! sticky-vxlan with sticky-ipam as its IPAM, on the three-node netns topology: a pod on
//! node 3 deleted and recreated under the same name (new netns, new container id, same
//! namespace/name, same UID and then a new one) keeps its IP and its MAC, and a pod on node 1
//! reaches it with no command run on node 1 between the delete and the ping. Root only.

use sticky_testkit::support;
use sticky_testkit::vxlan_support;

use serde_json::{Value, json};
use vxlan_support::*;

fn ipam() -> &'static str {
    sticky_testkit::support::bins::built("sticky-ipam")
}

/// Three nodes, peers in the config, and sticky-ipam (a symlink in the topology's CNI_PATH)
/// as every node's IPAM.
fn three_nodes_with_sticky_ipam(topo: &mut Topo) -> Vec<Value> {
    std::os::unix::fs::symlink(ipam(), topo.cni_path.join("sticky-ipam")).expect("symlink");
    let mut confs = topo.three_nodes();
    for c in &mut confs {
        c["ipam"]["type"] = json!("sticky-ipam");
    }
    confs
}

/// What node 1 holds for the overlay: its VTEP's FDB and neighbours, and its routes.
fn node1_overlay_state(topo: &Topo) -> String {
    let ns = topo.node_ns(1);
    [
        ok(&["bridge", "-n", &ns, "fdb", "show", "dev", "sticky.1"]),
        ok(&["ip", "-n", &ns, "neigh", "show", "dev", "sticky.1"]),
        ok(&["ip", "-n", &ns, "route", "show"]),
        topo.link_mac(&ns, "sticky.1"),
    ]
    .join("\n")
}

#[test]
#[ignore = "needs root: network namespaces"]
fn pod_recreated_on_node_3_keeps_ip_and_mac_and_node_1_reaches_it_untouched() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let confs = three_nodes_with_sticky_ipam(&mut topo);
    let client = topo.new_pod(1, "client");
    let client_args = support::Pod::new("shop", "client", "uid-client").kubelet_args(&client.id);
    topo.add_args(&client, &confs[0], &client_args);

    let web_id = support::Pod::new("shop", "web", "uid-web-1");
    let web = topo.new_pod(3, "web");
    let args = web_id.kubelet_args(&web.id);
    let first = topo.add_args(&web, &confs[2], &args);
    let ip = ip_of(&first, false);
    assert!(ip.starts_with("10.244.3."), "{first}");
    let mac = topo.link_mac(&web.ns, "eth0");
    assert!(
        topo.reaches(&client, &ip),
        "client cannot reach web at {ip}"
    );
    let node1_before = node1_overlay_state(&topo);

    // Round 1: same UID (kubelet recreating the sandbox of the same pod). Round 2: a new UID
    // (the pod object deleted and created again under the same name, e.g. a StatefulSet).
    let mut current = web;
    for (round, uid) in [(1, "uid-web-1"), (2, "uid-web-2")] {
        let del = topo.cni(
            3,
            "DEL",
            &current,
            &current.path(),
            &confs[2],
            &web_id.kubelet_args(&current.id),
        );
        succeeded(&del, "DEL web");
        let old_ns = current.ns.clone();
        topo.drop_ns(&old_ns);
        assert!(
            !topo.ping(&client, &ip),
            "round {round}: web still answers after DEL"
        );

        // Another pod created on node 3 meanwhile does not get web's address.
        let other = topo.new_pod(3, &format!("other{round}"));
        let other_args =
            support::Pod::new("shop", &format!("other{round}"), "uid-o").kubelet_args(&other.id);
        let other_ip = ip_of(&topo.add_args(&other, &confs[2], &other_args), false);
        assert_ne!(
            other_ip, ip,
            "round {round}: web's released lease was handed out"
        );

        let again = topo.new_pod(3, &format!("web-r{round}"));
        assert_ne!(again.id, current.id, "a new sandbox has a new container id");
        let pod = support::Pod::new("shop", "web", uid);
        let result = topo.add_args(&again, &confs[2], &pod.kubelet_args(&again.id));
        assert_eq!(
            ip_of(&result, false),
            ip,
            "round {round}: the recreated pod changed IP"
        );
        assert_eq!(
            topo.link_mac(&again.ns, "eth0"),
            mac,
            "round {round}: the recreated pod changed MAC"
        );
        // The ping runs in the client pod; nothing was run on node 1 since the DEL.
        assert!(
            topo.reaches(&client, &ip),
            "round {round}: node 1's client cannot reach the recreated pod at {ip}"
        );

        let state = support::check_dir(
            &topo.dir.path().join(format!("ipam-3/{}", topo.net)),
            support::COMPLETED,
        );
        let lease = state.sticky(ip.parse().unwrap());
        assert!(lease.attached, "{lease:?}");
        assert_eq!(lease.container_id, again.id);
        assert_eq!(lease.pod_uid, uid);
        current = again;
    }
    assert_eq!(
        node1_overlay_state(&topo),
        node1_before,
        "node 1's overlay state had to change"
    );
}

/// One conflist for every node: `ipam` names no range, so each node's IPAM gets the node's own
/// subnets from the (shared) peers file. The test's nodes share one filesystem, so only the
/// data and state dirs differ between them; the ranges do not appear anywhere.
#[test]
#[ignore = "needs root: network namespaces"]
fn ipam_ranges_come_from_the_nodes_own_peer_entry() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    std::os::unix::fs::symlink(ipam(), topo.cni_path.join("sticky-ipam")).expect("symlink");
    for n in 1..=2 {
        topo.add_node(n, 1500);
    }
    let peers = topo.write_peers_file(
        "peers.json",
        &json!([Topo::peer(1, true), Topo::peer(2, true)]),
    );
    let confs: Vec<Value> = (1..=2)
        .map(|n| {
            let mut c = topo.conf(n, json!({"peersFile": peers}));
            c["ipam"] = json!({
                "type": "sticky-ipam",
                "dataDir": topo.dir.path().join(format!("ipam-{n}")),
            });
            c
        })
        .collect();
    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(2, "b");
    let pod_a = support::Pod::new("shop", "a", "uid-a");
    let ra = topo.add_args(&a, &confs[0], &pod_a.kubelet_args(&a.id));
    let rb = topo.add_args(
        &b,
        &confs[1],
        &support::Pod::new("shop", "b", "uid-b").kubelet_args(&b.id),
    );
    let (a4, b4) = (ip_of(&ra, false), ip_of(&rb, false));
    assert!(a4.starts_with("10.244.1."), "node 1's subnet: {ra}");
    assert!(b4.starts_with("10.244.2."), "node 2's subnet: {rb}");
    assert!(
        ip_of(&ra, true).starts_with("fd00:1:"),
        "one range set per subnet: {ra}"
    );
    assert!(topo.reaches(&a, &b4), "a cannot reach b at {b4}");

    // DEL and ADD of the recreated pod see the same filled-in ranges: the lease is kept.
    let del = topo.cni(
        1,
        "DEL",
        &a,
        &a.path(),
        &confs[0],
        &pod_a.kubelet_args(&a.id),
    );
    succeeded(&del, "DEL a");
    topo.drop_ns(&a.ns.clone());
    let again = topo.new_pod(1, "a2");
    let r = topo.add_args(&again, &confs[0], &pod_a.kubelet_args(&again.id));
    assert_eq!(ip_of(&r, false), a4, "recreated pod keeps its address");
    assert!(topo.reaches(&again, &b4));

    // Node 1 drops out of the peer list while its pod lives; the pod's DEL (no prevResult)
    // still succeeds and releases the lease, or kubelet could never finish deleting the pod.
    topo.write_peers_file("peers.json", &json!([Topo::peer(2, true)]));
    let del = topo.cni(
        1,
        "DEL",
        &again,
        &again.path(),
        &confs[0],
        &pod_a.kubelet_args(&again.id),
    );
    succeeded(&del, "DEL after node 1 left the peer list");
    let state = support::check_dir(
        &topo.dir.path().join(format!("ipam-1/{}", topo.net)),
        support::COMPLETED,
    );
    for ip in [a4.parse().unwrap(), ip_of(&r, true).parse().unwrap()] {
        assert!(!state.sticky(ip).attached, "{ip} still attached");
    }
}

/// sticky-ipam, which sticky-vxlan carries, runs in sticky-vxlan's own process: the
/// `sticky-ipam` on CNI_PATH (here a wrapper that would leave a mark) is never exec'd, yet the
/// lease is written, kept on DEL and found again, exactly as by the binary; without a
/// `sticky-ipam` on CNI_PATH the call fails as an exec would.
#[test]
#[ignore = "needs root: network namespaces"]
fn sticky_ipam_runs_in_the_plugins_own_process() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let mark = topo.cni_path.join("exec-mark");
    let wrapper = topo.cni_path.join("sticky-ipam");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ntouch '{}'\nexec '{}' \"$@\"\n",
            mark.display(),
            ipam()
        ),
    )
    .expect("write wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod wrapper");
    let mut confs = topo.three_nodes();
    for c in &mut confs {
        c["ipam"]["type"] = json!("sticky-ipam");
    }
    let data = std::path::PathBuf::from(confs[2]["ipam"]["dataDir"].as_str().unwrap());
    let web_id = support::Pod::new("shop", "web", "uid-web");
    let web = topo.new_pod(3, "web");
    let first = topo.add_args(&web, &confs[2], &web_id.kubelet_args(&web.id));
    let ip = ip_of(&first, false);
    let net = confs[2]["name"].as_str().unwrap().to_string();
    let lease = data.join(&net).join(format!("{ip}_shop_web"));
    let body = std::fs::read_to_string(&lease).expect("the lease was not written");
    assert!(body.contains("\"state\":\"attached\""), "{body}");

    let del = topo.cni(
        3,
        "DEL",
        &web,
        &web.path(),
        &confs[2],
        &web_id.kubelet_args(&web.id),
    );
    succeeded(&del, "DEL web");
    let body = std::fs::read_to_string(&lease).expect("the lease is gone after DEL");
    assert!(body.contains("\"state\":\"released\""), "{body}");
    topo.drop_ns(&web.ns);
    let again = topo.new_pod(3, "web2");
    let second = topo.add_args(&again, &confs[2], &web_id.kubelet_args(&again.id));
    assert_eq!(
        ip_of(&second, false),
        ip,
        "the recreated pod lost its address"
    );
    assert!(!mark.exists(), "sticky-ipam was exec'd from CNI_PATH");

    std::fs::remove_file(&wrapper).unwrap();
    let other = topo.new_pod(3, "other");
    let out = topo.cni(3, "ADD", &other, &other.path(), &confs[2], "");
    assert!(
        !out.status.success(),
        "ADD without sticky-ipam on CNI_PATH succeeded"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("was not found in CNI_PATH"), "{text}");
}
