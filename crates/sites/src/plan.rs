//! What THIS node does about sites, from the whole model, its own name and what it observes:
//! a pure function, deterministic (maps, sorted output), O((nodes + sites) log n).
//!
//! - Every node: its site's members (the only nodes its VXLAN peers file should hold: VXLAN
//!   never crosses sites), every site's active gateway ([`crate::gateway`], to keep as
//!   `current` in the last-good file) and the path to each remote site ([`crate::paths`]).
//! - A node that is not its site's active gateway (a plain node or a standby gateway): the
//!   pod subnets of every remote site that has a path ([`RouteVia`]), to be carried as extra
//!   subnets by the active gateway's entry in the VXLAN peers file; the exec path needs
//!   nothing new. Unreachable sites are not routed (no black hole behind the gateway).
//! - The active gateway: its WireGuard peers ([`GatewayPlan`]): one per site it talks to (a
//!   direct path, a punch, or through the relay), allowed IPs = that site's pod subnets and
//!   never another's; endpoint = what the path dials, or for a site reached through the relay
//!   a relayed endpoint naming it ([`crate::relay`]: the relay only forwards the two sites' own
//!   session, punching meanwhile when the path is a punch); a punch with no relay to carry
//!   meanwhile is a peer with no allowed IPs (handshakes only). Keepalive
//!   ([`Settings::keepalive_secs`]) on every direct peer when this gateway has no endpoint
//!   (behind NAT: its mappings must stay open); every second on punching and punched peers
//!   ([`PUNCH_KEEPALIVE_SECS`]); none on a peer reached only through the relay (the relay's own
//!   peer holds the way open). When this site is the relay, the sites it forwards between are
//!   listed with their subnets (those whose active gateway has no endpoint, when there are two
//!   or more); forwarding needs no extra peers: each of them is already a direct peer.
//!
//! The caller's liveness view should mark this node itself alive. Pod subnets are assumed
//! already checked for conflicts (the agent's table leaves a conflicting Node out before its
//! Node reaches [`crate::model::build`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use sticky_overlay::sites::{DEFAULT_KEEPALIVE_SECS, DEFAULT_LISTEN_PORT, Sites};

use crate::gateway::{self, Liveness};
use crate::keys::PublicKey;
use crate::model::{Candidate, Model, SiteName};
use crate::paths::{Discovery, Path, Router};
use crate::relay;
use crate::tunnel::PeerConfig;

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("node {0:?} is in no site (left out of the model, or unknown)")]
    NotInModel(String),
    #[error(transparent)]
    Gateway(#[from] gateway::Error),
}

/// What this node knows beyond the model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// Which gateway candidates this node sees alive.
    pub liveness: Liveness,
    /// The active gateway per site as last decided (kept in the last-good file).
    pub current: BTreeMap<SiteName, String>,
    /// NAT-mapped addresses and punched tunnels.
    pub discovery: Discovery,
}

/// The WireGuard keepalive of a punch peer, whatever `keepaliveSecs` says: a direct path is
/// checked every second. It costs a 32-byte message a second each way per punched pair, and it
/// is what lets the other site leave a dead direct path within seconds (a failover, a NAT
/// router reboot, a new WAN address; [`crate::punch::DEAD_AFTER`]): nothing else reaches it
/// while the cloud is away.
pub const PUNCH_KEEPALIVE_SECS: u16 = 1;

/// What the plan reads of the config's `sites` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub listen_port: u16,
    pub keepalive_secs: u16,
    /// The sites that may relay, in order of preference (`sites.relays`): none named, no
    /// site relays ([`Router`]).
    pub relays: Vec<SiteName>,
}

impl Settings {
    /// The settings `sites` names; a relay that is no site name is dropped (the config's
    /// check refuses it first).
    pub fn of(sites: &Sites) -> Self {
        Self {
            listen_port: sites.listen_port,
            keepalive_secs: sites.keepalive_secs,
            relays: sites
                .relays
                .iter()
                .filter_map(|r| SiteName::parse("relays", r).ok())
                .collect(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen_port: DEFAULT_LISTEN_PORT,
            keepalive_secs: DEFAULT_KEEPALIVE_SECS,
            relays: Vec::new(),
        }
    }
}

/// Remote subnets a non-gateway node sends to its site's active gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteVia {
    /// The active gateway's Node name.
    pub gateway: String,
    /// Its underlay address (its VXLAN peer entry), if known.
    pub underlay: Option<IpAddr>,
    /// Sorted, without repeats.
    pub subnets: Vec<IpNet>,
}

