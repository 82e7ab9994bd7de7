//! This node's site plan from the model's inputs, and the peers file it calls for. Pure:
//! O((nodes + sites) log n), deterministic, so every node of a site computes the same.
//!
//! - The peers file holds this node's site's members only: VXLAN never crosses sites.
//! - On a node that is not its site's active gateway, that gateway's entry carries every
//!   remote site's pod subnets that have a path (`carries`): the plugin routes them to it
//!   over the site's VXLAN.
//! - With one site (no site labels anywhere) the list is exactly the placed one: a cluster
//!   without labels works as it did.

use std::collections::BTreeMap;

use sticky_overlay::peers::Peer;
use sticky_overlay::sites::Sites;
use sticky_sites::discovery;
use sticky_sites::gateway::Liveness;
use sticky_sites::model::{self, Holders, Model, NodeInput, SiteConfig, SiteName};
use sticky_sites::plan::{self, Settings, SitePlan, View};

use super::facts::{self, Facts};
use crate::table::Placed;

/// A plan and what it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped {
    pub inputs: Vec<NodeInput>,
    pub model: Model,
    pub plan: SitePlan,
    /// Reachable gateways whose NAT discovery annotation was refused, with why.
    pub observed_refused: BTreeMap<String, String>,
}

/// What this node observes of its site (issue 29): the probes' liveness view and its
/// step-down stance ([`sticky_sites::heal`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteView {
    /// By candidate name; this node itself is added as alive.
    pub liveness: Liveness,
    /// Cut off from its site: not the active gateway, whatever the rule says.
    pub stepped_down: bool,
    /// The site's choice to take as this site's current active gateway (once, on healing).
    pub adopt: Option<String>,
}

/// The peers file `plan` calls for, from the placed Nodes (see the module's rules).
pub fn peer_list(placed: &Placed, shaped: &Shaped) -> Vec<Peer> {
    if !shaped.model.has_sites() {
        return placed.list();
    }
    let plan = &shaped.plan;
    let via = plan.route_via.as_ref();
    let mut list: Vec<Peer> = plan
        .local_members
        .iter()
        .filter_map(|name| placed.peers.get(name).map(|p| (name, p)))
        .map(|(name, p)| {
            let mut p = p.clone();
            if let Some(v) = via.filter(|v| v.gateway == *name) {
                // Only subnets of a family the gateway has a subnet of can be routed to it.
                p.carries = v
                    .subnets
                    .iter()
                    .copied()
                    .filter(|s| p.next_hop(s).is_some())
                    .collect();
            }
            p
        })
        .collect();
    list.sort_by_key(|p| p.ip);
    list
}

/// How this node's plan is made: its name, how sites are read, the tunnel settings, the
/// current active gateway of each site and who holds each gateway key and endpoint (both from
/// the plan in force: no preemption, no takeover), and what this node observes of its site.
#[derive(Debug, Clone)]
pub struct Shaper {
    pub me: String,
    pub config: SiteConfig,
    pub settings: Settings,
    pub current: BTreeMap<SiteName, String>,
    pub holders: Holders,
    /// What this node observes of its site (the sites side keeps it current).
    pub observation: SiteView,
}

impl Shaper {
    /// The shaper of node `me` for the config's `sites`, with no plan in force yet.
    pub fn new(me: &str, sites: &Sites) -> Shaper {
        Shaper {
            me: me.to_string(),
            config: SiteConfig::of(sites),
            settings: Settings::of(sites),
            current: BTreeMap::new(),
            holders: Holders::default(),
            observation: SiteView::default(),
        }
    }

    /// Takes `shaped` as the plan in force: its active gateways stay current while they are
    /// not seen dead, and its Nodes' gateway keys and endpoints stay with their holders.
    pub fn adopt(&mut self, inputs: &[NodeInput], current: &BTreeMap<SiteName, String>) {
        self.current.clone_from(current);
        self.holders = Holders::of(inputs, &self.config, current);
    }

