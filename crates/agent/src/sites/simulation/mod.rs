//! The sites decisions of every node of a cluster, on a simulated clock and network (issue 33,
//! "a simulation"; FoundationDB's and TigerBeetle's way): a cloud site on the internet and two
//! edge sites behind NAT routers, each node running the agent's own [`Core`] (the plan, the
//! step-down rule, the gateway's round through its [`Device`] seam) and the probe tracker,
//! every gateway a simulated `sticky-wg` ([`wg`]), every datagram through [`net`]. Faults
//! (loss, links cut, routers rebooted or renumbered, the relay restarted, the API away) come
//! from the scenario and the seed; the same seed replays the same run. No root, no sockets,
//! no sleeping: an hour of simulated time takes seconds.
//!
//! What it shows is whether pods can talk: a ping from one pod to another follows the same
//! decisions a packet meets (the member's peers-file route to its site's gateway, the
//! gateway's routes and WireGuard peers, the relay's, the far side's source check) and both
//! ways must pass. The netns tests remain the proof that the real data path agrees.

mod net;
mod scenarios;
mod wg;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use ipnet::IpNet;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sticky_overlay::sites::{DEFAULT_GATEWAY_LABEL, DEFAULT_SITE_LABEL, Sites};
use sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION;
use sticky_sites::model::{ENDPOINT_ANNOTATION, NodeInput, PUBLIC_KEY_ANNOTATION};
use sticky_sites::probe::{self, Message, Tracker};
use sticky_sites::relay::{Inbound, Table};

use super::core::{Core, Now};
use super::keys::KeyDir;
use super::shape::Shaper;
use super::side::Side;
pub use net::{Host, Nat, Net, Router};
use wg::{NEW_HANDSHAKE, REJECT_AFTER, REKEY_AFTER, REKEY_TIMEOUT, SimDevice, Wg};

/// The step of the simulated clock: the agent's main loop polls every 500 ms.
const TICK: Duration = Duration::from_millis(500);

/// One node of the simulation.
struct SimNode {
    site: String,
    underlay: IpAddr,
    pod: IpNet,
    /// The agent runs.
    running: bool,
    core: Core<SimDevice>,
    tracker: Tracker,
    device: SimDevice,
    /// The agent's log, with the simulated time of each line.
    log: Vec<(Duration, String)>,
    /// The API inputs it made its plan from last (with the API up).
    api_seen: u64,
    /// The last probe round.
    probed: Option<Duration>,
    /// The status of its last round.
    status: Option<sticky_vxlan::status::SitesStatus>,
    /// When its agent started (drawn from the seed: the nodes' loops are not in step).
    started: Duration,
}

/// The cluster: nodes, network, clock, API, seed.
pub struct World {
    rng: ChaCha8Rng,
    /// Simulated time since the start.
    pub t: Duration,
    mono: Instant,
    wall: SystemTime,
    pub net: Net,
    nodes: BTreeMap<String, SimNode>,
    sites: Sites,
    /// The Nodes as the API holds them, and a counter of their changes.
    api: Vec<NodeInput>,
    api_version: u64,
    pub api_up: bool,
    next_session: u64,
    _keys: tempfile::TempDir,
}

/// One node of the cluster to build: (name, site, underlay, pod subnet, gateway candidate).
pub type Spec<'a> = (&'a str, &'a str, &'a str, &'a str, bool);

/// The cluster of every scenario: cloud (c1 its gateway, public), edge-a (a1 and a3 its
/// candidates, a2 a member) and edge-b (b1 its gateway, b2 a member), each edge site behind
/// its own NAT router.
pub const CLUSTER: [Spec<'static>; 7] = [
    ("c1", "cloud", "198.51.100.1", "198.18.1.0/24", true),
    ("c2", "cloud", "198.51.100.2", "198.18.2.0/24", false),
    ("a1", "edge-a", "192.0.2.1", "198.18.11.0/24", true),
    ("a2", "edge-a", "192.0.2.2", "198.18.12.0/24", false),
    ("a3", "edge-a", "192.0.2.3", "198.18.13.0/24", true),
    ("b1", "edge-b", "192.0.2.129", "198.18.21.0/24", true),
    ("b2", "edge-b", "192.0.2.130", "198.18.22.0/24", false),
];

