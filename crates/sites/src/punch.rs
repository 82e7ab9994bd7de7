//! Hole punching between two gateways behind NAT (issue 29): when and for how long the active
//! gateway tries a direct tunnel ([`crate::paths::Path::Punch`]), and what its WireGuard peers
//! are meanwhile. Pure: every decision takes the clock as an argument.
//!
//! Per remote site with a punch path, [`Punch::step`] with "the direct path is alive": its last
//! sign of life (a handshake, or bytes received while the peer's endpoint is a real address:
//! both sides keep it alive with WireGuard's keepalive, every [`PUNCH_KEEPALIVE_SECS`]) is
//! within [`DEAD_AFTER`], as [`Lives`] keeps it. The remote gateway has one peer whichever way
//! it goes ([`Punches::apply`]):
//! - **Trying**: through the relay, punching (`crate::relay`: handshakes also go to the
//!   address the relay saw the other side at, keepalives only there; both sides at about the
//!   same time); a direct datagram roams the peer to a real address, and a sign of life there
//!   makes it **Up**; none within [`TRY_FOR`] pauses it. With no relay: the peer at the mapped
//!   address, no allowed IPs.
//! - **Paused** (through the relay without punching; with no relay, no peer) for the current
//!   wait: [`FIRST_WAIT`], doubling at each failed try up to [`MAX_WAIT`]; then Trying again.
//! - **Up** (direct, left where WireGuard roamed it): while alive; silent past [`DEAD_AFTER`] (a
//!   NAT router rebooted, a WAN address changed, the remote site's gateway gone: its standby
//!   cannot reach this side through its NAT), the peer goes back through the relay at once and
//!   the punch starts over (Trying, wait back to [`FIRST_WAIT`]). WireGuard itself would hold
//!   on to the session for up to 180 s; the relay is there all along, so a direct path that
//!   stops carrying is left within seconds.
//!
//! Both sides start from the same event (the reachable gateway's annotation naming both), so
//! their tries overlap; a handshake seen by one side is seen by the other within a round.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use crate::model::SiteName;
use crate::paths::Path;
use crate::plan::{PUNCH_KEEPALIVE_SECS, SitePlan};
use crate::relay;

/// How long a punch peer may be silent (no handshake, no byte received) before its direct
/// path counts as dead: three of its keepalives ([`PUNCH_KEEPALIVE_SECS`]) missed in a row (a
/// member is dead after 2.5 s without an answer to its probes, [`crate::probe::DEAD_AFTER`]).
/// The caller reads the device once a round, so the path is left at the first round past this.
pub const DEAD_AFTER: Duration = Duration::from_secs(3 * PUNCH_KEEPALIVE_SECS as u64);
/// A try with no handshake within this is paused.
pub const TRY_FOR: Duration = Duration::from_secs(30);
/// The first pause after a failed try.
pub const FIRST_WAIT: Duration = Duration::from_secs(60);
/// The longest pause.
pub const MAX_WAIT: Duration = Duration::from_secs(30 * 60);

/// Where one punch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The punch peer is on the device since `since`.
    Trying { since: SystemTime },
    /// Direct and handshaking.
    Up,
    /// No punch peer until `until`.
    Paused { until: SystemTime },
}

/// One remote site's punch: its state and the wait after the next failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Punch {
    pub state: State,
    pub wait: Duration,
}

impl Punch {
    /// A punch starting now.
    pub fn new(now: SystemTime) -> Punch {
        Punch {
            state: State::Trying { since: now },
            wait: FIRST_WAIT,
        }
    }

    /// The state at `now`, given whether a direct handshake is fresh (see the module doc).
    pub fn step(&mut self, now: SystemTime, handshake_fresh: bool) {
        let elapsed = |t: SystemTime| now.duration_since(t).unwrap_or(Duration::ZERO);
        self.state = match self.state {
            State::Trying { .. } | State::Paused { .. } if handshake_fresh => State::Up,
            State::Trying { since } if elapsed(since) >= TRY_FOR => {
                let until = now + self.wait;
                self.wait = (self.wait * 2).min(MAX_WAIT);
                State::Paused { until }
            }
            State::Paused { until } if now >= until => State::Trying { since: now },
            State::Up if !handshake_fresh => {
                self.wait = FIRST_WAIT;
                State::Trying { since: now }
            }
            s => s,
        };
    }

