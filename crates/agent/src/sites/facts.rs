//! What sites read of a Node, and the inputs of the site model for the placed Nodes.

use std::collections::BTreeMap;

use sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION;
use sticky_sites::model::{ENDPOINT_ANNOTATION, NodeInput, PUBLIC_KEY_ANNOTATION};

use crate::objects::Node;
use crate::table::Placed;

/// A Node's labels and annotations as far as sites read them (the object keeps only labels
/// whose key contains `sticky-cni`, and the sites annotations among its kept ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// What sites read of `node`.
pub fn of(node: &Node) -> Facts {
    let annotations = [
        ENDPOINT_ANNOTATION,
        PUBLIC_KEY_ANNOTATION,
        OBSERVED_ENDPOINTS_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|k| {
        node.metadata
            .annotations
            .get(k)
            .map(|v| (k.to_string(), v.clone()))
    })
    .collect();
    Facts {
        labels: node.metadata.labels.clone(),
        annotations,
    }
}

/// The model's inputs: every placed Node (its peer entry gives the pod subnets and the
/// underlay address) with its facts. A Node left out of the peers is left out of the sites
/// too: its subnets or address conflict, so no site may route them. O(n log n).
pub fn inputs(placed: &Placed, facts: &BTreeMap<String, Facts>) -> Vec<NodeInput> {
    placed
        .peers
        .iter()
        .map(|(name, peer)| {
            let f = facts.get(name).cloned().unwrap_or_default();
            NodeInput {
                name: name.clone(),
                labels: f.labels,
                annotations: f.annotations,
                pod_cidrs: peer.subnets.clone(),
                underlay: Some(peer.ip),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sites_labels_and_annotations_are_read() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "a1",
                "labels": {
                    "sticky-cni.io/site": "shop-1",
                    "sticky-cni.io/gateway": "true",
                    "node-restriction.kubernetes.io/sticky-cni-site": "shop-1",
                    "kubernetes.io/hostname": "a1",
                    "topology.kubernetes.io/zone": "z"
                },
                "annotations": {
                    "sticky-cni.io/gateway-endpoint": "203.0.113.10:51820",
                    "sticky-cni.io/wireguard-public-key": "k",
                    "sticky-cni.io/observed-endpoints": "{}",
                    "sticky-cni.io/underlay-ip": "192.0.2.1",
                    "other.example/x": "y"
                }
            }
        }))
        .unwrap();
        let f = of(&node);
        assert_eq!(
            f.labels.keys().collect::<Vec<_>>(),
            [
                "node-restriction.kubernetes.io/sticky-cni-site",
                "sticky-cni.io/gateway",
                "sticky-cni.io/site"
            ]
        );
        assert_eq!(
            f.annotations.keys().collect::<Vec<_>>(),
            [
                ENDPOINT_ANNOTATION,
                OBSERVED_ENDPOINTS_ANNOTATION,
                PUBLIC_KEY_ANNOTATION
            ]
        );
    }

    #[test]
    fn at_most_eight_labels_are_kept() {
        let labels: serde_json::Map<String, serde_json::Value> = (0..20)
            .map(|i| (format!("sticky-cni.io/l{i:02}"), "v".into()))
            .collect();
        let node: Node = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n", "labels": labels}}),
        )
        .unwrap();
        assert_eq!(node.metadata.labels.len(), 8);
    }
}
