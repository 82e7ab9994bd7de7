//! The decision rules, a row each: facts in, causes out.

use super::*;

fn node() -> NodeFacts {
    NodeFacts {
        vtep_name: "sticky.1".into(),
        vtep: Vtep::Ready,
        bridge_name: "cni0".into(),
        bridge: Bridge::Ready,
        ip_forward: Some(true),
        forward_drop: vec![],
        strict_rp_filter: vec![],
        underlay_dev: "eth0".into(),
        conntrack: Some((10, 262144)),
        csum_errors: 0,
        rp_filter_drops: 0,
        port: 8472,
        pod_mtu: 1450,
        config: "/etc/cni/net.d/10-edge.conflist".into(),
        pod_subnet: "10.244.1.0/24".parse().ok(),
        cluster: "10.244.0.0/16".into(),
    }
}

fn peer(underlay: bool, small: bool, full: bool) -> PeerFacts {
    PeerFacts {
        peer: "192.0.2.2".parse().unwrap(),
        underlay,
        small,
        full,
        largest: None,
        route_dev: Some("eth0".into()),
    }
}

fn causes(node: &NodeFacts, peers: &[PeerFacts]) -> Vec<(&'static str, Option<String>)> {
    decide(node, peers)
        .into_iter()
        .map(|f| (f.cause.code(), f.peer.map(|p| p.to_string())))
        .collect()
}

const P: Option<&str> = Some("192.0.2.2");

fn chain(accepted: Vec<Vec<u8>>) -> DropChain {
    DropChain {
        family: "inet".into(),
        table: "fw".into(),
        chain: "forward".into(),
        accepted,
    }
}

/// One row per rule: the node's facts changed by `edit`, one peer's probes, the causes.
#[test]
fn each_fact_names_its_cause() {
    type Edit = fn(&mut NodeFacts);
    type Probes = (bool, bool, bool);
    type Want = &'static [(&'static str, Option<&'static str>)];
    let rows: &[(&str, Edit, Probes, Want)] = &[
        ("healthy", |_| {}, (true, true, true), &[]),
        (
            "underlay ICMP filtered, overlay fine",
            |_| {},
            (false, true, true),
            &[],
        ),
        (
            "port blocked",
            |_| {},
            (true, false, false),
            &[("vxlan-blocked", P)],
        ),
        ("pod MTU lost", |_| {}, (true, true, false), &[("mtu", P)]),
        (
            "peer gone",
            |_| {},
            (false, false, false),
            &[("peer-down", P)],
        ),
        (
            "bad checksums",
            |n| n.csum_errors = 3,
            (true, false, false),
            &[("checksum", P)],
        ),
        (
            "rp_filter drops, strict",
            |n| {
                n.rp_filter_drops = 2;
                n.strict_rp_filter = vec!["eth0".into()]
            },
            (false, false, false),
            &[("rp-filter", P)],
        ),
        (
            "rp_filter drops, loose only",
            |n| n.rp_filter_drops = 2,
            (false, false, false),
            &[("peer-down", P)],
        ),
        (
            "strict but nothing dropped",
            |n| n.strict_rp_filter = vec!["eth0".into()],
            (true, false, false),
            &[("vxlan-blocked", P)],
        ),
        (
            "forwarding off",
            |n| n.ip_forward = Some(false),
            (true, true, true),
            &[("forwarding-off", None)],
        ),
        (
            "forwarding unknown",
            |n| n.ip_forward = None,
            (true, true, true),
            &[],
        ),
        (
            "drop policy",
            |n| n.forward_drop = vec![chain(vec![])],
            (true, true, true),
            &[("forward-drop", None)],
        ),
        (
            "drop policy, other hosts and devices accepted",
            |n| n.forward_drop = vec![chain(vec![vec![10, 245, 0, 0], b"eth0\0".to_vec()])],
            (true, true, true),
            &[("forward-drop", None)],
        ),
        (
            "drop policy, the cluster accepted",
            |n| n.forward_drop = vec![chain(vec![vec![10, 244, 0, 0]])],
            (true, true, true),
            &[],
        ),
        (
            "drop policy, the subnet accepted",
            |n| n.forward_drop = vec![chain(vec![vec![10, 244, 1, 0]])],
            (true, true, true),
            &[],
        ),
        (
            "drop policy, the bridge accepted",
            |n| n.forward_drop = vec![chain(vec![b"cni0\0\0".to_vec()])],
            (true, true, true),
            &[],
        ),
        (
            "drop policy, a wildcard of the VTEP accepted",
            |n| n.forward_drop = vec![chain(vec![b"sticky".to_vec()])],
            (true, true, true),
            &[],
        ),
        (
            "conntrack 98 %",
            |n| n.conntrack = Some((98, 100)),
            (true, true, true),
            &[("conntrack-full", None)],
        ),
        (
            "conntrack 97 %",
            |n| n.conntrack = Some((97, 100)),
            (true, true, true),
            &[],
        ),
        (
            "no VTEP: no blame on the peer",
            |n| n.vtep = Vtep::Missing,
            (true, false, false),
            &[("no-vtep", None)],
        ),
        (
            "VTEP down and peer gone",
            |n| n.vtep = Vtep::Down,
            (false, false, false),
            &[("no-vtep", None), ("peer-down", P)],
        ),
        (
            "VTEP not ours",
            |n| n.vtep = Vtep::NotOurs,
            (true, true, true),
            &[("no-vtep", None)],
        ),
        (
            "bridge without address",
            |n| {
                n.bridge = Bridge::NoAddress {
                    subnet: "10.244.1.0/24".into(),
                }
            },
            (true, true, true),
            &[("bridge-address", None)],
        ),
        (
            "bridge missing",
            |n| n.bridge = Bridge::Missing,
            (true, true, true),
            &[("bridge-address", None)],
        ),
    ];
    for (name, edit, (u, s, f), want) in rows {
        let mut n = node();
        edit(&mut n);
        let want: Vec<(&str, Option<String>)> = want
            .iter()
            .map(|(c, p)| (*c, p.map(str::to_string)))
            .collect();
        assert_eq!(causes(&n, &[peer(*u, *s, *f)]), want, "{name}");
    }
}

