//! Peers without a control plane: from the network config and/or a peers file, merged by union.
//!
//! One cluster-wide list can be installed identically on every node: the entry whose `ip` is
//! one of this node's addresses is the node itself and names its local subnet(s); every other
//! entry is a remote VTEP.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::mac::vtep_mac;
use sticky_netlink::link::{format_mac, parse_mac};
use sticky_primitives::nofollow::{self, Durability};

/// One entry as written in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerEntry {
    pub ip: IpAddr,
    pub subnets: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Other sites' pod subnets this peer (its site's active gateway) carries: routed to it
    /// as its own subnets are (docs/sites.md). Written by the agent; empty without sites.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carries: Vec<IpNet>,
}

/// A checked peer: underlay address (IPv4 or IPv6, one family per network), pod subnets (one
/// IPv4, optionally one IPv6) and an explicit VTEP MAC for nodes that do not use the kept-MAC
/// scheme (e.g. flannel nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub ip: IpAddr,
    pub subnets: Vec<IpNet>,
    pub mac: Option<[u8; 6]>,
    /// Other sites' pod subnets routed through this peer (see [`PeerEntry::carries`]): each
    /// of a family of one of its `subnets` (that subnet's network address is the next hop).
    pub carries: Vec<IpNet>,
}

impl Peer {
    /// Its own subnets, then those it carries for other sites: every subnet routed to it.
    pub fn routed(&self) -> impl Iterator<Item = &IpNet> {
        self.subnets.iter().chain(&self.carries)
    }

    /// The next hop of `dst` through this peer's VTEP: the network address of its own subnet
    /// of `dst`'s family (for its own subnets, that subnet's own network address).
    pub fn next_hop(&self, dst: &IpNet) -> Option<IpAddr> {
        if self.subnets.contains(dst) {
            return Some(dst.network());
        }
        self.subnets
            .iter()
            .find(|s| s.addr().is_ipv4() == dst.addr().is_ipv4())
            .map(IpNet::network)
    }
}

/// Why a peer list cannot be used. Each names the peer (and the subnet or MAC) at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("peer ip {ip} is {what}: a peer's ip must be a node's unicast underlay address")]
    NotUnicast { ip: IpAddr, what: &'static str },
    #[error(
        "peers {ipv4} and {ipv6} are on underlays of two families: one network's underlay is IPv4 or IPv6 (make a second network for the other)"
    )]
    MixedUnderlay { ipv4: IpAddr, ipv6: IpAddr },
    #[error(
        "peer {ip} has subnets {subnets:?}: expected one IPv4 subnet and at most one IPv6 subnet"
    )]
    Subnets { ip: IpAddr, subnets: Vec<String> },
    #[error("peer {ip} subnet {subnet} has host bits set (did you mean {}?)", subnet.trunc())]
    HostBits { ip: IpAddr, subnet: IpNet },
    #[error("peer {ip} subnet {subnet} is too small for pods")]
    TooSmall { ip: IpAddr, subnet: IpNet },
    #[error("peer {ip} mac {mac:?} is not a unicast MAC like 0a:01:c0:00:02:01")]
    BadMac { ip: IpAddr, mac: String },
    #[error(
        "peer {ip} carries {subnet}, {why}: a carried subnet is another site's pod subnet, routed through this peer's own subnet of its family"
    )]
    Carries {
        ip: IpAddr,
        subnet: IpNet,
        why: &'static str,
    },
    #[error("peer {ip} is listed twice with different settings")]
    Twice { ip: IpAddr },
    #[error(
        "peer {ip} subnet {subnet} holds the underlay address of peer {holder}: a pod subnet must not overlap the underlay"
    )]
    HoldsUnderlay {
        ip: IpAddr,
        subnet: IpNet,
        holder: IpAddr,
    },
    #[error("peer {ip} subnet {subnet} overlaps peer {other} subnet {other_subnet}")]
    Overlap {
        ip: IpAddr,
        subnet: IpNet,
        other: IpAddr,
        other_subnet: IpNet,
    },
    #[error(
        "peer {ip} has VTEP MAC {}, which is {}: every node needs its own (check the peers' \"mac\")",
        format_mac(mac),
        match other { Some(o) => format!("also the VTEP MAC of peer {o}"), None => "this node's own VTEP MAC".into() }
    )]
    SharedMac {
        ip: IpAddr,
        mac: [u8; 6],
        other: Option<IpAddr>,
    },
    #[error("peer ip {ip} is {what} of the underlay subnet {subnet}: not a node's address ({why})")]
    UnderlayEdge {
        ip: IpAddr,
        what: &'static str,
        subnet: IpNet,
        why: &'static str,
    },
    #[error(
        "peers {} all name addresses of this node: exactly one entry may name it (its underlay address), or the node cannot tell which it is",
        ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    ManyLocal { ips: Vec<IpAddr> },
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("peers file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "peers file {path} is owned by uid {uid} with mode {mode:o}: it must be owned by root and not writable by group or others (anyone who can write it can redirect pod traffic)"
    )]
    Unsafe { path: PathBuf, uid: u32, mode: u32 },
    #[error("peers file {path} is not a regular file (a FIFO, device or directory): refused")]
    NotRegular { path: PathBuf },
    #[error(
        "peers file {path} is not JSON of the expected form: {source} (expected a list of {{\"ip\", \"subnets\", \"mac\"?}} or {{\"peers\": [...]}})"
    )]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("peers file {path} is not a valid peer list: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: Error,
    },
}

