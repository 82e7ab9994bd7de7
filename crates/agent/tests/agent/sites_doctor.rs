//! `sticky-vxlan doctor`'s sites causes (issue 35) in the sites topology
//! (`sticky_testkit::sites_support`, the shipped settings): each fault staged as it happens in
//! the field, first shown on pod traffic where it breaks it, then named by doctor on a1 (site
//! A's active gateway) with exit 1, then the fix doctor prints applied, the traffic back and
//! doctor exiting 0. Everything staged lives in the topology's namespaces, which its drop
//! removes, also when a test fails.

use sticky_testkit::sites_support;
use sticky_testkit::vxlan_support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sites_support::*;
use vxlan_support::*;

/// What `doctor --json` said on node `name`: its exit code and its report (the text output is
/// printed too, for a failing test's output).
fn doctor(s: &Sites, name: &str) -> (i32, Value) {
    let conf = s.conf_files[name].to_str().expect("utf-8 path").to_string();
    let k = site_node(name).k;
    let out = s.topo.tool(k, &["doctor", "--config", &conf, "--json"]);
    let code = out.status.code().unwrap_or(-1);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}), exit {code}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let text = s.topo.tool(k, &["doctor", "--config", &conf]);
    eprintln!(
        "doctor on {name}:\n{}",
        String::from_utf8_lossy(&text.stdout)
    );
    (code, report)
}

/// The findings' (cause, site) pairs.
fn causes(report: &Value) -> Vec<(String, Option<String>)> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let cause = f["cause"].as_str().unwrap_or_default().to_string();
            (cause, f["site"].as_str().map(str::to_string))
        })
        .collect()
}

/// Runs doctor on `name` until it finds exactly `want` (the agent's status follows the fault
/// within its rounds), within `within`; that report, after checking it exited 1 (0 when `want`
/// is empty).
fn doctor_until(s: &Sites, name: &str, want: &[(&str, &str)], within: Duration) -> Value {
    let want: Vec<(String, Option<String>)> = want
        .iter()
        .map(|(c, site)| (c.to_string(), Some(site.to_string())))
        .collect();
    let deadline = Instant::now() + within;
    loop {
        let (code, report) = doctor(s, name);
        if causes(&report) == want {
            assert_eq!(code, if want.is_empty() { 0 } else { 1 }, "{report:#}");
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "doctor on {name} still says {:?} after {within:?}, not {want:?}: {report:#}",
            causes(&report)
        );
    }
}

