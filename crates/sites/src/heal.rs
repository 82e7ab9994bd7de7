//! Step-down and healing inside a site (issue 29): a gateway candidate cut off from its site
//! must not come back as a second active gateway.
//!
//! The rule, applied by each candidate of a site with more than one member:
//! 1. It **steps down** when every other member it probes is seen dead (none answered
//!    [`crate::probe::DEAD_AFTER`] probes in a row): it is the one cut off, so it removes its
//!    tunnel peers and routes; when its link returns it does not handshake as the active one.
//! 2. Stepped down, once some member is seen alive again, it **adopts the site's choice**: the
//!    active gateway named by most of the members seen alive (ties: the first by name), if
//!    that gateway is alive in its own view (or is itself); then it is back to normal with that
//!    choice as its current active gateway. Until then it stays stepped down.
//! 3. Otherwise nothing changes: no preemption ([`crate::gateway`]).

use std::collections::BTreeMap;

use crate::gateway::{Liveness, Seen};

/// A candidate's stance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Stance {
    /// Follows [`crate::gateway::active`].
    #[default]
    Normal,
    /// Cut off from its site: not the active gateway whatever the rule says.
    SteppedDown,
}

/// What one healing step decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Healing {
    pub stance: Stance,
    /// The site's choice to take as this node's current active gateway.
    pub adopt: Option<String>,
}

/// The majority of `choices` (member → the active gateway it named): most named, ties by name.
pub fn majority(choices: &BTreeMap<String, String>) -> Option<&str> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in choices.values() {
        *counts.entry(c.as_str()).or_default() += 1;
    }
    // max_by_key keeps the last maximum: iterate in reverse name order so ties go to the first.
    counts
        .into_iter()
        .rev()
        .max_by_key(|(_, n)| *n)
        .map(|(c, _)| c)
}

/// One step of the rule for node `me` (a candidate of a site whose other members are
/// `others`), from its `liveness` view and the members' `choices`.
pub fn step(
    stance: &Stance,
    me: &str,
    others: &[&str],
    liveness: &Liveness,
    choices: &BTreeMap<String, String>,
) -> Healing {
    let seen = |n: &str| liveness.get(n).copied().unwrap_or(Seen::Unknown);
    let cut_off = !others.is_empty() && others.iter().all(|n| seen(n) == Seen::Dead);
    if cut_off {
        return Healing {
            stance: Stance::SteppedDown,
            adopt: None,
        };
    }
    if *stance == Stance::Normal {
        return Healing {
            stance: Stance::Normal,
            adopt: None,
        };
    }
    let alive: BTreeMap<String, String> = choices
        .iter()
        .filter(|(m, _)| others.contains(&m.as_str()) && seen(m) == Seen::Alive)
        .map(|(m, c)| (m.clone(), c.clone()))
        .collect();
    match majority(&alive) {
        Some(c) if c == me || seen(c) == Seen::Alive => Healing {
            stance: Stance::Normal,
            adopt: Some(c.to_string()),
        },
        _ => Healing {
            stance: Stance::SteppedDown,
            adopt: None,
        },
    }
}

