//! `sticky-vxlan doctor` on two nodes programmed by the plugin, each fault staged as it happens
//! in the field. Every test shows first that pod traffic breaks (real packets between pod
//! namespaces), then that doctor on node 1 names exactly that cause and exits 1, then that the
//! fix it prints restores the traffic and doctor exits 0. Everything staged lives in the
//! topology's namespaces, which [`Topo`]'s drop removes (rules, sysctls and links with them).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sticky_testkit::vxlan_support::*;

/// Node 1 and 2, one pod on each (`a`, `b`): node 1's config, `a`, and `b`'s address.
struct Pair {
    topo: Topo,
    conf1: Value,
    a: Pod,
    ip_b: String,
}

fn pair() -> Pair {
    let (topo, peers) = two_nodes(false);
    pair_on(topo, peers)
}

/// [`pair`], on an IPv4 underlay or an IPv6-only one (`2001:db8::<n>`; the pods stay IPv4).
fn pair_over(ipv6: bool) -> Pair {
    if !ipv6 {
        return pair();
    }
    assert_can_run();
    let mut topo = Topo::new_ipv6(1500);
    topo.add_node(1, 1500);
    topo.add_node(2, 1500);
    let peers = json!([topo.peer_of(1, false), topo.peer_of(2, false)]);
    pair_on(topo, peers)
}

/// UDP 8472 dropped on the way in (a host firewall), for `load_nft`.
const BLOCK_VXLAN: &str = "table inet doctor {\n chain input {\n type filter hook input priority 0;\n udp dport 8472 drop\n }\n}\n";

/// Deletes the nftables table `table` ("<family> <name>") a test loaded in node `n`.
fn delete_table(topo: &Topo, n: u8, table: &str) {
    let ns = topo.node_ns(n);
    let mut args = vec!["ip", "netns", "exec", &ns, "nft", "delete", "table"];
    args.extend(table.split_whitespace());
    ok(&args);
}

/// The underlays each test of a fault runs over, and node 2's address on it.
const UNDERLAYS: [(bool, &str); 2] = [(false, "192.0.2.2"), (true, "2001:db8::2")];

fn pair_on(mut topo: Topo, peers: Value) -> Pair {
    let conf1 = topo.conf(1, json!({"peers": peers}));
    let conf2 = topo.conf(2, json!({"peers": peers}));
    let (a, ip_b) = topo.pods_a_and_b(&conf1, &conf2);
    assert!(
        topo.reaches_within(&a, &ip_b),
        "the pair works before the fault"
    );
    Pair {
        topo,
        conf1,
        a,
        ip_b,
    }
}

/// What `doctor --json` said on node `n` with `conf`: its exit code and its report.
fn doctor(topo: &Topo, n: u8, conf: &Value) -> (i32, Value) {
    let file = topo.dir.path().join(format!("doctor-{n}.conflist"));
    std::fs::write(&file, conf.to_string()).expect("write the config");
    let path = file.to_str().expect("utf-8 path");
    let out = topo.tool(n, &["doctor", "--config", path, "--json"]);
    let code = out.status.code().unwrap_or(-1);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}), exit {code}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, report)
}

/// Doctor on node 1 finds exactly `cause` (about `peer`, or the node) and exits 1; the fix.
fn names(p: &Pair, cause: &str, peer: Option<&str>) -> String {
    let (code, report) = doctor(&p.topo, 1, &p.conf1);
    let findings = report["findings"].as_array().cloned().unwrap_or_default();
    let got: Vec<(&str, Option<&str>)> = findings
        .iter()
        .map(|f| (f["cause"].as_str().unwrap_or(""), f["peer"].as_str()))
        .collect();
    // What people read, shown with a failing test's output (and quoted in the README).
    let file = p.topo.dir.path().join("doctor-1.conflist");
    let text = p.topo.tool(
        1,
        &["doctor", "--config", file.to_str().unwrap_or_default()],
    );
    eprintln!("{}", String::from_utf8_lossy(&text.stdout));
    assert_eq!(got, [(cause, peer)], "{report:#}");
    assert_eq!(code, 1, "{report:#}");
    findings[0]["fix"].as_str().unwrap_or_default().to_string()
}