impl World {
    /// The cluster `specs` with the shipped settings (the cloud named as the relay), routers
    /// A and B of NAT kinds `a` and `b`, every node started with the API up.
    pub fn new(seed: u64, specs: &[Spec<'_>], a: Nat, b: Nat) -> World {
        let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary dir: {e}"));
        let mut obj = serde_json::Map::new();
        obj.insert("sites".into(), serde_json::json!({"relays": ["cloud"]}));
        let sites = sticky_overlay::sites::parse(&obj)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("the shipped sites config"));
        let mut net = Net::default();
        net.routers
            .insert("edge-a".into(), Router::new(ip("203.0.113.1"), a));
        net.routers
            .insert("edge-b".into(), Router::new(ip("203.0.113.2"), b));
        let mut world = World {
            rng: ChaCha8Rng::seed_from_u64(seed),
            t: Duration::ZERO,
            mono: Instant::now(),
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            net,
            nodes: BTreeMap::new(),
            sites,
            api: Vec::new(),
            api_version: 1,
            api_up: true,
            next_session: 0,
            _keys: keys,
        };
        for spec in specs {
            world.add(spec);
        }
        world
    }

    /// Node `name`'s agent as it starts: the shipped settings, its key dir, `device`.
    fn fresh_core(&self, name: &str, device: &SimDevice) -> Core<SimDevice> {
        let keys = KeyDir::new(
            self._keys.path().join(name),
            nix::unistd::geteuid().as_raw(),
        );
        let side = Side::new(self.sites.interface.clone(), 1408, keys, device.clone());
        Core::new(Shaper::new(name, &self.sites), side, self.sites.probe_port)
    }

    fn add(&mut self, &(name, site, underlay, pod, gateway): &Spec<'_>) {
        let dir = self._keys.path().join(name);
        let _ = std::fs::create_dir_all(&dir);
        let keys = KeyDir::new(dir, nix::unistd::geteuid().as_raw());
        let mut input = NodeInput {
            name: name.into(),
            pod_cidrs: vec![net(pod)],
            underlay: Some(ip(underlay)),
            ..NodeInput::default()
        };
        input
            .labels
            .insert(DEFAULT_SITE_LABEL.into(), site.to_string());
        if gateway {
            let key = keys
                .load_or_create("stickywg0.key")
                .unwrap_or_else(|e| panic!("{name}'s key: {e}"));
            input
                .labels
                .insert(DEFAULT_GATEWAY_LABEL.into(), "true".into());
            input
                .annotations
                .insert(PUBLIC_KEY_ANNOTATION.into(), key.public_key().to_base64());
            if !self.net.routers.contains_key(site) {
                let ep = SocketAddr::new(ip(underlay), self.sites.listen_port);
                input
                    .annotations
                    .insert(ENDPOINT_ANNOTATION.into(), ep.to_string());
            }
        }
        self.api.push(input);
        let host = Host {
            node: name.into(),
            site: site.into(),
            up: true,
        };
        self.net.hosts.insert(ip(underlay), host);
        let device = SimDevice::default();
        device.wg.borrow_mut().running = gateway;
        let core = self.fresh_core(name, &device);
        let node = SimNode {
            site: site.into(),
            underlay: ip(underlay),
            pod: net(pod),
            running: true,
            core,
            tracker: Tracker::new(),
            device,
            log: Vec::new(),
            api_seen: 0,
            probed: None,
            status: None,
            started: TICK * self.rng.random_range(0..4u32),
        };
        self.nodes.insert(name.into(), node);
    }

    fn now(&self) -> Now {
        Now {
            mono: self.mono + self.t,
            wall: self.wall + self.t,
        }
    }

    /// Runs the cluster for `d` of simulated time.
    pub fn run(&mut self, d: Duration) {
        let end = self.t + d;
        while self.t < end {
            self.tick();
            self.t += TICK;
        }
    }

    /// Runs until `ok` holds (checked every second), at most `d`; the time it took.
    pub fn run_until(
        &mut self,
        d: Duration,
        mut ok: impl FnMut(&mut World) -> bool,
    ) -> Option<Duration> {
        let start = self.t;
        while self.t - start <= d {
            if self.t.subsec_millis() == 0 && ok(self) {
                return Some(self.t - start);
            }
            self.tick();
            self.t += TICK;
        }
        None
    }

    fn tick(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for n in &names {
            self.probe(n);
        }
        if self.api_up {
            self.publish();
        }
        for n in &names {
            self.agent(n);
        }
        for n in &names {
            self.tunnel(n);
        }
    }

