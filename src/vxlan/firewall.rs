//! Optional nftables rules, in one table of their own per network (`ip sticky_vxlan_<name>`,
//! see [`table_name`]):
//!
//! - `ipMasq`: pods' IPv4 traffic leaving the cluster CIDR is masqueraded:
//!   `ip saddr <node subnet> ip daddr != <clusterCIDR> masquerade` (postrouting, srcnat);
//!   traffic to other pods never is.
//! - `peerOnlyPort`: the VXLAN UDP port accepts packets from configured peers only:
//!   `udp dport <port> ip saddr != { <peer ips> } counter drop` (input, just before filter).
//!
//! The table is rewritten whole in one `nft -f -` transaction, so it always matches the
//! current config and peers. With neither option set nothing is touched. While the peers file
//! cannot be used, the peers still programmed on the VTEP stay allowed too (a broken file never
//! cuts a node off, in the firewall as on the VTEP).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use super::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running nft (needed by ipMasq/peerOnlyPort): {0}")]
    Spawn(#[source] std::io::Error),
    #[error("writing the rules to nft: {0}")]
    Write(#[source] std::io::Error),
    #[error("nft refused the rules ({status}): {stderr}")]
    Refused { status: String, stderr: String },
}

/// The table name: `sticky_vxlan_` + the network name with ASCII letters and digits kept and
/// every other byte written `_` + two hex digits (`edge-1` → `edge_2d1`, `edge_1` →
/// `edge_5f1`), so two networks never share a table.
pub fn table_name(network: &str) -> String {
    let mut name = String::from("sticky_vxlan_");
    for b in network.bytes() {
        if b.is_ascii_alphanumeric() {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("_{b:02x}"));
        }
    }
    name
}

/// Whether `table` is [`table_name`] of some network (after each `_` of the name part come
/// two lower-case hex digits).
fn is_current_name(table: &str) -> bool {
    let Some(rest) = table.strip_prefix("sticky_vxlan_") else {
        return false;
    };
    let mut bytes = rest.bytes();
    while let Some(b) = bytes.next() {
        if b == b'_' {
            let hex =
                |c: Option<u8>| c.is_some_and(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
            if !(hex(bytes.next()) && hex(bytes.next())) {
                return false;
            }
        } else if !b.is_ascii_alphanumeric() {
            return false;
        }
    }
    true
}

/// The name earlier releases gave the table (every other character became `_`, so `edge-1`
/// and `edge_1` shared one). It is removed on upgrade when it cannot be another network's
/// current table ([`is_current_name`]), so an upgraded node keeps no stale rule.
fn legacy_table_name(network: &str) -> String {
    let clean: String = network
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("sticky_vxlan_{clean}")
}

/// The nft script for this config, or `None` when no rule is wanted. `subnet` is the node's
/// IPv4 pod subnet, `local` the node's underlay address and `allowed` the underlay addresses
/// the VXLAN port accepts (of `local`'s family). The masquerade rule is about IPv4 pods and
/// sits in an `ip` table; the VXLAN port's rule sits in a table of the underlay's family
/// (`ip6` for an IPv6 underlay), and both tables are replaced in one transaction, so a
/// network moved from one underlay family to the other leaves no rule behind.
pub fn script(
    cfg: &Config,
    subnet: Option<IpNet>,
    local: IpAddr,
    allowed: &[IpAddr],
) -> Option<String> {
    if !cfg.ip_masq && !cfg.peer_only_port {
        return None;
    }
    let table = table_name(&cfg.name);
    let mut s = String::new();
    let legacy = legacy_table_name(&cfg.name);
    if legacy != table && !is_current_name(&legacy) {
        s.push_str(&format!(
            "table ip {legacy} {{}}\ndelete table ip {legacy}\n"
        ));
    }
    s.push_str(&format!("table ip {table} {{}}\ndelete table ip {table}\n"));
    if cfg.peer_only_port {
        s.push_str(&format!(
            "table ip6 {table} {{}}\ndelete table ip6 {table}\n"
        ));
    }
    s.push_str(&format!("table ip {table} {{\n"));
    if cfg.ip_masq
        && let (Some(subnet), Some(cluster)) = (subnet, cfg.cluster_cidr)
        && cluster.addr().is_ipv4()
    {
        s.push_str(&format!(
                    "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {subnet} ip daddr != {cluster} masquerade\n  }}\n"
                ));
    }
    let (family, saddr) = match local {
        IpAddr::V4(_) => ("ip", "ip saddr"),
        IpAddr::V6(_) => ("ip6", "ip6 saddr"),
    };
    if cfg.peer_only_port {
        let allowed: BTreeSet<IpAddr> = allowed
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == local.is_ipv6())
            .collect();
        let peers: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        let rule = if peers.is_empty() {
            format!("udp dport {} counter drop", cfg.port)
        } else {
            format!(
                "udp dport {} {saddr} != {{ {} }} counter drop",
                cfg.port,
                peers.join(", ")
            )
        };
        let chain = format!(
            "  chain input {{\n    type filter hook input priority filter - 1; policy accept;\n    {rule}\n  }}\n"
        );
        if family == "ip" {
            s.push_str(&chain);
        } else {
            s.push_str(&format!("}}\ntable ip6 {table} {{\n{chain}"));
        }
    }
    s.push_str("}\n");
    Some(s)
}

