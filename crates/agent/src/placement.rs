//! The placement the last write settled, kept between writes, so that a change of a few Nodes
//! is placed at the cost of those Nodes (issue 37: at 100,000 Nodes, placing and checking every
//! Node again was 95 ms of a change's 175).
//!
//! The whole rules ([`table::place`], then [`table::settle`]) take every valid entry when no
//! two are in each other's way and the plugin accepts the list whole. A change comes to the
//! same without them when:
//! - no changed Node's entry, old or new, is in the way of a Node left out with a valid
//!   entry (in conflict with another, or refused by the plugin): what keeps that Node out
//!   stays, with the same why (a Node left out for its own entry alone stays out whatever
//!   the others do); and no entry placed as a newcomer is in its way either: held next
//!   time, it would be what keeps the Node out, and the why would change;
//! - the peers file holds the placement's list, and so does the plugin (`held`): every entry
//!   not changed is an incumbent, and the list was accepted whole;
//! - each changed Node's new entry holds nothing another entry holds: the same [`Claims`]
//!   index the rules use, and the VTEP MACs;
//! - the plugin accepts the new entries beside this node's own, and what it read of this node
//!   is what it read when it accepted the whole list ([`sticky_overlay::node::accepts`]): the
//!   entries not changed pass again;
//! - this node's own entry is not among the changes (the plugin finds the underlay from it).
//!
//! Otherwise [`Kept::place_changes`] says so, and the keeper places every Node again.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::table::{self, Mapped, Placed, Refusal};
use sticky_overlay::node::Observed;
use sticky_overlay::peers::{Claims, Peer};

/// A settled placement, with what a change needs to be placed by itself.
#[derive(Debug)]
pub struct Kept {
    placed: Placed,
    /// The Nodes left out with a valid entry, and that entry.
    contested: BTreeMap<String, Peer>,
    /// No Node left out with a valid entry is in the way of an entry placed as a newcomer.
    stable: bool,
    vni: u32,
    /// What the plugin read of this node when it accepted the whole list.
    facts: Option<Observed>,
    /// The hash of the peers file that holds the placement's list, once it does.
    file: Option<String>,
    /// What the placed entries hold, made at the first change placed here.
    index: Option<Index>,
}

/// The claims (underlay addresses, subnets) and VTEP MACs of some entries.
#[derive(Debug, Default)]
struct Index {
    claims: Claims,
    macs: HashSet<[u8; 6]>,
}

impl Index {
    fn of<'a>(entries: impl IntoIterator<Item = &'a Peer>, vni: u32) -> Index {
        let mut index = Index::default();
        for p in entries {
            index.insert(p, vni);
        }
        index
    }

    fn insert(&mut self, p: &Peer, vni: u32) {
        self.claims.insert(p);
        self.macs.insert(table::mac_of(p, vni));
    }

    fn remove(&mut self, p: &Peer, vni: u32) {
        self.claims.remove(p);
        self.macs.remove(&table::mac_of(p, vni));
    }

    /// Whether `p` holds nothing an entry here holds.
    fn free(&self, p: &Peer, vni: u32) -> bool {
        self.claims.conflict(p).is_none() && !self.macs.contains(&table::mac_of(p, vni))
    }
}

/// Whether neither of `a` and `b` holds what the other holds.
fn apart(a: &Peer, b: &Peer, vni: u32) -> bool {
    Index::of([a], vni).free(b, vni)
}

impl Kept {
    /// The placement the whole rules settled for `nodes` against `held`, the plugin having
    /// read `facts`.
    pub fn new(
        placed: Placed,
        nodes: &BTreeMap<String, Mapped>,
        held: &[Peer],
        vni: u32,
        facts: Option<Observed>,
    ) -> Kept {
        let contested: BTreeMap<String, Peer> = placed
            .left_out
            .keys()
            .filter_map(|name| Some((name.clone(), table::alone(nodes.get(name)?).ok()?)))
            .collect();
        let stable = contested.is_empty() || {
            let held: HashMap<IpAddr, &Peer> = held.iter().map(|p| (p.ip, p)).collect();
            placed
                .peers
                .values()
                .filter(|p| held.get(&p.ip) != Some(p))
                .all(|p| contested.values().all(|c| apart(c, p, vni)))
        };
        Kept {
            placed,
            contested,
            stable,
            vni,
            facts,
            file: None,
            index: None,
        }
    }

    pub fn placed(&self) -> &Placed {
        &self.placed
    }

    /// The peers file holds the placement's list, and its content hashes to `hash`.
    pub fn in_file(mut self, hash: String) -> Kept {
        self.file = Some(hash);
        self
    }

