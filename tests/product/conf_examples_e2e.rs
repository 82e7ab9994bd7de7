//! Every file in `conf-examples/` used for a real ADD/CHECK/DEL by a real client: Debian's
//! cnitool (libcni 1.1.2) runs the whole chain (bridge + portmap, or sticky-vxlan + portmap,
//! with sticky-ipam) in a netns node, two pods get addresses from the example's ranges and
//! ping each other, and DEL leaves a released lease in the data dir. Root only.
//!
//! What is substituted to run in a sandbox, and nothing else:
//! - Nothing in the bridge examples: each test has its own node netns, so the example's bridge
//!   name (`cni0`, `cni1`, `cni2`) and its iptables rules (`ipMasq`) live there and nowhere
//!   else; the data dir (`/var/lib/cni/networks`, explicit or default) is inside the private
//!   tmpfs that the cnitool sandbox mounts on `/var/lib/cni` (see tests/cnitool_support), and
//!   the test reads it through `/proc/<helper>/root`.
//! - `10-sticky-vxlan.conflist`: `stateDir` is added (moved into the private tmpfs), since its
//!   default `/run/sticky-vxlan` is the machine's. The peers file keeps the example's path,
//!   `/etc/cni/sticky-peers.json`, which is the test's own file in the private `/etc/cni`.
//!
//! - The segment examples (`40-…`, `41-…`): `stateDir` likewise; the NAD's `spec.config` is
//!   installed as the `.conf` Multus would hand over.
//!
//! The files are copied byte for byte into the private `/etc/cni/net.d` whenever nothing has
//! to change, so what is tested is what ships.

use sticky_testkit::cnitool_support;
use sticky_testkit::support;
use sticky_testkit::vxlan_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use cnitool_support::*;
use ipnet::IpNet;
use serde_json::{Value, json};
use vxlan_support::{Topo, ok};

/// Which test exercises which file. [`every_file_in_conf_examples_is_exercised`] fails when a
/// file in conf-examples/ is missing here.
const COVERED: &[(&str, &str)] = &[
    ("10-sticky-ipam-bridge.conflist", "bridge_example"),
    ("10-sticky-vxlan.conflist", "vxlan_example"),
    ("11-sticky-vxlan-cluster.conflist", "vxlan_cluster_example"),
    ("13-sticky-vxlan-sites.conflist", "vxlan_sites_example"),
    (
        "12-sticky-vxlan-ipv6-underlay.conflist",
        "vxlan_ipv6_underlay_example",
    ),
    ("20-sticky-ipam-dualstack.conf", "dualstack_conf_example"),
    ("30-host-local-dropin.conflist", "host_local_dropin_example"),
    (
        "30-host-local-dropin.conflist.host-local",
        "host_local_conflist_then_the_dropin_in_place",
    ),
    ("40-sticky-vxlan-segment.conflist", "segment_example"),
    ("41-vxlan-segment-nad.yaml", "segment_nad_example"),
];

fn example_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("conf-examples")
        .join(name)
}

