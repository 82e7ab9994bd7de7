//! One Node object → its peer entry, or why it has none (pure). What the whole list may hold
//! is [`super::table`]'s, and what a change may remove [`super::guard`]'s.
//!
//! Every Node is mapped on the network's underlay family ([`Family`]). Underlay = the
//! annotation `sticky-cni.io/underlay-ip` if set (an address of the other family leaves the
//! node out), else for a flannel node flannel's `public-ip` (IPv4) or `public-ipv6` (IPv6),
//! else the first `InternalIP` of `status.addresses` of the family that can be a node's
//! ([`sticky_overlay::peers::not_a_node`]: not loopback, link-local...). Subnets =
//! `spec.podCIDRs`, else `spec.podCIDR`. A node with no pod CIDR yet is skipped (and said so).
//! A node that runs flannel (flannel's `backend-data`, or `backend-v6-data` on an IPv6
//! underlay, carries a `VtepMAC`) and has no `sticky-cni.io/` annotation gets that MAC; one
//! whose flannel has a VTEP of the other family only is left out. Entries are checked by the
//! peers file's own rules ([`sticky_overlay::peers`]).

use std::net::IpAddr;

use ipnet::IpNet;

use super::family::Family;
use super::objects::Node;
use sticky_overlay::peers::{Peer, PeerEntry, not_a_node};
use sticky_vxlan::main_mode::change::PeerChange;

/// Sets a node's underlay address explicitly.
pub const UNDERLAY_ANNOTATION: &str = "sticky-cni.io/underlay-ip";
/// Any annotation under this prefix marks a node as run by sticky-cni.
pub const MARKER_PREFIX: &str = "sticky-cni.io/";
/// The annotation the agent sets on its own node when it publishes flannel's annotations.
pub const KEPT_MAC_ANNOTATION: &str = "sticky-cni.io/kept-mac";
pub const FLANNEL_BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
pub const FLANNEL_BACKEND_V6_DATA: &str = "flannel.alpha.coreos.com/backend-v6-data";
pub const FLANNEL_BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
pub const FLANNEL_PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";
pub const FLANNEL_PUBLIC_IPV6: &str = "flannel.alpha.coreos.com/public-ipv6";
pub const FLANNEL_KUBE_MANAGED: &str = "flannel.alpha.coreos.com/kube-subnet-manager";

/// flannel's backend data (`{"VNI": n, "VtepMAC": ".."}`) for the VTEP of `family`.
pub fn flannel_backend_data(family: Family) -> &'static str {
    match family {
        Family::V4 => FLANNEL_BACKEND_DATA,
        Family::V6 => FLANNEL_BACKEND_V6_DATA,
    }
}

/// flannel's public address of `family`.
pub fn flannel_public_ip(family: Family) -> &'static str {
    match family {
        Family::V4 => FLANNEL_PUBLIC_IP,
        Family::V6 => FLANNEL_PUBLIC_IPV6,
    }
}

/// Why a node is not a peer (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("has no pod CIDR yet (spec.podCIDRs is empty: is --allocate-node-cidrs on?)")]
    NoPodCidr,
    #[error(
        "has no {0} underlay address (no {UNDERLAY_ANNOTATION} annotation, no {0} InternalIP that can be a node's: not loopback, link-local, multicast or unspecified)"
    )]
    NoUnderlay(Family),
    #[error(
        "annotation {key} = {value} is an {} address, but this network's underlay is {family} (one network has one underlay family; see --underlay-family)",
        Family::of(*value)
    )]
    OtherFamily {
        key: &'static str,
        value: IpAddr,
        family: Family,
    },
    #[error(
        "runs flannel with an {} VTEP only (no VtepMAC in {}): it cannot be reached over this network's {family} underlay",
        family.other(),
        flannel_backend_data(*family)
    )]
    FlannelOtherFamily { family: Family },
    #[error("annotation {key} = {value:?} is not {expected}")]
    BadAnnotation {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("pod CIDR {0:?} is not a CIDR")]
    BadCidr(String),
}

fn is_sticky(node: &Node) -> bool {
    node.metadata
        .annotations
        .keys()
        .any(|k| k.starts_with(MARKER_PREFIX))
}