    /// The list of `file` (the peers file's list, sorted by address, whose content hashes to
    /// `hash`) with the Nodes in `changed` placed again, when that is what the whole rules
    /// would place (see the module doc); None when it may not be, and then this placement is
    /// no longer of use (part of the change may be in it). `accepts` is the plugin's check.
    pub fn place_changes(
        &mut self,
        changed: &BTreeSet<String>,
        nodes: &BTreeMap<String, Mapped>,
        (file, hash): (&[Peer], &str),
        held: &[Peer],
        own: Option<&str>,
        accepts: &mut impl FnMut(&[Peer]) -> Result<Observed, Refusal>,
    ) -> Option<Vec<Peer>> {
        let (own, vni) = (own?, self.vni);
        if changed.contains(own)
            || !self.stable
            || self.file.as_deref() != Some(hash)
            || self.facts.is_none()
            || held != file
        {
            return None;
        }
        let own_peer = self.placed.peers.get(own)?.clone();
        let index = self
            .index
            .get_or_insert_with(|| Index::of(self.placed.peers.values(), vni));
        let mut list = file.to_vec();
        let mut was_out = Vec::new();
        for name in changed {
            self.placed.left_out.remove(name);
            was_out.extend(self.contested.remove(name));
        }
        let contested = &self.contested;
        let clear = |p: &Peer| contested.values().all(|c| apart(c, p, vni));
        if !was_out.iter().all(clear) {
            return None;
        }
        for name in changed {
            if let Some(old) = self.placed.peers.remove(name) {
                if !clear(&old) {
                    return None;
                }
                index.remove(&old, vni);
                let at = list.binary_search_by_key(&old.ip, |p| p.ip).ok()?;
                list.remove(at);
            }
        }
        let mut added = vec![own_peer];
        for name in changed {
            let Some(mapped) = nodes.get(name) else {
                continue;
            };
            match table::alone(mapped) {
                Ok(p) if index.free(&p, vni) && clear(&p) => {
                    index.insert(&p, vni);
                    let at = list.binary_search_by_key(&p.ip, |q| q.ip).err()?;
                    list.insert(at, p.clone());
                    added.push(p.clone());
                    self.placed.peers.insert(name.clone(), p);
                }
                Ok(_) => return None,
                Err(why) => {
                    self.placed.left_out.insert(name.clone(), why);
                }
            }
        }
        added.sort_by_key(|p| p.ip);
        let facts = accepts(&added).ok()?;
        self.stable = true;
        (self.facts.as_ref() == Some(&facts)).then_some(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Skip;
    use rand::{Rng, SeedableRng};
    use sticky_overlay::peers::{self, PeerEntry};

    const VNI: u32 = 1;
    const OWN: &str = "n00";
    /// The fake plugin's "address of this node that is not its own": refused whatever else.
    const LOCAL: &str = "192.0.2.39";

    fn entry(ip: &str, subnet: &str, mac: Option<&str>) -> Mapped {
        Ok(PeerEntry {
            ip: ip.parse().unwrap(),
            subnets: vec![subnet.parse().unwrap()],
            mac: mac.map(String::from),
            carries: Vec::new(),
        })
    }

    /// A Node's mapping from a small pool, so that conflicts of every kind come up: shared
    /// addresses, equal and nested subnets, an address inside a subnet, shared MACs, invalid
    /// entries, no entry, and the address the plugin refuses.
    /// One in `rare` of them is one of the special kinds.
    fn random_mapped(rng: &mut impl Rng, rare: u32) -> Mapped {
        let ip = format!("192.0.2.{}", rng.random_range(2..250));
        match rng.random_range(0..rare * 6) {
            0 => Err(Skip::NoPodCidr),
            1 => entry(&ip, "10.244.1.1/24", None),
            2 => entry(&ip, "10.244.0.0/16", None),
            3 => entry(&ip, "192.0.2.0/28", None),
            4 => entry(&ip, "10.245.1.0/24", Some("02:00:00:00:00:01")),
            5 => entry(LOCAL, "10.245.2.0/24", None),
            _ => entry(
                &ip,
                &format!("10.244.{}.0/24", rng.random_range(2..250)),
                None,
            ),
        }
    }

    /// A plugin check of the whole list: this node's entry must be there, LOCAL never.
    fn fake_accepts(facts: &Observed, list: &[Peer]) -> Result<Observed, Refusal> {
        let own: IpAddr = "192.0.2.1".parse().unwrap();
        if !list.iter().any(|p| p.ip == own) {
            return Err(Refusal::Other("no entry names this node".into()));
        }
        match list.iter().find(|p| p.ip.to_string() == LOCAL) {
            Some(p) => Err(Refusal::Peers(peers::Error::ManyLocal {
                ips: vec![own, p.ip],
            })),
            None => Ok(facts.clone()),
        }
    }

    /// Random changes of one to three Nodes among 30 (many conflicts, then few): whenever
    /// [`Kept::place_changes`] places a change, the list and the Nodes left out are those
    /// the whole rules give, and it asks the plugin about the changed entries only; with few
    /// conflicts it places most changes.
    #[test]
    fn a_change_placed_by_itself_is_what_the_whole_rules_place() {
        for (rare, at_least) in [(10, 300), (100, 1000)] {
            let by_itself = random_changes(rare);
            assert!(
                by_itself >= at_least,
                "{by_itself} of 2000 placed by themselves"
            );
        }
    }

    /// 2000 random changes, each placed by the whole rules and by [`Kept::place_changes`]:
    /// how many it placed.
    fn random_changes(rare: u32) -> usize {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(37);
        let mut nodes: BTreeMap<String, Mapped> = BTreeMap::new();
        nodes.insert(OWN.into(), entry("192.0.2.1", "10.244.1.0/24", None));
        let mut facts = Observed::default();
        let whole = |nodes: &BTreeMap<String, Mapped>, held: &[Peer], facts: &Observed| {
            let placed = table::place(nodes, held, VNI);
            table::settle(placed, held, Some(OWN), |l| {
                fake_accepts(facts, l).map(|_| ())
            })
        };
        let (mut placed, mut list) = whole(&nodes, &[], &facts).unwrap();
        let mut kept =
            Kept::new(placed.clone(), &nodes, &[], VNI, Some(facts.clone())).in_file("0".into());
        let mut by_itself = 0;
        for step in 1..2000 {
            let before = nodes.clone();
            let mut changed = BTreeSet::new();
            for _ in 0..rng.random_range(1..=3) {
                let name = format!("n{:02}", rng.random_range(1..30));
                if rng.random_range(0..10) == 0 {
                    nodes.remove(&name);
                } else {
                    nodes.insert(name.clone(), random_mapped(&mut rng, rare));
                }
                changed.insert(name);
            }
            // Now and then the node's kernel changes: what the plugin read is not the same.
            if rng.random_range(0..50) == 0 {
                facts.addresses.push((1, "203.0.113.1/24".parse().unwrap()));
            }
            let want = whole(&nodes, &list, &facts);
            let mut asked = 0;
            let mut accepts = |l: &[Peer]| {
                asked = asked.max(l.len());
                fake_accepts(&facts, l)
            };
            let hash = (step - 1).to_string();
            let got = kept.place_changes(
                &changed,
                &nodes,
                (&list, &hash),
                &list,
                Some(OWN),
                &mut accepts,
            );
            match (want, got) {
                (Ok((want, want_list)), Some(got)) => {
                    by_itself += 1;
                    assert_eq!(got, want_list, "step {step}: {changed:?}");
                    assert_eq!(kept.placed(), &want, "step {step}: {changed:?}");
                    assert!(asked <= 1 + changed.len(), "asked about {asked} entries");
                    (placed, list) = (want, want_list);
                }
                (Ok((want, want_list)), None) => {
                    kept = Kept::new(want.clone(), &nodes, &list, VNI, Some(facts.clone()));
                    (placed, list) = (want, want_list);
                }
                (Err(_), got) => {
                    assert!(got.is_none(), "step {step}: {changed:?}");
                    nodes = before;
                    kept = Kept::new(placed.clone(), &nodes, &list, VNI, Some(facts.clone()));
                }
            }
            kept = kept.in_file(step.to_string());
        }
        by_itself
    }

    #[test]
    fn a_change_is_not_placed_by_itself_when_the_file_or_what_the_plugin_holds_is_another() {
        let mut nodes: BTreeMap<String, Mapped> = BTreeMap::new();
        nodes.insert(OWN.into(), entry("192.0.2.1", "10.244.1.0/24", None));
        nodes.insert("n01".into(), entry("192.0.2.2", "10.244.2.0/24", None));
        let facts = Observed::default();
        let placed = table::place(&nodes, &[], VNI);
        let (placed, list) = table::settle(placed, &[], Some(OWN), |l| {
            fake_accepts(&facts, l).map(|_| ())
        })
        .unwrap();
        nodes.insert("n02".into(), entry("192.0.2.3", "10.244.3.0/24", None));
        let changed = BTreeSet::from(["n02".to_string()]);
        let mut accepts = |l: &[Peer]| fake_accepts(&facts, l);
        let kept = |nodes: &BTreeMap<String, Mapped>| {
            Kept::new(placed.clone(), nodes, &list, VNI, Some(facts.clone())).in_file("h".into())
        };
        let shorter = &list[..1];
        for (file, hash, held, own) in [
            (&list[..], "h", &list[..], Some(OWN)),
            (&list[..], "edited by hand", &list[..], Some(OWN)),
            (&list[..], "h", shorter, Some(OWN)),
            (&list[..], "h", &list[..], None),
        ] {
            let got =
                kept(&nodes).place_changes(&changed, &nodes, (file, hash), held, own, &mut accepts);
            let expected = hash == "h" && held.len() == list.len() && own.is_some();
            assert_eq!(got.is_some(), expected, "{hash} {} {own:?}", held.len());
        }
        // This node's own entry changed: the plugin finds the underlay from it.
        nodes.insert(OWN.into(), entry("192.0.2.1", "10.244.9.0/24", None));
        let own = BTreeSet::from([OWN.to_string()]);
        assert!(
            kept(&nodes)
                .place_changes(&own, &nodes, (&list, "h"), &list, Some(OWN), &mut accepts)
                .is_none()
        );
    }
}
