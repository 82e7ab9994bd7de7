//! Each round of sites on the node (the main loop calls [`Side::round`] every
//! [`ROUND`] and after every change of the plan):
//!
//! - On its site's active gateway: the key from the key file (made once, kept), the tunnel
//!   device ensured (MTU, up), the device's key and port set only when they differ, its peers
//!   changed only by [`sticky_sites::tunnel::diff`] (re-applying costs packets), and the routes
//!   of every remote site's pod subnets into the device. The device's state is read each round,
//!   so a data-path daemon restarted with an empty device (or a device made again) is
//!   configured again within a round.
//! - On a node that stopped being the active gateway: its tunnel's peers and routes are
//!   removed (the device itself is `sticky-wg`'s).
//! - Everywhere: the status of every remote site (gateway, path; on the gateway the carrying
//!   tunnel's handshake and bytes), and a log line when a tunnel comes up or goes down.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use sticky_sites::keys::{KeyDir, PublicKey};
use sticky_sites::model::{Model, SiteName};
use sticky_sites::paths::Path;
use sticky_sites::plan::{GatewayPlan, Plan};
use sticky_sites::punch::Punches;
use sticky_sites::remote;
use sticky_sites::tunnel::{DeviceState, PeerConfig, Tunnel, diff};
use sticky_vxlan::status::{RemoteSite, SitesStatus, TunnelStatus};

use super::device::Routes;
use super::shape::Shaped;

/// How often a round runs when nothing changed: a tunnel device made again is configured
/// within this.
pub const ROUND: Duration = Duration::from_secs(2);

/// A tunnel whose latest handshake is older than this is down (WireGuard's reject-after time:
/// sessions rekey every 120 s while traffic flows).
pub const UP_WITHIN: Duration = Duration::from_secs(180);

/// The name of the gateway's key file in the key directory: `<interface>.key`.
pub fn key_name(ifname: &str) -> String {
    format!("{ifname}.key")
}

/// The sites side of one node.
pub struct Side<T, R> {
    /// The tunnel device's name.
    pub ifname: String,
    /// Its MTU (the pod MTU's WAN bound: wanMtu less WireGuard's overhead).
    pub mtu: u32,
    pub keys: KeyDir,
    pub tunnel: T,
    pub routes: R,
    shaped: Option<Shaped>,
    /// Tunnels up at the last round, by the site of their peer.
    up: BTreeMap<SiteName, bool>,
    /// This node configured the tunnel at some round (it may have peers and routes to clear).
    was_gateway: bool,
    /// Nodes left out of the sites at the last plan, with why.
    left_out: BTreeMap<String, String>,
    /// The candidate taken as each remote site's active one ([`sticky_sites::remote`]).
    taken: BTreeMap<SiteName, String>,
    /// Each peer's last sign of life, kept across rounds: its latest handshake, or the round
    /// its received bytes grew (sticky-wg makes a peer anew, with no handshake and no bytes,
    /// when its allowed IPs change, and that must not read as silence).
    signs: BTreeMap<PublicKey, Sign>,
    /// Log lines of remote sites moved to another candidate, for the round's lines.
    moved: Vec<String>,
    /// NAT traversal: see [`Nat`].
    nat: Nat,
}

/// NAT traversal on the active gateway (issue 29): the punches and what the device showed.
#[derive(Debug, Default)]
struct Nat {
    punches: Punches,
    /// The remote sites whose punch peer had a handshake within [`UP_WITHIN`] at the last round.
    fresh: BTreeSet<SiteName>,
    /// The latest handshake seen with each punch peer. Remembered, since the data path forgets
    /// it whenever a peer is set again (gotatun makes the peer anew, e.g. when its allowed IPs
    /// move): without this, moving the subnets would make the punch look stale at once.
    handshakes: BTreeMap<SiteName, SystemTime>,
    /// The current endpoints of the peers that dial in (gateways behind NAT), by gateway name:
    /// what a reachable gateway publishes. None when this node is not the active gateway.
    observed: Option<BTreeMap<String, SocketAddr>>,
    /// Refused discovery annotations at the last plan, by Node name.
    refused: BTreeMap<String, String>,
}