fn example_bytes(name: &str) -> Vec<u8> {
    std::fs::read(example_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn example(name: &str) -> Value {
    serde_json::from_slice(&example_bytes(name))
        .unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// The IPAM section of the example's first plugin (a .conf is its own first plugin).
fn ipam_of(doc: &Value) -> &Value {
    match doc.get("plugins") {
        Some(p) => &p[0]["ipam"],
        None => &doc["ipam"],
    }
}

/// One range (subnet and optional start/end) of a range set.
struct Range {
    subnet: IpNet,
    start: Option<IpAddr>,
    end: Option<IpAddr>,
}

fn ranges(doc: &Value) -> Vec<Range> {
    ipam_of(doc)["ranges"]
        .as_array()
        .expect("ranges")
        .iter()
        .map(|set| {
            let r = &set[0];
            let addr = |k: &str| r[k].as_str().map(|s| s.parse().unwrap());
            Range {
                subnet: r["subnet"].as_str().unwrap().parse().unwrap(),
                start: addr("rangeStart"),
                end: addr("rangeEnd"),
            }
        })
        .collect()
}

/// Asserts `ip` is a pod address of the range: inside the subnet, not the network address,
/// not the gateway (first address), within rangeStart..rangeEnd when set.
fn assert_in_range(ip: IpAddr, r: &Range, what: &str) {
    assert!(
        r.subnet.contains(&ip),
        "{what}: {ip} is outside {}",
        r.subnet
    );
    assert_ne!(ip, r.subnet.network(), "{what}: got the network address");
    let first = match r.subnet.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + 1).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) + 1).into()),
    };
    assert_ne!(ip, first, "{what}: got the gateway address");
    if let Some(s) = r.start {
        assert!(ip >= s, "{what}: {ip} below rangeStart {s}");
    }
    if let Some(e) = r.end {
        assert!(ip <= e, "{what}: {ip} above rangeEnd {e}");
    }
}

/// A node of one test: the topology (a node netns, underlay for sticky-vxlan) and cnitool's
/// sandbox inside it. Field order is drop order: the runtime's helper ends before the netns go.
struct Node {
    rt: Runtime,
    topo: Topo,
    _bins: tempfile::TempDir,
}

fn node(cnitool: &Path) -> Node {
    node_on(cnitool, Topo::new(1500))
}

/// [`node`] on a given (empty) topology: an IPv6-only underlay's, say.
fn node_on(cnitool: &Path, mut topo: Topo) -> Node {
    let bins = plugin_dir();
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let rt = Runtime::start(&topo.node_ns(1), cnitool, bins.path());
    Node {
        rt,
        topo,
        _bins: bins,
    }
}

/// A pod of a test: its netns (owned by the topology) and kubelet's CNI_ARGS.
struct TestPod {
    ns: String,
    path: String,
    args: String,
}

fn new_pod(node: &mut Node, name: &str) -> TestPod {
    let p = node.topo.new_pod(1, name);
    let path = p.path();
    TestPod {
        args: kubelet_args(
            "examples",
            name,
            &format!("uid-{name}"),
            &container_id(&path),
        ),
        ns: p.ns,
        path,
    }
}

fn env(pod: &TestPod) -> [(&str, &str); 1] {
    [("CNI_ARGS", pod.args.as_str())]
}

