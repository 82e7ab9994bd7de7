//! `--publish-flannel-annotations`: this node's flannel annotations (backend-type vxlan,
//! backend-data with the VNI and the kept MAC, public-ip, kube-subnet-manager), so flannel
//! nodes learn it during a migration, plus `sticky-cni.io/kept-mac`, which tells other
//! sticky-cni agents to compute its MAC rather than read flannel's.

use std::collections::BTreeMap;

use super::api::NodeApi;
use super::mapping::{
    self, FLANNEL_BACKEND_DATA, FLANNEL_BACKEND_TYPE, FLANNEL_KUBE_MANAGED, FLANNEL_PUBLIC_IP,
    KEPT_MAC_ANNOTATION,
};
use super::objects::Node;
use crate::netlink::link::format_mac;
use crate::vxlan::mac::vtep_mac;

pub struct Publisher {
    pub node_name: String,
    pub vni: u32,
}

impl Publisher {
    /// The annotations this node should carry; `None` while its underlay is unknown.
    pub fn wanted(&self, own: &Node) -> Result<BTreeMap<String, String>, mapping::Skip> {
        let ip = mapping::own_underlay(own)?;
        let mac = format_mac(&vtep_mac(ip, self.vni));
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
    pub fn publish(&self, api: &mut impl NodeApi, own: &Node) -> Result<bool, String> {
        let wanted = self
            .wanted(own)
            .map_err(|e| format!("node {}: {e}", self.node_name))?;
        let current = &own.metadata.annotations;
        if wanted.iter().all(|(k, v)| current.get(k) == Some(v)) {
            return Ok(false);
        }
        api.annotate(&self.node_name, &wanted)
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
