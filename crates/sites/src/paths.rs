//! How traffic flows between two sites, from their active gateways (issue 28's direct and
//! relayed paths, issue 29's hole punching).
//!
//! For a local site L and a remote site R with active gateways gL and gR:
//! 1. No active gateway on either side: [`Path::Unreachable`].
//! 2. gR has an endpoint: [`Path::Direct`] dialing it (gL's endpoint, if any, is dialed by R).
//!    Only gL has one: `Direct { dial: None }`: R dials in, and L's side learns R's address
//!    from R's first handshake.
//! 3. Neither has an endpoint, and both have an observed NAT-mapped address (what a reachable
//!    gateway saw them come from): [`Path::Punch`] at R's mapped address, with the relay below
//!    as fallback until a direct handshake is observed (`up`).
//! 4. Neither has an endpoint: [`Path::Relayed`] through the relay site: the first site the
//!    config names as a relay (`sites.relays`) whose active gateway has an endpoint (both
//!    sides can dial it). A site the config does not name never relays, whatever its Nodes'
//!    labels say (docs/sites.md, "Trust"). L and R cannot be it (they have none), so every
//!    pair that needs a relay uses the same one, which every node computes alike from the
//!    same actives. No such site: unreachable.
//!
//! Every function is O(1) per pair after [`Router::new`] (O(sites)).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::model::{Candidate, SiteName};

/// Why a remote site cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreachable {
    #[error("site {0} has no active gateway (no gateway-labelled node with a published key)")]
    NoGateway(SiteName),
    #[error(
        "neither site's gateway has an endpoint and no relay site (sites.relays) has an active gateway with one to relay through"
    )]
    NoRelay,
}

/// The path from the local site to one remote site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// A tunnel between the two active gateways; `dial`: the remote endpoint to dial, None when
    /// the remote side dials in.
    Direct { dial: Option<SocketAddr> },
    /// Both behind NAT: dial the remote's NAT-mapped address (hole punching); until `up` (a
    /// direct handshake observed), traffic goes through `relay`.
    Punch {
        dial: SocketAddr,
        relay: Option<SiteName>,
        up: bool,
    },
    /// Through the active gateway of site `via`.
    Relayed { via: SiteName },
    /// No path.
    Unreachable { why: Unreachable },
}

impl Path {
    /// Whether traffic to the remote site flows now: directly, punched, or through the relay
    /// (which only forwards: the remote gateway's own peer carries it, `crate::relay`). Not
    /// while a punch has no relay to carry meanwhile, nor when unreachable.
    pub fn carried(&self) -> bool {
        match self {
            Path::Direct { .. } | Path::Punch { up: true, .. } | Path::Relayed { .. } => true,
            Path::Punch { relay, .. } => relay.is_some(),
            Path::Unreachable { .. } => false,
        }
    }
}

/// What this node's gateway has observed for NAT traversal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// A gateway's address as a reachable gateway saw it, by gateway name.
    pub nat_mapped: BTreeMap<String, SocketAddr>,
    /// Remote sites with which a direct (punched) handshake is up.
    pub punched: BTreeSet<SiteName>,
}

/// The sites' active gateways, and the relay they share.
#[derive(Debug, Clone)]
pub struct Router<'a> {
    actives: &'a BTreeMap<SiteName, &'a Candidate>,
    discovery: &'a Discovery,
    relay: Option<&'a SiteName>,
}

impl<'a> Router<'a> {
    /// Paths over these active gateways (one per site that has one) and observations, with
    /// the relay sites the config names in order of preference.
    pub fn new(
        actives: &'a BTreeMap<SiteName, &'a Candidate>,
        discovery: &'a Discovery,
        relays: &'a [SiteName],
    ) -> Self {
        let relay = relays
            .iter()
            .find(|s| actives.get(*s).is_some_and(|g| g.endpoint.is_some()));
        Self {
            actives,
            discovery,
            relay,
        }
    }

    /// Where gateway `name` was seen coming from by a reachable gateway (NAT discovery).
    pub fn nat_mapped(&self, name: &str) -> Option<SocketAddr> {
        self.discovery.nat_mapped.get(name).copied()
    }