/// The `VtepMAC` in flannel's backend data annotation `key`, if it has one.
fn vtep_mac_in(node: &Node, key: &'static str) -> Result<Option<String>, Skip> {
    let Some(data) = node.metadata.annotations.get(key) else {
        return Ok(None);
    };
    let bad = || Skip::BadAnnotation {
        key,
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

/// flannel's VTEP MAC of `family` for a flannel node (none for a sticky-cni node or without
/// one); a node whose flannel has only a VTEP of the other family is left out.
fn flannel_mac(node: &Node, family: Family) -> Result<Option<String>, Skip> {
    if is_sticky(node) {
        return Ok(None);
    }
    if let Some(mac) = vtep_mac_in(node, flannel_backend_data(family))? {
        return Ok(Some(mac));
    }
    // The other family's data is read only to tell; a malformed one is not this network's.
    match vtep_mac_in(node, flannel_backend_data(family.other())) {
        Ok(Some(_)) => Err(Skip::FlannelOtherFamily { family }),
        _ => Ok(None),
    }
}

/// The address in annotation `key`: any family when `any_family` (refused when it is not
/// `family`, so the reason is the family), else `family` only.
fn annotation_ip(
    node: &Node,
    key: &'static str,
    family: Family,
    any_family: bool,
) -> Result<Option<IpAddr>, Skip> {
    let Some(v) = node.metadata.annotations.get(key) else {
        return Ok(None);
    };
    let expected = match (any_family, family) {
        (true, _) => "an IPv4 or IPv6 address",
        (false, Family::V4) => "an IPv4 address",
        (false, Family::V6) => "an IPv6 address",
    };
    let bad = || Skip::BadAnnotation {
        key,
        value: v.clone(),
        expected,
    };
    let ip = v.trim().parse::<IpAddr>().map_err(|_| bad())?;
    match (family.holds(ip), any_family) {
        (true, _) => Ok(Some(ip)),
        (false, true) => Err(Skip::OtherFamily {
            key,
            value: ip,
            family,
        }),
        (false, false) => Err(bad()),
    }
}

fn underlay(node: &Node, flannel: bool, family: Family) -> Result<IpAddr, Skip> {
    if let Some(ip) = annotation_ip(node, UNDERLAY_ANNOTATION, family, true)? {
        return Ok(ip);
    }
    if flannel && let Some(ip) = annotation_ip(node, flannel_public_ip(family), family, false)? {
        return Ok(ip);
    }
    node.status
        .addresses
        .iter()
        .filter(|a| a.kind == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| family.holds(*ip) && not_a_node(*ip).is_none())
        .ok_or(Skip::NoUnderlay(family))
}

/// The underlay address of a node run by sticky-cni (the agent's own, when it publishes).
pub fn own_underlay(node: &Node, family: Family) -> Result<IpAddr, Skip> {
    underlay(node, false, family)
}

/// The peer entry a Node object stands for on an underlay of `family`, IPv4 subnet first.
pub fn node_entry(node: &Node, family: Family) -> Result<PeerEntry, Skip> {
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
    let mac = flannel_mac(node, family)?;
    let ip = underlay(node, mac.is_some(), family)?;
    Ok(PeerEntry {
        carries: Vec::new(),
        ip,
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
            carries: p.carries.clone(),
            ip: p.ip,
            subnets: p.subnets.clone(),
            mac: p.mac.map(|m| sticky_netlink::link::format_mac(&m)),
        };
        out.extend_from_slice(b"  ");
        // A PeerEntry always serializes (plain strings and lists).
        out.extend_from_slice(&serde_json::to_vec(&entry).unwrap_or_default());
        out.extend_from_slice(if i + 1 < sorted.len() { b",\n" } else { b"\n" });
    }
    out.extend_from_slice(b"]\n");
    out
}

/// Every peer that differs between two lists, by address, as it was and as it is: those
/// added or changed in address order, then those removed. Each list is walked once, in
/// address order (a sort of each, already in order when written by the agent).
pub fn changes(old: &[Peer], new: &[Peer]) -> Vec<PeerChange> {
    let (old, new) = (by_address(old), by_address(new));
    let (mut came, mut gone) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    loop {
        match (old.get(i), new.get(j)) {
            (Some(&o), Some(&n)) if o.ip == n.ip => {
                if o != n {
                    came.push((Some(o.clone()), Some(n.clone())));
                }
                i += 1;
                j += 1;
            }
            (Some(&o), n) if n.is_none_or(|n| o.ip < n.ip) => {
                gone.push((Some(o.clone()), None));
                i += 1;
            }
            (_, Some(&n)) => {
                came.push((None, Some(n.clone())));
                j += 1;
            }
            _ => break,
        }
    }
    came.extend(gone);
    came
}

fn by_address(list: &[Peer]) -> Vec<&Peer> {
    let mut sorted: Vec<&Peer> = list.iter().collect();
    sorted.sort_by_key(|p| p.ip);
    sorted
}

/// What [`changes`] found, one line each, for the log.
pub fn describe(changes: &[PeerChange]) -> Vec<String> {
    let show = |p: &Peer| {
        let subnets: Vec<String> = p.subnets.iter().map(ToString::to_string).collect();
        let mac = p
            .mac
            .map(|m| format!(" mac {}", sticky_netlink::link::format_mac(&m)))
            .unwrap_or_default();
        format!("{} subnets {}{mac}", p.ip, subnets.join(","))
    };
    changes
        .iter()
        .filter_map(|c| match c {
            (None, Some(p)) => Some(format!("peer added: {}", show(p))),
            (Some(o), Some(p)) => Some(format!("peer changed: {} (was {})", show(p), show(o))),
            (Some(o), None) => Some(format!("peer removed: {} (its Node is gone)", show(o))),
            (None, None) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;

    const V4: Family = Family::V4;
    const V6: Family = Family::V6;

    /// A Node as a real API server returns it (kubeadm worker, trimmed of managedFields);
    /// `internal_ips` is one InternalIP or several, comma-separated (a dual-stack kubelet's
    /// `--node-ip=192.0.2.1,2001:db8::1` lists them in that order).
    pub fn node_json(name: &str, internal_ips: &str, cidrs: &[&str], annotations: &str) -> String {
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
        let addresses: Vec<String> = internal_ips
            .split(',')
            .map(|ip| format!(r#"{{"type":"InternalIP","address":"{ip}"}}"#))
            .collect();
        let addresses = addresses.join(",");
        format!(
            r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{name}","uid":"6f1c7a52-9d7e-4c1e-9a51-0d6c2b1f0001","resourceVersion":"1042","creationTimestamp":"2026-11-20T10:00:00Z","labels":{{"kubernetes.io/arch":"amd64","kubernetes.io/hostname":"{name}","kubernetes.io/os":"linux"}},"annotations":{{{annotations}}}}},"spec":{{{pod_cidr}"taints":[]}},"status":{{"capacity":{{"cpu":"2","memory":"4026372Ki","pods":"110"}},"conditions":[{{"type":"Ready","status":"True","lastHeartbeatTime":"2026-11-25T01:00:00Z","lastTransitionTime":"2026-11-20T10:01:00Z","reason":"KubeletReady","message":"kubelet is posting ready status"}}],"addresses":[{addresses},{{"type":"Hostname","address":"{name}"}}],"daemonEndpoints":{{"kubeletEndpoint":{{"Port":10250}}}},"nodeInfo":{{"machineID":"0c9d","systemUUID":"0c9d","bootID":"b1","kernelVersion":"6.1.0","osImage":"Debian GNU/Linux 12 (bookworm)","containerRuntimeVersion":"containerd://1.7.24","kubeletVersion":"v1.31.4","kubeProxyVersion":"v1.31.4","operatingSystem":"linux","architecture":"amd64"}}}}}}"#
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

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// What is not kept of a Node is never seen here: every annotation read or published
    /// must be kept (a published one not kept would be patched again at every event).
    #[test]
    fn every_annotation_read_or_published_is_kept() {
        for key in [
            UNDERLAY_ANNOTATION,
            KEPT_MAC_ANNOTATION,
            FLANNEL_BACKEND_DATA,
            FLANNEL_BACKEND_V6_DATA,
            FLANNEL_BACKEND_TYPE,
            FLANNEL_PUBLIC_IP,
            FLANNEL_PUBLIC_IPV6,
            FLANNEL_KUBE_MANAGED,
            sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION,
            sticky_sites::model::ENDPOINT_ANNOTATION,
            sticky_sites::model::PUBLIC_KEY_ANNOTATION,
        ] {
            assert!(
                super::super::objects::KEPT_ANNOTATIONS.contains(&key),
                "{key}"
            );
        }
    }

    const DUAL_CIDRS: [&str; 2] = ["10.244.1.0/24", "fd00:1::/64"];

    #[test]
    fn internal_ip_unless_the_underlay_annotation_says_otherwise() {
        let e = node_entry(&node("a", "192.0.2.1", &["10.244.1.0/24"], ""), V4).unwrap();
        assert_eq!(e.ip, ip("192.0.2.1"));
        assert_eq!(e.mac, None);
        let e = node_entry(
            &node(
                "a",
                "192.0.2.1",
                &["10.244.1.0/24"],
                r#""sticky-cni.io/underlay-ip":"198.51.100.7""#,
            ),
            V4,
        )
        .unwrap();
        assert_eq!(e.ip, ip("198.51.100.7"));
        let bad = node_entry(
            &node(
                "a",
                "192.0.2.1",
                &["10.244.1.0/24"],
                r#""sticky-cni.io/underlay-ip":"eth0""#,
            ),
            V4,
        );
        assert!(matches!(bad, Err(Skip::BadAnnotation { .. })));
        // Only an IPv6 InternalIP: no underlay on an IPv4 network, and the reason says so.
        let v6 = node_entry(&node("a", "2001:db8::1", &["10.244.1.0/24"], ""), V4);
        assert_eq!(v6, Err(Skip::NoUnderlay(V4)));
        let why = v6.unwrap_err().to_string();
        assert!(why.starts_with("has no IPv4 underlay address"), "{why}");
    }

    #[test]
    fn an_ipv6_network_takes_the_first_ipv6_internal_ip_that_can_be_a_node() {
        // A dual-stack kubelet lists its IPv4 InternalIP first.
        let dual = node("a", "192.0.2.1,2001:db8::1", &DUAL_CIDRS, "");
        assert_eq!(node_entry(&dual, V6).unwrap().ip, ip("2001:db8::1"));
        assert_eq!(node_entry(&dual, V4).unwrap().ip, ip("192.0.2.1"));
        // Link-local, loopback, IPv4-mapped: not a node's; the next one is taken.
        let odd = node(
            "a",
            "fe80::1,::1,::ffff:192.0.2.1,2001:db8::7,2001:db8::8",
            &DUAL_CIDRS,
            "",
        );
        assert_eq!(node_entry(&odd, V6).unwrap().ip, ip("2001:db8::7"));
        // None at all: left out, naming the family.
        let none = node_entry(&node("a", "192.0.2.1,fe80::1", &DUAL_CIDRS, ""), V6);
        assert_eq!(none, Err(Skip::NoUnderlay(V6)));
        let why = none.unwrap_err().to_string();
        assert!(
            why.starts_with("has no IPv6 underlay address") && why.contains("link-local"),
            "{why}"
        );
        // The same rule on IPv4: a loopback InternalIP listed first is passed over.
        let lo = node("a", "127.0.0.1,192.0.2.3", &["10.244.1.0/24"], "");
        assert_eq!(node_entry(&lo, V4).unwrap().ip, ip("192.0.2.3"));
    }

    #[test]
    fn the_underlay_annotation_takes_either_family_and_the_other_one_leaves_the_node_out() {
        let v6 = r#""sticky-cni.io/underlay-ip":"2001:db8::99""#;
        let e = node_entry(&node("a", "192.0.2.1,2001:db8::1", &DUAL_CIDRS, v6), V6).unwrap();
        assert_eq!(
            e.ip,
            ip("2001:db8::99"),
            "the annotation beats the InternalIP"
        );
        let wrong = node_entry(&node("a", "192.0.2.1,2001:db8::1", &DUAL_CIDRS, v6), V4);
        assert_eq!(
            wrong,
            Err(Skip::OtherFamily {
                key: UNDERLAY_ANNOTATION,
                value: ip("2001:db8::99"),
                family: V4,
            })
        );
        let why = wrong.unwrap_err().to_string();
        assert!(
            why.contains("2001:db8::99 is an IPv6 address")
                && why.contains("this network's underlay is IPv4"),
            "{why}"
        );
        let v4 = r#""sticky-cni.io/underlay-ip":"192.0.2.99""#;
        let wrong = node_entry(&node("a", "2001:db8::1", &DUAL_CIDRS, v4), V6);
        assert!(
            matches!(
                wrong,
                Err(Skip::OtherFamily {
                    family: Family::V6,
                    ..
                })
            ),
            "{wrong:?}"
        );
    }

    const FLANNEL_V4: &str = r#""flannel.alpha.coreos.com/backend-data":"{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:11:22:33\"}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"192.0.2.44""#;
    /// What a dual-stack flannel (EnableIPv6) adds: its flannel-v6.1 VTEP.
    const FLANNEL_V6: &str = r#""flannel.alpha.coreos.com/backend-v6-data":"{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:66:66:66\"}","flannel.alpha.coreos.com/public-ipv6":"2001:db8::44""#;

    #[test]
    fn flannel_nodes_bring_their_mac_and_public_ip_sticky_nodes_do_not() {
        let flannel = FLANNEL_V4;
        let e = node_entry(&node("f", "192.0.2.4", &["10.244.4.0/24"], flannel), V4).unwrap();
        assert_eq!(e.mac.as_deref(), Some("6e:3c:8a:11:22:33"));
        assert_eq!(e.ip, ip("192.0.2.44"));
        // The same annotations published by a sticky-cni agent: its kept MAC is computed.
        let sticky = format!(r#"{flannel},"sticky-cni.io/kept-mac":"0a:01:c0:00:02:04""#);
        let e = node_entry(&node("s", "192.0.2.4", &["10.244.4.0/24"], &sticky), V4).unwrap();
        assert_eq!(e.mac, None);
        assert_eq!(e.ip, ip("192.0.2.4"));
        let broken = r#""flannel.alpha.coreos.com/backend-data":"not json""#;
        assert!(matches!(
            node_entry(&node("f", "192.0.2.4", &["10.244.4.0/24"], broken), V4),
            Err(Skip::BadAnnotation { .. })
        ));
        // flannel's host-gw publishes "null": no VTEP, not a flannel VXLAN node.
        let host_gw = r#""flannel.alpha.coreos.com/backend-data":"null""#;
        let e = node_entry(&node("h", "192.0.2.4", &["10.244.4.0/24"], host_gw), V4).unwrap();
        assert_eq!((e.ip, e.mac), (ip("192.0.2.4"), None));
    }

    #[test]
    fn on_an_ipv6_network_a_flannel_node_brings_its_v6_vtep_mac_and_public_ipv6() {
        let dual = format!("{FLANNEL_V4},{FLANNEL_V6}");
        let n = node("f", "192.0.2.4,2001:db8::4", &DUAL_CIDRS, &dual);
        let e = node_entry(&n, V6).unwrap();
        assert_eq!(e.mac.as_deref(), Some("6e:3c:8a:66:66:66"));
        assert_eq!(e.ip, ip("2001:db8::44"));
        // The same Node on an IPv4 network: its IPv4 VTEP, as before.
        let e = node_entry(&n, V4).unwrap();
        assert_eq!(e.mac.as_deref(), Some("6e:3c:8a:11:22:33"));
        assert_eq!(e.ip, ip("192.0.2.44"));
        // Without public-ipv6: its IPv6 InternalIP, never the IPv4 public-ip.
        let no_public = format!(
            r#"{FLANNEL_V4},"flannel.alpha.coreos.com/backend-v6-data":"{{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:66:66:66\"}}""#
        );
        let n = node("f", "192.0.2.4,2001:db8::4", &DUAL_CIDRS, &no_public);
        assert_eq!(node_entry(&n, V6).unwrap().ip, ip("2001:db8::4"));
        // public-ipv6 that is not an IPv6 address.
        let bad = r#""flannel.alpha.coreos.com/backend-v6-data":"{\"VNI\":1,\"VtepMAC\":\"6e:3c:8a:66:66:66\"}","flannel.alpha.coreos.com/public-ipv6":"192.0.2.4""#;
        let n = node("f", "2001:db8::4", &DUAL_CIDRS, bad);
        let e = node_entry(&n, V6);
        assert!(
            matches!(
                e,
                Err(Skip::BadAnnotation {
                    key: FLANNEL_PUBLIC_IPV6,
                    expected: "an IPv6 address",
                    ..
                })
            ),
            "{e:?}"
        );
        // backend-v6-data that is not flannel's.
        let broken = r#""flannel.alpha.coreos.com/backend-v6-data":"{\"VtepMAC\":7}""#;
        let e = node_entry(&node("f", "2001:db8::4", &DUAL_CIDRS, broken), V6);
        assert!(
            matches!(
                e,
                Err(Skip::BadAnnotation {
                    key: FLANNEL_BACKEND_V6_DATA,
                    ..
                })
            ),
            "{e:?}"
        );
        // Published by a sticky-cni agent: its kept MAC is computed, its InternalIP taken.
        let sticky = format!(r#"{FLANNEL_V6},"sticky-cni.io/kept-mac":"06:01:02:03:04:05""#);
        let e = node_entry(&node("s", "2001:db8::4", &DUAL_CIDRS, &sticky), V6).unwrap();
        assert_eq!((e.ip, e.mac), (ip("2001:db8::4"), None));
    }

    #[test]
    fn a_flannel_node_without_a_vtep_of_the_networks_family_is_left_out() {
        // flannel on IPv4 only: no flannel-v6 device to send to.
        let n = node("f", "192.0.2.4,2001:db8::4", &DUAL_CIDRS, FLANNEL_V4);
        let e = node_entry(&n, V6);
        assert_eq!(e, Err(Skip::FlannelOtherFamily { family: V6 }));
        let why = e.unwrap_err().to_string();
        assert!(
            why.contains("IPv4 VTEP only") && why.contains("backend-v6-data"),
            "{why}"
        );
        // flannel on IPv6 only, on an IPv4 network.
        let n = node("f", "192.0.2.4,2001:db8::4", &DUAL_CIDRS, FLANNEL_V6);
        assert_eq!(
            node_entry(&n, V4),
            Err(Skip::FlannelOtherFamily { family: V4 })
        );
        // The other family's data is only looked at: a malformed one is not this network's.
        let other_broken = r#""flannel.alpha.coreos.com/backend-v6-data":"not json""#;
        let n = node("f", "192.0.2.4", &["10.244.4.0/24"], other_broken);
        assert_eq!(node_entry(&n, V4).unwrap().ip, ip("192.0.2.4"));
    }

    #[test]
    fn dual_stack_pod_cidrs_ipv4_first_and_the_legacy_field() {
        let e = node_entry(
            &node("a", "192.0.2.1", &["fd00:1::/64", "10.244.1.0/24"], ""),
            V4,
        )
        .unwrap();
        let s: Vec<String> = e.subnets.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["10.244.1.0/24", "fd00:1::/64"]);
        let mut legacy = node("a", "192.0.2.1", &[], "");
        legacy.spec.pod_cidr = Some("10.244.7.0/24".into());
        assert_eq!(
            node_entry(&legacy, V4).unwrap().subnets,
            vec!["10.244.7.0/24".parse::<IpNet>().unwrap()]
        );
    }

    fn placed(list: &BTreeMap<String, Node>, family: Family) -> Vec<Peer> {
        list.values()
            .map(|n| {
                sticky_overlay::peers::check_entries(&[node_entry(n, family).unwrap()])
                    .unwrap()
                    .remove(0)
            })
            .collect()
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
        let peers = placed(&list, V4);
        let text = file_text(&peers);
        assert_eq!(sticky_overlay::peers::parse_file(&text).unwrap(), peers);
        assert!(String::from_utf8_lossy(&text).starts_with("[\n  {\"ip\":\"192.0.2.1\""));
    }

    #[test]
    fn an_ipv6_file_is_sorted_by_address_and_reads_back() {
        let list = nodes(vec![
            node("a", "192.0.2.1,2001:db8::10", &DUAL_CIDRS, ""),
            node(
                "b",
                "192.0.2.2,2001:db8::9",
                &["10.244.2.0/24", "fd00:2::/64"],
                FLANNEL_V6,
            ),
            node(
                "c",
                "192.0.2.3,2001:db8::a",
                &["10.244.3.0/24", "fd00:3::/64"],
                "",
            ),
        ]);
        let peers = placed(&list, V6);
        let text = file_text(&peers);
        assert_eq!(sticky_overlay::peers::parse_file(&text).unwrap(), {
            let mut sorted = peers.clone();
            sorted.sort_by_key(|p| p.ip);
            sorted
        });
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.find("2001:db8::a\"").unwrap() < text.find("2001:db8::10\"").unwrap()
                && text.find("2001:db8::10\"").unwrap() < text.find("2001:db8::44\"").unwrap(),
            "by address, not by text: {text}"
        );
        assert!(
            text.contains(r#"{"ip":"2001:db8::44","subnets":["10.244.2.0/24","fd00:2::/64"],"mac":"6e:3c:8a:66:66:66"}"#),
            "{text}"
        );
    }

    /// A site gateway's entry keeps the other sites' subnets it carries: without them in the
    /// file, a plain node routes no other site (the sites tests' pods never met).
    #[test]
    fn the_file_keeps_what_a_gateway_carries() {
        let mut gw = peer(1);
        gw.carries = vec!["198.18.21.0/24".parse().unwrap()];
        let text = file_text(&[gw.clone(), peer(2)]);
        assert_eq!(
            sticky_overlay::peers::parse_file(&text).unwrap(),
            vec![gw, peer(2)]
        );
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(r#""carries":["198.18.21.0/24"]"#), "{text}");
    }

    fn peer(n: u8) -> Peer {
        Peer {
            carries: Vec::new(),
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
            subnets: vec![format!("10.244.{n}.0/24").parse().unwrap()],
            mac: None,
        }
    }

    fn describe_changes_of(old: &[Peer], new: &[Peer]) -> Vec<String> {
        describe(&changes(old, new))
    }

    #[test]
    fn changes_are_described_one_line_each() {
        let mut moved = peer(2);
        moved.subnets = vec!["10.244.9.0/24".parse().unwrap()];
        let found = changes(&[peer(1), peer(2)], &[moved.clone(), peer(3)]);
        // Each peer that differs, once, as it was and as it is.
        assert_eq!(
            found,
            [
                (Some(peer(2)), Some(moved)),
                (None, Some(peer(3))),
                (Some(peer(1)), None)
            ]
        );
        let lines = describe(&found);
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

    #[test]
    fn ipv6_changes_are_described_with_the_address_and_the_mac() {
        let six = |last: u8, mac: Option<[u8; 6]>| Peer {
            carries: Vec::new(),
            ip: ip(&format!("2001:db8::{last}")),
            subnets: vec![
                format!("10.244.{last}.0/24").parse().unwrap(),
                format!("fd00:{last}::/64").parse().unwrap(),
            ],
            mac,
        };
        let lines = describe_changes_of(
            &[six(1, None), six(2, None)],
            &[
                six(1, Some([0x6e, 0x3c, 0x8a, 0x66, 0x66, 0x66])),
                six(3, None),
            ],
        );
        assert_eq!(
            lines,
            [
                "peer changed: 2001:db8::1 subnets 10.244.1.0/24,fd00:1::/64 mac 6e:3c:8a:66:66:66 (was 2001:db8::1 subnets 10.244.1.0/24,fd00:1::/64)",
                "peer added: 2001:db8::3 subnets 10.244.3.0/24,fd00:3::/64",
                "peer removed: 2001:db8::2 subnets 10.244.2.0/24,fd00:2::/64 (its Node is gone)",
            ]
        );
    }
}
