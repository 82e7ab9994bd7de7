//! The `attachments` table: per-pod settings of a segment without an API server, the
//! equivalent of kube-vxlan-controller's per-pod annotation.
//!
//! Each entry names pods by namespace and a name pattern (`*` matches any run of
//! characters, so `gw-*` covers every pod of the `gw` workload) and gives their address(es),
//! routes and whether the interface is brought up. The pod comes from `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); the first entry that matches wins.

use ipnet::IpNet;
use serde_json::Value;

use super::routes;
use cni_protocol::Route;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "{0} is not a list of {{\"pod\", \"namespace\"?, \"ips\"?, \"routes\"?, \"up\"?}} objects"
    )]
    NotAList(String),
    /// What is wrong with entry `index` (counted from 0).
    #[error("entry {index}: {source}")]
    Entry { index: usize, source: Box<Error> },
    #[error("{0} is not an object")]
    NotAnObject(String),
    #[error("unknown key {0:?} (expected one of {keys})", keys = KEYS.join(", "))]
    UnknownKey(String),
    #[error("{key:?} {value} is not a non-empty string")]
    NotText { key: &'static str, value: String },
    #[error("\"pod\" (a name or pattern) is required")]
    NoPod,
    #[error("\"ips\" {0} is not a list of CIDR addresses")]
    IpsNotAList(String),
    #[error("address {0} is not an interface address in CIDR notation such as 192.168.11.2/29")]
    NotAnAddress(String),
    #[error(transparent)]
    Routes(#[from] routes::Error),
    #[error("\"up\" {0} is not true or false")]
    NotABool(String),
}

/// One entry of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The pod's namespace; `None` matches any.
    pub namespace: Option<String>,
    /// The pod name pattern.
    pub pod: String,
    pub ips: Vec<IpNet>,
    pub routes: Vec<Route>,
    pub up: Option<bool>,
}

const KEYS: &[&str] = &["namespace", "pod", "ips", "routes", "up"];

pub fn parse(value: &Value) -> Result<Vec<Attachment>, Error> {
    let list = value
        .as_array()
        .ok_or_else(|| Error::NotAList(value.to_string()))?;
    list.iter()
        .enumerate()
        .map(|(index, entry)| {
            parse_entry(entry).map_err(|e| Error::Entry {
                index,
                source: Box::new(e),
            })
        })
        .collect()
}

fn parse_entry(entry: &Value) -> Result<Attachment, Error> {
    let obj = entry
        .as_object()
        .ok_or_else(|| Error::NotAnObject(entry.to_string()))?;
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(Error::UnknownKey(k.clone()));
    }
    let text = |key: &'static str| -> Result<Option<String>, Error> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(v) => Err(Error::NotText {
                key,
                value: v.to_string(),
            }),
        }
    };
    let namespace = text("namespace")?;
    let pod = text("pod")?.ok_or(Error::NoPod)?;
    let ips = match obj.get("ips") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => parse_ips(v)?,
    };
    let routes = match obj.get("routes") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => routes::parse(v)?,
    };
    let up = match obj.get("up") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => return Err(Error::NotABool(v.to_string())),
    };
    Ok(Attachment {
        namespace,
        pod,
        ips,
        routes,
        up,
    })
}

/// Addresses in CIDR notation (`192.168.11.2/29`), at most one per family would be too strict
/// (spec 0.3+ allows several), so only their form is checked.
pub(crate) fn parse_ips(value: &Value) -> Result<Vec<IpNet>, Error> {
    let list = value
        .as_array()
        .ok_or_else(|| Error::IpsNotAList(value.to_string()))?;
    list.iter()
        .map(|v| {
            v.as_str()
                .and_then(|s| s.parse::<IpNet>().ok())
                .filter(|n| n.addr() != n.network() || n.prefix_len() == n.max_prefix_len())
                .ok_or_else(|| Error::NotAnAddress(v.to_string()))
        })
        .collect()
}