impl<T: Tunnel, R: Routes> Side<T, R> {
    pub fn new(ifname: String, mtu: u32, keys: KeyDir, tunnel: T, routes: R) -> Self {
        Side {
            ifname,
            mtu,
            keys,
            tunnel,
            routes,
            shaped: None,
            up: BTreeMap::new(),
            // A restarted agent does not know whether it configured the device before.
            was_gateway: true,
            left_out: BTreeMap::new(),
            nat: Nat::default(),
            taken: BTreeMap::new(),
            signs: BTreeMap::new(),
            moved: Vec::new(),
        }
    }

    /// Takes a new plan; the log lines for Nodes newly left out of the sites (or back).
    pub fn adopt(&mut self, shaped: Shaped) -> Vec<String> {
        let now: BTreeMap<String, String> = shaped
            .model
            .left_out
            .iter()
            .map(|(n, e)| (n.clone(), format!("is in no site: {e}")))
            .chain(
                shaped
                    .model
                    .not_gateway
                    .iter()
                    .map(|(n, e)| (n.clone(), format!("cannot be a gateway: {e}"))),
            )
            .collect();
        let mut lines = Vec::new();
        for (name, why) in &now {
            if self.left_out.get(name) != Some(why) {
                lines.push(format!("sites: node {name} {why}"));
            }
        }
        for name in self.left_out.keys().filter(|n| !now.contains_key(*n)) {
            lines.push(format!("sites: node {name} is no longer left out"));
        }
        self.left_out = now;
        lines.extend(self.nat.refusals(&shaped.observed_refused));
        let role_was = self.shaped.as_ref().map(role);
        let role_now = role(&shaped);
        if role_was.as_ref() != Some(&role_now) {
            lines.push(format!(
                "sites: this node is in site {}: {role_now}",
                shaped.plan.site
            ));
        }
        self.shaped = Some(shaped);
        lines
    }

    /// The plan last adopted.
    pub fn shaped(&self) -> Option<&Shaped> {
        self.shaped.as_ref()
    }

    /// This node's public key when its Node is labelled a gateway (the key is made on the first
    /// call and kept): what it publishes so that other sites can reach it.
    pub fn public_key(&self) -> Result<PublicKey, String> {
        self.keys
            .load_or_create(&key_name(&self.ifname))
            .map(|k| k.public_key())
            .map_err(|e| e.to_string())
    }

