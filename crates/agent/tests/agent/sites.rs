//! Sites (issue 28) in network namespaces (`sticky_testkit::sites_support`): a cloud site and
//! two edge sites behind masquerading routers, joined by an "internet"; an agent on every
//! node, sticky-wg on every gateway, real pods made by the plugin, real packets.

use sticky_testkit::kube_support;
use sticky_testkit::sites_support;
use sticky_testkit::vxlan_support;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use kube_support::*;
use sites_support::*;
use vxlan_support::*;

/// What the topology itself promises, with no sticky-cni daemon running: nodes of a site
/// reach each other, edge nodes reach the API server through their NAT, edge LANs cannot
/// reach each other, and nothing but documentation ranges is configured.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_topology_underlay_and_nat() {
    let s = Sites::new(Nat::Masquerade);
    let pings = |from: &str, to: &str| {
        s.topo
            .in_ns(&s.ns(from), &["ping", "-c", "1", "-W", "2", to])
    };
    for (from, to) in [
        ("c1", "198.51.100.2"),
        ("a1", "192.0.2.2"),
        ("b1", "192.0.2.130"),
    ] {
        assert!(
            first_reply(&s.ns(from), to, Duration::from_secs(60)).is_some(),
            "{from} reaches {to} on its LAN"
        );
    }
    // Edge nodes reach the cloud's public LAN (the API server, the cloud gateway) through
    // their router, which masquerades: the server sees the router's WAN address.
    for (from, wan) in [
        ("a1", "203.0.113.10"),
        ("b2", "203.0.113.20"),
        ("c2", "198.51.100.2"),
    ] {
        let before = s.api.clients().len();
        let got = get_in_netns(
            Path::new(&format!("/run/netns/{}", s.ns(from))),
            &s.api.addr.to_string(),
            "/",
        );
        assert!(
            got.is_some(),
            "{from} connects to the API server at {}",
            s.api.addr
        );
        let clients = s.api.clients();
        let seen: Vec<IpAddr> = clients[before..].iter().map(|c| c.ip()).collect();
        assert_eq!(
            seen,
            vec![wan.parse::<IpAddr>().unwrap()],
            "the source the API server saw from {from}"
        );
        assert!(first_reply(&s.ns(from), "198.51.100.1", Duration::from_secs(60)).is_some());
    }
    // Edge LANs are private: neither reaches the other's nodes or router LAN address, and the
    // cloud reaches no edge node.
    for (from, to) in [
        ("a1", "192.0.2.129"),
        ("a2", "192.0.2.254"),
        ("b1", "192.0.2.1"),
        ("b2", "192.0.2.126"),
        ("c1", "192.0.2.1"),
        ("c2", "192.0.2.129"),
    ] {
        assert!(
            !pings(from, to).status.success(),
            "{from} must not reach {to}"
        );
    }
    // The cut link: a2 is off its LAN until restored.
    s.cut("a2");
    assert!(
        !pings("a1", "192.0.2.2").status.success(),
        "a2's link is cut"
    );
    s.restore("a2");
    assert!(first_reply(&s.ns("a1"), "192.0.2.2", Duration::from_secs(60)).is_some());
    for ns in s.namespaces() {
        for ip in addresses(&ns) {
            assert!(
                documentation_address(&ip),
                "{ip} in {ns} is not a documentation address"
            );
        }
    }
}
