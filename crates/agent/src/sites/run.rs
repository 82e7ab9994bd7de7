//! The main loop's sites part: the [`Side`] on the host's kernel and `sticky-wg`'s socket, the
//! plan from the cache at start and from the keeper after, the cache kept, the rounds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use sticky_overlay::config::Config;
use sticky_overlay::peers::Peer;
use sticky_overlay::sites::{RESTRICTED_PREFIX, Sites};
use sticky_sites::gateway::Seen;
use sticky_sites::heal::{self, Stance};
use sticky_sites::keys::{KeyDir, PublicKey};
use sticky_sites::model::PUBLIC_KEY_ANNOTATION;

use super::cache::{self, Cache};
use super::device::Live;
use super::probe::Probes;
use super::shape::{Observation, Shaped, Shaper};
use super::side::{ROUND, Side};
use crate::family::Family;
use crate::objects::Node;
use crate::state::Shared;

/// How long one exchange with sticky-wg's socket may take.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);

/// See the module doc.
pub struct SitesRun {
    side: Side<Live>,
    cache_path: PathBuf,
    /// What the cache file holds (as last read or written).
    cached: Option<Cache>,
    last_round: Option<Instant>,
    /// A new plan came since the last round.
    pending: bool,
    /// A rotated key's `.previous` may still be there: forgotten once the Node shows the new
    /// public key (so a second rotation is possible).
    forget_pending: bool,
    /// The probes inside the site, and what this node makes of them (issue 29).
    probes: Probes,
    stance: sticky_sites::heal::Stance,
    observation: Observation,
    /// How the plan is computed (the keeper's shaper is made from the same settings).
    shaper: Shaper,
    /// Members whose probe socket could not be made, as last logged.
    probes_failed: BTreeMap<String, String>,
    probe_port: u16,
}

/// One line at start for each setting that lets a node's own kubelet steer sites
/// (docs/sites.md, "Trust"), and for a config that names no relay.
fn trust_warnings(sites: &Sites) -> Vec<String> {
    let mut lines: Vec<String> = sites
        .kubelet_writable_labels()
        .into_iter()
        .map(|key| {
            format!(
                "sites: WARNING: label {key} is not under {RESTRICTED_PREFIX}: a node's own kubelet can set it on its Node, and so move the node to another site or make it a gateway candidate; use keys under {RESTRICTED_PREFIX} (docs/sites.md, \"Trust\")"
            )
        })
        .collect();
    if sites.relays.is_empty() {
        lines.push(
            "sites: no relay site is named (sites.relays): two sites behind NAT that cannot punch a direct tunnel cannot reach each other".into(),
        );
    }
    lines
}

impl SitesRun {
    /// The sites part of node `me` for network `cfg` (which has `sites`), with the plan from
    /// the cache when there is one; the log lines.
    pub fn start(
        cfg: &Config,
        sites: &Sites,
        me: &str,
        family: Family,
        key_dir: PathBuf,
        socket_dir: PathBuf,
    ) -> (SitesRun, Vec<String>) {
        let overhead = match family {
            Family::V4 => sticky_overlay::sites::WIREGUARD_OVERHEAD_V4,
            Family::V6 => sticky_overlay::sites::WIREGUARD_OVERHEAD_V6,
        };
        let mtu = sites.wan_mtu.saturating_sub(overhead);
        let keys = KeyDir::new(key_dir, nix::unistd::geteuid().as_raw());
        let device = Live::new(socket_dir, SOCKET_TIMEOUT);
        let mut run = SitesRun {
            side: Side::new(sites.interface.clone(), mtu, keys, device),
            cache_path: cache::path(cfg),
            cached: None,
            last_round: None,
            pending: false,
            forget_pending: true,
            probes: Probes::new(me, sites.probe_port),
            stance: sticky_sites::heal::Stance::Normal,
            observation: Observation::default(),
            shaper: Shaper::new(me, sites),
            probes_failed: BTreeMap::new(),
            probe_port: sites.probe_port,
        };
        let mut lines = trust_warnings(sites);
        match cache::load(&run.cache_path) {
            Ok(None) => lines.push(format!(
                "sites: no cache at {} yet: the tunnel waits for the API",
                run.cache_path.display()
            )),
            Ok(Some(c)) => {
                run.shaper.adopt(&c.inputs, &c.current);
                match run.shaper.compute(c.inputs.clone()) {
                    Ok(shaped) => {
                        lines.push(format!(
                            "sites: plan from the cache {} ({} nodes) until the API answers",
                            run.cache_path.display(),
                            c.inputs.len()
                        ));
                        run.shaper.adopt(&shaped.inputs, &shaped.plan.actives);
                        lines.extend(run.side.adopt(shaped));
                        lines.extend(run.aim_probes());
                        run.pending = true;
                    }
                    Err(e) => lines.push(format!(
                        "sites: the cache {} makes no plan: {e}; waiting for the API",
                        run.cache_path.display()
                    )),
                }
                run.cached = Some(c);
            }
            Err(e) => lines.push(format!("sites: {e}; waiting for the API")),
        }
        (run, lines)
    }

