//! `measure` against the overlay's recording kernel and a fake prober: what is probed, what
//! the facts say, and that nothing is written.

use super::*;
use crate::doctor::probe::Fake;
use serde_json::json;
use sticky_overlay::fake::{self, Fake as Kernel};

struct Counting {
    calls: u64,
    chains: Result<Vec<DropChain>, String>,
}

impl Host for Counting {
    /// Each read sees one more checksum error than the one before.
    fn counters(&mut self) -> Result<Counters, Error> {
        self.calls += 1;
        Ok(Counters {
            udp_csum_errors: self.calls,
            rp_filter_drops: 0,
        })
    }
    fn drop_chains(&mut self) -> Result<Vec<DropChain>, String> {
        self.chains.clone()
    }
}

fn node() -> (Kernel, Config) {
    let cfg = fake::conf(json!({"peers": [
        {"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
        {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]},
        {"ip": "192.0.2.3", "subnets": ["10.244.3.0/24"]},
    ]}));
    let mut k = Kernel::node("192.0.2.1/24");
    k.add_link(&cfg.vtep_name, "vxlan");
    let vtep = k.link_mut(&cfg.vtep_name);
    vtep.alias = Some(marker(Dev::Vtep, &cfg.name));
    vtep.mtu = Some(1450);
    k.sysctls.insert("net/ipv4/ip_forward".into(), "1".into());
    k.sysctls
        .insert("net/ipv4/conf/all/rp_filter".into(), "1".into());
    k.sysctls
        .insert("net/ipv4/conf/eth0/rp_filter".into(), "0".into());
    (k, cfg)
}

#[test]
fn every_peer_is_probed_around_through_and_at_the_pod_mtu_and_nothing_is_written() {
    let (mut k, cfg) = node();
    let mut host = Counting {
        calls: 0,
        chains: Ok(vec![]),
    };
    // 192.0.2.3 takes nothing above 1350 bytes through the overlay.
    let mut prober = Fake {
        answers: |p: &Probe| !(p.dst == IpAddr::from([10, 244, 3, 0]) && p.size > 1350),
        sent: vec![],
    };
    let m = measure(&mut k, &mut host, &mut prober, &cfg, "/c").unwrap();
    assert!(k.writes.is_empty(), "doctor wrote {:?}", k.writes);
    let to_2: Vec<(String, u16)> = prober
        .sent
        .iter()
        .take(8)
        .map(|p| (p.dst.to_string(), p.size))
        .collect();
    let want: Vec<(String, u16)> = [
        ("192.0.2.2", 84),
        ("10.244.2.0", 84),
        ("10.244.2.0", 1450),
        ("10.244.2.0", 1400),
        ("10.244.2.0", 1350),
        ("10.244.2.0", 1300),
        ("10.244.2.0", 1250),
        ("10.244.2.0", 1200),
    ]
    .iter()
    .map(|(d, s)| (d.to_string(), *s))
    .collect();
    assert_eq!(to_2, want);
    assert_eq!(prober.sent.len(), 16, "8 probes a peer");
    assert_eq!(m.peers.len(), 2);
    assert!(m.peers[0].full && m.peers[0].largest.is_none());
    assert!(m.peers[1].small && !m.peers[1].full);
    assert_eq!(m.peers[1].largest, Some(1350));
    assert_eq!(m.node.pod_mtu, 1450);
    assert_eq!(m.node.ip_forward, Some(true));
    assert_eq!(m.node.vtep, Vtep::Ready);
    assert_eq!(m.node.strict_rp_filter, ["eth0"], "all=1 makes eth0 strict");
    assert_eq!(
        m.node.csum_errors, 1,
        "the counters' delta across the probes"
    );
    assert!(m.unchecked.is_empty());
}

#[test]
fn a_vtep_without_our_marker_and_unreadable_chains_are_said() {
    let (mut k, cfg) = node();
    k.link_mut(&cfg.vtep_name).alias = None;
    let mut host = Counting {
        calls: 0,
        chains: Err("no nf_tables".into()),
    };
    let mut prober = Fake {
        answers: |_: &Probe| true,
        sent: vec![],
    };
    let m = measure(&mut k, &mut host, &mut prober, &cfg, "/c").unwrap();
    assert_eq!(m.node.vtep, Vtep::NotOurs);
    assert_eq!(m.unchecked, ["forward chains: no nf_tables"]);
}

#[test]
fn counters_are_read_from_the_proc_tables() {
    let snmp = "Udp: InDatagrams NoPorts InErrors InCsumErrors\nUdp: 10 2 3 7\n";
    assert_eq!(counter(snmp, "Udp:", "InCsumErrors"), 7);
    assert_eq!(counter(snmp, "Tcp:", "InCsumErrors"), 0, "absent group");
    assert_eq!(counter(snmp, "Udp:", "Nothing"), 0, "absent counter");
}

#[test]
fn on_an_ipv6_underlay_peers_are_probed_around_in_icmpv6_and_through_in_ipv4() {
    let cfg = fake::conf(json!({"v6": true, "peers": [
        {"ip": "2001:db8::1", "subnets": ["10.244.1.0/24", "fd00:1::/64"]},
        {"ip": "2001:db8::2", "subnets": ["10.244.2.0/24", "fd00:2::/64"]},
    ]}));
    let mut k = Kernel::node("2001:db8::1/64");
    k.add_link(&cfg.vtep_name, "vxlan");
    let vtep = k.link_mut(&cfg.vtep_name);
    vtep.alias = Some(marker(Dev::Vtep, &cfg.name));
    vtep.mtu = Some(1430);
    k.sysctls
        .insert("net/ipv4/conf/all/rp_filter".into(), "1".into());
    k.sysctls
        .insert("net/ipv4/conf/eth0/rp_filter".into(), "1".into());
    let mut host = Counting {
        calls: 0,
        chains: Ok(vec![]),
    };
    let mut prober = Fake {
        answers: |_: &Probe| true,
        sent: vec![],
    };
    let m = measure(&mut k, &mut host, &mut prober, &cfg, "/c").unwrap();
    let sent: Vec<(String, u16)> = prober
        .sent
        .iter()
        .take(3)
        .map(|p| (p.dst.to_string(), p.size))
        .collect();
    assert_eq!(
        sent,
        [
            ("2001:db8::2".to_string(), 84),
            ("10.244.2.0".to_string(), 84),
            ("10.244.2.0".to_string(), 1430),
        ]
    );
    assert_eq!(m.local_ip, "2001:db8::1".parse::<IpAddr>().unwrap());
    assert_eq!(m.node.underlay, m.local_ip);
    assert_eq!(m.peers.len(), 1);
    assert!(
        !m.node.strict_rp_filter.contains(&"eth0".to_string()),
        "IPv4's rp_filter has nothing to say of an IPv6 underlay: {:?}",
        m.node.strict_rp_filter
    );
}

#[test]
fn ipv6_counters_are_read_from_snmp6() {
    let snmp6 = "Udp6InDatagrams                 \t12\nUdp6InCsumErrors                \t3\n";
    assert_eq!(counter6(snmp6, "Udp6InCsumErrors"), 3);
    assert_eq!(counter6(snmp6, "Udp6NoPorts"), 0, "absent counter");
    assert_eq!(counter6("", "Udp6InCsumErrors"), 0, "no IPv6 in the kernel");
}