/// The one finding's `field`.
fn field(report: &Value, field: &str) -> String {
    report["findings"][0][field]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `count` pings of `size` bytes of payload, DF set, from `ns` to `to`, 0.2 s apart: whether any
/// was answered.
fn any_reply(ns: &str, to: &str, size: usize, count: usize) -> bool {
    let (size, count) = (size.to_string(), count.to_string());
    sh(&[
        "ip", "netns", "exec", ns, "ping", "-4", "-n", "-q", "-M", "do", "-s", &size, "-c", &count,
        "-i", "0.2", "-W", "1", to,
    ])
    .status
    .success()
}

/// A healthy sites topology: doctor exits 0 on the gateway and on a member, each remote site
/// `ok`. Then sticky-wg stops on b1 (site B's gateway; its TUN device goes with it): a2's pod
/// no longer reaches b2's, and doctor on a1 names `tunnel-down` for site B (b1 does not answer
/// through the tunnel, while the relay's gateway does) and exits 1. The fix it prints (is
/// sticky-wg running on b1) applied: a2 reaches b2 again, doctor exits 0.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_healthy_then_tunnel_down_and_back() {
    let (mut s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let (a2, _) = pod_of(&pods, "a2");
    let (_, b2_ip) = pod_of(&pods, "b2");
    let healthy = doctor_until(&s, "a1", &[], Duration::from_secs(120));
    let states: Vec<&str> = healthy["sites"]["remotes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["state"].as_str())
        .collect();
    assert_eq!(states, ["ok", "ok"], "{healthy:#}");
    assert_eq!(healthy["sites"]["role"], "active gateway", "{healthy:#}");
    let member = doctor_until(&s, "a2", &[], Duration::from_secs(60));
    assert_eq!(member["sites"]["site"], "site-a", "{member:#}");

    s.stop_wg("b1");
    assert!(
        !any_reply(&a2.ns, b2_ip, 56, 10),
        "a2 still reaches b2 with b1's sticky-wg stopped"
    );
    let report = doctor_until(
        &s,
        "a1",
        &[("tunnel-down", "site-b")],
        Duration::from_secs(120),
    );
    let fix = field(&report, "fix");
    assert!(
        fix.contains("sticky-wg runs on b1") && fix.contains("UDP 51820"),
        "{fix}"
    );

    s.start_wg("b1");
    assert!(
        first_reply(&a2.ns, b2_ip, Duration::from_secs(120)).is_some(),
        "a2 does not reach b2 again within 120 s of b1's sticky-wg start: {:#?}",
        s.logs()
    );
    // A punch tried while b1 was away may be paused (up to 60 s, then a 30 s try).
    doctor_until(&s, "a1", &[], Duration::from_secs(240));
}

/// Router B maps every destination to a new random port (`masquerade random`): a1 and b1
/// cannot punch a direct tunnel, and once the first try has failed a1's path to site B is
/// "relayed via cloud (punch paused: ...)". Traffic still works through the relay, so there is
/// no "traffic breaks" step: doctor names `punch-failing` (exit 1) for the path it takes, with
/// the NAT kind the cloud saw (b1's port changed: a port-changing NAT). The fix it prints
/// applied (router B forwards UDP 51820 to b1 and b1's Node gets that endpoint): the path
/// becomes direct and doctor exits 0.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_punch_failing_behind_a_random_port_nat() {
    let (s, pods) = Sites::running(Nat::RandomOnB, |_| {});
    let (a2, _) = pod_of(&pods, "a2");
    let (_, b2_ip) = pod_of(&pods, "b2");
    // The first try (30 s from the punch's start) must fail before the path says so.
    let report = doctor_until(
        &s,
        "a1",
        &[("punch-failing", "site-b")],
        Duration::from_secs(300),
    );
    let detail = field(&report, "detail");
    assert!(
        detail.contains("b1's NAT maps UDP 51820 to 203.0.113.20:")
            && detail.contains("port-changing NAT"),
        "{detail}"
    );
    assert!(
        field(&report, "fix").contains("forward a UDP port"),
        "{report:#}"
    );
    assert!(
        first_reply(&a2.ns, b2_ip, Duration::from_secs(30)).is_some(),
        "the relay carries a2 -> b2 while the punch fails"
    );

    forward_port_to_b1(&s);
    let mut b1 = s.api.node("b1").expect("b1's Node");
    b1["metadata"]["annotations"][ENDPOINT_ANNOTATION] = json!(format!("203.0.113.20:{WG_PORT}"));
    s.api.put_node(b1);
    doctor_until(&s, "a1", &[], Duration::from_secs(180));
    assert!(
        first_reply(&a2.ns, b2_ip, Duration::from_secs(60)).is_some(),
        "a2 -> b2 once b1 has an endpoint: {:#?}",
        s.logs()
    );
}

/// Router B forwards UDP [`WG_PORT`] on its WAN to b1 (a port forward, as an operator sets one).
fn forward_port_to_b1(s: &Sites) {
    let ns = s.router_ns("site-b");
    let b1 = site_node("b1").ip;
    let script = format!(
        "table ip sticky_test_forward {{\n\
         \x20 chain prerouting {{\n\
         \x20   type nat hook prerouting priority dstnat; policy accept;\n\
         \x20   iifname \"wan\" udp dport {WG_PORT} dnat to {b1}:{WG_PORT}\n\
         \x20 }}\n\
         }}\n"
    );
    s.topo.load_nft(&ns, "forward-b1.nft", &script);
    ok(&[
        "ip",
        "netns",
        "exec",
        &ns,
        "nft",
        "insert",
        "rule",
        "ip",
        "sticky_test_router",
        "forward",
        "ct",
        "status",
        "dnat",
        "accept",
    ]);
}

/// Router B's WAN link carries 1400 bytes while `wanMtu` says 1500: a full-size pod packet
/// (1424, DF) from a2 to b2 is lost while a small one passes. Doctor on a1 names `wan-mtu` for
/// site B with the path MTU it measured (about 1400: its probes are 50 bytes apart) and exits 1. The fix it prints ("or make the WAN
/// path carry 1500 bytes") applied: full-size packets cross again and doctor exits 0.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_wan_mtu_below_wan_mtu_setting() {
    let (s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let (a2, _) = pod_of(&pods, "a2");
    let (_, b2_ip) = pod_of(&pods, "b2");
    // The pod MTU: min(1500 - 50, wanMtu 1500 - 72 to a multiple of 16); the payload, less the
    // IP and ICMP headers.
    let full = 1424 - 28;
    assert!(
        any_reply(&a2.ns, b2_ip, full, 10),
        "full size before the fault"
    );
    let router = s.router_ns("site-b");
    ok(&["ip", "-n", &router, "link", "set", "wan", "mtu", "1400"]);
    assert!(
        !any_reply(&a2.ns, b2_ip, full, 10),
        "a full-size pod packet still crosses a 1400-byte WAN"
    );
    assert!(any_reply(&a2.ns, b2_ip, 56, 10), "small packets pass");
    let report = doctor_until(&s, "a1", &[("wan-mtu", "site-b")], Duration::from_secs(60));
    let fix = field(&report, "fix");
    // The WAN path carries 1400; the probes are 50 bytes apart, so what is measured is at
    // most that and within one step of it.
    let wan_mtu: u32 = fix
        .strip_prefix("set \"wanMtu\": ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no wanMtu in {fix}"));
    assert!(
        (1351..=1400).contains(&wan_mtu) && fix.contains("carry 1500 bytes"),
        "{fix}"
    );

    ok(&["ip", "-n", &router, "link", "set", "wan", "mtu", "1500"]);
    assert!(
        full_size_reply(&a2.ns, b2_ip, full),
        "full size again with the WAN at 1500"
    );
    doctor_until(&s, "a1", &[], Duration::from_secs(60));
}