/// One WireGuard peer of the active gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePeer {
    /// The site whose active gateway this is.
    pub site: SiteName,
    /// That gateway's Node name.
    pub gateway: String,
    /// The relay gateway's key when this site's path has a relay (relayed, or a punch with a
    /// relay to carry meanwhile): while the relay carries, its endpoint is a relayed one.
    pub via: Option<PublicKey>,
    pub config: PeerConfig,
}

/// The active gateway's tunnel configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayPlan {
    pub public_key: PublicKey,
    pub listen_port: u16,
    /// By site name.
    pub peers: Vec<SitePeer>,
    /// When this site is the relay: the sites it forwards between, with the pod subnets it
    /// forwards for each (by site name; empty when it relays for nobody).
    pub relays_between: BTreeMap<SiteName, Vec<IpNet>>,
}

/// One remote site as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub site: SiteName,
    /// Its active gateway, if any.
    pub gateway: Option<String>,
    pub path: Path,
    /// Its pod subnets (sorted).
    pub subnets: Vec<IpNet>,
}

/// Everything this node does about sites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePlan {
    pub site: SiteName,
    /// This site's members (the VXLAN peers), sorted.
    pub local_members: Vec<String>,
    /// The active gateway of every site that has one.
    pub actives: BTreeMap<SiteName, String>,
    /// The other sites, by name.
    pub remotes: Vec<Remote>,
    /// Set when this node is not its site's active gateway and that gateway exists.
    pub route_via: Option<RouteVia>,
    /// Set when this node is its site's active gateway.
    pub gateway: Option<GatewayPlan>,
}

/// The plan of node `me` (see the module's rules).
pub fn plan(model: &Model, me: &str, view: &View, settings: &Settings) -> Result<SitePlan, Error> {
    let Some(my_site) = model.site_of.get(me) else {
        return Err(Error::NotInModel(me.to_string()));
    };
    let mut actives: BTreeMap<SiteName, &Candidate> = BTreeMap::new();
    for (name, site) in &model.sites {
        let current = view.current.get(name).map(String::as_str);
        if let Some(c) = gateway::active(&site.candidates, &view.liveness, current)? {
            actives.insert(name.clone(), c);
        }
    }
    let router = Router::new(&actives, &view.discovery, &settings.relays);
    let remotes: Vec<Remote> = model
        .sites
        .iter()
        .filter(|(name, _)| *name != my_site)
        .map(|(name, site)| Remote {
            site: name.clone(),
            gateway: actives.get(name).map(|c| c.name.clone()),
            path: router.path(my_site, name),
            subnets: site.subnets(),
        })
        .collect();
    let mine = actives.get(my_site).copied();
    let local_members = model
        .sites
        .get(my_site)
        .map(|s| s.members.keys().cloned().collect())
        .unwrap_or_default();
    let mut out = SitePlan {
        site: my_site.clone(),
        local_members,
        actives: actives
            .iter()
            .map(|(s, c)| (s.clone(), c.name.clone()))
            .collect(),
        remotes,
        route_via: None,
        gateway: None,
    };
    match mine {
        Some(g) if g.name == me => {
            out.gateway = Some(gateway_plan(g, &out.remotes, &actives, &router, settings));
        }
        Some(g) => {
            let subnets: BTreeSet<IpNet> = out
                .remotes
                .iter()
                .filter(|r| r.path.carried())
                .flat_map(|r| r.subnets.iter().copied())
                .collect();
            out.route_via = Some(RouteVia {
                gateway: g.name.clone(),
                underlay: g.underlay,
                subnets: subnets.into_iter().collect(),
            });
        }
        None => {}
    }
    Ok(out)
}