/// Why `ip` can never be a node's underlay address, if it cannot: the one rule for peer
/// entries, `localIp`, a segment's `nodes` and which of this node's addresses may name it.
pub fn not_a_node(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("a loopback address");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    match ip {
        IpAddr::V4(a) if a.is_link_local() => Some("link-local"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        // 0.0.0.0/8 is "this host on this network" (RFC 1122): a source, never a destination.
        IpAddr::V4(a) if a.octets()[0] == 0 => Some("in 0.0.0.0/8 (this network: a source only)"),
        IpAddr::V4(_) => None,
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("link-local"),
        // ::ffff:a.b.c.d is an IPv4 node in IPv6's clothes: name it by its IPv4 address.
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Some("an IPv4-mapped address"),
        // ::a.b.c.d (deprecated by RFC 4291) is carried by IPv4 tunnels, not by the underlay.
        IpAddr::V6(a) if a.segments()[..6] == [0; 6] => {
            Some("an IPv4-compatible address (::/96, deprecated)")
        }
        IpAddr::V6(_) => None,
    }
}

/// Checks entries one by one and merges them ([`merge`]).
pub fn check_entries(entries: &[PeerEntry]) -> Result<Vec<Peer>, Error> {
    let peers = entries
        .iter()
        .map(check_entry)
        .collect::<Result<Vec<_>, _>>()?;
    merged(peers)
}

/// One entry checked alone: what every peer must be, whatever the others are.
pub fn check_entry(e: &PeerEntry) -> Result<Peer, Error> {
    let ip = e.ip;
    if let Some(what) = not_a_node(ip) {
        return Err(Error::NotUnicast { ip, what });
    }
    let v4 = e.subnets.iter().filter(|s| s.addr().is_ipv4()).count();
    let v6 = e.subnets.len() - v4;
    if v4 != 1 || v6 > 1 {
        return Err(Error::Subnets {
            ip,
            subnets: e.subnets.iter().map(ToString::to_string).collect(),
        });
    }
    for &subnet in &e.subnets {
        if subnet.trunc() != subnet {
            return Err(Error::HostBits { ip, subnet });
        }
        if subnet.prefix_len() >= subnet.max_prefix_len() - 1 {
            return Err(Error::TooSmall { ip, subnet });
        }
    }
    let mac = match &e.mac {
        None => None,
        Some(text) => match parse_mac(text) {
            Some(m) if m[0] & 1 == 0 && m != [0; 6] => Some(m),
            _ => {
                return Err(Error::BadMac {
                    ip,
                    mac: text.clone(),
                });
            }
        },
    };
    for &subnet in &e.carries {
        let why = if subnet.trunc() != subnet {
            Some("which has host bits set")
        } else if !e
            .subnets
            .iter()
            .any(|s| s.addr().is_ipv4() == subnet.addr().is_ipv4())
        {
            Some("of a family none of its own subnets has")
        } else if e.carries.iter().filter(|c| **c == subnet).count() > 1 {
            Some("listed twice")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::Carries { ip, subnet, why });
        }
    }
    Ok(Peer {
        ip,
        subnets: e.subnets.clone(),
        mac,
        carries: e.carries.clone(),
    })
}

/// Union of two peer lists. The same peer may appear in both; the same `ip` with different
/// subnets or MAC, or two peers whose subnets overlap, is an error. O(n log n): every peer is
/// checked against a [`Claims`] index of those before it, in the order of their `ip`.
pub fn merge(a: &[Peer], b: &[Peer]) -> Result<Vec<Peer>, Error> {
    merged(a.iter().chain(b).cloned().collect())
}

