//! `--publish-flannel-annotations`: this node's flannel annotations for the network's
//! underlay family (backend-type vxlan; backend-data and public-ip on IPv4, backend-v6-data and
//! public-ipv6 on IPv6, the backend data with the VNI and the kept MAC; kube-subnet-manager),
//! so flannel nodes learn it during a migration, plus `sticky-cni.io/kept-mac`, which tells
//! other sticky-cni agents to compute its MAC rather than read flannel's. And on a site
//! gateway (docs/sites.md), `sticky-cni.io/wireguard-public-key`: its tunnel's public key, so
//! that other sites can reach it; on a site gateway others can dial,
//! `sticky-cni.io/observed-endpoints`: where its peers behind NAT come from (NAT discovery).
//! All go in the one PATCH of nodes/status.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::api::{ApiError, NodeApi};
use super::clock::Backoff;
use super::family::Family;
use super::mapping::{self, FLANNEL_BACKEND_TYPE, FLANNEL_KUBE_MANAGED, KEPT_MAC_ANNOTATION};
use super::objects::Node;
use sticky_netlink::link::format_mac;
use sticky_overlay::mac::vtep_mac;
use sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION;
use sticky_sites::keys::PublicKey;
use sticky_sites::model::PUBLIC_KEY_ANNOTATION;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This node's own Node cannot say its underlay address yet.
    #[error("node {node}: {source}")]
    Unknown {
        node: String,
        #[source]
        source: mapping::Skip,
    },
    #[error(transparent)]
    Api(#[from] ApiError),
}

pub struct Publisher {
    pub node_name: String,
    pub vni: u32,
    /// The network's underlay family: which address and which of flannel's keys.
    pub family: Family,
    /// Whether flannel's annotations are published (`--publish-flannel-annotations`).
    pub flannel: bool,
    /// The site gateway's public key, when this node is one.
    pub public_key: Option<PublicKey>,
    /// On a reachable site gateway: the NAT discovery annotation's value (the endpoints its
    /// peers behind NAT come from, `sticky_sites::discovery`).
    pub observed_endpoints: Option<String>,
}

impl Publisher {
    /// The annotations this node should carry; `Err` while its underlay is unknown.
    pub fn wanted(&self, own: &Node) -> Result<BTreeMap<String, String>, mapping::Skip> {
        let mut wanted = match self.flannel {
            true => self.flannel_wanted(own)?,
            false => BTreeMap::new(),
        };
        if let Some(k) = &self.public_key {
            wanted.insert(PUBLIC_KEY_ANNOTATION.to_string(), k.to_base64());
        }
        if let Some(v) = &self.observed_endpoints {
            wanted.insert(OBSERVED_ENDPOINTS_ANNOTATION.to_string(), v.clone());
        }
        Ok(wanted)
    }

    fn flannel_wanted(&self, own: &Node) -> Result<BTreeMap<String, String>, mapping::Skip> {
        let ip = mapping::own_underlay(own, self.family)?;
        let mac = format_mac(&vtep_mac(ip, self.vni));
        Ok(BTreeMap::from([
            (FLANNEL_BACKEND_TYPE.to_string(), "vxlan".to_string()),
            (
                mapping::flannel_backend_data(self.family).to_string(),
                serde_json::json!({"VNI": self.vni, "VtepMAC": mac}).to_string(),
            ),
            (
                mapping::flannel_public_ip(self.family).to_string(),
                ip.to_string(),
            ),
            (FLANNEL_KUBE_MANAGED.to_string(), "true".to_string()),
            (KEPT_MAC_ANNOTATION.to_string(), mac),
        ]))
    }

    /// Patches the Node if one of its annotations differs; true when it did.
    pub fn publish(&self, api: &mut impl NodeApi, own: &Node) -> Result<bool, Error> {
        let wanted = self.wanted(own).map_err(|source| Error::Unknown {
            node: self.node_name.clone(),
            source,
        })?;
        let current = &own.metadata.annotations;
        if wanted.iter().all(|(k, v)| current.get(k) == Some(v)) {
            return Ok(false);
        }
        api.annotate(&self.node_name, &wanted)?;
        Ok(true)
    }
}

/// Publishing that does not give up: the own Node's annotations are patched when it changes,
/// and a PATCH that failed (a 403 before RBAC is fixed, a 5xx, a broken connection) is tried
/// again after a capped backoff ([`Backoff`]: 1 s doubling to 30 s, spread), with the latest
/// own Node, until it succeeds; not only at the Node's next change.
pub struct Publishing {
    pub publisher: Publisher,
    /// The latest own Node, while its annotations may still need publishing.
    pending: Option<Node>,
    /// When the next attempt is due, after a failed one.
    retry_at: Option<Instant>,
    backoff: Backoff,
}

/// What one [`Publishing::run`] came to.
#[derive(Debug)]
pub enum Attempt {
    /// Nothing to publish, or not due yet.
    Idle,
    Published,
    /// The PATCH failed; tried again after `retry_in`.
    Failed {
        error: Error,
        retry_in: Duration,
    },
    /// This node's Node cannot say its underlay yet: tried again at its next change.
    Unknown(Error),
}

