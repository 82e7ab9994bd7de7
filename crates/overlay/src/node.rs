//! This node as the overlay sees it: underlay address and device, MTU, its own subnets
//! and the remote peers, worked out from config, the peers file and what the kernel shows
//! ([`Observed`], read once per call).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use super::Error;
use super::config::{Config, vxlan_overhead};
use super::kernel::Kernel;
use super::mac::vtep_mac;
use super::peers::{self, Gathered, Peer};
use super::stamp::{self, Applied, DeviceId};
use sticky_netlink::link::Link;
use sticky_netlink::neigh::{Fdb, Neighbour};
use sticky_netlink::route::Route;
use sticky_primitives::nofollow;

/// What the node's kernel holds, read once: links (see [`Observed::read`]), every address and
/// main-table route, and the entries on the VTEP (when a link of its name exists).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub links: Vec<Link>,
    pub addresses: Vec<(u32, IpNet)>,
    pub routes: Vec<Route>,
    pub vtep_fdb: Vec<Fdb>,
    pub vtep_neighbours: Vec<Neighbour>,
    /// The host ends of this network's pods ([`super::pod::host_ends`]), on the bridge or not.
    pub pods: Vec<Link>,
}

impl Observed {
    /// What programming the node needs. Links: every VXLAN device (the VTEP, any VTEP an
    /// earlier config left, any other device on the VNI), and the links named as the VTEP
    /// and the bridge, whatever their kind; the host ends of this network's pods (one veth
    /// dump: O(pods on this node), so that a bridge made again gets them back). Other links
    /// are not read: [`resolve`] asks for the underlay by name or index when it is not among
    /// these.
    ///
    /// The VTEP's FDB is read as `fdb` says ([`FdbRead`]).
    pub fn read(k: &mut impl Kernel, cfg: &Config, fdb: &FdbRead) -> Result<Observed, Error> {
        let (vtep_name, bridge) = (cfg.vtep_name.as_str(), cfg.bridge.as_str());
        let veths = k.veth_links()?;
        let pods = super::pod::host_ends(&cfg.name, &veths).cloned().collect();
        let mut links = k.vxlan_links()?;
        for name in [vtep_name, bridge] {
            if !links.iter().any(|l| l.name == name)
                && let Some(l) = k.link(name)?
            {
                links.push(l);
            }
        }
        let vtep = links.iter().find(|l| l.name == vtep_name);
        let (vtep_fdb, vtep_neighbours) = match vtep {
            Some(l) => {
                let entries = match fdb {
                    FdbRead::Only { vtep, macs } if DeviceId::of(l) == *vtep => {
                        k.fdb_of(l.index, macs)?
                    }
                    _ => k.fdb(l.index)?,
                };
                (entries, k.neighbours(l.index)?)
            }
            None => Default::default(),
        };
        Ok(Observed {
            addresses: k.addresses()?,
            routes: k.routes()?,
            links,
            vtep_fdb,
            vtep_neighbours,
            pods,
        })
    }