/// [`merge`] of one list, taken whole (a peers file's entries: nothing is copied).
fn merged(mut all: Vec<Peer>) -> Result<Vec<Peer>, Error> {
    // Ordered by address (stable: of the same peer twice, the first stays), every IPv4 peer
    // comes before every IPv6 one.
    all.sort_by_key(|p| p.ip);
    let mut twice = None;
    all.dedup_by(|later, kept| {
        let same_ip = later.ip == kept.ip;
        if same_ip && later != kept {
            twice.get_or_insert(later.ip);
        }
        same_ip
    });
    if let Some(ip) = twice {
        return Err(Error::Twice { ip });
    }
    if let (Some(v4), Some(v6)) = (
        all.first().map(|p| p.ip).filter(IpAddr::is_ipv4),
        all.last().map(|p| p.ip).filter(IpAddr::is_ipv6),
    ) {
        return Err(Error::MixedUnderlay { ipv4: v4, ipv6: v6 });
    }
    if !clear(all.iter()) {
        let mut claims = Claims::default();
        for p in &all {
            claims.conflict(p).map_or(Ok(()), Err)?;
            claims.insert(p);
        }
    }
    Ok(all)
}

/// Whether no peer of `all` (in any order) is in another's way: no two share an underlay
/// address, no two subnets routed to them overlap, no underlay address lies in a subnet. Then
/// [`Claims`] finds no conflict among them, whatever order they are inserted in; when this
/// says no, [`Claims`] says which. Sorts, no index: for the agent's placement at 100,000.
pub fn conflict_free(all: &[&Peer]) -> bool {
    let mut ips: Vec<IpAddr> = all.iter().map(|p| p.ip).collect();
    ips.sort_unstable();
    ips.windows(2).all(|w| w[0] != w[1]) && clear(all.iter().copied())
}

/// Whether nothing in `all` (in any order) can be in another's way: no two subnets
/// routed to its peers overlap (a peer's own included) and no underlay address lies in one.
/// Every conflict [`Claims`] finds but the same address twice is one of these, so a list of
/// distinct addresses that is clear has none; one that is not is walked through [`Claims`],
/// which says what is in whose way, if anything is. Two sorts and a walk: at 100,000 peers
/// the walk through the index cost a tenth of a reconcile.
fn clear<'a>(all: impl Iterator<Item = &'a Peer> + Clone) -> bool {
    // (is IPv6, first address, last address) of every subnet, in order.
    let mut ranges: Vec<(bool, u128, u128)> = all
        .clone()
        .flat_map(Peer::routed)
        .map(|n| (n.addr().is_ipv6(), wide(n.network()), wide(n.broadcast())))
        .collect();
    ranges.sort_unstable();
    // Sorted by their start, some two overlap only if some neighbours do.
    if ranges
        .windows(2)
        .any(|w| w[0].0 == w[1].0 && w[1].1 <= w[0].2)
    {
        return false;
    }
    // With none overlapping, only the last subnet starting at or before an address can hold it.
    let mut all = all;
    all.all(|p| {
        let key = (p.ip.is_ipv6(), wide(p.ip));
        let before = ranges.partition_point(|&(v6, first, _)| (v6, first) <= key);
        before == 0 || {
            let (v6, _, last) = ranges[before - 1];
            v6 != key.0 || key.1 > last
        }
    })
}

