//! Each round of sites on the node (the main loop calls [`Side::round`] every [`period`] and
//! after every change of the plan): read, decide, act.
//!
//! - **Read**: on its site's active gateway, the key from the key file (made once, kept), the
//!   device ensured (MTU, up) and its state; on a node that may still hold peers and routes
//!   from when it was the gateway, the device's state (none there: nothing to clear).
//! - **Decide**: [`sticky_sites::round`], pure: the key, port and peer changes
//!   ([`sticky_sites::tunnel::diff`]: re-applying costs packets), the routes of every remote
//!   site's pod subnets into the device, the datagrams that start a handshake, the lines.
//! - **Act**: the actions through the one device seam ([`Device`]), in order.
//!
//! The device's state is read each round, so a data-path daemon restarted with an empty device
//! (or a device made again) is configured again within a round. Everywhere, the status of every
//! remote site (gateway, path; on the gateway the carrying tunnel's handshake and bytes).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use sticky_sites::keys::{PrivateKey, PublicKey};
use sticky_sites::paths::Path;
use sticky_sites::round::{Action, Decision, Memory, path_text};
use sticky_sites::tunnel::DeviceState;
use sticky_vxlan::status::{RemoteSite, SitesStatus, TunnelStatus};

use super::device::{self, Device};
use super::keys::KeyDir;
use super::shape::Shaped;

/// How often a round runs when nothing changed: every second, so that a remote site's standby
/// is followed, and a silent punched path left, within a second of what their rules need (a
/// tunnel device made again is configured within this too).
pub const ROUND: Duration = Duration::from_secs(1);
/// As rarely as this where a round costs more than a twentieth of [`ROUND`] (a hub of
/// thousands of sites: see [`period`]).
pub const ROUND_MAX: Duration = Duration::from_secs(2);

/// How long after a round that took `cost` the next one is due when nothing changes: twenty
/// times its cost, at least [`ROUND`] and at most [`ROUND_MAX`]. Rounds take at most 5 % of
/// the agent's time (issue 37's budget for a hub) until [`ROUND_MAX`] binds; on a hub of 10,000
/// sites (a round of about 0.2 s) that is every 2 s.
pub fn period(cost: Duration) -> Duration {
    cost.saturating_mul(20).clamp(ROUND, ROUND_MAX)
}

/// The name of the gateway's key file in the key directory: `<interface>.key`.
pub fn key_name(ifname: &str) -> String {
    format!("{ifname}.key")
}

/// What keeps a round from reading or changing the device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Key(#[from] super::keys::Error),
    #[error(transparent)]
    Device(#[from] device::Error),
}

/// The sites side of one node.
pub struct Side<D> {
    /// The tunnel device's name.
    pub ifname: String,
    /// Its MTU (the pod MTU's WAN bound: wanMtu less WireGuard's overhead).
    pub mtu: u32,
    pub keys: KeyDir,
    pub device: D,
    shaped: Option<Shaped>,
    /// What the rounds learnt from the device ([`sticky_sites::round`]).
    memory: Memory,
    /// Nodes left out of the sites at the last plan, with why.
    left_out: BTreeMap<String, String>,
    /// Refused discovery annotations at the last plan, by Node name.
    refused: BTreeMap<String, String>,
}