/// Packets of a peer whose route leaves by another device fail strict rp_filter, ARP too:
/// no drop need be counted.
#[test]
fn an_asymmetric_route_with_strict_rp_filter_is_named_without_a_counted_drop() {
    let mut n = node();
    let mut asymmetric = peer(false, false, false);
    asymmetric.route_dev = Some("eth1".into());
    assert_eq!(
        causes(&n, &[asymmetric.clone()]),
        [("peer-down", P.map(str::to_string))]
    );
    n.strict_rp_filter = vec!["eth0".into(), "sticky.1".into()];
    let f = &decide(&n, &[asymmetric])[0];
    assert_eq!(f.cause, Cause::RpFilter);
    assert!(
        f.detail
            .contains("leaves by eth1 while its packets come in on eth0"),
        "{f:?}"
    );
    assert!(
        f.fix.ends_with("net/ipv4/conf/sticky.1/rp_filter=2"),
        "{f:?}"
    );
    n.strict_rp_filter = vec!["sticky.1".into()];
    let mut other = peer(false, false, false);
    other.route_dev = Some("eth1".into());
    assert_eq!(
        causes(&n, &[other]),
        [("peer-down", P.map(str::to_string))],
        "eth0 loose"
    );
}

#[test]
fn fixes_name_the_port_the_mtu_the_config_and_the_sysctls() {
    let mut n = node();
    n.port = 4789;
    let f = &decide(&n, &[peer(true, false, false)])[0];
    assert!(
        f.fix.contains("UDP 4789") && f.fix.contains("192.0.2.2"),
        "{f:?}"
    );
    let mut small_only = peer(true, true, false);
    small_only.largest = Some(1350);
    let f = &decide(&n, &[small_only])[0];
    assert!(f.detail.contains("1450") && f.fix.contains("1500"), "{f:?}");
    assert!(f.fix.starts_with("set \"mtu\": 1350 in "), "{f:?}");
    assert!(f.fix.contains("/etc/cni/net.d/10-edge.conflist"), "{f:?}");
    n.rp_filter_drops = 1;
    n.strict_rp_filter = vec!["eth0".into()];
    let f = &decide(&n, &[peer(false, false, false)])[0];
    assert_eq!(
        f.fix,
        "sysctl -w net/ipv4/conf/all/rp_filter=2 net/ipv4/conf/eth0/rp_filter=2"
    );
}

#[test]
fn node_findings_come_first_and_each_peer_has_its_own() {
    let mut n = node();
    n.ip_forward = Some(false);
    let mut other = peer(true, true, false);
    other.peer = "192.0.2.3".parse().unwrap();
    let got = causes(
        &n,
        &[peer(true, false, false), peer(true, true, true), other],
    );
    assert_eq!(
        got,
        [
            ("forwarding-off", None),
            ("vxlan-blocked", P.map(str::to_string)),
            ("mtu", Some("192.0.2.3".into())),
        ]
    );
}

#[test]
fn codes_serialize_as_printed() {
    for c in [
        Cause::VxlanBlocked,
        Cause::ConntrackFull,
        Cause::NoVtep,
        Cause::Mtu,
    ] {
        assert_eq!(serde_json::to_value(c).unwrap(), c.code());
    }
}
