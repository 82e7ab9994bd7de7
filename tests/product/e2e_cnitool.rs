//! Both plugins driven by a real client: Debian's cnitool (libcni 1.1.2, what containerd and
//! CRI-O run), on two netns nodes of the vxlan_support topology, with the conflist from
//! `conf-examples/10-sticky-vxlan.conflist` (sticky-vxlan + sticky-ipam, chained with Debian's
//! portmap) and Debian's loopback as a network of its own, as containerd attaches it.
//!
//! The sandbox (see `tests/cnitool_support/mod.rs`): cnitool runs in the node's netns and in a
//! private mount namespace of a helper process per node, with a tmpfs on `/var/lib/cni` and a
//! temp dir bound on `/etc/cni`: the machine's cache and config are never touched. Root only.

use sticky_testkit::cnitool_support;
use sticky_testkit::support;
use sticky_testkit::vxlan_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use cnitool_support::*;
use serde_json::{Value, json};
use vxlan_support::{Topo, ok};

const NET: &str = "sticky";
/// sticky-vxlan's state (peer lock, last valid peers file) goes into the private tmpfs: the
/// default `/run/sticky-vxlan` is the machine's.
const STATE_DIR: &str = "/var/lib/cni/test-sticky-vxlan-state";

/// The example conflist as node `n` installs it. The example is node 1's (10.244.1.0/24);
/// node `n` gets its own subnet, and the state dir moves into the sandbox. Nothing else
/// changes: the peers file is the example's `/etc/cni/sticky-peers.json` (private here), the
/// data dir is the default `/var/lib/cni/networks` (in the private tmpfs).
fn node_conflist(n: u8) -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf-examples/10-sticky-vxlan.conflist"
    );
    let mut list: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        list["cniVersion"], "1.0.0",
        "Debian's cnitool speaks up to 1.0.0"
    );
    // Both keys, as shipped: libcni 1.1.2 (cnitool, containerd 1.6/1.7) ignores cniVersions.
    assert_eq!(list["cniVersions"], json!(["1.0.0", "1.1.0"]));
    assert_eq!(list["name"], NET);
    assert_eq!(list["plugins"][1]["type"], "portmap");
    let main = &mut list["plugins"][0];
    assert_eq!(main["peersFile"], "/etc/cni/sticky-peers.json");
    main["ipam"]["ranges"][0][0]["subnet"] = json!(Topo::subnet(n));
    main["stateDir"] = json!(STATE_DIR);
    list
}

/// Starts node `n`'s runtime view with the cluster-wide peers file and its two networks.
fn node_runtime(
    topo: &Topo,
    n: u8,
    nodes: u8,
    cnitool: &std::path::Path,
    bins: &std::path::Path,
) -> Runtime {
    let rt = Runtime::start(&topo.node_ns(n), cnitool, bins);
    let peers: Vec<Value> = (1..=nodes).map(|m| Topo::peer(m, false)).collect();
    rt.write_etc("sticky-peers.json", &json!(peers));
    rt.write_etc("net.d/10-sticky-vxlan.conflist", &node_conflist(n));
    rt.write_etc(
        "net.d/99-loopback.conflist",
        &json!({"cniVersion": "1.0.0", "name": "cni-loopback", "plugins": [{"type": "loopback"}]}),
    );
    rt
}

/// What containerd does for a new sandbox: loopback (ifname `lo`), then the pod network.
fn start_pod(rt: &Runtime, netns: &str, args: &str, cap_args: Option<&str>) -> Value {
    rt.add(
        "cni-loopback",
        netns,
        &[("CNI_IFNAME", "lo"), ("CNI_ARGS", args)],
    );
    let mut env = vec![("CNI_ARGS", args)];
    if let Some(c) = cap_args {
        env.push(("CAP_ARGS", c));
    }
    rt.add(NET, netns, &env)
}

fn stop_pod(rt: &Runtime, netns: &str, args: &str, cap_args: Option<&str>) {
    let mut env = vec![("CNI_ARGS", args)];
    if let Some(c) = cap_args {
        env.push(("CAP_ARGS", c));
    }
    rt.must("del", NET, netns, &env);
    rt.must(
        "del",
        "cni-loopback",
        netns,
        &[("CNI_IFNAME", "lo"), ("CNI_ARGS", args)],
    );
}

fn assert_pod_result(result: &Value, netns: &str, node: u8) -> String {
    assert_eq!(result["cniVersion"], "1.0.0", "{result}");
    let ip = first_ip(result, false);
    assert!(
        ip.starts_with(&format!("10.244.{node}.")) && !ip.ends_with(".0") && !ip.ends_with(".1"),
        "{ip} is not a pod address of node {node}'s subnet"
    );
    let ifaces = result["interfaces"].as_array().expect("interfaces");
    assert!(
        ifaces
            .iter()
            .any(|i| i["name"] == "eth0" && i["sandbox"] == netns),
        "no eth0 in the sandbox {netns}: {result}"
    );
    ip
}

