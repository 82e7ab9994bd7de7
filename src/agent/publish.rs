//! `--publish-flannel-annotations`: this node's flannel annotations (backend-type vxlan,
//! backend-data with the VNI and the kept MAC, public-ip, kube-subnet-manager), so flannel
//! nodes learn it during a migration, plus `sticky-cni.io/kept-mac`, which tells other
//! sticky-cni agents to compute its MAC rather than read flannel's.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::api::{ApiError, NodeApi};
use super::mapping::{
    self, FLANNEL_BACKEND_DATA, FLANNEL_BACKEND_TYPE, FLANNEL_KUBE_MANAGED, FLANNEL_PUBLIC_IP,
    KEPT_MAC_ANNOTATION,
};
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
}

impl Publisher {
    /// The annotations this node should carry; `None` while its underlay is unknown.
    pub fn wanted(&self, own: &Node) -> Result<BTreeMap<String, String>, mapping::Skip> {
        let ip = mapping::own_underlay(own)?;
        let mac = format_mac(&vtep_mac(IpAddr::V4(ip), self.vni));
        Ok(BTreeMap::from([
            (FLANNEL_BACKEND_TYPE.to_string(), "vxlan".to_string()),
            (
                FLANNEL_BACKEND_DATA.to_string(),
                serde_json::json!({"VNI": self.vni, "VtepMAC": mac}).to_string(),
            ),
            (FLANNEL_PUBLIC_IP.to_string(), ip.to_string()),
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
    use std::time::Duration;

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
        let p = Publisher {
            node_name: "n2".into(),
            vni: 1,
        };
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
        let own: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.2"}]}}"#,
        )
        .unwrap();
        let p = Publisher {
            node_name: "n2".into(),
            vni: 1,
        };
        let w = p.wanted(&own).unwrap();
        assert_eq!(
            w[FLANNEL_BACKEND_DATA],
            r#"{"VNI":1,"VtepMAC":"0a:01:c0:00:02:02"}"#
        );
        assert_eq!(w[FLANNEL_PUBLIC_IP], "192.0.2.2");
        assert_eq!(w[KEPT_MAC_ANNOTATION], "0a:01:c0:00:02:02");
    }
}
