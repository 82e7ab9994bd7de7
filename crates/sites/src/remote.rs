//! Which candidate of a remote site an active gateway sends that site's traffic to, learned
//! from the tunnel itself (issue 29): a remote site behind NAT that moves to its standby is
//! followed at the standby's first handshake, with no API.
//!
//! - The active gateway holds a WireGuard peer for **every** candidate of each remote site it
//!   has a tunnel with (their keys are known ahead, from the Nodes or the cache); only the
//!   rule's choice ([`crate::gateway`]) gets the endpoint to dial, the others are dial-in only.
//! - The site's allowed IPs go to the one it takes as active ([`remote_active`]): the
//!   candidate with the newest sign of life (a handshake, or traffic received: the caller's
//!   reading) within the up time (180 s), switching only when another's is newer than the
//!   current one's (hysteresis); none within it: the rule's choice.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crate::model::{Model, SiteName};
use crate::plan::SitePeer;
use crate::tunnel::PeerConfig;

/// The candidate taken as a remote site's active one: `handshakes` (candidate → its latest
/// handshake), `current` (the one taken last), `rule` (the rule's choice), at `now`.
pub fn remote_active<'a>(
    handshakes: &'a BTreeMap<String, SystemTime>,
    current: Option<&'a str>,
    rule: &'a str,
    now: SystemTime,
    within: Duration,
) -> &'a str {
    let fresh = |t: &SystemTime| now.duration_since(*t).map_or(true, |age| age <= within);
    let newest = handshakes
        .iter()
        .filter(|(_, t)| fresh(t))
        .max_by_key(|(n, t)| (**t, std::cmp::Reverse(n.as_str())))
        .map(|(n, t)| (n.as_str(), *t));
    let Some((best, best_at)) = newest else {
        return rule;
    };
    match current.and_then(|c| handshakes.get(c).filter(|t| fresh(t)).map(|t| (c, *t))) {
        Some((c, at)) if best_at <= at => c,
        _ => best,
    }
}

/// One peer of the expanded plan: borrowed from the plan and the model where it is the plan's
/// own (a hub expands 10,000 peers every round).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidatePeer<'a> {
    pub site: &'a SiteName,
    /// The candidate's Node name.
    pub gateway: &'a str,
    pub config: Cow<'a, PeerConfig>,
}

/// The plan's `peers` (one per remote site, to the rule's choice) expanded to every candidate
/// of each site, the site's allowed IPs on `taken[site]` (else the rule's choice).
pub fn expand<'a>(
    peers: &'a [SitePeer],
    model: &'a Model,
    taken: &HashMap<SiteName, String>,
) -> Vec<CandidatePeer<'a>> {
    let mut out = Vec::with_capacity(peers.len());
    for p in peers {
        let on = taken.get(&p.site).unwrap_or(&p.gateway);
        let candidates = model
            .sites
            .get(&p.site)
            .map_or(&[][..], |s| &s.candidates[..]);
        let others = candidates.iter().filter(|c| c.name != p.gateway);
        let rule = |config| CandidatePeer {
            site: &p.site,
            gateway: &p.gateway,
            config,
        };
        if *on == p.gateway || !candidates.iter().any(|c| c.name == *on) {
            // The rule's choice carries (also when the one taken is no longer a candidate).
            out.push(rule(Cow::Borrowed(&p.config)));
            out.extend(others.map(|c| standby(p, c)));
            continue;
        }
        let mut config = p.config.clone();
        config.allowed_ips.clear();
        out.push(rule(Cow::Owned(config)));
        for c in others {
            let mut s = standby(p, c);
            if c.name == *on {
                s.config
                    .to_mut()
                    .allowed_ips
                    .clone_from(&p.config.allowed_ips);
            }
            out.push(s);
        }
    }
    out
}

