//! Segment mode (`"mode": "segment"`) on real kernels: kube-vxlan-controller's own example on
//! three nodes, a pod recreated on its static address, two segments and the main mode on one
//! node and port, flood entries following the peers file, and the ownership rule.

use sticky_testkit::vxlan_support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use vxlan_support::*;

/// kubelet's CNI_ARGS for pod `name` in namespace `default`.
fn k8s(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID=u-{name}")
}

fn all_peers() -> Value {
    json!([
        Topo::peer(1, false),
        Topo::peer(2, false),
        Topo::peer(3, false)
    ])
}

/// Nodes 1 to `count` on a 1500-byte underlay and the test's temp dir; panics when the test
/// cannot run here (see [`assert_can_run`]).
fn nodes(count: u8) -> (Topo, PathBuf) {
    assert_can_run();
    let mut topo = Topo::new(1500);
    for n in 1..=count {
        topo.add_node(n, 1500);
    }
    let dir = topo.dir.path().to_path_buf();
    (topo, dir)
}

/// A segment network for node `n`; `extra` keys are merged in.
fn segment(dir: &Path, name: &str, vni: u32, n: u8, extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": "1.1.0",
        "name": name,
        "type": "sticky-vxlan",
        "mode": "segment",
        "vni": vni,
        "peers": all_peers(),
        "stateDir": dir.join(format!("state-{n}")),
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    c
}

/// Links the reference `static` IPAM into the test's CNI_PATH.
fn with_static(topo: &Topo) {
    std::os::unix::fs::symlink("/usr/lib/cni/static", topo.cni_path.join("static"))
        .expect("link static");
}

/// Segment `name` (VNI `vni`) for node `n` whose pod gets `ip` from the reference `static`
/// IPAM with the `ips` capability, as Multus passes it ([`with_static`] first).
fn static_segment(dir: &Path, (name, vni): (&str, u32), n: u8, ip: &str) -> Value {
    segment(
        dir,
        name,
        vni,
        n,
        json!({
            // Debian's static (plugins 1.1.1) speaks up to 1.0.0.
            "cniVersion": "1.0.0",
            "capabilities": {"ips": true, "mac": true},
            "ipam": {"type": "static"},
            "runtimeConfig": {"ips": [ip]},
        }),
    )
}

/// The pod `pod` seen through another interface (a second segment of the same pod).
fn iface(pod: &Pod, ifname: &str) -> Pod {
    Pod {
        ns: pod.ns.clone(),
        id: pod.id.clone(),
        node: pod.node,
        ifname: ifname.into(),
    }
}

fn with_ifname(mut pod: Pod, ifname: &str) -> Pod {
    pod.ifname = ifname.into();
    pod
}

