//! The guard against changes that would stop traffic on many peers at once: an API answering
//! an empty list after a restore, a burst of DELETED events, a list that swaps every node's pod
//! CIDRs. What it counts is every peer of the last list the plugin accepted (its last-good copy)
//! that a new list removes or changes (subnets, underlay address, MAC): those are the peers
//! whose traffic would stop or move. It counts them over a window of time, not per event, so
//! five deletions half a second apart count as five. More than `--max-remove-fraction` of the
//! accepted peers (at least one) within [`WINDOW`] is refused: the peers file stays as it is,
//! the refusal is logged, counted and shown until the change shrinks back under the limit, the
//! window passes, or the operator accepts it. Additions never count. With sites
//! (docs/sites.md), every other site's pod subnet a site gateway's entry carries counts as a
//! peer does ([`Unit::Carried`]): one that is no longer carried, or carried by another entry,
//! is disrupted.
//!
//! An operator's acceptance ([`Guard::accept`], the `accept-changes` file, docs/agent.md) is
//! tied to the one change the guard refuses when it comes, by that change's
//! [`fingerprint`], and holds for [`ACCEPT_FOR`]: it lets that change through once, and
//! nothing else. With no refusal of the guard standing (nothing refused, or a list refused for
//! another reason) it accepts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;
use std::time::{Duration, Instant};

use sticky_overlay::peers::Peer;

/// How long a disrupted peer counts against the limit.
pub const WINDOW: Duration = Duration::from_secs(600);

/// How long an operator's acceptance of a refused change holds.
pub const ACCEPT_FOR: Duration = Duration::from_secs(600);

/// What the guard counts: a peer, by its underlay address, or another site's pod subnet that
/// a site gateway's entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    Peer(IpAddr),
    Carried(IpNet),
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Peer(ip) => write!(f, "{ip}"),
            Unit::Carried(net) => write!(f, "{net} of another site"),
        }
    }
}

/// Every unit of `list`.
fn units(list: &[Peer]) -> BTreeSet<Unit> {
    list.iter()
        .flat_map(|p| {
            std::iter::once(Unit::Peer(p.ip)).chain(p.carries.iter().map(|c| Unit::Carried(*c)))
        })
        .collect()
}

/// A change the guard refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Peers (and carried subnets) of the accepted list the change removes or changes.
    pub disrupted: Vec<Unit>,
    /// Of those and the ones disrupted earlier in the window, how many in all.
    pub in_window: usize,
    pub limit: usize,
    /// Peers in the list the plugin accepted when the window began.
    pub of: usize,
    pub max_fraction: f64,
    /// Which change this is ([`fingerprint`] of the accepted list and the new one).
    pub change: u64,
}

impl Refused {
    /// What the change does, in a few words: "the API's nodes would remove or change N of
    /// the M peers the plugin accepted (addresses), change <fingerprint>".
    pub fn what(&self) -> String {
        let shown: Vec<String> = self
            .disrupted
            .iter()
            .take(8)
            .map(ToString::to_string)
            .collect();
        let more = self.disrupted.len().saturating_sub(shown.len());
        format!(
            "the API's nodes would remove or change {} of the {} peers the plugin accepted ({}{}), change {:016x}",
            self.disrupted.len(),
            self.of,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            self.change,
        )
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; {} within {} minutes with the ones before, more than --max-remove-fraction {} allows ({}); keeping the peers file as it is. If the cluster really changed that much, accept this change once with `touch <stateDir>/<network>.accept-changes` (docs/agent.md)",
            self.what(),
            self.in_window,
            WINDOW.as_secs() / 60,
            self.max_fraction,
            self.limit,
        )
    }
}

/// The units of `accepted` that `new` removes or changes: peers whose entry (address,
/// subnets, MAC) is gone or differs, and carried subnets no longer carried by the same peer.
pub fn disrupted(accepted: &[Peer], new: &[Peer]) -> Vec<Unit> {
    let same = |a: &Peer, b: &Peer| a.subnets == b.subnets && a.mac == b.mac;
    let by_ip: BTreeMap<IpAddr, &Peer> = new.iter().map(|p| (p.ip, p)).collect();
    let carrier: BTreeMap<IpNet, IpAddr> = new
        .iter()
        .flat_map(|p| p.carries.iter().map(|c| (*c, p.ip)))
        .collect();
    let mut out: Vec<Unit> = accepted
        .iter()
        .filter(|p| by_ip.get(&p.ip).is_none_or(|n| !same(p, n)))
        .map(|p| Unit::Peer(p.ip))
        .collect();
    out.extend(accepted.iter().flat_map(|p| {
        p.carries
            .iter()
            .filter(|c| carrier.get(*c) != Some(&p.ip))
            .map(|c| Unit::Carried(*c))
    }));
    out
}