fn gateway_plan(
    me: &Candidate,
    remotes: &[Remote],
    actives: &BTreeMap<SiteName, &Candidate>,
    router: &Router<'_>,
    settings: &Settings,
) -> GatewayPlan {
    let behind_nat = me.endpoint.is_none();
    let peers = remotes
        .iter()
        .filter_map(|r| {
            let g = actives.get(&r.site)?;
            let how = Dial::of(&r.path)?;
            // The relay of this site's path, if it has one: punched and up too, so that the
            // punch can fall back to it ([`crate::punch::Punches::apply`]).
            let relay_site = match &r.path {
                Path::Relayed { via } => Some(via),
                Path::Punch { relay, .. } => relay.as_ref(),
                _ => None,
            };
            let via = relay_site
                .and_then(|v| actives.get(v))
                .map(|c| c.public_key);
            let endpoint = match (how, via) {
                (Dial::To(d), _) => d,
                (Dial::Punch(d), _) => Some(d),
                (Dial::Relayed { punch, .. }, Some(v)) => {
                    Some(relay::endpoint(&v, &g.public_key, punch))
                }
                (Dial::Relayed { .. }, None) => None,
            };
            let keepalive = match how {
                Dial::Punch(_) | Dial::Relayed { punch: true, .. } => Some(PUNCH_KEEPALIVE_SECS),
                // The way to the relay is held open by the relay's own peer.
                Dial::Relayed { punch: false, .. } => None,
                Dial::To(_) => behind_nat.then_some(settings.keepalive_secs),
            };
            // A peer that dials in: where this side saw it last, to dial it first after a
            // restart (see `PeerConfig::last_seen`).
            let last_seen = endpoint
                .is_none()
                .then(|| router.nat_mapped(&g.name))
                .flatten();
            let allowed_ips = if r.path.carried() {
                r.subnets.clone()
            } else {
                Vec::new()
            };
            Some(SitePeer {
                site: r.site.clone(),
                gateway: g.name.clone(),
                via,
                config: PeerConfig {
                    public_key: g.public_key,
                    endpoint,
                    allowed_ips,
                    keepalive_secs: keepalive,
                    last_seen,
                },
            })
        })
        .collect();
    GatewayPlan {
        public_key: me.public_key,
        listen_port: settings.listen_port,
        peers,
        relays_between: relays_between(me, remotes, actives, router),
    }
}

/// How this gateway reaches a peer site's gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dial<'a> {
    /// At this endpoint (none: the peer dials in).
    To(Option<std::net::SocketAddr>),
    /// At its NAT-mapped address, punched (up) or trying with no relay to carry meanwhile.
    Punch(std::net::SocketAddr),
    /// Through the relay site `via`'s gateway, which only forwards (`crate::relay`); punching
    /// meanwhile or not.
    Relayed { via: &'a SiteName, punch: bool },
}