    /// One round (see the module doc): the log lines and the status.
    pub fn round(&mut self, now: SystemTime) -> (Vec<String>, Option<SitesStatus>) {
        let Some(shaped) = self.shaped.clone() else {
            return (Vec::new(), None);
        };
        // The punches stepped with the last round's device, and the plan they make.
        self.nat.punches.step(&shaped.plan, now, &self.nat.fresh);
        let plan = self.nat.punches.apply(&shaped.plan);
        let model = &shaped.model;
        let mut error = None;
        let mut device = None;
        if let Some(gw) = &plan.gateway {
            match self.configure(gw, model, now) {
                Ok(state) => device = Some(state),
                Err(e) => error = Some(e),
            }
            self.was_gateway = true;
        } else if self.was_gateway {
            match self.clear() {
                Ok(()) => self.was_gateway = false,
                Err(e) => error = Some(e),
            }
        }
        let mut lines = std::mem::take(&mut self.moved);
        // The tunnels: one per peer of the gateway plan, by the site of its peer.
        let mut tunnels: BTreeMap<&SiteName, TunnelStatus> = BTreeMap::new();
        if let (Some(gw), Some(dev)) = (&plan.gateway, &device) {
            for p in &gw.peers {
                // The candidate taken as that site's active one carries its traffic.
                let key = self
                    .taken
                    .get(&p.site)
                    .and_then(|t| model.sites.get(&p.site)?.candidate(t))
                    .map_or(p.config.public_key, |c| c.public_key);
                let state = dev.peers.iter().find(|s| s.public_key == key);
                let handshake = state.and_then(|s| s.last_handshake);
                let up = handshake
                    .is_some_and(|t| now.duration_since(t).map_or(true, |age| age <= UP_WITHIN));
                let was = self.up.insert(p.site.clone(), up).unwrap_or(false);
                if up != was {
                    lines.push(match up {
                        true => format!(
                            "sites: tunnel to site {} (gateway {}) is up",
                            p.site, p.gateway
                        ),
                        false => format!(
                            "sites: tunnel to site {} (gateway {}) is DOWN: {}",
                            p.site,
                            p.gateway,
                            match handshake {
                                None => "no handshake yet".to_string(),
                                Some(t) => format!(
                                    "no handshake for {} s",
                                    now.duration_since(t).map_or(0, |d| d.as_secs())
                                ),
                            }
                        ),
                    });
                }
                tunnels.insert(
                    &p.site,
                    TunnelStatus {
                        peer: p.gateway.clone(),
                        last_handshake: handshake.and_then(unix),
                        up,
                        rx_bytes: state.map_or(0, |s| s.rx_bytes),
                        tx_bytes: state.map_or(0, |s| s.tx_bytes),
                    },
                );
            }
        }
        if plan.gateway.is_none() {
            self.up.clear();
            self.taken.clear();
            self.signs.clear();
        }
        self.nat.read(&shaped.plan, &plan, device.as_ref(), now);
        let remotes = plan
            .remotes
            .iter()
            .map(|r| RemoteSite {
                site: r.site.to_string(),
                gateway: r.gateway.clone(),
                path: match (&r.path, self.nat.punches.describe(&r.site, now)) {
                    (
                        Path::Punch {
                            up: false,
                            relay: Some(v),
                            ..
                        },
                        Some(d),
                    ) => {
                        format!("relayed via {v} ({d})")
                    }
                    (p, _) => path_text(p),
                },
                tunnel: r
                    .path
                    .carrier(&r.site)
                    .and_then(|c| tunnels.get(c))
                    .cloned(),
            })
            .collect();
        let status = SitesStatus {
            site: plan.site.to_string(),
            role: role(&shaped),
            remotes,
            left_out: self.left_out.len(),
            error,
        };
        (lines, Some(status))
    }

    /// The current endpoints of the gateways behind NAT that dial in, when this node is an
    /// active gateway (see [`Nat::observed`]).
    pub fn observed_endpoints(&self) -> Option<&BTreeMap<String, SocketAddr>> {
        self.nat.observed.as_ref()
    }

