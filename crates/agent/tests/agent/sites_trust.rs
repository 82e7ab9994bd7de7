//! Trust (issue 34, docs/sites.md "Trust"): what a Node writes about itself, and what anyone
//! sends at a probe port, moves no other node's or site's traffic. Each test is one of the
//! reproductions on the sites topology (`sticky_testkit::sites_support`), real daemons and
//! packets.

use sticky_netlink::netns;
use sticky_testkit::kube_support;
use sticky_testkit::sites_support;
use sticky_testkit::vxlan_support;

use std::net::UdpSocket;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use kube_support::*;
use sites_support::*;
use vxlan_support::*;

/// Every ordered pair of the plain nodes' pods answers a ping within 30 s.
fn every_pair_talks(pods: &[(Pod, String)], after: &str) {
    for (from, _) in pods {
        for (to, ip) in pods {
            if from.ns != to.ns {
                assert!(
                    first_reply(&from.ns, ip, Duration::from_secs(30)).is_some(),
                    "{} no longer reaches {ip} after {after}",
                    from.ns
                );
            }
        }
    }
}

/// Waits until every plain node's agent has logged `line`.
fn logged_everywhere(s: &Sites, line: &str) {
    for node in PLAIN {
        wait_for(
            &format!("{node}'s agent logs {line:?}"),
            Duration::from_secs(60),
            || s.agent_log(node).contains(line),
        );
    }
}

/// Reproduction 1: a Node that copies the cloud gateway's published public key (and labels
/// itself a gateway) took every cross-site tunnel down: every claimant lost its gateway part.
/// Now c1, which held the key, keeps it: the copier is no candidate, logged, and every pod
/// pair still talks through c1, whose peers are still a1 and b1.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_trust_a_copied_cloud_key_takes_no_tunnel_down() {
    let (s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let c1_key = s.wg_public_key("c1");
    let mut rogue = node_json("zz-rogue", "198.51.100.99", &["198.18.99.0/24"], json!({}));
    rogue["metadata"]["labels"][SITE_LABEL] = json!("aaa");
    rogue["metadata"]["labels"][GATEWAY_LABEL] = json!("true");
    rogue["metadata"]["annotations"]["sticky-cni.io/wireguard-public-key"] = json!(c1_key);
    s.api.put_node(rogue);
    logged_everywhere(&s, "sites: node zz-rogue cannot be a gateway");
    assert!(
        s.agent_log("a2").contains("it stays with c1"),
        "{}",
        s.agent_log("a2")
    );
    every_pair_talks(&pods, "a Node copied c1's key");
    assert_eq!(s.wg_peers("c1").len(), 2, "c1 still peers with a1 and b1");
}

/// Reproduction 2, with the kubelet-writable label keys (`sticky-cni.io/site`,
/// `sticky-cni.io/gateway`): a Node that puts itself in site `aaa` (first by name), labels
/// itself a gateway and publishes an endpoint and a key it holds became the relay of A <-> B
/// (B behind a port-randomising NAT): a1 gave its peer all of site B's subnets. With the relay
/// named in the config (`sites.relays: ["cloud"]`), it changes nothing outside its own site:
/// a1's peer for it carries only its own subnet, B's subnets stay on the cloud's peer, and A
/// and B still talk through c1.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_trust_a_self_labelled_site_relays_nothing_once_the_config_names_the_relays() {
    let (site_key, gateway_key) = ("sticky-cni.io/site", "sticky-cni.io/gateway");
    let (s, pods) = Sites::running(Nat::RandomOnB, |s| s.use_labels(site_key, gateway_key));
    assert!(
        s.agent_log("a1")
            .contains("is not under node-restriction.kubernetes.io/"),
        "a kubelet-writable key is warned about at start: {}",
        s.agent_log("a1")
    );
    let key = sticky_sites::keys::PrivateKey::generate().expect("a key");
    let rogue_key = key.public_key().to_base64();
    let mut rogue = node_json("zz-rogue", "198.51.100.98", &["198.18.98.0/24"], json!({}));
    rogue["metadata"]["labels"][site_key] = json!("aaa");
    rogue["metadata"]["labels"][gateway_key] = json!("true");
    rogue["metadata"]["annotations"]["sticky-cni.io/wireguard-public-key"] = json!(rogue_key);
    rogue["metadata"]["annotations"][ENDPOINT_ANNOTATION] = json!("198.51.100.98:51820");
    s.api.put_node(rogue);
    // a1 dials the new site directly: a peer for the rogue's key appears.
    wait_for(
        "a1 peers with the rogue site's gateway",
        Duration::from_secs(60),
        || s.wg_peers("a1").contains(&rogue_key),
    );
    let allowed = s.wg("a1", &["show", WG_IF, "allowed-ips"]);
    let of = |k: &str| {
        allowed
            .lines()
            .find(|l| l.starts_with(k))
            .unwrap_or_else(|| panic!("no peer {k} on a1: {allowed}"))
            .to_string()
    };
    let rogue_line = of(&rogue_key);
    assert!(
        !rogue_line.contains("198.18.21.") && !rogue_line.contains("198.18.22."),
        "the rogue site carries site B's subnets: {rogue_line}"
    );
    let cloud_line = of(&s.wg_public_key("c1"));
    assert!(
        cloud_line.contains("198.18.21.0/24") && cloud_line.contains("198.18.22.0/24"),
        "site B is relayed through the cloud: {cloud_line}"
    );
    every_pair_talks(&pods, "a self-labelled site appeared");
}