/// Pod traffic crosses again (within a deadline) and doctor on node 1 finds nothing.
fn healed(p: &Pair) {
    assert!(
        p.topo.reaches_within(&p.a, &p.ip_b),
        "the fix restores pod traffic"
    );
    let (code, report) = doctor(&p.topo, 1, &p.conf1);
    assert_eq!(report["findings"], json!([]), "{report:#}");
    assert_eq!(code, 0, "{report:#}");
}

/// The part of a fix before its first `;` or ` (`: a command to run as printed.
fn command_of(fix: &str) -> &str {
    let end = [fix.find(';'), fix.find(" (")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(fix.len());
    &fix[..end]
}

/// Runs a fix's command as printed, in node `n`.
fn apply(topo: &Topo, n: u8, fix: &str) {
    let out = topo.in_ns(&topo.node_ns(n), &["sh", "-c", command_of(fix)]);
    succeeded(&out, &format!("the fix {fix:?}"));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_finds_nothing_on_a_healthy_pair_and_says_each_peer_is_ok() {
    for (ipv6, peer) in UNDERLAYS {
        let p = pair_over(ipv6);
        let (code, report) = doctor(&p.topo, 1, &p.conf1);
        assert_eq!(
            (code, &report["findings"], &report["peers"]),
            (0, &json!([]), &json!([{"peer": peer, "state": "ok"}])),
            "{report:#}"
        );
        let file = p.topo.dir.path().join("doctor-1.conflist");
        let out = p
            .topo
            .tool(1, &["doctor", "--config", file.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("{text}");
        assert!(text.contains(&format!("\npeer {peer}: ok\n")), "{text}");
        assert!(text.ends_with("no cause found\n"), "{text}");
    }
}

/// On an IPv6 underlay too: the underlay answers (ICMPv6), the VXLAN port does not.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_blocked_vxlan_port() {
    for (ipv6, peer) in UNDERLAYS {
        let p = pair_over(ipv6);
        p.topo.load_nft(&p.topo.node_ns(2), "doctor", BLOCK_VXLAN);
        assert!(
            !p.topo.reaches(&p.a, &p.ip_b),
            "the blocked port breaks pod traffic"
        );
        let fix = names(&p, "vxlan-blocked", Some(peer));
        assert!(fix.contains("allow UDP 8472"), "{fix}");
        delete_table(&p.topo, 2, "inet doctor");
        healed(&p);
    }
}

/// Node 2's cable pulled: its port on the underlay's switch goes down (its own link stays up,
/// so an IPv6 underlay keeps its address).
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_peer_whose_underlay_is_down() {
    for (ipv6, peer) in UNDERLAYS {
        let p = pair_over(ipv6);
        let port = |state| ok(&["ip", "-n", &p.topo.underlay, "link", "set", "n2", state]);
        port("down");
        assert!(!p.topo.reaches(&p.a, &p.ip_b));
        let fix = names(&p, "peer-down", Some(peer));
        assert!(fix.contains(&format!("check that {peer} is up")), "{fix}");
        port("up");
        healed(&p);
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_forward_chain_that_drops() {
    let p = pair();
    p.topo.load_nft(
        &p.topo.node_ns(1),
        "doctor",
        "table inet doctor {\n chain forward {\n type filter hook forward priority 0; policy drop;\n }\n}\n",
    );
    assert!(
        !p.topo.reaches(&p.a, &p.ip_b),
        "node 1 forwards no pod traffic"
    );
    let fix = names(&p, "forward-drop", None);
    assert!(
        fix.starts_with("nft insert rule inet doctor forward ip saddr 10.244.0.0/22 accept; "),
        "{fix}"
    );
    // Both rules, run as printed (the chain keeps its drop policy for everything else).
    let rules = &fix[..fix.find(" (").unwrap_or(fix.len())];
    let out = p.topo.in_ns(&p.topo.node_ns(1), &["sh", "-c", rules]);
    succeeded(&out, rules);
    healed(&p);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_forwarding_turned_off() {
    let p = pair();
    p.topo.in_ns(
        &p.topo.node_ns(1),
        &["sysctl", "-qw", "net.ipv4.ip_forward=0"],
    );
    assert!(!p.topo.reaches(&p.a, &p.ip_b));
    let fix = names(&p, "forwarding-off", None);
    apply(&p.topo, 1, &fix);
    healed(&p);
}

/// A multi-homed node 1: a second link straight to node 2 and a host route over it, so its
/// packets to node 2 leave by `eth1` while node 2's come back on `eth0`. Strict reverse-path
/// filtering on node 1 drops every packet from node 2; loose lets them in.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_strict_rp_filter_on_an_asymmetric_underlay() {
    let p = pair();
    let (n1, n2) = (p.topo.node_ns(1), p.topo.node_ns(2));
    ok(&[
        "ip", "-n", &n1, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns",
        &n2,
    ]);
    p.topo.ip(1, &["link", "set", "eth1", "up"]);
    p.topo.ip(2, &["link", "set", "eth1", "up"]);
    p.topo.ip(
        1,
        &[
            "route",
            "add",
            "192.0.2.2/32",
            "dev",
            "eth1",
            "src",
            "192.0.2.1",
        ],
    );
    for key in ["all", "eth0"] {
        let set = format!("net.ipv4.conf.{key}.rp_filter=1");
        ok(&["ip", "netns", "exec", &n1, "sysctl", "-qw", &set]);
    }
    assert!(
        !p.topo.reaches(&p.a, &p.ip_b),
        "strict rp_filter breaks pod traffic"
    );
    let fix = names(&p, "rp-filter", Some("192.0.2.2"));
    assert!(fix.contains("net/ipv4/conf/eth0/rp_filter=2"), "{fix}");
    apply(&p.topo, 1, &fix);
    healed(&p);
}

/// A path that silently drops packets above 1400 bytes (a link or middlebox that cannot carry
/// more and sends no "fragmentation needed": cilium#47176), staged in the underlay's bridge.
/// Both nodes' underlays say 1500, so their pods take 1450 and full-size pod packets vanish,
/// while small ones cross. (Two underlays of 1400 and 1500 bytes make no black hole between
/// network namespaces: a veth delivers frames above its MTU, and node 2 answers a pod packet
/// above its own pods' MTU with "fragmentation needed", which is path MTU discovery working.)
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_an_mtu_black_hole_and_the_mtu_that_crosses() {
    for (ipv6, peer) in UNDERLAYS {
        mtu_black_hole_over(ipv6, peer);
    }
}

/// The same 1400-byte hole on either underlay: VXLAN over IPv4 adds 50 bytes, so pods of 1450
/// lose full-size packets and 1350 crosses; over IPv6 it adds 70, so pods of 1430 lose theirs
/// and 1330 crosses (the ladder's steps are 50 bytes from the pod MTU).
fn mtu_black_hole_over(ipv6: bool, peer: &str) {
    let mut p = pair_over(ipv6);
    // `ip6 length` is the payload's, without the 40-byte header.
    let drop = if ipv6 {
        "ip6 length > 1360 drop"
    } else {
        "ip length > 1400 drop"
    };
    p.topo.load_nft(
        &p.topo.underlay,
        "blackhole",
        &format!(
            "table bridge blackhole {{\n chain forward {{\n type filter hook forward priority 0;\n {drop}\n }}\n}}\n"
        ),
    );
    let full = |p: &Pair, a: &Pod, payload: u32| {
        p.topo
            .in_ns(
                &a.ns,
                &[
                    "ping",
                    "-c",
                    "2",
                    "-W",
                    "2",
                    "-M",
                    "do",
                    "-s",
                    &payload.to_string(),
                    &p.ip_b,
                ],
            )
            .status
            .success()
    };
    let (pod_mtu, crosses) = if ipv6 { (1430, 1330) } else { (1450, 1350) };
    // 28: the pod packet's IPv4 and ICMP headers.
    assert!(
        !full(&p, &p.a, pod_mtu - 28),
        "full-size pod packets are lost"
    );
    assert!(
        full(&p, &p.a, crosses - 28),
        "{crosses}-byte pod packets cross"
    );
    let fix = names(&p, "mtu", Some(peer));
    assert!(
        fix.starts_with(&format!("set \"mtu\": {crosses} in ")),
        "{fix}"
    );
    // The fix: that MTU on every node, reconciled, and node 1's pod made again.
    p.conf1["mtu"] = json!(crosses);
    p.topo.reconciled(1, &p.conf1);
    let conf2 = p
        .topo
        .conf(2, json!({"peers": p.conf1["peers"], "mtu": crosses}));
    p.topo.reconciled(2, &conf2);
    let old = std::mem::replace(&mut p.a, p.topo.new_pod(1, "a2"));
    succeeded(
        &p.topo.del(&old, &old.path(), &p.conf1),
        "DEL of the old pod",
    );
    p.topo.add(&p.a, &p.conf1);
    healed(&p);
    assert!(
        full(&p, &p.a, crosses - 28),
        "full-size packets of the new MTU cross"
    );
}

/// 100 peers, 99 of which never answer: doctor still ends within 10 s (every probe of every
/// peer goes out at once), and names each silent one.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_probes_a_hundred_peers_within_ten_seconds() {
    let (topo, mut peers) = two_nodes(false);
    let list = peers.as_array_mut().expect("peer list");
    for i in 0..98u8 {
        let ip = format!("192.0.2.{}", 10 + i);
        list.push(json!({"ip": ip, "subnets": [format!("10.245.{i}.0/24")]}));
    }
    let p = pair_on(topo, peers);
    let started = Instant::now();
    let (code, report) = doctor(&p.topo, 1, &p.conf1);
    let took = started.elapsed();
    eprintln!("doctor with 99 peers took {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(code, 1);
    let states = report["peers"].as_array().cloned().unwrap_or_default();
    assert_eq!(states.len(), 99);
    assert_eq!(states[0], json!({"peer": "192.0.2.2", "state": "ok"}));
    assert!(
        states[1..].iter().all(|s| s["state"] == "peer-down"),
        "{report:#}"
    );
}

/// VXLAN packets that reach node 1 with a bad outer UDP checksum (checksum offload off on
/// every wire, so the receiver verifies in software; the checksum rewritten at node 1's
/// ingress) are dropped by its kernel, which counts `Udp InCsumErrors`. The offload bug itself
/// cannot be staged between namespaces (a veth computes nothing), so the fix shown to heal is
/// the removal of what broke the checksums, not the `ethtool` line doctor prints.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_vxlan_packets_dropped_for_bad_checksums() {
    for (ipv6, peer) in UNDERLAYS {
        bad_checksums_over(ipv6, peer);
    }
}

fn bad_checksums_over(ipv6: bool, peer: &str) {
    let p = pair_over(ipv6);
    for (ns, dev) in [
        (p.topo.node_ns(1), "eth0"),
        (p.topo.node_ns(2), "eth0"),
        (p.topo.underlay.clone(), "n1"),
        (p.topo.underlay.clone(), "n2"),
    ] {
        ok(&[
            "ip", "netns", "exec", &ns, "ethtool", "-K", dev, "tx", "off", "rx", "off",
        ]);
    }
    p.topo.load_nft(
        &p.topo.node_ns(1),
        "csum",
        "table netdev csum {\n chain in {\n type filter hook ingress device eth0 priority 0;\n udp dport 8472 udp checksum set 0x1234\n }\n}\n",
    );
    assert!(
        !p.topo.reaches(&p.a, &p.ip_b),
        "bad checksums break pod traffic"
    );
    let fix = names(&p, "checksum", Some(peer));
    assert!(fix.contains("ethtool -K"), "{fix}");
    delete_table(&p.topo, 1, "netdev csum");
    healed(&p);
}

/// Node 1's VTEP deleted by hand: its pods reach no other node, doctor names the node (and
/// blames no peer), and the `reconcile` it prints brings the VTEP back.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_missing_vtep_and_its_reconcile_heals_it() {
    let p = pair();
    p.topo.ip(1, &["link", "del", "sticky.1"]);
    assert!(!p.topo.reaches(&p.a, &p.ip_b));
    let fix = names(&p, "no-vtep", None);
    assert!(fix.starts_with("sticky-vxlan reconcile --config "), "{fix}");
    // Run as printed (the tool is the test's build, run in node 1).
    let args: Vec<&str> = fix.split_whitespace().skip(1).collect();
    succeeded(&p.topo.tool(1, &args), &fix);
    healed(&p);
}

/// The bridge's gateway address removed by hand: node 1's pods have no gateway, doctor names
/// the bridge, and the `reconcile` it prints puts the address back.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_bridge_without_its_address() {
    let p = pair();
    p.topo.ip(1, &["addr", "flush", "dev", "stickybr0"]);
    assert!(!p.topo.reaches(&p.a, &p.ip_b));
    let fix = names(&p, "bridge-address", None);
    let reconcile = command_of(&fix);
    let args: Vec<&str> = reconcile.split_whitespace().skip(1).collect();
    succeeded(&p.topo.tool(1, &args), reconcile);
    healed(&p);
}

/// Node 1's conntrack table full, as on a node flooded with flows: a stateful rule makes its
/// forwarded traffic tracked (any firewall or masquerade does), and the table is filled to the
/// machine's maximum with established flows the kernel cannot evict
/// ([`sticky_testkit::conntrack`]). Every new flow is dropped, doctor's own probes too: it
/// names the node and blames no peer. `nf_conntrack_max` is read-only in a namespace, so the
/// printed `sysctl` cannot be run here; the table emptied (`conntrack -F`) heals instead.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_names_a_full_conntrack_table_and_blames_no_peer() {
    let p = pair();
    let node1 = p.topo.node_ns(1);
    p.topo.load_nft(
        &node1,
        "stateful",
        "table inet stateful {\n chain forward {\n type filter hook forward priority 0;\n ct state invalid drop\n }\n}\n",
    );
    let netns = std::path::Path::new("/run/netns").join(&node1);
    let (added, refused) = sticky_testkit::conntrack::fill(&netns);
    eprintln!("{added} flows added to node 1's conntrack table, then: {refused}");
    assert_eq!(
        refused.raw_os_error(),
        Some(nix::libc::ENOMEM),
        "the kernel refuses entries once the table is full: {refused}"
    );
    assert!(
        !p.topo.reaches(&p.a, &p.ip_b),
        "a full table breaks pod traffic"
    );
    let fix = names(&p, "conntrack-full", None);
    assert!(
        fix.starts_with("sysctl -w net.netfilter.nf_conntrack_max="),
        "{fix}"
    );
    let (_, report) = doctor(&p.topo, 1, &p.conf1);
    assert_eq!(
        report["peers"],
        json!([{"peer": "192.0.2.2", "state": "conntrack-full"}]),
        "{report:#}"
    );
    sticky_testkit::conntrack::flush(&netns);
    healed(&p);
}

/// Doctor without `CAP_NET_RAW` (the agent's unit leaves it out of its bounding set): with the
/// kernel's default `ping_group_range` it cannot probe and exits 2 saying what it needs; with
/// root's group in it (systemd's default) it probes through ping sockets and still tells a
/// healthy peer from a blocked VXLAN port.
#[test]
#[ignore = "needs root: network namespaces"]
fn doctor_probes_without_cap_net_raw_through_ping_sockets() {
    let p = pair();
    let file = p.topo.dir.path().join("doctor-1.conflist");
    std::fs::write(&file, p.conf1.to_string()).expect("write the config");
    let node1 = p.topo.node_ns(1);
    let unprivileged = || {
        let out = p.topo.in_ns(
            &node1,
            &[
                "setpriv",
                "--bounding-set",
                "-net_raw",
                "--",
                bin(),
                "doctor",
                "--config",
                file.to_str().expect("utf-8 path"),
                "--json",
            ],
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code(),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let range = |r: &str| {
        let set = format!("net.ipv4.ping_group_range={r}");
        ok(&["ip", "netns", "exec", &node1, "sysctl", "-qw", &set]);
    };
    range("1 0");
    let (code, _, stderr) = unprivileged();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("CAP_NET_RAW, or its group in net.ipv4.ping_group_range"),
        "{stderr}"
    );

    range("0 0");
    let (code, report, stderr) = unprivileged();
    assert_eq!(
        (code, &report["findings"], &report["peers"]),
        (
            Some(0),
            &json!([]),
            &json!([{"peer": "192.0.2.2", "state": "ok"}])
        ),
        "{report:#} {stderr}"
    );
    p.topo.load_nft(&p.topo.node_ns(2), "doctor", BLOCK_VXLAN);
    let (code, report, stderr) = unprivileged();
    assert_eq!(
        (code, &report["peers"]),
        (
            Some(1),
            &json!([{"peer": "192.0.2.2", "state": "vxlan-blocked"}])
        ),
        "{report:#} {stderr}"
    );
}