fn link_up(netns: &str, dev: &str) -> bool {
    let out = ok(&["ip", "-n", netns, "-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"))
}

/// A one-shot TCP server in a pod netns that answers `hello <peer address>`; killed on drop.
struct Server(Child);

impl Server {
    fn start(netns: &str, port: u16) -> Server {
        let code = format!(
            "import socket\n\
             s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('0.0.0.0', {port})); s.listen()\n\
             print('listening', flush=True)\n\
             c, a = s.accept(); c.sendall(('hello ' + a[0]).encode()); c.close()\n"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "python3", "-c", &code])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "listening", "the test server did not start");
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tcp_hello(from_ns: &str, host: &str, port: u16) -> String {
    let code = format!(
        "import socket\n\
         s = socket.create_connection(('{host}', {port}), timeout=5)\n\
         print(s.recv(100).decode())\n"
    );
    let out = Command::new("ip")
        .args(["netns", "exec", from_ns, "python3", "-c", &code])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn vtep_tx_packets(node_ns: &str) -> u64 {
    let out = ok(&[
        "ip", "-n", node_ns, "-s", "-j", "link", "show", "dev", "sticky.1",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

fn nat_rules(node_ns: &str) -> String {
    ok(&[
        "ip", "netns", "exec", node_ns, "iptables", "-t", "nat", "-S",
    ])
}

#[test]
#[ignore = "needs root: network and mount namespaces (cnitool)"]
fn two_nodes_through_cnitool_overlay_portmap_recreate_same_ip_and_check() {
    let cnitool = prerequisites("e2e_cnitool");
    let bins = plugin_dir();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let rt1 = node_runtime(&topo, 1, 2, &cnitool, bins.path());
    let rt2 = node_runtime(&topo, 2, 2, &cnitool, bins.path());

    // Pod a on node 1, pod b on node 2 (with a hostPort through Debian's portmap).
    let a = topo.new_pod(1, "a");
    let cid_a = container_id(&a.path());
    let args_a = kubelet_args("shop", "web-a", "uid-web-a-1", &cid_a);
    let ra = start_pod(&rt1, &a.path(), &args_a, None);
    let ip_a = assert_pod_result(&ra, &a.path(), 1);
    assert!(link_up(&a.ns, "lo"), "loopback network did not bring lo up");

    let b = topo.new_pod(2, "b");
    let args_b = kubelet_args("shop", "web-b", "uid-web-b-1", &container_id(&b.path()));
    let ports = r#"{"portMappings":[{"hostPort":18080,"containerPort":8080,"protocol":"tcp"}]}"#;
    let rb = start_pod(&rt2, &b.path(), &args_b, Some(ports));
    let ip_b = assert_pod_result(&rb, &b.path(), 2);

    // libcni cached our result under its own (private) cache, with the kubelet's CNI_ARGS.
    let cache = rt1
        .cached(NET, &cid_a, "eth0")
        .expect("libcni cached the ADD result");
    assert_eq!(cache["result"]["ips"], ra["ips"], "{cache}");
    assert_eq!(cache["containerId"], cid_a);
    assert!(
        cache["cniArgs"]
            .to_string()
            .contains("\"K8S_POD_NAME\",\"web-a\""),
        "{cache}"
    );
    assert!(
        !std::path::Path::new("/var/lib/cni/results").exists()
            || std::fs::read_dir("/var/lib/cni/results")
                .unwrap()
                .all(|e| !e.unwrap().file_name().to_string_lossy().contains(&cid_a)),
        "the machine's own cache was written"
    );

    // Across the VXLAN overlay, both ways: the packets leave node 1 through its VTEP.
    let vtep_tx_before = vtep_tx_packets(&topo.node_ns(1));
    assert!(reaches(&a.ns, &ip_b, 3), "a cannot reach b ({ip_b})");
    assert!(reaches(&b.ns, &ip_a, 3), "b cannot reach a ({ip_a})");
    assert!(
        vtep_tx_packets(&topo.node_ns(1)) >= vtep_tx_before + 2,
        "the pings did not go through node 1's VTEP"
    );

    // portmap got our result as prevResult and mapped node 2's hostPort to b's address: a
    // client on node 1 connects to 192.0.2.2:18080 and lands in pod b.
    assert!(
        nat_rules(&topo.node_ns(2)).contains(&format!("--to-destination {ip_b}:8080")),
        "no DNAT to b:\n{}",
        nat_rules(&topo.node_ns(2))
    );
    {
        let _server = Server::start(&b.ns, 8080);
        assert_eq!(
            tcp_hello(&topo.node_ns(1), "192.0.2.2", 18080),
            "hello 192.0.2.1"
        );
    }

    // CHECK on results cached by libcni: sticky-vxlan, sticky-ipam and portmap accept them.
    // b's CHECK goes without CAP_ARGS: Debian's portmap 1.1.1 fails CHECK of any IPv4-only
    // mapping, looking for an ip6tables chain it never made (containernetworking/plugins#819,
    // fixed upstream later); without mappings portmap checks nothing and ours are still run.
    rt1.must("check", NET, &a.path(), &[("CNI_ARGS", &args_a)]);
    rt2.must("check", NET, &b.path(), &[("CNI_ARGS", &args_b)]);

    // The pod is deleted (DEL of both networks), then recreated under the same name in a new
    // netns: new container id, same kubelet identity and UID.
    let mac_a = topo.link_mac(&a.ns, "eth0");
    stop_pod(&rt1, &a.path(), &args_a, None);
    assert!(
        rt1.cached(NET, &cid_a, "eth0").is_none(),
        "libcni kept the cache after DEL"
    );
    let net_dir = rt1.inside("/var/lib/cni/networks/sticky");
    let state = support::check_dir(&net_dir, support::COMPLETED);
    let lease = state.sticky(ip_a.parse().unwrap());
    assert!(!lease.attached, "DEL did not release {ip_a}: {lease:?}");
    assert_eq!(
        (lease.namespace.as_str(), lease.pod.as_str()),
        ("shop", "web-a")
    );
    assert_eq!(lease.container_id, cid_a);
    let ns_a = a.ns.clone();
    topo.drop_ns(&ns_a);

    let a2 = topo.new_pod(1, "a2");
    let cid_a2 = container_id(&a2.path());
    assert_ne!(cid_a2, cid_a, "a new netns path gives a new container id");
    let args_a2 = kubelet_args("shop", "web-a", "uid-web-a-1", &cid_a2);
    let ra2 = start_pod(&rt1, &a2.path(), &args_a2, None);
    assert_eq!(
        assert_pod_result(&ra2, &a2.path(), 1),
        ip_a,
        "the recreated pod changed IP"
    );
    assert_eq!(topo.link_mac(&a2.ns, "eth0"), mac_a, "and its MAC");
    let lease = support::check_dir(&net_dir, support::COMPLETED).sticky(ip_a.parse().unwrap());
    assert!(lease.attached && lease.container_id == cid_a2, "{lease:?}");
    assert!(
        reaches(&b.ns, &ip_a, 3),
        "b cannot reach the recreated pod at {ip_a}"
    );

    // CHECK passes on the new cache; it reads the cached prevResult (an address that libcni's
    // cache claims but the pod lacks fails it), and fails once the pod's address is gone.
    rt1.must("check", NET, &a2.path(), &[("CNI_ARGS", &args_a2)]);
    let cache_file = rt1.inside(&format!("/var/lib/cni/results/{NET}-{cid_a2}-eth0"));
    let good_cache = std::fs::read(&cache_file).expect("libcni cache of a2");
    let mut forged: Value = serde_json::from_slice(&good_cache).unwrap();
    forged["result"]["ips"][0]["address"] = json!("10.244.1.200/24");
    std::fs::write(&cache_file, forged.to_string()).unwrap();
    let out = rt1.cnitool("check", NET, &a2.path(), &[("CNI_ARGS", &args_a2)]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("10.244.1.200"),
        "CHECK ignored the cached prevResult: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&cache_file, &good_cache).unwrap();
    rt1.must("check", NET, &a2.path(), &[("CNI_ARGS", &args_a2)]);
    ok(&[
        "ip",
        "-n",
        &a2.ns,
        "addr",
        "del",
        &format!("{ip_a}/24"),
        "dev",
        "eth0",
    ]);
    let out = rt1.cnitool("check", NET, &a2.path(), &[("CNI_ARGS", &args_a2)]);
    assert!(
        !out.status.success(),
        "CHECK passed although {ip_a} was removed from the pod"
    );
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains(&format!("{ip_a}/24")),
        "CHECK failed for another reason than the missing address: {why}"
    );

    // DEL still works (best effort), and portmap's DNAT goes with b.
    stop_pod(&rt1, &a2.path(), &args_a2, None);
    stop_pod(&rt2, &b.path(), &args_b, Some(ports));
    assert!(
        !nat_rules(&topo.node_ns(2)).contains(&format!("{ip_b}:8080")),
        "portmap left its DNAT behind"
    );
    assert!(
        addrs(&b.ns, "eth0").is_empty(),
        "b's interface survived DEL"
    );
}
