//! Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`) of what the agent
//! reads: a NodeList page, a watch's events and a `Status`, each reduced to the same [`Node`]
//! the JSON reader keeps, by the same rules ([`Kept`], [`kept_cidrs`], [`kept_addresses`]).
//!
//! Why: at 100,000 Nodes the kubelets' heartbeats are 330 watch events a second of 10 KB,
//! mostly `status.images` and conditions the agent never reads. In JSON every byte of them is
//! scanned; here a field the agent does not read is one length to jump over.
//!
//! The wire, as the API server writes it (apimachinery's protobuf serializer): an answer is
//! the magic `k8s\0` and a `runtime.Unknown` whose `raw` is the object's message; a watch is
//! frames of a 4-byte big-endian length and a `meta/v1.WatchEvent` (without the magic) whose
//! object's `raw` is such an answer. The messages below name only the fields the agent keeps,
//! with Kubernetes' field numbers (`generated.proto` of `k8s.io/api/core/v1`,
//! `k8s.io/apimachinery/pkg/apis/meta/v1` and `pkg/runtime`); prost skips every other field.
//!
//! Bounds: a list page is read as it streams, one item at a time, each at most
//! [`super::EVENT_LIMIT`] bytes, at most `max_nodes` of them; a watch frame is at most
//! [`super::EVENT_LIMIT`] bytes before it is read.

use std::collections::BTreeMap;
use std::io::Read;

use prost::Message;
use prost::bytes::Bytes;

use super::EVENT_LIMIT;
use crate::api::NodePage;
use crate::objects::{
    Event, Kept, MAX_SHORT, Node, NodeAddress, NodeSpec, NodeStatus, ObjectMeta, Status, bounded,
    kept_addresses, kept_cidrs,
};

/// Before every object that is not in a watch frame.
pub const MAGIC: &[u8; 4] = b"k8s\0";
/// The media type of a protobuf answer (a watch's adds `;stream=watch`).
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// What the agent accepts for a list or a watch: protobuf, which a real API server speaks for
/// Nodes, and JSON from one that does not (a proxy, an aggregated server).
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
/// The list's metadata (a continue token, a resourceVersion): far below this.
const LIST_META_LIMIT: u64 = 1024 * 1024;

/// Why an answer is not what the protobuf encoding should carry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no k8s\\0 magic before the object")]
    Magic,
    #[error("a {what} that is not protobuf: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("a {what} of {len} bytes (the agent's limit is {limit})")]
    TooLarge {
        what: &'static str,
        len: u64,
        limit: u64,
    },
    #[error("more than {0} Nodes in one page")]
    TooManyNodes(usize),
    #[error("a {0} where a NodeList was expected")]
    NotAList(String),
    #[error("a varint longer than ten bytes")]
    Varint,
    #[error("wire type {0}, which Kubernetes never writes")]
    WireType(u64),
    #[error("unknown watch event type {0:?}")]
    Kind(String),
}

impl Error {
    /// True when the body ended early or broke: the connection, not the server's answer.
    pub fn is_io(&self) -> bool {
        matches!(self, Error::Io(_))
    }
}

/// Its `raw` (and [`RawExtension`]'s) is a slice of the frame read, not a copy.
#[derive(Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", tag = "2")]
    raw: Bytes,
}

#[derive(Message)]
struct TypeMeta {
    #[prost(string, tag = "2")]
    kind: String,
}

#[derive(Message)]
struct WireNode {
    #[prost(message, optional, tag = "1")]
    metadata: Option<WireMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<WireSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<WireStatus>,
}

#[derive(Message)]
struct WireMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "6")]
    resource_version: String,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
}

#[derive(Message)]
struct WireSpec {
    #[prost(string, tag = "1")]
    pod_cidr: String,
    #[prost(string, repeated, tag = "7")]
    pod_cidrs: Vec<String>,
}

#[derive(Message)]
struct WireStatus {
    #[prost(message, repeated, tag = "5")]
    addresses: Vec<WireAddress>,
}

#[derive(Message)]
struct WireAddress {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(string, tag = "2")]
    address: String,
}

#[derive(Message)]
struct WireListMeta {
    #[prost(string, tag = "2")]
    resource_version: String,
    #[prost(string, tag = "3")]
    continue_token: String,
}

#[derive(Message)]
struct WireWatchEvent {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Message)]
struct RawExtension {
    #[prost(bytes = "bytes", tag = "1")]
    raw: Bytes,
}

#[derive(Message)]
struct WireStatusObject {
    #[prost(string, tag = "3")]
    message: String,
    #[prost(string, tag = "4")]
    reason: String,
    #[prost(int32, tag = "6")]
    code: i32,
}

fn decode<M: Message + Default>(
    what: &'static str,
    bytes: impl prost::bytes::Buf,
) -> Result<M, Error> {
    M::decode(bytes).map_err(|source| Error::Decode { what, source })
}

