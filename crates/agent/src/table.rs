//! Which Nodes make the peers file: every rule the plugin applies to the whole peer list is
//! applied here, Node by Node, and only the Nodes that break one are left out, each with why.
//! The blast radius of one Node object is that Node.
//!
//! - A Node whose own entry is not a valid peer (no pod CIDR, a bad annotation, an address
//!   that is no node's, a malformed subnet or MAC) is left out.
//! - No takeover: a conflict between Nodes over an underlay address, a pod subnet (equal,
//!   inside, around, or holding another's underlay address) or a VTEP MAC never moves traffic
//!   away from the entry already in the last peers the plugin accepted (`held`): that entry
//!   stays, the newcomer is left out. When neither side is held, both are left out: which Node
//!   is right is not the agent's to guess, and neither gets the other's traffic.
//! - What only this node's kernel can tell (an entry naming one of this node's addresses that is
//!   not this node's own, a peer at its underlay subnet's network or broadcast address, a MAC
//!   equal to its own VTEP's) is settled by [`settle`] with the plugin's own check: an entry it
//!   names is left out and the rest checked again, so the file written is always one the
//!   plugin accepts, or nothing is written.
//!
//! Everything here is pure: O(n log n) in the number of Nodes (sorts when no entry is in
//! another's way, else an index of the claims: [`peers::Claims`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::mapping::Skip;
use sticky_overlay::mac::vtep_mac;
use sticky_overlay::peers::{self, Claims, Peer, PeerEntry};

/// What a Node maps to: its peer entry, or why it has none.
pub type Mapped = Result<PeerEntry, Skip>;

/// The peers for the file, and the Nodes left out with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// With the name of the Node each came from.
    pub peers: BTreeMap<String, Peer>,
    pub left_out: BTreeMap<String, String>,
}

impl Placed {
    pub fn list(&self) -> Vec<Peer> {
        let mut all: Vec<Peer> = self.peers.values().cloned().collect();
        all.sort_by_key(|p| p.ip);
        all
    }
}

/// The MAC a peer's VTEP has: its explicit one (a flannel node), else its kept MAC.
pub fn mac_of(p: &Peer, vni: u32) -> [u8; 6] {
    p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni))
}

/// Places the Nodes' entries, those already held first (see the module's rules).
///
/// When no two valid entries are in each other's way (the usual case: a change of one Node
/// among 100,000), the rules take every one of them, and that is found with sorts instead of
/// an index of every claim ([`peers::conflict_free`]); otherwise the rules are walked.
pub fn place(nodes: &BTreeMap<String, Mapped>, held: &[Peer], vni: u32) -> Placed {
    let (mut out, incumbents, newcomers) = sort_out(nodes, held);
    if independent(&incumbents, &newcomers, vni) {
        out.peers.extend(
            incumbents
                .into_iter()
                .chain(newcomers)
                .map(|(n, p)| (n.clone(), p)),
        );
        return out;
    }
    by_the_rules(out, incumbents, newcomers, vni)
}

/// A valid entry of a Node, with the Node's name.
type Entry<'a> = (&'a String, Peer);

/// Each Node's entry checked alone: the invalid ones left out with why, the rest as
/// incumbents (the very entry `held` has at its address) and newcomers.
fn sort_out<'a>(
    nodes: &'a BTreeMap<String, Mapped>,
    held: &[Peer],
) -> (Placed, Vec<Entry<'a>>, Vec<Entry<'a>>) {
    let held: BTreeMap<IpAddr, &Peer> = held.iter().map(|p| (p.ip, p)).collect();
    let mut out = Placed::default();
    let (mut incumbents, mut newcomers) = (Vec::new(), Vec::new());
    for (name, mapped) in nodes {
        match alone(mapped) {
            Ok(p) if held.get(&p.ip) == Some(&&p) => incumbents.push((name, p)),
            Ok(p) => newcomers.push((name, p)),
            Err(why) => {
                out.left_out.insert(name.clone(), why);
            }
        }
    }
    (out, incumbents, newcomers)
}