/// Which change goes from `accepted` to `new`: equal for the same two lists, in this process.
pub fn fingerprint(accepted: &[Peer], new: &[Peer]) -> u64 {
    let mut h = DefaultHasher::new();
    for list in [accepted, new] {
        list.len().hash(&mut h);
        for p in list {
            (p.ip, &p.subnets, p.mac, &p.carries).hash(&mut h);
        }
    }
    h.finish()
}

#[derive(Debug, Clone)]
pub struct Guard {
    max_fraction: f64,
    /// Peers disrupted by accepted changes, and when.
    spent: BTreeMap<Unit, Instant>,
    /// The change the guard refused last, while that refusal stands.
    refused: Option<Refused>,
    /// The refused change the operator accepted, and until when.
    accepted: Option<(Refused, Instant)>,
}

impl Guard {
    pub fn new(max_fraction: f64) -> Guard {
        Guard {
            max_fraction,
            spent: BTreeMap::new(),
            refused: None,
            accepted: None,
        }
    }

    /// The operator accepts, at `now`, the change the guard refuses now: that change (by its
    /// fingerprint) is let through once, whatever its size, if it comes within
    /// [`ACCEPT_FOR`], and the window starts over then. `None`, and nothing accepted, when no
    /// refusal of the guard stands.
    pub fn accept(&mut self, now: Instant) -> Option<&Refused> {
        let refused = self.refused.clone()?;
        self.accepted = Some((refused, now + ACCEPT_FOR));
        self.accepted.as_ref().map(|(r, _)| r)
    }

    /// The change the guard refused is no longer asked for (the file already holds what the
    /// Nodes make, or no list the plugin accepts can be made): its refusal stands no more.
    pub fn refusal_gone(&mut self) {
        self.refused = None;
    }

