//! DEL that must always succeed, ADD failures that leave nothing behind, CHECK, and GC /
//! STATUS / ADD reaching the IPAM plugin with the same stdin and environment.

use sticky_testkit::vxlan_support;

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn del_twice_with_empty_netns_and_after_netns_gone_all_succeed() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(1, "b");
    let c = topo.new_pod(1, "c");
    for p in [&a, &b, &c] {
        topo.add(p, &conf);
    }
    assert_eq!(topo.pod_veths(1), 3);
    assert_eq!(topo.allocations(1).len(), 3);

    // DEL twice.
    assert!(topo.del(&a, &a.path(), &conf).status.success());
    assert!(topo.del(&a, &a.path(), &conf).status.success());
    // DEL with an empty CNI_NETNS (containerd does this).
    assert!(topo.del(&b, "", &conf).status.success());
    // DEL after the netns is gone.
    let cns = c.ns.clone();
    topo.drop_ns(&cns);
    let out = topo.del(&c, &c.path(), &conf);
    succeeded(&out, "DEL");
    assert_eq!(topo.pod_veths(1), 0);
    assert!(topo.allocations(1).is_empty(), "IPAM released everything");

    // A config broken since ADD: DEL reports it, but the pod's veth is gone anyway.
    let d = topo.new_pod(1, "d");
    topo.add(&d, &conf);
    let mut broken = conf.clone();
    broken["vni"] = json!(0);
    let err = error_of(&topo.del(&d, &d.path(), &broken));
    assert_eq!(err["code"], 7, "{err}");
    assert_eq!(topo.pod_veths(1), 0);
    // The shared VTEP and bridge are never torn down by DEL.
    let links = ok(&["ip", "-n", &topo.node_ns(1), "-o", "link"]);
    assert!(
        links.contains("sticky.1") && links.contains("stickybr0"),
        "{links}"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn add_failing_in_ipam_or_after_it_leaves_nothing_behind() {
    assert_can_run();
    let (mut topo, mut conf) = one_node();
    conf["ipam"]["ranges"] = json!([[{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.10", "rangeEnd": "10.244.1.10"}]]);
    let a = topo.new_pod(1, "a");
    topo.add(&a, &conf);

    // Range exhausted: IPAM fails, its error is passed on, nothing is left.
    let b = topo.new_pod(1, "b");
    let err = error_of(&topo.try_add(&b, &conf));
    assert!(err["msg"].as_str().unwrap().starts_with("IPAM:"), "{err}");
    assert_eq!(topo.pod_veths(1), 1);
    let inside = ok(&["ip", "-n", &b.ns, "-o", "addr"]);
    assert!(!inside.contains("eth0"), "{inside}");
    assert_eq!(topo.allocations(1), vec!["10.244.1.10".to_string()]);

    // Failure after IPAM (the pod already has an eth0): veth and allocation rolled back.
    let c = topo.new_pod(1, "c");
    ok(&[
        "ip", "-n", &c.ns, "link", "add", "eth0", "type", "veth", "peer", "name", "x0",
    ]);
    assert!(topo.del(&a, &a.path(), &conf).status.success());
    let err = error_of(&topo.try_add(&c, &conf));
    assert_eq!(err["code"], 122, "{err}");
    assert_eq!(topo.pod_veths(1), 0);
    assert!(topo.allocations(1).is_empty(), "IPAM DEL ran on rollback");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn check_passes_then_sees_a_missing_address() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    let a = topo.new_pod(1, "a");
    let result = topo.add(&a, &conf);
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    let out = topo.cni(1, "CHECK", &a, &a.path(), &check, "");
    succeeded(&out, "CHECK");
    let addr = result["ips"][0]["address"].as_str().unwrap();
    ok(&["ip", "-n", &a.ns, "addr", "del", addr, "dev", "eth0"]);
    let err = error_of(&topo.cni(1, "CHECK", &a, &a.path(), &check, ""));
    assert_eq!(err["code"], 127, "{err}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn gc_status_and_add_reach_ipam_with_the_same_stdin_and_env() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    // A recording IPAM plugin: writes its command, CNI_ARGS and stdin, answers like an IPAM.
    let log = topo.dir.path().join("ipam.log");
    let script = format!(
        "#!/bin/sh\nin=$(cat)\nprintf '%s|%s|%s\\n' \"$CNI_COMMAND\" \"$CNI_ARGS\" \"$in\" >> {log}\n\
         [ \"$CNI_COMMAND\" = ADD ] && printf '{{\"cniVersion\":\"1.1.0\",\"ips\":[{{\"address\":\"10.244.1.9/24\",\"gateway\":\"10.244.1.1\"}}]}}'\nexit 0\n",
        log = log.display()
    );
    let fake = topo.cni_path.join("recording-ipam");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false)], "cniVersion": "1.1.0"}),
    );
    conf["ipam"] = json!({"type": "recording-ipam"});
    let a = topo.new_pod(1, "a");
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
    let result = topo.add_args(&a, &conf, args);
    assert_eq!(ip_of(&result, false), "10.244.1.9");
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    for (cmd, c) in [("GC", &gc), ("STATUS", &conf)] {
        let out = topo.cni(1, cmd, &a, "", c, args);
        succeeded(&out, cmd);
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = logged.lines().collect();
    assert_eq!(lines.len(), 3, "{logged}");
    for (line, (cmd, c)) in lines
        .iter()
        .zip([("ADD", &conf), ("GC", &gc), ("STATUS", &conf)])
    {
        let mut parts = line.splitn(3, '|');
        assert_eq!(parts.next(), Some(cmd));
        assert_eq!(parts.next(), Some(args), "CNI_ARGS (K8S_POD_*) reach IPAM");
        let stdin: Value = serde_json::from_str(parts.next().unwrap()).unwrap();
        assert_eq!(&stdin, c, "IPAM gets the same stdin");
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn result_follows_the_config_version() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false)], "cniVersion": "0.3.1"}),
    );
    let a = topo.new_pod(1, "a");
    let r = topo.add(&a, &conf);
    assert_eq!(r["cniVersion"], "0.3.1");
    assert_eq!(r["ips"][0]["version"], "4", "{r}");
    assert_eq!(r["ips"][0]["interface"], 2, "{r}");
    assert_eq!(r["interfaces"][0]["name"], "stickybr0");
    assert_eq!(r["interfaces"][2]["name"], "eth0");
    assert_eq!(r["interfaces"][2]["sandbox"], a.path());
    assert_eq!(r["routes"][0]["dst"], "0.0.0.0/0", "isDefaultGateway");
    // The bridge's MAC is derived from its gateway address, so it never changes either.
    assert_eq!(r["interfaces"][0]["mac"], "0e:01:0a:f4:01:01");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_ipam_gateway_other_than_the_first_address_answers_on_the_bridge() {
    assert_can_run();
    let (mut topo, mut conf) = one_node();
    conf["ipam"]["ranges"] = json!([[{"subnet": Topo::subnet(1), "gateway": "10.244.1.254"}]]);
    let a = topo.new_pod(1, "a");
    let r = topo.add(&a, &conf);
    assert_eq!(r["ips"][0]["gateway"], "10.244.1.254", "{r}");
    let on_bridge = topo.ip(1, &["-o", "addr", "show", "dev", "stickybr0"]);
    assert!(on_bridge.contains("10.244.1.254/24"), "{on_bridge}");
    assert!(
        on_bridge.contains("10.244.1.1/24"),
        "the node's own gateway stays: {on_bridge}"
    );
    let routes = ok(&["ip", "-n", &a.ns, "route"]);
    assert!(routes.contains("default via 10.244.1.254"), "{routes}");
    // A second pod finds it there already.
    let b = topo.new_pod(1, "b");
    topo.add(&b, &conf);
    assert!(topo.reaches(&b, "10.244.1.254"), "the gateway answers");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn gc_removes_only_this_networks_veths_missing_from_the_valid_list() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    // Debian's host-local speaks up to 1.0.0: ADD with that; GC needs 1.1.0.
    let conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(1, "b");
    let ra = topo.add(&a, &conf);
    let rb = topo.add(&b, &conf);
    // A veth of another network on the same node: GC of this network must leave it alone.
    // (Two networks never share a VTEP or bridge: each would remove the other's peers.)
    let mut other = conf.clone();
    other["name"] = json!(format!("{}-other", topo.net));
    other["vni"] = json!(2);
    other["bridge"] = json!("stickybr1");
    other["peers"] = json!([{"ip": Topo::node_ip(1), "subnets": ["10.245.1.0/24"]}]);
    other["ipam"]["dataDir"] = json!(topo.dir.path().join("ipam-other"));
    other["ipam"]["ranges"] = json!([[{"subnet": "10.245.1.0/24"}]]);
    let c = topo.new_pod(1, "c");
    let rc = topo.add(&c, &other);
    assert_eq!(topo.pod_veths(1), 3);

    // Debian's host-local predates GC, so IPAM's answer is an error; the veth cleanup before
    // it still happens.
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.id, "ifname": "eth0"}]);
    let _ = topo.cni(1, "GC", &a, "", &gc, "");
    let names = ok(&["ip", "-n", &topo.node_ns(1), "-o", "link"]);
    let host = |r: &Value| r["interfaces"][1]["name"].as_str().unwrap().to_string();
    assert!(names.contains(&host(&ra)), "valid attachment kept: {names}");
    assert!(
        !names.contains(&host(&rb)),
        "stale attachment removed: {names}"
    );
    assert!(
        names.contains(&host(&rc)),
        "other network untouched: {names}"
    );
    assert!(topo.reaches(&a, &ip_of(&rc, false)));
}