/// A Node's entry checked alone by the peers file's rules (the first of the module's rules):
/// its peer, or why it has none.
pub fn alone(mapped: &Mapped) -> Result<Peer, String> {
    match mapped.as_ref().map(peers::check_entry) {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(invalid)) => Err(invalid.to_string()),
        Err(skip) => Err(skip.to_string()),
    }
}

/// Whether no two of the entries are in each other's way, their VTEP MACs included: then
/// [`by_the_rules`] takes them all.
fn independent(incumbents: &[Entry], newcomers: &[Entry], vni: u32) -> bool {
    let all: Vec<&Peer> = incumbents.iter().chain(newcomers).map(|(_, p)| p).collect();
    let mut macs: Vec<[u8; 6]> = all.iter().map(|p| mac_of(p, vni)).collect();
    macs.sort_unstable();
    macs.windows(2).all(|w| w[0] != w[1]) && peers::conflict_free(&all)
}

/// The module's rules, entry by entry against an index of what is held.
fn by_the_rules(
    mut out: Placed,
    incumbents: Vec<Entry>,
    newcomers: Vec<Entry>,
    vni: u32,
) -> Placed {
    // Who holds what: (underlay address → Node) and (MAC → Node).
    let mut claims = Claims::default();
    let mut owner: BTreeMap<IpAddr, &String> = BTreeMap::new();
    let mut macs: BTreeMap<[u8; 6], &String> = BTreeMap::new();
    for (name, p) in incumbents {
        // The held list was accepted whole, so its entries agree; a second Node mapping to
        // the very same entry is the only conflict left.
        if let Some(e) = claims.conflict(&p) {
            out.left_out
                .insert(name.clone(), format!("conflicts with another Node: {e}"));
            continue;
        }
        claims.insert(&p);
        owner.insert(p.ip, name);
        macs.insert(mac_of(&p, vni), name);
        out.peers.insert(name.clone(), p);
    }
    // Newcomers may take nothing the held entries hold.
    let mut free = Vec::new();
    for (name, p) in newcomers {
        let why = if let Some(e) = claims.conflict(&p) {
            Some(format!(
                "conflicts with Node {} already in the peers file: {e}",
                holder_name(&e, &owner)
            ))
        } else {
            macs.get(&mac_of(&p, vni)).map(|other| {
                format!(
                    "VTEP MAC {} is also that of Node {other}, already in the peers file",
                    sticky_netlink::link::format_mac(&mac_of(&p, vni))
                )
            })
        };
        match why {
            Some(why) => {
                out.left_out.insert(name.clone(), why);
            }
            None => free.push((name, p)),
        }
    }
    // Newcomers in conflict with each other: none of them.
    let mut new_claims = Claims::default();
    let mut new_owner: BTreeMap<IpAddr, &String> = BTreeMap::new();
    let mut new_macs: BTreeMap<[u8; 6], &String> = BTreeMap::new();
    let mut contested: BTreeMap<&String, String> = BTreeMap::new();
    for (name, p) in &free {
        let rival = match new_claims.conflict(p) {
            Some(e) => Some((holder_name(&e, &new_owner).to_string(), e.to_string())),
            None => new_macs
                .get(&mac_of(p, vni))
                .map(|o| (o.to_string(), "the same VTEP MAC".to_string())),
        };
        if let Some((rival, what)) = rival {
            let why = |other: &str| {
                format!(
                    "conflicts with Node {other}, neither in the peers file yet, so neither is taken: {what}"
                )
            };
            contested.insert(*name, why(&rival));
            if let Some(r) = free.iter().find(|(n, _)| **n == rival).map(|(n, _)| *n) {
                contested.entry(r).or_insert_with(|| why(name));
            }
            continue;
        }
        new_claims.insert(p);
        new_owner.insert(p.ip, name);
        new_macs.insert(mac_of(p, vni), name);
    }
    for (name, p) in free {
        match contested.remove(name) {
            Some(why) => {
                out.left_out.insert(name.clone(), why);
            }
            None => {
                out.peers.insert(name.clone(), p);
            }
        }
    }
    out
}