    /// One probe round of node `n` (every [`probe::INTERVAL`]).
    fn probe(&mut self, n: &str) {
        let now = self.now().mono;
        let Some(node) = self.nodes.get_mut(n).filter(|x| x.running) else {
            return;
        };
        if self.t < node.started || node.probed.is_some_and(|t| self.t - t < probe::INTERVAL) {
            return;
        }
        node.probed = Some(self.t);
        let aim = node.core.aim();
        node.tracker
            .set_peers(aim.targets.keys().map(String::as_str));
        let rng = &mut self.rng;
        let sends = node.tracker.round(now, || rng.random());
        let from = SocketAddr::new(node.underlay, self.sites.probe_port);
        let mut replies = Vec::new();
        for (peer, nonce) in sends {
            let Some(to) = aim.targets.get(&peer) else {
                continue;
            };
            let Some((got, _)) = self.net.send(&mut self.rng, from, *to) else {
                continue;
            };
            let Some(answerer) = self.nodes.get(&got).filter(|x| x.running) else {
                continue;
            };
            let active = answerer.core.aim().active;
            if self.net.send(&mut self.rng, *to, from).is_some() {
                replies.push(Message {
                    reply: true,
                    nonce,
                    name: got,
                    active,
                });
            }
        }
        if let Some(node) = self.nodes.get_mut(n) {
            for r in &replies {
                node.tracker.answered(r);
            }
        }
    }

    /// The API takes what the agents publish: the NAT discovery annotation of the reachable
    /// gateways.
    fn publish(&mut self) {
        for (name, node) in &self.nodes {
            if !node.running {
                continue;
            }
            let observed = node
                .core
                .side
                .observed_endpoints()
                .filter(|m| !m.is_empty())
                .map(sticky_sites::discovery::format);
            let Some(input) = self.api.iter_mut().find(|i| &i.name == name) else {
                continue;
            };
            let was = input.annotations.get(OBSERVED_ENDPOINTS_ANNOTATION);
            if let Some(o) = observed
                && was != Some(&o)
            {
                input
                    .annotations
                    .insert(OBSERVED_ENDPOINTS_ANNOTATION.into(), o);
                self.api_version += 1;
            }
        }
    }

    /// One pass of node `n`'s main loop: what the probes saw, the plan again when it or the
    /// API's Nodes changed, a round when one is due.
    fn agent(&mut self, n: &str) {
        let now = self.now();
        let (api_up, version, t) = (self.api_up, self.api_version, self.t);
        let api = &self.api;
        let Some(node) = self
            .nodes
            .get_mut(n)
            .filter(|x| x.running && t >= x.started)
        else {
            return;
        };
        let (seen, mut lines) = node
            .core
            .observe(node.tracker.liveness(), &node.tracker.choices());
        if api_up && (seen.is_some() || node.api_seen != version) {
            node.api_seen = version;
            lines.extend(node.core.recompute(api.clone()));
        } else if seen.is_some() {
            lines.extend(node.core.recompute_kept());
        }
        if let Some((more, status)) = node.core.round_if_due(now) {
            lines.extend(more);
            node.status = status;
        }
        node.log.extend(lines.into_iter().map(|l| (t, l)));
    }

    /// What node `n`'s `sticky-wg` sends this tick: handshakes, keepalives, the agent's nudges.
    fn tunnel(&mut self, n: &str) {
        let Some(node) = self.nodes.get(n) else {
            return;
        };
        let wg = node.device.wg.clone();
        let nudges: Vec<SocketAddr> = node.device.nudges.borrow_mut().drain(..).collect();
        for to in nudges {
            let key = wg.borrow().route(to.ip());
            if let Some(key) = key
                && let Some((_, s)) = wg.borrow_mut().peer(&key)
            {
                s.pending = true;
            }
        }
        let keys: Vec<_> = {
            let w = wg.borrow();
            if !w.running || w.state.public_key.is_none() {
                return;
            }
            w.state.peers.iter().map(|p| p.public_key).collect()
        };
        for key in keys {
            self.peer_timers(n, &wg, key);
        }
    }