/// A flood of UDP datagrams at `to` from namespace `ns` (at most `per_second`), until `stop`.
fn flood(
    ns: &Path,
    to: &str,
    per_second: u32,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let socket = netns::run_in(ns, || UdpSocket::bind("0.0.0.0:0"))
        .expect("enter the namespace")
        .expect("bind the flood's socket");
    let to: std::net::SocketAddr = to.parse().expect("an address");
    // A well-formed probe (17 bytes: magic, version, kind, nonce, a one-byte name, no active).
    let mut probe = b"STKP\x01\x00".to_vec();
    probe.extend_from_slice(&7u64.to_be_bytes());
    probe.extend_from_slice(b"\x01x\x00");
    std::thread::spawn(move || {
        let batch = per_second / 100;
        let mut sent = 0;
        let mut tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..batch {
                if socket.send_to(&probe, to).is_ok() {
                    sent += 1;
                }
            }
            tick += Duration::from_millis(10);
            if let Some(wait) = tick.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        sent
    })
}

/// Reproduction 3: 30 s of well-formed probes at the cloud gateway's probe port, 50,000 a
/// second from the internet and 50,000 from a pod on c2, with the CPU kept busy by the
/// floods themselves: c1 saw c2 dead and stepped down (3 of 5 runs). Now the flood reaches no
/// queue of the probes (each member has a socket of its own, connected to it): no node sees a
/// live member dead, no gateway steps down, c1 keeps its peers and every pair still talks.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_trust_a_probe_flood_makes_no_member_dead_and_no_gateway_step_down() {
    let (mut s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let (c2_pod, _) = pod_of(&pods, "c2");
    let target = "198.51.100.1:51821";
    let stop = Arc::new(AtomicBool::new(false));
    let internet = format!("/run/netns/{}", s.internet_host());
    let floods = [
        flood(Path::new(&internet), target, 50_000, stop.clone()),
        flood(Path::new(&c2_pod.path()), target, 50_000, stop.clone()),
    ];
    let before: Vec<String> = NODES.iter().map(|n| s.agent_log(n.name)).collect();
    let start = Instant::now();
    let mut idle = 0;
    while start.elapsed() < Duration::from_secs(30) {
        // Meanwhile pods keep talking across sites (a lost ping or two under load is allowed).
        if first_reply(&pods[1].0.ns, &pods[0].1, Duration::from_secs(5)).is_none() {
            idle += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for (from, f) in ["the internet", "c2's pod"].into_iter().zip(floods) {
        let sent = f.join().expect("a flood");
        eprintln!("flood from {from}: {sent} probes in {:?}", start.elapsed());
        assert!(
            sent > 500_000,
            "the flood from {from} sent only {sent} datagrams"
        );
    }
    for (n, was) in NODES.iter().zip(before) {
        let log = s.agent_log(n.name);
        let new = &log[was.len().min(log.len())..];
        assert!(
            !new.contains("is Dead") && !new.contains("steps down"),
            "{}'s agent saw a member dead or stepped down under the flood: {new}",
            n.name
        );
    }
    assert_eq!(idle, 0, "a2 lost c2 for 5 s during the flood");
    assert_eq!(s.wg_peers("c1").len(), 2, "c1 still peers with a1 and b1");
    every_pair_talks(&pods, "the probe flood");
}

/// Reproduction 4: a new Node a9 in site A with cloud node c2's pod subnet. On a2, c2's subnet
/// is only carried (by a1's entry), so it did not count as placed: both were left out, and
/// a2 -> c2, b2 -> c2 and c2 -> a2 failed. Now c2 keeps its place on every node, the
/// newcomer is left out, and every pair still talks.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_trust_an_overlapping_newcomer_cuts_no_remote_node_off() {
    let (s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let mut a9 = node_json("a9", "192.0.2.9", &[&pod_subnet("c2")], json!({}));
    a9["metadata"]["labels"][SITE_LABEL] = json!("site-a");
    s.api.put_node(a9);
    logged_everywhere(&s, "node a9 is left out of the peers");
    for node in PLAIN {
        assert!(
            !s.agent_log(node).contains("node c2 is left out"),
            "{node} left c2 out: {}",
            s.agent_log(node)
        );
    }
    every_pair_talks(&pods, "a9 claimed c2's subnet");
}

/// `count` distinct WireGuard handshake initiations (148 bytes) to the holder of `public_key`
/// (base64), each with a MAC1 that verifies (anyone can compute it from a published key) and
/// garbage where the sender's ephemeral, static and timestamp go.
fn initiations(public_key: &str, count: u32) -> Vec<Vec<u8>> {
    use blake2::digest::{FixedOutput, KeyInit, Update};
    use blake2::{Blake2s256, Blake2sMac, Digest};
    let key = base64_decode(public_key).expect("a base64 public key");
    let mac1_key = Blake2s256::new()
        .chain_update(b"mac1----")
        .chain_update(&key)
        .finalize();
    (0..count)
        .map(|i| {
            let mut m = vec![0u8; 148];
            m[0] = 1; // handshake initiation
            m[4..8].copy_from_slice(&i.to_le_bytes()); // sender index
            for (j, b) in m[8..116].iter_mut().enumerate() {
                *b = (i as usize * 31 + j * 7) as u8;
            }
            let mut mac =
                <Blake2sMac<blake2::digest::consts::U16> as KeyInit>::new_from_slice(&mac1_key)
                    .expect("a 32-byte key");
            Update::update(&mut mac, &m[..116]);
            m[116..132].copy_from_slice(&mac.finalize_fixed());
            m
        })
        .collect()
}

/// Issue 34, part 4: 20 s of handshake initiations whose MAC1 verifies, 20,000 a second from
/// the internet at the cloud gateway's tunnel port (anyone can make them from its published
/// key). WireGuard's answer under load (a cookie reply per source instead of a handshake) keeps
/// the established tunnels: pings between pods across sites through c1 lose at most 1 %.
#[test]
#[ignore = "needs root: network namespaces"]
fn sites_trust_a_mac1_valid_handshake_flood_leaves_established_tunnels_working() {
    let (mut s, pods) = Sites::running(Nat::Masquerade, |_| {});
    let packets = initiations(&s.wg_public_key("c1"), 1000);
    let socket = netns::run_in(
        Path::new(&format!("/run/netns/{}", s.internet_host())),
        || UdpSocket::bind("0.0.0.0:0"),
    )
    .expect("enter the internet")
    .expect("bind the flood's socket");
    let to: std::net::SocketAddr = CLOUD_ENDPOINT.parse().expect("c1's endpoint");
    let (a2_pod, a2_ip) = pod_of(&pods, "a2");
    let (c2_pod, c2_ip) = pod_of(&pods, "c2");
    let pings = [
        Flood::start(&c2_pod.ns, a2_ip, 2000),
        Flood::start(&a2_pod.ns, c2_ip, 2000),
    ];
    let start = Instant::now();
    let mut sent = 0u64;
    let mut tick = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        for p in packets.iter().cycle().skip(sent as usize % 1000).take(200) {
            if socket.send_to(p, to).is_ok() {
                sent += 1;
            }
        }
        tick += Duration::from_millis(10);
        if let Some(wait) = tick.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    eprintln!(
        "handshake flood: {sent} initiations in {:?}",
        start.elapsed()
    );
    assert!(sent > 200_000, "the flood sent only {sent} initiations");
    for (what, ping) in ["c2 -> a2", "a2 -> c2"].into_iter().zip(pings) {
        let (tx, rx) = ping.finish();
        eprintln!("{what} during the flood: {rx} of {tx} pings answered");
        assert!(
            rx * 100 >= tx * 99,
            "{what} lost more than 1 % during the handshake flood: {rx} of {tx}"
        );
    }
    every_pair_talks(&pods, "the handshake flood");
}
