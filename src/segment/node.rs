//! This node and the segment's other nodes, from the same peer sources as the main mode
//! (`peers`, `peersFile`, parsed by [`crate::vxlan::peers`]), optionally narrowed to the
//! config's `nodes`.

use std::net::{IpAddr, Ipv4Addr};

use super::Error;
use super::config::Config;
use crate::netlink::link::Link;
use crate::vxlan::kernel::Kernel;
use crate::vxlan::peers::{self, Peer};

/// This node as the segment sees it.
#[derive(Debug, Clone)]
pub struct Node {
    pub local_ip: Ipv4Addr,
    pub underlay: Link,
    /// MTU of the VXLAN device, the bridge and every pod interface.
    pub mtu: u32,
    /// Every node of the segment, this one included (sorted).
    pub members: Vec<Ipv4Addr>,
    /// The other nodes: one flood entry each.
    pub remote: Vec<Ipv4Addr>,
    /// Why the peers file could not be used, if it could not: nothing programmed is removed.
    pub peers_file_error: Option<String>,
}

/// The segment's nodes (underlay addresses) from the merged peer list and `nodes`.
pub fn members(all: &[Peer], nodes: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = all
        .iter()
        .map(|p| p.ip)
        .filter(|ip| nodes.is_empty() || nodes.contains(ip))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// This node (the peer entry whose `ip` is one of its addresses), its underlay device and MTU,
/// and the segment's other nodes.
pub fn resolve<K: Kernel>(k: &mut K, cfg: &Config) -> Result<Node, Error> {
    let (all, file_error) = peers::gather(
        &cfg.peers,
        cfg.peers_file.as_deref(),
        &cfg.last_good_peers_path(),
    )
    .map_err(|e| Error::Vxlan(crate::vxlan::Error::Peers(e)))?;
    let peers_file_error = file_error.map(|e| {
        eprintln!(
            "sticky-vxlan: segment {}: {e}; using the last peers file that was valid and removing no flood entry",
            cfg.name
        );
        e.to_string()
    });
    let addrs = k.addresses()?;
    // This node's entry (the first whose ip is one of its addresses) and the interface with it.
    let (local_ip, index) = all
        .iter()
        .find_map(|p| {
            let (i, _) = addrs.iter().find(|(_, n)| n.addr() == IpAddr::V4(p.ip))?;
            Some((p.ip, *i))
        })
        .ok_or(Error::NoLocalEntry)?;
    let members = members(&all, &cfg.nodes);
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
    let underlay = k
        .links()?
        .into_iter()
        .find(|l| l.index == index)
        .ok_or(Error::Vxlan(crate::vxlan::Error::LocalIpNotHere {
            ip: local_ip,
        }))?;
    let mtu = crate::vxlan::node::mtu_for(&underlay, cfg.mtu)?;
    let remote = members
        .iter()
        .copied()
        .filter(|ip| *ip != local_ip)
        .collect();
    Ok(Node {
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
    use crate::vxlan::fake::Fake;
    use serde_json::json;

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

    #[test]
    fn this_node_is_the_entry_holding_a_local_address_and_must_be_in_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut k = Fake::node("192.0.2.2/24");
        let n = resolve(&mut k, &cfg(&dir, json!({}))).unwrap();
        assert_eq!(n.local_ip, Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!((n.underlay.name.as_str(), n.mtu), ("eth0", 1450));
        assert_eq!(n.remote.len(), 2);
        let narrow = cfg(&dir, json!({"nodes": ["192.0.2.2", "192.0.2.3"]}));
        assert_eq!(
            resolve(&mut k, &narrow).unwrap().remote,
            [Ipv4Addr::new(192, 0, 2, 3)]
        );
        let without = cfg(&dir, json!({"nodes": ["192.0.2.1", "192.0.2.3"]}));
        assert!(matches!(
            resolve(&mut k, &without),
            Err(Error::NotInSegment { .. })
        ));
        let mut stranger = Fake::node("198.51.100.9/24");
        assert!(matches!(
            resolve(&mut stranger, &cfg(&dir, json!({}))),
            Err(Error::NoLocalEntry)
        ));
        let big = cfg(&dir, json!({"mtu": 1451}));
        assert!(matches!(
            resolve(&mut k, &big),
            Err(Error::Vxlan(crate::vxlan::Error::MtuTooLarge { .. }))
        ));
    }

    #[test]
    fn members_are_the_peers_narrowed_to_nodes() {
        let peer = |ip: &str, s: &str| Peer {
            ip: ip.parse().unwrap(),
            subnets: vec![s.parse().unwrap()],
            mac: None,
        };
        let all = vec![
            peer("192.0.2.3", "10.244.3.0/24"),
            peer("192.0.2.1", "10.244.1.0/24"),
            peer("192.0.2.2", "10.244.2.0/24"),
        ];
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
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
