//! One Node object → its peer entry, or why it has none (pure). What the whole list may hold
//! is [`super::table`]'s, and what a change may remove [`super::guard`]'s.
//!
//! For every node: underlay = the annotation `sticky-cni.io/underlay-ip` if set, else (for a
//! flannel node) flannel's `public-ip`, else the first IPv4 `InternalIP` of
//! `status.addresses`; subnets = `spec.podCIDRs`, else `spec.podCIDR`. A node with no pod
//! CIDR yet is skipped (and said so). A node that runs flannel (flannel's `backend-data`
//! annotation carries a `VtepMAC`) and has no `sticky-cni.io/` annotation gets that MAC.
//! Entries are checked by the peers file's own rules ([`crate::vxlan::peers`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::objects::Node;
use crate::vxlan::peers::{Peer, PeerEntry};

/// Sets a node's underlay address explicitly.
pub const UNDERLAY_ANNOTATION: &str = "sticky-cni.io/underlay-ip";
/// Any annotation under this prefix marks a node as run by sticky-cni.
pub const MARKER_PREFIX: &str = "sticky-cni.io/";
/// The annotation the agent sets on its own node when it publishes flannel's annotations.
pub const KEPT_MAC_ANNOTATION: &str = "sticky-cni.io/kept-mac";
pub const FLANNEL_BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
pub const FLANNEL_BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
pub const FLANNEL_PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";
pub const FLANNEL_KUBE_MANAGED: &str = "flannel.alpha.coreos.com/kube-subnet-manager";

/// Why a node is not a peer (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("has no pod CIDR yet (spec.podCIDRs is empty: is --allocate-node-cidrs on?)")]
    NoPodCidr,
    #[error(
        "has no IPv4 underlay address (no {UNDERLAY_ANNOTATION} annotation, no IPv4 InternalIP)"
    )]
    NoUnderlay,
    #[error("annotation {key} = {value:?} is not {expected}")]
    BadAnnotation {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("pod CIDR {0:?} is not a CIDR")]
    BadCidr(String),
    #[error("{0}")]
    Invalid(String),
}

fn is_sticky(node: &Node) -> bool {
    node.metadata
        .annotations
        .keys()
        .any(|k| k.starts_with(MARKER_PREFIX))
}

/// flannel's VTEP MAC for a flannel node (none for a sticky-cni node or without one).
fn flannel_mac(node: &Node) -> Result<Option<String>, Skip> {
    if is_sticky(node) {
        return Ok(None);
    }
    let Some(data) = node.metadata.annotations.get(FLANNEL_BACKEND_DATA) else {
        return Ok(None);
    };
    let bad = || Skip::BadAnnotation {
        key: FLANNEL_BACKEND_DATA,
        value: data.clone(),
        expected: "flannel's {\"VNI\": n, \"VtepMAC\": \"..\"}",
    };
    let v: serde_json::Value = serde_json::from_str(data).map_err(|_| bad())?;
    match v.get("VtepMAC") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(m)) => Ok(Some(m.clone())),
        Some(_) => Err(bad()),
    }
}

fn annotation_ip(node: &Node, key: &'static str) -> Result<Option<Ipv4Addr>, Skip> {
    match node.metadata.annotations.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<Ipv4Addr>()
            .map(Some)
            .map_err(|_| Skip::BadAnnotation {
                key,
                value: v.clone(),
                expected: "an IPv4 address",
            }),
    }
}