    /// Builds the model of `inputs` and this node's plan, keeping each site's current active
    /// gateway while it is not seen dead (no preemption; `sticky_sites::gateway`), with the
    /// NAT-mapped addresses the reachable gateways published (`sticky_sites::discovery`) and
    /// what this node observes: the adopted choice replaces this site's current active
    /// gateway, the liveness view feeds the rule, and a stepped-down node plans no tunnel.
    pub fn compute(&self, inputs: Vec<NodeInput>) -> Result<Shaped, plan::Error> {
        let me = self.me.as_str();
        let seen = &self.observation;
        let model = model::build(&inputs, &self.config, &self.holders);
        let mut view = View {
            current: self.current.clone(),
            liveness: seen.liveness.clone(),
            ..View::default()
        };
        let (nat_mapped, refused) = discovery::nat_mapped(&model, &inputs);
        view.discovery.nat_mapped = nat_mapped;
        view.liveness
            .insert(me.to_string(), sticky_sites::gateway::Seen::Alive);
        if let (Some(site), Some(choice)) = (model.site_of.get(me), &seen.adopt) {
            view.current.insert(site.clone(), choice.clone());
        }
        let mut plan = plan::plan(&model, me, &view, &self.settings)?;
        if seen.stepped_down {
            plan.gateway = None;
        }
        Ok(Shaped {
            inputs,
            model,
            plan,
            observed_refused: refused
                .into_iter()
                .map(|(n, e)| (n, e.to_string()))
                .collect(),
        })
    }

    /// The plan for the placed Nodes and the peer list it calls for; `Err` says why no list
    /// can be made (this node is in no site: its own Node was left out).
    pub fn shape(
        &self,
        placed: &Placed,
        facts: &BTreeMap<String, Facts>,
    ) -> Result<(Vec<Peer>, Shaped), String> {
        let shaped = self
            .compute(facts::inputs(placed, facts))
            .map_err(|e| format!("sites: {e}"))?;
        Ok((peer_list(placed, &shaped), shaped))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sticky_overlay::sites::{
        DEFAULT_GATEWAY_LABEL as GATEWAY_LABEL, DEFAULT_SITE_LABEL as SITE_LABEL,
    };
    use sticky_sites::keys::PrivateKey;
    use sticky_sites::model::{ENDPOINT_ANNOTATION, PUBLIC_KEY_ANNOTATION};

    fn key(n: u8) -> String {
        PrivateKey::from_bytes([n; 32]).public_key().to_base64()
    }

    /// (name, underlay, pod subnet, site, gateway with endpoint?)
    type Row<'a> = (&'a str, &'a str, &'a str, &'a str, Option<Option<&'a str>>);

    type OwnedRow = (String, String, String, String, Option<Option<String>>);