    /// Whether the punch peer is on the device.
    pub fn has_peer(&self) -> bool {
        !matches!(self.state, State::Paused { .. })
    }
}

/// The remote sites `plan` punches towards.
pub fn punching(plan: &SitePlan) -> BTreeSet<&SiteName> {
    plan.remotes
        .iter()
        .filter(|r| matches!(r.path, Path::Punch { .. }))
        .map(|r| &r.site)
        .collect()
}

/// The punches of this gateway, by remote site.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Punches(pub BTreeMap<SiteName, Punch>);

impl Punches {
    /// Steps every punch path of `plan` at `now`; `fresh`: the sites whose punch peer is
    /// alive ([`Lives::alive`]). A site that is no punch path any more is forgotten; a new one
    /// starts trying.
    pub fn step(&mut self, plan: &SitePlan, now: SystemTime, fresh: &BTreeSet<SiteName>) {
        let punching = punching(plan);
        self.0.retain(|s, _| punching.contains(s));
        for site in punching {
            self.0
                .entry(site.clone())
                .or_insert_with(|| Punch::new(now))
                .step(now, fresh.contains(site));
        }
    }

    /// `plan` as these punches make it, on the remote gateway's one peer (the same keys
    /// whichever way it goes): up, it stays at the direct address WireGuard roamed it to and
    /// carries the remote site's subnets; trying, it goes through the relay and punches (`crate::relay`), or with
    /// no relay only handshakes at the mapped address; paused, it goes through the relay
    /// without punching, or with no relay is removed. The path is marked `up` or not. Other
    /// paths are untouched. No punch: the plan itself.
    pub fn apply<'a>(&self, plan: &'a SitePlan) -> Cow<'a, SitePlan> {
        if self.0.is_empty() {
            return Cow::Borrowed(plan);
        }
        let mut out = plan.clone();
        for r in &mut out.remotes {
            let Path::Punch { up, dial, .. } = &mut r.path else {
                continue;
            };
            let Some(p) = self.0.get(&r.site) else {
                continue;
            };
            *up = p.state == State::Up;
            let Some(gw) = &mut out.gateway else {
                continue;
            };
            let Some(i) = gw.peers.iter().position(|peer| peer.site == r.site) else {
                continue;
            };
            let peer = &mut gw.peers[i];
            let key = peer.config.public_key;
            let config = &mut peer.config;
            match (p.state, peer.via) {
                (State::Up, _) => {
                    // Where WireGuard roamed it on a direct datagram: the candidate the relay
                    // named may be fresher than the mapped address the cloud published.
                    config.endpoint = None;
                    config.keepalive_secs = Some(PUNCH_KEEPALIVE_SECS);
                    config.allowed_ips.clone_from(&r.subnets);
                }
                (State::Trying { .. }, Some(via)) => {
                    config.endpoint = Some(relay::endpoint(&via, &key, true));
                    config.keepalive_secs = Some(PUNCH_KEEPALIVE_SECS);
                    config.allowed_ips.clone_from(&r.subnets);
                }
                (State::Trying { .. }, None) => {
                    config.endpoint = Some(*dial);
                    config.keepalive_secs = Some(PUNCH_KEEPALIVE_SECS);
                    config.allowed_ips.clear();
                }
                (State::Paused { .. }, Some(via)) => {
                    config.endpoint = Some(relay::endpoint(&via, &key, false));
                    config.keepalive_secs = None;
                    config.allowed_ips.clone_from(&r.subnets);
                }
                (State::Paused { .. }, None) => {
                    gw.peers.remove(i);
                }
            }
        }
        Cow::Owned(out)
    }

    /// How a punch path reads in the status: `None` for a site with no punch.
    pub fn describe(&self, site: &SiteName, now: SystemTime) -> Option<String> {
        let p = self.0.get(site)?;
        Some(match p.state {
            State::Up => "punched".into(),
            State::Trying { .. } => "punching".into(),
            State::Paused { until } => format!(
                "punch paused: next try in {} s",
                until.duration_since(now).map_or(0, |d| d.as_secs())
            ),
        })
    }
}