    /// Only what working out the node needs (every link, and the addresses): for the
    /// commands that do not program the node (DEL, CHECK, GC, STATUS).
    pub fn read_for_node(k: &mut impl Kernel) -> Result<Observed, Error> {
        Ok(Observed {
            links: k.links()?,
            addresses: k.addresses()?,
            ..Observed::default()
        })
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    pub fn link_index(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    /// The addresses on interface `index`.
    pub fn addresses_of(&self, index: u32) -> Vec<IpNet> {
        self.addresses
            .iter()
            .filter(|(i, _)| *i == index)
            .map(|(_, n)| *n)
            .collect()
    }

    /// This node's addresses that could be an underlay address ([`peers::not_a_node`]: not
    /// loopback, not link-local; a peer entry naming one of those would make every node
    /// "this node").
    pub fn node_addresses(&self) -> Vec<IpAddr> {
        self.addresses
            .iter()
            .map(|(_, n)| n.addr())
            .filter(|a| peers::not_a_node(*a).is_none())
            .collect()
    }

    /// The link holding address `ip`.
    pub fn holder(&self, ip: IpAddr) -> Option<&Link> {
        self.addresses
            .iter()
            .find(|(_, n)| n.addr() == ip)
            .and_then(|(i, _)| self.link_index(*i))
    }
}

/// This node, as far as the overlay is concerned.
#[derive(Debug, Clone)]
pub struct LocalNode {
    /// The underlay address: IPv4, or IPv6 (every peer's is of the same family).
    pub local_ip: IpAddr,
    pub underlay: Link,
    /// MTU of the VTEP, the bridge and every pod interface.
    pub mtu: u32,
    /// This node's own entry: its pod subnets.
    pub local: Peer,
    pub remote: Vec<Peer>,
    /// Why the peers file could not be used, if it could not: the programmed peers must
    /// then be left as they are.
    pub peers_file_error: Option<String>,
}

impl LocalNode {
    /// What programming the node needs beyond [`resolve`] (ADD, `reconcile`, STATUS): the
    /// underlay address is the one this node's entry names, and every peer has a VTEP MAC of
    /// its own. DEL, CHECK and GC only need the local subnets and do not ask.
    pub fn check(&self, vni: u32) -> Result<(), Error> {
        if self.local.ip != self.local_ip {
            return Err(Error::UnderlayNotNamed {
                underlay: self.local_ip,
                entry: self.local.ip,
            });
        }
        Ok(peers::check_macs(vni, self.local_ip, &self.remote)?)
    }

    /// The node's IPv4 pod subnet (every entry has exactly one).
    pub fn subnet_v4(&self) -> Option<IpNet> {
        self.local
            .subnets
            .iter()
            .copied()
            .find(|s| s.addr().is_ipv4())
    }
}

/// The MTU of the overlay devices over `underlay` whose address is `local`: `wanted`, or the
/// underlay's MTU − 50 (VXLAN over IPv4) or − 70 (over IPv6), and with sites no more than
/// `wan_mtu` − 72 (WireGuard over IPv4 and a relayed path's header) or − 92 (over IPv6; the WAN
/// is taken to be of the underlay's family), rounded down to a multiple of 16 (WireGuard's
/// padding: [`crate::sites::tunnel_mtu`]): a full-size pod packet then crosses the LAN in VXLAN and the WAN in the
/// tunnel whole (docs/sites.md, "MTU"). A `wanted` larger than either is an error.
pub fn mtu_for(
    underlay: &Link,
    local: IpAddr,
    wanted: Option<u32>,
    wan_mtu: Option<u32>,
) -> Result<u32, Error> {
    let underlay_mtu = underlay.mtu.unwrap_or(1500);
    let max = underlay_mtu.saturating_sub(vxlan_overhead(local));
    if let Some(m) = wanted
        && m > max
    {
        return Err(Error::MtuTooLarge {
            mtu: m,
            max,
            underlay: underlay_mtu,
            device: underlay.name.clone(),
        });
    }
    let Some(wan_mtu) = wan_mtu else {
        return Ok(wanted.unwrap_or(max));
    };
    let wg = crate::sites::tunnel_overhead(local);
    let wan_max = crate::sites::tunnel_mtu(wan_mtu, wg);
    match wanted {
        Some(m) if m > wan_max => Err(Error::MtuAboveWan {
            mtu: m,
            max: wan_max,
            wan_mtu,
            overhead: wg,
        }),
        Some(m) => Ok(m),
        None => Ok(max.min(wan_max)),
    }
}

/// The peers of the config and the peers file, merged; and why the file could not be used,
/// if it could not (then its last good copy stands in for it, and the problem is logged).
/// Reads only: the reconcile that programs the node keeps the file that was used
/// ([`Gathered::keep_last_good`]).
pub fn peer_list(cfg: &Config) -> Result<Gathered, Error> {
    let copy = cfg.last_good_peers_path();
    let gathered = peers::gather(&cfg.peers, cfg.peers_file.as_deref(), &copy)?;
    if let Some(e) = &gathered.file_error {
        eprintln!(
            "sticky-vxlan: {e}; using the last peers file that was valid and removing no peer"
        );
    }
    Ok(gathered)
}

/// How much of the VTEP's FDB [`Observed::read`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FdbRead {
    /// Every entry: one dump, whose cost grows in the kernel with the square of the entries
    /// (1.3 s at 100,000).
    #[default]
    Whole,
    /// The entries of these MACs, one lookup each, when the VTEP is still the device `vtep`;
    /// every entry otherwise.
    Only { vtep: DeviceId, macs: Vec<[u8; 6]> },
}

/// From this many peers on, the FDB entries of known MACs are looked up rather than dumped
/// ([`fdb_read`]): the dump's cost grows with the square of the entries, the lookups' with
/// their number, and they meet about here (at 5,000 peers a no-change reconcile took 35 ms
/// with the dump and 50 ms with lookups; at 100,000, 1.3 s of dump against 0.3 s).
pub const LOOK_UP_FROM: usize = 20_000;

/// What of the VTEP's FDB a full reconcile reads, given what the last one `applied` (its
/// stamp: the VTEP it left, the hash of the peers file it applied) and the peers it now
/// programs. A reconcile writes and deletes entries of the MACs of its peers only. So while
/// the VTEP is the one the last full reconcile left and the last good copy (`copy`) is the
/// very file it applied, ours on the VTEP are entries of that file's MACs: looking up those
/// and the MACs of `peers` finds every entry to delete or repair, for a cost that grows with
/// the peers, not their square. Without that proof (no stamp: a boot, a first run, a reconcile
/// that did not finish, other settings; the copy is another file), and below
/// [`LOOK_UP_FROM`] peers, every entry is read; an entry that someone else adds for a MAC no
/// peer has is removed then.
pub fn fdb_read(vni: u32, applied: Option<Applied>, peers: &Gathered, copy: &Path) -> FdbRead {
    let Some(Applied { vtep, peers_hash }) = applied else {
        return FdbRead::Whole;
    };
    if peers.peers.len() < LOOK_UP_FROM {
        return FdbRead::Whole;
    }
    let mac = |p: &Peer| p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni));
    let mut macs: HashSet<[u8; 6]> = peers.peers.iter().map(mac).collect();
    let now = peers.file_text.as_deref().map(stamp::hash);
    if peers_hash != now {
        // Another file was applied: its MACs too, if the copy is that file.
        let Some(text) = nofollow::read(copy).ok().flatten() else {
            return FdbRead::Whole;
        };
        if peers_hash != Some(stamp::hash(&text)) {
            return FdbRead::Whole;
        }
        match peers::parse_file(&text) {
            Ok(before) => macs.extend(before.iter().map(mac)),
            Err(_) => return FdbRead::Whole,
        }
    }
    let mut macs: Vec<[u8; 6]> = macs.into_iter().collect();
    macs.sort_unstable();
    FdbRead::Only { vtep, macs }
}