/// Rule 4, in the normal stance, for every node of the site (members too): it **follows its
/// site**. Its own current active gateway (`current`) and those named by the members it sees
/// alive (`choices`) vote ([`majority`]); a winner other than `current` is taken when it is
/// alive in this node's view (or is this node). Without it, one node that missed a few probes
/// in a row (loss, a busy second) moves to the next candidate while the rest of the site stays,
/// and no preemption would ever bring it back: its pods' traffic goes to a node that is not the
/// gateway (the simulation found it: `simulation_api_away_for_an_hour`).
pub fn follow(
    me: &str,
    current: Option<&str>,
    liveness: &Liveness,
    choices: &BTreeMap<String, String>,
) -> Option<String> {
    let seen = |n: &str| liveness.get(n).copied().unwrap_or(Seen::Unknown);
    let mut votes: BTreeMap<String, String> = choices
        .iter()
        .filter(|(m, _)| m.as_str() != me && seen(m) == Seen::Alive)
        .map(|(m, c)| (m.clone(), c.clone()))
        .collect();
    if let Some(c) = current {
        votes.insert(me.to_string(), c.to_string());
    }
    let winner = majority(&votes)?;
    let take = Some(winner) != current && (winner == me || seen(winner) == Seen::Alive);
    take.then(|| winner.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Seen::*;

    fn view(e: &[(&str, Seen)]) -> Liveness {
        e.iter().map(|(n, s)| ((*n).to_string(), *s)).collect()
    }

    fn choices(e: &[(&str, &str)]) -> BTreeMap<String, String> {
        e.iter()
            .map(|(m, c)| ((*m).to_string(), (*c).to_string()))
            .collect()
    }

    #[test]
    fn a_node_that_moved_alone_follows_its_site_back() {
        // a2 missed a1's probes, moved to a3; a1 answers again, and a1 and a3 both name a1.
        let live = view(&[("a1", Alive), ("a3", Alive)]);
        let named = choices(&[("a1", "a1"), ("a3", "a1")]);
        assert_eq!(follow("a2", Some("a3"), &live, &named), Some("a1".into()));
        // Agreeing with the site: nothing to take.
        assert_eq!(follow("a2", Some("a1"), &live, &named), None);
        // The winner is dead in this node's view: it keeps its own.
        let a1_dead = view(&[("a1", Dead), ("a3", Alive)]);
        assert_eq!(
            follow("a2", Some("a3"), &a1_dead, &choices(&[("a3", "a1")])),
            None
        );
        // One against one: the first by name wins the tie, if alive.
        let named = choices(&[("a3", "a3")]);
        assert_eq!(follow("a1", Some("a1"), &live, &named), None);
        assert_eq!(
            follow("a3", Some("a3"), &live, &choices(&[("a1", "a1")])),
            Some("a1".into())
        );
        // Votes of members not seen alive do not count.
        let a1_unknown = view(&[("a1", Unknown), ("a3", Alive)]);
        assert_eq!(
            follow("a2", Some("a3"), &a1_unknown, &choices(&[("a1", "a1")])),
            None
        );
    }

    #[test]
    fn majority_table() {
        assert_eq!(majority(&choices(&[])), None);
        assert_eq!(majority(&choices(&[("a2", "a3")])), Some("a3"));
        assert_eq!(
            majority(&choices(&[("a2", "a3"), ("a4", "a3"), ("a5", "a1")])),
            Some("a3")
        );
        assert_eq!(
            majority(&choices(&[("a2", "a3"), ("a4", "a1")])),
            Some("a1"),
            "a tie goes to the first by name"
        );
    }

    #[test]
    fn rule_table() {
        use Stance::*;
        let others = ["a2", "a3"];
        // (stance, liveness, choices, expected stance, adopt)
        type Case<'a> = (
            Stance,
            &'a [(&'a str, Seen)],
            &'a [(&'a str, &'a str)],
            Stance,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (Normal, &[], &[], Normal, None),             // nothing probed yet
            (Normal, &[("a2", Dead)], &[], Normal, None), // a3 still unknown
            (
                Normal,
                &[("a2", Dead), ("a3", Dead)],
                &[],
                SteppedDown,
                None,
            ), // cut off
            (
                SteppedDown,
                &[("a2", Dead), ("a3", Dead)],
                &[],
                SteppedDown,
                None,
            ),
            // Back: a2 and a3 alive and name a3: adopt a3.
            (
                SteppedDown,
                &[("a2", Alive), ("a3", Alive)],
                &[("a2", "a3"), ("a3", "a3")],
                Normal,
                Some("a3"),
            ),
            // Back, but the majority's gateway is not alive in this view: wait.
            (
                SteppedDown,
                &[("a2", Alive), ("a3", Unknown)],
                &[("a2", "a3")],
                SteppedDown,
                None,
            ),
            // The site still names this node (it was a short blip): adopt itself.
            (
                SteppedDown,
                &[("a2", Alive), ("a3", Dead)],
                &[("a2", "a1")],
                Normal,
                Some("a1"),
            ),
            // Choices of members not seen alive do not count.
            (
                SteppedDown,
                &[("a2", Unknown), ("a3", Alive)],
                &[("a2", "a1"), ("a3", "a3")],
                Normal,
                Some("a3"),
            ),
            // Normal: no preemption, whatever the choices say.
            (
                Normal,
                &[("a2", Alive), ("a3", Alive)],
                &[("a2", "a3"), ("a3", "a3")],
                Normal,
                None,
            ),
        ];
        for (stance, live, ch, want, adopt) in cases {
            let got = step(stance, "a1", &others, &view(live), &choices(ch));
            assert_eq!(got.stance, *want, "{stance:?} {live:?} {ch:?}");
            assert_eq!(got.adopt.as_deref(), *adopt, "{stance:?} {live:?} {ch:?}");
        }
    }

    #[test]
    fn a_single_node_site_never_steps_down() {
        let got = step(
            &Stance::Normal,
            "a1",
            &[],
            &Liveness::new(),
            &BTreeMap::new(),
        );
        assert_eq!(got.stance, Stance::Normal);
    }
}