/// An address as a number of its family.
fn wide(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// What the peers of a list hold (their underlay address and their pod subnets), indexed so
/// that whether a new peer conflicts with them is answered in O(log n): the one place the
/// "no two peers share an address or overlapping subnets" rules live, used to check a whole
/// list ([`merge`]) and, peer by peer, by the agent.
#[derive(Debug, Default, Clone)]
pub struct Claims {
    /// Underlay address → nothing (the peer is identified by it).
    ips: std::collections::BTreeSet<IpAddr>,
    /// (is IPv6, network address, prefix length) → the peer holding that subnet.
    subnets: BTreeMap<(bool, u128, u8), IpAddr>,
}

fn subnet_key(net: &IpNet) -> (bool, u128, u8) {
    match net {
        IpNet::V4(n) => (false, u128::from(u32::from(n.network())), n.prefix_len()),
        IpNet::V6(n) => (true, u128::from(n.network()), n.prefix_len()),
    }
}

impl Claims {
    /// The peer already holding `ip` as its underlay address, or a subnet that contains
    /// `ip`, or a subnet overlapping `net`: whichever `peer` runs into first.
    pub fn conflict(&self, peer: &Peer) -> Option<Error> {
        if self.ips.contains(&peer.ip) {
            return Some(Error::Twice { ip: peer.ip });
        }
        // Its underlay address inside a subnet already held (or one of its own).
        let own = IpNet::from(peer.ip);
        if let Some((subnet, holder)) = self.containing(&own) {
            return Some(Error::HoldsUnderlay {
                ip: holder,
                subnet,
                holder: peer.ip,
            });
        }
        for &subnet in peer.routed() {
            // An underlay address already held inside one of its subnets, or its own.
            if let Some(&holder) = self.ips.range(subnet.network()..=subnet.broadcast()).next() {
                return Some(Error::HoldsUnderlay {
                    ip: peer.ip,
                    subnet,
                    holder,
                });
            }
            if subnet.contains(&peer.ip) {
                return Some(Error::HoldsUnderlay {
                    ip: peer.ip,
                    subnet,
                    holder: peer.ip,
                });
            }
            if let Some((other_subnet, other)) =
                self.containing(&subnet).or_else(|| self.inside(&subnet))
            {
                return Some(Error::Overlap {
                    ip: other,
                    subnet: other_subnet,
                    other: peer.ip,
                    other_subnet: subnet,
                });
            }
        }
        None
    }

    /// Records what `peer` holds (after [`Claims::conflict`] said it may).
    pub fn insert(&mut self, peer: &Peer) {
        self.ips.insert(peer.ip);
        for subnet in peer.routed() {
            self.subnets.insert(subnet_key(subnet), peer.ip);
        }
    }

    /// Forgets what `peer` holds.
    pub fn remove(&mut self, peer: &Peer) {
        self.ips.remove(&peer.ip);
        for subnet in peer.routed() {
            if self.subnets.get(&subnet_key(subnet)) == Some(&peer.ip) {
                self.subnets.remove(&subnet_key(subnet));
            }
        }
    }

    /// A held subnet equal to or containing `net`. Held subnets never overlap each other
    /// (one is inserted only when [`Claims::conflict`] found nothing), so the only candidate is
    /// the last one at or before `net` in the index's order: one range lookup.
    fn containing(&self, net: &IpNet) -> Option<(IpNet, IpAddr)> {
        let key = subnet_key(net);
        let (v6, _, _) = key;
        let (&found, &holder) = self.subnets.range((v6, 0, 0)..=key).next_back()?;
        let candidate = key_net(found);
        (candidate.prefix_len() <= net.prefix_len() && candidate.contains(&net.network()))
            .then_some((candidate, holder))
    }

    /// A held subnet strictly inside `net`.
    fn inside(&self, net: &IpNet) -> Option<(IpNet, IpAddr)> {
        let (v6, addr, prefix) = subnet_key(net);
        let host_bits = u32::from(net.max_prefix_len() - prefix);
        let last = if host_bits >= 128 {
            u128::MAX
        } else {
            addr | ((1u128 << host_bits) - 1)
        };
        self.subnets
            .range((v6, addr, prefix)..=(v6, last, u8::MAX))
            .next()
            .map(|(&key, &holder)| (key_net(key), holder))
    }
}

fn key_net((v6, addr, prefix): (bool, u128, u8)) -> IpNet {
    if v6 {
        IpNet::V6(ipnet::Ipv6Net::new(addr.into(), prefix).unwrap_or_default())
    } else {
        let v4 = Ipv4Addr::from(u32::try_from(addr).unwrap_or(0));
        IpNet::V4(ipnet::Ipv4Net::new(v4, prefix).unwrap_or_default())
    }
}

/// Reads a peers file: a JSON list of entries, or `{"peers": [...]}`, with the exact bytes
/// it was parsed from. The file must be a regular file owned by root and not writable by
/// group or others; the checks are made on the open file itself, so the bytes are those of
/// the file that was checked even if the path is replaced meanwhile. It is opened without
/// blocking, so a FIFO (or a device) at the path is refused instead of hanging the call.
/// Links are followed: a ConfigMap volume presents its files through links, and what is
/// checked is the file they lead to (nothing is ever written there).
pub fn read_file(path: &Path) -> Result<(Vec<Peer>, Vec<u8>), FileError> {
    read_owned_by(path, 0)
}

/// [`read_file`], with the owner the file must have.
fn read_owned_by(path: &Path, owner: u32) -> Result<(Vec<Peer>, Vec<u8>), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let read = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::options()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    if meta.uid() != owner || meta.mode() & 0o022 != 0 {
        return Err(FileError::Unsafe {
            path: path.to_path_buf(),
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        });
    }
    let mut text = Vec::new();
    file.read_to_end(&mut text).map_err(read)?;
    let peers = parse_file(&text).map_err(|e| match e {
        ParseError::Json(source) => FileError::Json {
            path: path.to_path_buf(),
            source,
        },
        ParseError::Invalid(source) => FileError::Invalid {
            path: path.to_path_buf(),
            source,
        },
    })?;
    Ok((peers, text))
}

/// The peer list of a config and its peers file, as read: nothing is written while gathering.
#[derive(Debug)]
pub struct Gathered {
    /// The config's peers merged with the file's (or its last good copy's).
    pub peers: Vec<Peer>,
    /// Why the file could not be used, if it could not: its last good copy stood in for it.
    pub file_error: Option<FileError>,
    /// The file's bytes when it was used: what [`Gathered::keep_last_good`] keeps.
    pub file_text: Option<Vec<u8>>,
}

