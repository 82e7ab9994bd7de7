//! A [`Report`] for people (one line a node finding, one a peer, one a remote site) or as JSON
//! (an object whose `findings` carry `cause`, `peer` or `site`, `detail` and `fix`).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{Finding, Report};

/// The text output: a heading, one line a node finding, one line a peer (`ok` or its cause),
/// with sites this node's site and role and one line a remote site, and what could not be
/// checked.
pub fn text(r: &Report) -> String {
    let m = &r.measured;
    let mut out = format!(
        "network {}, node {}: {} peer(s) probed in {:.1}s, pod MTU {}\n",
        r.network,
        m.local_ip,
        m.peers.len(),
        r.took.as_secs_f64(),
        m.node.pod_mtu
    );
    for f in r
        .findings
        .iter()
        .filter(|f| f.peer.is_none() && f.site.is_none())
    {
        let _ = writeln!(out, "node: {}", line(f));
    }
    for p in &m.peers {
        let _ = match r.peer_finding(p.peer) {
            Some(f) => writeln!(out, "peer {}: {}", p.peer, line(f)),
            None => match r.peer_state(p) {
                "ok" => writeln!(out, "peer {}: ok", p.peer),
                node => writeln!(out, "peer {}: {node} (this node's cause, above)", p.peer),
            },
        };
    }
    if let Some(s) = &m.sites {
        let _ = writeln!(out, "site {}: {}", s.site, s.role);
        for remote in &s.remotes {
            let _ = match r.site_finding(&remote.site) {
                Some(f) => writeln!(out, "site {}: {}", remote.site, line(f)),
                None => writeln!(out, "site {}: ok ({})", remote.site, remote.path),
            };
        }
    }
    for u in &m.unchecked {
        let _ = writeln!(out, "not checked: {u}");
    }
    let _ = match r.findings.len() {
        0 => writeln!(out, "no cause found"),
        n => writeln!(out, "{n} cause(s) found"),
    };
    out
}

fn line(f: &Finding) -> String {
    format!("{}: {} | fix: {}", f.cause.code(), f.detail, f.fix)
}

/// The `--json` output.
pub fn json(r: &Report) -> Value {
    let m = &r.measured;
    let peers: Vec<Value> = m
        .peers
        .iter()
        .map(|p| json!({"peer": p.peer, "state": r.peer_state(p)}))
        .collect();
    let sites = m.sites.as_ref().map(|s| {
        let remotes: Vec<Value> = s
            .remotes
            .iter()
            .map(|remote| {
                json!({"site": remote.site, "path": remote.path, "state": r.site_state(&remote.site)})
            })
            .collect();
        json!({"site": s.site, "role": s.role, "remotes": remotes})
    });
    json!({
        "network": r.network,
        "node": m.local_ip,
        "podMtu": m.node.pod_mtu,
        "tookMs": r.took.as_millis() as u64,
        "peers": peers,
        "sites": sites,
        "findings": r.findings,
        "unchecked": m.unchecked,
    })
}

#[cfg(test)]
mod tests {
    use super::super::decide::{Bridge, Cause, NodeFacts, PeerFacts, Vtep};
    use super::super::measure::Measured;
    use super::*;

    fn report() -> Report {
        let peer = |ip: &str| PeerFacts {
            peer: ip.parse().unwrap(),
            underlay: true,
            small: true,
            full: true,
            largest: None,
            route_dev: None,
        };
        let node = NodeFacts {
            vtep_name: "sticky.1".into(),
            vtep: Vtep::Ready,
            bridge_name: "cni0".into(),
            bridge: Bridge::Ready,
            ip_forward: Some(false),
            forward_drop: vec![],
            strict_rp_filter: vec![],
            underlay_dev: "eth0".into(),
            underlay: "192.0.2.1".parse().unwrap(),
            conntrack: None,
            csum_errors: 0,
            rp_filter_drops: 0,
            port: 8472,
            pod_mtu: 1450,
            config: "/c".into(),
            pod_subnet: None,
            cluster: "10.244.0.0/16".into(),
        };
        let mut peers = vec![peer("192.0.2.2"), peer("192.0.2.3")];
        peers[1].small = false;
        let findings = super::super::decide::decide(&node, &peers);
        Report {
            network: "edge".into(),
            measured: Measured {
                node,
                peers,
                local_ip: "192.0.2.1".parse().unwrap(),
                unchecked: vec!["forward chains: no nf_tables".into()],
                sites: None,
            },
            findings,
            took: std::time::Duration::from_millis(2512),
        }
    }

