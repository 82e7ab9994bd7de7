//! The guard against changes that would stop traffic on many peers at once: an API answering
//! an empty list after a restore, a burst of DELETED events, a list that swaps every node's pod
//! CIDRs. What it counts is every peer of the last list the plugin accepted (its last-good copy)
//! that a new list removes or changes (subnets, underlay address, MAC): those are the peers
//! whose traffic would stop or move. It counts them over a window of time, not per event, so
//! five deletions half a second apart count as five. More than `--max-remove-fraction` of the
//! accepted peers (at least one) within [`WINDOW`] is refused: the peers file stays as it is,
//! the refusal is logged, counted and shown until the change shrinks back under the limit, the
//! window passes, or the operator accepts it ([`Guard::accept_once`], see docs/agent.md).
//! Additions never count.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::vxlan::peers::Peer;

/// How long a disrupted peer counts against the limit.
pub const WINDOW: Duration = Duration::from_secs(600);

/// A change the guard refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Peers of the accepted list the change removes or changes.
    pub disrupted: Vec<IpAddr>,
    /// Of those and the ones disrupted earlier in the window, how many in all.
    pub in_window: usize,
    pub limit: usize,
    /// Peers in the list the plugin accepted when the window began.
    pub of: usize,
    pub max_fraction: f64,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<String> = self
            .disrupted
            .iter()
            .take(8)
            .map(ToString::to_string)
            .collect();
        let more = self.disrupted.len().saturating_sub(shown.len());
        write!(
            f,
            "the API's nodes would remove or change {} of the {} peers the plugin accepted ({}{}), {} within {} minutes with the ones before, more than --max-remove-fraction {} allows ({}); keeping the peers file as it is. If the cluster really changed that much, accept it once with `touch <stateDir>/<network>.accept-changes` (docs/agent.md)",
            self.disrupted.len(),
            self.of,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            self.in_window,
            WINDOW.as_secs() / 60,
            self.max_fraction,
            self.limit,
        )
    }
}

/// The peers of `accepted` that `new` removes or changes.
pub fn disrupted(accepted: &[Peer], new: &[Peer]) -> Vec<IpAddr> {
    let new: BTreeMap<IpAddr, &Peer> = new.iter().map(|p| (p.ip, p)).collect();
    accepted
        .iter()
        .filter(|p| new.get(&p.ip) != Some(p))
        .map(|p| p.ip)
        .collect()
}

#[derive(Debug, Clone)]
pub struct Guard {
    max_fraction: f64,
    /// Peers disrupted by accepted changes, and when.
    spent: BTreeMap<IpAddr, Instant>,
    accept_next: bool,
}

impl Guard {
    pub fn new(max_fraction: f64) -> Guard {
        Guard {
            max_fraction,
            spent: BTreeMap::new(),
            accept_next: false,
        }
    }

    /// The operator accepts the next change whatever its size; the window starts over.
    pub fn accept_once(&mut self) {
        self.accept_next = true;
    }

    /// Whether the change from `accepted` to `new` may be written now; when it may, it is
    /// counted.
    pub fn admit(&mut self, now: Instant, accepted: &[Peer], new: &[Peer]) -> Result<(), Refused> {
        self.spent.retain(|_, at| now.duration_since(*at) < WINDOW);
        let disrupted = disrupted(accepted, new);
        if disrupted.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut self.accept_next) {
            self.spent.clear();
            return Ok(());
        }
        // The list as it was when the window began: the peers accepted now and those removed
        // since (so each removal does not shrink the limit for the next one).
        let present: std::collections::BTreeSet<IpAddr> = accepted.iter().map(|p| p.ip).collect();
        let baseline =
            accepted.len() + self.spent.keys().filter(|ip| !present.contains(ip)).count();
        let limit = ((self.max_fraction * baseline as f64).floor() as usize).max(1);
        let in_window = self.spent.len()
            + disrupted
                .iter()
                .filter(|ip| !self.spent.contains_key(ip))
                .count();
        if self.max_fraction < 1.0 && in_window > limit {
            return Err(Refused {
                disrupted,
                in_window,
                limit,
                of: baseline,
                max_fraction: self.max_fraction,
            });
        }
        for ip in disrupted {
            self.spent.insert(ip, now);
        }
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
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
            subnets: vec![format!("10.244.{n}.0/24").parse().unwrap()],
            mac: None,
        }
    }

    fn six() -> Vec<Peer> {
        (1..=6).map(peer).collect()
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
        assert_eq!(r.disrupted, ["2001:db8::3".parse::<IpAddr>().unwrap()]);
        assert_eq!((r.in_window, r.limit, r.of), (3, 2, 4));
        assert!(r.to_string().contains("(2001:db8::3)"), "{r}");
    }

    #[test]
    fn the_operator_accepts_one_refused_change_and_the_window_starts_over() {
        let mut g = Guard::new(0.5);
        let t = Instant::now();
        assert!(g.admit(t, &six(), &[]).is_err());
        g.accept_once();
        assert!(g.admit(t, &six(), &[]).is_ok());
        assert!(g.admit(t, &six(), &[]).is_err(), "only once");
        assert!(
            Guard::new(1.0).admit(t, &six(), &[]).is_ok(),
            "1 turns it off"
        );
    }
}
