//! Migration: a flannel-style VTEP made by hand (its own random MAC) on a fourth node
//! interoperates once its MAC is given in the peer entry, and it reaches us by programming
//! our kept MAC exactly as flannel does from a Node annotation.

use sticky_testkit::vxlan_support;

use serde_json::json;
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn hand_made_flannel_vtep_interoperates_when_its_mac_is_given() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(4, 1500);
    let n4 = topo.node_ns(4);
    let f = |args: &[&str]| {
        let mut full = vec!["ip", "-n", n4.as_str()];
        full.extend_from_slice(args);
        ok(&full);
    };
    // What flannel's vxlan backend sets up on its node.
    f(&[
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "1",
        "local",
        "192.0.2.4",
        "dev",
        "eth0",
        "dstport",
        "8472",
        "nolearning",
    ]);
    f(&["link", "set", "flannel.1", "mtu", "1450", "up"]);
    f(&["addr", "add", "10.244.4.0/32", "dev", "flannel.1"]);
    f(&["link", "add", "cni0", "type", "bridge"]);
    f(&["addr", "add", "10.244.4.1/24", "dev", "cni0"]);
    f(&["link", "set", "cni0", "up"]);
    let p4 = topo.new_pod(4, "f");
    f(&[
        "link", "add", "vethf", "mtu", "1450", "type", "veth", "peer", "name", "eth0", "mtu",
        "1450", "netns", &p4.ns,
    ]);
    f(&["link", "set", "vethf", "master", "cni0", "up"]);
    ok(&[
        "ip",
        "-n",
        &p4.ns,
        "addr",
        "add",
        "10.244.4.2/24",
        "dev",
        "eth0",
    ]);
    ok(&["ip", "-n", &p4.ns, "link", "set", "eth0", "up"]);
    ok(&[
        "ip",
        "-n",
        &p4.ns,
        "route",
        "add",
        "default",
        "via",
        "10.244.4.1",
    ]);
    topo.in_ns(&n4, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let flannel_mac = topo.link_mac(&n4, "flannel.1");
    assert!(
        !flannel_mac.starts_with("0a:01:"),
        "flannel's MAC is its own: {flannel_mac}"
    );

    // Flannel learns node 1 from its Node annotation: backend-data {"VNI":1,"VtepMAC":...}
    // with the kept MAC, which anyone can compute offline.
    let our_mac = ok(&[bin(), "mac", "--local", "192.0.2.1", "--vni", "1"]);
    let our_mac = our_mac.trim();
    f(&[
        "neigh",
        "replace",
        "10.244.1.0",
        "lladdr",
        our_mac,
        "dev",
        "flannel.1",
        "nud",
        "permanent",
    ]);
    ok(&[
        "bridge",
        "-n",
        &n4,
        "fdb",
        "append",
        our_mac,
        "dev",
        "flannel.1",
        "dst",
        "192.0.2.1",
    ]);
    f(&[
        "route",
        "replace",
        "10.244.1.0/24",
        "via",
        "10.244.1.0",
        "dev",
        "flannel.1",
        "onlink",
    ]);

    // Node 1 runs sticky-vxlan with the flannel node's MAC in its peer entry.
    let peers = json!([Topo::peer(1, false), {"ip": "192.0.2.4", "subnets": ["10.244.4.0/24"], "mac": flannel_mac}]);
    let a = topo.new_pod(1, "a");
    let ra = topo.add(&a, &topo.conf(1, json!({"peers": peers})));
    assert!(topo.reaches(&a, "10.244.4.2"), "sticky pod -> flannel pod");
    assert!(
        topo.reaches(&p4, &ip_of(&ra, false)),
        "flannel pod -> sticky pod"
    );
}
