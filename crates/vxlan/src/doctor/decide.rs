//! From what was measured to what is wrong: the facts of the node and of each peer's probes
//! ([`NodeFacts`], [`PeerFacts`]) become findings, each with a stable [`Cause`] code, the peer
//! it concerns (none for the node's own), one line of detail and one line of fix. Pure: no
//! socket, no file, no clock, so every rule is a row of a table test.
//!
//! The order of the rules is the order of certainty. The node's own state comes first: with no
//! VTEP, every overlay probe fails and blaming the peers would send the operator the wrong way.
//! For a peer, the underlay answers or not (`peer-down`), then the small probe through the
//! overlay (a counter that moved during the probes tells `checksum` and `rp-filter` from a plain
//! `vxlan-blocked`), then the probe of the pod MTU (`mtu`).

#[path = "decide_sites.rs"]
pub mod sites;

use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use serde::Serialize;

/// The stable code of a finding (`cause` in `--json`; docs/operations.md lists each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The peer's underlay address answers, nothing crosses the VXLAN port.
    VxlanBlocked,
    /// Small packets cross the overlay, packets of the pod MTU do not.
    Mtu,
    /// VXLAN packets arrive and are dropped for bad UDP checksums (the offload bug).
    Checksum,
    /// A forward-hook chain drops what no rule accepts: forwarded pod traffic.
    ForwardDrop,
    /// Strict reverse-path filtering dropped the probes' answers.
    RpFilter,
    /// The conntrack table is full: new flows are dropped.
    ConntrackFull,
    /// The peer's underlay address does not answer at all.
    PeerDown,
    /// This node's VTEP is missing, down, or not this network's.
    NoVtep,
    /// `net.ipv4.ip_forward` is off: pod traffic is not routed.
    ForwardingOff,
    /// The bridge is missing or lacks its gateway address while pods use it.
    BridgeAddress,
    /// Sites: the tunnel carrying a remote site is down, or nothing crosses it.
    TunnelDown,
    /// Sites: small packets cross the tunnel, packets of `wanMtu` less WireGuard's do not.
    WanMtu,
    /// Sites: a relayed site's relay does not carry (the tunnel to the relay is down).
    RelayUnreachable,
    /// Sites: the direct tunnel to a site behind NAT could not be punched (relayed instead).
    PunchFailing,
    /// Sites: the plan has no path to a remote site (no active gateway, no relay).
    SiteUnreachable,
}

impl Cause {
    /// The code as printed (`vxlan-blocked`, ...).
    pub fn code(self) -> &'static str {
        match self {
            Cause::VxlanBlocked => "vxlan-blocked",
            Cause::Mtu => "mtu",
            Cause::Checksum => "checksum",
            Cause::ForwardDrop => "forward-drop",
            Cause::RpFilter => "rp-filter",
            Cause::ConntrackFull => "conntrack-full",
            Cause::PeerDown => "peer-down",
            Cause::NoVtep => "no-vtep",
            Cause::ForwardingOff => "forwarding-off",
            Cause::BridgeAddress => "bridge-address",
            Cause::TunnelDown => "tunnel-down",
            Cause::WanMtu => "wan-mtu",
            Cause::RelayUnreachable => "relay-unreachable",
            Cause::PunchFailing => "punch-failing",
            Cause::SiteUnreachable => "site-unreachable",
        }
    }
}

/// One thing found: what, about whom, why it is believed, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub cause: Cause,
    /// The peer's underlay address; `None` for a finding about this node or a site.
    pub peer: Option<IpAddr>,
    /// The remote site a sites finding concerns (absent from the others' JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    pub detail: String,
    pub fix: String,
}

/// This network's VTEP as the kernel shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vtep {
    Ready,
    Missing,
    /// It exists but carries no marker of this network (another network's, or someone else's).
    NotOurs,
    Down,
}

/// The network's bridge, as far as pods depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bridge {
    /// It holds an address of this node's pod subnet, or no pod uses it yet.
    Ready,
    /// Pods are attached to it but it holds no address of `subnet`.
    NoAddress { subnet: String },
    /// Pods exist but the bridge does not.
    Missing,
}