/// Router B maps each destination to a random port, so a2 <-> b2 is relayed through the cloud
/// gateway c1. sticky-wg stops on c1: a2 no longer reaches b2 (nor c2), and doctor on a1 names
/// `tunnel-down` for the cloud site (c1 does not answer through the tunnel) and
/// `relay-unreachable` for site B (relayed via the cloud, whose gateway answers nothing either),
/// and exits 1. The fix (sticky-wg running on c1) applied: a2 reaches b2 again and doctor names
/// neither; what may remain is `punch-failing` for site B, which is this NAT's, not the relay's.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_relay_unreachable() {
    let (mut s, pods) = Sites::running(Nat::RandomOnB, |_| {});
    let (a2, _) = pod_of(&pods, "a2");
    let (_, b2_ip) = pod_of(&pods, "b2");
    // As in the field, the relay has seen where both edge gateways come from (what it dials
    // when it comes back: docs/sites.md, "What survives the cloud").
    s.wait_relay_observed();
    s.stop_wg("c1");
    assert!(
        !any_reply(&a2.ns, b2_ip, 56, 10),
        "a2 still reaches b2 with the relay's sticky-wg stopped"
    );
    let report = doctor_until(
        &s,
        "a1",
        &[("tunnel-down", "cloud"), ("relay-unreachable", "site-b")],
        Duration::from_secs(120),
    );
    let relay = &report["findings"][1];
    assert!(
        relay["detail"]
            .as_str()
            .is_some_and(|d| d.contains("relayed via cloud")),
        "{report:#}"
    );
    assert!(
        relay["fix"]
            .as_str()
            .is_some_and(|f| f.contains("sticky-wg runs on c1")),
        "{report:#}"
    );

    s.start_wg("c1");
    assert!(
        first_reply(&a2.ns, b2_ip, Duration::from_secs(120)).is_some(),
        "a2 does not reach b2 again within 120 s of c1's sticky-wg start: {:#?}",
        s.logs()
    );
    until_only_punch_failing(&s, Duration::from_secs(120));
}