fn underlay(node: &Node, flannel: bool) -> Result<Ipv4Addr, Skip> {
    if let Some(ip) = annotation_ip(node, UNDERLAY_ANNOTATION)? {
        return Ok(ip);
    }
    if flannel && let Some(ip) = annotation_ip(node, FLANNEL_PUBLIC_IP)? {
        return Ok(ip);
    }
    node.status
        .addresses
        .iter()
        .filter(|a| a.kind == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
        .ok_or(Skip::NoUnderlay)
}

/// The underlay address of a node run by sticky-cni (the agent's own, when it publishes).
pub fn own_underlay(node: &Node) -> Result<Ipv4Addr, Skip> {
    underlay(node, false)
}

/// The peer entry a Node object stands for, IPv4 subnet first.
pub fn node_entry(node: &Node) -> Result<PeerEntry, Skip> {
    let cidrs: Vec<&String> = if node.spec.pod_cidrs.is_empty() {
        node.spec
            .pod_cidr
            .iter()
            .filter(|c| !c.is_empty())
            .collect()
    } else {
        node.spec.pod_cidrs.iter().collect()
    };
    if cidrs.is_empty() {
        return Err(Skip::NoPodCidr);
    }
    let mut subnets = cidrs
        .into_iter()
        .map(|c| c.parse::<IpNet>().map_err(|_| Skip::BadCidr(c.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    subnets.sort_by_key(|s| s.addr().is_ipv6());
    let mac = flannel_mac(node)?;
    let ip = underlay(node, mac.is_some())?;
    Ok(PeerEntry {
        ip: IpAddr::V4(ip),
        subnets,
        mac,
    })
}

/// The peers file's text for `peers`: a JSON list, sorted by underlay address, one entry
/// per line.
pub fn file_text(peers: &[Peer]) -> Vec<u8> {
    let mut sorted: Vec<&Peer> = peers.iter().collect();
    sorted.sort_by_key(|p| p.ip);
    let mut out = b"[\n".to_vec();
    for (i, p) in sorted.iter().enumerate() {
        let entry = PeerEntry {
            ip: p.ip,
            subnets: p.subnets.clone(),
            mac: p.mac.map(|m| crate::netlink::link::format_mac(&m)),
        };
        out.extend_from_slice(b"  ");
        // A PeerEntry always serializes (plain strings and lists).
        out.extend_from_slice(&serde_json::to_vec(&entry).unwrap_or_default());
        out.extend_from_slice(if i + 1 < sorted.len() { b",\n" } else { b"\n" });
    }
    out.extend_from_slice(b"]\n");
    out
}

/// What changed between two peer lists, one line each, for the log.
pub fn describe_changes(old: &[Peer], new: &[Peer]) -> Vec<String> {
    let by_ip =
        |l: &[Peer]| -> BTreeMap<IpAddr, Peer> { l.iter().map(|p| (p.ip, p.clone())).collect() };
    let (old, new) = (by_ip(old), by_ip(new));
    let show = |p: &Peer| {
        let subnets: Vec<String> = p.subnets.iter().map(ToString::to_string).collect();
        let mac = p
            .mac
            .map(|m| format!(" mac {}", crate::netlink::link::format_mac(&m)))
            .unwrap_or_default();
        format!("{} subnets {}{mac}", p.ip, subnets.join(","))
    };
    let mut out = Vec::new();
    for (ip, p) in &new {
        match old.get(ip) {
            None => out.push(format!("peer added: {}", show(p))),
            Some(o) if o != p => out.push(format!("peer changed: {} (was {})", show(p), show(o))),
            Some(_) => {}
        }
    }
    for (ip, p) in &old {
        if !new.contains_key(ip) {
            out.push(format!("peer removed: {} (its Node is gone)", show(p)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    /// A Node as a real API server returns it (kubeadm worker, trimmed of managedFields).
    pub fn node_json(name: &str, internal_ip: &str, cidrs: &[&str], annotations: &str) -> String {
        let cidrs_json: Vec<String> = cidrs.iter().map(|c| format!("\"{c}\"")).collect();
        let pod_cidr = cidrs
            .first()
            .map(|c| {
                format!(
                    "\"podCIDR\":\"{c}\",\"podCIDRs\":[{}],",
                    cidrs_json.join(",")
                )
            })
            .unwrap_or_default();
        format!(
            r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{name}","uid":"6f1c7a52-9d7e-4c1e-9a51-0d6c2b1f0001","resourceVersion":"1042","creationTimestamp":"2026-11-20T10:00:00Z","labels":{{"kubernetes.io/arch":"amd64","kubernetes.io/hostname":"{name}","kubernetes.io/os":"linux"}},"annotations":{{{annotations}}}}},"spec":{{{pod_cidr}"taints":[]}},"status":{{"capacity":{{"cpu":"2","memory":"4026372Ki","pods":"110"}},"conditions":[{{"type":"Ready","status":"True","lastHeartbeatTime":"2026-11-25T01:00:00Z","lastTransitionTime":"2026-11-20T10:01:00Z","reason":"KubeletReady","message":"kubelet is posting ready status"}}],"addresses":[{{"type":"InternalIP","address":"{internal_ip}"}},{{"type":"Hostname","address":"{name}"}}],"daemonEndpoints":{{"kubeletEndpoint":{{"Port":10250}}}},"nodeInfo":{{"machineID":"0c9d","systemUUID":"0c9d","bootID":"b1","kernelVersion":"6.1.0","osImage":"Debian GNU/Linux 12 (bookworm)","containerRuntimeVersion":"containerd://1.7.24","kubeletVersion":"v1.31.4","kubeProxyVersion":"v1.31.4","operatingSystem":"linux","architecture":"amd64"}}}}}}"#
        )
    }

    fn node(name: &str, ip: &str, cidrs: &[&str], annotations: &str) -> Node {
        serde_json::from_str(&node_json(name, ip, cidrs, annotations)).unwrap()
    }

    fn nodes(list: Vec<Node>) -> BTreeMap<String, Node> {
        list.into_iter()
            .map(|n| (n.metadata.name.clone(), n))
            .collect()
    }

    #[test]
    fn internal_ip_unless_the_underlay_annotation_says_otherwise() {
        let e = node_entry(&node("a", "192.0.2.1", &["10.244.1.0/24"], "")).unwrap();
        assert_eq!(e.ip, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.mac, None);
        let e = node_entry(&node(
            "a",
            "192.0.2.1",
            &["10.244.1.0/24"],
            r#""sticky-cni.io/underlay-ip":"198.51.100.7""#,
        ))
        .unwrap();
        assert_eq!(e.ip, "198.51.100.7".parse::<IpAddr>().unwrap());
        let bad = node_entry(&node(
            "a",
            "192.0.2.1",
            &["10.244.1.0/24"],
            r#""sticky-cni.io/underlay-ip":"eth0""#,
        ));
        assert!(matches!(bad, Err(Skip::BadAnnotation { .. })));
        // Only an IPv6 InternalIP: no underlay (IPv6 underlays are not supported).
        let v6 = node_entry(&node("a", "2001:db8::1", &["10.244.1.0/24"], ""));
        assert_eq!(v6, Err(Skip::NoUnderlay));
    }

    #[test]
    fn dual_stack_pod_cidrs_ipv4_first_and_the_legacy_field() {
        let e = node_entry(&node(
            "a",
            "192.0.2.1",
            &["fd00:1::/64", "10.244.1.0/24"],
            "",
        ))
        .unwrap();
        let s: Vec<String> = e.subnets.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["10.244.1.0/24", "fd00:1::/64"]);
        let mut legacy = node("a", "192.0.2.1", &[], "");
        legacy.spec.pod_cidr = Some("10.244.7.0/24".into());
        assert_eq!(
            node_entry(&legacy).unwrap().subnets,
            vec!["10.244.7.0/24".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn flannel_nodes_bring_their_mac_and_public_ip_sticky_nodes_do_not() {
        let flannel = r#""flannel.alpha.coreos.com/backend-data":"{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:11:22:33\"}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"192.0.2.44""#;
        let e = node_entry(&node("f", "192.0.2.4", &["10.244.4.0/24"], flannel)).unwrap();
        assert_eq!(e.mac.as_deref(), Some("6e:3c:8a:11:22:33"));
        assert_eq!(e.ip, "192.0.2.44".parse::<IpAddr>().unwrap());
        // The same annotations published by a sticky-cni agent: its kept MAC is computed.
        let sticky = format!(r#"{flannel},"sticky-cni.io/kept-mac":"0a:01:c0:00:02:04""#);
        let e = node_entry(&node("s", "192.0.2.4", &["10.244.4.0/24"], &sticky)).unwrap();
        assert_eq!(e.mac, None);
        assert_eq!(e.ip, "192.0.2.4".parse::<IpAddr>().unwrap());
        let broken = r#""flannel.alpha.coreos.com/backend-data":"not json""#;
        assert!(matches!(
            node_entry(&node("f", "192.0.2.4", &["10.244.4.0/24"], broken)),
            Err(Skip::BadAnnotation { .. })
        ));
    }

    #[test]
    fn the_written_file_reads_back_as_the_same_peers() {
        let list = nodes(vec![
            node("b", "192.0.2.2", &["10.244.2.0/24", "fd00:2::/64"], ""),
            node(
                "a",
                "192.0.2.1",
                &["10.244.1.0/24"],
                r#""flannel.alpha.coreos.com/backend-data":"{\"VtepMAC\":\"6e:3c:8a:11:22:33\"}""#,
            ),
        ]);
        let peers: Vec<Peer> = list
            .values()
            .map(|n| {
                crate::vxlan::peers::check_entries(&[node_entry(n).unwrap()])
                    .unwrap()
                    .remove(0)
            })
            .collect();
        let text = file_text(&peers);
        assert_eq!(crate::vxlan::peers::parse_file(&text).unwrap(), peers);
        assert!(String::from_utf8_lossy(&text).starts_with("[\n  {\"ip\":\"192.0.2.1\""));
    }

    fn peer(n: u8) -> Peer {
        Peer {
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
            subnets: vec![format!("10.244.{n}.0/24").parse().unwrap()],
            mac: None,
        }
    }

    #[test]
    fn changes_are_described_one_line_each() {
        let mut moved = peer(2);
        moved.subnets = vec!["10.244.9.0/24".parse().unwrap()];
        let lines = describe_changes(&[peer(1), peer(2)], &[moved, peer(3)]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("peer added: 192.0.2.3")));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("peer changed: 192.0.2.2"))
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("peer removed: 192.0.2.1"))
        );
    }
}
