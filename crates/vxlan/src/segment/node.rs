//! This node and the segment's other nodes, from the same peer sources as the main mode
//! (`peers`, `peersFile`, parsed by [`sticky_overlay::peers`]), optionally narrowed to the
//! config's `nodes`. Which entry is this node follows the main mode's rule
//! ([`sticky_overlay::node::Observed::node_addresses`], [`sticky_overlay::peers::split_local`]).

use std::collections::HashSet;
use std::net::IpAddr;

use super::Error;
use super::config::Config;
use sticky_netlink::link::Link;
use sticky_overlay::kernel::Kernel;
use sticky_overlay::node::Observed;
use sticky_overlay::peers::{self, Gathered, Peer};

/// A peer list error, with the main mode's code.
fn peer_error(e: peers::Error) -> Error {
    Error::Vxlan(sticky_overlay::Error::Peers(e))
}

/// This node as the segment sees it.
#[derive(Debug, Clone)]
pub struct SegmentNode {
    pub local_ip: IpAddr,
    pub underlay: Link,
    /// MTU of the VXLAN device, the bridge and every pod interface.
    pub mtu: u32,
    /// Every node of the segment, this one included (sorted).
    pub members: Vec<IpAddr>,
    /// The other nodes: one flood entry each.
    pub remote: Vec<IpAddr>,
    /// Why the peers file could not be used, if it could not: nothing programmed is removed.
    pub peers_file_error: Option<String>,
}