impl Publishing {
    pub fn new(publisher: Publisher, backoff: Backoff) -> Publishing {
        Publishing {
            publisher,
            pending: None,
            retry_at: None,
            backoff,
        }
    }

    /// The own Node changed: it is published at the next [`run`](Self::run), at once.
    pub fn offer(&mut self, own: Node) {
        self.pending = Some(own);
        self.retry_at = None;
    }

    /// Publishes the pending own Node if an attempt is due at `now`.
    pub fn run(&mut self, api: &mut impl NodeApi, now: Instant) -> Attempt {
        let Some(own) = &self.pending else {
            return Attempt::Idle;
        };
        if self.retry_at.is_some_and(|t| now < t) {
            return Attempt::Idle;
        }
        match self.publisher.publish(api, own) {
            Ok(patched) => {
                self.pending = None;
                self.retry_at = None;
                if patched {
                    Attempt::Published
                } else {
                    Attempt::Idle
                }
            }
            Err(error @ Error::Unknown { .. }) => {
                self.pending = None;
                Attempt::Unknown(error)
            }
            Err(error) => {
                let retry_in = self.backoff.next_wait(now);
                self.retry_at = Some(now + retry_in);
                Attempt::Failed { error, retry_in }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Events, ListFrom, NodePage};
    use crate::mapping::{
        FLANNEL_BACKEND_DATA, FLANNEL_BACKEND_V6_DATA, FLANNEL_PUBLIC_IP, FLANNEL_PUBLIC_IPV6,
    };
    use std::time::Duration;

    /// Node `n2` with a dual-stack kubelet's InternalIPs.
    fn own() -> Node {
        serde_json::from_str(
            r#"{"metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.2"},{"type":"InternalIP","address":"2001:db8::2"},{"type":"Hostname","address":"n2"}]}}"#,
        )
        .unwrap()
    }

    fn publisher(family: Family) -> Publisher {
        Publisher {
            node_name: "n2".into(),
            vni: 1,
            family,
            flannel: true,
            public_key: None,
            observed_endpoints: None,
        }
    }

    /// Records the patches; fails them when `refuse` is set. Lists and watches are not
    /// the publisher's business.
    #[derive(Default)]
    struct Patches {
        sent: Vec<(String, BTreeMap<String, String>)>,
        refuse: bool,
        /// Refuses this many more, then accepts.
        refuse_next: usize,
    }

    impl NodeApi for Patches {
        fn list(&mut self, _: &ListFrom, _: Option<&str>) -> Result<NodePage, ApiError> {
            unreachable!("the publisher never lists")
        }
        fn watch(&mut self, _: &str, _: Duration) -> Result<Box<dyn Events + '_>, ApiError> {
            unreachable!("the publisher never watches")
        }
        fn annotate(
            &mut self,
            name: &str,
            annotations: &BTreeMap<String, String>,
        ) -> Result<(), ApiError> {
            if self.refuse || self.refuse_next > 0 {
                self.refuse_next = self.refuse_next.saturating_sub(1);
                return Err(ApiError::Status {
                    what: format!("PATCH node {name}"),
                    code: 403,
                    reason: "Forbidden".into(),
                    message: "nodes/status is forbidden".into(),
                });
            }
            self.sent.push((name.to_string(), annotations.clone()));
            Ok(())
        }
    }

    #[test]
    fn patches_only_what_differs_and_says_why_it_could_not() {
        let p = publisher(Family::V4);
        let mut own: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.2"}]}}"#,
        )
        .unwrap();
        let mut api = Patches::default();
        assert!(p.publish(&mut api, &own).unwrap());
        assert_eq!(api.sent.len(), 1);
        own.metadata.annotations = api.sent[0].1.clone();
        assert!(!p.publish(&mut api, &own).unwrap(), "nothing differs");
        assert_eq!(api.sent.len(), 1);

        let bare: Node = serde_json::from_str(r#"{"metadata":{"name":"n2"}}"#).unwrap();
        let err = p.publish(&mut api, &bare).unwrap_err();
        assert!(matches!(err, Error::Unknown { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("node n2: has no IPv4 underlay address"),
            "{err}"
        );
        let mut refusing = Patches {
            refuse: true,
            ..Patches::default()
        };
        own.metadata.annotations.clear();
        let err = p.publish(&mut refusing, &own).unwrap_err();
        assert_eq!(
            err.to_string(),
            "PATCH node n2: HTTP 403 Forbidden: nodes/status is forbidden"
        );
    }

    #[test]
    fn a_site_gateway_publishes_its_public_key_alone_or_with_flannels() {
        let key = sticky_sites::keys::PrivateKey::from_bytes([7; 32]).public_key();
        let mut p = Publisher {
            flannel: false,
            public_key: Some(key),
            ..publisher(Family::V4)
        };
        // No underlay needed for the key alone.
        let bare: Node = serde_json::from_str(r#"{"metadata":{"name":"n2"}}"#).unwrap();
        let w = p.wanted(&bare).unwrap();
        assert_eq!(
            w,
            BTreeMap::from([(PUBLIC_KEY_ANNOTATION.to_string(), key.to_base64())])
        );
        p.flannel = true;
        let w = p.wanted(&own()).unwrap();
        assert_eq!(w[PUBLIC_KEY_ANNOTATION], key.to_base64());
        assert!(w.contains_key(KEPT_MAC_ANNOTATION));
        // Neither: nothing to publish.
        p.flannel = false;
        p.public_key = None;
        assert!(p.wanted(&bare).unwrap().is_empty());
    }

    #[test]
    fn flannel_reads_back_the_kept_mac() {
        let w = publisher(Family::V4).wanted(&own()).unwrap();
        assert_eq!(
            w[FLANNEL_BACKEND_DATA],
            r#"{"VNI":1,"VtepMAC":"0a:01:c0:00:02:02"}"#
        );
        assert_eq!(w[FLANNEL_PUBLIC_IP], "192.0.2.2");
        assert_eq!(w[KEPT_MAC_ANNOTATION], "0a:01:c0:00:02:02");
        assert!(!w.contains_key(FLANNEL_BACKEND_V6_DATA) && !w.contains_key(FLANNEL_PUBLIC_IPV6));
    }

    #[test]
    fn on_an_ipv6_underlay_the_v6_annotations_carry_the_kept_ipv6_mac() {
        let w = publisher(Family::V6).wanted(&own()).unwrap();
        let mac = format_mac(&vtep_mac("2001:db8::2".parse().unwrap(), 1));
        assert!(mac.starts_with("06:"), "{mac}");
        assert_eq!(
            w[FLANNEL_BACKEND_V6_DATA],
            format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#)
        );
        assert_eq!(w[FLANNEL_PUBLIC_IPV6], "2001:db8::2");
        assert_eq!(w[KEPT_MAC_ANNOTATION], mac);
        assert_eq!(w[FLANNEL_BACKEND_TYPE], "vxlan");
        assert_eq!(w[FLANNEL_KUBE_MANAGED], "true");
        assert!(
            !w.contains_key(FLANNEL_BACKEND_DATA) && !w.contains_key(FLANNEL_PUBLIC_IP),
            "{w:?}"
        );
        // Other agents map the published Node as a sticky-cni node: its kept MAC, computed.
        let mut published = own();
        published.metadata.annotations = w.into_iter().collect();
        published.spec.pod_cidrs = vec!["10.244.2.0/24".into(), "fd00:2::/64".into()];
        let e = mapping::node_entry(&published, Family::V6).unwrap();
        assert_eq!((e.ip, e.mac), ("2001:db8::2".parse().unwrap(), None));
        // No IPv6 InternalIP: nothing to publish yet.
        let v4_only: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.2"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            publisher(Family::V6).wanted(&v4_only),
            Err(mapping::Skip::NoUnderlay(Family::V6))
        );
    }

    /// Issue 27, defect 8: a refused PATCH waited for the Node's next change. Now it is tried
    /// again after a backoff, with nothing changing, until it goes through; the waits double
    /// up to the cap.
    #[test]
    fn a_refused_patch_is_tried_again_after_a_backoff_until_it_succeeds() {
        let mut p = Publishing::new(publisher(Family::V4), Backoff::seeded(3));
        let mut api = Patches {
            refuse_next: 8,
            ..Patches::default()
        };
        let mut now = Instant::now();
        p.offer(own());
        let mut waits = Vec::new();
        loop {
            match p.run(&mut api, now) {
                Attempt::Failed { error, retry_in } => {
                    assert!(error.to_string().contains("HTTP 403"), "{error}");
                    // Not due before its time.
                    assert!(matches!(p.run(&mut api, now + retry_in / 2), Attempt::Idle));
                    waits.push(retry_in);
                    now += retry_in;
                }
                Attempt::Published => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits.len(), 8);
        assert_eq!(api.sent.len(), 1, "published once it was allowed");
        assert!(waits[0] <= Backoff::MIN * 3 / 2, "{waits:?}");
        assert!(
            waits.iter().all(|w| *w <= Backoff::MAX * 3 / 2),
            "capped: {waits:?}"
        );
        assert!(waits[7] >= Backoff::MAX / 2, "grew to the cap: {waits:?}");
        assert!(matches!(p.run(&mut api, now), Attempt::Idle), "done");
        // A Node with no underlay yet: nothing to retry until it changes.
        let bare: Node = serde_json::from_str(r#"{"metadata":{"name":"n2"}}"#).unwrap();
        p.offer(bare);
        assert!(matches!(p.run(&mut api, now), Attempt::Unknown(_)));
        assert!(matches!(
            p.run(&mut api, now + Backoff::MAX * 2),
            Attempt::Idle
        ));
    }
}
