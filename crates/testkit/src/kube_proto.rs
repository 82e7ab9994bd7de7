//! The test API server's protobuf encoding (`application/vnd.kubernetes.protobuf`), as a real
//! API server answers a client that asks for it: every object behind the `k8s\0` magic in a
//! `runtime.Unknown` envelope, a watch as length-prefixed `WatchEvent` frames whose object is
//! such an envelope. The field numbers are Kubernetes' own (`k8s.io/api/core/v1`,
//! `k8s.io/apimachinery/pkg/apis/meta/v1` and `pkg/runtime`, their `generated.proto`).
//!
//! A Node is encoded from the JSON the server keeps: every field a test Node has, whole (the
//! images and conditions the agent skips included, so that it skips real bytes). A JSON key
//! this encoder does not know fails the test: no field is dropped unseen.

use prost::encoding::{WireType, encode_key, encode_varint};
use serde_json::Value;

/// Before every object that is not in a watch frame.
pub const MAGIC: &[u8; 4] = b"k8s\0";
/// What a client asking for protobuf names in its `Accept` (and the server in `Content-Type`).
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// How a JSON value is written as a field.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Int,
    Bool,
    /// `meta/v1.Time` from RFC 3339 text: seconds since the epoch (and nanos, none here).
    Time,
    /// `map<string, string>`.
    Map,
    /// `map<string, resource.Quantity>`.
    Quantities,
    /// `meta/v1.FieldsV1`: the JSON object as bytes.
    Fields,
    Msg(&'static [Field]),
    /// A JSON key the protobuf message does not carry (`kind` and `apiVersion` of an object:
    /// they are in the envelope).
    Skip,
}

