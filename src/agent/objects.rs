//! The small typed subset of the Kubernetes API objects the agent reads: Node (name,
//! resourceVersion, annotations, pod CIDRs, addresses), NodeList, a watch event and Status.
//! Every other field of a real object is ignored.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeSpec {
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs", deserialize_with = "null_as_default")]
    pub pod_cidrs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub addresses: Vec<NodeAddress>,
}

/// A Node object (`/api/v1/nodes/<name>`), reduced to what the agent uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

/// `GET /api/v1/nodes`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeList {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<Node>,
}

/// A `Status` object: what the API answers with on errors, and the object of an ERROR event.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// One line of a watch stream.
#[derive(Debug, Clone, Deserialize)]
pub struct RawEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub object: serde_json::Value,
}

/// A watch event, decoded by type.
#[derive(Debug, Clone)]
pub enum Event {
    Added(Node),
    Modified(Node),
    Deleted(Node),
    /// Only the resourceVersion is meaningful.
    Bookmark(String),
    Error(Status),
}

impl Event {
    /// Decodes one line of a watch stream.
    pub fn parse(line: &[u8]) -> Result<Event, String> {
        let raw: RawEvent =
            serde_json::from_slice(line).map_err(|e| format!("watch event is not JSON: {e}"))?;
        let node = |v: serde_json::Value| {
            serde_json::from_value::<Node>(v).map_err(|e| format!("{} event: {e}", raw.kind))
        };
        Ok(match raw.kind.as_str() {
            "ADDED" => Event::Added(node(raw.object)?),
            "MODIFIED" => Event::Modified(node(raw.object)?),
            "DELETED" => Event::Deleted(node(raw.object)?),
            "BOOKMARK" => Event::Bookmark(node(raw.object)?.metadata.resource_version),
            "ERROR" => Event::Error(
                serde_json::from_value(raw.object).map_err(|e| format!("ERROR event: {e}"))?,
            ),
            other => return Err(format!("unknown watch event type {other:?}")),
        })
    }
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_every_type() {
        let e = Event::parse(br#"{"type":"ADDED","object":{"kind":"Node","metadata":{"name":"a","resourceVersion":"5","annotations":null},"spec":{"podCIDR":"10.244.1.0/24"}}}"#).unwrap();
        assert!(
            matches!(e, Event::Added(n) if n.metadata.name == "a" && n.metadata.resource_version == "5")
        );
        let e = Event::parse(
            br#"{"type":"BOOKMARK","object":{"kind":"Node","metadata":{"resourceVersion":"12"}}}"#,
        )
        .unwrap();
        assert!(matches!(e, Event::Bookmark(rv) if rv == "12"));
        let e = Event::parse(br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}}"#).unwrap();
        assert!(matches!(e, Event::Error(s) if s.code == 410));
        assert!(Event::parse(br#"{"type":"SURPRISE","object":{}}"#).is_err());
        assert!(Event::parse(b"{").is_err());
    }
}