/// `*` matches any run of characters (also none); everything else matches itself.
pub fn matches(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut left) = name.strip_prefix(head) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let (last, middle) = parts.split_last().unwrap_or((&"", &[]));
    for part in middle {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

/// The first entry for the pod `namespace`/`name`.
pub fn find<'a>(table: &'a [Attachment], namespace: &str, name: &str) -> Option<&'a Attachment> {
    table.iter().find(|a| {
        a.namespace
            .as_deref()
            .is_none_or(|ns| matches(ns, namespace))
            && matches(&a.pod, name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns() {
        for (p, n, want) in [
            ("gw-*", "gw-f87979b47-5p57h", true),
            ("gw-*", "gw-", true),
            ("gw-*", "gwx", false),
            ("gw-*", "a-gw-1", false),
            ("a", "a", true),
            ("a", "ab", false),
            ("*", "anything", true),
            ("*-db-*", "app-db-0", true),
            ("*-db-*", "app-web-0", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
        ] {
            assert_eq!(matches(p, n), want, "{p} vs {n}");
        }
    }

    #[test]
    fn first_match_wins_and_namespace_counts() {
        let table = parse(&json!([
            {"namespace": "prod", "pod": "gw-*", "ips": ["192.168.11.1/29", "192.168.12.1/29"]},
            {"pod": "gw-*", "up": false},
            {"pod": "a-*", "ips": ["192.168.11.2/29"],
             "routes": [{"dst": "192.168.12.0/29", "gw": "192.168.11.1"}]}
        ]))
        .unwrap();
        assert_eq!(find(&table, "prod", "gw-1").unwrap().ips.len(), 2);
        assert_eq!(find(&table, "dev", "gw-1").unwrap().up, Some(false));
        assert_eq!(find(&table, "dev", "a-1").unwrap().routes.len(), 1);
        assert!(find(&table, "dev", "b-1").is_none());
    }

    #[test]
    fn every_entry_key_is_checked() {
        for bad in [
            json!({"pod": "a"}),
            json!([1]),
            json!([{"ips": ["192.168.11.2/29"]}]),
            json!([{"pod": ""}]),
            json!([{"pod": "a", "ip": "192.168.11.2/29"}]),
            json!([{"pod": "a", "ips": "192.168.11.2/29"}]),
            json!([{"pod": "a", "ips": ["192.168.11.2"]}]),
            json!([{"pod": "a", "ips": ["192.168.11.0/29"]}]),
            json!([{"pod": "a", "routes": [{"dst": "x"}]}]),
            json!([{"pod": "a", "up": "false"}]),
            json!([{"pod": "a", "namespace": 3}]),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_entry_and_quote_the_value() {
        for (bad, says) in [
            (
                json!({"pod": "a"}),
                r#"{"pod":"a"} is not a list of {"pod", "namespace"?, "ips"?, "routes"?, "up"?} objects"#,
            ),
            (json!([1]), "entry 0: 1 is not an object"),
            (
                json!([{"pod": "a"}, {"ips": ["192.168.11.2/29"]}]),
                r#"entry 1: "pod" (a name or pattern) is required"#,
            ),
            (
                json!([{"pod": "a", "ip": "192.168.11.2/29"}]),
                r#"entry 0: unknown key "ip" (expected one of namespace, pod, ips, routes, up)"#,
            ),
            (
                json!([{"pod": "a", "namespace": 3}]),
                r#"entry 0: "namespace" 3 is not a non-empty string"#,
            ),
            (
                json!([{"pod": "a", "ips": "192.168.11.2/29"}]),
                r#"entry 0: "ips" "192.168.11.2/29" is not a list of CIDR addresses"#,
            ),
            (
                json!([{"pod": "a", "ips": ["192.168.11.0/29"]}]),
                r#"entry 0: address "192.168.11.0/29" is not an interface address in CIDR notation"#,
            ),
            (
                json!([{"pod": "a", "routes": [{"dst": "x"}]}]),
                r#"entry 0: route {"dst":"x"}: "#,
            ),
            (
                json!([{"pod": "a", "up": "false"}]),
                r#"entry 0: "up" "false" is not true or false"#,
            ),
        ] {
            let msg = parse(&bad).unwrap_err().to_string();
            assert!(msg.starts_with(says), "{bad}: {msg}");
        }
    }
}