type Field = (&'static str, u32, Kind);

const NODE: &[Field] = &[
    ("kind", 0, Kind::Skip),
    ("apiVersion", 0, Kind::Skip),
    ("metadata", 1, Kind::Msg(META)),
    ("spec", 2, Kind::Msg(SPEC)),
    ("status", 3, Kind::Msg(STATUS)),
];
const META: &[Field] = &[
    ("name", 1, Kind::Str),
    ("generateName", 2, Kind::Str),
    ("namespace", 3, Kind::Str),
    ("selfLink", 4, Kind::Str),
    ("uid", 5, Kind::Str),
    ("resourceVersion", 6, Kind::Str),
    ("generation", 7, Kind::Int),
    ("creationTimestamp", 8, Kind::Time),
    ("deletionTimestamp", 9, Kind::Time),
    ("labels", 11, Kind::Map),
    ("annotations", 12, Kind::Map),
    ("finalizers", 14, Kind::Str),
    ("managedFields", 17, Kind::Msg(MANAGED)),
];
const MANAGED: &[Field] = &[
    ("manager", 1, Kind::Str),
    ("operation", 2, Kind::Str),
    ("apiVersion", 3, Kind::Str),
    ("time", 4, Kind::Time),
    ("fieldsType", 6, Kind::Str),
    ("fieldsV1", 7, Kind::Fields),
    ("subresource", 8, Kind::Str),
];
const SPEC: &[Field] = &[
    ("podCIDR", 1, Kind::Str),
    ("externalID", 2, Kind::Str),
    ("providerID", 3, Kind::Str),
    ("unschedulable", 4, Kind::Bool),
    ("taints", 5, Kind::Msg(TAINT)),
    ("podCIDRs", 7, Kind::Str),
];
const TAINT: &[Field] = &[
    ("key", 1, Kind::Str),
    ("value", 2, Kind::Str),
    ("effect", 3, Kind::Str),
    ("timeAdded", 4, Kind::Time),
];
const STATUS: &[Field] = &[
    ("capacity", 1, Kind::Quantities),
    ("allocatable", 2, Kind::Quantities),
    ("phase", 3, Kind::Str),
    ("conditions", 4, Kind::Msg(CONDITION)),
    ("addresses", 5, Kind::Msg(ADDRESS)),
    ("daemonEndpoints", 6, Kind::Msg(DAEMON_ENDPOINTS)),
    ("nodeInfo", 7, Kind::Msg(NODE_INFO)),
    ("images", 8, Kind::Msg(IMAGE)),
    ("volumesInUse", 9, Kind::Str),
];
const CONDITION: &[Field] = &[
    ("type", 1, Kind::Str),
    ("status", 2, Kind::Str),
    ("lastHeartbeatTime", 3, Kind::Time),
    ("lastTransitionTime", 4, Kind::Time),
    ("reason", 5, Kind::Str),
    ("message", 6, Kind::Str),
];
const ADDRESS: &[Field] = &[("type", 1, Kind::Str), ("address", 2, Kind::Str)];
const DAEMON_ENDPOINTS: &[Field] = &[("kubeletEndpoint", 1, Kind::Msg(&[("Port", 1, Kind::Int)]))];
const NODE_INFO: &[Field] = &[
    ("machineID", 1, Kind::Str),
    ("systemUUID", 2, Kind::Str),
    ("bootID", 3, Kind::Str),
    ("kernelVersion", 4, Kind::Str),
    ("osImage", 5, Kind::Str),
    ("containerRuntimeVersion", 6, Kind::Str),
    ("kubeletVersion", 7, Kind::Str),
    ("kubeProxyVersion", 8, Kind::Str),
    ("operatingSystem", 9, Kind::Str),
    ("architecture", 10, Kind::Str),
];
const IMAGE: &[Field] = &[("names", 1, Kind::Str), ("sizeBytes", 2, Kind::Int)];
const LIST_META: &[Field] = &[
    ("selfLink", 1, Kind::Str),
    ("resourceVersion", 2, Kind::Str),
    ("continue", 3, Kind::Str),
    ("remainingItemCount", 4, Kind::Int),
];
const STATUS_OBJECT: &[Field] = &[
    ("kind", 0, Kind::Skip),
    ("apiVersion", 0, Kind::Skip),
    ("metadata", 1, Kind::Msg(LIST_META)),
    ("status", 2, Kind::Str),
    ("message", 3, Kind::Str),
    ("reason", 4, Kind::Str),
    ("code", 6, Kind::Int),
];

fn bytes_field(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint_field(tag: u32, v: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(v, out);
}

/// The message `value` (a JSON object) as `schema` says; Go writes fields in number order.
fn message(schema: &[Field], value: &Value, out: &mut Vec<u8>) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {value}"));
    for key in object.keys() {
        assert!(
            schema.iter().any(|(k, _, _)| k == key),
            "the test API server cannot encode {key:?} in protobuf"
        );
    }
    for &(key, tag, kind) in schema {
        match object.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => items.iter().for_each(|v| field(tag, kind, v, out)),
            Some(v) => field(tag, kind, v, out),
        }
    }
}

fn field(tag: u32, kind: Kind, v: &Value, out: &mut Vec<u8>) {
    let text = || v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    match kind {
        Kind::Skip => {}
        Kind::Str => bytes_field(tag, text().as_bytes(), out),
        // Two's complement, as Go writes a negative int64.
        Kind::Int => varint_field(tag, v.as_i64().expect("an integer") as u64, out),
        Kind::Bool => varint_field(tag, u64::from(v.as_bool().expect("a bool")), out),
        Kind::Time => {
            let mut time = Vec::new();
            varint_field(1, rfc3339_seconds(text()) as u64, &mut time);
            bytes_field(tag, &time, out);
        }
        Kind::Map | Kind::Quantities => {
            for (k, value) in v.as_object().expect("a map") {
                let value = value.as_str().expect("a string value");
                let mut value_bytes = Vec::new();
                match kind {
                    Kind::Quantities => bytes_field(1, value.as_bytes(), &mut value_bytes),
                    _ => value_bytes.extend_from_slice(value.as_bytes()),
                }
                let mut entry = Vec::new();
                bytes_field(1, k.as_bytes(), &mut entry);
                bytes_field(2, &value_bytes, &mut entry);
                bytes_field(tag, &entry, out);
            }
        }
        Kind::Fields => {
            let mut fields = Vec::new();
            bytes_field(1, v.to_string().as_bytes(), &mut fields);
            bytes_field(tag, &fields, out);
        }
        Kind::Msg(schema) => {
            let mut inner = Vec::new();
            message(schema, v, &mut inner);
            bytes_field(tag, &inner, out);
        }
    }
}