/// The segment's nodes (underlay addresses) from the merged peer list and `nodes`.
pub fn members(all: &[Peer], nodes: &[IpAddr]) -> Vec<IpAddr> {
    let nodes: HashSet<&IpAddr> = nodes.iter().collect();
    let mut out: Vec<IpAddr> = all
        .iter()
        .map(|p| p.ip)
        .filter(|ip| nodes.is_empty() || nodes.contains(ip))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The segment's peer list as read from the config and its peers file (nothing is written:
/// [`sticky_overlay::peers::Gathered::keep_last_good`] is for the reconcile). A file that
/// cannot be used is logged; its last good copy stands in for it.
pub fn peer_list(cfg: &Config) -> Result<Gathered, Error> {
    let gathered = peers::gather(
        &cfg.peers,
        cfg.peers_file.as_deref(),
        &cfg.last_good_peers_path(),
    )
    .map_err(peer_error)?;
    if let Some(e) = &gathered.file_error {
        eprintln!(
            "sticky-vxlan: segment {}: {e}; using the last peers file that was valid and removing no flood entry",
            cfg.name
        );
    }
    Ok(gathered)
}

/// This node (the peer entry whose `ip` is one of its addresses), its underlay device and MTU,
/// and the segment's other nodes, from the gathered peer list ([`peer_list`]). Reads only.
pub fn resolve<K: Kernel>(
    k: &mut K,
    cfg: &Config,
    gathered: &Gathered,
) -> Result<SegmentNode, Error> {
    let all = &gathered.peers;
    let peers_file_error = gathered.file_error.as_ref().map(ToString::to_string);
    // This node is the one entry naming one of its addresses, by the main mode's rule: a
    // loopback or link-local address is never this node's, two such entries are refused, and
    // no other node may sit at the network or broadcast address of the underlay's subnet.
    let seen = Observed::read_for_node(k)?;
    let (local, others) = peers::split_local(all, &seen.node_addresses()).map_err(peer_error)?;
    let local_ip = local.ok_or(Error::NoLocalEntry)?.ip;
    let underlay = seen
        .holder(local_ip)
        .cloned()
        .ok_or(sticky_overlay::Error::LocalIpNotHere { ip: local_ip })?;
    sticky_overlay::node::check_underlay_edges(&seen, &underlay, &others)?;
    let members = members(all, &cfg.nodes);
    if !members.contains(&local_ip) {
        return Err(Error::NotInSegment {
            local: local_ip,
            nodes: cfg
                .nodes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mtu = sticky_overlay::node::mtu_for(&underlay, local_ip, cfg.mtu, None)?;
    let remote = members
        .iter()
        .copied()
        .filter(|ip| *ip != local_ip)
        .collect();
    Ok(SegmentNode {
        local_ip,
        underlay,
        mtu,
        members,
        remote,
        peers_file_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};
    use sticky_overlay::fake::Fake;

    fn cfg(dir: &tempfile::TempDir, extra: serde_json::Value) -> Config {
        let mut raw = json!({"type": "sticky-vxlan", "mode": "segment", "vni": 7,
            "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                      {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]},
                      {"ip": "192.0.2.3", "subnets": ["10.244.3.0/24"]}],
            "stateDir": dir.path()});
        for (k, v) in extra.as_object().into_iter().flatten() {
            raw[k] = v.clone();
        }
        Config::from_json("seg", &raw).unwrap()
    }

    fn resolved(k: &mut Fake, cfg: &Config) -> Result<SegmentNode, Error> {
        resolve(k, cfg, &peer_list(cfg)?)
    }

    #[test]
    fn this_node_is_the_entry_holding_a_local_address_and_must_be_in_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut k = Fake::node("192.0.2.2/24");
        let n = resolved(&mut k, &cfg(&dir, json!({}))).unwrap();
        assert_eq!(n.local_ip, Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!((n.underlay.name.as_str(), n.mtu), ("eth0", 1450));
        assert_eq!(n.remote.len(), 2);
        let narrow = cfg(&dir, json!({"nodes": ["192.0.2.2", "192.0.2.3"]}));
        assert_eq!(
            resolved(&mut k, &narrow).unwrap().remote,
            [Ipv4Addr::new(192, 0, 2, 3)]
        );
        let without = cfg(&dir, json!({"nodes": ["192.0.2.1", "192.0.2.3"]}));
        assert!(matches!(
            resolved(&mut k, &without),
            Err(Error::NotInSegment { .. })
        ));
        let mut stranger = Fake::node("198.51.100.9/24");
        assert!(matches!(
            resolved(&mut stranger, &cfg(&dir, json!({}))),
            Err(Error::NoLocalEntry)
        ));
        let big = cfg(&dir, json!({"mtu": 1451}));
        assert!(matches!(
            resolved(&mut k, &big),
            Err(Error::Vxlan(sticky_overlay::Error::MtuTooLarge { .. }))
        ));
    }

    /// The main mode's rule (`vxlan::node`): a loopback or link-local address is never this
    /// node's, two entries naming this node are refused, and no other node may sit at the
    /// network or broadcast address of the underlay's subnet.
    #[test]
    fn loopback_link_local_and_second_own_entries_never_become_this_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut k = Fake::node("192.0.2.2/24");
        k.add_link("lo", "loopback");
        k.add_address("lo", "127.0.0.1/8");
        k.add_address("eth0", "169.254.0.7/16");
        let odd = |ip: Ipv4Addr, s: &str| Peer {
            carries: Vec::new(),
            ip: ip.into(),
            subnets: vec![s.parse().unwrap()],
            mac: None,
        };
        // (The config and the peers file refuse these entries; even if one got here it is
        // not this node.)
        let mut c = cfg(&dir, json!({}));
        c.peers.push(odd(Ipv4Addr::LOCALHOST, "10.244.8.0/24"));
        c.peers
            .push(odd(Ipv4Addr::new(169, 254, 0, 7), "10.244.9.0/24"));
        let n = resolved(&mut k, &c).unwrap();
        assert_eq!(n.local_ip, Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(n.underlay.name, "eth0");

        k.add_address("eth0", "192.0.2.101/24");
        let mut two = cfg(&dir, json!({}));
        two.peers
            .push(odd(Ipv4Addr::new(192, 0, 2, 101), "10.244.101.0/24"));
        let err = resolved(&mut k, &two).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Vxlan(sticky_overlay::Error::Peers(peers::Error::ManyLocal { .. }))
            ),
            "{err}"
        );

        for edge in [Ipv4Addr::new(192, 0, 2, 255), Ipv4Addr::new(192, 0, 2, 0)] {
            let mut c = cfg(&dir, json!({}));
            c.peers.push(odd(edge, "10.244.9.0/24"));
            let err = resolved(&mut Fake::node("192.0.2.2/24"), &c).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Vxlan(sticky_overlay::Error::Peers(
                        peers::Error::UnderlayEdge { .. }
                    ))
                ),
                "{edge}: {err}"
            );
        }
    }

    #[test]
    fn members_are_the_peers_narrowed_to_nodes() {
        let peer = |ip: &str, s: &str| Peer {
            carries: Vec::new(),
            ip: ip.parse().unwrap(),
            subnets: vec![s.parse().unwrap()],
            mac: None,
        };
        let all = vec![
            peer("192.0.2.3", "10.244.3.0/24"),
            peer("192.0.2.1", "10.244.1.0/24"),
            peer("192.0.2.2", "10.244.2.0/24"),
        ];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            members(&all, &[]),
            vec![ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3")]
        );
        assert_eq!(
            members(&all, &[ip("192.0.2.3"), ip("192.0.2.9"), ip("192.0.2.1")]),
            vec![ip("192.0.2.1"), ip("192.0.2.3")],
            "a listed node without a peer entry has no address to flood to"
        );
    }
}
