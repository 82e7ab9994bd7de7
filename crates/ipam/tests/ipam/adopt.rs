//! Adoption in place: a data dir written by Debian's host-local, or by OpenYurt's patched
//! host-local, keeps every allocation when the node switches to sticky-ipam.

use sticky_testkit::support;

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::json;
use support::*;

const NET: &str = "adopt";

#[test]
fn host_local_data_dir_is_adopted() {
    let hl = host_local_bin();
    let hl = Plugin::at(hl);
    let tmp = temp_dir();
    let conf = Conf::new(
        NET,
        tmp.path(),
        json!([[{"subnet": "10.50.0.0/24", "rangeStart": "10.50.0.10", "rangeEnd": "10.50.0.19"}]]),
    );
    let net = tmp.path().join(NET);
    // Real host-local ADDs, as kubelet made them (pod args, IgnoreUnknown).
    let pods: Vec<Pod> = (0..4)
        .map(|i| Pod::new("ns", &format!("old{i}"), &format!("uid-old{i}")))
        .collect();
    let mut held = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = hl
            .run(
                &Call::add(&format!("h{i}"), &conf)
                    .pod(pod)
                    .env("CNI_PATH", "/usr/lib/cni"),
            )
            .ok();
        held.push(result_ip(&r));
    }
    let hl_files = snapshot(&net);
    check_dir(&net, COMPLETED);

    let p = Plugin::sticky();
    // New pods never get an address host-local handed out, and round-robin continues after
    // host-local's last_reserved_ip.
    let mut new_ips = Vec::new();
    for i in 0..6 {
        let pod = Pod::new("ns", &format!("new{i}"), &format!("uid-new{i}"));
        let r = p.run(&Call::add(&format!("n{i}"), &conf).pod(&pod)).ok();
        new_ips.push(result_ip(&r));
    }
    assert_eq!(
        new_ips[0],
        ip("10.50.0.14"),
        "round-robin after host-local's hint"
    );
    let all: BTreeSet<IpAddr> = held.iter().chain(&new_ips).copied().collect();
    assert_eq!(all.len(), 10, "an adopted address was handed out again");
    // The range is now full: nothing of host-local's may be reclaimed.
    p.run(&Call::add("n9", &conf).pod(&Pod::new("ns", "x", "u")))
        .expect_code(100);
    let snap = snapshot(&net);
    for (name, bytes) in &hl_files {
        if !name.starts_with("last_reserved_ip") {
            assert_eq!(snap.get(name), Some(bytes), "adopted {name} was rewritten");
        }
    }
    check_dir(&net, COMPLETED);

    // DEL by container id, no pod args (ctr-style): the address is freed.
    p.run(&Call::del("h0", &conf)).ok_empty();
    let st = check_dir(&net, COMPLETED);
    assert!(
        st.by_ip(held[0]).is_none(),
        "DEL by container id left {}",
        held[0]
    );
    // DEL with the pod's args (kubelet): the adopted record becomes a released lease ...
    p.run(&Call::del("h1", &conf).pod(&pods[1])).ok_empty();
    let st = check_dir(&net, COMPLETED);
    let rec = st.sticky(held[1]);
    assert!(!rec.attached);
    assert_eq!((rec.namespace.as_str(), rec.pod.as_str()), ("ns", "old1"));
    // ... that a new pod does not get while another address is free ...
    let r = p
        .run(&Call::add("n10", &conf).pod(&Pod::new("ns", "y", "uy")))
        .ok();
    assert_eq!(result_ip(&r), held[0]);
    // ... and that the migrated pod gets back on its first restart.
    let again = Pod::new("ns", "old1", "uid-old1-b");
    let r = p.run(&Call::add("h1b", &conf).pod(&again)).ok();
    assert_eq!(result_ip(&r), held[1]);
    // An adopted record is found by container id with prevResult, as libcni sends DEL.
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": format!("{}/24", held[2])}]});
    p.run(&Call::del("h2", &conf.clone().prev_result(&prev)).pod(&pods[2]))
        .ok_empty();
    assert!(!check_dir(&net, COMPLETED).sticky(held[2]).attached);
    // A DEL with another container id releases nothing.
    let before = snapshot(&net);
    p.run(&Call::del("h9", &conf).pod(&pods[3])).ok_empty();
    assert_same(&before, &snapshot(&net), "DEL of an unknown container id");
}

#[test]
fn openyurt_layout_is_adopted() {
    let tmp = temp_dir();
    let conf = Conf::new(
        NET,
        tmp.path(),
        json!([[{"subnet": "10.51.0.0/24", "rangeStart": "10.51.0.10", "rangeEnd": "10.51.0.12"}]]),
    );
    let net = tmp.path().join(NET);
    std::fs::create_dir_all(&net).unwrap();
    // OpenYurt's patched host-local: <ip> with host-local's body plus an empty marker.
    for (last, cid, pod) in [(10, "y0", "edge-a"), (11, "y1", "edge-b")] {
        std::fs::write(
            net.join(format!("10.51.0.{last}")),
            format!("{cid}\r\neth0"),
        )
        .unwrap();
        std::fs::write(net.join(format!("10.51.0.{last}_kube-system_{pod}")), "").unwrap();
    }
    std::fs::write(net.join("last_reserved_ip.0"), "10.51.0.11").unwrap();
    let markers = Rules {
        allow_tmp: false,
        allow_markers: true,
    };
    check_dir(&net, markers);
    let p = Plugin::sticky();
    let r = p
        .run(&Call::add("s0", &conf).pod(&Pod::new("default", "n0", "u0")))
        .ok();
    assert_eq!(result_ip(&r), ip("10.51.0.12"));
    // Full: the adopted addresses are held.
    let before = snapshot(&net);
    p.run(&Call::add("s1", &conf).pod(&Pod::new("default", "n1", "u1")))
        .expect_code(100);
    assert_same(&before, &snapshot(&net), "ADD into a full adopted range");

    // DEL with K8S_POD_*: a released lease that the pod gets back, never someone else.
    let edge_a = Pod::new("kube-system", "edge-a", "uid-a");
    p.run(&Call::del("y0", &conf).pod(&edge_a)).ok_empty();
    check_dir(&net, markers);
    let r = p
        .run(&Call::add("y0b", &conf).pod(&Pod::new("kube-system", "edge-a", "uid-a2")))
        .ok();
    assert_eq!(result_ip(&r), ip("10.51.0.10"));

    // DEL by container id alone frees the address for anyone.
    p.run(&Call::del("y1", &conf)).ok_empty();
    let st = check_dir(&net, markers);
    assert!(
        st.attached_to("y1").is_empty(),
        "DEL by container id left y1 attached: {st:?}"
    );
    let r = p
        .run(&Call::add("s1", &conf).pod(&Pod::new("default", "n1", "u1")))
        .ok();
    assert_eq!(result_ip(&r), ip("10.51.0.11"));
    let st = check_dir(&net, markers);
    assert!(
        st.records.values().all(|(_, r)| *r != Record::Marker),
        "a marker outlived its record: {st:?}"
    );
}