    fn cluster(rows: &[Row<'_>]) -> (Placed, BTreeMap<String, Facts>) {
        let mut placed = Placed::default();
        let mut facts = BTreeMap::new();
        for (i, (name, ip, subnet, site, gw)) in rows.iter().enumerate() {
            placed.peers.insert(
                name.to_string(),
                Peer {
                    ip: ip.parse().unwrap(),
                    subnets: vec![subnet.parse().unwrap()],
                    mac: None,
                    carries: Vec::new(),
                },
            );
            let mut f = Facts::default();
            if !site.is_empty() {
                f.labels.insert(SITE_LABEL.into(), site.to_string());
            }
            if let Some(ep) = gw {
                f.labels.insert(GATEWAY_LABEL.into(), "true".into());
                f.annotations
                    .insert(PUBLIC_KEY_ANNOTATION.into(), key(i as u8 + 1));
                if let Some(ep) = ep {
                    f.annotations
                        .insert(ENDPOINT_ANNOTATION.into(), ep.to_string());
                }
            }
            facts.insert(name.to_string(), f);
        }
        (placed, facts)
    }

    /// The shaper of `me` with the shipped settings and the cloud site named as the relay.
    pub(crate) fn shaper(me: &str) -> Shaper {
        let mut s = Shaper::new(me, &sites_config());
        s.settings.relays = vec![SiteName::parse("relays", "cloud").unwrap()];
        s
    }

    fn sites_config() -> Sites {
        let mut obj = serde_json::Map::new();
        obj.insert("sites".into(), serde_json::json!({}));
        sticky_overlay::sites::parse(&obj).unwrap().unwrap()
    }

    fn sites() -> (Placed, BTreeMap<String, Facts>) {
        cluster(&[
            (
                "c1",
                "198.51.100.1",
                "198.18.1.0/24",
                "cloud",
                Some(Some("198.51.100.1:51820")),
            ),
            ("c2", "198.51.100.2", "198.18.2.0/24", "cloud", None),
            ("a1", "192.0.2.1", "198.18.11.0/24", "site-a", Some(None)),
            ("a2", "192.0.2.2", "198.18.12.0/24", "site-a", None),
            ("b1", "192.0.2.129", "198.18.21.0/24", "site-b", Some(None)),
            ("b2", "192.0.2.130", "198.18.22.0/24", "site-b", None),
        ])
    }

    #[test]
    fn a_plain_node_lists_its_site_and_its_gateway_carries_the_other_sites() {
        let (placed, facts) = sites();
        let (list, shaped) = shaper("a2").shape(&placed, &facts).unwrap();
        let ips: Vec<String> = list.iter().map(|p| p.ip.to_string()).collect();
        assert_eq!(ips, ["192.0.2.1", "192.0.2.2"], "VXLAN never crosses sites");
        let carried: Vec<String> = list[0].carries.iter().map(ToString::to_string).collect();
        assert_eq!(
            carried,
            [
                "198.18.1.0/24",
                "198.18.2.0/24",
                "198.18.21.0/24",
                "198.18.22.0/24"
            ],
            "the cloud directly, site B through the relay"
        );
        assert!(list[1].carries.is_empty());
        assert!(shaped.plan.gateway.is_none());
    }

    #[test]
    fn the_active_gateway_lists_its_site_plainly_and_plans_the_tunnel() {
        let (placed, facts) = sites();
        let (list, shaped) = shaper("a1").shape(&placed, &facts).unwrap();
        assert_eq!(list.len(), 2);
        assert!(
            list.iter().all(|p| p.carries.is_empty()),
            "the gateway routes into the tunnel"
        );
        let gw = shaped.plan.gateway.unwrap();
        let peers: Vec<_> = gw
            .peers
            .iter()
            .map(|p| (p.gateway.as_str(), p.via.is_some()))
            .collect();
        assert_eq!(
            peers,
            [("c1", false), ("b1", true)],
            "the cloud's gateway, and B's through it: {gw:?}"
        );
    }

    #[test]
    fn without_site_labels_the_list_is_the_placed_one() {
        let (placed, facts) = cluster(&[
            ("n1", "192.0.2.1", "198.18.1.0/24", "", None),
            ("n2", "192.0.2.2", "198.18.2.0/24", "", Some(None)),
        ]);
        let (list, _) = shaper("n1").shape(&placed, &facts).unwrap();
        assert_eq!(list, placed.list());
    }

    /// The cost sites add to every write of the peers file, against placing the Nodes (which
    /// every write does anyway), at 1,000 and 5,000 Nodes in sites of 100 with two gateways
    /// each: `cargo test --release -p sticky-vxlan-agent --lib -- --ignored --nocapture
    /// bench_shape`.
    #[test]
    #[ignore = "benchmark: run with --release --ignored --nocapture"]
    fn bench_shape() {
        for n in [1000usize, 5000] {
            let rows: Vec<OwnedRow> = (0..n)
                .map(|i| {
                    let site = i / 100;
                    let gw = match i % 100 {
                        0 if site == 0 => {
                            Some(Some(format!("198.18.{}.{}:51820", i / 250, i % 250 + 1)))
                        }
                        0 | 1 => Some(None),
                        _ => None,
                    };
                    (
                        format!("n{i:05}"),
                        format!("198.18.{}.{}", i / 250, i % 250 + 1),
                        format!("10.{}.{}.0/24", 64 + i / 256, i % 256),
                        format!("site-{site:03}"),
                        gw,
                    )
                })
                .collect();
            let borrowed: Vec<Row<'_>> = rows
                .iter()
                .map(|(a, b, c, d, e)| {
                    (
                        a.as_str(),
                        b.as_str(),
                        c.as_str(),
                        d.as_str(),
                        e.as_ref().map(|o| o.as_deref()),
                    )
                })
                .collect();
            let (placed, facts) = cluster(&borrowed);
            let nodes: BTreeMap<String, crate::table::Mapped> = placed
                .peers
                .iter()
                .map(|(name, p)| {
                    let entry = sticky_overlay::peers::PeerEntry {
                        ip: p.ip,
                        subnets: p.subnets.clone(),
                        mac: None,
                        carries: Vec::new(),
                    };
                    (name.clone(), Ok(entry))
                })
                .collect();
            let held = placed.list();
            let time = |f: &dyn Fn()| {
                let mut t: Vec<f64> = (0..20)
                    .map(|_| {
                        let s = std::time::Instant::now();
                        f();
                        s.elapsed().as_secs_f64() * 1000.0
                    })
                    .collect();
                t.sort_by(f64::total_cmp);
                t[t.len() / 2]
            };
            let place = time(&|| {
                std::hint::black_box(crate::table::place(&nodes, &held, 1));
            });
            let me = shaper("n00150");
            let shape = time(&|| {
                std::hint::black_box(me.shape(&placed, &facts).unwrap());
            });
            println!(
                "BENCH sites shape, {n} Nodes in {} sites: placing the Nodes {place:.2} ms, shaping to this node's site {shape:.2} ms ({:.2}x of placing; median of 20)",
                n / 100,
                shape / place
            );
        }
    }

    #[test]
    fn this_node_left_out_is_said() {
        let (placed, facts) = sites();
        let err = shaper("zz").shape(&placed, &facts).unwrap_err();
        assert!(err.contains("\"zz\""), "{err}");
    }
}
