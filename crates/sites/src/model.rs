//! From Node objects to sites: which site each Node is in, and which Nodes may carry their
//! site's traffic (gateway candidates) with their public key and endpoint.
//!
//! - Site: the label [`SiteConfig::site_key`] (`sites.siteLabel`). No label, or an empty
//!   value, is the default site [`DEFAULT_SITE`]: a cluster without labels is one site, as
//!   today. The value must be a valid Kubernetes label value (at most 63 characters,
//!   alphanumeric at both ends, `-`, `_`, `.` between).
//! - Gateway: the label [`SiteConfig::gateway_key`] (`sites.gatewayLabel`) = `"true"`;
//!   `"false"` or absent is a plain node. Both keys default to admin-only labels (under
//!   `node-restriction.kubernetes.io/`, which a kubelet cannot set on its own Node).
//! - Public key: annotation [`PUBLIC_KEY_ANNOTATION`], base64 of 32 bytes, not all zeros. A
//!   gateway without it is not a candidate yet (its key is not published), which is no error.
//! - Endpoint: annotation [`ENDPOINT_ANNOTATION`], `a.b.c.d:port` or `[v6]:port`. DNS names are
//!   refused: the tunnel takes an address, and resolving names would make the data path depend
//!   on a resolver while the cloud is away. Unspecified, loopback, multicast, IPv4 broadcast
//!   addresses and port 0 are refused.
//!
//! Blast radius: a Node with a bad site label is left out of every site ([`Model::left_out`]):
//! it is no member, no gateway, and its pod subnets are routed from no other site. A Node whose
//! site is good but whose gateway part is bad (a gateway label other than `"true"`/`"false"`,
//! a bad key or endpoint annotation) stays a plain member of its site (its subnets are its
//! site's) and is no candidate ([`Model::not_gateway`]). A public key or an endpoint claimed by
//! more than one gateway stays with the one that held it ([`Holders`]: the site's current
//! active gateway, or the only claimant in the Nodes every node last adopted); the others are
//! no candidates, and when none held it, none is: a Node that copies another's key or
//! endpoint never takes its role (docs/sites.md, "Trust"). Two input Nodes with one name are
//! both left out. Each reason is typed; nothing else changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use sticky_overlay::sites::{DEFAULT_GATEWAY_LABEL, DEFAULT_SITE_LABEL, Sites};

use crate::keys::{self, PublicKey};

/// The annotation others dial: `<address>:<port>`.
pub const ENDPOINT_ANNOTATION: &str = "sticky-cni.io/gateway-endpoint";
/// The annotation holding a gateway's WireGuard public key (base64).
pub const PUBLIC_KEY_ANNOTATION: &str = "sticky-cni.io/wireguard-public-key";
/// The site of Nodes without a site label.
pub const DEFAULT_SITE: &str = "default";

/// Why a Node, or its gateway part, is left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "label {key} = {value:?} is not a valid label value (at most 63 characters, alphanumeric at both ends, '-', '_' or '.' between)"
    )]
    BadSite { key: String, value: String },
    #[error("label {key} = {value:?} is neither \"true\" nor \"false\"")]
    BadGatewayLabel { key: String, value: String },
    #[error("annotation {PUBLIC_KEY_ANNOTATION}: {0}")]
    BadKey(String),
    #[error("annotation {ENDPOINT_ANNOTATION} = {value:?} is not {expected}")]
    BadEndpoint {
        value: String,
        expected: &'static str,
    },
    #[error(
        "public key {key} is also claimed by gateway(s) {others:?}: {}",
        kept(holder)
    )]
    KeyInUse {
        key: PublicKey,
        others: Vec<String>,
        holder: Option<String>,
    },
    #[error(
        "endpoint {endpoint} is also claimed by gateway(s) {others:?}: {}",
        kept(holder)
    )]
    EndpointInUse {
        endpoint: SocketAddr,
        others: Vec<String>,
        holder: Option<String>,
    },
    #[error("more than one input Node is named {name:?}")]
    DuplicateName { name: String },
}

/// How a claim made twice ends, for an error message.
fn kept(holder: &Option<String>) -> String {
    match holder {
        Some(h) => format!("it stays with {h}, which held it"),
        None => "none of them held it, so none of them is a candidate".into(),
    }
}