fn sysctl(topo: &Topo, ns: &str, kv: &str) {
    let out = topo.in_ns(ns, &["sysctl", "-qw", kv]);
    assert!(out.status.success(), "sysctl {kv} in {ns}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn kube_vxlan_controller_example_a_and_b_talk_through_gw_and_a_neighbour_answers_broadcasts() {
    let (mut topo, dir) = nodes(3);
    // The README's example: one NetworkAttachmentDefinition per segment, the per-pod
    // annotation's `ip=` and `route=` as the attachments table.
    let vxeth1 = |n| {
        segment(
            &dir,
            "vxeth1",
            101,
            n,
            json!({"attachments": [
                {"pod": "a-*", "ips": ["192.168.11.2/29"],
                 "routes": [{"dst": "192.168.12.0/29", "gw": "192.168.11.1"}]},
                {"pod": "gw-*", "ips": ["192.168.11.1/29"]},
                {"pod": "d-*", "ips": ["192.168.11.3/29"]}
            ]}),
        )
    };
    let vxeth2 = |n| {
        segment(
            &dir,
            "vxeth2",
            102,
            n,
            json!({"attachments": [
                {"pod": "b-*", "ips": ["192.168.12.2/29"],
                 "routes": [{"dst": "192.168.11.0/29", "gw": "192.168.12.1"}]},
                {"pod": "gw-*", "ips": ["192.168.12.1/29"]}
            ]}),
        )
    };
    let a = with_ifname(topo.new_pod(1, "a"), "vxeth1");
    let b = with_ifname(topo.new_pod(2, "b"), "vxeth2");
    let gw = with_ifname(topo.new_pod(3, "gw"), "vxeth1");
    let gw2 = iface(&gw, "vxeth2");
    let d = with_ifname(topo.new_pod(2, "d"), "vxeth1");
    sysctl(&topo, &gw.ns, "net.ipv4.ip_forward=1");
    sysctl(&topo, &d.ns, "net.ipv4.icmp_echo_ignore_broadcasts=0");
    let ra = topo.add_args(&a, &vxeth1(1), &k8s("a-5cd8c6ccb8-kkvwt"));
    topo.add_args(&b, &vxeth2(2), &k8s("b-cf894dbfd-t657f"));
    topo.add_args(&gw, &vxeth1(3), &k8s("gw-f87979b47-5p57h"));
    topo.add_args(&gw2, &vxeth2(3), &k8s("gw-f87979b47-5p57h"));
    topo.add_args(&d, &vxeth1(2), &k8s("d-1"));
    assert_eq!(ra["ips"][0]["address"], "192.168.11.2/29");
    assert_eq!(
        ra["interfaces"][2]["mac"], "0e:01:c0:a8:0b:02",
        "MAC from the IPv4"
    );
    assert_eq!(ra["routes"][0]["dst"], "192.168.12.0/29");

    for (from, to) in [(&a, "192.168.12.2"), (&b, "192.168.11.2")] {
        let out = topo.in_ns(&from.ns, &["ping", "-c", "3", "-W", "2", to]);
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{} $ ping -c 3 {to}\n{text}", from.ns);
        assert!(
            out.status.success(),
            "{} cannot reach {to} through gw: {text}",
            from.ns
        );
        assert!(text.contains("ttl=63"), "one hop through gw: {text}");
    }

    // d, on vxeth1 on node 2, answers a's ARP and a broadcast ping.
    assert!(topo.reaches(&a, "192.168.11.3"));
    let neigh = ok(&["ip", "-n", &a.ns, "neigh", "show", "192.168.11.3"]);
    assert!(
        neigh.contains("0e:01:c0:a8:0b:03"),
        "ARP answered with d's MAC: {neigh}"
    );
    let out = topo.in_ns(&a.ns, &["ping", "-b", "-c", "2", "-W", "2", "192.168.11.7"]);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{} $ ping -b -c 2 192.168.11.7\n{text}", a.ns);
    assert!(
        text.contains("from 192.168.11.3"),
        "broadcast answered by d: {text}"
    );

    // CHECK with the ADD result passes; `show` lists both segments and their members.
    let mut check = vxeth1(1);
    check["prevResult"] = ra.clone();
    let out = topo.cni(
        1,
        "CHECK",
        &a,
        &a.path(),
        &check,
        &k8s("a-5cd8c6ccb8-kkvwt"),
    );
    succeeded(&out, "CHECK");
    let show = String::from_utf8_lossy(&topo.tool(3, &["show"]).stdout).into_owned();
    assert!(
        show.contains("segment vxeth1 vni 101 bridge segbr101 vxlan segvx101 mtu 1450 up"),
        "{show}"
    );
    assert!(
        show.contains("segment vxeth2 vni 102 bridge segbr102"),
        "{show}"
    );
    assert!(show.contains("  flood 192.0.2.1 192.0.2.2"), "{show}");
    assert!(
        show.contains(&format!("  member {} vxeth2 host sv", gw.id)),
        "{show}"
    );

    // GC of vxeth1 on node 3 with no valid attachment removes gw's vxeth1 veth only.
    let mut gc = vxeth1(3);
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = topo.cni(3, "GC", &gw, "", &gc, "");
    succeeded(&out, "GC");
    let left = ok(&[
        "ip",
        "-n",
        &topo.node_ns(3),
        "-o",
        "link",
        "show",
        "master",
        "segbr101",
    ]);
    assert!(!left.contains(": sv"), "gw's vxeth1 veth is gone: {left}");
    let kept = ok(&[
        "ip",
        "-n",
        &topo.node_ns(3),
        "-o",
        "link",
        "show",
        "master",
        "segbr102",
    ]);
    assert!(kept.contains(": sv"), "gw's vxeth2 veth stays: {kept}");

    // DEL, twice, succeeds and leaves the shared devices.
    for _ in 0..2 {
        let out = topo.cni(
            1,
            "DEL",
            &a,
            &a.path(),
            &vxeth1(1),
            &k8s("a-5cd8c6ccb8-kkvwt"),
        );
        succeeded(&out, "DEL");
    }
    assert!(
        topo.in_ns(&a.ns, &["ip", "link", "show", "vxeth1"])
            .status
            .code()
            != Some(0)
    );
    ok(&["ip", "-n", &topo.node_ns(1), "link", "show", "segvx101"]);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_pod_recreated_on_its_static_address_keeps_its_mac_and_is_reached_with_nothing_run_elsewhere() {
    let (mut topo, dir) = nodes(2);
    with_static(&topo);
    let conf = |n: u8, ip: &str| static_segment(&dir, ("seg13", 103), n, ip);
    let p = with_ifname(topo.new_pod(1, "p"), "net1");
    topo.add_args(&p, &conf(1, "192.168.13.1/24"), &k8s("p"));
    let q = with_ifname(topo.new_pod(2, "q"), "net1");
    let first = topo.add_args(&q, &conf(2, "192.168.13.2/24"), &k8s("q"));
    assert_eq!(first["ips"][0]["address"], "192.168.13.2/24");
    let mac = topo.link_mac(&q.ns, "net1");
    assert_eq!(mac, "0e:01:c0:a8:0d:02");
    assert!(topo.reaches(&p, "192.168.13.2"));

    let out = topo.del(&q, &q.path(), &conf(2, "192.168.13.2/24"));
    succeeded(&out, "DEL");
    let ns = q.ns.clone();
    topo.drop_ns(&ns);
    assert!(!topo.ping(&p, "192.168.13.2"));
    let q2 = with_ifname(topo.new_pod(2, "q2"), "net1");
    topo.add_args(&q2, &conf(2, "192.168.13.2/24"), &k8s("q"));
    assert_eq!(topo.link_mac(&q2.ns, "net1"), mac, "same address, same MAC");
    // Node 1 is never touched: its neighbour and learned FDB entries still hold.
    assert!(
        topo.ping(&p, "192.168.13.2"),
        "reached at once, no retry needed"
    );

    // An L2-only pod (no address) gets a MAC stable per (pod, segment); the runtime's `mac`
    // capability wins over it.
    let mut l2 = segment(&dir, "seg14", 104, 1, json!({}));
    let r = with_ifname(topo.new_pod(1, "r"), "net2");
    let first = topo.add_args(&r, &l2, &k8s("r"));
    let stable = first["interfaces"][2]["mac"].as_str().unwrap().to_string();
    assert!(stable.starts_with("0e:02:"), "{stable}");
    assert!(first["ips"].as_array().is_none_or(Vec::is_empty));
    assert!(topo.del(&r, &r.path(), &l2).status.success());
    assert_eq!(
        topo.add_args(&r, &l2, &k8s("r"))["interfaces"][2]["mac"],
        stable
    );
    assert!(topo.del(&r, &r.path(), &l2).status.success());
    l2["runtimeConfig"] = json!({"mac": "02:00:00:00:00:42"});
    topo.add_args(&r, &l2, &k8s("r"));
    assert_eq!(topo.link_mac(&r.ns, "net2"), "02:00:00:00:00:42");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn two_segments_never_see_each_others_frames_and_share_node_and_port_with_the_main_mode() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    let dir = topo.dir.path().to_path_buf();
    let mains = topo.three_nodes();
    // The same address plan on two segments: only the VNI keeps them apart.
    let seg = |name: &str, vni: u32, n: u8| segment(&dir, name, vni, n, json!({}));
    let mut pods = Vec::new();
    for (name, vni, host) in [
        ("sega", 201, 1),
        ("sega", 201, 2),
        ("segb", 202, 1),
        ("segb", 202, 2),
    ] {
        let pod = with_ifname(topo.new_pod(host, &format!("{name}{host}")), "net1");
        // No IPv6 chatter (router solicitations, MLD) to blur the counters.
        sysctl(&topo, &pod.ns, "net.ipv6.conf.all.disable_ipv6=1");
        sysctl(&topo, &pod.ns, "net.ipv6.conf.default.disable_ipv6=1");
        sysctl(&topo, &pod.ns, "net.ipv4.icmp_echo_ignore_broadcasts=0");
        let ip = if name == "sega" {
            format!("10.99.0.{host}/24")
        } else {
            format!("10.99.0.1{host}/24")
        };
        let mut conf = seg(name, vni, host);
        conf["runtimeConfig"] = json!({"ips": [ip]});
        topo.add_args(&pod, &conf, &k8s(&format!("{name}-{host}")));
        pods.push(pod);
    }
    // Main-mode pods on the same nodes, same UDP port (8472).
    let m1 = topo.new_pod(1, "m1");
    let m2 = topo.new_pod(2, "m2");
    topo.add(&m1, &mains[0]);
    let ip_m2 = ip_of(&topo.add(&m2, &mains[1]), false);
    let udp = |n: u8, dev: &str| {
        let out = ok(&[
            "ip",
            "-n",
            &topo.node_ns(n),
            "-d",
            "-j",
            "link",
            "show",
            "dev",
            dev,
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0]["linkinfo"]["info_data"]["port"].as_u64()
    };
    assert_eq!(udp(1, "segvx201"), Some(8472));
    assert_eq!(udp(1, "sticky.1"), Some(8472));

    let captures: Vec<Capture> = pods[2..]
        .iter()
        .map(|p| Capture::start(&p.ns, "net1", dir.join(format!("{}.pcap", p.ns))))
        .collect();
    assert!(topo.reaches(&pods[0], "10.99.0.2"));
    let out = topo.in_ns(
        &pods[0].ns,
        &["ping", "-b", "-c", "3", "-W", "2", "10.99.0.255"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("from 10.99.0.2"), "{text}");
    assert!(
        !text.contains("from 10.99.0.11") && !text.contains("from 10.99.0.12"),
        "{text}"
    );
    assert!(
        topo.reaches(&m1, &ip_m2),
        "the main mode works beside the segments"
    );
    // Segment a's frames carry its pods' MACs (0e:01:0a:63:00:01, ...:02) and addresses;
    // the main mode's pods are in 10.244.0.0/16.
    for c in captures {
        let seen = c.frames();
        println!("segment b saw:\n{seen}");
        for foreign in [
            "0e:01:0a:63:00:01",
            "0e:01:0a:63:00:02",
            "10.99.0.1 ",
            "10.99.0.2 ",
            "10.99.0.1:",
            "10.99.0.2:",
            "10.244.",
        ] {
            assert!(!seen.contains(foreign), "segment b saw {foreign}: {seen}");
        }
    }
    // And segment b works on its own.
    assert!(topo.reaches(&pods[2], "10.99.0.12"));
    assert!(!topo.ping(&pods[2], "10.99.0.2"));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn flood_entries_follow_the_peers_file() {
    let (mut topo, dir) = nodes(3);
    let file = topo.write_peers_file("peers.json", &all_peers());
    let conf = |n: u8| {
        let mut c = segment(&dir, "segf", 301, n, json!({"peersFile": file}));
        c.as_object_mut().unwrap().remove("peers");
        c
    };
    let mut n = 0;
    let mut add_on_1 = |topo: &mut Topo| {
        n += 1;
        let pod = with_ifname(topo.new_pod(1, &format!("f{n}")), "net1");
        topo.add_args(&pod, &conf(1), &k8s(&format!("f{n}")));
    };
    add_on_1(&mut topo);
    assert_eq!(topo.flood(1, "segvx301"), ["192.0.2.2", "192.0.2.3"]);
    topo.write_peers_file(
        "peers.json",
        &json!([Topo::peer(1, false), Topo::peer(2, false)]),
    );
    add_on_1(&mut topo);
    assert_eq!(topo.flood(1, "segvx301"), ["192.0.2.2"], "node 3 left");
    // A broken file removes nothing.
    std::fs::write(&file, "[{\"ip\": ").unwrap();
    add_on_1(&mut topo);
    assert_eq!(topo.flood(1, "segvx301"), ["192.0.2.2"]);
    // Node 3 comes back; `reconcile` (no pod) follows the file, and rebuilds the segment's
    // devices after they are gone (a reboot).
    topo.write_peers_file("peers.json", &all_peers());
    let conf_file = dir.join("segf.conf");
    std::fs::write(&conf_file, conf(1).to_string()).unwrap();
    let reconcile = |topo: &Topo| {
        let out = topo.tool(1, &["reconcile", "--config", conf_file.to_str().unwrap()]);
        succeeded(&out, "reconcile");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = reconcile(&topo);
    assert!(said.contains("segment segf vni 301"), "{said}");
    assert_eq!(
        topo.flood(1, "segvx301"),
        ["192.0.2.2", "192.0.2.3"],
        "node 3 is back"
    );
    let members = || {
        let out = ok(&[
            "ip",
            "-n",
            &topo.node_ns(1),
            "-o",
            "link",
            "show",
            "master",
            "segbr301",
        ]);
        out.lines().filter(|l| l.contains(": sv")).count()
    };
    assert_eq!(members(), 3, "f1, f2, f3");
    for dev in ["segvx301", "segbr301"] {
        ok(&["ip", "-n", &topo.node_ns(1), "link", "del", dev]);
    }
    reconcile(&topo);
    assert_eq!(topo.flood(1, "segvx301"), ["192.0.2.2", "192.0.2.3"]);
    assert_eq!(members(), 3, "the running pods are back on the bridge");
    // `nodes` narrows the segment to a subset of the peers.
    let mut narrow = conf(1);
    narrow["nodes"] = json!(["192.0.2.1", "192.0.2.3"]);
    let pod = with_ifname(topo.new_pod(1, "narrow"), "net1");
    topo.add_args(&pod, &narrow, &k8s("narrow"));
    assert_eq!(topo.flood(1, "segvx301"), ["192.0.2.3"]);

    // STATUS: ready on a node of the segment, 50 on one outside its `nodes`.
    let out = topo.cni(1, "STATUS", &pod, "", &narrow, "");
    succeeded(&out, "STATUS");
    let out = topo.cni(2, "STATUS", &pod, "", &narrow, "");
    expect_error(&out, 50, "not one of the segment's");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_device_that_is_not_ours_is_refused_and_bad_config_changes_nothing() {
    let (mut topo, dir) = nodes(2);
    let node = topo.node_ns(1);
    ok(&[
        "ip", "-n", &node, "link", "add", "segbr401", "type", "bridge",
    ]);
    let pod = with_ifname(topo.new_pod(1, "x"), "net1");
    let conf = segment(&dir, "seg401", 401, 1, json!({}));
    let out = topo.cni(1, "ADD", &pod, &pod.path(), &conf, &k8s("x"));
    expect_error(&out, 121, "was not made by this network");
    let links = ok(&["ip", "-n", &node, "-o", "link"]);
    assert!(
        !links.contains("segvx401") && !links.contains(": sv"),
        "{links}"
    );
    // Another network's segment device is not adopted either.
    ok(&["ip", "-n", &node, "link", "del", "segbr401"]);
    topo.add_args(&pod, &conf, &k8s("x"));
    let other = with_ifname(topo.new_pod(1, "y"), "net1");
    let thief = segment(&dir, "other", 401, 1, json!({}));
    let out = topo.cni(1, "ADD", &other, &other.path(), &thief, &k8s("y"));
    expect_error(&out, 121, "segbr401");

    for (key, value, says) in [
        ("mode", json!("l2"), "\"mode\""),
        ("vni", json!(0), "vni"),
        ("bridge", json!("br0"), "main mode"),
        (
            "attachments",
            json!([{"pod": "x", "ips": ["10.0.0.1"]}]),
            "attachments",
        ),
        (
            "runtimeConfig",
            json!({"mac": "01:00:5e:00:00:01"}),
            "runtimeConfig.mac",
        ),
        (
            "runtimeConfig",
            json!({"ips": ["10.0.0.1"]}),
            "runtimeConfig.ips",
        ),
    ] {
        let mut bad = conf.clone();
        bad[key] = value;
        let fresh = with_ifname(topo.new_pod(1, &format!("bad{}", key.len())), "net9");
        let out = topo.cni(1, "ADD", &fresh, &fresh.path(), &bad, &k8s("bad"));
        expect_error(&out, 7, says);
        assert!(
            topo.in_ns(&fresh.ns, &["ip", "link", "show", "net9"])
                .status
                .code()
                != Some(0)
        );
        let ns = fresh.ns.clone();
        topo.drop_ns(&ns);
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_failed_add_gives_the_address_back_and_leaves_no_veth() {
    let (mut topo, dir) = nodes(2);
    let data = dir.join("seg-ipam");
    let conf = segment(
        &dir,
        "segr",
        501,
        1,
        json!({
            "cniVersion": "1.0.0",
            "ipam": {"type": "host-local", "dataDir": data, "ranges": [[{"subnet": "192.168.20.0/24"}]]}
        }),
    );
    let pod = with_ifname(topo.new_pod(1, "r"), "net1");
    // The pod's namespace is gone by the time the veth is made: IPAM had allocated.
    let out = topo.cni(1, "ADD", &pod, "/run/netns/no-such-netns", &conf, &k8s("r"));
    expect_error(&out, 123, "");
    let held: Vec<_> = std::fs::read_dir(data.join("segr"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !held.iter().any(|f: &String| f.starts_with("192.168.")),
        "{held:?}"
    );
    let links = ok(&["ip", "-n", &topo.node_ns(1), "-o", "link"]);
    assert!(!links.contains(": sv"), "{links}");
    // The same ADD into the real namespace then works (host-local moves on round-robin).
    let r = topo.add_args(&pod, &conf, &k8s("r"));
    assert!(
        r["ips"][0]["address"]
            .as_str()
            .unwrap()
            .starts_with("192.168.20.")
    );
}

/// Issue 21: pod `x-1` got 192.168.11.65 from the attachments table while IPAM had leased it
/// to `p-1` (node 1's slice, .64/26): the same address and MAC twice on one L2 segment. A
/// fixed address IPAM may hand out is now refused at ADD (7, naming the entry and the range)
/// and STATUS says so (50), while DEL still releases what a pod holds.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_fixed_address_ipam_may_hand_out_is_refused_and_dels_still_release() {
    let (mut topo, dir) = nodes(1);
    let data = dir.join("seg-clash");
    let ipam = json!({
        "cniVersion": "1.0.0",
        "nodeSlice": 26,
        "ipam": {"type": "host-local", "dataDir": data,
                 "ranges": [[{"subnet": "192.168.11.0/24"}]]}
    });
    let plain = segment(&dir, "segc", 503, 1, ipam.clone());
    let p = with_ifname(topo.new_pod(1, "p"), "net1");
    let first = topo.add_args(&p, &plain, &k8s("p-1"));
    assert_eq!(first["ips"][0]["address"], "192.168.11.65/24");

    let mut clash = plain.clone();
    clash["attachments"] = json!([{"pod": "x-*", "ips": ["192.168.11.65/24"]}]);
    let x = with_ifname(topo.new_pod(1, "x"), "net1");
    let out = topo.cni(1, "ADD", &x, &x.path(), &clash, &k8s("x-1"));
    expect_error(&out, 7, r#"entry 0 (pod "x-*") gives 192.168.11.65"#);
    assert!(
        topo.in_ns(&x.ns, &["ip", "link", "show", "net1"])
            .status
            .code()
            != Some(0),
        "x-1 got an interface"
    );
    // Every ADD on the network is refused, not only the entry's pods: IPAM would hand the
    // address to the next pod otherwise.
    let q = with_ifname(topo.new_pod(1, "q"), "net1");
    let out = topo.cni(1, "ADD", &q, &q.path(), &clash, &k8s("q-1"));
    expect_error(&out, 7, "192.168.11.0/24");
    // STATUS is 1.1.0's (Debian's host-local speaks 1.0.0, but is not asked: refused first).
    let mut status = clash.clone();
    status["cniVersion"] = json!("1.1.0");
    let out = topo.cni(1, "STATUS", &q, "", &status, "");
    expect_error(&out, 50, r#"pod "x-*""#);

    // A pod that runs is removed, and its address released, under the refused config.
    let out = topo.cni(1, "DEL", &p, &p.path(), &clash, &k8s("p-1"));
    succeeded(&out, "DEL under a refused config");
    let held: Vec<String> = std::fs::read_dir(data.join("segc"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|f| f.starts_with("192.168."))
                .collect()
        })
        .unwrap_or_default();
    assert!(held.is_empty(), "{held:?}");
}

/// The same refusal comes before anything is touched, so this needs no root.
#[test]
fn a_fixed_address_in_an_ipam_range_is_refused_before_anything_is_touched() {
    let state = tempfile::tempdir().unwrap();
    let conf = json!({
        "cniVersion": "1.1.0", "name": "seg", "type": "sticky-vxlan", "mode": "segment",
        "vni": 101, "stateDir": state.path(),
        "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}],
        "ipam": {"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                 "rangeStart": "192.168.11.64", "rangeEnd": "192.168.11.127"},
        "attachments": [{"pod": "gw-*", "ips": ["192.168.11.1/24"]},
                        {"pod": "x-*", "ips": ["192.168.11.65/24"]}]
    });
    for command in ["ADD", "STATUS"] {
        let out = plugin_call(
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "clash"),
                ("CNI_NETNS", "/run/netns/none"),
                ("CNI_IFNAME", "net1"),
                ("CNI_PATH", "/nonexistent"),
            ],
            &conf,
        );
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        let msg = reply["msg"].as_str().unwrap();
        assert_eq!(
            reply["code"],
            if command == "ADD" { 7 } else { 50 },
            "{reply}"
        );
        assert!(
            msg.contains(r#"entry 1 (pod "x-*") gives 192.168.11.65"#)
                && msg.contains("192.168.11.64-192.168.11.127 of 192.168.11.0/24"),
            "{command}: {msg}"
        );
        assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
    }
}

/// A segment's lock is taken as the main mode's is (one way to lock a network's state): a link
/// planted at the lock's name, or a stateDir that is a link, is refused with 128 and nothing is
/// created through it.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_link_at_the_segment_lock_or_state_dir_is_refused_without_writing() {
    let (mut topo, dir) = nodes(1);
    let ipam = |n: &str| {
        json!({"cniVersion": "1.0.0",
               "ipam": {"type": "host-local", "dataDir": dir.join(n),
                        "ranges": [[{"subnet": "192.168.30.0/24"}]]}})
    };
    let pod = with_ifname(topo.new_pod(1, "l"), "net1");
    let planted = dir.join("planted");
    let state = dir.join("state-planted");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::symlink(&planted, state.join("segl.segment.lock")).unwrap();
    let mut conf = segment(&dir, "segl", 502, 1, ipam("ipam-l"));
    conf["stateDir"] = json!(state);
    let out = topo.cni(1, "ADD", &pod, &pod.path(), &conf, &k8s("l"));
    expect_error(&out, 128, "lock");
    assert!(!planted.exists(), "the lock was created through the link");

    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = dir.join("state-link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    conf["stateDir"] = json!(link);
    let out = topo.cni(1, "ADD", &pod, &pod.path(), &conf, &k8s("l"));
    expect_error(&out, 128, "lock");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

/// Who this node is follows the main mode's rule, with its codes (`vxlan_ownership`'s
/// `a_peer_entry_cannot_make_the_node_mistake_who_it_is`): an entry or a node at an address
/// that is no node's (loopback, link-local, multicast) is bad config (7); a peer at the
/// network or broadcast address of the underlay's subnet, or a second entry naming this node,
/// is a bad peer list (124). Nothing is made for any of them.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_peer_entry_or_node_cannot_make_a_segment_node_mistake_who_it_is() {
    let (mut topo, dir) = nodes(1);
    let node = topo.node_ns(1);
    let with = |ip: &str| json!([Topo::peer(1, false), {"ip": ip, "subnets": ["10.244.9.0/24"]}]);
    let cases = [
        ("peers", with("127.0.0.1"), 7, "127.0.0.1"),
        ("peers", with("169.254.0.7"), 7, "169.254.0.7"),
        ("peers", with("224.0.0.1"), 7, "224.0.0.1"),
        ("peers", with("192.0.2.255"), 124, "192.0.2.255"),
        ("peers", with("192.0.2.0"), 124, "192.0.2.0"),
        ("nodes", json!(["192.0.2.1", "127.0.0.1"]), 7, "127.0.0.1"),
        (
            "nodes",
            json!(["192.0.2.1", "169.254.0.7"]),
            7,
            "169.254.0.7",
        ),
    ];
    for (i, (key, value, code, says)) in cases.into_iter().enumerate() {
        let conf = segment(&dir, "segw", 601, 1, json!({ key: value }));
        let pod = with_ifname(topo.new_pod(1, &format!("w{i}")), "net1");
        let out = topo.cni(1, "ADD", &pod, &pod.path(), &conf, &k8s("w"));
        expect_error(&out, code, says);
        let links = ok(&["ip", "-n", &node, "-o", "link"]);
        assert!(!links.contains("segvx601"), "{key} {value}: {links}");
        topo.drop_ns(&pod.ns);
    }
    // A second address of this node named by a second entry: which one is this node?
    ok(&[
        "ip",
        "-n",
        &node,
        "addr",
        "add",
        "192.0.2.101/24",
        "dev",
        "eth0",
    ]);
    let conf = segment(&dir, "segw", 601, 1, json!({"peers": with("192.0.2.101")}));
    let pod = with_ifname(topo.new_pod(1, "two"), "net1");
    let out = topo.cni(1, "ADD", &pod, &pod.path(), &conf, &k8s("two"));
    expect_error(&out, 124, "192.0.2.101");
    let links = ok(&["ip", "-n", &node, "-o", "link"]);
    assert!(!links.contains("segvx601"), "{links}");
}

/// The boot unit's call: one `reconcile` with the main network's conflist and each segment's.
/// Each is reconciled in turn; one that fails (an unusable file, a device that is not ours)
/// is reported, stops none of the others, and the exit code says so.
#[test]
#[ignore = "needs root: network namespaces"]
fn one_reconcile_restores_the_main_network_and_every_segment_and_a_failing_one_stops_no_other() {
    let (topo, dir) = nodes(2);
    let node = topo.node_ns(1);
    let peers = topo.write_peers_file(
        "peers.json",
        &json!([Topo::peer(1, false), Topo::peer(2, false)]),
    );
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let seg = |name: &str, vni: u32| {
        let mut c = segment(&dir, name, vni, 1, json!({"peersFile": peers}));
        c.as_object_mut().unwrap().remove("peers");
        c.to_string()
    };
    let main_file = write(
        "10-main.conf",
        topo.conf(1, json!({"peersFile": peers})).to_string(),
    );
    let seg_file = write("40-segb.conf", seg("segb", 501));
    let broken = write("05-broken.conflist", "{\"name\": ".into());
    let reconcile = |files: &[&str]| {
        let mut args = vec!["reconcile"];
        for f in files {
            args.extend(["--config", f]);
        }
        let out = topo.tool(1, &args);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let routed =
        || ok(&["ip", "-n", &node, "route", "show", &Topo::subnet(2)]).contains("dev sticky.1");

    // A broken first file: reported (usage, exit 2), the two others reconciled.
    let (code, out, err) = reconcile(&[&broken, &main_file, &seg_file]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("05-broken.conflist"), "{err}");
    assert!(
        out.contains("sticky.1 up") && out.contains("segment segb vni 501"),
        "{out}"
    );
    assert!(routed(), "the main network's peer is programmed");
    assert_eq!(topo.flood(1, "segvx501"), ["192.0.2.2"]);

    // After a "reboot" (devices gone), a segment whose bridge is someone else's fails at run
    // time (exit 1) and the main network and the other segment still come back.
    for dev in ["sticky.1", "segvx501", "segbr501"] {
        ok(&["ip", "-n", &node, "link", "del", dev]);
    }
    ok(&[
        "ip", "-n", &node, "link", "add", "segbr502", "type", "bridge",
    ]);
    let taken = write("41-segc.conf", seg("segc", 502));
    let (code, out, err) = reconcile(&[&taken, &main_file, &seg_file]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("41-segc.conf") && err.contains("segbr502"),
        "{err}"
    );
    assert!(routed(), "the main network is back");
    assert_eq!(topo.flood(1, "segvx501"), ["192.0.2.2"], "segb is back");

    // All usable: exit 0. The same file twice is a usage error that does nothing.
    let (code, out, err) = reconcile(&[&main_file, &seg_file]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = reconcile(&[&main_file, &main_file]);
    assert_eq!((code, out.as_str()), (Some(2), ""), "{err}");
}

/// Issue 21: the error for a bad requested MAC quoted the value twice
/// (`runtimeConfig.mac "\"01:00:5e:00:00:01\""`). It is refused before anything is touched,
/// so this needs no root.
#[test]
fn a_bad_requested_mac_is_quoted_once() {
    let state = tempfile::tempdir().unwrap();
    let conf = json!({
        "cniVersion": "1.0.0", "name": "seg", "type": "sticky-vxlan", "mode": "segment",
        "vni": 101, "stateDir": state.path(),
        "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}],
        "runtimeConfig": {"mac": "01:00:5e:00:00:01"}
    });
    let out = plugin_call(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "quoted"),
            ("CNI_NETNS", "/run/netns/none"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/nonexistent"),
        ],
        &conf,
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let msg = reply["msg"].as_str().unwrap();
    assert!(
        msg.starts_with(r#"runtimeConfig.mac "01:00:5e:00:00:01" is not a unicast MAC"#),
        "{msg}"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_segment_add_on_a_node_whose_vxlan_device_was_changed_repairs_it_and_its_pod_is_reached() {
    let (mut topo, dir) = nodes(2);
    with_static(&topo);
    let conf = |n: u8, ip: &str| static_segment(&dir, ("seg15", 105), n, ip);
    let p = with_ifname(topo.new_pod(1, "p"), "net1");
    topo.add_args(&p, &conf(1, "192.168.15.1/24"), &k8s("p"));
    let q = with_ifname(topo.new_pod(2, "q"), "net1");
    topo.add_args(&q, &conf(2, "192.168.15.2/24"), &k8s("q"));
    assert!(topo.reaches_within(&p, "192.168.15.2"));
    let n1 = topo.node_ns(1);
    let device = |topo: &Topo| topo.link_details(&n1, "segvx105");
    // What was done to the device (in node 1), and whether its details show it repaired.
    type Breakage<'a> = (&'a str, &'a [&'a str], &'a dyn Fn(&Value) -> bool);
    let breakages: [Breakage; 2] = [
        (
            "local address and learning",
            &[
                "link",
                "set",
                "segvx105",
                "type",
                "vxlan",
                "local",
                "192.0.2.9",
                "nolearning",
            ],
            &|d| {
                d["linkinfo"]["info_data"]["local"] == "192.0.2.1"
                    && d["linkinfo"]["info_data"]["learning"] == true
            },
        ),
        ("master", &["link", "set", "segvx105", "nomaster"], &|d| {
            d["master"] == "segbr105"
        }),
    ];
    for (i, (what, args, back)) in breakages.into_iter().enumerate() {
        topo.ip(1, args);
        assert!(!back(&device(&topo)), "{what}: not broken by {args:?}");
        let r = with_ifname(topo.new_pod(1, &format!("r{i}")), "net1");
        let ip = format!("192.168.15.{}/24", 10 + i);
        topo.add_args(&r, &conf(1, &ip), &k8s(&format!("r{i}")));
        assert!(back(&device(&topo)), "{what}: not repaired by the ADD");
        assert!(
            topo.reaches_within(&r, "192.168.15.2"),
            "{what}: the new pod does not reach its peer"
        );
    }
}