impl<D: Device> Side<D> {
    pub fn new(ifname: String, mtu: u32, keys: KeyDir, device: D) -> Self {
        Side {
            ifname,
            mtu,
            keys,
            device,
            shaped: None,
            memory: Memory::default(),
            left_out: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    /// Takes a new plan; the log lines for Nodes newly left out of the sites (or back), for
    /// refused discovery annotations, and for a new role.
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
        let mut lines = changed_lines(
            &self.left_out,
            &now,
            |n, why| format!("sites: node {n} {why}"),
            |n| format!("sites: node {n} is no longer left out"),
        );
        self.left_out = now;
        lines.extend(changed_lines(
            &self.refused,
            &shaped.observed_refused,
            |n, e| format!("sites: node {n}: {e}; its NAT observations are not used"),
            |n| format!("sites: node {n}: its NAT observations are used again"),
        ));
        self.refused.clone_from(&shaped.observed_refused);
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

    /// This node's gateway key (made on the first call and kept).
    fn key(&self) -> Result<PrivateKey, Error> {
        Ok(self.keys.load_or_create(&key_name(&self.ifname))?)
    }

    /// This node's public key when its Node is labelled a gateway (the key is made on the first
    /// call and kept): what it publishes so that other sites can reach it.
    pub fn public_key(&self) -> Result<PublicKey, Error> {
        self.key().map(|k| k.public_key())
    }

    /// The current endpoints of the gateways behind NAT that dial in, when this node is an
    /// active gateway.
    pub fn observed_endpoints(&self) -> Option<&BTreeMap<String, SocketAddr>> {
        self.memory.observed_endpoints()
    }

    /// One round (see the module doc): the log lines and the status.
    pub fn round(&mut self, now: SystemTime) -> (Vec<String>, Option<SitesStatus>) {
        let Some(shaped) = &self.shaped else {
            return (Vec::new(), None);
        };
        let plan = &shaped.plan;
        let gateway = plan.gateway.is_some();
        let mut error = None;
        let (key, device) = match self.read(plan) {
            Ok(read) => read,
            Err(e) => {
                error = Some(e.to_string());
                (None, None)
            }
        };
        let public = key.as_ref().map(PrivateKey::public_key);
        let decision = self
            .memory
            .decide(plan, &shaped.model, device.as_ref(), public, now);
        if let Err(e) = self.act(&decision.actions, key.as_ref()) {
            if !gateway {
                self.memory.clear_failed();
            }
            error = Some(e.to_string());
        }
        let status = SitesStatus {
            site: plan.site.to_string(),
            role: role(shaped),
            remotes: self.remotes(&decision, now),
            left_out: self.left_out.len(),
            error,
        };
        (decision.lines, Some(status))
    }

    /// What the round needs of the device (see the module doc): the key and the device's
    /// state on the gateway; the state alone where peers and routes may be left to clear.
    fn read(
        &self,
        plan: &sticky_sites::plan::SitePlan,
    ) -> Result<(Option<PrivateKey>, Option<DeviceState>), Error> {
        if plan.gateway.is_some() {
            let key = self.key()?;
            self.device.ensure(&self.ifname, self.mtu)?;
            let state = self.device.get(&self.ifname)?;
            return Ok((Some(key), Some(state)));
        }
        if !self.memory.wants_device(plan) {
            return Ok((None, None));
        }
        // No device (or no daemon): no peers and routes to clear.
        Ok((None, self.device.get(&self.ifname).ok()))
    }

    /// Carries out `actions` in order; stops at the first that fails.
    fn act(&self, actions: &[Action], key: Option<&PrivateKey>) -> Result<(), Error> {
        let ifname = &self.ifname;
        for action in actions {
            match action {
                Action::Set {
                    with_key,
                    port,
                    changes,
                } => {
                    let key = key.filter(|_| *with_key);
                    self.device.set(ifname, key, *port, changes)?;
                }
                Action::Routes(want) => match self.device.routes(ifname, want) {
                    Err(device::Error::NoDevice(_)) if want.is_empty() => {}
                    r => r?,
                },
                // Best effort: without it the handshake comes at the next keepalive.
                Action::Nudge(to) => {
                    let _ = self.device.nudge(*to);
                }
            }
        }
        Ok(())
    }

    /// Every remote site in the status: its gateway, its path, and on the gateway the tunnel
    /// that carries its traffic.
    fn remotes(&self, d: &Decision, now: SystemTime) -> Vec<RemoteSite> {
        d.applied
            .remotes
            .iter()
            .map(|r| RemoteSite {
                site: r.site.to_string(),
                gateway: r.gateway.clone(),
                path: match (&r.path, self.memory.describe_punch(&r.site, now)) {
                    (
                        Path::Punch {
                            up: false,
                            relay: Some(v),
                            ..
                        },
                        Some(d),
                    ) => format!("relayed via {v} ({d})"),
                    (p, _) => path_text(p),
                },
                // The remote gateway's own peer carries it, also through a relay.
                tunnel: Some(&r.site)
                    .filter(|_| r.path.carried())
                    .and_then(|c| d.carriers.get(c))
                    .map(|c| TunnelStatus {
                        peer: c.peer.clone(),
                        last_handshake: c.last_handshake.and_then(unix),
                        up: c.up,
                        rx_bytes: c.rx_bytes,
                        tx_bytes: c.tx_bytes,
                    }),
            })
            .collect()
    }
}

/// The log lines for what is new or changed in `now` against `was` (`said`), and for what is
/// gone (`gone`).
fn changed_lines(
    was: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
    said: impl Fn(&str, &str) -> String,
    gone: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut lines: Vec<String> = now
        .iter()
        .filter(|(n, e)| was.get(*n) != Some(*e))
        .map(|(n, e)| said(n, e))
        .collect();
    lines.extend(
        was.keys()
            .filter(|n| !now.contains_key(*n))
            .map(|n| gone(n)),
    );
    lines
}

fn unix(t: SystemTime) -> Option<u64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
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
    use super::*;
    use crate::sites::device::fake::{Call, Fake};
    use crate::sites::shape::tests::shaper;
    use ipnet::IpNet;
    use sticky_overlay::sites::{
        DEFAULT_GATEWAY_LABEL as GATEWAY_LABEL, DEFAULT_SITE_LABEL as SITE_LABEL,
    };
    use sticky_sites::keys::PrivateKey;
    use sticky_sites::model::{ENDPOINT_ANNOTATION, NodeInput, PUBLIC_KEY_ANNOTATION};
    use sticky_sites::tunnel::PeerChange;

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

    fn side(dir: &std::path::Path) -> Side<Fake> {
        std::fs::create_dir_all(dir).unwrap();
        let owner = nix::unistd::geteuid().as_raw();
        let keys = KeyDir::new(dir, owner);
        Side::new("stickywg0".into(), 1424, keys, Fake::default())
    }

    #[test]
    fn rounds_take_at_most_5_percent_of_the_time_every_second_to_every_2_s() {
        assert_eq!(period(Duration::ZERO), ROUND);
        assert_eq!(period(Duration::from_millis(2)), Duration::from_secs(1));
        assert_eq!(
            period(Duration::from_millis(75)),
            Duration::from_millis(1500)
        );
        assert_eq!(period(Duration::from_millis(250)), ROUND_MAX);
        assert_eq!(period(Duration::MAX), Duration::from_secs(2));
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
        let calls = s.device.calls();
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
        // The cloud directly, site B through it (B's own peer, relayed): both sites' subnets
        // routed into the device.
        let held: Vec<String> = s
            .device
            .held("stickywg0")
            .unwrap()
            .routes
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
        assert_eq!(by_site["site-b"].tunnel.as_ref().unwrap().peer, "b1");
        // A second round changes nothing: only reads.
        let after = calls_of_a_round(&mut s);
        assert!(
            after.iter().all(|c| matches!(
                c,
                Call::Ensure { .. } | Call::Get { .. } | Call::Routes { .. }
            )),
            "{after:?}"
        );
    }

    /// The calls one round makes.
    fn calls_of_a_round(s: &mut Side<Fake>) -> Vec<Call> {
        let before = s.device.calls().len();
        s.round(SystemTime::now());
        s.device.calls()[before..].to_vec()
    }

    /// The side of a1, site A's active gateway, with its key made: (its key dir, the side,
    /// its public key).
    fn gateway_a1() -> (tempfile::TempDir, Side<Fake>, PublicKey) {
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
        s.device.devices.borrow_mut().clear();
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
        assert!(!s.device.held("stickywg0").unwrap().routes.is_empty());
        // Now a2's view: not the gateway.
        s.adopt(shaped("a2", pk));
        let (_, status) = s.round(SystemTime::now());
        assert!(
            s.device.held("stickywg0").unwrap().routes.is_empty(),
            "routes into the tunnel removed"
        );
        let dev = s.device.held("stickywg0").unwrap().state;
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
            sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION.into(),
            r#"{"a1":"203.0.113.10:51820","b1":"203.0.113.20:51820"}"#.into(),
        );
        s = shaper(me).compute(inputs).unwrap();
        s
    }

