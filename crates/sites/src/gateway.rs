//! Which of a site's gateway candidates is active, decided the same way by every node from
//! what it has cached (the candidates, in name order) and what it observes itself (which
//! candidates are alive): no election through the API, no lease (issue 29, "Failover without
//! the API"). With nothing observed, the rule is issue 28's: the first candidate by name.
//!
//! The rule (no preemption):
//! 1. The current active gateway stays while it is still a candidate and not seen dead.
//! 2. Otherwise the first candidate by name not seen dead becomes active.
//! 3. If every candidate is seen dead: the current one stays if it is still a candidate (moving
//!    to another dead gateway helps nothing and would be one more switch), else the first.
//! 4. No candidates: no active gateway.
//!
//! No flapping: a gateway that comes back (earlier in the order or not) does not take over;
//! the site moves again only when the one it moved to dies. The cost: which gateway is active
//! depends on history, so the caller must keep `current` across restarts (the last-good
//! file); a node that starts with no `current` while the first gateway has returned picks it,
//! and may then disagree with its site until one of the two dies. [`Seen::Unknown`] (no
//! probe answered or failed yet) counts as alive, so a node that just started does not skip
//! gateways it has not had time to probe.

use std::collections::BTreeMap;

use crate::model::Candidate;

/// What this node observes of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seen {
    /// Probes answered.
    Alive,
    /// Probes failed (the caller's rule: so many missed in a row).
    Dead,
    /// Not probed yet: treated as alive.
    Unknown,
}

/// This node's liveness view, by candidate name; a name not in the map is [`Seen::Unknown`].
pub type Liveness = BTreeMap<String, Seen>;

/// The rule's errors (a name given as current that is no candidate is not one: it is dropped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("gateway candidates are not sorted by name at {name:?}: the rule needs name order")]
    Unsorted { name: String },
}

fn seen(liveness: &Liveness, name: &str) -> Seen {
    liveness.get(name).copied().unwrap_or(Seen::Unknown)
}

/// The active gateway among `candidates` (sorted by name, as [`crate::model::Site`] keeps
/// them), given this node's `liveness` view and the `current` active one.
pub fn active<'a>(
    candidates: &'a [Candidate],
    liveness: &Liveness,
    current: Option<&str>,
) -> Result<Option<&'a Candidate>, Error> {
    if let Some(w) = candidates.windows(2).find(|w| w[0].name >= w[1].name) {
        return Err(Error::Unsorted {
            name: w[1].name.clone(),
        });
    }
    let current = current.and_then(|name| {
        candidates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .and_then(|i| candidates.get(i))
    });
    if let Some(c) = current
        && seen(liveness, &c.name) != Seen::Dead
    {
        return Ok(Some(c));
    }
    if let Some(c) = candidates
        .iter()
        .find(|c| seen(liveness, &c.name) != Seen::Dead)
    {
        return Ok(Some(c));
    }
    Ok(current.or(candidates.first()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::PublicKey;
    use proptest::prelude::*;

    fn cands(names: &[&str]) -> Vec<Candidate> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| Candidate {
                name: (*n).into(),
                public_key: PublicKey([i as u8 + 1; 32]),
                endpoint: None,
                underlay: None,
            })
            .collect()
    }

    fn view(entries: &[(&str, Seen)]) -> Liveness {
        entries
            .iter()
            .map(|(n, s)| ((*n).to_string(), *s))
            .collect()
    }

    #[test]
    fn rule_table() {
        use Seen::*;
        let c = cands(&["g1", "g2", "g3"]);
        // (liveness, current, expected)
        type Case<'a> = (&'a [(&'a str, Seen)], Option<&'a str>, Option<&'a str>);
        let cases: &[Case] = &[
            (&[], None, Some("g1")),             // issue 28: first by name
            (&[("g1", Dead)], None, Some("g2")), // first not dead
            (&[("g1", Dead), ("g2", Dead)], None, Some("g3")),
            (&[("g1", Alive)], Some("g2"), Some("g2")), // returning g1: no takeover
            (&[("g2", Dead)], Some("g2"), Some("g1")),  // current dies: first alive
            (&[("g1", Dead), ("g2", Dead)], Some("g2"), Some("g3")),
            (
                &[("g1", Dead), ("g2", Dead), ("g3", Dead)],
                Some("g2"),
                Some("g2"),
            ), // all dead: stay
            (
                &[("g1", Dead), ("g2", Dead), ("g3", Dead)],
                None,
                Some("g1"),
            ),
            (&[], Some("gone"), Some("g1")), // current no candidate
            (&[("g3", Unknown)], Some("g3"), Some("g3")),
        ];
        for (live, current, want) in cases {
            let got = active(&c, &view(live), *current)
                .unwrap()
                .map(|c| c.name.as_str());
            assert_eq!(got, *want, "liveness {live:?}, current {current:?}");
        }
        assert_eq!(active(&[], &Liveness::new(), Some("g1")).unwrap(), None);
    }

    #[test]
    fn failover_sequence_switches_once_per_death() {
        use Seen::*;
        let c = cands(&["g1", "g2"]);
        let mut current: Option<String> = None;
        let mut switches = 0;
        for live in [
            view(&[("g1", Alive), ("g2", Alive)]),
            view(&[("g1", Dead), ("g2", Alive)]),
            view(&[("g1", Alive), ("g2", Alive)]), // g1 returns: no second outage
            view(&[("g1", Alive), ("g2", Alive)]),
            view(&[("g1", Alive), ("g2", Dead)]),
        ] {
            let next = active(&c, &live, current.as_deref())
                .unwrap()
                .map(|c| c.name.clone());
            if current.is_some() && next != current {
                switches += 1;
            }
            current = next;
        }
        assert_eq!(current.as_deref(), Some("g1"));
        assert_eq!(switches, 2);
    }

    #[test]
    fn unsorted_candidates_are_refused() {
        let mut c = cands(&["g1", "g2"]);
        c.swap(0, 1);
        assert!(matches!(
            active(&c, &Liveness::new(), None),
            Err(Error::Unsorted { .. })
        ));
    }

    proptest! {
        /// The choice depends on the liveness map's contents, never on the order facts arrived.
        #[test]
        fn choice_ignores_observation_order(
            states in proptest::collection::vec(0u8..3, 4),
            current in proptest::option::of(0usize..5),
            order in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
        ) {
            let names = ["g1", "g2", "g3", "g4"];
            let c = cands(&names);
            let seen_of = |s: u8| match s { 0 => Seen::Alive, 1 => Seen::Dead, _ => Seen::Unknown };
            let mut a = Liveness::new();
            for i in 0..4 { a.insert(names[i].into(), seen_of(states[i])); }
            let mut b = Liveness::new();
            for &i in &order { b.insert(names[i].into(), seen_of(states[i])); }
            let cur = current.map(|i| names.get(i).copied().unwrap_or("gone"));
            let x = active(&c, &a, cur).unwrap().map(|c| c.name.clone());
            let y = active(&c, &b, cur).unwrap().map(|c| c.name.clone());
            prop_assert_eq!(&x, &y);
            // And the chosen one is never dead while an alive one exists.
            if let Some(x) = x
                && states.iter().any(|s| *s != 1)
            {
                prop_assert_ne!(seen(&a, &x), Seen::Dead);
            }
        }
    }
}