fn ips_of(result: &Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|i| {
            i["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// Pings with a bounded retry. IPv6 needs the kernel's DAD on both pod addresses to finish
/// (asynchronous, about a second): up to 10 tries of 2 s each; IPv4 gets 3 (first ARP).
fn pingable(from: &TestPod, to: IpAddr) -> bool {
    let tries = if to.is_ipv6() { 10 } else { 3 };
    reaches(&from.ns, &to.to_string(), tries)
}

/// The sticky-ipam records of network `net` in the sandbox's default data dir.
fn data_dir(n: &Node, net: &str) -> PathBuf {
    n.rt.inside(&format!("/var/lib/cni/networks/{net}"))
}

/// The common run: two pods ADDed through cnitool, addresses from the example's ranges (one
/// per range set), pod 2 pings pod 1 on every family, CHECK passes on libcni's cache, DEL of
/// pod 1 leaves a released lease for each of its addresses and takes its interface away.
fn exercise(name: &str, n: &mut Node) {
    exercise_in(name, n, ranges(&example(name)));
}

/// [`exercise`], with the range sets the addresses must come from given explicitly.
fn exercise_in(name: &str, n: &mut Node, ranges: Vec<Range>) {
    let doc = example(name);
    let net = doc["name"].as_str().unwrap().to_string();
    let version = doc["cniVersion"].as_str().unwrap().to_string();
    let p1 = new_pod(n, "pod-1");
    let p2 = new_pod(n, "pod-2");
    let r1 = n.rt.add(&net, &p1.path, &env(&p1));
    let r2 = n.rt.add(&net, &p2.path, &env(&p2));
    for (r, what) in [(&r1, "pod-1"), (&r2, "pod-2")] {
        assert_eq!(r["cniVersion"], version.as_str(), "{name} {what}: {r}");
        let ips = ips_of(r);
        assert_eq!(
            ips.len(),
            ranges.len(),
            "{name} {what}: one address per range set: {r}"
        );
        for (ip, range) in ips.iter().zip(&ranges) {
            assert_in_range(*ip, range, &format!("{name} {what}"));
        }
    }
    let ip1 = ips_of(&r1);
    for ip in &ip1 {
        assert!(
            pingable(&p2, *ip),
            "{name}: pod-2 cannot ping pod-1 at {ip}"
        );
    }
    n.rt.must("check", &net, &p1.path, &env(&p1));

    n.rt.must("del", &net, &p1.path, &env(&p1));
    let state = support::check_dir(&data_dir(n, &net), support::COMPLETED);
    for ip in &ip1 {
        let lease = state.sticky(*ip);
        assert!(
            !lease.attached,
            "{name}: {ip} not released by DEL: {lease:?}"
        );
        assert_eq!(lease.pod, "pod-1");
        assert_eq!(lease.container_id, container_id(&p1.path));
    }
    assert!(
        addrs(&p1.ns, "eth0").is_empty(),
        "{name}: pod-1 still has eth0 after DEL"
    );
    for ip in ips_of(&r2) {
        assert!(
            state.sticky(ip).attached,
            "{name}: DEL of pod-1 touched pod-2"
        );
    }
    n.rt.must("del", &net, &p2.path, &env(&p2));
    assert_eq!(
        support::check_dir(&data_dir(n, &net), support::COMPLETED).released_count(),
        ip1.len() * 2,
        "{name}: both pods' leases are kept, released"
    );
}

/// Installs `doc` as `/etc/cni/net.d/<file>` with its `stateDir` moved into the sandbox (the
/// default `/run/sticky-vxlan` is the machine's), and the peers file naming nodes 1 and 2 at
/// the examples' path.
fn install_with_state(n: &Node, file: &str, mut doc: Value) {
    let entry = match doc.get_mut("plugins") {
        Some(plugins) => &mut plugins[0],
        None => &mut doc,
    };
    entry["stateDir"] = json!("/var/lib/cni/test-sticky-vxlan-state");
    n.rt.write_etc(&format!("net.d/{file}"), &doc);
    let v6 = n.topo.underlay6;
    n.rt.write_etc(
        "sticky-peers.json",
        &json!([n.topo.peer_of(1, v6), n.topo.peer_of(2, v6)]),
    );
}

/// Installs the example byte for byte as `/etc/cni/net.d/<name>`.
fn install_unchanged(n: &Node, name: &str) {
    n.rt.write_etc_raw(&format!("net.d/{name}"), &example_bytes(name));
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn bridge_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "10-sticky-ipam-bridge.conflist";
    let mut n = node(&cnitool);
    install_unchanged(&n, name);
    exercise(name, &mut n);
    // The example's own bridge, in the node's netns, holds the example's gateway.
    assert!(addrs(&n.topo.node_ns(1), "cni0").contains(&"10.88.0.1".to_string()));
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn vxlan_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "10-sticky-vxlan.conflist";
    let mut n = node(&cnitool);
    let list = example(name);
    // The only change: stateDir into the sandbox. The example is node 1's: 10.244.1.0/24,
    // named by the peers file install_with_state writes at the example's path.
    assert_eq!(
        list["plugins"][0]["peersFile"], "/etc/cni/sticky-peers.json",
        "the example's peers file path"
    );
    install_with_state(&n, name, list);
    exercise(name, &mut n);
    // The example's defaults: VTEP sticky.1 with the kept MAC, bridge stickybr0, and the peer
    // from the peers file programmed (onlink route, proto 118).
    let node1 = n.topo.node_ns(1);
    assert_eq!(n.topo.link_mac(&node1, "sticky.1"), "0a:01:c0:00:02:01");
    assert!(addrs(&node1, "stickybr0").contains(&"10.244.1.1".to_string()));
    let routes = vxlan_support::ok(&["ip", "-n", &node1, "route", "show", "proto", "118"]);
    assert!(
        routes.contains("10.244.2.0/24 via 10.244.2.0 dev sticky.1"),
        "{routes}"
    );
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn vxlan_ipv6_underlay_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "12-sticky-vxlan-ipv6-underlay.conflist";
    let mut n = node_on(&cnitool, Topo::new_ipv6(1500));
    // The only change: stateDir into the sandbox. The peers file names nodes 1 and 2 by their
    // IPv6 addresses, with dual-stack subnets.
    install_with_state(&n, name, example(name));
    exercise(name, &mut n);
    // The VTEP on the IPv6 underlay, its kept MAC, 70 bytes of overhead, node 2 programmed.
    let node1 = n.topo.node_ns(1);
    assert_eq!(n.topo.link_mac(&node1, "sticky.1"), "06:be:aa:cc:39:99");
    let vtep = vxlan_support::ok(&["ip", "-n", &node1, "-d", "link", "show", "sticky.1"]);
    assert!(
        vtep.contains("local 2001:db8::1") && vtep.contains("mtu 1430"),
        "{vtep}"
    );
    let routes = vxlan_support::ok(&["ip", "-n", &node1, "route", "show", "proto", "118"]);
    assert!(
        routes.contains("10.244.2.0/24 via 10.244.2.0 dev sticky.1"),
        "{routes}"
    );
    let fdb = vxlan_support::ok(&["bridge", "-n", &node1, "fdb", "show", "dev", "sticky.1"]);
    assert!(fdb.contains("dst 2001:db8::2"), "{fdb}");
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn vxlan_cluster_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let mut n = node(&cnitool);
    exercise_cluster("11-sticky-vxlan-cluster.conflist", &mut n);
}

/// A cluster conflist's common run: the only change is stateDir into the sandbox; the example
/// names no range, so node 1's subnet comes from its entry in the peers file.
fn exercise_cluster(name: &str, n: &mut Node) {
    install_with_state(n, name, example(name));
    let node_range = Range {
        subnet: Topo::subnet(1).parse().unwrap(),
        start: None,
        end: None,
    };
    exercise_in(name, n, vec![node_range]);
}

/// The cluster network with sites (docs/sites.md): node 2 is its site's active gateway and
/// carries another site's pod subnet; the pod MTU leaves room for the tunnel (1500 - 72: WireGuard's 60, a relay's 12; to a multiple of 16).
#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn vxlan_sites_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "13-sticky-vxlan-sites.conflist";
    let mut n = node(&cnitool);
    exercise_cluster(name, &mut n);
    let mut gateway = n.topo.peer_of(2, false);
    gateway["carries"] = json!(["198.18.21.0/24"]);
    n.rt.write_etc(
        "sticky-peers.json",
        &json!([n.topo.peer_of(1, false), gateway]),
    );
    let net = example(name)["name"].as_str().unwrap().to_string();
    let pod = new_pod(&mut n, "pod-mtu");
    n.rt.add(&net, &pod.path, &env(&pod));
    let link = ok(&["ip", "-n", &pod.ns, "-o", "link", "show", "eth0"]);
    assert!(
        link.contains(" mtu 1424 "),
        "{name}: pod MTU is not 1424: {link}"
    );
    let via = Topo::subnet(2).split('/').next().unwrap().to_string();
    let routes = ok(&[
        "ip",
        "-n",
        &n.topo.node_ns(1),
        "route",
        "show",
        "198.18.21.0/24",
    ]);
    assert!(
        routes.contains(&format!("via {via}")) && routes.contains("onlink"),
        "{name}: the carried subnet is not routed via the gateway's subnet {via}: {routes:?}"
    );
    n.rt.must("del", &net, &pod.path, &env(&pod));
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn dualstack_conf_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "20-sticky-ipam-dualstack.conf";
    assert!(
        example(name).get("plugins").is_none(),
        "a single-plugin .conf"
    );
    let mut n = node(&cnitool);
    // libcni finds a .conf by its network name and wraps it in a list, as for any runtime.
    install_unchanged(&n, name);
    exercise(name, &mut n);
    assert!(addrs(&n.topo.node_ns(1), "cni1").contains(&"10.89.0.1".to_string()));
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn host_local_dropin_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "30-host-local-dropin.conflist";
    let mut n = node(&cnitool);
    install_unchanged(&n, name);
    exercise(name, &mut n);
}

/// The drop-in as an operator does it: pods run under the host-local conflist (the
/// `.host-local` file, installed under the name libcni reads), then the file is replaced by
/// the drop-in in place, same data dir. The host-local address stays allocated, libcni's
/// cached host-local result passes sticky-ipam's CHECK, DEL with the kubelet's identity turns
/// it into a released lease, and the recreated pod gets it back.
#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn host_local_conflist_then_the_dropin_in_place() {
    let cnitool = prerequisites("conf_examples_e2e");
    let installed = "net.d/30-host-local-dropin.conflist";
    let mut n = node(&cnitool);
    let net = "edge-pods";
    n.rt.write_etc_raw(
        installed,
        &example_bytes("30-host-local-dropin.conflist.host-local"),
    );
    let old = new_pod(&mut n, "old");
    let r_old = n.rt.add(net, &old.path, &env(&old));
    let ip_old = ips_of(&r_old)[0];
    let subnet: IpNet = "10.90.0.0/24".parse().unwrap();
    assert!(subnet.contains(&ip_old), "{r_old}");
    let host_local_record = data_dir(&n, net).join(ip_old.to_string());
    assert_eq!(
        std::fs::read_to_string(&host_local_record).unwrap(),
        format!("{}\r\neth0", container_id(&old.path)),
        "host-local's own record"
    );

    // The one-word change, in place.
    n.rt.write_etc_raw(installed, &example_bytes("30-host-local-dropin.conflist"));
    let new = new_pod(&mut n, "new");
    let r_new = n.rt.add(net, &new.path, &env(&new));
    let ip_new = ips_of(&r_new)[0];
    assert!(subnet.contains(&ip_new));
    assert_ne!(
        ip_new, ip_old,
        "the host-local allocation was handed out again"
    );
    assert!(
        pingable(&new, ip_old),
        "the pod from the host-local era is cut off"
    );
    n.rt.must("check", net, &old.path, &env(&old));

    // DEL (kubelet's identity in CNI_ARGS) releases the adopted record as a lease of its pod.
    n.rt.must("del", net, &old.path, &env(&old));
    let state = support::check_dir(&data_dir(&n, net), support::COMPLETED);
    let lease = state.sticky(ip_old);
    assert!(!lease.attached && lease.pod == "old", "{lease:?}");
    assert!(!host_local_record.exists());

    // Recreated under the same name in a new netns: its host-local address back.
    let again = {
        let p = n.topo.new_pod(1, "old-again");
        let path = p.path();
        TestPod {
            args: kubelet_args("examples", "old", "uid-old-2", &container_id(&path)),
            ns: p.ns,
            path,
        }
    };
    let r_again = n.rt.add(net, &again.path, &env(&again));
    assert_eq!(
        ips_of(&r_again),
        vec![ip_old],
        "the migrated pod lost its address"
    );
    // Reached from the node (through the example's bridge and gateway), not from pod `new`:
    // the reference bridge plugin gives the recreated pod a new random MAC, and `new` still
    // holds a REACHABLE neighbour entry for the old one (sticky-vxlan derives the MAC from the
    // IP to avoid exactly this; the bridge plugin does not).
    let neigh = vxlan_support::ok(&["ip", "-n", &new.ns, "neigh", "show", &ip_old.to_string()]);
    eprintln!("pod `new`'s neighbour entry for {ip_old} after the recreate: {neigh}");
    assert!(
        reaches(&n.topo.node_ns(1), &ip_old.to_string(), 3),
        "the recreated pod is not reachable at {ip_old}"
    );
    for p in [&again, &new] {
        n.rt.must("del", net, &p.path, &env(p));
    }
    assert_eq!(
        support::check_dir(&data_dir(&n, net), support::COMPLETED).released_count(),
        2
    );
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn segment_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "40-sticky-vxlan-segment.conflist";
    let mut n = node(&cnitool);
    install_with_state(&n, name, example(name));
    // Node 192.0.2.1 takes slice 1 of 192.168.10.0/24 cut in /27s: .33 to .62.
    let slice = Range {
        subnet: "192.168.10.0/24".parse().unwrap(),
        start: Some("192.168.10.33".parse().unwrap()),
        end: Some("192.168.10.62".parse().unwrap()),
    };
    exercise_in(name, &mut n, vec![slice]);
    let node1 = n.topo.node_ns(1);
    let fdb = vxlan_support::ok(&[
        "ip", "netns", "exec", &node1, "bridge", "fdb", "show", "dev", "segvx100",
    ]);
    assert!(
        fdb.contains("00:00:00:00:00:00 dst 192.0.2.2 self permanent"),
        "{fdb}"
    );
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn segment_nad_example() {
    let cnitool = prerequisites("conf_examples_e2e");
    let name = "41-vxlan-segment-nad.yaml";
    let mut n = node(&cnitool);
    let conf = support::nad_config(&String::from_utf8_lossy(&example_bytes(name)));
    install_with_state(&n, "vxeth1.conf", conf);
    let a = new_pod(&mut n, "a-5cd8c6ccb8-kkvwt");
    let gw = new_pod(&mut n, "gw-f87979b47-5p57h");
    let ra = n.rt.add("vxeth1", &a.path, &env(&a));
    let rgw = n.rt.add("vxeth1", &gw.path, &env(&gw));
    assert_eq!(ra["ips"][0]["address"], "192.168.11.2/29", "{ra}");
    assert_eq!(rgw["ips"][0]["address"], "192.168.11.1/29", "{rgw}");
    assert_eq!(ra["routes"][0]["gw"], "192.168.11.1", "{ra}");
    assert!(pingable(&a, "192.168.11.1".parse().unwrap()));
    n.rt.must("check", "vxeth1", &a.path, &env(&a));
    n.rt.must("del", "vxeth1", &a.path, &env(&a));
    assert!(addrs(&a.ns, "eth0").is_empty());
    n.rt.must("del", "vxeth1", &gw.path, &env(&gw));
}

/// The vxlan example as a runtime on libcni ≥ 1.2 (containerd ≥ 2.0.1, CRI-O) sends it:
/// cniVersion 1.1.0, negotiated from `cniVersions`, the plugin run directly (Debian's cnitool
/// speaks up to 1.0.0). ADD answers at 1.1.0; STATUS is ready; GC removes the attachment it is
/// not given and passes GC to sticky-ipam at the same version, which releases that lease.
#[test]
#[ignore = "needs root: network namespaces"]
fn vxlan_example_at_1_1_0_answers_add_status_and_gc() {
    vxlan_support::assert_can_run();
    let name = "10-sticky-vxlan.conflist";
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    std::os::unix::fs::symlink(support::sticky_bin(), topo.cni_path.join("sticky-ipam")).unwrap();
    let mut entry = support::runtime_entries(&example(name), true)[0].clone();
    assert_eq!(
        entry["cniVersion"],
        support::LIBCNI_1_2_MAX,
        "{name}: {entry}"
    );
    // Into the test's dirs: state, peers file, data dir. The example is node 1's subnet.
    let peers = json!([topo.peer_of(1, false), topo.peer_of(2, false)]);
    entry["stateDir"] = json!(topo.state_dir(1));
    entry["peersFile"] = json!(topo.write_peers_file("peers.json", &peers));
    let data = topo.dir.path().join("ipam");
    entry["ipam"]["dataDir"] = json!(data);
    assert_eq!(entry["ipam"]["ranges"][0][0]["subnet"], Topo::subnet(1));

    let a = topo.new_pod(1, "a");
    let b = topo.new_pod(1, "b");
    let ra = topo.add(&a, &entry);
    let rb = topo.add(&b, &entry);
    for r in [&ra, &rb] {
        assert_eq!(r["cniVersion"], support::LIBCNI_1_2_MAX, "{r}");
    }
    let status = topo.cni(1, "STATUS", &a, "", &entry, "");
    vxlan_support::succeeded(&status, "STATUS");
    let mut gc = entry.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.id, "ifname": "eth0"}]);
    let out = topo.cni(1, "GC", &a, "", &gc, "");
    vxlan_support::succeeded(&out, "GC");

    let links = vxlan_support::ok(&["ip", "-n", &topo.node_ns(1), "-o", "link"]);
    let host = |r: &Value| r["interfaces"][1]["name"].as_str().unwrap().to_string();
    assert!(links.contains(&host(&ra)), "valid attachment kept: {links}");
    assert!(
        !links.contains(&host(&rb)),
        "stale attachment removed: {links}"
    );
    let state = support::check_dir(&data.join("sticky"), support::COMPLETED);
    let ip = |r: &Value| vxlan_support::ip_of(r, false).parse::<IpAddr>().unwrap();
    assert_eq!(state.attached_to(&a.id), [ip(&ra)], "GC kept a's address");
    assert_eq!(
        state.attached_to(&b.id),
        Vec::<IpAddr>::new(),
        "GC released b's address"
    );
}