/// A site's name (a valid label value).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SiteName(String);

impl SiteName {
    /// A site name from a label value; empty means the default site.
    pub fn parse(key: &str, value: &str) -> Result<Self, Error> {
        if value.is_empty() {
            return Ok(Self::default_site());
        }
        let inner_ok = value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        let ends_ok = value
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
            && value
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric());
        if value.len() > 63 || !inner_ok || !ends_ok {
            return Err(Error::BadSite {
                key: key.to_string(),
                value: value.to_string(),
            });
        }
        Ok(Self(value.to_string()))
    }

    /// The site of unlabelled Nodes.
    pub fn default_site() -> Self {
        Self(DEFAULT_SITE.to_string())
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SiteName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How sites are read from Nodes: the label keys of the config's `sites` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteConfig {
    /// The label holding a Node's site (`sites.siteLabel`).
    pub site_key: String,
    /// The label that makes a Node a gateway candidate (`sites.gatewayLabel`).
    pub gateway_key: String,
}

impl SiteConfig {
    /// The keys `sites` names.
    pub fn of(sites: &Sites) -> Self {
        Self {
            site_key: sites.site_label.clone(),
            gateway_key: sites.gateway_label.clone(),
        }
    }
}

impl Default for SiteConfig {
    fn default() -> Self {
        Self {
            site_key: DEFAULT_SITE_LABEL.to_string(),
            gateway_key: DEFAULT_GATEWAY_LABEL.to_string(),
        }
    }
}

/// Who held each gateway public key and endpoint before this build: a second claim never
/// takes them away (see the module doc). Every node computes the same from what it adopted
/// and cached: the current active gateways and the Nodes of the plan in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    keys: BTreeMap<PublicKey, String>,
    endpoints: BTreeMap<SocketAddr, String>,
}

impl Holders {
    /// The holders in `prior` (the Nodes of the plan in force): a key or endpoint's only
    /// gateway claimant holds it, and of several claimants a site's `current` active gateway.
    /// O(n log n).
    pub fn of(
        prior: &[NodeInput],
        config: &SiteConfig,
        current: &BTreeMap<SiteName, String>,
    ) -> Holders {
        let mut keys: BTreeMap<PublicKey, Vec<&str>> = BTreeMap::new();
        let mut endpoints: BTreeMap<SocketAddr, Vec<&str>> = BTreeMap::new();
        for n in prior {
            if let Ok(Some(c)) = gateway_part(n, config) {
                keys.entry(c.public_key).or_default().push(&n.name);
                if let Some(e) = c.endpoint {
                    endpoints.entry(e).or_default().push(&n.name);
                }
            }
        }
        let active: BTreeSet<&str> = current.values().map(String::as_str).collect();
        let holder = |names: Vec<&str>| match names[..] {
            [one] => Some(one.to_string()),
            _ => names
                .into_iter()
                .find(|n| active.contains(n))
                .map(str::to_string),
        };
        Holders {
            keys: keys
                .into_iter()
                .filter_map(|(k, names)| holder(names).map(|h| (k, h)))
                .collect(),
            endpoints: endpoints
                .into_iter()
                .filter_map(|(e, names)| holder(names).map(|h| (e, h)))
                .collect(),
        }
    }
}

/// What this crate needs of a Node object (the agent maps its Node type to this).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInput {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The Node's pod subnets (the agent's peer entry subnets).
    pub pod_cidrs: Vec<IpNet>,
    /// The Node's underlay address inside its site (the agent's peer entry address), if known.
    pub underlay: Option<IpAddr>,
}

/// A gateway-labelled Node whose key is known: it may become its site's active gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub public_key: PublicKey,
    /// Where others dial it; None: it can only dial out (behind NAT).
    pub endpoint: Option<SocketAddr>,
    pub underlay: Option<IpAddr>,
}

/// A Node of a site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub pod_cidrs: Vec<IpNet>,
    pub underlay: Option<IpAddr>,
}

