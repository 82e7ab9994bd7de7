//! The main loop's sites part: the [`Side`] on the host's kernel and `sticky-wg`'s socket, the
//! plan from the cache at start and from the keeper after, the cache kept, the rounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use sticky_overlay::config::{Config, Sites};
use sticky_sites::gateway::Seen;
use sticky_sites::heal::{self, Stance};
use sticky_sites::keys::{KeyDir, PublicKey};
use sticky_sites::model::{GATEWAY_LABEL, PUBLIC_KEY_ANNOTATION, SiteConfig, SiteName};
use sticky_sites::plan::Settings;
use sticky_sites::uapi::UapiTunnel;

use super::cache::{self, Cache};
use super::device::Kernel;
use super::probe::Probes;
use super::shape::{self, Observation, Shaped, Shaper};
use super::side::{ROUND, Side};
use crate::family::Family;
use crate::objects::Node;
use crate::state::Shared;

/// How long one exchange with sticky-wg's socket may take.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);

/// See the module doc.
pub struct SitesRun {
    side: Side<UapiTunnel<Kernel>, Kernel>,
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
    probe_port: u16,
}

/// How sites are read and the tunnel set, from the config.
pub fn shaper(
    me: &str,
    sites: &Sites,
    current: std::collections::BTreeMap<SiteName, String>,
) -> Shaper {
    Shaper {
        me: me.to_string(),
        config: SiteConfig {
            label_key: sites.site_label.clone(),
        },
        settings: Settings {
            listen_port: sites.listen_port,
            keepalive_secs: sites.keepalive_secs,
        },
        current,
        observation: Observation::default(),
    }
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
        let wg = match family {
            Family::V4 => sticky_sites::mtu::Family::V4,
            Family::V6 => sticky_sites::mtu::Family::V6,
        };
        let mtu = sites.wan_mtu.saturating_sub(wg.wireguard_overhead());
        let keys = KeyDir::new(key_dir, nix::unistd::geteuid().as_raw());
        let tunnel = UapiTunnel::new(socket_dir, Kernel, SOCKET_TIMEOUT);
        let mut run = SitesRun {
            side: Side::new(sites.interface.clone(), mtu, keys, tunnel, Kernel),
            cache_path: cache::path(cfg),
            cached: None,
            last_round: None,
            pending: false,
            forget_pending: true,
            probes: Probes::new(me, sites.probe_port),
            stance: sticky_sites::heal::Stance::Normal,
            observation: Observation::default(),
            shaper: shaper(me, sites, Default::default()),
            probe_port: sites.probe_port,
        };
        let mut lines = Vec::new();
        match cache::load(&run.cache_path) {
            Ok(None) => lines.push(format!(
                "sites: no cache at {} yet: the tunnel waits for the API",
                run.cache_path.display()
            )),
            Ok(Some(c)) => {
                let s = shaper(me, sites, c.current.clone());
                match shape::compute(c.inputs.clone(), me, &s.config, &s.settings, &s.current) {
                    Ok(shaped) => {
                        lines.push(format!(
                            "sites: plan from the cache {} ({} nodes) until the API answers",
                            run.cache_path.display(),
                            c.inputs.len()
                        ));
                        run.shaper.current = shaped.plan.actives.clone();
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

    /// The current active gateways of the cache (the keeper starts from them).
    pub fn cached_current(&self) -> std::collections::BTreeMap<SiteName, String> {
        self.cached
            .as_ref()
            .map(|c| c.current.clone())
            .unwrap_or_default()
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
        self.shaper.current = shaped.plan.actives.clone();
        lines.extend(self.side.adopt(shaped));
        lines.extend(self.aim_probes());
        self.pending = true;
        lines
    }

    /// The key this node publishes: its gateway key when its Node is labelled a gateway.
    pub fn public_key(&self, own: &Node) -> Option<Result<PublicKey, String>> {
        let gateway = own.metadata.labels.get(GATEWAY_LABEL).map(String::as_str) == Some("true");
        gateway.then(|| self.side.public_key())
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
        let s = &self.shaper;
        match shape::compute_seen(
            c.inputs.clone(),
            &s.me,
            &s.config,
            &s.settings,
            &s.current,
            seen,
        ) {
            Ok(shaped) => {
                self.shaper.current = shaped.plan.actives.clone();
                let mut lines = self.side.adopt(shaped);
                lines.extend(self.aim_probes());
                self.pending = true;
                lines
            }
            Err(e) => vec![format!("sites: the cache makes no plan: {e}")],
        }
    }
}