/// Runs `script` with `nft -f -` (one transaction).
pub fn run(script: &str) -> Result<(), Error> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(Error::Write)?;
    }
    let out = child.wait_with_output().map_err(Error::Write)?;
    if !out.status.success() {
        return Err(Error::Refused {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_for_masq_and_peer_only_port() {
        let cfg = Config::from_json(
            "edge-1",
            &json!({"vni": 1, "ipMasq": true, "clusterCIDR": "10.244.0.0/16",
                    "peerOnlyPort": true, "ipam": {"type": "host-local"}}),
        )
        .unwrap();
        let subnet = Some("10.244.1.0/24".parse().unwrap());
        let local: IpAddr = "192.0.2.1".parse().unwrap();
        let s = script(&cfg, subnet, local, &["192.0.2.2".parse().unwrap()]).unwrap();
        assert!(s.contains("table ip sticky_vxlan_edge_2d1 {"), "{s}");
        assert!(s.contains("delete table ip sticky_vxlan_edge_1\n"), "{s}");
        assert!(
            s.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 masquerade"),
            "{s}"
        );
        assert!(
            s.contains("udp dport 8472 ip saddr != { 192.0.2.2 } counter drop"),
            "{s}"
        );
        let allowed = [
            "192.0.2.3".parse().unwrap(),
            "192.0.2.2".parse().unwrap(),
            "192.0.2.2".parse().unwrap(),
        ];
        let s = script(&cfg, subnet, local, &allowed).unwrap();
        assert!(
            s.contains("udp dport 8472 ip saddr != { 192.0.2.2, 192.0.2.3 } counter drop"),
            "{s}"
        );
        // An IPv6 underlay: the VXLAN port's rule in an ip6 table, the masquerade (IPv4
        // pods) where it was; both tables replaced.
        let local6: IpAddr = "2001:db8::1".parse().unwrap();
        let s = script(&cfg, subnet, local6, &["2001:db8::2".parse().unwrap()]).unwrap();
        assert!(
            s.contains("delete table ip6 sticky_vxlan_edge_2d1\n"),
            "{s}"
        );
        assert!(s.contains("delete table ip sticky_vxlan_edge_2d1\n"), "{s}");
        let v6_table = &s[s
            .find("table ip6 sticky_vxlan_edge_2d1 {\n")
            .expect("an ip6 table")..];
        assert!(
            v6_table.contains("udp dport 8472 ip6 saddr != { 2001:db8::2 } counter drop"),
            "{s}"
        );
        assert!(s.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 masquerade"));
    }

    #[test]
    fn table_names_are_injective_and_plain_names_keep_theirs() {
        assert_eq!(table_name("edge"), "sticky_vxlan_edge");
        let names = ["edge-1", "edge_1", "edge.1", "edge_2d1", "edge1"];
        let tables: BTreeSet<String> = names.iter().map(|n| table_name(n)).collect();
        assert_eq!(tables.len(), names.len(), "{tables:?}");
        for n in names {
            assert!(is_current_name(&table_name(n)), "{n}");
        }
        // A legacy name is only removed when no network has it as its current table.
        assert!(!is_current_name(&legacy_table_name("edge-1")));
        assert!(is_current_name(&legacy_table_name("edge_2d1")));
        let cfg = |name: &str| {
            Config::from_json(
                name,
                &json!({"vni": 1, "peerOnlyPort": true, "ipam": {"type": "x"}}),
            )
            .unwrap()
        };
        let s = script(&cfg("edge_2d1"), None, "192.0.2.1".parse().unwrap(), &[]).unwrap();
        assert!(!s.contains("delete table ip sticky_vxlan_edge_2d1"), "{s}");
    }
}