    /// WireGuard's timers for one peer of node `n` (see [`wg`]).
    fn peer_timers(&mut self, n: &str, wg: &Rc<RefCell<Wg>>, key: sticky_sites::keys::PublicKey) {
        let t = self.t;
        let (handshake, keepalive) = {
            let mut w = wg.borrow_mut();
            let Some((p, s)) = w.peer(&key) else {
                return;
            };
            if s.id.is_some_and(|(_, at)| t - at > REJECT_AFTER) {
                s.id = None;
            }
            let wants = p.keepalive_secs.is_some() || s.pending;
            let stale = s.id.is_none_or(|(_, at)| t - at >= REKEY_AFTER)
                || s.unanswered_since.is_some_and(|u| t - u >= NEW_HANDSHAKE);
            let retry = s.last_init.is_none_or(|i| t - i >= REKEY_TIMEOUT);
            let handshake = p.endpoint.is_some() && wants && stale && retry;
            let keepalive = p.keepalive_secs.map(|k| Duration::from_secs(u64::from(k)));
            let due = s.id.is_some()
                && (s.pending || keepalive.is_some_and(|k| s.last_sent.is_none_or(|l| t - l >= k)));
            if handshake {
                s.last_init = Some(t);
            }
            (handshake, due)
        };
        if handshake {
            self.handshake(n, wg, key);
        } else if keepalive {
            let _ = self.transport(n, wg, key, 32);
            if let Some((_, s)) = wg.borrow_mut().peer(&key) {
                s.pending = false;
            }
        }
    }

    /// The address node `n`'s tunnel sends from.
    fn tunnel_addr(&self, n: &str) -> Option<SocketAddr> {
        let node = self.nodes.get(n)?;
        let port = node.device.wg.borrow().state.listen_port;
        Some(SocketAddr::new(node.underlay, port))
    }

    /// Node `n` initiates a handshake with its peer `key`: it takes when the initiation reaches
    /// a device with that key that knows `n`'s, and the response comes back.
    fn handshake(&mut self, n: &str, wg: &Rc<RefCell<Wg>>, key: sticky_sites::keys::PublicKey) {
        let (to, mine) = {
            let w = wg.borrow();
            let p = w.state.peers.iter().find(|p| p.public_key == key);
            match (p.and_then(|p| p.endpoint), w.state.public_key) {
                (Some(to), Some(mine)) => (to, mine),
                _ => return,
            }
        };
        let Some((m, seen)) = self.send_datagram(n, to, &message(1, 148)) else {
            return;
        };
        let Some(other) = self.nodes.get(&m).map(|x| x.device.wg.clone()) else {
            return;
        };
        {
            let o = other.borrow();
            if !o.running || o.state.public_key != Some(key) {
                return;
            }
            if !o.state.peers.iter().any(|p| p.public_key == mine) {
                return;
            }
        }
        if self
            .send_datagram(&m, seen, &message(2, 92))
            .map(|(r, _)| r)
            .as_deref()
            != Some(n)
        {
            return;
        }
        self.next_session += 1;
        let id = Some((self.next_session, self.t));
        let at = self.wall + self.t;
        if let Some((q, s)) = other.borrow_mut().peer(&mine) {
            q.last_handshake = Some(at);
            q.endpoint = Some(seen);
            q.rx_bytes += 148;
            q.tx_bytes += 92;
            *s = wg::Session {
                id,
                last_sent: Some(self.t),
                ..wg::Session::default()
            };
        }
        if let Some((p, s)) = wg.borrow_mut().peer(&key) {
            p.last_handshake = Some(at);
            p.rx_bytes += 92;
            p.tx_bytes += 148;
            let pending = s.pending;
            *s = wg::Session {
                id,
                last_init: s.last_init,
                pending,
                ..wg::Session::default()
            };
        }
    }

    /// Node `n` sends `bytes` to its peer `key` on their session: the node whose device takes
    /// it (same session). The receiver's endpoint for `n` roams to where it came from.
    fn transport(
        &mut self,
        n: &str,
        wg: &Rc<RefCell<Wg>>,
        key: sticky_sites::keys::PublicKey,
        bytes: u64,
    ) -> Option<String> {
        let t = self.t;
        let (to, id, mine) = {
            let mut w = wg.borrow_mut();
            let mine = w.state.public_key;
            let (p, s) = w.peer(&key)?;
            p.tx_bytes += bytes;
            s.last_sent = Some(t);
            if bytes > 32 {
                s.unanswered_since.get_or_insert(t);
            }
            match (p.endpoint, s.id, mine) {
                (Some(to), Some(id), Some(mine)) => (to, id, mine),
                _ => {
                    s.pending = true;
                    return None;
                }
            }
        };
        let (m, seen) = self.send_datagram(n, to, &message(4, bytes as usize))?;
        let other = self.nodes.get(&m)?.device.wg.clone();
        let mut o = other.borrow_mut();
        if !o.running || o.state.public_key != Some(key) {
            return None;
        }
        let (q, s) = o.peer(&mine)?;
        if s.id.map(|(i, _)| i) != Some(id.0) {
            return None;
        }
        q.rx_bytes += bytes;
        q.endpoint = Some(seen);
        s.unanswered_since = None;
        Some(m)
    }