/// One site: its members by name and its gateway candidates in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    pub members: BTreeMap<String, Member>,
    /// Sorted by name: the order the active-gateway rule walks.
    pub candidates: Vec<Candidate>,
}

impl Site {
    /// Every member's pod subnets, sorted and without repeats.
    pub fn subnets(&self) -> Vec<IpNet> {
        let all: BTreeSet<IpNet> = self
            .members
            .values()
            .flat_map(|m| m.pod_cidrs.iter().copied())
            .collect();
        all.into_iter().collect()
    }

    /// The candidate named `name`.
    pub fn candidate(&self, name: &str) -> Option<&Candidate> {
        self.candidates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.candidates.get(i))
    }
}

/// The sites of a cluster, and what was left out with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    pub sites: BTreeMap<SiteName, Site>,
    /// Nodes in no site at all (bad site label, duplicate name).
    pub left_out: BTreeMap<String, Error>,
    /// Plain members whose gateway part was refused.
    pub not_gateway: BTreeMap<String, Error>,
    /// The site of every member, by Node name.
    pub site_of: BTreeMap<String, SiteName>,
}

impl Model {
    /// True when the network has more than one site (cross-site routing and the tunnel's MTU
    /// matter only then).
    pub fn has_sites(&self) -> bool {
        self.sites.len() > 1
    }
}

/// Parses an endpoint annotation (see the module's rules).
pub fn parse_endpoint(value: &str) -> Result<SocketAddr, Error> {
    let bad = |expected| Error::BadEndpoint {
        value: value.to_string(),
        expected,
    };
    let Ok(addr) = value.trim().parse::<SocketAddr>() else {
        return Err(bad(
            "an IPv4 address:port or [IPv6 address]:port (DNS names are not accepted)",
        ));
    };
    if addr.port() == 0 {
        return Err(bad("an endpoint with a port other than 0"));
    }
    let ip = addr.ip();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || broadcast {
        return Err(bad(
            "a unicast address others can dial (not unspecified, loopback, multicast or broadcast)",
        ));
    }
    Ok(addr)
}

/// The gateway part of a Node of a good site: Ok(None) for a plain node.
fn gateway_part(node: &NodeInput, config: &SiteConfig) -> Result<Option<Candidate>, Error> {
    match node.labels.get(&config.gateway_key).map(String::as_str) {
        None | Some("false") => return Ok(None),
        Some("true") => {}
        Some(other) => {
            return Err(Error::BadGatewayLabel {
                key: config.gateway_key.clone(),
                value: other.to_string(),
            });
        }
    }
    let endpoint = node
        .annotations
        .get(ENDPOINT_ANNOTATION)
        .map(|v| parse_endpoint(v))
        .transpose()?;
    let Some(key) = node.annotations.get(PUBLIC_KEY_ANNOTATION) else {
        return Ok(None);
    };
    let public_key =
        PublicKey::from_base64(key).map_err(|e: keys::Error| Error::BadKey(e.to_string()))?;
    Ok(Some(Candidate {
        name: node.name.clone(),
        public_key,
        endpoint,
        underlay: node.underlay,
    }))
}

/// Builds the model from Nodes in any order (the result does not depend on the order), a
/// claim made twice staying with its holder in `holders`.
pub fn build<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInput>,
    config: &SiteConfig,
    holders: &Holders,
) -> Model {
    let mut by_name: BTreeMap<&str, Option<&NodeInput>> = BTreeMap::new();
    for n in nodes {
        by_name
            .entry(n.name.as_str())
            .and_modify(|seen| *seen = None)
            .or_insert(Some(n));
    }
    let mut model = Model::default();
    let mut candidates: Vec<(SiteName, Candidate)> = Vec::new();
    for (name, node) in by_name {
        let Some(node) = node else {
            model.left_out.insert(
                name.to_string(),
                Error::DuplicateName {
                    name: name.to_string(),
                },
            );
            continue;
        };
        let value = node
            .labels
            .get(&config.site_key)
            .map(String::as_str)
            .unwrap_or("");
        let site = match SiteName::parse(&config.site_key, value) {
            Ok(s) => s,
            Err(e) => {
                model.left_out.insert(name.to_string(), e);
                continue;
            }
        };
        match gateway_part(node, config) {
            Ok(Some(c)) => candidates.push((site.clone(), c)),
            Ok(None) => {}
            Err(e) => {
                model.not_gateway.insert(name.to_string(), e);
            }
        }
        model.site_of.insert(name.to_string(), site.clone());
        model.sites.entry(site).or_default().members.insert(
            name.to_string(),
            Member {
                pod_cidrs: node.pod_cidrs.clone(),
                underlay: node.underlay,
            },
        );
    }
    let candidates = settle_claims(candidates, holders, &mut model.not_gateway, |c| {
        Some(c.public_key)
    });
    let candidates = settle_claims(candidates, holders, &mut model.not_gateway, |c| c.endpoint);
    for (site, c) in candidates {
        // Candidates arrive in name order (from the name map), so each list stays sorted.
        model.sites.entry(site).or_default().candidates.push(c);
    }
    model
}

