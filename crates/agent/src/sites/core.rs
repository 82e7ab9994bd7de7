//! Everything sites keeps on this node, in one place, and how it moves (issue 33, "one owner,
//! one clock"): the plan in force and what it was made from, how plans are made (the current
//! active gateways, the key and endpoint holders: [`Shaper`]), the step-down stance and what
//! the probes saw ([`SiteView`]), and the gateway's round ([`Side`]: the punches, the signs
//! of life, the remote choices). Nothing here reads a file, a socket or the clock: the caller
//! passes the time ([`Now`]), what the probes saw, and the device through its seam. The agent
//! wraps it with its files and threads ([`super::run::SitesRun`]); the simulation
//! (`super::simulation`) runs one for every node of a cluster on a simulated clock and network.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use sticky_sites::gateway::{Liveness, Seen};
use sticky_sites::heal::{self, Stance};
use sticky_sites::model::{NodeInput, SiteName};
use sticky_vxlan::status::SitesStatus;

use super::device::Device;
use super::shape::{Shaped, Shaper, SiteView};
use super::side::{self, Side};

/// The agent's clock, read once by the caller and passed to everything that waits or times
/// out: monotonic for rounds and probes, the wall clock for handshakes (the tunnel reports
/// them in Unix time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

impl Now {
    /// The host's clock, now.
    pub fn system() -> Now {
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// Whom the probes target and what they say (see [`Core::aim`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aim {
    /// This node's underlay address: the probes are answered there.
    pub underlay: Option<IpAddr>,
    /// By member name.
    pub targets: BTreeMap<String, SocketAddr>,
    /// This node's active gateway for its site, said in replies (none while stepped down).
    pub active: Option<String>,
}

/// See the module doc.
pub struct Core<D> {
    pub shaper: Shaper,
    pub side: Side<D>,
    /// What the plan in force was made from (the Nodes' site inputs).
    inputs: Option<Vec<NodeInput>>,
    stance: Stance,
    observation: SiteView,
    probe_port: u16,
    last_round: Option<Instant>,
    /// How long after the last round the next is due ([`side::period`] of its cost).
    period: Duration,
    /// A new plan came since the last round.
    pending: bool,
}

impl<D: Device> Core<D> {
    pub fn new(shaper: Shaper, side: Side<D>, probe_port: u16) -> Self {
        Core {
            shaper,
            side,
            inputs: None,
            stance: Stance::Normal,
            observation: SiteView::default(),
            probe_port,
            last_round: None,
            period: side::ROUND,
            pending: false,
        }
    }

    /// What the plan in force was made from, and its active gateways: what the cache keeps.
    pub fn kept(&self) -> Option<(&[NodeInput], &BTreeMap<SiteName, String>)> {
        let inputs = self.inputs.as_deref()?;
        Some((inputs, &self.side.shaped()?.plan.actives))
    }

    /// Starts from what the cache kept (`inputs`, made with `current` as the active
    /// gateways); the log lines, or why no plan comes of it.
    pub fn start_from(
        &mut self,
        inputs: &[NodeInput],
        current: &BTreeMap<SiteName, String>,
    ) -> Result<Vec<String>, sticky_sites::plan::Error> {
        self.shaper.adopt(inputs, current);
        let shaped = self.shaper.compute(inputs.to_vec())?;
        Ok(self.adopt(shaped))
    }

    /// Takes `shaped` as the plan in force (from the keeper, or made here); the log lines. A
    /// round is due at once only when the plan is new: the same plan again (a Node's heartbeat,
    /// which changes nothing the sites read) waits for the next round.
    pub fn adopt(&mut self, shaped: Shaped) -> Vec<String> {
        self.shaper.adopt(&shaped.inputs, &shaped.plan.actives);
        self.inputs = Some(shaped.inputs.clone());
        self.pending |= self.side.shaped() != Some(&shaped);
        self.side.adopt(shaped)
    }

    /// The plan again from `inputs` (the Nodes as the API has them now, or as kept), with
    /// what this node observes; the log lines.
    pub fn recompute(&mut self, inputs: Vec<NodeInput>) -> Vec<String> {
        match self.shaper.compute(inputs) {
            Ok(shaped) => self.adopt(shaped),
            Err(e) => vec![format!("sites: no plan: {e}")],
        }
    }

    /// The plan again from what the plan in force was made from (the API is away, or has said
    /// nothing new); the log lines.
    pub fn recompute_kept(&mut self) -> Vec<String> {
        match self.inputs.clone() {
            Some(inputs) => self.recompute(inputs),
            None => Vec::new(),
        }
    }

