//! One round of the active gateway's tunnel, decided (issue 33, "decide, then act"): from the
//! plan, what the device showed at the start of the round and the time, the [`Action`]s that
//! bring the device to the plan, the lines to log and what each tunnel shows. No I/O: the agent
//! reads the device, calls [`Memory::decide`], and carries the actions out through its one
//! device seam. Every rule that learns from the tunnel across rounds lives here, in [`Memory`]:
//!
//! - the punches ([`crate::punch`]), stepped with what this round's device shows;
//! - each peer's last sign of life (its newest handshake, or the round its received bytes
//!   grew: the data path makes a peer anew, with no handshake and no bytes, when its allowed
//!   IPs change, and that must not read as silence);
//! - the candidate taken as each remote site's active one ([`crate::remote`]): when it moves, a
//!   datagram through the tunnel to the new one makes this side handshake at once, as does a
//!   dial-in peer given back where it was last seen (a device made anew);
//! - the tunnels seen up, for one log line when one comes up or goes down;
//! - whether this node configured the tunnel (a node that stops being the active gateway
//!   removes its peers and routes; a restarted agent does not know, so it clears once).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use crate::keys::PublicKey;
use crate::model::{Model, SiteName};
use crate::paths::Path;
use crate::plan::{GatewayPlan, SitePlan};
use crate::punch::{self, Lives, Punches, Sign};
use crate::relay;
use crate::remote;
use crate::tunnel::{DeviceState, PeerChange, PeerState, diff, diff_keyed};

/// A tunnel whose latest handshake is older than this is down (WireGuard's reject-after time:
/// sessions rekey every 120 s while traffic flows).
pub const UP_WITHIN: Duration = Duration::from_secs(180);

/// The port a handshake-starting datagram goes to: discard.
const NUDGE_PORT: u16 = 9;

/// What the gateway's device is to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Key (the gateway's, when `with_key`), listen port and peer changes, in one transaction.
    Set {
        with_key: bool,
        port: Option<u16>,
        changes: Vec<PeerChange>,
    },
    /// The device's routes of ours become exactly these (none: a device that is not there has
    /// none, which is no error).
    Routes(Vec<IpNet>),
    /// One datagram to this address through the tunnel: it makes this side handshake at once.
    Nudge(SocketAddr),
}

/// What the tunnel that carries one remote site's traffic shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carrier {
    /// The carrier's gateway (the peer).
    pub peer: String,
    pub last_handshake: Option<SystemTime>,
    pub up: bool,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A round's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<'a> {
    /// The plan as the punches made it (the paths the status shows): the plan itself when no
    /// punch changes it.
    pub applied: Cow<'a, SitePlan>,
    pub actions: Vec<Action>,
    /// Tunnels moved, up or down, as log lines.
    pub lines: Vec<String>,
    /// The tunnel carrying each remote site's traffic, by the site of its peer (on the active
    /// gateway only).
    pub carriers: HashMap<SiteName, Carrier>,
}

/// What a round remembers for the next (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    punches: Punches,
    lives: Lives,
    signs: HashMap<PublicKey, Sign>,
    /// The candidate taken as active, of each remote site with a standby.
    taken: HashMap<SiteName, String>,
    up: HashMap<SiteName, bool>,
    configured: bool,
    /// The current endpoints of the peers that dial in (gateways behind NAT), by gateway name:
    /// what a reachable gateway publishes. None when this node is not the active gateway.
    observed: Option<BTreeMap<String, SocketAddr>>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            punches: Punches::default(),
            lives: Lives::default(),
            signs: HashMap::new(),
            taken: HashMap::new(),
            up: HashMap::new(),
            // A restarted agent does not know whether it configured the device before.
            configured: true,
            observed: None,
        }
    }
}

impl Memory {
    /// Whether the round needs the device read: on the active gateway, and on a node that
    /// may still hold peers and routes to clear.
    pub fn wants_device(&self, plan: &SitePlan) -> bool {
        plan.gateway.is_some() || self.configured
    }

    /// Clearing the device failed: it is tried again next round.
    pub fn clear_failed(&mut self) {
        self.configured = true;
    }

    /// The current endpoints of the gateways behind NAT that dial in, when this node is an
    /// active gateway.
    pub fn observed_endpoints(&self) -> Option<&BTreeMap<String, SocketAddr>> {
        self.observed.as_ref()
    }

    /// How a punch path reads in the status: `None` for a site with no punch.
    pub fn describe_punch(&self, site: &SiteName, now: SystemTime) -> Option<String> {
        self.punches.describe(site, now)
    }