impl From<WireNode> for Node {
    fn from(n: WireNode) -> Node {
        let meta = n.metadata.unwrap_or_default();
        let spec = n.spec.unwrap_or_default();
        Node {
            metadata: ObjectMeta {
                name: meta.name,
                resource_version: bounded(meta.resource_version, MAX_SHORT),
                annotations: Kept::Annotations.of(meta.annotations),
                labels: Kept::Labels.of(meta.labels),
            },
            spec: NodeSpec {
                // Go writes an empty string where JSON leaves the field out.
                pod_cidr: Some(spec.pod_cidr)
                    .filter(|c| !c.is_empty())
                    .map(|c| bounded(c, MAX_SHORT)),
                pod_cidrs: kept_cidrs(spec.pod_cidrs),
            },
            status: NodeStatus {
                addresses: kept_addresses(n.status.unwrap_or_default().addresses.into_iter().map(
                    |a| NodeAddress {
                        kind: a.kind,
                        address: a.address,
                    },
                )),
            },
        }
    }
}

/// The message in an answer's envelope (a slice of it).
fn unwrap(what: &'static str, mut answer: Bytes) -> Result<Bytes, Error> {
    if !answer.starts_with(MAGIC) {
        return Err(Error::Magic);
    }
    let inner = answer.split_off(MAGIC.len());
    Ok(decode::<Unknown>(what, inner)?.raw)
}

impl From<WireStatusObject> for Status {
    fn from(s: WireStatusObject) -> Status {
        Status {
            code: u16::try_from(s.code).unwrap_or_default(),
            reason: s.reason,
            message: s.message,
        }
    }
}

/// A `Status` answer (an error's body).
pub fn status(answer: &[u8]) -> Result<Status, Error> {
    let raw = unwrap("Status", Bytes::copy_from_slice(answer))?;
    Ok(decode::<WireStatusObject>("Status", raw)?.into())
}

/// One watch frame (its length already read) as the event it carries.
pub fn event(frame: Vec<u8>) -> Result<Event, Error> {
    let e: WireWatchEvent = decode("WatchEvent", Bytes::from(frame))?;
    let raw = unwrap("watch event's object", e.object.unwrap_or_default().raw)?;
    if e.kind == "ERROR" {
        return Ok(Event::Error(
            decode::<WireStatusObject>("Status", raw)?.into(),
        ));
    }
    let event = Event::of_node(&e.kind).ok_or_else(|| Error::Kind(e.kind.clone()))?;
    Ok(event(decode::<WireNode>("Node", raw)?.into()))
}

/// The next watch frame of `r`: `None` at the end of the stream, between frames.
pub fn next_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, Error> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(early_end()),
            n => got += n,
        }
    }
    let len = u64::from(u32::from_be_bytes(len));
    if len > EVENT_LIMIT {
        return Err(Error::TooLarge {
            what: "watch event",
            len,
            limit: EVENT_LIMIT,
        });
    }
    read_exactly(r, len).map(Some)
}

fn early_end() -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the stream ended inside an event",
    ))
}

/// `len` bytes of `r`, or the error of a body that ended before them.
fn read_exactly(r: &mut impl Read, len: u64) -> Result<Vec<u8>, Error> {
    // `len` is bounded by the caller.
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    r.take(len).read_to_end(&mut buf)?;
    if (buf.len() as u64) < len {
        return Err(early_end());
    }
    Ok(buf)
}

/// A NodeList answer read as it streams: one item in memory at a time, a Node that cannot be
/// kept ([`Node::keepable`]) skipped, more than `max_nodes` items an error at once.
pub fn read_list(r: &mut impl Read, max_nodes: usize) -> Result<NodePage, Error> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(Error::Magic);
    }
    let mut page = NodePage::default();
    // The envelope's fields: its type, then the list.
    while let Some((field, wire)) = key(r)? {
        match (field, wire) {
            (1, 2) => {
                let len = varint(r)?;
                let bytes = read_bounded(r, len, "type", LIST_META_LIMIT)?;
                let kind = decode::<TypeMeta>("type", &bytes[..])?.kind;
                if !kind.is_empty() && kind != "NodeList" {
                    return Err(Error::NotAList(kind));
                }
            }
            (2, 2) => {
                let len = varint(r)?;
                list_fields(&mut r.take(len), max_nodes, &mut page)?;
            }
            _ => skip(r, wire)?,
        }
    }
    Ok(page)
}