    #[test]
    fn text_has_one_line_a_peer_and_the_node_first() {
        let out = text(&report());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "network edge, node 192.0.2.1: 2 peer(s) probed in 2.5s, pod MTU 1450"
        );
        assert!(lines[1].starts_with("node: forwarding-off: "), "{out}");
        assert_eq!(lines[2], "peer 192.0.2.2: ok");
        assert!(
            lines[3].starts_with("peer 192.0.2.3: vxlan-blocked: "),
            "{out}"
        );
        assert!(lines[3].contains(" | fix: allow UDP 8472"), "{out}");
        assert_eq!(lines[4], "not checked: forward chains: no nf_tables");
        assert_eq!(lines[5], "2 cause(s) found");
    }

    /// A full conntrack table drops the probes too: no peer is blamed, and none is called ok.
    #[test]
    fn peers_whose_probes_died_of_the_nodes_cause_carry_it() {
        let mut r = report();
        r.measured.node.ip_forward = Some(true);
        r.measured.node.conntrack = Some((100, 100));
        r.findings = super::super::decide::decide(&r.measured.node, &r.measured.peers);
        let out = text(&r);
        assert!(out.contains("\npeer 192.0.2.2: ok\n"), "{out}");
        assert!(
            out.contains("\npeer 192.0.2.3: conntrack-full (this node's cause, above)\n"),
            "{out}"
        );
        let v = json(&r);
        assert_eq!(v["peers"][1]["state"], "conntrack-full");
        assert_eq!(v["findings"].as_array().map(Vec::len), Some(1));
    }

    /// With sites: the node's site and role, then one line a remote site.
    #[test]
    fn text_and_json_have_one_entry_a_remote_site() {
        use super::super::decide::sites::{RemoteFacts, SitesFacts, WanProbe};
        let mut r = report();
        let remote = |site: &str, path: &str, full: bool| RemoteFacts {
            site: site.into(),
            gateway: Some(format!("{site}-gw")),
            path: path.into(),
            tunnel: None,
            probe: Some(WanProbe {
                target: "198.18.21.0".parse().unwrap(),
                small: true,
                full,
                largest: None,
            }),
            nat: vec![],
        };
        let sites = SitesFacts {
            site: "site-a".into(),
            role: "member, through gateway a1".into(),
            gateway: false,
            interface: "stickywg0".into(),
            listen_port: 51820,
            wan_mtu: 1500,
            overhead: 60,
            config: "/c".into(),
            remotes: vec![
                remote("cloud", "direct", true),
                remote("site-b", "direct (punched)", false),
            ],
        };
        r.findings
            .extend(super::super::decide::sites::decide(&sites));
        r.measured.sites = Some(sites);
        let out = text(&r);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[4], "site site-a: member, through gateway a1", "{out}");
        assert_eq!(lines[5], "site cloud: ok (direct)", "{out}");
        assert!(lines[6].starts_with("site site-b: wan-mtu: "), "{out}");
        assert_eq!(lines[8], "3 cause(s) found", "{out}");
        let v = json(&r);
        assert_eq!(
            v["sites"]["remotes"][1],
            json!({"site": "site-b", "path": "direct (punched)", "state": "wan-mtu"})
        );
        assert_eq!(v["findings"][2]["site"], "site-b");
        assert_eq!(v["findings"][2]["cause"], "wan-mtu");
    }

    #[test]
    fn json_findings_carry_cause_peer_detail_and_fix() {
        let v = json(&report());
        assert_eq!(v["findings"][0]["cause"], "forwarding-off");
        assert_eq!(v["findings"][0]["peer"], Value::Null);
        assert_eq!(v["findings"][1]["cause"], Cause::VxlanBlocked.code());
        assert_eq!(v["findings"][1]["peer"], "192.0.2.3");
        assert!(v["findings"][1]["fix"].as_str().unwrap().contains("8472"));
        assert_eq!(v["peers"][0], json!({"peer": "192.0.2.2", "state": "ok"}));
        assert_eq!(v["peers"][1]["state"], "vxlan-blocked");
    }
}
