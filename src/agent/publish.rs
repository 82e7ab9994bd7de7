//! `--publish-flannel-annotations`: this node's flannel annotations for the network's
//! underlay family (backend-type vxlan; backend-data and public-ip on IPv4, backend-v6-data and
//! public-ipv6 on IPv6, the backend data with the VNI and the kept MAC; kube-subnet-manager),
//! so flannel nodes learn it during a migration, plus `sticky-cni.io/kept-mac`, which tells
//! other sticky-cni agents to compute its MAC rather than read flannel's.

use std::collections::BTreeMap;

use super::api::{ApiError, NodeApi};
use super::family::Family;
use super::mapping::{self, FLANNEL_BACKEND_TYPE, FLANNEL_KUBE_MANAGED, KEPT_MAC_ANNOTATION};
use super::objects::Node;
use crate::netlink::link::format_mac;
use crate::vxlan::mac::vtep_mac;

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
}

impl Publisher {
    /// The annotations this node should carry; `Err` while its underlay is unknown.
    pub fn wanted(&self, own: &Node) -> Result<BTreeMap<String, String>, mapping::Skip> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::api::{Events, ListFrom, NodePage};
    use crate::agent::mapping::{
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
        }
    }

    /// Records the patches; fails them when `refuse` is set. Lists and watches are not
    /// the publisher's business.
    #[derive(Default)]
    struct Patches {
        sent: Vec<(String, BTreeMap<String, String>)>,
        refuse: bool,
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
            if self.refuse {
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
}