    /// Whom this node probes in the plan in force: its site's gateway candidates, and every
    /// other member when it is a candidate itself (for step-down).
    pub fn aim(&self) -> Aim {
        let Some(shaped) = self.side.shaped() else {
            return Aim::default();
        };
        let me = self.shaper.me.as_str();
        let Some(site) = shaped.model.sites.get(&shaped.plan.site) else {
            return Aim::default();
        };
        let candidate = site.candidate(me).is_some();
        let targets = site
            .members
            .iter()
            .filter(|(n, _)| *n != me && (candidate || site.candidate(n).is_some()))
            .filter_map(|(n, m)| {
                let ip = m.underlay?;
                Some((n.clone(), SocketAddr::new(ip, self.probe_port)))
            })
            .collect();
        let active = match self.stance {
            Stance::Normal => shaped.plan.actives.get(&shaped.plan.site).cloned(),
            Stance::SteppedDown => None,
        };
        Aim {
            underlay: site.members.get(me).and_then(|m| m.underlay),
            targets,
            active,
        }
    }

    /// Takes what the probes saw (`liveness` of the targets, the active gateway each one seen
    /// alive named) and one healing step ([`heal::step`]); the new observation when it
    /// changed (the caller makes the plan again with it: [`Core::recompute`], or the keeper),
    /// and the log lines.
    pub fn observe(
        &mut self,
        liveness: Liveness,
        choices: &BTreeMap<String, String>,
    ) -> (Option<SiteView>, Vec<String>) {
        let mut lines = Vec::new();
        let me = self.shaper.me.clone();
        let mut next = SiteView {
            liveness,
            stepped_down: false,
            adopt: None,
        };
        if let Some(shaped) = self.side.shaped()
            && let Some(site) = shaped.model.sites.get(&shaped.plan.site)
            && site.candidate(&me).is_some()
        {
            let others: Vec<&str> = site
                .members
                .keys()
                .map(String::as_str)
                .filter(|n| *n != me)
                .collect();
            let step = heal::step(&self.stance, &me, &others, &next.liveness, choices);
            if step.stance != self.stance {
                lines.push(match &step.stance {
                    Stance::SteppedDown => "sites: no other member of this site answers probes: this node steps down (tunnel peers and routes removed) until it hears from its site".to_string(),
                    Stance::Normal => format!(
                        "sites: this site answers again; taking its choice, {}, as the active gateway",
                        step.adopt.as_deref().unwrap_or("(none)")
                    ),
                });
            }
            self.stance = step.stance;
            next.stepped_down = self.stance == Stance::SteppedDown;
            next.adopt = step.adopt;
        }
        if self.stance == Stance::Normal && next.adopt.is_none() {
            let current = self
                .side
                .shaped()
                .and_then(|s| s.plan.actives.get(&s.plan.site));
            next.adopt = heal::follow(&me, current.map(String::as_str), &next.liveness, choices);
            if let Some(c) = &next.adopt {
                lines.push(format!(
                    "sites: this site's members name {c} as the active gateway: following them"
                ));
            }
        }
        for (name, seen) in &next.liveness {
            if self.observation.liveness.get(name) != Some(seen) && *seen != Seen::Unknown {
                lines.push(format!("sites: probes: {name} is {seen:?}"));
            }
        }
        if next == self.observation {
            return (None, lines);
        }
        self.observation = next.clone();
        self.shaper.observation = next.clone();
        (Some(next), lines)
    }

    /// Whether a round is due at `now`: a period ([`side::period`]) after the last, or a new
    /// plan came.
    pub fn round_due(&self, now: Now) -> bool {
        self.until_round(now).is_zero()
    }

    /// How long after `now` the next round is due (zero: it is).
    pub fn until_round(&self, now: Now) -> Duration {
        match self.last_round {
            Some(t) if !self.pending => {
                let since = now.mono.saturating_duration_since(t);
                self.period.saturating_sub(since)
            }
            _ => Duration::ZERO,
        }
    }

    /// A round when one is due: the log lines and the status.
    pub fn round_if_due(&mut self, now: Now) -> Option<(Vec<String>, Option<SitesStatus>)> {
        if !self.round_due(now) {
            return None;
        }
        self.pending = false;
        self.last_round = Some(now.mono);
        // What the round costs the machine (its reads wait on sticky-wg): the real clock, also
        // under a simulated one.
        let started = Instant::now();
        let round = self.side.round(now.wall);
        self.period = side::period(started.elapsed());
        Some(round)
    }
}