    /// The round at `now` for `plan` over `model`: `device` is what the device showed at the
    /// start of the round (None: not read, or it could not be, which the caller reports),
    /// `key` the gateway's public key.
    pub fn decide<'a>(
        &mut self,
        plan: &'a SitePlan,
        model: &Model,
        device: Option<&DeviceState>,
        key: Option<PublicKey>,
        now: SystemTime,
    ) -> Decision<'a> {
        let peers = device.map(DeviceState::by_key).unwrap_or_default();
        // Only the active gateway punches: a plain node keeps no punch of its own (it would
        // say a punch is paused that is not its to know). The punches step on this round's
        // reading: a dead direct path is left in the round that sees it dead.
        let alive = self.heard(plan, device.map(|_| &peers), now);
        match plan.gateway {
            Some(_) => self.punches.step(plan, now, &alive),
            None => self.punches = Punches::default(),
        }
        let applied = self.punches.apply(plan);
        let mut actions = Vec::new();
        let mut lines = Vec::new();
        let mut carriers = HashMap::new();
        match (&applied.gateway, device) {
            (Some(gw), Some(dev)) => {
                self.configured = true;
                (actions, lines) = self.configure(gw, model, dev, &peers, key, now);
                carriers = self.carriers(gw, model, &peers, now, &mut lines);
            }
            (Some(_), None) => self.configured = true,
            (None, Some(dev)) if self.configured => {
                self.configured = false;
                actions.push(Action::Set {
                    with_key: false,
                    port: None,
                    changes: diff(&[], dev),
                });
                actions.push(Action::Routes(Vec::new()));
            }
            (None, _) => self.configured = false,
        }
        if applied.gateway.is_none() {
            self.up.clear();
            self.taken.clear();
            self.signs.clear();
        }
        self.read(&applied, device.map(|_| &peers));
        Decision {
            applied,
            actions,
            lines,
            carriers,
        }
    }

    /// The actions that bring the device to `gw`: a peer for every candidate of each remote
    /// site (`remote::expand`), the site's subnets on the candidate taken as its active one.
    /// `peers` are the device's by key; the log lines come with the actions.
    fn configure(
        &mut self,
        gw: &GatewayPlan,
        model: &Model,
        dev: &DeviceState,
        peers: &HashMap<PublicKey, &PeerState>,
        key: Option<PublicKey>,
        now: SystemTime,
    ) -> (Vec<Action>, Vec<String>) {
        self.saw_signs(&dev.peers, now);
        let mut lines = Vec::new();
        let mut nudges = Vec::new();
        for (site, g) in self.take_remote_actives(gw, model, now) {
            nudges.extend(nudge_address(model, site, g));
            lines.push(format!(
                "sites: site {site}'s traffic goes to its gateway {g} now (its newest handshake)"
            ));
        }
        let expanded = remote::expand(&gw.peers, model, &self.taken);
        let changes = diff_keyed(expanded.iter().map(|p| p.config.as_ref()), peers);
        // A dial-in peer given where it was last seen (the device was made anew) is dialed at
        // once, through the mapping its keepalives hold open.
        let given: BTreeSet<PublicKey> = changes
            .iter()
            .filter_map(|c| match c {
                PeerChange::Upsert { peer, .. } if peer.endpoint.is_some() => Some(peer.public_key),
                _ => None,
            })
            .collect();
        if !given.is_empty() {
            for p in expanded
                .iter()
                .filter(|p| p.config.endpoint.is_none() && given.contains(&p.config.public_key))
            {
                nudges.extend(nudge_address(model, p.site, p.gateway));
            }
        }
        let mut actions = Vec::new();
        // Key and port go with every change (one transaction).
        if dev.public_key != key || dev.listen_port != gw.listen_port || !changes.is_empty() {
            actions.push(Action::Set {
                with_key: true,
                port: Some(gw.listen_port),
                changes,
            });
        }
        let routes = expanded
            .iter()
            .flat_map(|p| p.config.allowed_ips.iter().copied())
            .collect();
        actions.push(Action::Routes(routes));
        actions.extend(nudges.into_iter().map(Action::Nudge));
        (actions, lines)
    }

    /// Keeps each peer's last sign of life from what the device shows.
    fn saw_signs(&mut self, peers: &[PeerState], now: SystemTime) {
        for p in peers {
            let sign = self.signs.entry(p.public_key).or_default();
            sign.saw(p.rx_bytes, p.last_handshake, now);
        }
    }

    /// Takes each remote site's candidate as active, from the last signs of life; the sites
    /// whose taken candidate moved, with the one taken now, in the plan's order. Only sites
    /// with a standby are kept: a site of one candidate (most of a hub's) has no choice to
    /// remember, and its lookups stay off the round's path.
    fn take_remote_actives<'p>(
        &mut self,
        gw: &'p GatewayPlan,
        model: &'p Model,
        now: SystemTime,
    ) -> Vec<(&'p SiteName, &'p str)> {
        let mut was = std::mem::take(&mut self.taken);
        let mut moved = Vec::new();
        for p in &gw.peers {
            let Some(site) = model.sites.get(&p.site) else {
                continue;
            };
            if site.candidates.iter().all(|c| c.name == p.gateway) {
                continue;
            }
            let current = was.remove_entry(&p.site);
            let signs: BTreeMap<String, SystemTime> = site
                .candidates
                .iter()
                .filter_map(|c| Some((c.name.clone(), self.signs.get(&c.public_key)?.at?)))
                .collect();
            let taken = current.as_ref().map(|(_, g)| g.as_str());
            let chosen = remote::remote_active(&signs, taken, &p.gateway, now, UP_WITHIN);
            // The name as the model has it, not the local map's.
            let chosen: &'p str = site.candidate(chosen).map_or(&p.gateway, |c| &c.name);
            match current {
                Some((name, g)) if g == chosen => {
                    self.taken.insert(name, g);
                }
                current => {
                    if current.is_some() {
                        moved.push((&p.site, chosen));
                    }
                    self.taken.insert(p.site.clone(), chosen.to_string());
                }
            }
        }
        moved
    }

    /// The tunnel of each peer of `gw`, by the site of its peer; a line when one comes up or
    /// goes down.
    fn carriers(
        &mut self,
        gw: &GatewayPlan,
        model: &Model,
        peers: &HashMap<PublicKey, &PeerState>,
        now: SystemTime,
        lines: &mut Vec<String>,
    ) -> HashMap<SiteName, Carrier> {
        let mut out = HashMap::with_capacity(gw.peers.len());
        for p in &gw.peers {
            // The candidate taken as that site's active one carries its traffic.
            let key = match self.taken.get(&p.site) {
                Some(t) if *t != p.gateway => model
                    .sites
                    .get(&p.site)
                    .and_then(|s| s.candidate(t))
                    .map_or(p.config.public_key, |c| c.public_key),
                _ => p.config.public_key,
            };
            let state = peers.get(&key);
            let handshake = state.and_then(|s| s.last_handshake);
            // Up by the last sign of life kept across rounds: a peer the data path made anew
            // (its allowed IPs moved) shows no handshake for a moment, and is not down.
            let life = self.signs.get(&key).and_then(|s| s.at).max(handshake);
            let up = life.is_some_and(|t| age(now, t) <= UP_WITHIN);
            let was = match self.up.get_mut(&p.site) {
                Some(was) => std::mem::replace(was, up),
                None => {
                    self.up.insert(p.site.clone(), up);
                    false
                }
            };
            if up != was {
                lines.push(up_or_down(&p.site, &p.gateway, up, life, now));
            }
            let carrier = Carrier {
                peer: p.gateway.clone(),
                last_handshake: handshake,
                up,
                rx_bytes: state.map_or(0, |s| s.rx_bytes),
                tx_bytes: state.map_or(0, |s| s.tx_bytes),
            };
            out.insert(p.site.clone(), carrier);
        }
        out
    }

    /// The punch peers of `plan` that showed a sign of life within [`punch::DEAD_AFTER`] of
    /// `now`, from what the device shows (its peers by key) at the start of the round.
    fn heard(
        &mut self,
        plan: &SitePlan,
        dev: Option<&HashMap<PublicKey, &PeerState>>,
        now: SystemTime,
    ) -> BTreeSet<SiteName> {
        let (Some(gw), Some(dev)) = (&plan.gateway, dev) else {
            self.lives = Lives::default();
            return BTreeSet::new();
        };
        let punching = punch::punching(plan);
        self.lives.keep(&punching);
        for p in gw.peers.iter().filter(|p| punching.contains(&p.site)) {
            let Some(st) = dev.get(&p.config.public_key) else {
                continue;
            };
            // The same peer carries through the relay while punching: only what comes while
            // its endpoint is a real one (WireGuard roamed it to a direct datagram) is a sign
            // of the direct path.
            if st.endpoint.is_some_and(|e| relay::is_relayed(&e)) {
                self.lives.relayed(&p.site, st.rx_bytes);
            } else {
                self.lives.saw(&p.site, st.rx_bytes, st.last_handshake, now);
            }
        }
        self.lives.alive(now, punch::DEAD_AFTER)
    }

    /// The current endpoints of the dial-in peers of `applied` (the plan as the punches made
    /// it), from what the device shows.
    fn read(&mut self, applied: &SitePlan, dev: Option<&HashMap<PublicKey, &PeerState>>) {
        let (Some(gw), Some(dev)) = (&applied.gateway, dev) else {
            self.observed = None;
            return;
        };
        let now = gw
            .peers
            .iter()
            .filter(|p| p.config.endpoint.is_none())
            .filter_map(|p| Some((&p.gateway, dev.get(&p.config.public_key)?.endpoint?)));
        // Made anew only when an endpoint moved (a hub's dial-in peers are thousands).
        let same = self.observed.as_ref().is_some_and(|was| {
            let mut seen = 0;
            now.clone().all(|(g, ep)| {
                seen += 1;
                was.get(g) == Some(&ep)
            }) && seen == was.len()
        });
        if !same {
            self.observed = Some(now.map(|(g, ep)| (g.clone(), ep)).collect());
        }
    }
}