/// The Node whose entry an error from [`Claims::conflict`] names as the one already there.
fn holder_name<'a>(e: &peers::Error, owner: &BTreeMap<IpAddr, &'a String>) -> &'a str {
    let ips: Vec<IpAddr> = match e {
        peers::Error::Twice { ip } => vec![*ip],
        peers::Error::HoldsUnderlay { ip, holder, .. } => vec![*ip, *holder],
        peers::Error::Overlap { ip, other, .. } => vec![*ip, *other],
        _ => vec![],
    };
    ips.iter()
        .find_map(|ip| owner.get(ip))
        .map_or("?", |n| n.as_str())
}

/// The peer addresses a plugin error names: the entries to leave out so the rest may pass.
pub fn named_ips(e: &peers::Error) -> Vec<IpAddr> {
    use peers::Error as E;
    match e {
        E::NotUnicast { ip, .. }
        | E::Subnets { ip, .. }
        | E::HostBits { ip, .. }
        | E::TooSmall { ip, .. }
        | E::BadMac { ip, .. }
        | E::Carries { ip, .. }
        | E::Twice { ip }
        | E::UnderlayEdge { ip, .. } => vec![*ip],
        E::HoldsUnderlay { ip, holder, .. } => vec![*ip, *holder],
        E::Overlap { ip, other, .. } => vec![*ip, *other],
        E::SharedMac { ip, other, .. } => other.iter().copied().chain([*ip]).collect(),
        E::ManyLocal { ips } => ips.clone(),
        E::MixedUnderlay { ipv4, ipv6 } => vec![*ipv4, *ipv6],
    }
}

/// Why the plugin would refuse a list, as far as settling is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A rule of the peer list, naming peers.
    Peers(peers::Error),
    /// Anything else (this node's own entry missing, no underlay): no Node to leave out.
    Other(String),
}

