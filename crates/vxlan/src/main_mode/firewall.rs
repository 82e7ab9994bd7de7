//! Optional nftables rules, in tables of their own per network (`ip sticky_vxlan_<name>` and
//! `ip6 sticky_vxlan_<name>`, see [`table_name`]):
//!
//! - `ipMasq`: pods' IPv4 traffic leaving the cluster CIDR is masqueraded:
//!   `ip saddr <node subnet> ip daddr != <clusterCIDR> masquerade` (postrouting, srcnat), in
//!   the `ip` table; traffic to other pods never is.
//! - `peerOnlyPort`: the VXLAN UDP port accepts packets from configured peers only:
//!   `udp dport <port> ip saddr != { <peer ips> } counter drop` (input, just before filter),
//!   in the table of the underlay's family (`ip6 saddr` in the `ip6` one).
//!
//! Every rewrite decides each table the network owns, in both families ([`tables`]): a table
//! holding a wanted rule is replaced whole, every other one is deleted, all in one `nft -f -`
//! transaction; so an option turned off or an underlay moved to the other family leaves no
//! rule behind. With neither option set, the tables that exist are deleted
//! ([`remove_present`]: `nft list tables` first, so a node that never used nftables needs no
//! `nft`). Tables of any other name are never touched. While the peers file cannot be used,
//! the peers still programmed on the VTEP stay allowed too (a broken file never cuts a node
//! off, in the firewall as on the VTEP).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use sticky_overlay::config::Config;
pub use sticky_overlay::nft::{Error, Family, Table};

/// The table name: `sticky_vxlan_` + the network name with ASCII letters and digits kept and
/// every other byte written `_` + two hex digits (`edge-1` → `edge_2d1`, `edge_1` →
/// `edge_5f1`), so two networks never share a table.
pub(crate) fn table_name(network: &str) -> String {
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

/// What a rewrite does with every table the network owns.
#[derive(Debug, PartialEq, Eq)]
pub struct Tables {
    /// Tables replaced whole, each with its chains (nft syntax, inside `table … { }`).
    pub write: Vec<(Table, String)>,
    /// The network's other tables: deleted.
    pub delete: Vec<Table>,
}

/// Every table the network may own: [`table_name`] in both families, and the name earlier
/// releases gave it ([`legacy_table_name`]) in both where that is no network's current name.
fn owned(network: &str) -> Vec<Table> {
    let current = table_name(network);
    let legacy = legacy_table_name(network);
    let mut names = vec![current.clone()];
    if legacy != current && !is_current_name(&legacy) {
        names.push(legacy);
    }
    let mut all = Vec::new();
    for family in [Family::Ip, Family::Ip6] {
        for name in &names {
            all.push(Table {
                family,
                name: name.clone(),
            });
        }
    }
    all
}

/// Which of the network's tables hold rules for this config, and which are deleted (pure).
/// `subnet` is the node's IPv4 pod subnet, `local` the node's underlay address and `allowed`
/// the underlay addresses the VXLAN port accepts (of `local`'s family).
pub fn tables(cfg: &Config, subnet: Option<IpNet>, local: IpAddr, allowed: &[IpAddr]) -> Tables {
    let mut ip = String::new();
    let mut ip6 = String::new();
    if cfg.ip_masq
        && let (Some(subnet), Some(cluster)) = (subnet, cfg.cluster_cidr)
        && cluster.addr().is_ipv4()
    {
        ip.push_str(&format!(
            "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {subnet} ip daddr != {cluster} masquerade\n  }}\n"
        ));
    }
    if cfg.peer_only_port {
        let allowed: BTreeSet<IpAddr> = allowed
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == local.is_ipv6())
            .collect();
        let peers: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        let saddr = if local.is_ipv6() {
            "ip6 saddr"
        } else {
            "ip saddr"
        };
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
        if local.is_ipv6() {
            ip6.push_str(&chain);
        } else {
            ip.push_str(&chain);
        }
    }
    let current = table_name(&cfg.name);
    let mut write = Vec::new();
    for (family, chains) in [(Family::Ip, ip), (Family::Ip6, ip6)] {
        if !chains.is_empty() {
            let name = current.clone();
            write.push((Table { family, name }, chains));
        }
    }
    let delete = owned(&cfg.name)
        .into_iter()
        .filter(|t| !write.iter().any(|(w, _)| w == t))
        .collect();
    Tables { write, delete }
}