impl Gathered {
    /// Keeps the file that was used as the last good copy `copy` (when it differs; best
    /// effort, logged). Written by the one who programs the node, under the network's lock,
    /// never by a read.
    pub fn keep_last_good(&self, copy: &Path) {
        if let Some(text) = &self.file_text {
            keep_last_good(copy, text);
        }
    }
}

/// The peers listed in a config merged with those of its peers file; and why the file could
/// not be used, if it could not. An unusable file is replaced by its last good copy `copy`,
/// so a broken file never removes a peer; a usable one is for the caller to keep
/// ([`Gathered::keep_last_good`]).
pub fn gather(listed: &[Peer], file: Option<&Path>, copy: &Path) -> Result<Gathered, Error> {
    let (from_file, file_error, file_text) = match file.map(read_file) {
        None => (Vec::new(), None, None),
        Some(Ok((list, text))) => (list, None, Some(text)),
        Some(Err(e)) => (last_good(copy), Some(e), None),
    };
    // The file's list is merged already ([`check_entries`]).
    let peers = if listed.is_empty() {
        from_file
    } else {
        merge(listed, &from_file)?
    };
    Ok(Gathered {
        peers,
        file_error,
        file_text,
    })
}

/// Why the text of a peers file is not a peer list.
#[derive(Debug)]
pub enum ParseError {
    Json(serde_json::Error),
    Invalid(Error),
}

/// A peers file's text as a checked, merged peer list: a JSON list of entries, or an object
/// whose `peers` is one. Which of the two is told by the first character, so the entries are
/// read straight into their type (serde's untagged enum would first copy the whole document
/// into a generic tree: a quarter of a reconcile's time at 100,000 peers).
pub fn parse_file(text: &[u8]) -> Result<Vec<Peer>, ParseError> {
    #[derive(Deserialize)]
    struct Wrapped {
        peers: Vec<PeerEntry>,
    }
    let list = text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let entries = if list {
        serde_json::from_slice::<Vec<PeerEntry>>(text)
    } else {
        serde_json::from_slice::<Wrapped>(text).map(|w| w.peers)
    }
    .map_err(ParseError::Json)?;
    check_entries(&entries).map_err(ParseError::Invalid)
}

/// Every remote peer needs a VTEP MAC of its own (its kept MAC or its explicit `mac`), and none
/// may be this node's (`local`'s kept MAC): the FDB maps a MAC to every node listed behind it,
/// so two peers sharing one would each be sent the other's traffic.
pub(crate) fn check_macs(vni: u32, local: IpAddr, remote: &[Peer]) -> Result<(), Error> {
    let mut seen: BTreeMap<[u8; 6], IpAddr> = BTreeMap::new();
    seen.insert(vtep_mac(local, vni), local);
    for p in remote {
        let mac = p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni));
        if let Some(other) = seen.insert(mac, p.ip) {
            return Err(Error::SharedMac {
                ip: p.ip,
                mac,
                other: (other != local).then_some(other),
            });
        }
    }
    Ok(())
}

/// Splits peers into this node (the one entry whose ip is one of `local_addrs`) and the
/// others. More than one entry naming this node is refused: which one it is would depend on
/// the order of the list.
pub fn split_local(
    peers: &[Peer],
    local_addrs: &[IpAddr],
) -> Result<(Option<Peer>, Vec<Peer>), Error> {
    let (local, remote): (Vec<Peer>, Vec<Peer>) = peers
        .iter()
        .cloned()
        .partition(|p| local_addrs.contains(&p.ip));
    if local.len() > 1 {
        return Err(Error::ManyLocal {
            ips: local.iter().map(|p| p.ip).collect(),
        });
    }
    Ok((local.into_iter().next(), remote))
}

/// Keeps `text`, a peers file that just parsed, as the last good copy ([`nofollow::replace`],
/// so the copy is always whole). [`Durability::Cache`]: the copy is only the fallback for a
/// broken peers file, and every reconcile that reads a good file writes it again. Best effort:
/// failing to keep it only weakens the fallback, so it is logged.
pub fn keep_last_good(copy: &Path, text: &[u8]) {
    if nofollow::read(copy).is_ok_and(|old| old.as_deref() == Some(text)) {
        return;
    }
    let Some(dir) = copy.parent() else {
        return;
    };
    let saved = super::state_dir::create_dir(dir)
        .and_then(|()| nofollow::replace(copy, text, 0o600, Durability::Cache));
    if let Err(e) = saved {
        eprintln!(
            "sticky-vxlan: keeping a copy of the peers file in {}: {e}",
            copy.display()
        );
    }
}

