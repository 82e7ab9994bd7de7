//! The small typed subset of the Kubernetes API objects the agent reads: Node (name,
//! resourceVersion, the annotations it reads, pod CIDRs, InternalIP addresses), list metadata, a
//! watch event and Status. Every other field of a real object is skipped while it is read
//! (a real Node is 10-40 KB, mostly `status.images`), and what is kept of one Node is bounded
//! whatever the API sends: a name of at most [`MAX_NAME`] bytes (a longer one is not a Node),
//! the [`KEPT_ANNOTATIONS`] only, each at most [`MAX_ANNOTATION`] bytes (the sites' NAT
//! discovery annotation [`MAX_OBSERVED_BYTES`]), at most
//! [`MAX_KEPT_LABELS`] labels whose key contains [`KEPT_LABEL_MARK`] (their keys at most 316
//! bytes, as the API allows), at most [`MAX_KEPT_ADDRESSES`] InternalIP addresses and
//! [`MAX_CIDRS`] pod CIDRs of at most [`MAX_SHORT`] bytes each (a longer value is kept as a
//! short marker no rule accepts). So one kept Node is at most about 12 KB (name 253, the 4 KB
//! discovery annotation, ten other annotations and eight labels of 256 with their keys, eight addresses and four CIDRs of 64,
//! and the structure), and the 10,000 a list may hold at most 120 MB; a Node without such labels
//! keeps the 3.5 KB it did.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "resourceVersion", deserialize_with = "short")]
    pub resource_version: String,
    /// Only the annotations the agent reads ([`KEPT_ANNOTATIONS`]), and [`STICKY_MARKER`] when
    /// the Node has any other `sticky-cni.io/` annotation.
    #[serde(default, deserialize_with = "kept_annotations")]
    pub annotations: BTreeMap<String, String>,
    /// Only the labels sites read: keys containing [`KEPT_LABEL_MARK`] (the site label,
    /// whatever key the config names, and the gateway label), at most [`MAX_KEPT_LABELS`].
    #[serde(default, deserialize_with = "kept_labels")]
    pub labels: BTreeMap<String, String>,
}

/// The annotations the agent reads.
pub const KEPT_ANNOTATIONS: [&str; 11] = [
    "sticky-cni.io/gateway-endpoint",
    "sticky-cni.io/observed-endpoints",
    "sticky-cni.io/wireguard-public-key",
    "sticky-cni.io/underlay-ip",
    "sticky-cni.io/kept-mac",
    "flannel.alpha.coreos.com/backend-data",
    "flannel.alpha.coreos.com/backend-v6-data",
    "flannel.alpha.coreos.com/backend-type",
    "flannel.alpha.coreos.com/public-ip",
    "flannel.alpha.coreos.com/public-ipv6",
    "flannel.alpha.coreos.com/kube-subnet-manager",
];
/// Kept (with an empty value) for a Node that has any `sticky-cni.io/` annotation: it is run
/// by sticky-cni.
pub const STICKY_MARKER: &str = "sticky-cni.io/";
/// A label is kept when its key contains this (the site label's key must: a config's
/// `sites.siteLabel` is checked for it).
pub const KEPT_LABEL_MARK: &str = "sticky-cni";
/// At most this many labels are kept of one Node (the first by key order of arrival).
pub const MAX_KEPT_LABELS: usize = 8;

/// A Node name longer than this (Kubernetes allows 253) is not a Node.
pub const MAX_NAME: usize = 253;
/// An annotation value longer than this is kept as a short marker that no rule accepts.
pub const MAX_ANNOTATION: usize = 256;
/// The bound of the sites' NAT discovery annotation (a reachable gateway's observations).
pub const MAX_OBSERVED_BYTES: usize = sticky_sites::discovery::MAX_BYTES;
use sticky_sites::discovery::OBSERVED_ENDPOINTS_ANNOTATION;
/// An address, a CIDR or a resourceVersion longer than this is kept as a marker.
pub const MAX_SHORT: usize = 64;
pub const MAX_KEPT_ADDRESSES: usize = 8;
pub const MAX_CIDRS: usize = 4;