    /// The relay rules' table of node `n`'s device (`sticky_sites::relay`), as its sticky-wg
    /// builds it: its peers at their current endpoints, the candidates it learned.
    fn table_of(&self, n: &str) -> Option<Table> {
        let wg = self.nodes.get(n)?.device.wg.clone();
        let w = wg.borrow();
        if !w.running {
            return None;
        }
        let peers = w.state.peers.iter().map(|p| (p.public_key, p.endpoint));
        Some(Table::new(peers, &w.candidates))
    }

    /// Node `n`'s sticky-wg sends `message` to `to` as its transport does: a real endpoint
    /// over the network; a relayed one through the relay it names (and, punching, directly to
    /// the candidate too: the first copy to arrive is the one taken). The node that takes it
    /// and where its WireGuard sees it come from.
    fn send_datagram(
        &mut self,
        n: &str,
        to: SocketAddr,
        message: &[u8],
    ) -> Option<(String, SocketAddr)> {
        let from = self.tunnel_addr(n)?;
        let out = match self.table_of(n)?.outbound(&to, message) {
            None => return self.net.send(&mut self.rng, from, to),
            Some(Err(_)) => return None,
            Some(Ok(out)) => out,
        };
        let direct = out
            .direct
            .and_then(|c| self.net.send(&mut self.rng, from, c));
        let relayed = out
            .relay
            .and_then(|(at, header)| self.through_relay(from, at, header.as_bytes(), message));
        direct.or(relayed)
    }

    /// A datagram with relay header `header` from `from` to the relay at `at`: forwarded by
    /// the relay's rules, delivered by the receiver's (which learns the sender's candidate).
    fn through_relay(
        &mut self,
        from: SocketAddr,
        at: SocketAddr,
        header: &[u8],
        message: &[u8],
    ) -> Option<(String, SocketAddr)> {
        let (r, seen) = self.net.send(&mut self.rng, from, at)?;
        let Inbound::Forward { to, header } = self
            .table_of(&r)?
            .inbound(&[header, message].concat(), seen)
        else {
            return None;
        };
        let r_from = self.tunnel_addr(&r)?;
        let (b, seen) = self.net.send(&mut self.rng, r_from, to)?;
        let Inbound::Deliver { from, seen, .. } = self
            .table_of(&b)?
            .inbound(&[header.as_bytes(), message].concat(), seen)
        else {
            return None;
        };
        if let Some((id, addr)) = seen {
            self.nodes
                .get(&b)?
                .device
                .wg
                .borrow_mut()
                .candidates
                .insert(id, addr);
        }
        Some((b, from))
    }

    /// Whether a packet from a pod on node `from` reaches a pod on node `to`: the member's
    /// route to its site's gateway, then tunnel hops (a relay forwards once more).
    fn forward(&mut self, from: &str, to: &str) -> bool {
        let (Some(src), Some(dst)) = (self.nodes.get(from), self.nodes.get(to)) else {
            return false;
        };
        let (src_site, dst_site, dst_ip, src_ip) = (
            src.site.clone(),
            dst.site.clone(),
            pod_ip(dst.pod),
            pod_ip(src.pod),
        );
        let up = |w: &World, n: &str| w.net.hosts.values().any(|h| h.node == n && h.up);
        if !up(self, from) || !up(self, to) {
            return false;
        }
        if src_site == dst_site {
            return true;
        }
        let gateway = if src
            .device
            .wg
            .borrow()
            .routes
            .iter()
            .any(|r| r.contains(&dst_ip))
        {
            from.to_string()
        } else {
            let Some(shaped) = src.core.side.shaped() else {
                return false;
            };
            match &shaped.plan.route_via {
                Some(v) if v.subnets.iter().any(|s| s.contains(&dst_ip)) => v.gateway.clone(),
                _ => return false,
            }
        };
        if !up(self, &gateway) {
            return false;
        }
        let mut at = gateway;
        for _ in 0..3 {
            let Some(next) = self.hop(&at, dst_ip, src_ip) else {
                return false;
            };
            let Some(node) = self.nodes.get(&next) else {
                return false;
            };
            if node.site == dst_site {
                return true;
            }
            at = next;
        }
        false
    }