impl Tables {
    /// The `nft -f -` script that deletes every table of the network and writes the wanted
    /// ones again, in one transaction (`table … {}` first, so deleting one that is not there
    /// is no error); `None` when no table is written (then [`remove_present`] deletes those
    /// that exist, without needing nftables where none ever was).
    pub fn script(&self) -> Option<String> {
        if self.write.is_empty() {
            return None;
        }
        let mut s = String::new();
        for t in self.write.iter().map(|(t, _)| t).chain(&self.delete) {
            s.push_str(&format!("table {t} {{}}\ndelete table {t}\n"));
        }
        for (t, chains) in &self.write {
            s.push_str(&format!("table {t} {{\n{chains}}}\n"));
        }
        Some(s)
    }
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
        let script = |subnet, local, allowed: &[IpAddr]| {
            tables(&cfg, subnet, local, allowed).script().unwrap()
        };
        let s = script(subnet, local, &["192.0.2.2".parse().unwrap()]);
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
        let s = script(subnet, local, &allowed);
        assert!(
            s.contains("udp dport 8472 ip saddr != { 192.0.2.2, 192.0.2.3 } counter drop"),
            "{s}"
        );
        // An IPv6 underlay: the VXLAN port's rule in an ip6 table, the masquerade (IPv4
        // pods) where it was; both tables replaced.
        let local6: IpAddr = "2001:db8::1".parse().unwrap();
        let s = script(subnet, local6, &["2001:db8::2".parse().unwrap()]);
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
        let names_made: BTreeSet<String> = names.iter().map(|n| table_name(n)).collect();
        assert_eq!(names_made.len(), names.len(), "{names_made:?}");
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
        let s = tables(&cfg("edge_2d1"), None, "192.0.2.1".parse().unwrap(), &[])
            .script()
            .unwrap();
        assert!(!s.contains("delete table ip sticky_vxlan_edge_2d1"), "{s}");
    }

    /// Each option and underlay family: which tables are written and which deleted. Every
    /// table the network owns is one or the other, in both families, so turning an option
    /// off or moving the underlay leaves no rule behind.
    #[test]
    fn every_table_of_the_network_is_written_or_deleted() {
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let cases: &[(serde_json::Value, IpAddr, &[&str])] = &[
            (
                json!({"ipMasq": true, "clusterCIDR": "10.244.0.0/16", "peerOnlyPort": true}),
                v4,
                &["ip"],
            ),
            (
                json!({"ipMasq": true, "clusterCIDR": "10.244.0.0/16", "peerOnlyPort": true}),
                v6,
                &["ip", "ip6"],
            ),
            (
                json!({"ipMasq": true, "clusterCIDR": "10.244.0.0/16"}),
                v4,
                &["ip"],
            ),
            (
                json!({"ipMasq": true, "clusterCIDR": "10.244.0.0/16"}),
                v6,
                &["ip"],
            ),
            (json!({"peerOnlyPort": true}), v4, &["ip"]),
            (json!({"peerOnlyPort": true}), v6, &["ip6"]),
            // ipMasq without an IPv4 cluster CIDR has no rule: no table.
            (json!({"ipMasq": true, "clusterCIDR": "fd00::/48"}), v4, &[]),
            (json!({}), v4, &[]),
            (json!({}), v6, &[]),
        ];
        let subnet = Some("10.244.1.0/24".parse().unwrap());
        for (extra, local, written) in cases {
            let mut conf = json!({"vni": 1, "ipam": {"type": "host-local"}});
            conf.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let cfg = Config::from_json("edge-1", &conf).unwrap();
            let t = tables(&cfg, subnet, *local, &["192.0.2.2".parse().unwrap()]);
            let shown = |ts: Vec<&Table>| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
            let want_written: Vec<String> = written
                .iter()
                .map(|f| format!("{f} sticky_vxlan_edge_2d1"))
                .collect();
            assert_eq!(
                shown(t.write.iter().map(|(t, _)| t).collect()),
                want_written,
                "{extra} on {local}"
            );
            let mut all = shown(t.write.iter().map(|(t, _)| t).chain(&t.delete).collect());
            all.sort();
            assert_eq!(
                all,
                [
                    "ip sticky_vxlan_edge_1",
                    "ip sticky_vxlan_edge_2d1",
                    "ip6 sticky_vxlan_edge_1",
                    "ip6 sticky_vxlan_edge_2d1"
                ],
                "{extra} on {local}: every table owned is written or deleted"
            );
            // The script replaces or deletes each one in one transaction; with nothing
            // written, the tables that exist are removed instead.
            match t.script() {
                None => assert!(written.is_empty()),
                Some(s) => {
                    for table in &all {
                        assert!(s.contains(&format!("delete table {table}\n")), "{s}");
                    }
                }
            }
        }
    }
}
