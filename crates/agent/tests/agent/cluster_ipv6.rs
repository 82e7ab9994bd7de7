//! `sticky-vxlan-agent` on an IPv6-only underlay (issue 22): the nodes' underlay carries no
//! IPv4 address at all (`2001:db8::<n>/64`), the test API server answers on it
//! (`[2001:db8::fe]`), and the Node objects are a dual-stack kubelet's (an IPv4 InternalIP
//! listed first, then the IPv6 one). The agents build the peers from the IPv6 addresses, the
//! plugin programs them, and dual-stack pods on two nodes ping each other in both families.

use sticky_testkit::agent_support;
use sticky_testkit::kube_support;
use sticky_testkit::vxlan_support;

use std::time::Duration;

use agent_support::*;
use kube_support::*;
use serde_json::json;
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn agents_take_the_ipv6_internal_ips_of_dual_stack_nodes_and_pods_ping_in_both_families() {
    assert_can_run();
    // Node 1's network names its IPv6 localIp; node 2's names nothing, and its agent is told
    // the family by --underlay-family.
    let mut c = Cluster::new_ipv6(|n| match n {
        1 => json!({"localIp": "2001:db8::1"}),
        _ => json!({}),
    });
    for n in 1..=2 {
        let v4 = c.topo.ip(n, &["-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(v4.trim().is_empty(), "no IPv4 on the underlay: {v4}");
    }
    c.api.put_node(Cluster::node_dual(1));
    c.api.put_node(Cluster::node_dual(2));
    // A Node with an IPv4 InternalIP only: nothing of this network's family.
    c.api.put_node(Cluster::node(3));
    // A dual-stack flannel node (flannel-v6.1 beside flannel.1).
    let flannel = with_internal_ips(
        node_json(
            "flannel-9",
            "192.0.2.9",
            &["10.244.9.0/24", "fd00:9::/64"],
            json!({
                "flannel.alpha.coreos.com/backend-data": "{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:11:22:33\"}",
                "flannel.alpha.coreos.com/backend-v6-data": "{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:66:66:66\"}",
                "flannel.alpha.coreos.com/backend-type": "vxlan",
                "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                "flannel.alpha.coreos.com/public-ip": "192.0.2.9",
                "flannel.alpha.coreos.com/public-ipv6": "2001:db8::99"
            }),
        ),
        &["192.0.2.9", "2001:db8::9"],
    );
    c.api.put_node(flannel);
    let agents = [
        c.agent(1, &["--publish-flannel-annotations"]),
        c.agent(2, &["--underlay-family", "ipv6"]),
    ];
    let _logs = ShowLogs(&agents);

    wait_for(
        "nodes 1 and 2 to program each other, both pod families",
        Duration::from_secs(10),
        || {
            c.routes(1, &Topo::subnet(2))
                && c.routes(1, &Topo::subnet6(2))
                && c.routes(2, &Topo::subnet(1))
                && c.routes(2, &Topo::subnet6(1))
        },
    );
    assert!(
        agents[0]
            .log_text()
            .contains("the underlay is IPv6 (from the config's localIp)"),
        "{}",
        agents[0].log_text()
    );
    assert!(
        agents[1]
            .log_text()
            .contains("the underlay is IPv6 (from --underlay-family)"),
        "{}",
        agents[1].log_text()
    );
    for n in 1..=2u8 {
        let text = std::fs::read_to_string(c.peers_file(n)).unwrap();
        for m in 1..=2u8 {
            assert!(
                text.contains(&format!(
                    r#"{{"ip":"2001:db8::{m}","subnets":["10.244.{m}.0/24","fd00:{m}::/64"]}}"#
                )),
                "node {m} by its IPv6 InternalIP: {text}"
            );
        }
        assert!(!text.contains("192.0.2."), "no IPv4 underlay: {text}");
        assert!(
            text.contains(
                r#"{"ip":"2001:db8::99","subnets":["10.244.9.0/24","fd00:9::/64"],"mac":"6e:3c:8a:66:66:66"}"#
            ),
            "the flannel node by public-ipv6 and its flannel-v6 VTEP's MAC: {text}"
        );
        wait_for("node-3 said left out", Duration::from_secs(5), || {
            agents[usize::from(n) - 1]
                .log_text()
                .contains("node node-3 is left out of the peers: has no IPv6 underlay address")
        });
    }
    let fdb = ok(&[
        "ip",
        "netns",
        "exec",
        &c.topo.node_ns(1),
        "bridge",
        "fdb",
        "show",
        "dev",
        "sticky.1",
    ]);
    assert!(fdb.contains("dst 2001:db8::2"), "{fdb}");

    let p1 = c.topo.new_pod(1, "a1");
    let p2 = c.topo.new_pod(2, "a2");
    let r1 = c.topo.add(&p1, &c.confs[0]);
    let r2 = c.topo.add(&p2, &c.confs[1]);
    for (from, to) in [(&p1, &r2), (&p2, &r1)] {
        for v6 in [false, true] {
            let ip = ip_of(to, v6);
            assert!(c.topo.reaches(from, &ip), "{} to {ip}", from.ns);
        }
    }

    // Node 1 published flannel's IPv6 annotations with its kept MAC, the one its VTEP has.
    let kept = ok(&[bin(), "mac", "--local", "2001:db8::1", "--vni", "1"]);
    let kept = kept.trim();
    assert_eq!(c.topo.link_mac(&c.topo.node_ns(1), "sticky.1"), kept);
    wait_for(
        "the flannel annotations on node-1",
        Duration::from_secs(10),
        || {
            c.api.node("node-1").is_some_and(|n| {
                n["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-v6-data"]
                    == format!(r#"{{"VNI":1,"VtepMAC":"{kept}"}}"#)
            })
        },
    );
    let annotations = &c.api.node("node-1").unwrap()["metadata"]["annotations"];
    assert_eq!(
        annotations["flannel.alpha.coreos.com/public-ipv6"],
        "2001:db8::1"
    );
    assert_eq!(annotations["sticky-cni.io/kept-mac"], kept);
    assert!(
        annotations
            .get("flannel.alpha.coreos.com/backend-data")
            .is_none()
            && annotations
                .get("flannel.alpha.coreos.com/public-ip")
                .is_none(),
        "no IPv4 ones: {annotations}"
    );
    assert_eq!(c.api.patches().len(), 1, "patched once, not on every event");
    for a in &agents {
        eprintln!("--- {}\n{}", a.log.display(), a.log_text());
    }
}

/// Prints the agents' logs when the test fails (they go with the temp dir).
struct ShowLogs<'a>(&'a [Agent]);

impl Drop for ShowLogs<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for a in self.0 {
                eprintln!("--- {}\n{}", a.log.display(), a.log_text());
            }
        }
    }
}