/// How old `t` is at `now` (a time in the future is no age).
fn age(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or_default()
}

/// The line for a tunnel that came up or went down.
fn up_or_down(
    site: &SiteName,
    gateway: &str,
    up: bool,
    life: Option<SystemTime>,
    now: SystemTime,
) -> String {
    if up {
        return format!("sites: tunnel to site {site} (gateway {gateway}) is up");
    }
    let why = match life {
        None => "no handshake yet".to_string(),
        Some(t) => format!("nothing heard for {} s", age(now, t).as_secs()),
    };
    format!("sites: tunnel to site {site} (gateway {gateway}) is DOWN: {why}")
}

/// Where to send a datagram through the tunnel to candidate `g` of `site`: the first address
/// of its first IPv4 pod subnet (its bridge), the discard port.
fn nudge_address(model: &Model, site: &SiteName, g: &str) -> Option<SocketAddr> {
    let member = model.sites.get(site)?.members.get(g)?;
    member.pod_cidrs.iter().find_map(|n| match n {
        IpNet::V4(v4) => Some(SocketAddr::from((
            Ipv4Addr::from(u32::from(v4.network()).saturating_add(1)),
            NUDGE_PORT,
        ))),
        IpNet::V6(_) => None,
    })
}

/// What a path says in the status.
pub fn path_text(p: &Path) -> String {
    match p {
        Path::Direct { .. } => "direct".into(),
        Path::Punch { up: true, .. } => "direct (punched)".into(),
        Path::Punch { relay, .. } => match relay {
            Some(r) => format!("relayed via {r} (punching)"),
            None => "punching".into(),
        },
        Path::Relayed { via } => format!("relayed via {via}"),
        Path::Unreachable { why } => format!("unreachable: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Holders, SiteConfig, build};
    use crate::punch::tests::a_gateway_plan;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    /// A plain node of a site that punches does not punch itself: it never says a punch is
    /// paused (it cannot know the gateway's), only that the relay carries while the gateway
    /// punches (docs/sites.md, "Observing").
    #[test]
    fn a_plain_node_keeps_no_punch_of_its_own() {
        let mut plan = a_gateway_plan();
        plan.gateway = None;
        let model = build(&[], &SiteConfig::default(), &Holders::default());
        let mut m = Memory::default();
        for s in [0, 2, 40, 100] {
            m.decide(&plan, &model, None, None, t(s));
        }
        let b = SiteName::parse("site", "edge-b").unwrap();
        assert_eq!(m.describe_punch(&b, t(100)), None);
    }

    /// The active gateway of the same plan punches, and after 30 s without a handshake the
    /// punch pauses.
    #[test]
    fn the_gateway_punches_and_pauses() {
        let plan = a_gateway_plan();
        let model = build(&[], &SiteConfig::default(), &Holders::default());
        let mut m = Memory::default();
        let dev = DeviceState::default();
        for s in [0, 2, 40] {
            m.decide(&plan, &model, Some(&dev), None, t(s));
        }
        let b = SiteName::parse("site", "edge-b").unwrap();
        let said = m.describe_punch(&b, t(40)).unwrap_or_default();
        assert!(said.starts_with("punch paused"), "{said}");
    }
}