impl<'a> Dial<'a> {
    /// How `path` is dialled; `None`: no tunnel with that site.
    fn of(path: &'a Path) -> Option<Dial<'a>> {
        Some(match path {
            Path::Direct { dial } => Dial::To(*dial),
            Path::Punch {
                relay: Some(via),
                up: false,
                ..
            } => Dial::Relayed { via, punch: true },
            Path::Punch { dial, .. } => Dial::Punch(*dial),
            Path::Relayed { via } => Dial::Relayed { via, punch: false },
            Path::Unreachable { .. } => return None,
        })
    }
}

/// On the relay site's active gateway: the sites behind NAT it forwards between (two at
/// least), with their subnets; empty elsewhere.
fn relays_between(
    me: &Candidate,
    remotes: &[Remote],
    actives: &BTreeMap<SiteName, &Candidate>,
    router: &Router<'_>,
) -> BTreeMap<SiteName, Vec<IpNet>> {
    let my_site_is_relay = router
        .relay()
        .and_then(|s| actives.get(s))
        .is_some_and(|c| c.name == me.name);
    if !my_site_is_relay {
        return BTreeMap::new();
    }
    let between: BTreeMap<SiteName, Vec<IpNet>> = remotes
        .iter()
        .filter(|r| actives.get(&r.site).is_some_and(|c| c.endpoint.is_none()))
        .map(|r| (r.site.clone(), r.subnets.clone()))
        .collect();
    // Forwarding between sites needs two of them.
    if between.len() < 2 {
        return BTreeMap::new();
    }
    between
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gateway::Seen;
    use crate::model::tests::SITE_LABEL;
    use crate::model::tests::node;
    use crate::model::{Holders, NodeInput, SiteConfig, build};
    use proptest::prelude::*;

    fn site(s: &str) -> SiteName {
        SiteName::parse(SITE_LABEL, s).unwrap()
    }

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn key(n: u8) -> PublicKey {
        PublicKey([n; 32])
    }

    /// cloud: 2 nodes, gateway c-gw with an endpoint; edge a: gateways a-gw1, a-gw2 (standby)
    /// and a plain node; edge b: gateway b-gw and a plain node; site d: no gateway.
    fn cluster() -> Vec<NodeInput> {
        let mut v = vec![
            node(
                "c-gw",
                Some("cloud"),
                "10.0.0.0/24",
                Some((1, Some("203.0.113.1:51820"))),
            ),
            node("c-n", Some("cloud"), "10.0.1.0/24", None),
            node("a-gw1", Some("edge-a"), "10.1.0.0/24", Some((2, None))),
            node("a-gw2", Some("edge-a"), "10.1.1.0/24", Some((3, None))),
            node("a-n", Some("edge-a"), "10.1.2.0/24", None),
            node("b-gw", Some("edge-b"), "10.2.0.0/24", Some((4, None))),
            node("b-n", Some("edge-b"), "10.2.1.0/24", None),
            node("d-n", Some("site-d"), "10.3.0.0/24", None),
        ];
        for (i, n) in v.iter_mut().enumerate() {
            n.underlay = Some(format!("192.0.2.{}", i + 1).parse().unwrap());
        }
        v
    }

    /// The shipped settings with the cloud site named as the relay.
    pub(crate) fn cloud_relays() -> Settings {
        Settings {
            relays: vec![site("cloud")],
            ..Settings::default()
        }
    }

    fn plan_of(nodes: &[NodeInput], me: &str, view: &View) -> SitePlan {
        plan(
            &build(nodes, &SiteConfig::default(), &Holders::default()),
            me,
            view,
            &cloud_relays(),
        )
        .unwrap()
    }

    #[test]
    fn plain_node_routes_reachable_remote_subnets_to_its_gateway() {
        let p = plan_of(&cluster(), "a-n", &View::default());
        assert_eq!(p.site, site("edge-a"));
        assert_eq!(p.local_members, ["a-gw1", "a-gw2", "a-n"]);
        assert_eq!(p.actives[&site("edge-a")], "a-gw1");
        assert!(!p.actives.contains_key(&site("site-d")));
        assert!(p.gateway.is_none());
        let r = p.route_via.unwrap();
        assert_eq!(r.gateway, "a-gw1");
        assert_eq!(r.underlay, Some("192.0.2.3".parse().unwrap()));
        // cloud (direct) and edge-b (relayed through cloud); site-d unreachable: not routed.
        assert_eq!(
            r.subnets,
            nets(&["10.0.0.0/24", "10.0.1.0/24", "10.2.0.0/24", "10.2.1.0/24"])
        );
        let paths: Vec<_> = p
            .remotes
            .iter()
            .map(|r| (r.site.as_str(), &r.path))
            .collect();
        assert!(matches!(
            paths[0],
            ("cloud", Path::Direct { dial: Some(_) })
        ));
        assert!(matches!(paths[1], ("edge-b", Path::Relayed { .. })));
        assert!(matches!(paths[2], ("site-d", Path::Unreachable { .. })));
    }

    #[test]
    fn standby_gateway_is_a_plain_node() {
        let p = plan_of(&cluster(), "a-gw2", &View::default());
        assert!(p.gateway.is_none());
        assert_eq!(p.route_via.unwrap().gateway, "a-gw1");
    }

    /// Edge A's gateway: the cloud at its endpoint with the cloud's subnets; edge B's gateway
    /// through the cloud, which only forwards: B's own peer, at the relayed endpoint, carries
    /// B's subnets (the relay cannot read them).
    #[test]
    fn edge_gateway_peers_with_the_relay_and_through_it_with_the_other_edge() {
        let p = plan_of(&cluster(), "a-gw1", &View::default());
        assert!(p.route_via.is_none());
        let g = p.gateway.unwrap();
        assert_eq!(g.public_key, key(2));
        assert_eq!(g.listen_port, DEFAULT_LISTEN_PORT);
        assert!(g.relays_between.is_empty());
        assert_eq!(g.peers.len(), 2);
        let c = &g.peers[0];
        assert_eq!((c.site.as_str(), c.gateway.as_str()), ("cloud", "c-gw"));
        assert_eq!(c.config.public_key, key(1));
        assert_eq!(c.via, None);
        assert_eq!(
            c.config.endpoint,
            Some("203.0.113.1:51820".parse().unwrap())
        );
        assert_eq!(c.config.allowed_ips, nets(&["10.0.0.0/24", "10.0.1.0/24"]));
        assert_eq!(c.config.keepalive_secs, Some(DEFAULT_KEEPALIVE_SECS)); // behind NAT
        let b = &g.peers[1];
        assert_eq!((b.site.as_str(), b.gateway.as_str()), ("edge-b", "b-gw"));
        assert_eq!(b.config.public_key, key(4));
        assert_eq!(b.via, Some(key(1)));
        assert_eq!(
            b.config.endpoint,
            Some(relay::endpoint(&key(1), &key(4), false))
        );
        assert_eq!(b.config.allowed_ips, nets(&["10.2.0.0/24", "10.2.1.0/24"]));
        // The way to the relay is held open by the relay's own peer.
        assert_eq!(b.config.keepalive_secs, None);
    }

    #[test]
    fn cloud_gateway_is_the_relay() {
        let p = plan_of(&cluster(), "c-gw", &View::default());
        let g = p.gateway.unwrap();
        let relayed: Vec<_> = g
            .relays_between
            .iter()
            .map(|(s, n)| (s.as_str(), n.clone()))
            .collect();
        assert_eq!(
            relayed,
            vec![
                (
                    "edge-a",
                    nets(&["10.1.0.0/24", "10.1.1.0/24", "10.1.2.0/24"])
                ),
                ("edge-b", nets(&["10.2.0.0/24", "10.2.1.0/24"])),
            ]
        );
        let peers: Vec<_> = g
            .peers
            .iter()
            .map(|p| {
                (
                    p.site.as_str(),
                    p.config.endpoint,
                    p.config.allowed_ips.clone(),
                    p.config.keepalive_secs,
                )
            })
            .collect();
        assert_eq!(
            peers,
            vec![
                (
                    "edge-a",
                    None,
                    nets(&["10.1.0.0/24", "10.1.1.0/24", "10.1.2.0/24"]),
                    None
                ),
                ("edge-b", None, nets(&["10.2.0.0/24", "10.2.1.0/24"]), None),
            ]
        );
        // The cloud's plain node routes both edges to its gateway.
        let n = plan_of(&cluster(), "c-n", &View::default())
            .route_via
            .unwrap();
        assert_eq!(n.subnets.len(), 5);
    }

    /// A gateway plan's peers by site name.
    fn by_site(g: &GatewayPlan) -> BTreeMap<&str, &PeerConfig> {
        g.peers
            .iter()
            .map(|p| (p.site.as_str(), &p.config))
            .collect()
    }

    /// A punch with the relay to carry meanwhile: the remote gateway's one peer carries its
    /// subnets through the relay, punching; once up, at the mapped address. The relay's peer
    /// carries only its own site's subnets either way.
    #[test]
    fn a_punch_goes_through_the_relay_until_up_then_direct_on_the_same_peer() {
        let mut view = View::default();
        view.discovery
            .nat_mapped
            .insert("a-gw1".into(), "198.51.100.10:51820".parse().unwrap());
        view.discovery
            .nat_mapped
            .insert("b-gw".into(), "198.51.100.11:40001".parse().unwrap());
        let g = plan_of(&cluster(), "a-gw1", &view).gateway.unwrap();
        let by = by_site(&g);
        assert_eq!(
            by["edge-b"].endpoint,
            Some(relay::endpoint(&key(1), &key(4), true))
        );
        let b_subnets = nets(&["10.2.0.0/24", "10.2.1.0/24"]);
        assert_eq!(by["edge-b"].allowed_ips, b_subnets);
        // The punch is checked every second; the relay's keeps the NAT mapping open.
        assert_eq!(by["edge-b"].keepalive_secs, Some(PUNCH_KEEPALIVE_SECS));
        assert_eq!(by["cloud"].keepalive_secs, Some(DEFAULT_KEEPALIVE_SECS));
        let cloud_subnets = nets(&["10.0.0.0/24", "10.0.1.0/24"]);
        assert_eq!(by["cloud"].allowed_ips, cloud_subnets);
        view.discovery.punched.insert(site("edge-b"));
        let g = plan_of(&cluster(), "a-gw1", &view).gateway.unwrap();
        let by = by_site(&g);
        assert_eq!(
            by["edge-b"].endpoint,
            Some("198.51.100.11:40001".parse().unwrap())
        );
        assert_eq!(by["edge-b"].allowed_ips, b_subnets);
        assert_eq!(by["cloud"].allowed_ips, cloud_subnets);
    }

    #[test]
    fn failover_moves_routes_and_peers_to_the_standby() {
        let mut view = View::default();
        view.liveness.insert("a-gw1".into(), Seen::Dead);
        view.current.insert(site("edge-a"), "a-gw1".into());
        let p = plan_of(&cluster(), "a-n", &view);
        assert_eq!(p.actives[&site("edge-a")], "a-gw2");
        assert_eq!(p.route_via.unwrap().gateway, "a-gw2");
        assert!(plan_of(&cluster(), "a-gw2", &view).gateway.is_some());
        let c = plan_of(&cluster(), "c-gw", &view).gateway.unwrap();
        assert_eq!(c.peers[0].config.public_key, key(3));
        // a-gw1 back: a-gw2 stays (current kept).
        view.liveness.insert("a-gw1".into(), Seen::Alive);
        view.current.insert(site("edge-a"), "a-gw2".into());
        assert_eq!(
            plan_of(&cluster(), "a-n", &view).actives[&site("edge-a")],
            "a-gw2"
        );
    }

    #[test]
    fn one_site_cluster_has_nothing_to_route() {
        let nodes = [
            node("n1", None, "10.0.1.0/24", None),
            node("n2", None, "10.0.2.0/24", None),
        ];
        let p = plan_of(&nodes, "n1", &View::default());
        assert!(p.remotes.is_empty() && p.route_via.is_none() && p.gateway.is_none());
        assert_eq!(p.local_members, ["n1", "n2"]);
    }

    #[test]
    fn left_out_node_has_no_plan() {
        let m = build(&cluster(), &SiteConfig::default(), &Holders::default());
        assert_eq!(
            plan(&m, "nobody", &View::default(), &Settings::default()),
            Err(Error::NotInModel("nobody".into()))
        );
    }

    proptest! {
        /// The plan of every node is the same whatever order the Nodes arrive in.
        #[test]
        fn plan_ignores_node_order(
            order in Just((0..8).collect::<Vec<usize>>()).prop_shuffle(),
            dead in proptest::collection::vec(any::<bool>(), 4),
        ) {
            let nodes = cluster();
            let shuffled: Vec<NodeInput> = order.iter().map(|&i| nodes[i].clone()).collect();
            let mut view = View::default();
            for (g, d) in ["c-gw", "a-gw1", "a-gw2", "b-gw"].iter().zip(&dead) {
                view.liveness.insert((*g).into(), if *d { Seen::Dead } else { Seen::Alive });
            }
            for n in &nodes {
                prop_assert_eq!(plan_of(&nodes, &n.name, &view), plan_of(&shuffled, &n.name, &view));
            }
        }
    }
}