    fn allowed_of(s: &Side<Fake>, key: u8) -> Vec<String> {
        let pk = PrivateKey::from_bytes([key; 32]).public_key();
        let d = s.device.held("stickywg0").unwrap();
        d.state
            .peers
            .iter()
            .find(|p| p.public_key == pk)
            .map(|p| p.allowed_ips.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    /// Site B's one peer carries its subnets through the relay while punching; what arrives
    /// through the relay is no sign of the direct path; a direct datagram (the device roamed
    /// the peer to a real address) is, and the path is punched with no change of peer; silent,
    /// it goes back through the relay.
    #[test]
    fn a_punch_moves_site_b_to_the_direct_path_on_its_own_peer_and_back_when_silent() {
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
        assert_eq!(
            allowed_of(&s, 1),
            ["198.18.1.0/24"],
            "the relay carries nothing of B"
        );
        assert_eq!(allowed_of(&s, 3), ["198.18.21.0/24"]);
        let c1 = PrivateKey::from_bytes([1; 32]).public_key();
        let b1 = PrivateKey::from_bytes([3; 32]).public_key();
        let through_cloud = sticky_sites::relay::endpoint(&c1, &b1, true);
        // What the device shows of b1's peer, changed by `f`.
        let on_b1 = |s: &Side<Fake>, f: &dyn Fn(&mut sticky_sites::tunnel::PeerState)| {
            let mut d = s.device.devices.borrow_mut();
            let peers = &mut d.get_mut("stickywg0").unwrap().state.peers;
            peers.iter_mut().filter(|p| p.public_key == b1).for_each(f);
        };
        let endpoint_of_b1 = |s: &Side<Fake>| {
            let d = s.device.held("stickywg0").unwrap();
            d.state
                .peers
                .iter()
                .find(|p| p.public_key == b1)
                .unwrap()
                .endpoint
        };
        assert_eq!(endpoint_of_b1(&s), Some(through_cloud));
        let rx = |s: &Side<Fake>, bytes: u64| on_b1(s, &|p| p.rx_bytes = bytes);
        // Through the relay: a handshake and bytes, no sign of the direct path.
        on_b1(&s, &|p| p.last_handshake = Some(t0));
        rx(&s, 5000);
        let (_, status) = s.round(t0 + Duration::from_millis(500));
        assert_eq!(b(&status), "relayed via cloud (punching)");
        // A direct datagram: the device roamed b1's peer to a real address.
        let direct: std::net::SocketAddr = "203.0.113.20:51820".parse().unwrap();
        on_b1(&s, &|p| p.endpoint = Some(direct));
        rx(&s, 5032);
        let (_, status) = s.round(t0 + Duration::from_secs(1));
        assert_eq!(b(&status), "direct (punched)");
        assert_eq!(allowed_of(&s, 3), ["198.18.21.0/24"]);
        assert_eq!(endpoint_of_b1(&s), Some(direct), "left where it roamed");
        // Keepalives arrive every second.
        for t in 2..=5 {
            rx(&s, 5032 + 32 * t);
            let (_, status) = s.round(t0 + Duration::from_secs(t));
            assert_eq!(b(&status), "direct (punched)", "at {t} s");
        }
        // Silent from the keepalive read at 5 s: dead at the round more than 3 s later, and
        // back through the relay in that round, on the same peer.
        let (_, status) = s.round(t0 + Duration::from_secs(8));
        assert_eq!(b(&status), "direct (punched)");
        let (_, status) = s.round(t0 + Duration::from_secs(9));
        assert_eq!(b(&status), "relayed via cloud (punching)");
        assert_eq!(endpoint_of_b1(&s), Some(through_cloud));
        assert_eq!(allowed_of(&s, 3), ["198.18.21.0/24"]);
        assert_eq!(allowed_of(&s, 1), ["198.18.1.0/24"]);
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
            let mut d = s.device.devices.borrow_mut();
            for p in &mut d.get_mut("stickywg0").unwrap().state.peers {
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
        // A handshake with the cloud's gateway, and with B's through it.
        {
            let mut d = s.device.devices.borrow_mut();
            for p in &mut d.get_mut("stickywg0").unwrap().state.peers {
                p.last_handshake = Some(t0);
            }
        }
        let (lines, status) = s.round(t0 + Duration::from_secs(1));
        assert_eq!(
            lines,
            [
                "sites: tunnel to site cloud (gateway c1) is up",
                "sites: tunnel to site site-b (gateway b1) is up"
            ],
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
            [
                "sites: tunnel to site cloud (gateway c1) is DOWN: nothing heard for 181 s",
                "sites: tunnel to site site-b (gateway b1) is DOWN: nothing heard for 181 s"
            ]
        );
    }

    /// The cloud gateway `c1` of a hub (issue 37): `sites` edge sites, each a gateway of its
    /// own behind NAT, with a /26 each from 10.64.0.0/10.
    fn hub(sites: u32, my_key: PublicKey, moved: Option<u32>) -> Shaped {
        let mut inputs = vec![input(
            "c1",
            "198.51.100.1",
            "198.51.100.0/24",
            "cloud",
            Some((1, Some("198.51.100.1:51820"))),
        )];
        inputs[0]
            .annotations
            .insert(PUBLIC_KEY_ANNOTATION.into(), my_key.to_base64());
        for i in 1..=sites {
            // Site `moved` has a new pod subnet, past the others.
            let block = if Some(i) == moved { sites + i } else { i };
            let net = format!(
                "{}/26",
                std::net::Ipv4Addr::from(0x0a40_0000 + (block << 6))
            );
            let mut n = input(
                &format!("shop-{i:05}"),
                &std::net::Ipv4Addr::from(0xc612_0000 + i).to_string(),
                &net,
                &format!("shop-{i:05}"),
                None,
            );
            n.labels.insert(GATEWAY_LABEL.into(), "true".into());
            // Any 32 bytes but zeros are a key to the plan (no curve arithmetic in a debug
            // build for 10,000 of them).
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            key[31] = 0x40;
            n.annotations
                .insert(PUBLIC_KEY_ANNOTATION.into(), PublicKey(key).to_base64());
            inputs.push(n);
        }
        shaper("c1").compute(inputs).unwrap()
    }

    /// A hub of 10,000 sites is configured in one transaction, and one site's new subnet
    /// changes that site's peer only: one upsert, with its allowed IPs.
    #[test]
    fn a_hub_of_10000_sites_changes_only_the_site_that_changed() {
        const SITES: u32 = 10_000;
        let dir = tempfile::tempdir().unwrap();
        let mut s = side(&dir.path().join("keys"));
        let pk = s.public_key().unwrap();
        s.adopt(hub(SITES, pk, None));
        let first = calls_of_a_round(&mut s);
        let sets: Vec<&Vec<PeerChange>> = first
            .iter()
            .filter_map(|c| match c {
                Call::Set { changes, .. } => Some(changes),
                _ => None,
            })
            .collect();
        assert_eq!(sets.len(), 1, "one transaction");
        assert_eq!(sets[0].len(), SITES as usize);
        let held = s.device.held("stickywg0").unwrap();
        assert_eq!(held.routes.len(), SITES as usize);
        let again = calls_of_a_round(&mut s);
        assert!(
            again.iter().all(|c| !matches!(c, Call::Set { .. })),
            "nothing changed, nothing set"
        );

        s.adopt(hub(SITES, pk, Some(42)));
        let after = calls_of_a_round(&mut s);
        let changes: Vec<&PeerChange> = after
            .iter()
            .filter_map(|c| match c {
                Call::Set { changes, .. } => Some(changes),
                _ => None,
            })
            .flatten()
            .collect();
        let moved: IpNet = format!(
            "{}/26",
            std::net::Ipv4Addr::from(0x0a40_0000 + ((SITES + 42) << 6))
        )
        .parse()
        .unwrap();
        match changes.as_slice() {
            [
                PeerChange::Upsert {
                    peer,
                    replace_allowed_ips: true,
                },
            ] => assert_eq!(peer.allowed_ips, [moved]),
            other => panic!("one upsert of shop-00042's peer, got {other:?}"),
        }
        let held = s.device.held("stickywg0").unwrap();
        assert_eq!(held.routes.len(), SITES as usize);
        assert!(held.routes.contains(&moved));
    }
}