/// Leaves out the entries the plugin's own check (`accepts`) names until it accepts the list:
/// first the ones not held, and this node's own entry never (without it the node cannot be
/// programmed at all). At most `placed.peers.len()` rounds, each O(n log n). The settled
/// placement and its [`Placed::list`], the list the plugin accepted; `Err` when the plugin
/// would still refuse: then nothing may be written.
pub fn settle(
    mut placed: Placed,
    held: &[Peer],
    own: Option<&str>,
    mut accepts: impl FnMut(&[Peer]) -> Result<(), Refusal>,
) -> Result<(Placed, Vec<Peer>), Refusal> {
    let held: BTreeMap<IpAddr, &Peer> = held.iter().map(|p| (p.ip, p)).collect();
    loop {
        let list = placed.list();
        let refusal = match accepts(&list) {
            Ok(()) => return Ok((placed, list)),
            Err(Refusal::Peers(e)) => e,
            Err(other) => return Err(other),
        };
        let named: BTreeSet<IpAddr> = named_ips(&refusal).into_iter().collect();
        let mut candidates: Vec<(&String, bool)> = placed
            .peers
            .iter()
            .filter(|(name, p)| named.contains(&p.ip) && Some(name.as_str()) != own)
            .map(|(name, p)| (name, held.get(&p.ip) == Some(&p)))
            .collect();
        // Newcomers go first; held entries only if the refusal names nothing else.
        if candidates.iter().any(|(_, h)| !h) {
            candidates.retain(|(_, h)| !h);
        }
        let names: Vec<String> = candidates.into_iter().map(|(n, _)| n.clone()).collect();
        if names.is_empty() {
            return Err(Refusal::Peers(refusal));
        }
        for name in names {
            placed.peers.remove(&name);
            placed
                .left_out
                .insert(name, format!("this node's plugin refuses it: {refusal}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    fn entry(ip: &str, subnets: &[&str]) -> Mapped {
        Ok(PeerEntry {
            carries: Vec::new(),
            ip: ip.parse().unwrap(),
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            mac: None,
        })
    }

    fn peer(ip: &str, subnets: &[&str]) -> Peer {
        peers::check_entry(&entry(ip, subnets).unwrap()).unwrap()
    }

    fn nodes(list: &[(&str, Mapped)]) -> BTreeMap<String, Mapped> {
        list.iter()
            .map(|(n, m)| (n.to_string(), m.clone()))
            .collect()
    }

    fn names(p: &Placed) -> Vec<&str> {
        p.peers.keys().map(String::as_str).collect()
    }

    #[test]
    fn a_node_claiming_a_held_address_or_subnet_is_left_out_the_holder_keeps_it() {
        let held = [
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24"]),
        ];
        // "attacker" sorts first by name and claims node-b's underlay address, then its subnet.
        for claim in [
            entry("192.0.2.2", &["10.244.9.0/24"]),
            entry("192.0.2.9", &["10.244.2.0/24"]),
            entry("192.0.2.9", &["10.244.2.128/25"]),
            entry("192.0.2.9", &["10.244.0.0/16"]),
            entry("10.244.2.7", &["10.244.9.0/24"]),
        ] {
            let p = place(
                &nodes(&[
                    ("a-attacker", claim.clone()),
                    ("node-a", entry("192.0.2.1", &["10.244.1.0/24"])),
                    ("node-b", entry("192.0.2.2", &["10.244.2.0/24"])),
                ]),
                &held,
                1,
            );
            assert_eq!(names(&p), ["node-a", "node-b"], "{claim:?}");
            assert!(p.left_out["a-attacker"].contains("already in the peers file"));
            assert_eq!(p.list(), held.to_vec(), "nothing moved for {claim:?}");
        }
    }

    /// The shortcut for entries in no one's way gives exactly what the rules give, on random
    /// clusters where addresses, subnets and MACs collide often.
    #[test]
    fn placing_without_the_index_gives_what_the_rules_give() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(35);
        let (mut independent_cases, mut conflicted) = (0, 0);
        for _ in 0..3000 {
            let mut list = Vec::new();
            for n in 0..rng.random_range(1..10) {
                let ip = if rng.random_bool(0.1) {
                    format!("10.244.{}.9", rng.random_range(0..12))
                } else {
                    format!("192.0.2.{}", rng.random_range(1..40))
                };
                let subnet = match rng.random_range(0..20) {
                    0 => "10.244.0.0/16".to_string(),
                    1 => format!("10.244.{}.128/25", rng.random_range(0..12)),
                    _ => format!("10.244.{}.0/24", rng.random_range(0..60)),
                };
                let mut e = entry(&ip, &[&subnet]);
                if rng.random_bool(0.05) {
                    e = Err(Skip::NoPodCidr);
                }
                if let Ok(e) = &mut e
                    && rng.random_bool(0.05)
                {
                    let other = format!("192.0.2.{}", rng.random_range(1..40));
                    e.mac = Some(sticky_netlink::link::format_mac(&vtep_mac(
                        other.parse().unwrap(),
                        1,
                    )));
                }
                list.push((format!("node-{n}"), e));
            }
            let held: Vec<Peer> = list
                .iter()
                .filter_map(|(_, m)| m.as_ref().ok())
                .filter_map(|e| peers::check_entry(e).ok())
                .filter(|_| rng.random_bool(0.5))
                .collect();
            let nodes: BTreeMap<String, Mapped> = list.into_iter().collect();
            let (out, incumbents, newcomers) = sort_out(&nodes, &held);
            if independent(&incumbents, &newcomers, 1) {
                independent_cases += 1;
            } else {
                conflicted += 1;
            }
            let by_rules = by_the_rules(out, incumbents, newcomers, 1);
            assert_eq!(place(&nodes, &held, 1), by_rules, "{nodes:?} held {held:?}");
        }
        assert!(
            independent_cases > 500 && conflicted > 500,
            "{independent_cases} {conflicted}"
        );
    }

    #[test]
    fn two_newcomers_in_conflict_are_both_left_out_others_are_taken() {
        let p = place(
            &nodes(&[
                ("x", entry("192.0.2.7", &["10.244.7.0/24"])),
                ("y", entry("192.0.2.7", &["10.244.8.0/24"])),
                ("z", entry("192.0.2.9", &["10.244.9.0/24"])),
            ]),
            &[],
            1,
        );
        assert_eq!(names(&p), ["z"]);
        assert!(p.left_out["x"].contains("neither"), "{:?}", p.left_out);
        assert!(p.left_out["y"].contains("neither"), "{:?}", p.left_out);
    }

    #[test]
    fn a_flannel_mac_equal_to_another_nodes_kept_mac_leaves_out_only_that_node() {
        let held = [peer("192.0.2.1", &["10.244.1.0/24"])];
        let stolen = sticky_netlink::link::format_mac(&vtep_mac("192.0.2.1".parse().unwrap(), 1));
        let mut flannel = entry("192.0.2.5", &["10.244.5.0/24"]).unwrap();
        flannel.mac = Some(stolen);
        let p = place(
            &nodes(&[
                ("node-a", entry("192.0.2.1", &["10.244.1.0/24"])),
                ("flannel-5", Ok(flannel)),
                ("node-6", entry("192.0.2.6", &["10.244.6.0/24"])),
            ]),
            &held,
            1,
        );
        assert_eq!(names(&p), ["node-6", "node-a"]);
        assert!(p.left_out["flannel-5"].contains("VTEP MAC"));
    }

    #[test]
    fn bad_entries_are_left_out_with_why_and_the_rest_is_kept() {
        let p = place(
            &nodes(&[
                ("no-cidr", Err(Skip::NoPodCidr)),
                ("loopback", entry("127.0.0.1", &["10.244.3.0/24"])),
                ("host-bits", entry("192.0.2.4", &["10.244.4.1/24"])),
                ("good", entry("192.0.2.5", &["10.244.5.0/24"])),
            ]),
            &[],
            1,
        );
        assert_eq!(names(&p), ["good"]);
        assert!(p.left_out["no-cidr"].contains("no pod CIDR"));
        assert!(p.left_out["loopback"].contains("loopback"));
        assert!(p.left_out["host-bits"].contains("host bits"));
    }

    #[test]
    fn a_changed_node_is_a_newcomer_for_its_new_claims() {
        // node-b moves onto node-a's subnet: node-a keeps it; node-b is left out (its old
        // entry goes: the guard counts that).
        let held = [
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24"]),
        ];
        let p = place(
            &nodes(&[
                ("node-a", entry("192.0.2.1", &["10.244.1.0/24"])),
                ("node-b", entry("192.0.2.2", &["10.244.1.0/24"])),
            ]),
            &held,
            1,
        );
        assert_eq!(names(&p), ["node-a"]);
    }

    #[test]
    fn settle_drops_what_the_plugin_names_newcomers_first_never_this_node() {
        let held = [peer("192.0.2.1", &["10.244.1.0/24"])];
        let p = place(
            &nodes(&[
                ("me", entry("192.0.2.1", &["10.244.1.0/24"])),
                ("docker0-alike", entry("172.17.0.1", &["10.244.2.0/24"])),
                ("broadcast", entry("192.0.2.255", &["10.244.3.0/24"])),
                ("fine", entry("192.0.2.4", &["10.244.4.0/24"])),
            ]),
            &held,
            1,
        );
        // The plugin on this node: 172.17.0.1 is also one of its addresses, 192.0.2.255 the
        // broadcast of its underlay /24.
        let mut rounds = 0;
        let accepts = |list: &[Peer]| {
            rounds += 1;
            let ips: Vec<IpAddr> = list.iter().map(|p| p.ip).collect();
            let local: Vec<IpAddr> = ["192.0.2.1", "172.17.0.1"]
                .iter()
                .map(|a| a.parse().unwrap())
                .filter(|a| ips.contains(a))
                .collect();
            if local.len() > 1 {
                return Err(Refusal::Peers(peers::Error::ManyLocal { ips: local }));
            }
            let edge: IpAddr = "192.0.2.255".parse().unwrap();
            if ips.contains(&edge) {
                return Err(Refusal::Peers(peers::Error::UnderlayEdge {
                    ip: edge,
                    what: "the broadcast address",
                    subnet: "192.0.2.0/24".parse().unwrap(),
                    why: "an FDB entry for it would flood the underlay",
                }));
            }
            Ok(())
        };
        let (settled, list) = settle(p, &held, Some("me"), accepts).unwrap();
        assert_eq!(list, settled.list());
        assert_eq!(names(&settled), ["fine", "me"]);
        assert!(settled.left_out["docker0-alike"].contains("plugin refuses"));
        assert!(settled.left_out["broadcast"].contains("broadcast"));
        assert_eq!(rounds, 3);
        // What cannot be settled by leaving a Node out is an error: nothing is written.
        let p = place(
            &nodes(&[("me", entry("192.0.2.1", &["10.244.1.0/24"]))]),
            &held,
            1,
        );
        let r = settle(p, &held, Some("me"), |_| {
            Err(Refusal::Other("no entry names this node".into()))
        });
        assert!(r.is_err());
    }

    #[test]
    fn ipv6_underlays_are_placed_by_the_same_rules() {
        let dual =
            |a: &str, n: u8| entry(a, &[&format!("10.244.{n}.0/24"), &format!("fd00:{n}::/64")]);
        let held = [
            peers::check_entry(&dual("2001:db8::1", 1).unwrap()).unwrap(),
            peers::check_entry(&dual("2001:db8::2", 2).unwrap()).unwrap(),
        ];
        // The kept MAC of an IPv6 peer is its hash: a flannel node claiming node-a's is left
        // out, as on IPv4.
        let stolen = sticky_netlink::link::format_mac(&vtep_mac("2001:db8::1".parse().unwrap(), 1));
        let mut flannel = dual("2001:db8::5", 5).unwrap();
        flannel.mac = Some(stolen);
        let p = place(
            &nodes(&[
                ("a-attacker", dual("2001:db8::2", 9)),
                (
                    "b-attacker",
                    entry("2001:db8::9", &["10.244.9.0/24", "fd00:2::/80"]),
                ),
                ("flannel-5", Ok(flannel)),
                ("node-a", dual("2001:db8::1", 1)),
                ("node-b", dual("2001:db8::2", 2)),
                ("node-c", dual("2001:db8::a", 10)),
                ("link-local", dual("fe80::7", 7)),
            ]),
            &held,
            1,
        );
        assert_eq!(names(&p), ["node-a", "node-b", "node-c"]);
        for (name, says) in [
            ("a-attacker", "already in the peers file"),
            ("b-attacker", "fd00:2::/64"),
            ("flannel-5", "VTEP MAC"),
            ("link-local", "link-local"),
        ] {
            assert!(p.left_out[name].contains(says), "{name}: {:?}", p.left_out);
        }
        // The list is in address order: ::1, ::2, ::a.
        let ips: Vec<String> = p.list().iter().map(|p| p.ip.to_string()).collect();
        assert_eq!(ips, ["2001:db8::1", "2001:db8::2", "2001:db8::a"]);
        // Two newcomers on one IPv6 address: neither.
        let p = place(
            &nodes(&[("x", dual("2001:db8::7", 7)), ("y", dual("2001:db8::7", 8))]),
            &[],
            1,
        );
        assert!(p.peers.is_empty() && p.left_out.len() == 2, "{p:?}");
    }

    /// 5,000 Nodes placed in well under a second, conflicts found by index.
    #[test]
    fn five_thousand_nodes_are_all_placed() {
        let all: BTreeMap<String, Mapped> = (0..5000u32)
            .map(|i| {
                let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i);
                let subnet = Ipv4Addr::from((10u32 << 24) + (i << 8));
                (
                    format!("node-{i:05}"),
                    entry(&ip.to_string(), &[&format!("{subnet}/24")]),
                )
            })
            .collect();
        let p = place(&all, &[], 1);
        assert_eq!(p.peers.len(), 5000);
        let held = p.list();
        let p = place(&all, &held, 1);
        assert_eq!(p.peers.len(), 5000);
        assert!(p.left_out.is_empty());
    }
}