    /// Brings the device to `gw`; its state after.
    /// Brings the device to `gw` (a peer for every candidate of each remote site: `expand`);
    /// its state after.
    fn configure(
        &mut self,
        gw: &GatewayPlan,
        model: &Model,
        now: SystemTime,
    ) -> Result<DeviceState, String> {
        let ifname = &self.ifname;
        let key = self
            .keys
            .load_or_create(&key_name(ifname))
            .map_err(|e| e.to_string())?;
        let t = &self.tunnel;
        t.ensure_device(ifname, self.mtu)
            .map_err(|e| e.to_string())?;
        let state = t.get(ifname).map_err(|e| e.to_string())?;
        for p in &state.peers {
            let sign = self.signs.entry(p.public_key).or_default();
            if p.rx_bytes > sign.rx {
                sign.at = Some(now);
            }
            sign.rx = p.rx_bytes;
            sign.at = sign.at.max(p.last_handshake);
        }
        let seen: BTreeMap<PublicKey, SystemTime> = self
            .signs
            .iter()
            .filter_map(|(k, s)| Some((*k, s.at?)))
            .collect();
        let taken = take_remote_actives(gw, model, &seen, &self.taken, now);
        let mut nudge = Vec::new();
        for (site, g) in &taken {
            if self.taken.get(site).is_some_and(|was| was != g) {
                nudge.extend(nudge_address(model, site, g));
                self.moved.push(format!(
                    "sites: site {site}'s traffic goes to its gateway {g} now (its newest handshake)"
                ));
            }
        }
        self.taken = taken;
        let desired: Vec<PeerConfig> = remote::expand(&gw.peers, model, &self.taken)
            .into_iter()
            .map(|p| p.config)
            .collect();
        let changes = diff(&desired, &state);
        // Key and port go with every change (one transaction): see `Tunnel::set`.
        let changed = state.public_key != Some(key.public_key())
            || state.listen_port != gw.listen_port
            || !changes.is_empty();
        if changed {
            t.set(ifname, Some(&key), Some(gw.listen_port), &changes)
                .map_err(|e| e.to_string())?;
        }
        let want: Vec<_> = desired
            .iter()
            .flat_map(|p| p.allowed_ips.iter().copied())
            .collect();
        self.routes.sync(ifname, &want).map_err(|e| e.to_string())?;
        // sticky-wg made the newly taken peer anew (its session is gone) and that gateway's
        // packets on the old session are dropped until it handshakes again (up to 15 s): one
        // datagram to it makes this side handshake at once.
        for to in nudge {
            if let Ok(sock) = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)) {
                let _ = sock.send_to(b"sticky-cni: handshake", to);
            }
        }
        if changed {
            return t.get(ifname).map_err(|e| e.to_string());
        }
        Ok(state)
    }

    /// Removes this node's tunnel peers and routes (it is no longer the active gateway). A
    /// device that is not there has none.
    fn clear(&self) -> Result<(), String> {
        let ifname = &self.ifname;
        let state = match self.tunnel.get(ifname) {
            Ok(s) => s,
            Err(_) => return Ok(()),
        };
        let changes = diff(&[], &state);
        self.tunnel
            .set(ifname, None, None, &changes)
            .map_err(|e| e.to_string())?;
        match self.routes.sync(ifname, &[]) {
            Ok(_) | Err(super::device::Error::NoDevice(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Nat {
    /// What the device shows after a round of `plan` (the plan as made, with every punch
    /// peer) and `applied` (as the punches made it): the fresh punch peers and the dial-in
    /// peers' endpoints.
    fn read(&mut self, plan: &Plan, applied: &Plan, device: Option<&DeviceState>, now: SystemTime) {
        let (Some(gw), Some(dev)) = (&plan.gateway, device) else {
            self.fresh.clear();
            self.handshakes.clear();
            self.observed = None;
            return;
        };
        let state = |key: &PublicKey| dev.peers.iter().find(|s| s.public_key == *key);
        let punching = sticky_sites::punch::punching(plan);
        self.handshakes.retain(|s, _| punching.contains(s));
        for p in gw.peers.iter().filter(|p| punching.contains(&p.site)) {
            if let Some(t) = state(&p.config.public_key).and_then(|s| s.last_handshake) {
                let latest = self.handshakes.entry(p.site.clone()).or_insert(t);
                *latest = (*latest).max(t);
            }
        }
        self.fresh = self
            .handshakes
            .iter()
            .filter(|(_, t)| now.duration_since(**t).map_or(true, |a| a <= UP_WITHIN))
            .map(|(s, _)| s.clone())
            .collect();
        let dial_in = applied.gateway.iter().flat_map(|g| &g.peers);
        self.observed = Some(
            dial_in
                .filter(|p| p.config.endpoint.is_none())
                .filter_map(|p| {
                    let ep = state(&p.config.public_key)?.endpoint?;
                    Some((p.gateway.clone(), ep))
                })
                .collect(),
        );
    }

    /// The log lines for refused discovery annotations, new or gone.
    fn refusals(&mut self, now: &BTreeMap<String, String>) -> Vec<String> {
        let mut lines: Vec<String> = now
            .iter()
            .filter(|(n, e)| self.refused.get(*n) != Some(*e))
            .map(|(n, e)| format!("sites: node {n}: {e}; its NAT observations are not used"))
            .collect();
        lines.extend(
            self.refused
                .keys()
                .filter(|n| !now.contains_key(*n))
                .map(|n| format!("sites: node {n}: its NAT observations are used again")),
        );
        self.refused = now.clone();
        lines
    }
}

/// Where to send a datagram through the tunnel to candidate `g` of `site`: the first address
/// of its first IPv4 pod subnet (its bridge), the discard port.
fn nudge_address(model: &Model, site: &SiteName, g: &str) -> Option<std::net::SocketAddr> {
    let member = model.sites.get(site)?.members.get(g)?;
    member.pod_cidrs.iter().find_map(|n| match n {
        ipnet::IpNet::V4(v4) => Some(std::net::SocketAddr::from((
            std::net::Ipv4Addr::from(u32::from(v4.network()).saturating_add(1)),
            9,
        ))),
        ipnet::IpNet::V6(_) => None,
    })
}

/// A peer's last sign of life (see [`Side`]'s `signs`).
#[derive(Debug, Default, Clone, Copy)]
struct Sign {
    /// Its received bytes at the last round.
    rx: u64,
    at: Option<SystemTime>,
}

/// Each remote site's candidate taken as active, from the last signs of life seen
/// ([`remote::remote_active`]; logged by the status's tunnel lines).
fn take_remote_actives(
    gw: &GatewayPlan,
    model: &Model,
    seen: &BTreeMap<PublicKey, SystemTime>,
    taken: &BTreeMap<SiteName, String>,
    now: SystemTime,
) -> BTreeMap<SiteName, String> {
    let mut out = BTreeMap::new();
    for p in &gw.peers {
        let Some(site) = model.sites.get(&p.site) else {
            continue;
        };
        let handshakes: BTreeMap<String, SystemTime> = site
            .candidates
            .iter()
            .filter_map(|c| Some((c.name.clone(), *seen.get(&c.public_key)?)))
            .collect();
        let current = taken.get(&p.site).map(String::as_str);
        let chosen = remote::remote_active(&handshakes, current, &p.gateway, now, UP_WITHIN);
        out.insert(p.site.clone(), chosen.to_string());
    }
    out
}

fn unix(t: SystemTime) -> Option<u64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// What a path says in the status.
fn path_text(p: &Path) -> String {
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

/// The role of a gateway that stepped down (`sticky_sites::heal`).
pub const STEPPED_DOWN: &str = "member; stepped down";

/// This node's role in its site.
fn role(s: &Shaped) -> String {
    let plan = &s.plan;
    if plan.gateway.is_some() {
        return "active gateway".into();
    }
    match (plan.actives.get(&plan.site), &plan.route_via) {
        // The rule names this node, yet it plans no tunnel: it stepped down.
        (Some(_), None) => STEPPED_DOWN.into(),
        (Some(g), _) => format!("member, through gateway {g}"),
        (None, _) if plan.remotes.is_empty() => "the only site".into(),
        (None, _) => "member; the site has NO active gateway (no gateway-labelled node with a published key): other sites are not reached".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::sites::device::Error as DeviceError;
    use crate::sites::shape::tests::shaper;
    use ipnet::IpNet;
    use sticky_overlay::sites::{
        DEFAULT_GATEWAY_LABEL as GATEWAY_LABEL, DEFAULT_SITE_LABEL as SITE_LABEL,
    };
    use sticky_sites::keys::PrivateKey;
    use sticky_sites::model::{ENDPOINT_ANNOTATION, NodeInput, PUBLIC_KEY_ANNOTATION};
    use sticky_sites::tunnel::fake::{Call, FakeTunnel};

    #[derive(Default)]
    struct FakeRoutes {
        held: RefCell<Vec<IpNet>>,
    }

    impl Routes for FakeRoutes {
        fn sync(&self, _: &str, want: &[IpNet]) -> Result<(usize, usize), DeviceError> {
            *self.held.borrow_mut() = want.to_vec();
            Ok((want.len(), 0))
        }
    }

    fn input(
        name: &str,
        ip: &str,
        net: &str,
        site: &str,
        key: Option<(u8, Option<&str>)>,
    ) -> NodeInput {
        let mut n = NodeInput {
            name: name.into(),
            pod_cidrs: vec![net.parse().unwrap()],
            underlay: Some(ip.parse().unwrap()),
            ..NodeInput::default()
        };
        n.labels.insert(SITE_LABEL.into(), site.into());
        if let Some((k, ep)) = key {
            n.labels.insert(GATEWAY_LABEL.into(), "true".into());
            n.annotations.insert(
                PUBLIC_KEY_ANNOTATION.into(),
                PrivateKey::from_bytes([k; 32]).public_key().to_base64(),
            );
            if let Some(ep) = ep {
                n.annotations.insert(ENDPOINT_ANNOTATION.into(), ep.into());
            }
        }
        n
    }

    fn shaped(me: &str, my_key: PublicKey) -> Shaped {
        let mut inputs = vec![
            input(
                "c1",
                "198.51.100.1",
                "198.18.1.0/24",
                "cloud",
                Some((1, Some("198.51.100.1:51820"))),
            ),
            input(
                "a1",
                "192.0.2.1",
                "198.18.11.0/24",
                "site-a",
                Some((2, None)),
            ),
            input("a2", "192.0.2.2", "198.18.12.0/24", "site-a", None),
            input(
                "b1",
                "192.0.2.129",
                "198.18.21.0/24",
                "site-b",
                Some((3, None)),
            ),
        ];
        // This node's published key is its key file's.
        for n in &mut inputs {
            if n.name == me && n.annotations.contains_key(PUBLIC_KEY_ANNOTATION) {
                n.annotations
                    .insert(PUBLIC_KEY_ANNOTATION.into(), my_key.to_base64());
            }
        }
        shaper(me).compute(inputs).unwrap()
    }

    fn side(dir: &std::path::Path) -> Side<FakeTunnel, FakeRoutes> {
        std::fs::create_dir_all(dir).unwrap();
        let owner = nix::unistd::geteuid().as_raw();
        let keys = KeyDir::new(dir, owner);
        Side::new(
            "stickywg0".into(),
            1440,
            keys,
            FakeTunnel::default(),
            FakeRoutes::default(),
        )
    }

    #[test]
    fn the_gateway_configures_its_tunnel_once_and_then_only_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = side(&dir.path().join("keys"));
        let pk = s.public_key().unwrap();
        assert_eq!(s.public_key().unwrap(), pk, "made once, then kept");
        let lines = s.adopt(shaped("a1", pk));
        assert!(
            lines
                .iter()
                .any(|l| l.contains("site site-a: active gateway")),
            "{lines:?}"
        );
        let (_, status) = s.round(SystemTime::now());
        let status = status.unwrap();
        assert_eq!(status.error, None);
        let calls = s.tunnel.calls();
        assert!(
            calls
                .iter()
                .any(|c| matches!(c, Call::Set { public_key: Some(_), port: Some(51820), changes, .. } if !changes.is_empty())),
            "{calls:?}"
        );
        assert_eq!(
            calls
                .iter()
                .filter(|c| matches!(c, Call::Set { .. }))
                .count(),
            1,
            "key, port and peers in one transaction: {calls:?}"
        );
        // The cloud directly, site B through it: one peer, both sites' subnets routed into the device.
        let held: Vec<String> = s
            .routes
            .held
            .borrow()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(held, ["198.18.1.0/24", "198.18.21.0/24"]);
        let by_site: BTreeMap<_, _> = status
            .remotes
            .iter()
            .map(|r| (r.site.as_str(), r))
            .collect();
        assert_eq!(by_site["cloud"].path, "direct");
        assert_eq!(by_site["site-b"].path, "relayed via cloud");
        assert_eq!(by_site["site-b"].tunnel.as_ref().unwrap().peer, "c1");
        // A second round changes nothing: only reads.
        let after = calls_of_a_round(&mut s);
        assert!(
            after
                .iter()
                .all(|c| matches!(c, Call::EnsureDevice { .. } | Call::Get { .. })),
            "{after:?}"
        );
    }

    /// The calls one round makes.
    fn calls_of_a_round(s: &mut Side<FakeTunnel, FakeRoutes>) -> Vec<Call> {
        let before = s.tunnel.calls().len();
        s.round(SystemTime::now());
        s.tunnel.calls()[before..].to_vec()
    }

    /// The side of a1, site A's active gateway, with its key made: (its key dir, the side,
    /// its public key).
    fn gateway_a1() -> (tempfile::TempDir, Side<FakeTunnel, FakeRoutes>, PublicKey) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = side(&dir.path().join("keys"));
        let pk = s.public_key().unwrap();
        s.adopt(shaped("a1", pk));
        (dir, s, pk)
    }

    #[test]
    fn a_device_made_again_empty_is_configured_again_in_one_round() {
        let (_dir, mut s, _) = gateway_a1();
        s.round(SystemTime::now());
        // sticky-wg made the device again: no key, no peers.
        s.tunnel.devices.lock().unwrap().clear();
        let after = calls_of_a_round(&mut s);
        assert!(
            after
                .iter()
                .any(|c| matches!(c, Call::Set { public_key: Some(_), port: Some(51820), changes, .. } if !changes.is_empty())),
            "{after:?}"
        );
    }

    #[test]
    fn a_member_configures_no_tunnel_and_a_former_gateway_clears_its_own() {
        let (_dir, mut s, pk) = gateway_a1();
        s.round(SystemTime::now());
        assert!(!s.routes.held.borrow().is_empty());
        // Now a2's view: not the gateway.
        s.adopt(shaped("a2", pk));
        let (_, status) = s.round(SystemTime::now());
        assert!(
            s.routes.held.borrow().is_empty(),
            "routes into the tunnel removed"
        );
        let dev = s.tunnel.devices.lock().unwrap()["stickywg0"].1.clone();
        assert!(dev.peers.is_empty(), "peers removed: {dev:?}");
        let status = status.unwrap();
        assert_eq!(status.role, "member, through gateway a1");
        assert!(status.remotes.iter().all(|r| r.tunnel.is_none()));
    }

    /// `shaped`, with the cloud gateway's NAT discovery annotation naming a1 and b1.
    fn shaped_punching(me: &str, my_key: PublicKey) -> Shaped {
        let mut s = shaped(me, my_key);
        let mut inputs = s.inputs.clone();
        inputs[0].annotations.insert(
            sticky_sites::observed::OBSERVED_ENDPOINTS_ANNOTATION.into(),
            r#"{"a1":"203.0.113.10:51820","b1":"203.0.113.20:51820"}"#.into(),
        );
        s = shaper(me).compute(inputs).unwrap();
        s
    }

    fn allowed_of(s: &Side<FakeTunnel, FakeRoutes>, key: u8) -> Vec<String> {
        let pk = PrivateKey::from_bytes([key; 32]).public_key();
        let d = s.tunnel.devices.lock().unwrap();
        d["stickywg0"]
            .1
            .peers
            .iter()
            .find(|p| p.public_key == pk)
            .map(|p| p.allowed_ips.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_punch_moves_site_b_to_the_direct_peer_and_stays_when_the_device_forgets_the_handshake() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = side(&dir.path().join("keys"));
        let pk = s.public_key().unwrap();
        s.adopt(shaped_punching("a1", pk));
        let t0 = SystemTime::now();
        let (_, status) = s.round(t0);
        let b = |st: &Option<SitesStatus>| {
            st.as_ref()
                .unwrap()
                .remotes
                .iter()
                .find(|r| r.site == "site-b")
                .unwrap()
                .path
                .clone()
        };
        assert_eq!(b(&status), "relayed via cloud (punching)");
        assert_eq!(allowed_of(&s, 1), ["198.18.1.0/24", "198.18.21.0/24"]);
        assert!(
            allowed_of(&s, 3).is_empty(),
            "the punch peer carries nothing yet"
        );
        let b1 = PrivateKey::from_bytes([3; 32]).public_key();
        let handshake = |s: &Side<FakeTunnel, FakeRoutes>, t: Option<SystemTime>| {
            let mut d = s.tunnel.devices.lock().unwrap();
            for p in &mut d.get_mut("stickywg0").unwrap().1.peers {
                if p.public_key == b1 {
                    p.last_handshake = t;
                }
            }
        };
        handshake(&s, Some(t0));
        s.round(t0 + Duration::from_secs(2));
        let (_, status) = s.round(t0 + Duration::from_secs(4));
        assert_eq!(b(&status), "direct (punched)");
        assert_eq!(allowed_of(&s, 1), ["198.18.1.0/24"]);
        assert_eq!(allowed_of(&s, 3), ["198.18.21.0/24"]);
        // The data path made the peer anew when its allowed IPs moved: no handshake shown.
        handshake(&s, None);
        s.round(t0 + Duration::from_secs(6));
        let (_, status) = s.round(t0 + Duration::from_secs(8));
        assert_eq!(
            b(&status),
            "direct (punched)",
            "the handshake seen is remembered"
        );
        assert_eq!(allowed_of(&s, 3), ["198.18.21.0/24"]);
        // Stale after 180 s: back on the relay.
        s.round(t0 + Duration::from_secs(190));
        let (_, status) = s.round(t0 + Duration::from_secs(192));
        assert_eq!(b(&status), "relayed via cloud (punching)");
        assert_eq!(allowed_of(&s, 1), ["198.18.1.0/24", "198.18.21.0/24"]);
    }

    #[test]
    fn a_reachable_gateway_reports_where_its_dial_in_peers_come_from() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = side(&dir.path().join("keys"));
        let pk = s.public_key().unwrap();
        s.adopt(shaped("c1", pk));
        s.round(SystemTime::now());
        assert_eq!(s.observed_endpoints(), Some(&BTreeMap::new()));
        {
            let mut d = s.tunnel.devices.lock().unwrap();
            for p in &mut d.get_mut("stickywg0").unwrap().1.peers {
                p.endpoint = Some("203.0.113.10:40000".parse().unwrap());
            }
        }
        s.round(SystemTime::now());
        let seen: Vec<(String, String)> = s
            .observed_endpoints()
            .unwrap()
            .iter()
            .map(|(g, e)| (g.clone(), e.to_string()))
            .collect();
        assert_eq!(
            seen,
            [
                ("a1".to_string(), "203.0.113.10:40000".to_string()),
                ("b1".to_string(), "203.0.113.10:40000".to_string())
            ]
        );
        // A NATed gateway dials everyone: it observes nobody.
        s.adopt(shaped("a2", pk));
        s.round(SystemTime::now());
        assert_eq!(s.observed_endpoints(), None);
    }

    #[test]
    fn tunnel_up_and_down_are_logged_once_each() {
        let (_dir, mut s, _) = gateway_a1();
        let t0 = SystemTime::now();
        let (lines, _) = s.round(t0);
        assert!(!lines.iter().any(|l| l.contains("is up")), "{lines:?}");
        // A handshake with the cloud's gateway.
        {
            let mut d = s.tunnel.devices.lock().unwrap();
            for p in &mut d.get_mut("stickywg0").unwrap().1.peers {
                p.last_handshake = Some(t0);
            }
        }
        let (lines, status) = s.round(t0 + Duration::from_secs(1));
        assert_eq!(
            lines,
            ["sites: tunnel to site cloud (gateway c1) is up"],
            "{lines:?}"
        );
        assert!(
            status
                .unwrap()
                .remotes
                .iter()
                .all(|r| r.tunnel.as_ref().is_some_and(|t| t.up))
        );
        let (lines, _) = s.round(t0 + Duration::from_secs(2));
        assert!(lines.is_empty(), "{lines:?}");
        let (lines, _) = s.round(t0 + Duration::from_secs(181));
        assert_eq!(
            lines,
            ["sites: tunnel to site cloud (gateway c1) is DOWN: no handshake for 181 s"]
        );
    }
}