    /// How the plan is made, with the plan in force (from the cache at start): the keeper
    /// starts from it.
    pub fn shaper(&self) -> Shaper {
        self.shaper.clone()
    }

    /// Every Node of every site the cache holds, as the peer entry it was placed with: the
    /// keeper counts them as placed until its first write.
    pub fn cached_peers(&self) -> Vec<Peer> {
        let Some(c) = &self.cached else {
            return Vec::new();
        };
        c.inputs
            .iter()
            .filter_map(|n| {
                Some(Peer {
                    ip: n.underlay?,
                    subnets: n.pod_cidrs.clone(),
                    mac: None,
                    carries: Vec::new(),
                })
            })
            .collect()
    }

    /// Takes the keeper's new plan, and keeps it in the cache when what it was made from
    /// changed; the log lines.
    pub fn adopt(&mut self, shaped: Shaped) -> Vec<String> {
        let cache = Cache {
            inputs: shaped.inputs.clone(),
            current: shaped.plan.actives.clone(),
        };
        let mut lines = Vec::new();
        if self.cached.as_ref() != Some(&cache) {
            match cache::save(&self.cache_path, &cache) {
                Ok(()) => self.cached = Some(cache),
                Err(e) => lines.push(format!(
                    "sites: {e}; the tunnel works, but a restart without the API would use the older cache"
                )),
            }
        }
        self.shaper.adopt(&shaped.inputs, &shaped.plan.actives);
        lines.extend(self.side.adopt(shaped));
        lines.extend(self.aim_probes());
        self.pending = true;
        lines
    }

    /// The key this node publishes: its gateway key when its Node is labelled a gateway.
    pub fn public_key(&self, own: &Node) -> Option<Result<PublicKey, String>> {
        let label = &self.shaper.config.gateway_key;
        let gateway = own.metadata.labels.get(label).map(String::as_str) == Some("true");
        gateway.then(|| self.side.public_key().map_err(|e| e.to_string()))
    }

    /// The NAT discovery annotation this node publishes: the endpoints its dial-in peers come
    /// from, when it is an active gateway and has any.
    pub fn observed_endpoints(&self) -> Option<String> {
        self.side
            .observed_endpoints()
            .filter(|m| !m.is_empty())
            .map(sticky_sites::observed::format)
    }

    /// The own Node shows `key` as published: a rotated key's `.previous` is deleted then
    /// (once); the log line if that failed.
    pub fn confirm_published(&mut self, own: &Node, key: &PublicKey) -> Option<String> {
        if !self.forget_pending
            || own.metadata.annotations.get(PUBLIC_KEY_ANNOTATION) != Some(&key.to_base64())
        {
            return None;
        }
        self.forget_pending = false;
        self.side
            .keys
            .forget_previous(&super::side::key_name(&self.side.ifname))
            .err()
            .map(|e| format!("sites: removing the previous gateway key: {e}"))
    }

    /// The key changed (a rotation): its `.previous` is forgotten once the new one shows.
    pub fn key_changed(&mut self) {
        self.forget_pending = true;
    }