/// STATUS answers 50 when the plugin cannot work (here: a config without `vni`), the code
/// containerd reads as "not ready". Needs no root: nothing is touched.
#[test]
fn status_is_50_when_the_config_cannot_work() {
    let conf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "n", "type": "sticky-vxlan",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}
    });
    let out = plugin_call(
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")],
        &conf,
    );
    assert!(!out.status.success());
    expect_error(&out, 50, "vni");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn ipam_add_that_succeeds_with_an_unusable_result_is_released() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    // An IPAM plugin that allocates (exit 0) but answers with something that is not a result
    // this plugin can use: what it allocated must be given back with IPAM DEL.
    let log = topo.dir.path().join("ipam.log");
    let fake = topo.cni_path.join("odd-ipam");
    for answer in [r#"{"cniVersion":"1.0.0","ips":"10.244.1.9/24"}"#, ""] {
        let script = format!(
            "#!/bin/sh\ncat >/dev/null\necho \"$CNI_COMMAND\" >> {log}\n\
             [ \"$CNI_COMMAND\" = ADD ] && printf '%s' '{answer}'\nexit 0\n",
            log = log.display()
        );
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = std::fs::remove_file(&log);
        let mut conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
        conf["ipam"] = json!({"type": "odd-ipam"});
        let a = topo.new_pod(1, &format!("a{}", answer.len()));
        let err = error_of(&topo.try_add(&a, &conf));
        assert_eq!(err["code"], 125, "{err}");
        let logged = std::fs::read_to_string(&log).unwrap();
        assert_eq!(logged, "ADD\nDEL\n", "answer {answer:?}");
        assert_eq!(topo.pod_veths(1), 0);
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn status_is_50_when_the_node_cannot_be_worked_out() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let fake = topo.cni_path.join("ready-ipam");
    std::fs::write(&fake, "#!/bin/sh\ncat >/dev/null\nexit 0\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pod = topo.new_pod(1, "a");
    let mut conf = topo.conf(
        1,
        json!({"peers": [Topo::peer(1, false)], "cniVersion": "1.1.0"}),
    );
    conf["ipam"]["type"] = json!("ready-ipam");
    let out = topo.cni(1, "STATUS", &pod, "", &conf, "");
    succeeded(&out, "STATUS");
    // No entry names this node: every ADD would fail, so the plugin is not ready, even though
    // the IPAM plugin (its ranges given in full) is.
    conf["peers"] = json!([Topo::peer(2, false)]);
    expect_error(
        &topo.cni(1, "STATUS", &pod, "", &conf, ""),
        50,
        "no peer entry names this node",
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_address_outside_this_nodes_subnets_is_refused_and_released() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let peers = json!([Topo::peer(1, false), Topo::peer(2, false)]);
    let a = topo.new_pod(1, "a");
    let ip_a = ip_of(&topo.add(&a, &topo.conf(1, json!({"peers": peers}))), false);
    // Node 1's conflist copied to node 2 unchanged: its ranges are node 1's subnet. A pod on
    // node 2 with an address from it would take node 1's addresses (and its gateway on node
    // 2's bridge would pull node 1's whole subnet onto node 2).
    let mut copied = topo.conf(1, json!({"peers": peers}));
    copied["stateDir"] = json!(topo.state_dir(2));
    copied["ipam"]["dataDir"] = json!(topo.dir.path().join("ipam-2"));
    let b = topo.new_pod(2, "b");
    expect_error(&topo.try_add(&b, &copied), 120, "10.244.2.0/24");
    assert_eq!(topo.pod_veths(2), 0);
    assert!(
        topo.allocations(2).is_empty(),
        "node 2's IPAM gave its lease back"
    );
    let bridge = ok(&["ip", "-n", &topo.node_ns(2), "addr", "show", "stickybr0"]);
    assert!(!bridge.contains("10.244.1."), "{bridge}");
    let c = topo.new_pod(2, "c");
    let ip_c = ip_of(&topo.add(&c, &topo.conf(2, json!({"peers": peers}))), false);
    assert!(ip_c.starts_with("10.244.2."), "{ip_c}");
    assert!(topo.reaches(&c, &ip_a));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn del_without_prev_result_releases_even_when_the_peers_could_not_be_programmed() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    // No ranges: they come from this node's peer entry, also for DEL.
    let mut conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    conf["ipam"] = json!({"type": "host-local", "dataDir": topo.dir.path().join("ipam-1")});
    let a = topo.new_pod(1, "a");
    topo.add(&a, &conf);
    assert_eq!(topo.allocations(1).len(), 1);
    // The peer list gained two entries behind one MAC: ADD refuses it, DEL must still work.
    let mut bad = conf.clone();
    bad["peers"] = json!([
        Topo::peer(1, false),
        {"ip": "192.0.2.4", "subnets": ["10.244.4.0/24"], "mac": "6e:3c:8a:11:22:33"},
        {"ip": "192.0.2.5", "subnets": ["10.244.5.0/24"], "mac": "6e:3c:8a:11:22:33"},
    ]);
    let b = topo.new_pod(1, "b");
    assert_eq!(error_of(&topo.try_add(&b, &bad))["code"], 124);
    let out = topo.del(&a, &a.path(), &bad);
    succeeded(&out, "DEL");
    assert!(topo.allocations(1).is_empty());
}

/// A GC whose attachment list has one malformed entry is refused as a whole (code 7) before
/// anything is removed: read as "no valid entry", it would tear down every pod of the node.
#[test]
#[ignore = "needs root: network namespaces"]
fn gc_with_a_malformed_attachment_list_removes_nothing() {
    assert_can_run();
    let (mut topo, conf) = one_node();
    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(1, "b");
    topo.add(&a, &conf);
    let rb = topo.add(&b, &conf);
    let before = (topo.pod_veths(1), topo.allocations(1));
    assert_eq!(before.0, 2);
    let bad_lists = [
        json!([{"containerID": a.id, "ifname": "eth0"}, {"containerID": b.id, "ifName": "eth0"}]),
        json!([{"containerID": a.id, "ifname": "eth0"}, {"containerID": 7, "ifname": "eth0"}]),
        json!([{"containerID": a.id, "ifname": "eth0"}, null]),
        json!([{"containerID": "", "ifname": "eth0"}]),
        json!([{"containerID": a.id, "ifname": ""}]),
        json!({"containerID": a.id, "ifname": "eth0"}),
        json!("all"),
    ];
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        for list in &bad_lists {
            let mut gc = conf.clone();
            gc["cniVersion"] = json!("1.1.0");
            gc[key] = list.clone();
            let out = topo.cni(1, "GC", &a, "", &gc, "");
            expect_error(&out, 7, key);
            assert_eq!(
                (topo.pod_veths(1), topo.allocations(1)),
                before,
                "GC with {key}: {list} changed the node"
            );
        }
    }
    assert!(topo.reaches(&a, &ip_of(&rb, false)));
}