/// A base chain on the forward hook whose policy is drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropChain {
    /// `ip`, `inet`.
    pub family: String,
    pub table: String,
    pub chain: String,
    /// The values the chain's accepting rules compare with (addresses, interface names).
    pub accepted: Vec<Vec<u8>>,
}

/// What was measured on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub vtep_name: String,
    pub vtep: Vtep,
    pub bridge_name: String,
    pub bridge: Bridge,
    /// `None` when it could not be read.
    pub ip_forward: Option<bool>,
    pub forward_drop: Vec<DropChain>,
    /// Interfaces of the path (underlay, VTEP, bridge) whose effective `rp_filter` is strict.
    pub strict_rp_filter: Vec<String>,
    /// The device holding this node's underlay address: where peers' packets arrive.
    pub underlay_dev: String,
    /// This node's underlay address: its family is the VXLAN packets'.
    pub underlay: IpAddr,
    /// `(count, max)` of the conntrack table, when conntrack is loaded.
    pub conntrack: Option<(u64, u64)>,
    /// Packets dropped for bad UDP checksums while the probes ran (`Udp InCsumErrors` and
    /// `Udp6InCsumErrors`).
    pub csum_errors: u64,
    /// Packets dropped by reverse-path filtering while the probes ran (`IPReversePathFilter`).
    pub rp_filter_drops: u64,
    pub port: u16,
    /// The size of the full probe: the pod MTU.
    pub pod_mtu: u32,
    /// The network's config file, for the fixes that change it.
    pub config: String,
    /// This node's IPv4 pod subnet: a drop chain whose rules accept it is no finding.
    pub pod_subnet: Option<Ipv4Net>,
    /// The pods of the whole network (`clusterCIDR`, or the prefix covering every subnet),
    /// for the fixes.
    pub cluster: String,
}

/// What the probes to one peer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFacts {
    pub peer: IpAddr,
    /// An ICMP echo to its underlay address was answered.
    pub underlay: bool,
    /// A small echo through the overlay (to its VTEP address) was answered.
    pub small: bool,
    /// An echo of the pod MTU, DF set, through the overlay was answered.
    pub full: bool,
    /// The largest of the smaller sizes tried through the overlay that was answered, when the
    /// pod MTU was not.
    pub largest: Option<u32>,
    /// The device this node's route to the peer leaves by.
    pub route_dev: Option<String>,
}

/// Conntrack counts as full from this share of its maximum on (new flows start to be dropped
/// at the maximum; a table this close gets there with the next burst).
const CONNTRACK_FULL_PERCENT: u64 = 98;

/// Every finding, the node's first, then the peers' in their order.
/// A full conntrack table drops every new flow of the node, the probes' too: then no peer is
/// blamed.
pub fn decide(node: &NodeFacts, peers: &[PeerFacts]) -> Vec<Finding> {
    let mut found = node_findings(node);
    if found.iter().any(|f| f.cause == Cause::ConntrackFull) {
        return found;
    }
    let overlay_usable = node.vtep == Vtep::Ready;
    found.extend(
        peers
            .iter()
            .filter_map(|p| peer_finding(node, p, overlay_usable)),
    );
    found
}

fn node_finding(cause: Cause, detail: String, fix: String) -> Finding {
    Finding {
        cause,
        peer: None,
        site: None,
        detail,
        fix,
    }
}

fn node_findings(node: &NodeFacts) -> Vec<Finding> {
    let mut found = Vec::new();
    found.extend(vtep_finding(node));
    if node.ip_forward == Some(false) {
        found.push(node_finding(
            Cause::ForwardingOff,
            "net.ipv4.ip_forward is 0: this node routes no pod traffic".into(),
            "sysctl -w net.ipv4.ip_forward=1 (and set it in /etc/sysctl.d to keep it)".into(),
        ));
    }
    found.extend(bridge_finding(node));
    found.extend(
        node.forward_drop
            .iter()
            .filter(|c| !c.accepted.iter().any(|v| lets_pods_through(node, v)))
            .map(|c| forward_drop(c, &node.cluster)),
    );
    found.extend(conntrack_finding(node));
    found
}