#[test]
fn every_file_in_conf_examples_is_exercised() {
    let mut files: Vec<String> = std::fs::read_dir(example_path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "README.md")
        .collect();
    files.sort();
    let mut covered: Vec<String> = COVERED.iter().map(|(f, _)| f.to_string()).collect();
    covered.sort();
    assert_eq!(
        files, covered,
        "every file in conf-examples/ needs a real ADD/DEL in tests/conf_examples_e2e.rs"
    );
    // Each one parses, and speaks a version Debian's cnitool (libcni 1.1.2) can run.
    for (file, test) in COVERED {
        let doc = match file.strip_suffix(".yaml") {
            Some(_) => support::nad_config(&String::from_utf8_lossy(&example_bytes(file))),
            None => example(file),
        };
        let v = doc["cniVersion"].as_str().unwrap_or_default();
        assert!(
            ["0.4.0", "1.0.0"].contains(&v),
            "{file} (exercised by {test}): cniVersion {v:?}"
        );
        // A 1.0.0 conflist also offers 1.1.0 to runtimes that negotiate (libcni ≥ 1.2); the
        // real ADD/DEL above runs it through cnitool, which loads it at 1.0.0.
        if file.ends_with(".conflist") && v == "1.0.0" {
            assert_eq!(
                doc["cniVersions"],
                json!(["1.0.0", "1.1.0"]),
                "{file}: cniVersions beside cniVersion 1.0.0"
            );
        }
        // Ranges are the example's own, or (cluster-wide conflists) filled in per node.
        let first = doc.get("plugins").map_or(&doc, |p| &p[0]);
        if first["mode"] == "segment" {
            // A segment may have no IPAM at all; its config must read.
            sticky_vxlan::segment::config::Config::from_json("example", first)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            continue;
        }
        assert!(
            sticky_overlay::config::Config::from_json("n", first)
                .is_ok_and(|c| c.ranges_from_peers)
                || !ranges(&doc).is_empty(),
            "{file}: no ranges"
        );
    }
    // And this file names each test it lists (a renamed test must update the table).
    let me = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file!())).unwrap();
    for (_, test) in COVERED {
        assert!(me.contains(&format!("fn {test}()")), "no test named {test}");
    }
}