/// [`accepts`] against this node's kernel (the agent's check before it writes a peers file).
pub fn accepts_here(cfg: &Config, file_peers: &[Peer]) -> Result<Observed, Error> {
    let mut sock = sticky_netlink::Socket::open()?;
    accepts(
        &mut super::kernel::Live { sock: &mut sock },
        cfg,
        file_peers,
    )
}

/// Whether this node's plugin would accept `file_peers` as its peers file: the rules ADD and
/// `reconcile` apply to the whole list (merged with the config's own peers, exactly one entry
/// naming this node, a VTEP MAC of its own for every peer, no peer at an underlay subnet's
/// network or broadcast address). Reads links and addresses; writes nothing. Returns what it
/// read of the node. While that is the same, a list it accepted is accepted with entries
/// removed (but the node's own), and with entries added that it accepts beside the node's own
/// entry and whose claims and VTEP MACs are no other entry's: the agent places a change of a
/// few Nodes so (its `placement` module).
pub fn accepts(k: &mut impl Kernel, cfg: &Config, file_peers: &[Peer]) -> Result<Observed, Error> {
    let all = peers::merge(&cfg.peers, file_peers)?;
    let seen = Observed::read_for_node(k)?;
    identify(k, cfg, &seen, &all, None)?.check(cfg.vni)?;
    Ok(seen)
}

/// Works out the underlay, the MTU and the peers from config, the peer list ([`peer_list`])
/// and the host. Reads only.
pub fn resolve(
    k: &mut impl Kernel,
    cfg: &Config,
    seen: &Observed,
    peers: &Gathered,
) -> Result<LocalNode, Error> {
    let file_error = peers.file_error.as_ref().map(ToString::to_string);
    identify(k, cfg, seen, &peers.peers, file_error)
}