/// What two candidates may not share: a public key (two peers would be one) or an endpoint.
trait Claim: Ord + Copy {
    fn held_by(self, holders: &Holders) -> Option<&String>;
    fn in_use(self, others: Vec<String>, holder: Option<String>) -> Error;
}

impl Claim for PublicKey {
    fn held_by(self, holders: &Holders) -> Option<&String> {
        holders.keys.get(&self)
    }
    fn in_use(self, others: Vec<String>, holder: Option<String>) -> Error {
        Error::KeyInUse {
            key: self,
            others,
            holder,
        }
    }
}

impl Claim for SocketAddr {
    fn held_by(self, holders: &Holders) -> Option<&String> {
        holders.endpoints.get(&self)
    }
    fn in_use(self, others: Vec<String>, holder: Option<String>) -> Error {
        Error::EndpointInUse {
            endpoint: self,
            others,
            holder,
        }
    }
}

/// The candidates whose `claim` no other candidate makes, or who held it; the others go to
/// `refused` with why. Keeps the order.
fn settle_claims<C: Claim>(
    candidates: Vec<(SiteName, Candidate)>,
    holders: &Holders,
    refused: &mut BTreeMap<String, Error>,
    claim: impl Fn(&Candidate) -> Option<C>,
) -> Vec<(SiteName, Candidate)> {
    let mut claims: BTreeMap<C, Vec<String>> = BTreeMap::new();
    for (_, c) in &candidates {
        if let Some(k) = claim(c) {
            claims.entry(k).or_default().push(c.name.clone());
        }
    }
    candidates
        .into_iter()
        .filter(|(_, c)| {
            let Some(k) = claim(c) else {
                return true;
            };
            let names = claims.get(&k).map(Vec::as_slice).unwrap_or_default();
            if names.len() < 2 {
                return true;
            }
            let holder = k.held_by(holders).filter(|h| names.contains(h));
            if holder == Some(&c.name) {
                return true;
            }
            let others = names.iter().filter(|n| **n != c.name).cloned().collect();
            refused.insert(c.name.clone(), k.in_use(others, holder.cloned()));
            false
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine;
    use proptest::prelude::*;
    pub(crate) use sticky_overlay::sites::{
        DEFAULT_GATEWAY_LABEL as GATEWAY_LABEL, DEFAULT_SITE_LABEL as SITE_LABEL,
    };

    pub(crate) fn key(n: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([n; 32])
    }

    /// A Node: `site` None = unlabelled; `gw` = (key byte, endpoint).
    pub(crate) fn node(
        name: &str,
        site: Option<&str>,
        cidr: &str,
        gw: Option<(u8, Option<&str>)>,
    ) -> NodeInput {
        let mut n = NodeInput {
            name: name.into(),
            pod_cidrs: vec![cidr.parse().unwrap()],
            ..Default::default()
        };
        if let Some(s) = site {
            n.labels.insert(SITE_LABEL.into(), s.into());
        }
        if let Some((k, ep)) = gw {
            n.labels.insert(GATEWAY_LABEL.into(), "true".into());
            n.annotations.insert(PUBLIC_KEY_ANNOTATION.into(), key(k));
            if let Some(ep) = ep {
                n.annotations.insert(ENDPOINT_ANNOTATION.into(), ep.into());
            }
        }
        n
    }

    #[test]
    fn endpoint_table() {
        let cases: &[(&str, bool)] = &[
            ("203.0.113.5:51820", true),
            (" 203.0.113.5:51820 ", true),
            ("[2001:db8::1]:51820", true),
            ("2001:db8::1:51820", false),
            ("gw.example.com:51820", false),
            ("203.0.113.5", false),
            ("203.0.113.5:0", false),
            ("0.0.0.0:51820", false),
            ("[::]:51820", false),
            ("127.0.0.1:51820", false),
            ("[::1]:51820", false),
            ("224.0.0.1:51820", false),
            ("[ff02::1]:51820", false),
            ("255.255.255.255:51820", false),
            ("203.0.113.5:65536", false),
        ];
        for (v, ok) in cases {
            assert_eq!(parse_endpoint(v).is_ok(), *ok, "{v:?}");
        }
        let err = parse_endpoint("gw.example.com:1").unwrap_err().to_string();
        assert!(
            err.contains("gw.example.com:1") && err.contains("DNS"),
            "{err}"
        );
    }

    #[test]
    fn site_name_table() {
        let long = "a".repeat(64);
        let cases: &[(&str, Option<&str>)] = &[
            ("", Some(DEFAULT_SITE)),
            ("shop-1", Some("shop-1")),
            ("a.b_c", Some("a.b_c")),
            ("A9", Some("A9")),
            ("-shop", None),
            ("shop-", None),
            ("sh op", None),
            ("shöp", None),
            (&long, None),
        ];
        for (v, want) in cases {
            let got = SiteName::parse(SITE_LABEL, v).ok();
            assert_eq!(got.as_ref().map(SiteName::as_str), *want, "{v:?}");
        }
    }

    #[test]
    fn no_labels_is_one_default_site() {
        let nodes = [
            node("n1", None, "10.0.1.0/24", None),
            node("n2", None, "10.0.2.0/24", None),
        ];
        let m = build(&nodes, &SiteConfig::default(), &Holders::default());
        assert_eq!(m.sites.len(), 1);
        assert!(!m.has_sites());
        let s = &m.sites[&SiteName::default_site()];
        assert_eq!(s.members.len(), 2);
        assert!(s.candidates.is_empty());
        assert!(m.left_out.is_empty() && m.not_gateway.is_empty());
    }

    #[test]
    fn configurable_label_key() {
        let (key, gw) = ("sticky-cni.io/site", "sticky-cni.io/gateway");
        let mut n = node("n1", None, "10.0.1.0/24", Some((1, None)));
        n.labels.insert(key.into(), "shop".into());
        n.labels.insert(SITE_LABEL.into(), "ignored".into());
        n.labels.remove(GATEWAY_LABEL);
        let config = SiteConfig {
            site_key: key.into(),
            gateway_key: gw.into(),
        };
        let m = build([&n], &config, &Holders::default());
        assert_eq!(m.site_of["n1"].as_str(), "shop");
        assert!(m.sites[&m.site_of["n1"]].candidates.is_empty());
        n.labels.insert(gw.into(), "true".into());
        let m = build([&n], &config, &Holders::default());
        assert_eq!(m.sites[&m.site_of["n1"]].candidates[0].name, "n1");
    }

    #[test]
    fn bad_parts_break_only_their_node() {
        let mut bad_site = node("b-site", Some("no good"), "10.0.9.0/24", Some((9, None)));
        bad_site.underlay = Some("192.0.2.9".parse().unwrap());
        let mut bad_label = node("b-label", Some("a"), "10.0.3.0/24", Some((3, None)));
        bad_label.labels.insert(GATEWAY_LABEL.into(), "yes".into());
        let bad_key = {
            let mut n = node("b-key", Some("a"), "10.0.4.0/24", Some((4, None)));
            n.annotations
                .insert(PUBLIC_KEY_ANNOTATION.into(), "AAAA".into());
            n
        };
        let zero_key = {
            let mut n = node("b-zero", Some("a"), "10.0.5.0/24", Some((4, None)));
            n.annotations.insert(PUBLIC_KEY_ANNOTATION.into(), key(0));
            n
        };
        let bad_ep = node(
            "b-ep",
            Some("a"),
            "10.0.6.0/24",
            Some((6, Some("127.0.0.1:5"))),
        );
        let twin1 = node("t1", Some("b"), "10.0.7.0/24", Some((7, None)));
        let twin2 = node("t2", Some("c"), "10.0.8.0/24", Some((7, None)));
        let good = node(
            "good",
            Some("a"),
            "10.0.1.0/24",
            Some((1, Some("203.0.113.1:51820"))),
        );
        let no_key = {
            let mut n = node("no-key", Some("a"), "10.0.2.0/24", Some((2, None)));
            n.annotations.remove(PUBLIC_KEY_ANNOTATION);
            n
        };
        let nodes = [
            bad_site, bad_label, bad_key, zero_key, bad_ep, twin1, twin2, good, no_key,
        ];
        let m = build(&nodes, &SiteConfig::default(), &Holders::default());
        assert!(matches!(m.left_out["b-site"], Error::BadSite { .. }));
        assert_eq!(m.left_out.len(), 1);
        assert!(!m.site_of.contains_key("b-site"));
        assert!(matches!(
            m.not_gateway["b-label"],
            Error::BadGatewayLabel { .. }
        ));
        assert!(matches!(m.not_gateway["b-key"], Error::BadKey(_)));
        assert!(m.not_gateway["b-zero"].to_string().contains("all zeros"));
        assert!(matches!(m.not_gateway["b-ep"], Error::BadEndpoint { .. }));
        assert!(matches!(m.not_gateway["t1"], Error::KeyInUse { .. }));
        assert!(matches!(m.not_gateway["t2"], Error::KeyInUse { .. }));
        assert_eq!(m.not_gateway.len(), 6);
        let a = &m.sites[&SiteName::parse(SITE_LABEL, "a").unwrap()];
        // All of site a's good-site nodes are still members, only `good` is a candidate.
        assert_eq!(a.members.len(), 6);
        let names: Vec<_> = a.candidates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["good"]);
        assert_eq!(
            a.candidate("good").map(|c| c.public_key),
            Some(a.candidates[0].public_key)
        );
        assert!(a.candidate("b-key").is_none());
        assert_eq!(
            a.candidates[0].endpoint,
            Some("203.0.113.1:51820".parse().unwrap())
        );
        assert!(
            m.sites[&SiteName::parse(SITE_LABEL, "b").unwrap()]
                .candidates
                .is_empty()
        );
    }

    /// Issue 34, reproduction 1: a Node that copies the active cloud gateway's public key (or
    /// its endpoint) takes nothing from it: the holder stays the candidate, the copier is not.
    #[test]
    fn a_copied_key_or_endpoint_stays_with_its_holder() {
        let c1 = node(
            "c1",
            Some("cloud"),
            "10.0.1.0/24",
            Some((1, Some("203.0.113.1:51820"))),
        );
        let a1 = node("a1", Some("edge-a"), "10.0.2.0/24", Some((2, None)));
        let rogue_key = node("zz-rogue", Some("edge-b"), "10.0.9.0/24", Some((1, None)));
        let rogue_ep = node(
            "zz-ep",
            Some("edge-b"),
            "10.0.8.0/24",
            Some((8, Some("203.0.113.1:51820"))),
        );
        let config = SiteConfig::default();
        let prior = [c1.clone(), a1.clone()];
        let current = BTreeMap::from([(
            SiteName::parse(SITE_LABEL, "cloud").unwrap(),
            "c1".to_string(),
        )]);
        let holders = Holders::of(&prior, &config, &current);
        let m = build([&c1, &a1, &rogue_key, &rogue_ep], &config, &holders);
        let cloud = &m.sites[&m.site_of["c1"]];
        assert_eq!(
            cloud
                .candidates
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["c1"]
        );
        let Error::KeyInUse { holder, .. } = &m.not_gateway["zz-rogue"] else {
            panic!("{:?}", m.not_gateway);
        };
        assert_eq!(holder.as_deref(), Some("c1"));
        assert!(
            m.not_gateway["zz-rogue"]
                .to_string()
                .contains("stays with c1")
        );
        assert!(
            matches!(&m.not_gateway["zz-ep"], Error::EndpointInUse { holder: Some(h), .. } if h == "c1")
        );
        assert!(!m.not_gateway.contains_key("c1"));
        // Without what every node adopted (no holder known), nobody gets a copied key.
        let m = build([&c1, &rogue_key], &config, &Holders::default());
        assert!(m.not_gateway.contains_key("c1") && m.not_gateway.contains_key("zz-rogue"));
    }

    /// Of several prior claimants of one key, the site's current active gateway holds it; the
    /// only claimant holds it whether or not it is active.
    #[test]
    fn holders_are_the_only_claimant_or_the_current_active() {
        let g1 = node("g1", Some("a"), "10.0.1.0/24", Some((1, None)));
        let g2 = node("g2", Some("a"), "10.0.2.0/24", Some((1, None)));
        let g3 = node("g3", Some("a"), "10.0.3.0/24", Some((3, None)));
        let config = SiteConfig::default();
        let a = SiteName::parse(SITE_LABEL, "a").unwrap();
        let h = Holders::of(
            &[g1.clone(), g2.clone(), g3.clone()],
            &config,
            &BTreeMap::new(),
        );
        assert_eq!(
            h.keys.get(&PublicKey([3; 32])).map(String::as_str),
            Some("g3")
        );
        assert_eq!(h.keys.get(&PublicKey([1; 32])), None);
        let h = Holders::of(
            &[g1, g2, g3],
            &config,
            &BTreeMap::from([(a, "g2".to_string())]),
        );
        assert_eq!(
            h.keys.get(&PublicKey([1; 32])).map(String::as_str),
            Some("g2")
        );
    }

    #[test]
    fn duplicate_names_leave_both_out() {
        let a = node("n", Some("a"), "10.0.1.0/24", None);
        let b = node("n", Some("b"), "10.0.2.0/24", None);
        let m = build([&a, &b], &SiteConfig::default(), &Holders::default());
        assert!(matches!(m.left_out["n"], Error::DuplicateName { .. }));
        assert!(m.sites.is_empty());
    }

    proptest! {
        /// The model is the same whatever order the Nodes arrive in, bad ones included.
        #[test]
        fn build_ignores_node_order(order in Just((0..7).collect::<Vec<usize>>()).prop_shuffle()) {
            let nodes = [
                node("g2", Some("a"), "10.0.2.0/24", Some((2, None))),
                node("g1", Some("a"), "10.0.1.0/24", Some((1, Some("203.0.113.1:51820")))),
                node("twin-a", Some("b"), "10.1.0.0/24", Some((5, None))),
                node("twin-b", Some("c"), "10.2.0.0/24", Some((5, None))),
                node("dup", Some("b"), "10.1.1.0/24", None),
                node("dup", Some("c"), "10.2.1.0/24", None),
                node("bad", Some("-x"), "10.9.0.0/24", None),
            ];
            let shuffled: Vec<&NodeInput> = order.iter().map(|&i| &nodes[i]).collect();
            let a = build(&nodes, &SiteConfig::default(), &Holders::default());
            let b = build(shuffled, &SiteConfig::default(), &Holders::default());
            prop_assert_eq!(&a, &b);
            let names: Vec<&str> = a.sites[&SiteName::parse(SITE_LABEL, "a").unwrap()]
                .candidates.iter().map(|c| c.name.as_str()).collect();
            prop_assert_eq!(names, ["g1", "g2"]);
            prop_assert_eq!(a.left_out.len(), 2);
        }
    }

    #[test]
    fn subnets_are_sorted_and_unique() {
        let mut n = node("n1", None, "10.0.2.0/24", None);
        n.pod_cidrs.push("10.0.1.0/24".parse().unwrap());
        let m2 = node("n2", None, "10.0.2.0/24", None);
        let m = build([&n, &m2], &SiteConfig::default(), &Holders::default());
        let got = m.sites[&SiteName::default_site()].subnets();
        assert_eq!(
            got,
            vec![
                "10.0.1.0/24".parse::<IpNet>().unwrap(),
                "10.0.2.0/24".parse().unwrap()
            ]
        );
    }
}
