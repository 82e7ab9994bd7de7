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
        underlay: "192.0.2.1".parse().unwrap(),
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
            "conntrack full: the probes die with every other new flow, no blame on the peer",
            |n| n.conntrack = Some((100, 100)),
            (false, false, false),
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

/// VXLAN over IPv6 adds 70 bytes, not 50, and its bad checksums are counted apart.
#[test]
fn on_an_ipv6_underlay_the_fixes_count_its_overhead_and_its_counter() {
    let mut n = node();
    n.underlay = "2001:db8::1".parse().unwrap();
    n.pod_mtu = 1430;
    let mut six = peer(true, true, false);
    six.peer = "2001:db8::2".parse().unwrap();
    six.largest = Some(1330);
    let f = &decide(&n, &[six.clone()])[0];
    assert!(f.fix.ends_with("carry 1500 bytes"), "{f:?}");
    n.csum_errors = 2;
    six.small = false;
    let f = &decide(&n, &[six])[0];
    assert_eq!(f.cause, Cause::Checksum);
    assert!(f.detail.ends_with("(Udp6InCsumErrors)"), "{f:?}");
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

/// The sites facts of gateway a1 (site-a) with one remote site, site-b, `path`, carried by
/// `tunnel`, probed with `probe`.
fn sites(
    path: &str,
    tunnel: Option<(bool, Option<u64>)>,
    probe: Option<(bool, bool)>,
) -> sites::SitesFacts {
    sites::SitesFacts {
        site: "site-a".into(),
        role: "active gateway".into(),
        gateway: true,
        interface: "stickywg0".into(),
        listen_port: 51820,
        wan_mtu: 1500,
        overhead: 72,
        config: "/etc/cni/net.d/10-edge.conflist".into(),
        remotes: vec![sites::RemoteFacts {
            site: "site-b".into(),
            gateway: Some("b1".into()),
            path: path.into(),
            tunnel: tunnel.map(|(up, age)| sites::TunnelFacts {
                peer: if path.starts_with("relayed") {
                    "c1"
                } else {
                    "b1"
                }
                .into(),
                up,
                handshake_age: age,
            }),
            probe: probe.map(|(small, full)| sites::WanProbe {
                target: Ipv4Addr::new(198, 18, 21, 0),
                small,
                full,
                largest: None,
            }),
            nat: vec![],
        }],
    }
}

fn site_causes(s: &sites::SitesFacts) -> Vec<(&'static str, Option<String>)> {
    sites::decide(s)
        .into_iter()
        .map(|f| (f.cause.code(), f.site))
        .collect()
}

const B: Option<&str> = Some("site-b");

/// One row per sites rule: the remote's path, its tunnel (up, handshake age), its probes
/// (small, full), the causes.
#[test]
fn each_sites_fact_names_its_cause() {
    type Tunnel = Option<(bool, Option<u64>)>;
    type Probes = Option<(bool, bool)>;
    type Want = &'static [(&'static str, Option<&'static str>)];
    let up: Tunnel = Some((true, Some(5)));
    let ok: Probes = Some((true, true));
    let rows: &[(&str, &str, Tunnel, Probes, Want)] = &[
        ("healthy direct", "direct", up, ok, &[]),
        ("healthy punched", "direct (punched)", up, ok, &[]),
        (
            "relayed, punching",
            "relayed via cloud (punching)",
            up,
            ok,
            &[],
        ),
        ("a member sees no tunnel", "direct", None, ok, &[]),
        ("not probed, tunnel up", "direct", up, None, &[]),
        (
            "no path",
            "unreachable: site site-b has no active gateway",
            None,
            None,
            &[("site-unreachable", B)],
        ),
        (
            "tunnel down by status",
            "direct",
            Some((false, Some(400))),
            ok,
            &[("tunnel-down", B)],
        ),
        (
            "tunnel never up",
            "direct (punched)",
            Some((false, None)),
            None,
            &[("tunnel-down", B)],
        ),
        (
            "up by status, nothing crosses",
            "direct",
            up,
            Some((false, false)),
            &[("tunnel-down", B)],
        ),
        (
            "punching with no relay, nothing crosses",
            "punching",
            Some((false, None)),
            Some((false, false)),
            &[("site-unreachable", B)],
        ),
        (
            "punching with no relay, the punch crossed",
            "punching",
            up,
            ok,
            &[],
        ),
        (
            "relay tunnel down by status",
            "relayed via cloud",
            Some((false, Some(200))),
            ok,
            &[("relay-unreachable", B)],
        ),
        (
            "relay answers, the far leg does not",
            "relayed via cloud",
            up,
            Some((false, false)),
            &[("tunnel-down", B)],
        ),
        (
            "full size lost",
            "direct (punched)",
            up,
            Some((true, false)),
            &[("wan-mtu", B)],
        ),
        (
            "full size lost while punch paused: the MTU first",
            "relayed via cloud (punch paused: next try in 60 s)",
            up,
            Some((true, false)),
            &[("wan-mtu", B)],
        ),
        (
            "punch paused, relay carries",
            "relayed via cloud (punch paused: next try in 60 s)",
            up,
            ok,
            &[("punch-failing", B)],
        ),
        (
            "punch paused, seen from a member",
            "relayed via cloud (punch paused: next try in 120 s)",
            None,
            ok,
            &[("punch-failing", B)],
        ),
    ];
    for (name, path, tunnel, probe, want) in rows {
        let want: Vec<(&str, Option<String>)> = want
            .iter()
            .map(|(c, s)| (*c, s.map(str::to_string)))
            .collect();
        assert_eq!(site_causes(&sites(path, *tunnel, *probe)), want, "{name}");
    }
}

/// Relayed, with nothing crossing to the relay's own gateway either: the relay is named.
#[test]
fn a_relay_that_answers_nothing_is_named_before_the_site() {
    let mut s = sites(
        "relayed via cloud",
        Some((true, Some(5))),
        Some((false, false)),
    );
    let mut cloud = s.remotes[0].clone();
    cloud.site = "cloud".into();
    cloud.gateway = Some("c1".into());
    cloud.path = "direct".into();
    cloud.tunnel = None;
    s.remotes.push(cloud);
    assert_eq!(
        site_causes(&s),
        [
            ("relay-unreachable", Some("site-b".into())),
            ("tunnel-down", Some("cloud".into())),
        ]
    );
    let f = &sites::decide(&s)[0];
    assert!(f.detail.contains("relayed via cloud"), "{f:?}");
    assert!(f.fix.contains("sticky-wg runs on c1"), "{f:?}");
}

#[test]
fn sites_fixes_name_the_age_the_port_the_path_mtu_and_the_nat_kind() {
    let f = &sites::decide(&sites("direct", Some((false, Some(400))), None))[0];
    assert!(f.detail.contains("last handshake 400 s ago"), "{f:?}");
    assert!(
        f.fix.contains("UDP 51820") && f.fix.contains("wg show stickywg0"),
        "{f:?}"
    );
    let mut s = sites("direct", Some((true, Some(3))), Some((true, false)));
    if let Some(p) = s.remotes[0].probe.as_mut() {
        p.largest = Some(1340);
    }
    let f = &sites::decide(&s)[0];
    assert!(
        f.detail.contains("1424") && f.detail.contains("1340"),
        "{f:?}"
    );
    assert!(f.fix.starts_with("set \"wanMtu\": 1400 in "), "{f:?}");
    let paused = "relayed via cloud (punch paused: next try in 60 s)";
    let f = &sites::decide(&sites(paused, None, None))[0];
    assert!(f.detail.contains("symmetric) NAT likely"), "{f:?}");
    assert!(f.fix.contains("forward a UDP port"), "{f:?}");
    let mut s = sites(paused, None, None);
    s.remotes[0].nat = vec![
        sites::Mapped {
            gateway: "a1".into(),
            seen: "203.0.113.10:51820".parse().unwrap(),
        },
        sites::Mapped {
            gateway: "b1".into(),
            seen: "203.0.113.20:40123".parse().unwrap(),
        },
    ];
    let f = &sites::decide(&s)[0];
    assert!(
        f.detail
            .contains("b1's NAT maps UDP 51820 to 203.0.113.20:40123: a port-changing NAT"),
        "{f:?}"
    );
    s.remotes[0].nat.truncate(1);
    let f = &sites::decide(&s)[0];
    assert!(f.detail.contains("port-preserving NAT seen"), "{f:?}");
}

#[test]
fn sites_codes_serialize_as_printed_and_findings_name_the_site() {
    for c in [
        Cause::TunnelDown,
        Cause::WanMtu,
        Cause::RelayUnreachable,
        Cause::PunchFailing,
        Cause::SiteUnreachable,
    ] {
        assert_eq!(serde_json::to_value(c).unwrap(), c.code());
    }
    let f = &sites::decide(&sites("direct", Some((false, None)), None))[0];
    let v = serde_json::to_value(f).unwrap();
    assert_eq!(
        (v["site"].as_str(), &v["peer"]),
        (Some("site-b"), &serde_json::Value::Null)
    );
    let node = serde_json::to_value(&decide(&node(), &[peer(true, false, false)])[0]).unwrap();
    assert!(node.get("site").is_none(), "{node}");
}