/// [`resolve`] once the peer list is known.
pub(crate) fn identify(
    k: &mut impl Kernel,
    cfg: &Config,
    seen: &Observed,
    all: &[Peer],
    peers_file_error: Option<String>,
) -> Result<LocalNode, Error> {
    let node_addrs = seen.node_addresses();
    let (local_ip, underlay) = underlay(k, cfg, seen, all, &node_addrs)?;
    if let Some(other) = all.iter().find(|p| p.ip.is_ipv4() != local_ip.is_ipv4()) {
        let (ipv4, ipv6) = match local_ip {
            IpAddr::V4(_) => (local_ip, other.ip),
            IpAddr::V6(_) => (other.ip, local_ip),
        };
        return Err(peers::Error::MixedUnderlay { ipv4, ipv6 }.into());
    }
    let (local, remote) = peers::split_local(all, &[cfg.local_ip.unwrap_or(local_ip)])?;
    let local = match local {
        Some(l) => l,
        None => {
            let (l, _) = peers::split_local(all, &node_addrs)?;
            l.ok_or(Error::NoLocalEntry { local: local_ip })?
        }
    };
    let remote: Vec<Peer> = remote.into_iter().filter(|p| p.ip != local.ip).collect();
    // Every other entry matching one of this node's addresses would also be "this node".
    peers::split_local(all, &node_addrs)?;
    check_underlay_edges(seen, &underlay, &remote)?;
    let mtu = mtu_for(
        &underlay,
        local_ip,
        cfg.mtu,
        cfg.sites.as_ref().map(|s| s.wan_mtu),
    )?;
    Ok(LocalNode {
        local_ip,
        underlay,
        mtu,
        local,
        remote,
        peers_file_error,
    })
}

