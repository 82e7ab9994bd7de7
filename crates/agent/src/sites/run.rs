//! The main loop's sites part: the [`Side`] on the host's kernel and `sticky-wg`'s socket, the
//! plan from the cache at start and from the keeper after, the cache kept, the rounds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sticky_overlay::config::Config;
use sticky_overlay::peers::Peer;
use sticky_overlay::sites::{RESTRICTED_PREFIX, Sites};
use sticky_sites::keys::PublicKey;
use sticky_sites::model::PUBLIC_KEY_ANNOTATION;

use super::cache::{self, Cache};
use super::core::{Core, Now};
use super::device::Live;
use super::keys::KeyDir;
use super::probe::Probes;
use super::shape::{Shaped, Shaper, SiteView};
use super::side::Side;
use crate::family::Family;
use crate::objects::Node;
use crate::state::Shared;

/// How long one exchange with sticky-wg's socket may take.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);

/// See the module doc.
pub struct SitesRun {
    core: Core<Live>,
    cache_path: PathBuf,
    /// What the cache file holds (as last read or written).
    cached: Option<Cache>,
    /// A rotated key's `.previous` may still be there: forgotten once the Node shows the new
    /// public key (so a second rotation is possible).
    forget_pending: bool,
    /// The probes inside the site, and what this node makes of them (issue 29).
    probes: Probes,
    /// Members whose probe socket could not be made, as last logged.
    probes_failed: BTreeMap<String, String>,
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
        let overhead = sticky_overlay::sites::tunnel_overhead(match family {
            Family::V4 => std::net::Ipv4Addr::UNSPECIFIED.into(),
            Family::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
        });
        let mtu = sticky_overlay::sites::tunnel_mtu(sites.wan_mtu, overhead);
        let keys = KeyDir::new(key_dir, nix::unistd::geteuid().as_raw());
        let device = Live::new(socket_dir, SOCKET_TIMEOUT);
        let side = Side::new(sites.interface.clone(), mtu, keys, device);
        let mut run = SitesRun {
            core: Core::new(Shaper::new(me, sites), side, sites.probe_port),
            cache_path: cache::path(cfg),
            cached: None,
            forget_pending: true,
            probes: Probes::new(me, sites.probe_port),
            probes_failed: BTreeMap::new(),
        };
        let mut lines = trust_warnings(sites);
        lines.extend(run.start_from_cache());
        (run, lines)
    }

    /// The plan from the cache, when there is one; the log lines.
    fn start_from_cache(&mut self) -> Vec<String> {
        let path = self.cache_path.display();
        let c = match cache::load(&self.cache_path) {
            Ok(Some(c)) => c,
            Ok(None) => {
                return vec![format!(
                    "sites: no cache at {path} yet: the tunnel waits for the API"
                )];
            }
            Err(e) => return vec![format!("sites: {e}; waiting for the API")],
        };
        let mut lines = match self.core.start_from(&c.inputs, &c.current) {
            Ok(mut lines) => {
                lines.insert(
                    0,
                    format!(
                        "sites: plan from the cache {path} ({} nodes) until the API answers",
                        c.inputs.len()
                    ),
                );
                lines
            }
            Err(e) => vec![format!(
                "sites: the cache {path} makes no plan: {e}; waiting for the API"
            )],
        };
        self.cached = Some(c);
        lines.extend(self.aim_probes());
        lines
    }

    /// How the plan is made, with the plan in force and what this node observes: the keeper
    /// makes the plan with it (the one owner of both is [`Core`]).
    pub fn shaper(&self) -> &Shaper {
        &self.core.shaper
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
        let mut lines = self.core.adopt(shaped);
        lines.extend(self.save_cache());
        lines.extend(self.aim_probes());
        lines
    }

    /// Keeps what the plan in force was made from in the cache, when it changed; the log line
    /// when that failed.
    fn save_cache(&mut self) -> Option<String> {
        let (inputs, current) = self.core.kept()?;
        let cache = Cache {
            inputs: inputs.to_vec(),
            current: current.clone(),
        };
        if self.cached.as_ref() == Some(&cache) {
            return None;
        }
        match cache::save(&self.cache_path, &cache) {
            Ok(()) => {
                self.cached = Some(cache);
                None
            }
            Err(e) => Some(format!(
                "sites: {e}; the tunnel works, but a restart without the API would use the older cache"
            )),
        }
    }

    /// The key this node publishes: its gateway key when its Node is labelled a gateway.
    pub fn public_key(&self, own: &Node) -> Option<Result<PublicKey, String>> {
        let label = &self.core.shaper.config.gateway_key;
        let gateway = own.metadata.labels.get(label).map(String::as_str) == Some("true");
        gateway.then(|| self.core.side.public_key().map_err(|e| e.to_string()))
    }

    /// The NAT discovery annotation this node publishes: the endpoints its dial-in peers come
    /// from, when it is an active gateway and has any.
    pub fn observed_endpoints(&self) -> Option<String> {
        self.core
            .side
            .observed_endpoints()
            .filter(|m| !m.is_empty())
            .map(sticky_sites::discovery::format)
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
        let side = &self.core.side;
        side.keys
            .forget_previous(&super::side::key_name(&side.ifname))
            .err()
            .map(|e| format!("sites: removing the previous gateway key: {e}"))
    }

    /// The key changed (a rotation): its `.previous` is forgotten once the new one shows.
    pub fn key_changed(&mut self) {
        self.forget_pending = true;
    }

    /// Whether a round is due: a period after the last ([`super::side::period`]), or a new
    /// plan came.
    pub fn round_due(&self) -> bool {
        self.core.round_due(Now::system())
    }

    /// How long until a round is due (zero: now).
    pub fn until_round(&self) -> Duration {
        self.core.until_round(Now::system())
    }

    /// A round, when one is due; the log lines.
    pub fn round_if_due(&mut self, shared: &Shared) -> Vec<String> {
        let Some((lines, status)) = self.core.round_if_due(Now::system()) else {
            return Vec::new();
        };
        // Kept as it was when the round changed nothing: the loop's comparison with the
        // status it wrote is then one pointer's (a hub's status is thousands of sites).
        let mut s = shared.lock();
        if s.status.sites.as_deref() != status.as_ref() {
            s.status.sites = status.map(Arc::new);
        }
        lines
    }

    /// Points the probes at this node's targets in the plan in force.
    fn aim_probes(&mut self) -> Option<String> {
        let aim = self.core.aim();
        self.probes.set(aim.underlay, aim.targets, aim.active)
    }

    /// Reads the probes and takes one healing step; the new observation when it changed (the
    /// caller recomputes the plan with it: [`SitesRun::recompute`] or the keeper), and the log
    /// lines.
    pub fn observe(&mut self) -> (Option<SiteView>, Vec<String>) {
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
        let (seen, more) = self.core.observe(liveness, &choices);
        lines.extend(more);
        (seen, lines)
    }

    /// The plan again from what the plan in force was made from, with what this node observes
    /// (when the keeper has no Nodes to make it from: the agent started with the API away);
    /// the log lines.
    pub fn recompute(&mut self) -> Vec<String> {
        let mut lines = self.core.recompute_kept();
        lines.extend(self.save_cache());
        lines.extend(self.aim_probes());
        lines
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