    /// The relay site (see the module's rule 4).
    pub fn relay(&self) -> Option<&'a SiteName> {
        self.relay
    }

    /// The path from `local` to `remote` (distinct sites).
    pub fn path(&self, local: &SiteName, remote: &SiteName) -> Path {
        let Some(gl) = self.actives.get(local) else {
            return unreachable(Unreachable::NoGateway(local.clone()));
        };
        let Some(gr) = self.actives.get(remote) else {
            return unreachable(Unreachable::NoGateway(remote.clone()));
        };
        if gr.endpoint.is_some() || gl.endpoint.is_some() {
            return Path::Direct { dial: gr.endpoint };
        }
        let relay = self.relay.cloned();
        let mapped = |g: &Candidate| self.discovery.nat_mapped.get(&g.name).copied();
        if let (Some(_), Some(dial)) = (mapped(gl), mapped(gr)) {
            return Path::Punch {
                dial,
                relay,
                up: self.discovery.punched.contains(remote),
            };
        }
        match relay {
            Some(via) => Path::Relayed { via },
            None => unreachable(Unreachable::NoRelay),
        }
    }
}

fn unreachable(why: Unreachable) -> Path {
    Path::Unreachable { why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::PublicKey;
    use crate::model::tests::SITE_LABEL;

    fn site(s: &str) -> SiteName {
        SiteName::parse(SITE_LABEL, s).unwrap()
    }

    fn gw(name: &str, ep: Option<&str>) -> Candidate {
        Candidate {
            name: name.into(),
            public_key: PublicKey([name.len() as u8; 32]),
            endpoint: ep.map(|e| e.parse().unwrap()),
            underlay: None,
        }
    }

    /// The gateways of the path table: two clouds (relays), two NATed edges, one edge with
    /// a forwarded port.
    fn table_gateways() -> [(SiteName, Candidate); 5] {
        [
            (site("cloud"), gw("cloud-gw", Some("203.0.113.1:51820"))),
            (site("edge-a"), gw("a-gw", None)),
            (site("edge-b"), gw("b-gw", None)),
            (site("fwd"), gw("f-gw", Some("198.51.100.7:40000"))),
            (
                site("zz-cloud"),
                gw("b-cloud-gw", Some("203.0.113.2:51820")),
            ),
        ]
    }

    fn table_actives(gateways: &[(SiteName, Candidate)]) -> BTreeMap<SiteName, &Candidate> {
        gateways.iter().map(|(s, c)| (s.clone(), c)).collect()
    }

    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Both NATed edges seen by the relay (NAT discovery).
    fn edges_mapped() -> Discovery {
        let mut observed = Discovery::default();
        observed
            .nat_mapped
            .insert("a-gw".into(), ep("198.51.100.10:51820"));
        observed
            .nat_mapped
            .insert("b-gw".into(), ep("198.51.100.11:51820"));
        observed
    }

    #[test]
    fn path_table() {
        let gateways = table_gateways();
        let actives = table_actives(&gateways);
        let observed = edges_mapped();
        let relays = [site("cloud"), site("zz-cloud")];
        let r = Router::new(&actives, &observed, &relays);
        assert_eq!(r.relay(), Some(&site("cloud")));
        let direct = |to: &str| Path::Direct { dial: Some(ep(to)) };
        let cases: Vec<(&str, &str, Path)> = vec![
            ("edge-a", "cloud", direct("203.0.113.1:51820")),
            ("cloud", "edge-a", Path::Direct { dial: None }),
            ("cloud", "zz-cloud", direct("203.0.113.2:51820")),
            ("edge-a", "fwd", direct("198.51.100.7:40000")),
            (
                "edge-a",
                "edge-b",
                Path::Punch {
                    dial: ep("198.51.100.11:51820"),
                    relay: Some(site("cloud")),
                    up: false,
                },
            ),
            (
                "edge-a",
                "nowhere",
                unreachable(Unreachable::NoGateway(site("nowhere"))),
            ),
            (
                "nowhere",
                "edge-a",
                unreachable(Unreachable::NoGateway(site("nowhere"))),
            ),
        ];
        for (l, rm, want) in cases {
            assert_eq!(r.path(&site(l), &site(rm)), want, "{l} -> {rm}");
        }
    }

    /// Without NAT mappings: relayed; while punching, carried through the relay; punched and
    /// up: carried directly; punching with no relay: not carried until up.
    #[test]
    fn between_nated_edges_traffic_is_carried_relayed_punching_and_punched() {
        let gateways = table_gateways();
        let actives = table_actives(&gateways);
        let relays = [site("cloud"), site("zz-cloud")];
        let none = Discovery::default();
        let r2 = Router::new(&actives, &none, &relays);
        let relayed = r2.path(&site("edge-a"), &site("edge-b"));
        assert_eq!(relayed, Path::Relayed { via: site("cloud") });
        assert!(relayed.carried());
        let observed = edges_mapped();
        let r = Router::new(&actives, &observed, &relays);
        let punching = r.path(&site("edge-a"), &site("edge-b"));
        assert!(matches!(punching, Path::Punch { up: false, .. }) && punching.carried());
        let mut up = observed.clone();
        up.punched.insert(site("edge-b"));
        let r3 = Router::new(&actives, &up, &relays);
        assert!(r3.path(&site("edge-a"), &site("edge-b")).carried());
        let no_relay = Router::new(&actives, &observed, &[]);
        assert!(!no_relay.path(&site("edge-a"), &site("edge-b")).carried());
    }

    #[test]
    fn no_endpoint_anywhere_is_unreachable() {
        let a = gw("a-gw", None);
        let b = gw("b-gw", None);
        let actives: BTreeMap<SiteName, &Candidate> =
            [(site("a"), &a), (site("b"), &b)].into_iter().collect();
        let obs = Discovery::default();
        let relays = [site("a"), site("b")];
        let r = Router::new(&actives, &obs, &relays);
        assert_eq!(r.relay(), None);
        assert_eq!(
            r.path(&site("a"), &site("b")),
            unreachable(Unreachable::NoRelay)
        );
        // One side mapped only: still no punch.
        let mut one = Discovery::default();
        one.nat_mapped
            .insert("a-gw".into(), "198.51.100.1:1".parse().unwrap());
        let r = Router::new(&actives, &one, &relays);
        assert_eq!(
            r.path(&site("a"), &site("b")),
            unreachable(Unreachable::NoRelay)
        );
    }

    /// Issue 34: a site that puts itself first by name, with a gateway that has an endpoint,
    /// is no relay unless the config names it; the first named site with an endpoint is.
    #[test]
    fn only_a_named_site_relays() {
        let rogue = gw("zz-rogue", Some("198.51.100.66:51820"));
        let cloud = gw("c1", Some("203.0.113.1:51820"));
        let a = gw("a1", None);
        let b = gw("b1", None);
        let actives: BTreeMap<SiteName, &Candidate> = [
            (site("aaa"), &rogue),
            (site("cloud"), &cloud),
            (site("edge-a"), &a),
            (site("edge-b"), &b),
        ]
        .into_iter()
        .collect();
        let obs = Discovery::default();
        let named = [site("cloud")];
        let r = Router::new(&actives, &obs, &named);
        assert_eq!(
            r.path(&site("edge-a"), &site("edge-b")),
            Path::Relayed { via: site("cloud") }
        );
        let r = Router::new(&actives, &obs, &[]);
        assert_eq!(
            r.path(&site("edge-a"), &site("edge-b")),
            unreachable(Unreachable::NoRelay)
        );
        // A named site without an active endpoint is passed over for the next one named.
        let named = [site("gone"), site("cloud")];
        let r = Router::new(&actives, &obs, &named);
        assert_eq!(r.relay(), Some(&site("cloud")));
    }

    #[test]
    fn relay_is_the_first_named_endpoint_site_for_every_pair() {
        let c1 = gw("c1", Some("203.0.113.1:1"));
        let c2 = gw("c2", Some("203.0.113.2:1"));
        let n: Vec<Candidate> = (0..4).map(|i| gw(&format!("n{i}"), None)).collect();
        let mut actives: BTreeMap<SiteName, &Candidate> = BTreeMap::new();
        actives.insert(site("m-cloud"), &c1);
        actives.insert(site("k-cloud"), &c2);
        for (i, g) in n.iter().enumerate() {
            actives.insert(site(&format!("s{i}")), g);
        }
        let obs = Discovery::default();
        let relays = [site("m-cloud"), site("k-cloud")];
        let r = Router::new(&actives, &obs, &relays);
        for i in 0..4 {
            for j in 0..4 {
                if i != j {
                    let p = r.path(&site(&format!("s{i}")), &site(&format!("s{j}")));
                    assert_eq!(
                        p,
                        Path::Relayed {
                            via: site("m-cloud")
                        }
                    );
                }
            }
        }
    }
}