    /// Whether the change from `accepted` to `new` may be written now; when it may, it is
    /// counted.
    pub fn admit(&mut self, now: Instant, accepted: &[Peer], new: &[Peer]) -> Result<(), Refused> {
        self.spent.retain(|_, at| now.duration_since(*at) < WINDOW);
        if self
            .accepted
            .as_ref()
            .is_some_and(|(_, until)| now >= *until)
        {
            self.accepted = None;
        }
        let disrupted = disrupted(accepted, new);
        if disrupted.is_empty() {
            self.refused = None;
            self.accepted = None;
            return Ok(());
        }
        let change = fingerprint(accepted, new);
        if self
            .accepted
            .as_ref()
            .is_some_and(|(r, _)| r.change == change)
        {
            self.accepted = None;
            self.refused = None;
            self.spent.clear();
            return Ok(());
        }
        // The list as it was when the window began: the peers accepted now and those removed
        // since (so each removal does not shrink the limit for the next one).
        let present = units(accepted);
        let baseline = present.len() + self.spent.keys().filter(|u| !present.contains(u)).count();
        let limit = ((self.max_fraction * baseline as f64).floor() as usize).max(1);
        let in_window = self.spent.len()
            + disrupted
                .iter()
                .filter(|u| !self.spent.contains_key(u))
                .count();
        if self.max_fraction < 1.0 && in_window > limit {
            let refused = Refused {
                disrupted,
                in_window,
                limit,
                of: baseline,
                max_fraction: self.max_fraction,
                change,
            };
            self.refused = Some(refused.clone());
            return Err(refused);
        }
        for u in disrupted {
            self.spent.insert(u, now);
        }
        self.refused = None;
        self.accepted = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    fn peer(n: u8) -> Peer {
        Peer {
            carries: Vec::new(),
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
            subnets: vec![format!("10.244.{n}.0/24").parse().unwrap()],
            mac: None,
        }
    }

    fn six() -> Vec<Peer> {
        (1..=6).map(peer).collect()
    }

    /// Peers 1 and 2 of a site; 1 is its gateway, carrying `remote` subnets of other sites.
    fn site_with(remote: u8) -> Vec<Peer> {
        let mut gw = peer(1);
        gw.carries = (0..remote)
            .map(|i| format!("198.18.{i}.0/24").parse().unwrap())
            .collect();
        vec![gw, peer(2)]
    }

    #[test]
    fn other_sites_subnets_count_as_peers_do() {
        let now = Instant::now();
        // 2 peers + 8 carried subnets = 10 units; half may go.
        let accepted = site_with(8);
        assert_eq!(
            disrupted(&accepted, &site_with(3)).len(),
            5,
            "five carried subnets gone; the gateway's own entry is the same"
        );
        let mut g = Guard::new(0.5);
        let r = g.admit(now, &accepted, &site_with(2)).unwrap_err();
        assert_eq!(r.disrupted.len(), 6);
        assert_eq!(r.of, 10);
        assert!(
            r.what().contains("198.18.2.0/24 of another site"),
            "{}",
            r.what()
        );
        let mut g = Guard::new(0.5);
        g.admit(now, &accepted, &site_with(3)).unwrap();
        // The carried subnets moving to another entry (a new gateway) disrupt them too.
        let mut moved = site_with(0);
        moved[1].carries = accepted[0].carries.clone();
        assert_eq!(disrupted(&accepted, &moved).len(), 8);
    }

    #[test]
    fn deletions_half_a_second_apart_count_together_over_the_window() {
        let mut g = Guard::new(0.5);
        let t0 = Instant::now();
        let mut accepted = six();
        // Node 6, 5, 4 go, one by one: 3 of 6 is the limit.
        for (i, n) in [6u8, 5, 4].iter().enumerate() {
            let new: Vec<Peer> = accepted
                .iter()
                .filter(|p| p.ip != IpAddr::V4(Ipv4Addr::new(192, 0, 2, *n)))
                .cloned()
                .collect();
            let at = t0 + Duration::from_millis(500 * i as u64);
            assert!(g.admit(at, &accepted, &new).is_ok(), "deletion {i}");
            accepted = new;
        }
        // The 4th, half a second later, is refused, though it is 1 of the 3 left.
        let new: Vec<Peer> = accepted[1..].to_vec();
        let r = g
            .admit(t0 + Duration::from_millis(2000), &accepted, &new)
            .unwrap_err();
        assert_eq!((r.in_window, r.limit, r.of), (4, 3, 6));
        assert!(r.to_string().contains("accept-changes"), "{r}");
        // After the window, it is a change like any other.
        assert!(
            g.admit(t0 + WINDOW + Duration::from_secs(3), &accepted, &new)
                .is_ok()
        );
    }

    #[test]
    fn a_swap_of_every_subnet_counts_every_peer_and_is_refused() {
        let mut g = Guard::new(0.5);
        let accepted = six();
        let mut swapped = six();
        for (i, p) in swapped.iter_mut().enumerate() {
            p.subnets = vec![format!("10.244.{}.0/24", 6 - i).parse().unwrap()];
        }
        let r = g.admit(Instant::now(), &accepted, &swapped).unwrap_err();
        assert_eq!(r.disrupted.len(), 6);
        // An empty list after an API restore, likewise.
        assert!(g.admit(Instant::now(), &accepted, &[]).is_err());
    }

    #[test]
    fn additions_never_count_one_change_always_may() {
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        let two = vec![peer(1), peer(2)];
        let more: Vec<Peer> = (1..=9).map(peer).collect();
        assert!(g.admit(t, &two, &more).is_ok());
        // A two-node cluster can lose a node; a one-node one can change its one peer.
        assert!(g.admit(t, &two, &two[..1]).is_ok());
        assert!(Guard::new(0.5).admit(t, &two[..1], &[]).is_ok());
    }

    #[test]
    fn ipv6_peers_count_the_same_a_changed_mac_included() {
        let six = |n: u8, mac: Option<[u8; 6]>| Peer {
            carries: Vec::new(),
            ip: format!("2001:db8::{n}").parse().unwrap(),
            subnets: vec![format!("10.244.{n}.0/24").parse().unwrap()],
            mac,
        };
        let accepted: Vec<Peer> = (1..=4).map(|n| six(n, None)).collect();
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        // Two of four: the limit. A third, a MAC change only, is over it.
        assert!(g.admit(t, &accepted, &accepted[2..]).is_ok());
        let changed = [six(3, Some([0x6e, 0, 0, 0, 0, 3])), six(4, None)];
        let r = g.admit(t, &accepted[2..], &changed).unwrap_err();
        assert_eq!(
            r.disrupted,
            [Unit::Peer("2001:db8::3".parse::<IpAddr>().unwrap())]
        );
        assert_eq!((r.in_window, r.limit, r.of), (3, 2, 4));
        assert!(r.to_string().contains("(2001:db8::3)"), "{r}");
    }

    #[test]
    fn the_operator_accepts_the_refused_change_once_and_the_window_starts_over() {
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        assert!(g.admit(t, &six(), &[]).is_err());
        let accepted = g.accept(t).cloned().unwrap();
        assert_eq!(accepted.change, fingerprint(&six(), &[]));
        assert!(
            accepted.what().contains("6 of the 6"),
            "{}",
            accepted.what()
        );
        assert!(g.admit(t, &six(), &[]).is_ok());
        assert!(g.admit(t, &six(), &[]).is_err(), "only once");
        assert!(
            Guard::new(1.0).admit(t, &six(), &[]).is_ok(),
            "1 turns it off"
        );
    }

    /// Issue 27, defect 3: an acceptance with no refusal of the guard standing (a list refused
    /// because this node's plugin would take none) stayed armed, and let a later mass removal
    /// through. Now it accepts nothing.
    #[test]
    fn an_acceptance_with_no_refusal_standing_accepts_nothing() {
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        assert!(g.accept(t).is_none(), "nothing refused yet");
        // A refusal the keeper then sees go (the Nodes came back, or an unusable list).
        assert!(g.admit(t, &six(), &[]).is_err());
        g.refusal_gone();
        assert!(g.accept(t).is_none());
        assert!(g.admit(t, &six(), &[]).is_err(), "nothing was armed");
        // A refusal that went by itself (the change shrank under the limit) likewise.
        let mut g = Guard::new(0.5);
        assert!(g.admit(t, &six(), &[]).is_err());
        assert!(g.admit(t, &six(), &six()[1..]).is_ok());
        assert!(g.accept(t).is_none());
    }

    #[test]
    fn an_acceptance_lets_only_its_own_change_through_and_expires() {
        let t0 = Instant::now();
        let mut g = Guard::new(0.5);
        assert!(g.admit(t0, &six(), &[]).is_err());
        assert!(g.accept(t0).is_some());
        // Another change (two peers left, not none) is not the one accepted.
        let other = &six()[4..];
        let r = g.admit(t0, &six(), other).unwrap_err();
        assert_ne!(r.change, fingerprint(&six(), &[]));
        // The accepted one, within ten minutes: through.
        assert!(g.admit(t0 + ACCEPT_FOR / 2, &six(), &[]).is_ok());

        let mut g = Guard::new(0.5);
        assert!(g.admit(t0, &six(), &[]).is_err());
        assert!(g.accept(t0).is_some());
        assert!(
            g.admit(t0 + ACCEPT_FOR, &six(), &[]).is_err(),
            "expired after {ACCEPT_FOR:?}"
        );
    }

    fn peer_at(n: u8, cidr: u8) -> Peer {
        Peer {
            carries: Vec::new(),
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
            subnets: vec![format!("10.244.{cidr}.0/24").parse().unwrap()],
            mac: None,
        }
    }

    /// The sequence of issue 27's "one more": three nodes, a pod CIDR rotation refused, the
    /// API restored, five Nodes added, then deleted one by one half a second apart, the
    /// accepted list following every write (as the agent's reconcile keeps it). The guard keeps
    /// node 1 at least 3 remote peers. It ended with 2 only when the agent saw fewer than all
    /// five newcomers (a relist after its backoff, two deletions in): then 3 of the 6 it had
    /// accepted went, which is the limit; [`reaching_fewer_newcomers_the_limit_is_of_those`].
    #[test]
    fn a_refused_rotation_a_restore_then_five_nodes_added_and_deleted_keep_three_remote() {
        let mut g = Guard::new(0.5);
        let t0 = Instant::now();
        let original: Vec<Peer> = (1..=3).map(|n| peer_at(n, n)).collect();
        let rotated: Vec<Peer> = (1..=3).map(|n| peer_at(n, n % 3 + 1)).collect();
        assert!(
            g.admit(t0, &original, &rotated).is_err(),
            "rotation refused"
        );
        // Retried while refused, then the restored API's list is the accepted one again.
        let t = t0 + Duration::from_secs(5);
        assert!(g.admit(t, &original, &rotated).is_err());
        assert!(g.admit(t, &original, &original).is_ok());
        let mut accepted = original.clone();
        for n in 4..=8u8 {
            let mut new = accepted.clone();
            new.push(peer_at(n, n));
            assert!(g.admit(t, &accepted, &new).is_ok(), "node {n} added");
            accepted = new;
        }
        let mut at = t + Duration::from_secs(1);
        for n in (4..=8u8).rev() {
            let new: Vec<Peer> = accepted
                .iter()
                .filter(|p| p.ip != IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)))
                .cloned()
                .collect();
            if g.admit(at, &accepted, &new).is_ok() {
                accepted = new;
            }
            at += Duration::from_millis(500);
        }
        assert_eq!(
            accepted.len() - 1,
            3,
            "remote peers of node 1: {accepted:?}"
        );
    }

    #[test]
    fn reaching_fewer_newcomers_the_limit_is_of_those() {
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        let original: Vec<Peer> = (1..=3).map(|n| peer_at(n, n)).collect();
        // The relist after the restore comes two deletions late: nodes 4 to 6 only.
        let mut accepted: Vec<Peer> = (1..=6).map(|n| peer_at(n, n)).collect();
        assert!(g.admit(t, &original, &accepted).is_ok());
        for n in (4..=6u8).rev() {
            let new: Vec<Peer> = accepted[..usize::from(n) - 1].to_vec();
            assert!(g.admit(t, &accepted, &new).is_ok(), "3 of 6 is the limit");
            accepted = new;
        }
        assert_eq!(accepted, original);
    }
}