/// Runs doctor on a1 until its only finding left is site B's `punch-failing` (a relayed path
/// behind router B's port-randomising NAT: whether the 30 s punch try is paused right then
/// decides between that one and none), within `within`; the exit code must say which.
fn until_only_punch_failing(s: &Sites, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (code, report) = doctor(s, "a1");
        let left = causes(&report);
        let punch_only = left
            .iter()
            .all(|(c, site)| c == "punch-failing" && site.as_deref() == Some("site-b"));
        if punch_only {
            assert_eq!(code, i32::from(!left.is_empty()), "{report:#}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "doctor on a1 still says {left:?}: {report:#}"
        );
    }
}

/// Both edge sites behind NAT, router B a port-randomising one (no punch crosses it), and no
/// relay site configured (`sites.relays: []`): site A has no path to site B at all. a2 cannot
/// reach b2; doctor on a1 names `site-unreachable` for site-b (exit 1) and says to name a relay
/// site in `sites.relays`. The fix applied (`relays: ["cloud"]` in every node's config, the
/// agents restarted as a config change is rolled out): a2 reaches b2 through the cloud and the
/// only finding left is the failed punch (`punch-failing`, the relayed path's).
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_site_unreachable_without_a_relay() {
    let mut s = Sites::new(Nat::RandomOnB);
    s.set_sites_setting("relays", json!([]));
    s.start_all();
    let (a2, _) = s.pod("a2", "pa2");
    let (_, b2_ip) = s.pod("b2", "pb2");
    let report = doctor_until(
        &s,
        "a1",
        &[("site-unreachable", "site-b")],
        Duration::from_secs(120),
    );
    assert!(field(&report, "fix").contains("sites.relays"), "{report:#}");
    assert!(
        !any_reply(&a2.ns, &b2_ip, 56, 5),
        "a2 reaches b2 with no path between the sites"
    );

    s.set_sites_setting("relays", json!(["cloud"]));
    for n in &NODES {
        s.start_agent(n.name);
    }
    assert!(
        first_reply(&a2.ns, &b2_ip, Duration::from_secs(120)).is_some(),
        "a2 does not reach b2 within 120 s of the relay named: {:#?}",
        s.logs()
    );
    until_only_punch_failing(&s, Duration::from_secs(120));
}

/// Site B's only gateway's Node object deleted (the node decommissioned, or its kubelet's
/// object removed): site B has no active gateway. a2 no longer reaches b2, and doctor on a1
/// names `site-unreachable` for site B, saying it has no active gateway, with the fix (give
/// the site one). The fix applied (b1's Node object back, labelled): a2 reaches b2 again and
/// doctor on a1 exits 0.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_doctor_a_site_with_no_active_gateway() {
    let (s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let (a2, _) = pod_of(&pods, "a2");
    let (_, b2_ip) = pod_of(&pods, "b2");
    doctor_until(&s, "a1", &[], Duration::from_secs(120));

    s.api.delete_node("b1");
    let report = doctor_until(
        &s,
        "a1",
        &[("site-unreachable", "site-b")],
        Duration::from_secs(120),
    );
    assert!(
        field(&report, "detail").contains("no active gateway"),
        "{report:#}"
    );
    assert!(
        field(&report, "fix").starts_with("give both sites an active gateway"),
        "{report:#}"
    );
    assert!(
        !any_reply(&a2.ns, b2_ip, 56, 5),
        "a2 reaches b2 while site B has no gateway"
    );

    let b1 = NODES.iter().find(|n| n.name == "b1").expect("b1");
    s.api.put_node(node_object(b1));
    assert!(
        first_reply(&a2.ns, b2_ip, Duration::from_secs(120)).is_some(),
        "a2 does not reach b2 within 120 s of b1 back: {:#?}",
        s.logs()
    );
    doctor_until(&s, "a1", &[], Duration::from_secs(120));
}