/// The fields of a NodeList message (`r` ends where it does).
fn list_fields(
    r: &mut std::io::Take<&mut impl Read>,
    max_nodes: usize,
    page: &mut NodePage,
) -> Result<(), Error> {
    while r.limit() > 0 {
        let Some((field, wire)) = key(r)? else {
            return Err(early_end());
        };
        match (field, wire) {
            (1, 2) => {
                let len = varint(r)?;
                let meta: WireListMeta = decode(
                    "ListMeta",
                    &read_bounded(r, len, "list's metadata", LIST_META_LIMIT)?[..],
                )?;
                page.resource_version = meta.resource_version;
                page.continue_token = Some(meta.continue_token).filter(|t| !t.is_empty());
            }
            (2, 2) => {
                let len = varint(r)?;
                let item = read_bounded(r, len, "Node", EVENT_LIMIT)?;
                let node: Node = decode::<WireNode>("Node", &item[..])?.into();
                if page.items.len() == max_nodes {
                    return Err(Error::TooManyNodes(max_nodes));
                }
                if node.keepable() {
                    page.items.push(node);
                }
            }
            _ => skip(r, wire)?,
        }
    }
    Ok(())
}

fn read_bounded(
    r: &mut impl Read,
    len: u64,
    what: &'static str,
    limit: u64,
) -> Result<Vec<u8>, Error> {
    if len > limit {
        return Err(Error::TooLarge { what, len, limit });
    }
    read_exactly(r, len)
}

/// The next field's number and wire type; `None` at the end of the body, between fields.
fn key(r: &mut impl Read) -> Result<Option<(u64, u64)>, Error> {
    let mut first = [0u8; 1];
    if r.read(&mut first)? == 0 {
        return Ok(None);
    }
    let k = varint_from(first[0], r)?;
    Ok(Some((k >> 3, k & 7)))
}

fn varint(r: &mut impl Read) -> Result<u64, Error> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    varint_from(b[0], r)
}

/// A varint whose first byte is `first`.
fn varint_from(first: u8, r: &mut impl Read) -> Result<u64, Error> {
    let mut value = u64::from(first & 0x7f);
    let mut byte = first;
    let mut shift = 7;
    while byte & 0x80 != 0 {
        if shift > 63 {
            return Err(Error::Varint);
        }
        let mut b = [0u8; 1];
        r.read_exact(&mut b)?;
        byte = b[0];
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
    }
    Ok(value)
}