/// `value`, or a short marker saying how long it was when it is longer than `max`.
pub fn bounded(value: String, max: usize) -> String {
    if value.len() > max {
        format!("<{} bytes: longer than {max}>", value.len())
    } else {
        value
    }
}

fn short<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(bounded(String::deserialize(d)?, MAX_SHORT))
}

fn short_option<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|v| bounded(v, MAX_SHORT)))
}

fn cidrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(kept_cidrs(null_as_default::<_, Vec<String>>(d)?))
}

/// The first [`MAX_CIDRS`] pod CIDRs, each bounded.
pub fn kept_cidrs(all: impl IntoIterator<Item = String>) -> Vec<String> {
    all.into_iter()
        .take(MAX_CIDRS)
        .map(|c| bounded(c, MAX_SHORT))
        .collect()
}

fn kept_annotations<'de, D>(d: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    d.deserialize_option(Kept::Annotations)
}

fn kept_labels<'de, D>(d: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    d.deserialize_option(Kept::Labels)
}

/// Which of a map's entries are kept, read one by one (the rest skipped unread).
#[derive(Clone, Copy)]
pub enum Kept {
    /// [`KEPT_ANNOTATIONS`], and [`STICKY_MARKER`] for any other `sticky-cni.io/` one.
    Annotations,
    /// Keys containing [`KEPT_LABEL_MARK`], at most [`MAX_KEPT_LABELS`].
    Labels,
}