/// A peer's last sign of life: its newest handshake, or the last round its received bytes
/// grew. The one rule for both the punches ([`Lives`]) and the remote choice
/// ([`crate::round`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sign {
    /// Its received bytes at the last round.
    rx: u64,
    pub at: Option<SystemTime>,
}

impl Sign {
    /// A peer first seen with `rx` bytes received: those are no sign of life of their own.
    pub fn first(rx: u64) -> Sign {
        Sign { rx, at: None }
    }

    /// What the device shows of the peer at `now`: its received bytes and its last handshake.
    pub fn saw(&mut self, rx: u64, handshake: Option<SystemTime>, now: SystemTime) {
        if rx > self.rx {
            self.at = Some(now);
        }
        self.rx = rx;
        self.at = self.at.max(handshake);
    }
}

/// The last sign of life of each punch peer, by remote site. Kept here because the data path
/// forgets a peer's handshake and counters whenever the peer is set again (gotatun makes it
/// anew, e.g. when its allowed IPs move): without this, moving the subnets would make the
/// punch look dead at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lives(BTreeMap<SiteName, Sign>);

impl Lives {
    /// What the device shows of `site`'s punch peer at `now`: its received bytes and its last
    /// handshake.
    pub fn saw(
        &mut self,
        site: &SiteName,
        rx: u64,
        handshake: Option<SystemTime>,
        now: SystemTime,
    ) {
        self.0
            .entry(site.clone())
            .or_insert(Sign::first(rx))
            .saw(rx, handshake, now);
    }

    /// What the device shows of `site`'s peer while its endpoint is relayed: its received
    /// bytes become the new baseline and are no sign of the direct path, nor is its handshake
    /// (it went through the relay). A sign already seen is kept.
    pub fn relayed(&mut self, site: &SiteName, rx: u64) {
        self.0.entry(site.clone()).or_insert(Sign::first(rx)).rx = rx;
    }

    /// Forgets every site not in `keep` (no punch path any more).
    pub fn keep(&mut self, keep: &BTreeSet<&SiteName>) {
        self.0.retain(|s, _| keep.contains(s));
    }

    /// The sites whose punch peer showed a sign of life within `within` of `now`.
    pub fn alive(&self, now: SystemTime, within: Duration) -> BTreeSet<SiteName> {
        self.0
            .iter()
            .filter(|(_, l)| {
                l.at.is_some_and(|t| now.duration_since(t).map_or(true, |age| age <= within))
            })
            .map(|(s, _)| s.clone())
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys::PublicKey;
    use crate::model::tests::SITE_LABEL;
    use crate::model::tests::node;
    use crate::model::{Holders, SiteConfig, build};
    use crate::plan::{View, plan};
    use std::net::SocketAddr;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn backoff_with_a_fake_clock() {
        let mut p = Punch::new(t(0));
        p.step(t(29), false);
        assert_eq!(p.state, State::Trying { since: t(0) });
        assert!(p.has_peer());
        p.step(t(30), false);
        assert_eq!(p.state, State::Paused { until: t(90) });
        assert!(!p.has_peer());
        p.step(t(89), false);
        assert!(!p.has_peer());
        p.step(t(90), false);
        assert_eq!(p.state, State::Trying { since: t(90) });
        // Failed again: 2 min, then 4, 8, 16, 30, 30.
        let mut now = 90;
        let mut waits = Vec::new();
        for _ in 0..6 {
            now += 30;
            p.step(t(now), false);
            let State::Paused { until } = p.state else {
                panic!("{p:?}")
            };
            let w = until.duration_since(t(now)).unwrap().as_secs();
            waits.push(w / 60);
            now += w;
            p.step(t(now), false);
            assert!(matches!(p.state, State::Trying { .. }));
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30]);
        // Up; then stale: starts over with the first wait.
        p.step(t(now + 5), true);
        assert_eq!(p.state, State::Up);
        p.step(t(now + 500), true);
        assert_eq!(p.state, State::Up);
        p.step(t(now + 600), false);
        assert_eq!(
            p.state,
            State::Trying {
                since: t(now + 600)
            }
        );
        p.step(t(now + 630), false);
        assert_eq!(
            p.state,
            State::Paused {
                until: t(now + 690)
            }
        );
    }

    fn site(s: &str) -> SiteName {
        SiteName::parse(SITE_LABEL, s).unwrap()
    }