fn vtep_finding(node: &NodeFacts) -> Option<Finding> {
    let name = &node.vtep_name;
    let detail = match node.vtep {
        Vtep::Ready => return None,
        Vtep::Missing => format!("the VTEP {name} does not exist: nothing crosses the overlay"),
        Vtep::NotOurs => {
            format!("{name} exists but is not this network's VTEP (no sticky-vxlan marker for it)")
        }
        Vtep::Down => format!("the VTEP {name} is down: nothing crosses the overlay"),
    };
    Some(node_finding(
        Cause::NoVtep,
        detail,
        format!("sticky-vxlan reconcile --config {}", node.config),
    ))
}

fn bridge_finding(node: &NodeFacts) -> Option<Finding> {
    let name = &node.bridge_name;
    let detail = match &node.bridge {
        Bridge::Ready => return None,
        Bridge::Missing => format!("pods are attached but the bridge {name} does not exist"),
        Bridge::NoAddress { subnet } => {
            format!("the bridge {name} holds no address of {subnet}: pods have no gateway")
        }
    };
    Some(node_finding(
        Cause::BridgeAddress,
        detail,
        format!(
            "sticky-vxlan reconcile --config {} (it puts the gateway address back on the bridge)",
            node.config
        ),
    ))
}

/// Whether a value an accepting rule compares with is this node's pods: an address prefix
/// holding its pod subnet (`ip saddr 10.244.0.0/16 accept`), or the bridge's or VTEP's name
/// (`iifname "stickybr0" accept`, a wildcard prefix of it too). Which direction the rule
/// matches is not told apart.
fn lets_pods_through(node: &NodeFacts, value: &[u8]) -> bool {
    if let (Ok(octets), Some(subnet)) = (<[u8; 4]>::try_from(value), node.pod_subnet) {
        let v = Ipv4Addr::from(octets);
        return (8..=subnet.prefix_len()).any(|len| {
            Ipv4Net::new(subnet.network(), len).is_ok_and(|n| n.trunc().network() == v)
        });
    }
    let name = value.split(|b| *b == 0).next().unwrap_or_default();
    !name.is_empty()
        && [&node.bridge_name, &node.vtep_name]
            .iter()
            .any(|dev| dev.as_bytes().starts_with(name))
}

fn forward_drop(c: &DropChain, cluster: &str) -> Finding {
    let (f, t, ch) = (&c.family, &c.table, &c.chain);
    node_finding(
        Cause::ForwardDrop,
        format!(
            "chain {f} {t} {ch} on the forward hook has policy drop and no rule of it accepts the pods ({cluster}): forwarded pod traffic is dropped"
        ),
        format!(
            "nft insert rule {f} {t} {ch} ip saddr {cluster} accept; nft insert rule {f} {t} {ch} ip daddr {cluster} accept (iptables: iptables -I FORWARD -s {cluster} -j ACCEPT; iptables -I FORWARD -d {cluster} -j ACCEPT)"
        ),
    )
}

fn conntrack_finding(node: &NodeFacts) -> Option<Finding> {
    let (count, max) = node.conntrack?;
    if max == 0 || count * 100 < max * CONNTRACK_FULL_PERCENT {
        return None;
    }
    Some(node_finding(
        Cause::ConntrackFull,
        format!("the conntrack table holds {count} of {max} entries: new flows are dropped"),
        format!(
            "sysctl -w net.netfilter.nf_conntrack_max={} (and find what opens so many flows: conntrack -L)",
            max.saturating_mul(2)
        ),
    ))
}