impl<'de> serde::de::Visitor<'de> for Kept {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.wants(&key, &out) {
                let value: String = map.next_value()?;
                self.insert(&mut out, key, value);
            } else {
                self.insert_marker(&mut out, &key);
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

impl Kept {
    /// Whether the entry `key` is kept, `out` holding those kept so far.
    fn wants(self, key: &str, out: &BTreeMap<String, String>) -> bool {
        match self {
            Kept::Annotations => KEPT_ANNOTATIONS.contains(&key),
            Kept::Labels => key.contains(KEPT_LABEL_MARK) && out.len() < MAX_KEPT_LABELS,
        }
    }

    /// Keeps a wanted entry, its value bounded.
    fn insert(self, out: &mut BTreeMap<String, String>, key: String, value: String) {
        // The NAT discovery annotation holds one entry per NATed gateway.
        let max = match key == OBSERVED_ENDPOINTS_ANNOTATION {
            true => MAX_OBSERVED_BYTES,
            false => MAX_ANNOTATION,
        };
        out.insert(key, bounded(value, max));
    }

    /// Notes an entry not kept: [`STICKY_MARKER`] for a `sticky-cni.io/` annotation.
    fn insert_marker(self, out: &mut BTreeMap<String, String>, key: &str) {
        if matches!(self, Kept::Annotations) && key.starts_with(STICKY_MARKER) {
            out.insert(STICKY_MARKER.to_string(), String::new());
        }
    }

    /// What is kept of `entries`, in the order they came: the rules the JSON reader applies
    /// as it reads, for an encoding that hands over the whole map.
    pub fn of(
        self,
        entries: impl IntoIterator<Item = (String, String)>,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (key, value) in entries {
            if self.wants(&key, &out) {
                self.insert(&mut out, key, value);
            } else {
                self.insert_marker(&mut out, &key);
            }
        }
        out
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeSpec {
    #[serde(default, rename = "podCIDR", deserialize_with = "short_option")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs", deserialize_with = "cidrs")]
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
    /// The first [`MAX_KEPT_ADDRESSES`] InternalIP addresses.
    #[serde(default, deserialize_with = "internal_addresses")]
    pub addresses: Vec<NodeAddress>,
}

fn internal_addresses<'de, D>(d: D) -> Result<Vec<NodeAddress>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(kept_addresses(null_as_default::<_, Vec<NodeAddress>>(d)?))
}

/// The first [`MAX_KEPT_ADDRESSES`] InternalIP addresses, each bounded.
pub fn kept_addresses(all: impl IntoIterator<Item = NodeAddress>) -> Vec<NodeAddress> {
    all.into_iter()
        .filter(|a| a.kind == "InternalIP")
        .take(MAX_KEPT_ADDRESSES)
        .map(|a| NodeAddress {
            kind: a.kind,
            address: bounded(a.address, MAX_SHORT),
        })
        .collect()
}

impl Node {
    /// False for a Node the agent cannot keep (a name longer than [`MAX_NAME`]).
    pub fn keepable(&self) -> bool {
        self.metadata.name.len() <= MAX_NAME
    }
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

/// Why a line of a watch stream is not an event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("watch event is not JSON of the form {{\"type\", \"object\"}}: {0}")]
    Json(#[source] serde_json::Error),
    #[error("{kind} event: the object is not a Node: {source}")]
    Object {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("unknown watch event type {0:?}")]
    Kind(String),
}

/// One line of a watch stream, with the object left unparsed until its type is known.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a serde_json::value::RawValue,
}

/// One line of a watch stream whose object is a Node: every event but ERROR, in one pass.
#[derive(Deserialize)]
struct NodeLine {
    #[serde(rename = "type")]
    kind: String,
    object: Node,
}

impl Event {
    /// Decodes one line of a watch stream. A line whose object is a Node (the kubelets' status
    /// updates at 100,000 Nodes: 330 a second) is read in one pass; anything else (an ERROR, a
    /// line that is no event) is read again, object by its type, for the event or the error.
    pub fn parse(line: &[u8]) -> Result<Event, EventError> {
        if let Ok(NodeLine { kind, object }) = serde_json::from_slice(line)
            && let Some(event) = Event::of_node(&kind)
        {
            return Ok(event(object));
        }
        let raw: Line = serde_json::from_slice(line).map_err(EventError::Json)?;
        let object = |source| EventError::Object {
            kind: raw.kind.clone(),
            source,
        };
        if raw.kind == "ERROR" {
            return Ok(Event::Error(
                serde_json::from_str(raw.object.get()).map_err(object)?,
            ));
        }
        let event = Event::of_node(&raw.kind).ok_or_else(|| EventError::Kind(raw.kind.clone()))?;
        Ok(event(
            serde_json::from_str::<Node>(raw.object.get()).map_err(object)?,
        ))
    }

    /// The event a type whose object is a Node makes of it; `None` for any other type.
    pub fn of_node(kind: &str) -> Option<fn(Node) -> Event> {
        match kind {
            "ADDED" => Some(Event::Added),
            "MODIFIED" => Some(Event::Modified),
            "DELETED" => Some(Event::Deleted),
            "BOOKMARK" => Some(|node: Node| Event::Bookmark(node.metadata.resource_version)),
            _ => None,
        }
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
    fn the_nat_discovery_annotation_is_kept_up_to_its_own_bound() {
        let key = OBSERVED_ENDPOINTS_ANNOTATION;
        let node = |len: usize| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "c1",
                "annotations": {key: "x".repeat(len), "sticky-cni.io/gateway-endpoint": "y".repeat(len)}}}))
            .unwrap()
        };
        let n = node(MAX_OBSERVED_BYTES);
        assert_eq!(n.metadata.annotations[key].len(), MAX_OBSERVED_BYTES);
        assert!(
            n.metadata.annotations["sticky-cni.io/gateway-endpoint"].starts_with('<'),
            "other annotations keep their bound"
        );
        let n = node(MAX_OBSERVED_BYTES + 1);
        assert_eq!(
            n.metadata.annotations[key],
            format!(
                "<{} bytes: longer than {MAX_OBSERVED_BYTES}>",
                MAX_OBSERVED_BYTES + 1
            )
        );
    }

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