    pub(crate) fn a_gateway_plan() -> SitePlan {
        let nodes = vec![
            node(
                "c1",
                Some("cloud"),
                "10.0.0.0/24",
                Some((1, Some("198.51.100.1:51820"))),
            ),
            node("a1", Some("edge-a"), "10.1.0.0/24", Some((2, None))),
            node("b1", Some("edge-b"), "10.2.0.0/24", Some((3, None))),
        ];
        let mut view = View::default();
        for (g, ep) in [("a1", "203.0.113.10:51820"), ("b1", "203.0.113.20:51820")] {
            view.discovery
                .nat_mapped
                .insert(g.into(), ep.parse().unwrap());
        }
        let m = build(&nodes, &SiteConfig::default(), &Holders::default());
        plan(&m, "a1", &view, &crate::plan::tests::cloud_relays()).unwrap()
    }

    fn allowed(p: &SitePlan) -> Vec<(String, Vec<String>)> {
        p.gateway
            .as_ref()
            .unwrap()
            .peers
            .iter()
            .map(|p| {
                (
                    p.site.to_string(),
                    p.config
                        .allowed_ips
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                )
            })
            .collect()
    }

    /// Edge B's peer in `p`: its endpoint, keepalive and allowed IPs; `None` when it has none.
    fn b_peer(p: &SitePlan) -> Option<(Option<SocketAddr>, Option<u16>, Vec<String>)> {
        let peer = p
            .gateway
            .as_ref()
            .unwrap()
            .peers
            .iter()
            .find(|p| p.site.as_str() == "edge-b")?;
        Some((
            peer.config.endpoint,
            peer.config.keepalive_secs,
            peer.config
                .allowed_ips
                .iter()
                .map(ToString::to_string)
                .collect(),
        ))
    }

    /// B's relayed endpoint through the cloud gateway (c1's key 1, b1's key 3).
    fn through_cloud(punch: bool) -> SocketAddr {
        relay::endpoint(&PublicKey([1; 32]), &PublicKey([3; 32]), punch)
    }

    /// The cloud's peer carries its own subnet only, whatever the punch does: the relay
    /// forwards B's traffic, it never carries it.
    #[test]
    fn one_peer_moves_between_the_relay_and_the_direct_path_as_the_punch_goes() {
        let plan = a_gateway_plan();
        let mut punches = Punches::default();
        let none = BTreeSet::new();
        let b = || vec!["10.2.0.0/24".to_string()];
        punches.step(&plan, t(0), &none);
        let trying = punches.apply(&plan);
        assert_eq!(
            b_peer(&trying),
            Some((Some(through_cloud(true)), Some(PUNCH_KEEPALIVE_SECS), b()))
        );
        assert_eq!(
            allowed(&trying)[0],
            ("cloud".into(), vec!["10.0.0.0/24".into()])
        );
        assert_eq!(punches.describe(&site("edge-b"), t(0)).unwrap(), "punching");
        let fresh = BTreeSet::from([site("edge-b")]);
        punches.step(&plan, t(5), &fresh);
        let up = punches.apply(&plan);
        let direct: SocketAddr = "203.0.113.20:51820".parse().unwrap();
        assert_eq!(
            b_peer(&up),
            Some((None, Some(PUNCH_KEEPALIVE_SECS), b())),
            "up: left where it roamed"
        );
        assert_eq!(
            allowed(&up)[0],
            ("cloud".into(), vec!["10.0.0.0/24".into()])
        );
        assert!(up.remotes.iter().any(|r| r.path
            == Path::Punch {
                dial: direct,
                relay: Some(site("cloud")),
                up: true
            }));
        // Stale: back on the relay, trying again; not up within 30 s: paused, relayed only.
        punches.step(&plan, t(400), &none);
        assert_eq!(b_peer(&punches.apply(&plan)), b_peer(&trying));
        punches.step(&plan, t(430), &none);
        assert_eq!(
            b_peer(&punches.apply(&plan)),
            Some((Some(through_cloud(false)), None, b()))
        );
        assert_eq!(
            punches.describe(&site("edge-b"), t(430)).unwrap(),
            "punch paused: next try in 60 s"
        );
        // No punch path any more: forgotten.
        let mut relayed = plan.clone();
        relayed.remotes.retain(|r| r.site != site("edge-b"));
        punches.step(&relayed, t(431), &none);
        assert!(punches.0.is_empty());
    }