fn peer_finding(node: &NodeFacts, p: &PeerFacts, overlay_usable: bool) -> Option<Finding> {
    let finding = |cause, detail: String, fix: String| {
        Some(Finding {
            cause,
            peer: Some(p.peer),
            site: None,
            detail,
            fix,
        })
    };
    let peer = p.peer;
    if p.small && p.full {
        return None;
    }
    if !overlay_usable {
        // The node's finding explains the overlay; only a dead underlay is news.
        return (!p.underlay).then(|| peer_down(p)).flatten();
    }
    if !p.small {
        if let Some(f) = rp_filter(node, p) {
            return Some(f);
        }
        if !p.underlay {
            return peer_down(p);
        }
        if node.csum_errors > 0 {
            return finding(
                Cause::Checksum,
                format!(
                    "{} VXLAN packet(s) from {peer} arrived with bad UDP checksums and were dropped ({})",
                    node.csum_errors,
                    if node.underlay.is_ipv4() { "Udp InCsumErrors" } else { "Udp6InCsumErrors" }
                ),
                "ethtool -K <underlay device> tx-checksum-ip-generic off on the sending node (flannel#1279), or ethtool -K <vtep> tx off".into(),
            );
        }
        return finding(
            Cause::VxlanBlocked,
            format!(
                "{peer} answers on the underlay but nothing crosses UDP port {} to it",
                node.port
            ),
            format!(
                "allow UDP {} between this node and {peer} (host firewalls on both ends, security groups)",
                node.port
            ),
        );
    }
    let passes = match p.largest {
        Some(m) => format!(", {m} bytes pass"),
        None => String::new(),
    };
    let mtu = p
        .largest
        .map_or_else(|| "a smaller \"mtu\"".into(), |m| format!("\"mtu\": {m}"));
    finding(
        Cause::Mtu,
        format!(
            "small packets reach {peer} through the overlay, packets of the pod MTU {} (DF) are lost on the way{passes}",
            node.pod_mtu
        ),
        format!(
            "set {mtu} in {} on every node, run sticky-vxlan reconcile and recreate the pods; or make every underlay on the path carry {} bytes",
            node.config,
            node.pod_mtu + sticky_overlay::config::vxlan_overhead(node.underlay)
        ),
    )
}

fn peer_down(p: &PeerFacts) -> Option<Finding> {
    Some(Finding {
        cause: Cause::PeerDown,
        peer: Some(p.peer),
        site: None,
        detail: format!(
            "{} does not answer on the underlay, nor through the overlay",
            p.peer
        ),
        fix: format!(
            "check that {} is up and reachable (ip route get {}), or remove it from the peers",
            p.peer, p.peer
        ),
    })
}

/// Reverse-path filtering is the cause when it is strict on the path and either dropped
/// packets during the probes, or the route to the peer leaves by another device than the one
/// its packets come in by (the underlay address's): then every packet of the peer fails the
/// check, its ARP requests too, so after a while nothing of it arrives to be counted. Loose
/// (2) lets asymmetric routes through.
fn rp_filter(node: &NodeFacts, p: &PeerFacts) -> Option<Finding> {
    let asymmetric = p
        .route_dev
        .as_ref()
        .filter(|d| **d != node.underlay_dev && node.strict_rp_filter.contains(&node.underlay_dev));
    let dropped = node.rp_filter_drops > 0 && !node.strict_rp_filter.is_empty();
    if asymmetric.is_none() && !dropped {
        return None;
    }
    let devs = node.strict_rp_filter.join(", ");
    let why = match asymmetric {
        Some(out) => format!(
            "the route to {} leaves by {out} while its packets come in on {}, and strict reverse-path filtering on {devs} drops them",
            p.peer, node.underlay_dev
        ),
        None => format!(
            "{} answer(s) from {} were dropped by strict reverse-path filtering on {devs} (IPReversePathFilter)",
            node.rp_filter_drops, p.peer
        ),
    };
    let keys: Vec<String> = std::iter::once("all".to_string())
        .chain(node.strict_rp_filter.iter().cloned())
        // Slashes: a device name may hold a dot (`sticky.1`), which sysctl reads as a slash.
        .map(|d| format!("net/ipv4/conf/{d}/rp_filter=2"))
        .collect();
    Some(Finding {
        cause: Cause::RpFilter,
        peer: Some(p.peer),
        site: None,
        detail: why,
        fix: format!("sysctl -w {}", keys.join(" ")),
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