/// Skips a field the agent does not read.
fn skip(r: &mut impl Read, wire: u64) -> Result<(), Error> {
    let len = match wire {
        0 => {
            varint(r)?;
            return Ok(());
        }
        1 => 8,
        2 => varint(r)?,
        5 => 4,
        other => return Err(Error::WireType(other)),
    };
    if std::io::copy(&mut r.take(len), &mut std::io::sink())? < len {
        return Err(early_end());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sticky_testkit::kube_proto as server;
    use sticky_testkit::kube_support::{node_json, with_images, with_internal_ips};

    /// Nodes that exercise every rule of what is kept: real-sized ones with images, kept and
    /// other annotations, a value over its bound, more sticky labels than are kept, dual-stack
    /// and extra addresses, no pod CIDR, a name longer than Kubernetes allows.
    fn nodes() -> Vec<Value> {
        let long = "x".repeat(300);
        let mut a = with_images(
            node_json(
                "a",
                "192.0.2.1",
                &["10.244.1.0/24", "2001:db8:1::/64"],
                json!({
                    "sticky-cni.io/kept-mac": "02:00:00:00:00:01",
                    "sticky-cni.io/other": "y",
                    "flannel.alpha.coreos.com/public-ip": long,
                }),
            ),
            40,
        );
        for i in 0..10 {
            a["metadata"]["labels"][format!("sticky-cni.io/l{i}")] = json!(format!("v{i}"));
        }
        let a = with_internal_ips(a, &["192.0.2.1", "2001:db8::1"]);
        let b = node_json("b", "192.0.2.2", &[], json!({}));
        let c = node_json(&"c".repeat(254), "192.0.2.3", &["10.244.3.0/24"], json!({}));
        vec![a, b, c]
    }

    fn from_json(v: &Value) -> Node {
        serde_json::from_value(v.clone()).unwrap()
    }

    #[test]
    fn a_node_in_protobuf_keeps_what_its_json_keeps() {
        for v in nodes() {
            let n: Node = decode::<WireNode>("Node", &server::node(&v)[..])
                .unwrap()
                .into();
            assert_eq!(n, from_json(&v));
        }
        let a = from_json(&nodes()[0]);
        assert_eq!(a.metadata.labels.len(), crate::objects::MAX_KEPT_LABELS);
        assert!(
            a.metadata
                .annotations
                .contains_key(crate::objects::STICKY_MARKER)
        );
        assert_eq!(a.status.addresses.len(), 2);
        assert_eq!(from_json(&nodes()[1]).spec.pod_cidr, None);
    }

    fn list(items: &[Value], metadata: Value) -> Vec<u8> {
        let items: Vec<Vec<u8>> = items.iter().map(server::node).collect();
        server::node_list(&metadata, &items)
    }

    #[test]
    fn a_list_page_is_read_item_by_item() {
        let body = list(
            &nodes(),
            json!({"resourceVersion": "42", "continue": "t;1", "remainingItemCount": 7}),
        );
        let page = read_list(&mut &body[..], 10).unwrap();
        let names: Vec<&str> = page
            .items
            .iter()
            .map(|n| n.metadata.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["a", "b"],
            "a name Kubernetes would refuse is no Node"
        );
        assert_eq!(page.items[0], from_json(&nodes()[0]));
        assert_eq!(page.resource_version, "42");
        assert_eq!(page.continue_token.as_deref(), Some("t;1"));
        let last = read_list(
            &mut &list(&nodes()[..1], json!({"resourceVersion": "42"}))[..],
            10,
        );
        assert_eq!(last.unwrap().continue_token, None);
    }

    #[test]
    fn a_list_past_its_bounds_or_broken_says_which() {
        let body = list(&nodes(), json!({"resourceVersion": "1"}));
        assert!(matches!(
            read_list(&mut &body[..], 1),
            Err(Error::TooManyNodes(1))
        ));
        let cut = read_list(&mut &body[..body.len() / 2], 10).unwrap_err();
        assert!(cut.is_io(), "{cut}");
        let mut other = body.clone();
        other[0] = b'{';
        assert!(matches!(read_list(&mut &other[..], 10), Err(Error::Magic)));
        let status = server::envelope("Status", &server::status(&json!({"code": 500})));
        assert!(
            matches!(read_list(&mut &status[..], 10), Err(Error::NotAList(k)) if k == "Status")
        );
        // An item that says it is larger than the limit is refused before it is read.
        let mut huge = MAGIC.to_vec();
        huge.extend([0x12, 0x80, 0x80, 0x80, 0x80, 0x01]); // raw: 2^28 bytes
        huge.extend([0x12, 0x80, 0x80, 0x80, 0x04]); // item: 2^23 bytes
        let e = read_list(&mut &huge[..], 10).unwrap_err();
        assert!(matches!(e, Error::TooLarge { len: 8_388_608, .. }), "{e}");
    }

    #[test]
    fn watch_frames_of_every_type() {
        let node = &nodes()[0];
        let bookmark = json!({"kind": "Node", "metadata": {"resourceVersion": "12"}});
        let gone =
            json!({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"});
        let mut stream = Vec::new();
        for (kind, object, object_kind) in [
            ("ADDED", node, "Node"),
            ("MODIFIED", node, "Node"),
            ("DELETED", node, "Node"),
            ("BOOKMARK", &bookmark, "Node"),
            ("ERROR", &gone, "Status"),
            ("SURPRISE", node, "Node"),
        ] {
            let raw = match object_kind {
                "Status" => server::status(object),
                _ => server::node(object),
            };
            stream.extend(server::watch_frame(kind, object_kind, &raw));
        }
        let r = &mut &stream[..];
        let mut next = || event(next_frame(r).unwrap().unwrap());
        assert!(matches!(next().unwrap(), Event::Added(n) if n == from_json(node)));
        assert!(matches!(next().unwrap(), Event::Modified(_)));
        assert!(matches!(next().unwrap(), Event::Deleted(_)));
        assert!(matches!(next().unwrap(), Event::Bookmark(rv) if rv == "12"));
        assert!(
            matches!(next().unwrap(), Event::Error(s) if s.code == 410 && s.reason == "Expired" && s.message == "too old")
        );
        assert!(matches!(next(), Err(Error::Kind(k)) if k == "SURPRISE"));
        assert!(next_frame(r).unwrap().is_none(), "the end, between frames");
    }

    #[test]
    fn a_frame_too_large_or_cut_is_an_error() {
        let frame = server::watch_frame("ADDED", "Node", &server::node(&nodes()[0]));
        let cut = next_frame(&mut &frame[..frame.len() - 1]).unwrap_err();
        assert!(cut.is_io(), "{cut}");
        assert!(next_frame(&mut &frame[..2]).unwrap_err().is_io());
        let huge = u32::try_from(EVENT_LIMIT + 1).unwrap().to_be_bytes();
        assert!(matches!(
            next_frame(&mut &huge[..]),
            Err(Error::TooLarge { .. })
        ));
        let mut not_ours = frame.clone();
        not_ours[4..].fill(0xff);
        assert!(event(not_ours[4..].to_vec()).is_err());
    }

    #[test]
    fn an_error_answer_in_protobuf_is_its_status() {
        let body = server::envelope(
            "Status",
            &server::status(&json!({"code": 403, "reason": "Forbidden", "message": "no"})),
        );
        let s = status(&body).unwrap();
        assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (403, "Forbidden", "no")
        );
        assert!(matches!(status(b"{}"), Err(Error::Magic)));
    }
}