    /// Without a relay, a punch only handshakes at the mapped address until up, and a paused
    /// one has no peer.
    #[test]
    fn with_no_relay_a_punch_carries_nothing_until_up_and_pauses_with_no_peer() {
        let mut plan = a_gateway_plan();
        for r in &mut plan.remotes {
            if let Path::Punch { relay, .. } = &mut r.path {
                *relay = None;
            }
        }
        for p in &mut plan.gateway.as_mut().unwrap().peers {
            p.via = None;
        }
        let mut punches = Punches::default();
        punches.step(&plan, t(0), &BTreeSet::new());
        let direct: SocketAddr = "203.0.113.20:51820".parse().unwrap();
        assert_eq!(
            b_peer(&punches.apply(&plan)),
            Some((Some(direct), Some(PUNCH_KEEPALIVE_SECS), vec![]))
        );
        punches.step(&plan, t(30), &BTreeSet::new());
        assert_eq!(b_peer(&punches.apply(&plan)), None);
    }

    /// While the peer's endpoint is relayed, what it receives is no sign of the direct path.
    #[test]
    fn what_comes_through_the_relay_is_no_sign_of_the_direct_path() {
        let b = site("edge-b");
        let mut lives = Lives::default();
        lives.relayed(&b, 0);
        lives.relayed(&b, 5000);
        assert!(lives.alive(t(1), DEAD_AFTER).is_empty());
        // Roamed to a direct datagram: what arrives from then on is.
        lives.saw(&b, 5032, None, t(2));
        assert!(lives.alive(t(2), DEAD_AFTER).contains(&b));
    }

    /// Issue 36, a NAT router reboot or the remote site's gateway gone: a punched path kept
    /// alive every second, read every second, counts as alive through a lost keepalive (two or
    /// three rounds that show nothing new); silent for more than `DEAD_AFTER` (3 s), it is
    /// dead at the fourth round that shows nothing, and the next step puts the traffic back on
    /// the relay (the punch tries again). Before, a 10 s keepalive left it after 15 s and,
    /// earlier still, a direct handshake counted for 180 s.
    #[test]
    fn a_silent_direct_path_is_left_for_the_relay_at_the_fourth_silent_round() {
        let b = site("edge-b");
        let within = DEAD_AFTER;
        let mut lives = Lives::default();
        lives.saw(&b, 0, Some(t(0)), t(0));
        // Keepalives arrive about every second: alive throughout.
        for now in 1..=60 {
            lives.saw(&b, 32 * now, Some(t(0)), t(now));
            assert!(lives.alive(t(now), within).contains(&b), "at {now} s");
        }
        // A keepalive lost, the next one late: three rounds show nothing new, still alive.
        for now in 61..=63 {
            lives.saw(&b, 32 * 60, Some(t(0)), t(now));
            assert!(lives.alive(t(now), within).contains(&b), "at {now} s");
        }
        lives.saw(&b, 32 * 64, Some(t(0)), t(64));
        // The peer made anew (its subnets moved): counters and handshake forgotten, not its life.
        lives.saw(&b, 0, None, t(65));
        assert!(lives.alive(t(65), within).contains(&b));
        // The router rebooted after the keepalive read at 64 s: nothing arrives any more.
        for now in 66..=67 {
            lives.saw(&b, 0, None, t(now));
            assert!(lives.alive(t(now), within).contains(&b), "at {now} s");
        }
        assert!(!lives.alive(t(68), within).contains(&b));
        // The punch that was up puts the traffic back on the relay at the next round.
        let plan = a_gateway_plan();
        let mut punches = Punches::default();
        punches.step(&plan, t(0), &BTreeSet::from([b.clone()]));
        assert_eq!(punches.0[&b].state, State::Up);
        punches.step(&plan, t(68), &lives.alive(t(68), within));
        assert_eq!(
            b_peer(&punches.apply(&plan)).map(|p| p.0),
            Some(Some(through_cloud(true))),
            "site B is relayed again"
        );
        lives.keep(&BTreeSet::new());
        assert!(lives.alive(t(68), Duration::MAX).is_empty());
    }
}
