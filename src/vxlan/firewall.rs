//! Optional nftables rules, in one table of their own per network (`ip sticky_vxlan_<name>`):
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
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use super::Error;
use super::config::Config;
use super::node::Node;

/// The table name: `sticky_vxlan_` + the network name with anything but letters, digits and
/// `_` turned into `_`.
pub fn table_name(network: &str) -> String {
    let clean: String = network
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("sticky_vxlan_{clean}")
}

/// The nft script for this config, or `None` when no rule is wanted. `kept` are underlay
/// addresses allowed besides the remote peers (the peers still programmed while the peers file
/// cannot be used).
pub fn script(cfg: &Config, node: &Node, kept: &[Ipv4Addr]) -> Option<String> {
    if !cfg.ip_masq && !cfg.peer_only_port {
        return None;
    }
    let table = table_name(&cfg.name);
    let mut s = format!("table ip {table} {{}}\ndelete table ip {table}\ntable ip {table} {{\n");
    if cfg.ip_masq
        && let (Some(subnet), Some(cluster)) = (node.subnet_v4(), cfg.cluster_cidr)
        && cluster.addr().is_ipv4()
    {
        s.push_str(&format!(
                    "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {subnet} ip daddr != {cluster} masquerade\n  }}\n"
                ));
    }
    if cfg.peer_only_port {
        let allowed: BTreeSet<Ipv4Addr> = node
            .remote
            .iter()
            .map(|p| p.ip)
            .chain(kept.iter().copied())
            .collect();
        let peers: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        let rule = if peers.is_empty() {
            format!("udp dport {} counter drop", cfg.port)
        } else {
            format!(
                "udp dport {} ip saddr != {{ {} }} counter drop",
                cfg.port,
                peers.join(", ")
            )
        };
        s.push_str(&format!(
            "  chain input {{\n    type filter hook input priority filter - 1; policy accept;\n    {rule}\n  }}\n"
        ));
    }
    s.push_str("}\n");
    Some(s)
}

/// Installs the rules with `nft -f -`; `kept` as in [`script`].
pub fn apply(cfg: &Config, node: &Node, kept: &[Ipv4Addr]) -> Result<(), Error> {
    let Some(script) = script(cfg, node, kept) else {
        return Ok(());
    };
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::Firewall(format!("running nft (needed by ipMasq/peerOnlyPort): {e}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| Error::Firewall(format!("writing to nft: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Firewall(format!("waiting for nft: {e}")))?;
    if !out.status.success() {
        return Err(Error::Firewall(format!(
            "nft refused the rules ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::link::Link;
    use crate::vxlan::peers::Peer;
    use serde_json::json;

    #[test]
    fn rules_for_masq_and_peer_only_port() {
        let cfg = Config::from_json(
            "edge-1",
            &json!({"vni": 1, "ipMasq": true, "clusterCIDR": "10.244.0.0/16",
                    "peerOnlyPort": true, "ipam": {"type": "host-local"}}),
        )
        .unwrap();
        let peer = |ip: &str, s: &str| Peer {
            ip: ip.parse().unwrap(),
            subnets: vec![s.parse().unwrap()],
            mac: None,
        };
        let node = Node {
            local_ip: "192.0.2.1".parse().unwrap(),
            underlay: Link::default(),
            mtu: 1450,
            local: peer("192.0.2.1", "10.244.1.0/24"),
            remote: vec![peer("192.0.2.2", "10.244.2.0/24")],
            peers_file_error: None,
        };
        let s = script(&cfg, &node, &[]).unwrap();
        assert!(s.contains("table ip sticky_vxlan_edge_1 {"), "{s}");
        assert!(
            s.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 masquerade"),
            "{s}"
        );
        assert!(
            s.contains("udp dport 8472 ip saddr != { 192.0.2.2 } counter drop"),
            "{s}"
        );
        let kept = ["192.0.2.3".parse().unwrap(), "192.0.2.2".parse().unwrap()];
        let s = script(&cfg, &node, &kept).unwrap();
        assert!(
            s.contains("udp dport 8472 ip saddr != { 192.0.2.2, 192.0.2.3 } counter drop"),
            "programmed peers stay allowed while the peers file is broken: {s}"
        );
    }
}