    /// One tunnel hop from gateway `at` towards `dst` (a packet from `src`): the node whose
    /// device takes it.
    fn hop(&mut self, at: &str, dst: IpAddr, src: IpAddr) -> Option<String> {
        let wg = self.nodes.get(at)?.device.wg.clone();
        let key = {
            let w = wg.borrow();
            if !w.running || !w.routes.iter().any(|r| r.contains(&dst)) {
                return None;
            }
            w.route(dst)?
        };
        let m = self.transport(at, &wg, key, 100)?;
        // The receiver's source check: the packet's source is in its peer's allowed IPs.
        let mine = wg.borrow().state.public_key?;
        let other = self.nodes.get(&m)?.device.wg.clone();
        let o = other.borrow();
        let q = o.state.peers.iter().find(|p| p.public_key == mine)?;
        q.allowed_ips.iter().any(|n| n.contains(&src)).then_some(m)
    }

    /// A ping from a pod on `from` to one on `to` and back.
    pub fn ping(&mut self, from: &str, to: &str) -> bool {
        self.forward(from, to) && self.forward(to, from)
    }

    /// Cuts or restores node `n`'s link.
    pub fn link(&mut self, n: &str, up: bool) {
        for h in self.net.hosts.values_mut().filter(|h| h.node == n) {
            h.up = up;
        }
    }

    /// Restarts node `n`: its `sticky-wg` with an empty device, its agent from what it kept
    /// (the cache), with a fresh probe tracker.
    pub fn restart(&mut self, n: &str) {
        let Some(node) = self.nodes.get_mut(n) else {
            return;
        };
        let gateway = node.device.wg.borrow().running;
        if gateway {
            node.device.wg.borrow_mut().restart();
        }
        let kept = node.core.kept().map(|(i, c)| (i.to_vec(), c.clone()));
        let device = node.device.clone();
        let core = self.fresh_core(n, &device);
        let Some(node) = self.nodes.get_mut(n) else {
            return;
        };
        node.core = core;
        node.tracker = Tracker::new();
        node.probed = None;
        node.api_seen = 0;
        if let Some((inputs, current)) = kept
            && let Ok(lines) = node.core.start_from(&inputs, &current)
        {
            node.log.extend(lines.into_iter().map(|l| (self.t, l)));
        }
        node.log.push((self.t, "(restarted)".into()));
    }

    /// The active gateway node `n` has for its site.
    pub fn active(&self, n: &str) -> Option<String> {
        let shaped = self.nodes.get(n)?.core.side.shaped()?;
        shaped.plan.actives.get(&shaped.plan.site).cloned()
    }

    /// A gateway's peer that carries another site's pod subnets than its own (what a relay
    /// that decrypts has): `None` when every peer of every device carries only its own
    /// site's, so that no relay can read what it forwards.
    pub fn relay_reads(&self) -> Option<String> {
        let site_of_key: BTreeMap<_, &str> = self
            .nodes
            .values()
            .filter_map(|n| Some((n.device.wg.borrow().state.public_key?, n.site.as_str())))
            .collect();
        for (name, node) in &self.nodes {
            let wg = node.device.wg.borrow();
            for p in &wg.state.peers {
                let Some(site) = site_of_key.get(&p.public_key) else {
                    continue;
                };
                let foreign = p.allowed_ips.iter().find(|net| {
                    !self
                        .nodes
                        .values()
                        .any(|n| n.site == *site && n.pod == **net)
                });
                if let Some(net) = foreign {
                    return Some(format!(
                        "{name}'s peer for site {site} carries {net}, not of that site"
                    ));
                }
            }
        }
        None
    }

    /// What node `n`'s status says of remote site `site`'s path.
    pub fn path(&self, n: &str, site: &str) -> Option<String> {
        let status = self.nodes.get(n)?.status.as_ref()?;
        let remote = status.remotes.iter().find(|r| r.site == site)?;
        Some(remote.path.clone())
    }

    /// Every node's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, node) in &self.nodes {
            for (t, l) in &node.log {
                out.push_str(&format!("{:>8.1} {name}: {l}\n", t.as_secs_f64()));
            }
        }
        out
    }
}

/// A WireGuard message of type `t` and `len` bytes, as the relay rules read it.
fn message(t: u8, len: usize) -> Vec<u8> {
    let mut m = vec![0; len.max(32)];
    m[0] = t;
    m
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A pod's address in subnet `n`.
fn pod_ip(n: IpNet) -> IpAddr {
    match n {
        IpNet::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()) + 2)),
        IpNet::V6(v6) => IpAddr::V6(v6.network()),
    }
}