/// A remote peer at an edge of an underlay subnet ([`underlay_edge`]) is not a node.
pub fn check_underlay_edges(
    seen: &Observed,
    underlay: &Link,
    remote: &[Peer],
) -> Result<(), Error> {
    for net in seen.addresses_of(underlay.index) {
        for p in remote {
            if let Some((what, why)) = underlay_edge(net, p.ip) {
                return Err(peers::Error::UnderlayEdge {
                    ip: p.ip,
                    what,
                    subnet: net.trunc(),
                    why,
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Why `ip` is no node's address on the underlay subnet `net` (an address of this node), if
/// it is not: what it is, and what a peer entry for it would do (pure).
///
/// - IPv4: the network and the broadcast address (both addresses of a /31 are hosts,
///   RFC 3021).
/// - IPv6: the subnet-router anycast address, the all-zero host part (RFC 4291; none on a
///   /127, RFC 6164), which the kernel gives this node itself while it forwards; and the
///   reserved subnet anycast addresses (RFC 2526): in a /64 (or shorter) prefix of the
///   EUI-64 kinds (all but `000…`), interface identifiers `fdff:ffff:ffff:ff80` to
///   `fdff:ffff:ffff:ffff`; otherwise the highest 128 addresses of a subnet of at least 256.
pub(crate) fn underlay_edge(net: IpNet, ip: IpAddr) -> Option<(&'static str, &'static str)> {
    const FLOODS: &str = "an FDB entry for it would flood the underlay";
    match (net, ip) {
        (IpNet::V4(net), IpAddr::V4(ip)) => {
            if net.prefix_len() >= 31 || !net.contains(&ip) {
                None
            } else if ip == net.network() {
                Some(("the network address", FLOODS))
            } else if ip == net.broadcast() {
                Some(("the broadcast address", FLOODS))
            } else {
                None
            }
        }
        (IpNet::V6(net), IpAddr::V6(ip)) => {
            if net.prefix_len() >= 127 || !net.contains(&ip) {
                return None;
            }
            if ip == net.network() {
                return Some((
                    "the subnet-router anycast address",
                    "a forwarding node holds it itself: its VXLAN traffic would stay on this node",
                ));
            }
            let bits = u128::from(ip);
            let eui64 = bits >> 125 != 0;
            let reserved = if eui64 && net.prefix_len() <= 64 {
                bits as u64 & !0x7f == 0xfdff_ffff_ffff_ff80
            } else if net.prefix_len() <= 120 {
                let host = u128::from(net.hostmask());
                bits & host & !0x7f == host & !0x7f
            } else {
                false
            };
            reserved.then_some((
                "a reserved subnet anycast address (RFC 2526)",
                "no node may hold it as its own",
            ))
        }
        _ => None,
    }
}

/// The underlay address and device: `localIp` and/or `device` if given, else the address of
/// the peer entry naming this node, else the device (and its source address) that routes to
/// the first remote peer.
fn underlay(
    k: &mut impl Kernel,
    cfg: &Config,
    seen: &Observed,
    all: &[Peer],
    node_addrs: &[IpAddr],
) -> Result<(IpAddr, Link), Error> {
    // The network's underlay family: `localIp`'s, else its peers' (one family, [`peers::merge`]).
    let v6 = cfg
        .local_ip
        .or_else(|| all.first().map(|p| p.ip))
        .is_some_and(|ip| ip.is_ipv6());
    let family = if v6 { "IPv6" } else { "IPv4" };
    let node_address_on = |index: u32| {
        seen.addresses.iter().find_map(|(i, n)| {
            let a = n.addr();
            (*i == index && a.is_ipv6() == v6 && peers::not_a_node(a).is_none()).then_some(a)
        })
    };
    // The links not read with the rest (see `Observed::read`) are asked for.
    let mut at = |index: u32| match seen.link_index(index) {
        Some(l) => Ok(Some(l.clone())),
        None => k.link_at(index),
    };
    let mut holder = |ip: IpAddr| match seen.addresses.iter().find(|(_, n)| n.addr() == ip) {
        Some((i, _)) => at(*i),
        None => Ok(None),
    };
    if let Some(name) = &cfg.device {
        let dev = match seen.link(name) {
            Some(l) => Some(l.clone()),
            None => k.link(name)?,
        }
        .ok_or_else(|| Error::NoDevice { name: name.clone() })?;
        // Of the device's addresses, the one this node's peer entry names: the others' FDB
        // entries point at it and their MAC for this node is computed from it.
        let named = seen.addresses.iter().find_map(|(i, n)| {
            let a = n.addr();
            (*i == dev.index && all.iter().any(|p| p.ip == a)).then_some(a)
        });
        let ip = match cfg
            .local_ip
            .or(named)
            .or_else(|| node_address_on(dev.index))
        {
            Some(ip) => ip,
            None => {
                return Err(Error::DeviceWithoutAddress {
                    name: name.clone(),
                    family,
                });
            }
        };
        return Ok((ip, dev));
    }
    if let Some(ip) = cfg.local_ip {
        let dev = holder(ip)?.ok_or(Error::LocalIpNotHere { ip })?;
        return Ok((ip, dev));
    }
    // The entry naming this node gives its underlay address directly.
    if let Some(own) = all.iter().find(|p| node_addrs.contains(&p.ip))
        && let Some(dev) = holder(own.ip)?
    {
        return Ok((own.ip, dev));
    }
    let target = all
        .iter()
        .find(|p| !node_addrs.contains(&p.ip))
        .ok_or(Error::NoRemotePeer)?;
    let (oif, src) = k.route_to(target.ip)?;
    let (Some(oif), Some(src)) = (oif, src.filter(|s| s.is_ipv6() == target.ip.is_ipv6())) else {
        return Err(Error::NoRouteToPeer { peer: target.ip });
    };
    let dev = match seen.link_index(oif) {
        Some(l) => Some(l.clone()),
        None => k.link_at(oif)?,
    }
    .ok_or(Error::NoRouteToPeer { peer: target.ip })?;
    Ok((src, dev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Fake, conf, peer};
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    /// A peers file of peers `from..=to`: underlay 198.18.0.0 + i, subnet the i-th /24 of
    /// 10.0.0.0/8.
    fn file(from: u32, to: u32) -> Vec<u8> {
        let entries: Vec<serde_json::Value> = (from..=to)
            .map(|i| {
                let ip = Ipv4Addr::from(0xc612_0000 + i);
                let subnet = format!("{}/24", Ipv4Addr::from(0x0a00_0000 + (i << 8)));
                serde_json::json!({"ip": ip.to_string(), "subnets": [subnet]})
            })
            .collect();
        serde_json::to_vec(&entries).unwrap()
    }

    fn gathered(text: &[u8]) -> Gathered {
        Gathered {
            peers: peers::parse_file(text).unwrap(),
            file_error: None,
            file_text: Some(text.to_vec()),
        }
    }

    fn vtep() -> DeviceId {
        DeviceId::of(&Link {
            index: 4,
            name: "sticky.1".into(),
            ..Link::default()
        })
    }

    fn applied(text: &[u8]) -> Option<Applied> {
        Some(Applied {
            vtep: vtep(),
            peers_hash: Some(stamp::hash(text)),
        })
    }

    fn looked_up(read: FdbRead) -> Vec<[u8; 6]> {
        match read {
            FdbRead::Only { vtep: v, macs } if v == vtep() => macs,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fdb_entries_are_looked_up_only_where_the_last_reconcile_says_what_it_left() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("edge.peers.json");
        let n = LOOK_UP_FROM as u32;
        let now = file(1, n);
        let g = gathered(&now);
        assert_eq!(fdb_read(1, None, &g, &copy), FdbRead::Whole, "no stamp");
        // It applied this very file: this file's MACs.
        let macs = looked_up(fdb_read(1, applied(&now), &g, &copy));
        assert_eq!(macs.len(), LOOK_UP_FROM);
        // It applied the file before, which the copy is: that file's MACs too, so the entry
        // of a peer gone since is found and deleted.
        let before = file(2, n + 1);
        std::fs::write(&copy, &before).unwrap();
        let macs = looked_up(fdb_read(1, applied(&before), &g, &copy));
        assert_eq!(macs.len(), LOOK_UP_FROM + 1);
        let gone = vtep_mac(Ipv4Addr::from(0xc612_0000 + n + 1).into(), 1);
        assert!(macs.contains(&gone));
        // The copy is not the file it applied (one that did not finish; the copy is written
        // first): nothing says what is on the VTEP.
        let unfinished = file(3, n + 2);
        assert_eq!(fdb_read(1, applied(&unfinished), &g, &copy), FdbRead::Whole);
        std::fs::remove_file(&copy).unwrap();
        assert_eq!(fdb_read(1, applied(&before), &g, &copy), FdbRead::Whole);
        // Fewer peers: the dump costs less.
        let few = file(1, n - 1);
        assert_eq!(
            fdb_read(1, applied(&few), &gathered(&few), &copy),
            FdbRead::Whole
        );
    }

    #[test]
    fn fdb_entries_are_looked_up_on_the_vtep_the_stamp_names_only() {
        let cfg = conf(serde_json::json!({}));
        let mut k = Fake::node("192.0.2.1/24");
        k.add_link(&cfg.vtep_name, "vxlan");
        let link = k.link_mut(&cfg.vtep_name).clone();
        let macs = vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
        let only = |vtep| FdbRead::Only {
            vtep,
            macs: macs.clone(),
        };
        Observed::read(&mut k, &cfg, &only(DeviceId::of(&link))).unwrap();
        assert!(
            k.queries.contains(&"get 2 fdb entries".to_string()),
            "{:?}",
            k.queries
        );
        assert!(!k.queries.contains(&"dump fdb".to_string()));
        // Another device of that name (made again, or changed): every entry.
        k.queries.clear();
        let mut other = link.clone();
        other.mtu = Some(1400);
        Observed::read(&mut k, &cfg, &only(DeviceId::of(&other))).unwrap();
        assert!(
            k.queries.contains(&"dump fdb".to_string()),
            "{:?}",
            k.queries
        );
    }

    fn identify_on(k: &mut Fake, cfg: &Config, all: &[Peer]) -> Result<LocalNode, Error> {
        let seen = Observed::read(k, cfg, &FdbRead::Whole).unwrap();
        identify(k, cfg, &seen, all, None)
    }

    #[test]
    fn underlay_is_the_address_this_nodes_entry_names() {
        let mut k = Fake::node("192.0.2.1/24");
        k.add_address("eth0", "198.51.100.7/24");
        let cfg = conf(serde_json::json!({}));
        let all = [
            peer("192.0.2.2", "10.244.2.0/24"),
            peer("198.51.100.7", "10.244.7.0/24"),
        ];
        let node = identify_on(&mut k, &cfg, &all).unwrap();
        assert_eq!(node.local_ip, "198.51.100.7".parse::<Ipv4Addr>().unwrap());
        assert_eq!(node.underlay.name, "eth0");
        assert_eq!(node.mtu, 1450);
        assert_eq!(node.remote.len(), 1);
    }

    #[test]
    fn without_an_own_entry_the_route_to_the_first_peer_picks_the_underlay() {
        let mut k = Fake::node("192.0.2.1/24");
        let cfg = conf(serde_json::json!({}));
        let err = identify_on(&mut k, &cfg, &[peer("192.0.2.2", "10.244.2.0/24")]).unwrap_err();
        assert!(
            matches!(err, Error::NoLocalEntry { local } if local == Ipv4Addr::new(192, 0, 2, 1)),
            "{err}"
        );
        assert!(
            k.queries.iter().any(|q| q == "route to 192.0.2.2"),
            "{:?}",
            k.queries
        );
    }

    #[test]
    fn loopback_and_second_own_entries_never_become_this_node() {
        let mut k = Fake::node("192.0.2.1/24");
        k.add_link("lo", "loopback");
        k.add_address("lo", "127.0.0.1/8");
        k.add_address("eth0", "192.0.2.101/24");
        let cfg = conf(serde_json::json!({}));
        let lo = Peer {
            ip: Ipv4Addr::LOCALHOST.into(),
            ..peer("192.0.2.9", "10.244.9.0/24")
        };
        // (check_entries refuses it in any list; even if it got here it is not this node.)
        let node = identify_on(&mut k, &cfg, &[peer("192.0.2.1", "10.244.1.0/24"), lo]).unwrap();
        assert_eq!(node.local_ip, Ipv4Addr::new(192, 0, 2, 1));
        let two = [
            peer("192.0.2.1", "10.244.1.0/24"),
            peer("192.0.2.101", "10.244.9.0/24"),
        ];
        let err = identify_on(&mut k, &cfg, &two).unwrap_err();
        assert!(
            matches!(err, Error::Peers(peers::Error::ManyLocal { .. })),
            "{err}"
        );
    }

    #[test]
    fn underlay_network_and_broadcast_addresses_are_not_peers() {
        // Each IPv4 edge with its IPv6 twin, named in the error.
        let cases = [
            ("192.0.2.1/24", "192.0.2.255", "the broadcast address"),
            ("192.0.2.1/24", "192.0.2.0", "the network address"),
            (
                "2001:db8::1/64",
                "2001:db8::",
                "the subnet-router anycast address",
            ),
            (
                "2001:db8::1/64",
                "2001:db8::fdff:ffff:ffff:ffff",
                "a reserved subnet anycast",
            ),
        ];
        for (underlay, ip, what) in cases {
            let mut k = Fake::node(underlay);
            let cfg = conf(serde_json::json!({}));
            let own = underlay.split('/').next().unwrap();
            let all = [peer(own, "10.244.1.0/24"), peer(ip, "10.244.9.0/24")];
            let err = identify_on(&mut k, &cfg, &all).unwrap_err();
            assert!(
                matches!(err, Error::Peers(peers::Error::UnderlayEdge { .. })),
                "{ip}: {err}"
            );
            let text = err.to_string();
            assert!(text.contains(&format!("peer ip {ip} is {what}")), "{text}");
        }
    }

    #[test]
    fn addresses_that_cannot_be_a_node_are_refused_in_both_families() {
        let rows: &[(&str, &str, &str, &str, &str, bool)] = &[
            (
                "unspecified",
                "0.0.0.0",
                "192.0.2.1/24",
                "::",
                "2001:db8::1/64",
                true,
            ),
            (
                "loopback",
                "127.0.0.1",
                "192.0.2.1/24",
                "::1",
                "2001:db8::1/64",
                true,
            ),
            (
                "multicast",
                "224.0.0.1",
                "192.0.2.1/24",
                "ff02::1",
                "2001:db8::1/64",
                true,
            ),
            (
                "link-local",
                "169.254.1.1",
                "192.0.2.1/24",
                "fe80::1",
                "2001:db8::1/64",
                true,
            ),
            // IPv6 has no broadcast; its all-nodes address is multicast.
            (
                "broadcast",
                "255.255.255.255",
                "192.0.2.1/24",
                "ff02::1",
                "2001:db8::1/64",
                true,
            ),
            // "This network" (IPv4) and the IPv4-compatible addresses (IPv6): no destination
            // of the underlay.
            (
                "this network / IPv4-compatible",
                "0.1.2.3",
                "192.0.2.1/24",
                "::192.0.2.9",
                "2001:db8::1/64",
                true,
            ),
            // An IPv4 address is itself; in IPv6's clothes it is refused.
            (
                "IPv4-mapped",
                "192.0.2.9",
                "192.0.2.1/24",
                "::ffff:192.0.2.9",
                "2001:db8::1/64",
                false,
            ),
            // The subnet's lowest address: the network address / the subnet-router anycast
            // address (which a forwarding node holds itself).
            (
                "subnet's lowest",
                "192.0.2.0",
                "192.0.2.1/24",
                "2001:db8::",
                "2001:db8::1/64",
                true,
            ),
            (
                "subnet's lowest, shorter prefix",
                "10.0.0.0",
                "10.1.2.3/8",
                "2001:db8::",
                "2001:db8:0:1::1/48",
                true,
            ),
            // The subnet's highest: the broadcast address / the reserved subnet anycast
            // addresses (RFC 2526; in a /64, interface identifiers fdff:ffff:ffff:ff80-ff).
            (
                "subnet's highest",
                "192.0.2.255",
                "192.0.2.1/24",
                "2001:db8::fdff:ffff:ffff:ffff",
                "2001:db8::1/64",
                true,
            ),
            (
                "reserved anycast, lowest of 128",
                "192.0.2.255",
                "192.0.2.1/24",
                "2001:db8::fdff:ffff:ffff:ff80",
                "2001:db8::1/64",
                true,
            ),
            (
                "reserved anycast, in each /64 of a shorter prefix",
                "10.255.255.255",
                "10.1.2.3/8",
                "2001:db8:0:7:fdff:ffff:ffff:ff80",
                "2001:db8::1/48",
                true,
            ),
            (
                "reserved anycast, a longer prefix",
                "192.0.2.127",
                "192.0.2.1/25",
                "2001:db8::ff80",
                "2001:db8::1/112",
                true,
            ),
            // Just below the reserved ones, and a node's address with the u bit set: hosts.
            (
                "just below the highest",
                "192.0.2.254",
                "192.0.2.1/24",
                "2001:db8::fdff:ffff:ffff:ff7f",
                "2001:db8::1/64",
                false,
            ),
            (
                "all ones but u/l",
                "192.0.2.254",
                "192.0.2.1/24",
                "2001:db8::ffff:ffff:ffff:ffff",
                "2001:db8::1/64",
                false,
            ),
            // Point-to-point links have no edges (RFC 3021, RFC 6164).
            (
                "point-to-point",
                "192.0.2.0",
                "192.0.2.1/31",
                "2001:db8::",
                "2001:db8::1/127",
                false,
            ),
            // Another subnet's edges are not this node's to judge.
            (
                "another subnet's lowest",
                "198.51.100.0",
                "192.0.2.1/24",
                "2001:db8:1::",
                "2001:db8::1/64",
                false,
            ),
            (
                "a plain host",
                "192.0.2.2",
                "192.0.2.1/24",
                "2001:db8::2",
                "2001:db8::1/64",
                false,
            ),
        ];
        let refusal = |ip: &str, net: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            let net: IpNet = net.parse().unwrap();
            peers::not_a_node(ip).or_else(|| underlay_edge(net, ip).map(|(what, _)| what))
        };
        for (rule, v4, net4, v6, net6, refused) in rows {
            let (r4, r6) = (refusal(v4, net4), refusal(v6, net6));
            if *rule == "IPv4-mapped" {
                assert_eq!((r4, r6), (None, Some("an IPv4-mapped address")), "{rule}");
                continue;
            }
            assert_eq!(r4.is_some(), *refused, "{rule}: {v4} on {net4}: {r4:?}");
            assert_eq!(r6.is_some(), *refused, "{rule}: {v6} on {net6}: {r6:?}");
        }
        assert_eq!(
            refusal("2001:db8::", "2001:db8::1/64"),
            Some("the subnet-router anycast address")
        );
        assert_eq!(
            refusal("192.0.2.0", "192.0.2.1/24"),
            Some("the network address")
        );
    }

    #[test]
    fn with_sites_the_mtu_leaves_room_for_the_tunnel() {
        let link = |mtu| Link {
            mtu: Some(mtu),
            ..Fake::node("192.0.2.1/24").seen.links[0].clone()
        };
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        // (underlay MTU, address, wanted, wanMtu) -> MTU
        assert_eq!(mtu_for(&link(1500), v4, None, None).unwrap(), 1450);
        assert_eq!(mtu_for(&link(1500), v4, None, Some(1500)).unwrap(), 1424);
        assert_eq!(mtu_for(&link(1500), v6, None, Some(1500)).unwrap(), 1408);
        assert_eq!(mtu_for(&link(9000), v4, None, Some(1492)).unwrap(), 1408);
        assert_eq!(
            mtu_for(&link(1400), v4, None, Some(1500)).unwrap(),
            1350,
            "LAN bound"
        );
        assert_eq!(
            mtu_for(&link(1500), v4, Some(1400), Some(1500)).unwrap(),
            1400
        );
        let err = mtu_for(&link(1500), v4, Some(1450), Some(1500)).unwrap_err();
        assert!(matches!(err, Error::MtuAboveWan { max: 1424, .. }), "{err}");
    }

    #[test]
    fn mtu_above_the_underlay_is_refused() {
        let mut k = Fake::node("192.0.2.1/24");
        let cfg = conf(serde_json::json!({"mtu": 1460}));
        let err = identify_on(&mut k, &cfg, &[peer("192.0.2.1", "10.244.1.0/24")]).unwrap_err();
        assert!(matches!(err, Error::MtuTooLarge { max: 1450, .. }), "{err}");
    }
}