/// `2026-11-25T01:00:00Z` as seconds since the epoch (UTC, whole seconds: what the test
/// objects hold).
fn rfc3339_seconds(text: &str) -> i64 {
    let n = |range: std::ops::Range<usize>| -> i64 {
        text.get(range)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an RFC 3339 time in UTC: {text}"))
    };
    assert!(
        text.len() == 20 && text.ends_with('Z'),
        "not a UTC time: {text}"
    );
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days since 1970-01-01 of a proleptic Gregorian date (years counted from March).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
}

/// `raw` (an object's message) in the envelope an answer (or a watch event's object) carries.
pub fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    bytes_field(1, b"v1", &mut type_meta);
    bytes_field(2, kind.as_bytes(), &mut type_meta);
    let mut out = MAGIC.to_vec();
    bytes_field(1, &type_meta, &mut out);
    bytes_field(2, raw, &mut out);
    out
}

/// A Node's message (no envelope).
pub fn node(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    message(NODE, value, &mut out);
    out
}

/// A `NodeList` answer: `metadata` (a JSON `ListMeta`) and the Nodes' messages.
pub fn node_list(metadata: &Value, items: &[Vec<u8>]) -> Vec<u8> {
    let mut list = Vec::new();
    field(1, Kind::Msg(LIST_META), metadata, &mut list);
    for item in items {
        bytes_field(2, item, &mut list);
    }
    envelope("NodeList", &list)
}

/// A `Status`'s message (no envelope) from its JSON.
pub fn status(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    message(STATUS_OBJECT, value, &mut out);
    out
}

/// One watch frame: the event's length (4 bytes, big-endian), then the `WatchEvent` of type
/// `kind` whose object is `raw` in its envelope (a Node's, or a Status's for an `ERROR`).
pub fn watch_frame(kind: &str, object_kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut object = Vec::new();
    bytes_field(1, &envelope(object_kind, raw), &mut object);
    let mut event = Vec::new();
    bytes_field(1, kind.as_bytes(), &mut event);
    bytes_field(2, &object, &mut event);
    let mut out = u32::try_from(event.len())
        .expect("a frame under 4 GiB")
        .to_be_bytes()
        .to_vec();
    out.extend(event);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_are_seconds_since_the_epoch() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), 0);
        assert_eq!(rfc3339_seconds("2000-03-01T00:00:01Z"), 951_868_801);
        assert_eq!(rfc3339_seconds("2026-11-25T01:00:00Z"), 1_795_568_400);
    }

    #[test]
    fn a_node_is_written_field_by_field_in_number_order() {
        let bytes = node(
            &json!({"kind": "Node", "metadata": {"name": "a"}, "spec": {"podCIDRs": ["10.0.0.0/24"]}}),
        );
        // metadata (1) { name (1) "a" }, spec (2) { podCIDRs (7) "10.0.0.0/24" }
        let mut want = vec![0x0a, 3, 0x0a, 1, b'a', 0x12, 13, 0x3a, 11];
        want.extend_from_slice(b"10.0.0.0/24");
        assert_eq!(bytes, want);
    }

    #[test]
    #[should_panic(expected = "cannot encode")]
    fn an_unknown_field_fails_the_test() {
        node(&json!({"metadata": {"surprise": 1}}));
    }
}