/// A candidate other than the rule's choice: dial-in only, no allowed IPs.
fn standby<'a>(p: &'a SitePeer, c: &'a crate::model::Candidate) -> CandidatePeer<'a> {
    CandidatePeer {
        site: &p.site,
        gateway: &c.name,
        config: Cow::Owned(PeerConfig {
            public_key: c.public_key,
            endpoint: None,
            allowed_ips: Vec::new(),
            keepalive_secs: p.config.keepalive_secs,
            last_seen: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::PublicKey;
    use crate::model::{Candidate, Site};

    const UP: Duration = Duration::from_secs(180);

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn hs(e: &[(&str, u64)]) -> BTreeMap<String, SystemTime> {
        e.iter().map(|(n, s)| ((*n).to_string(), at(*s))).collect()
    }

    #[test]
    fn remote_active_table() {
        // (handshakes, current, rule, now, expected)
        type Case<'a> = (&'a [(&'a str, u64)], Option<&'a str>, &'a str, u64, &'a str);
        let cases: &[Case] = &[
            (&[], None, "a1", 10, "a1"),                           // none: the rule
            (&[("a1", 0)], None, "a1", 200, "a1"),                 // stale: the rule
            (&[("a3", 0)], None, "a1", 200, "a1"),                 // stale standby: the rule
            (&[("a3", 5)], None, "a1", 10, "a3"),                  // standby's handshake: taken
            (&[("a1", 5), ("a3", 8)], Some("a1"), "a1", 10, "a3"), // newer: switch
            (&[("a1", 8), ("a3", 5)], Some("a3"), "a1", 10, "a1"), // a1 newer again
            (&[("a1", 8), ("a3", 8)], Some("a3"), "a1", 10, "a3"), // a tie: stay
            (&[("a1", 8), ("a3", 8)], None, "a1", 10, "a1"),       // a tie, none taken: first
            (&[("a1", 0), ("a3", 100)], Some("a1"), "a1", 190, "a3"), // current stale
            (&[("a3", 100)], Some("gone"), "a1", 110, "a3"),
        ];
        for (h, current, rule, now, want) in cases {
            let h = hs(h);
            let got = remote_active(&h, *current, rule, at(*now), UP);
            assert_eq!(got, *want, "{h:?} current {current:?} rule {rule}");
        }
    }

    fn model() -> Model {
        let mut m = Model::default();
        let cand = |n: &str, k: u8| Candidate {
            name: n.into(),
            public_key: PublicKey([k; 32]),
            endpoint: None,
            underlay: None,
        };
        let site = Site {
            candidates: vec![cand("a1", 1), cand("a3", 3)],
            ..Site::default()
        };
        m.sites
            .insert(SiteName::parse("k", "site-a").unwrap(), site);
        m
    }

    fn peer() -> SitePeer {
        SitePeer {
            site: SiteName::parse("k", "site-a").unwrap(),
            gateway: "a1".into(),
            via: None,
            config: PeerConfig {
                public_key: PublicKey([1; 32]),
                endpoint: Some("203.0.113.10:51820".parse().unwrap()),
                allowed_ips: vec!["198.18.11.0/24".parse().unwrap()],
                keepalive_secs: None,
                last_seen: None,
            },
        }
    }

    #[test]
    fn every_candidate_is_a_peer_and_the_taken_one_carries() {
        let m = model();
        let site = SiteName::parse("k", "site-a").unwrap();
        let peers = [peer()];
        let rule = expand(&peers, &m, &HashMap::new());
        let summary = |v: &[CandidatePeer]| {
            v.iter()
                .map(|p| {
                    (
                        p.gateway.to_string(),
                        p.config.public_key.0[0],
                        p.config.endpoint.is_some(),
                        p.config.allowed_ips.len(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            summary(&rule),
            [("a1".into(), 1, true, 1), ("a3".into(), 3, false, 0)]
        );
        let taken = HashMap::from([(site.clone(), "a3".to_string())]);
        assert_eq!(
            summary(&expand(&peers, &m, &taken)),
            [("a1".into(), 1, true, 0), ("a3".into(), 3, false, 1)]
        );
        let gone = HashMap::from([(site, "a9".to_string())]);
        assert_eq!(summary(&expand(&peers, &m, &gone)), summary(&rule));
    }
}