    /// Whether a round is due: every [`ROUND`], or a new plan came.
    pub fn round_due(&self) -> bool {
        self.pending || self.last_round.is_none_or(|t| t.elapsed() >= ROUND)
    }

    /// A round, when one is due (every [`ROUND`], or a new plan); the log lines.
    pub fn round_if_due(&mut self, shared: &Shared) -> Vec<String> {
        if !self.round_due() {
            return Vec::new();
        }
        self.pending = false;
        self.last_round = Some(Instant::now());
        let (lines, status) = self.side.round(SystemTime::now());
        shared.lock().status.sites = status;
        lines
    }
}

impl SitesRun {
    /// Points the probes at this node's targets in the current plan: its site's gateway
    /// candidates, and every other member when it is a candidate itself (for step-down).
    fn aim_probes(&mut self) -> Option<String> {
        let shaped = self.side.shaped()?;
        let me = self.shaper.me.as_str();
        let site = shaped.model.sites.get(&shaped.plan.site)?;
        let candidate = site.candidate(me).is_some();
        let port = self.probe_port;
        let targets = site
            .members
            .iter()
            .filter(|(n, _)| *n != me && (candidate || site.candidate(n).is_some()))
            .filter_map(|(n, m)| m.underlay.map(|ip| (n.clone(), SocketAddr::new(ip, port))))
            .collect();
        let underlay = site.members.get(me).and_then(|m| m.underlay);
        let active = match self.stance {
            Stance::Normal => shaped.plan.actives.get(&shaped.plan.site).cloned(),
            Stance::SteppedDown => None,
        };
        self.probes.set(underlay, targets, active)
    }

    /// Reads the probes and takes one healing step; the new observation when it changed (the
    /// caller recomputes the plan with it: [`SitesRun::recompute`] or the keeper), and the log
    /// lines.
    pub fn observe(&mut self) -> (Option<Observation>, Vec<String>) {
        let mut lines = Vec::new();
        let failed = self.probes.failed();
        if failed != self.probes_failed {
            lines.extend(
                failed
                    .values()
                    .map(|why| format!("sites: {why}; retried every round")),
            );
            self.probes_failed = failed;
        }
        let (liveness, choices) = self.probes.view();
        let me = self.shaper.me.clone();
        let mut next = Observation {
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
            let step = heal::step(&self.stance, &me, &others, &next.liveness, &choices);
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
        for (name, seen) in &next.liveness {
            if self.observation.liveness.get(name) != Some(seen) && *seen != Seen::Unknown {
                lines.push(format!("sites: probes: {name} is {seen:?}"));
            }
        }
        if next == self.observation {
            return (None, lines);
        }
        self.observation = next.clone();
        (Some(next), lines)
    }

    /// The plan again from the cache with `seen` (when the keeper has no Nodes to make it
    /// from: the agent started with the API away); the log lines.
    pub fn recompute(&mut self, seen: &Observation) -> Vec<String> {
        let Some(c) = &self.cached else {
            return Vec::new();
        };
        self.shaper.observation = seen.clone();
        match self.shaper.compute(c.inputs.clone()) {
            Ok(shaped) => {
                self.shaper.adopt(&shaped.inputs, &shaped.plan.actives);
                let mut lines = self.side.adopt(shaped);
                lines.extend(self.aim_probes());
                self.pending = true;
                lines
            }
            Err(e) => vec![format!("sites: the cache makes no plan: {e}")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sites(v: serde_json::Value) -> Sites {
        let mut obj = serde_json::Map::new();
        obj.insert("sites".into(), v);
        sticky_overlay::sites::parse(&obj).unwrap().unwrap()
    }

    #[test]
    fn kubelet_writable_labels_and_no_relay_are_said_at_start() {
        assert!(trust_warnings(&sites(serde_json::json!({"relays": ["cloud"]}))).is_empty());
        let lines = trust_warnings(&sites(serde_json::json!({
            "siteLabel": "sticky-cni.io/site", "gatewayLabel": "sticky-cni.io/gateway"
        })));
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("label sticky-cni.io/site is not under"));
        assert!(lines[1].contains("label sticky-cni.io/gateway is not under"));
        assert!(lines[2].contains("no relay site is named"));
    }
}