/// The last valid peers list, or none.
pub fn last_good(copy: &Path) -> Vec<Peer> {
    nofollow::read(copy)
        .ok()
        .flatten()
        .and_then(|text| parse_file(&text).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    mod clear_lists {
        use super::*;
        use proptest::prelude::*;

        /// A peer of a crowded space: addresses and subnets of 10.0.0.0/26 (and one IPv6
        /// block), so that lists often collide in every way there is.
        fn peer() -> impl Strategy<Value = Peer> {
            let net = (0u32..64, 26u8..=32).prop_map(|(a, len)| {
                IpNet::new(Ipv4Addr::from(0x0a00_0000 | a).into(), len)
                    .unwrap()
                    .trunc()
            });
            let v6 = (0u16..4, 126u8..=128).prop_map(|(a, len)| {
                IpNet::new(format!("2001:db8::{a}").parse().unwrap(), len)
                    .unwrap()
                    .trunc()
            });
            (
                0u32..64,
                net.clone(),
                prop::option::of(v6),
                prop::collection::vec(net, 0..2),
            )
                .prop_map(|(ip, own, own6, carries)| Peer {
                    ip: Ipv4Addr::from(0x0a00_0000 | ip).into(),
                    subnets: std::iter::once(own).chain(own6).collect(),
                    mac: None,
                    carries,
                })
        }

        proptest! {
            /// `clear` and `conflict_free` are only shortcuts: a list they let through is
            /// one the index finds nothing in, in whatever order it is walked.
            #[test]
            fn a_clear_list_is_one_claims_finds_nothing_in(peers in prop::collection::vec(peer(), 1..6)) {
                let unsorted: Vec<&Peer> = peers.iter().collect();
                if conflict_free(&unsorted) {
                    let mut claims = Claims::default();
                    for p in &unsorted {
                        prop_assert!(claims.conflict(p).is_none(), "{unsorted:?}");
                        claims.insert(p);
                    }
                }
                let mut all = peers.clone();
                all.sort_by_key(|p| p.ip);
                all.dedup_by_key(|p| p.ip);
                if clear(all.iter()) {
                    let mut claims = Claims::default();
                    for p in &all {
                        prop_assert!(claims.conflict(p).is_none(), "{all:?}");
                        claims.insert(p);
                    }
                }
            }
        }

        #[test]
        fn crowded_lists_are_not_clear() {
            let p = |ip: &str, subnets: &[&str], carries: &[&str]| Peer {
                ip: ip.parse().unwrap(),
                subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
                mac: None,
                carries: carries.iter().map(|s| s.parse().unwrap()).collect(),
            };
            let a = p("192.0.2.1", &["10.244.1.0/24"], &[]);
            let b = p("192.0.2.2", &["10.244.2.0/24"], &["10.245.0.0/16"]);
            assert!(clear([a.clone(), b.clone()].iter()));
            assert!(conflict_free(&[&a, &b]));
            assert!(!conflict_free(&[&a, &b, &a]), "the same address twice");
            let inside = p("192.0.2.3", &["10.244.1.128/25"], &[]);
            assert!(!clear([a.clone(), b.clone(), inside].iter()));
            let carried = p("192.0.2.3", &["10.244.3.0/24"], &["10.245.7.0/24"]);
            assert!(!clear([a.clone(), b.clone(), carried].iter()));
            let underlay_in_a = p("10.244.1.7", &["10.244.9.0/24"], &[]);
            assert!(!clear([a, b, underlay_in_a].iter()));
        }
    }
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn carried_subnets_are_checked_and_claimed_like_own_ones() {
        let entry = |carries: &[&str]| PeerEntry {
            ip: "192.0.2.2".parse().unwrap(),
            subnets: vec!["10.244.2.0/24".parse().unwrap()],
            mac: None,
            carries: carries.iter().map(|s| s.parse().unwrap()).collect(),
        };
        let ok = check_entry(&entry(&["198.18.21.0/24"])).unwrap();
        assert_eq!(ok.carries, vec!["198.18.21.0/24".parse::<IpNet>().unwrap()]);
        assert_eq!(
            ok.next_hop(&"198.18.21.0/24".parse().unwrap()),
            Some("10.244.2.0".parse().unwrap())
        );
        for (bad, why) in [
            (&["198.18.21.1/24"][..], "host bits"),
            (&["fd00:21::/64"][..], "family"),
            (&["198.18.21.0/24", "198.18.21.0/24"][..], "twice"),
        ] {
            let err = check_entry(&entry(bad)).unwrap_err();
            assert!(
                matches!(&err, Error::Carries { .. }) && err.to_string().contains(why),
                "{bad:?}: {err}"
            );
        }
        // A carried subnet overlapping another peer's own subnet is an overlap.
        let gw = ok.clone();
        let other = peer("192.0.2.3", &["198.18.21.0/25"]);
        assert!(matches!(merge(&[gw], &[other]), Err(Error::Overlap { .. })));
        // JSON: written only when present, read back.
        let text = serde_json::to_string(&entry(&["198.18.21.0/24"])).unwrap();
        assert!(text.contains("\"carries\":[\"198.18.21.0/24\"]"), "{text}");
        assert!(
            !serde_json::to_string(&entry(&[]))
                .unwrap()
                .contains("carries")
        );
    }

    fn peer(ip: &str, subnets: &[&str]) -> Peer {
        Peer {
            carries: Vec::new(),
            ip: ip.parse().unwrap(),
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            mac: None,
        }
    }

    #[test]
    fn union_dedupes_and_refuses_overlap_and_conflicts() {
        let a = vec![peer("192.0.2.1", &["10.244.1.0/24"])];
        let b = vec![
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24", "fd00:2::/64"]),
        ];
        assert_eq!(merge(&a, &b).unwrap().len(), 2);
        let overlap = vec![peer("192.0.2.3", &["10.244.0.0/16"])];
        assert!(matches!(merge(&a, &overlap), Err(Error::Overlap { .. })));
        let conflict = vec![peer("192.0.2.1", &["10.244.9.0/24"])];
        assert!(matches!(merge(&a, &conflict), Err(Error::Twice { .. })));
        let underlay = vec![peer("192.0.2.2", &["192.0.2.0/24"])];
        let err = merge(&a, &underlay).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds the underlay address of peer 192.0.2.1"),
            "{err}"
        );
    }

    /// The index answers what the pairwise rules answered, whatever the order and the sizes.
    #[test]
    fn claims_find_every_overlap_and_held_underlay_in_either_direction() {
        let held = [
            peer("192.0.2.1", &["10.244.1.0/24", "fd00:1::/64"]),
            peer("192.0.2.2", &["10.245.0.0/16"]),
        ];
        let mut c = Claims::default();
        for p in &held {
            assert!(c.conflict(p).is_none());
            c.insert(p);
        }
        let conflicts = |ip: &str, subnets: &[&str]| c.conflict(&peer(ip, subnets));
        // Inside, around, equal; IPv6 too.
        for (subnets, why) in [
            (&["10.244.1.128/25"][..], "inside a held /24"),
            (&["10.244.0.0/16"][..], "around a held /24"),
            (&["10.245.3.0/24"][..], "inside a held /16"),
            (&["10.244.1.0/24"][..], "equal"),
            (&["10.9.0.0/24", "fd00:1::/80"][..], "IPv6 inside"),
            (&["10.9.0.0/24", "fd00::/16"][..], "IPv6 around"),
        ] {
            assert!(
                matches!(conflicts("192.0.2.9", subnets), Some(Error::Overlap { .. })),
                "{why}"
            );
        }
        assert!(conflicts("192.0.2.9", &["10.9.0.0/24", "fd00:2::/64"]).is_none());
        assert!(matches!(
            conflicts("192.0.2.1", &["10.9.0.0/24"]),
            Some(Error::Twice { .. })
        ));
        // An underlay address inside a held subnet, a subnet around a held underlay address,
        // a subnet around its own.
        assert!(matches!(
            conflicts("10.245.9.9", &["10.9.0.0/24"]),
            Some(Error::HoldsUnderlay { .. })
        ));
        assert!(matches!(
            conflicts("192.0.2.9", &["192.0.2.0/30"]),
            Some(Error::HoldsUnderlay { .. })
        ));
        assert!(matches!(
            conflicts("10.9.0.1", &["10.9.0.0/24"]),
            Some(Error::HoldsUnderlay { .. })
        ));
        // Forgotten claims are free again.
        c.remove(&held[1]);
        assert!(c.conflict(&peer("192.0.2.9", &["10.245.3.0/24"])).is_none());
    }

    /// 5,000 peers merge in O(n log n): the pairwise check took seconds here.
    #[test]
    fn a_5000_peer_list_merges_and_its_one_conflict_is_found() {
        let mut all: Vec<Peer> = (0..5000u32)
            .map(|i| {
                let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i + 1);
                Peer {
                    carries: Vec::new(),
                    ip: ip.into(),
                    subnets: vec![IpNet::V4(
                        ipnet::Ipv4Net::new(Ipv4Addr::from((10u32 << 24) + (i << 8)), 24).unwrap(),
                    )],
                    mac: None,
                }
            })
            .collect();
        assert_eq!(merge(&[], &all).unwrap().len(), 5000);
        all[4999].subnets = vec!["10.0.3.0/24".parse().unwrap()];
        assert!(matches!(merge(&[], &all), Err(Error::Overlap { .. })));
    }

    #[test]
    fn file_forms_and_errors() {
        let list = br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]}]"#;
        let wrapped = br#"{"peers":[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"mac":"0a:01:c0:00:02:01"}]}"#;
        assert_eq!(parse_file(list).unwrap().len(), 1);
        assert_eq!(
            parse_file(wrapped).unwrap()[0].mac,
            Some([10, 1, 192, 0, 2, 1])
        );
        for bad in [
            &br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]"#[..],
            br#"[{"ip":"192.0.2.1","subnets":[]}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.1/24"]}]"#,
            br#"[{"ip":"2001:db8::1","subnets":["10.244.1.0/24"]},{"ip":"192.0.2.2","subnets":["10.244.2.0/24"]}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"mac":"01:00:00:00:00:01"}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"extra":1}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24","10.244.2.0/24"]}]"#,
        ] {
            assert!(parse_file(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn addresses_that_are_no_node_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "169.254.1.1",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "::",
            "::1",
            "fe80::1",
            "ff02::1",
            "::ffff:192.0.2.1",
        ] {
            let entry = PeerEntry {
                carries: Vec::new(),
                ip: ip.parse().unwrap(),
                subnets: vec!["10.244.9.0/24".parse().unwrap()],
                mac: None,
            };
            assert!(
                matches!(check_entries(&[entry]), Err(Error::NotUnicast { .. })),
                "{ip}"
            );
        }
    }

    #[test]
    fn every_peer_has_a_vtep_mac_of_its_own() {
        let local: IpAddr = "192.0.2.1".parse().unwrap();
        let flannel = |ip: &str, mac: [u8; 6]| Peer {
            mac: Some(mac),
            ..peer(ip, &["10.244.9.0/24"])
        };
        let two = peer("192.0.2.2", &["10.244.2.0/24"]);
        assert!(check_macs(1, local, std::slice::from_ref(&two)).is_ok());
        let m = [0x6e, 0x3c, 0x8a, 0x11, 0x22, 0x33];
        let err = check_macs(
            1,
            local,
            &[flannel("192.0.2.4", m), flannel("192.0.2.5", m)],
        );
        assert!(err.unwrap_err().to_string().contains("6e:3c:8a:11:22:33"));
        let err = check_macs(
            1,
            local,
            &[two.clone(), flannel("192.0.2.5", vtep_mac(two.ip, 1))],
        );
        assert!(err.unwrap_err().to_string().contains("peer 192.0.2.2"));
        let err = check_macs(1, local, &[flannel("192.0.2.5", vtep_mac(local, 1))]);
        assert!(err.unwrap_err().to_string().contains("own"));
    }

    #[test]
    fn the_local_entry_names_this_node_and_only_one_may() {
        let all = vec![
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24"]),
        ];
        let (local, remote) = split_local(&all, &["192.0.2.2".parse().unwrap()]).unwrap();
        assert_eq!(local.unwrap().ip, Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(remote.len(), 1);
        let both = ["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
        assert!(matches!(
            split_local(&all, &both),
            Err(Error::ManyLocal { .. })
        ));
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn the_bytes_returned_are_the_file_that_was_checked_even_while_it_is_being_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        let good = br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]}]"#;
        let broken = br#"[{"ip":"192.0.2.1","subnets":["10.2"#;
        let write = |name: &str, text: &[u8], mode: u32| {
            let tmp = dir.path().join(name);
            std::fs::write(&tmp, text).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write("first", good, 0o644);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Someone keeps replacing the file: with a valid one, a half-written one, and a
            // valid-looking one anyone could have written.
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    write("a", good, 0o644);
                    write("b", broken, 0o644);
                    write("c", br#"[]"#, 0o666);
                }
            });
            let mut bad = None;
            for _ in 0..3000 {
                if let Ok((_, text)) = read_owned_by(&path, me())
                    && text != good
                {
                    bad = Some(String::from_utf8_lossy(&text).into_owned());
                    break;
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            bad
        })
        .map_or(Ok(()), |kept| {
            Err(format!("returned bytes that were not checked: {kept}"))
        })
        .unwrap();
    }

    #[test]
    fn unsafe_and_non_regular_files_are_refused_without_blocking() {
        use std::os::unix::fs::PermissionsExt;
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), br#"[]"#).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            read_owned_by(f.path(), me()),
            Err(FileError::Unsafe { .. })
        ));
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_owned_by(f.path(), me()).is_ok());
        assert!(matches!(
            read_owned_by(f.path(), me() + 1),
            Err(FileError::Unsafe { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert!(matches!(
            read_owned_by(&fifo, me()),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            read_owned_by(dir.path(), me()),
            Err(FileError::NotRegular { .. })
        ));
    }
}
