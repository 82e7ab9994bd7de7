//! NAT discovery (issue 29): a gateway others can dial (it has an endpoint) sees the address
//! and port each gateway behind NAT comes from (WireGuard's roaming) and publishes them on its
//! own Node as annotation [`OBSERVED_ENDPOINTS_ANNOTATION`], a JSON object
//! `{"<gateway Node name>": "ip:port", ...}`. Every node keeps it (objects, facts, the sites
//! cache), so [`crate::paths::Discovery::nat_mapped`] is known offline too.
//!
//! Only the annotations of gateways with an endpoint count (a NATed gateway sees nobody's
//! mapping); of two that name one gateway, the first by Node name wins. A bad annotation (not
//! such an object, a bad address, more than [`MAX_ENTRIES`] entries) is refused whole and
//! breaks only itself: its error is reported by the Node's name.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::model::{self, Model, NodeInput};

/// The annotation a reachable gateway publishes its observations in.
pub const OBSERVED_ENDPOINTS_ANNOTATION: &str = "sticky-cni.io/observed-endpoints";
/// At most this many entries in one annotation (a larger one is refused).
pub const MAX_ENTRIES: usize = 64;
/// At most this many bytes in one annotation (the agent keeps no more of it).
pub const MAX_BYTES: usize = 4096;

/// Why an annotation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "annotation {OBSERVED_ENDPOINTS_ANNOTATION} = {value:?} is not a JSON object of gateway names to \"ip:port\""
    )]
    NotObject { value: String },
    #[error("annotation {OBSERVED_ENDPOINTS_ANNOTATION} has {0} entries (at most {MAX_ENTRIES})")]
    TooMany(usize),
    #[error("annotation {OBSERVED_ENDPOINTS_ANNOTATION}, gateway {gateway:?}: {source}")]
    Endpoint {
        gateway: String,
        #[source]
        source: model::Error,
    },
}

/// The annotation's value parsed (see the module doc).
pub fn parse(value: &str) -> Result<BTreeMap<String, SocketAddr>, Error> {
    let map: BTreeMap<String, String> =
        serde_json::from_str(value).map_err(|_| Error::NotObject {
            value: value.to_string(),
        })?;
    if map.len() > MAX_ENTRIES {
        return Err(Error::TooMany(map.len()));
    }
    map.into_iter()
        .map(|(gateway, v)| match model::parse_endpoint(&v) {
            Ok(ep) => Ok((gateway, ep)),
            Err(source) => Err(Error::Endpoint { gateway, source }),
        })
        .collect()
}

/// The annotation's value for `observed` (sorted by name; the first ones by name that fit in
/// [`MAX_ENTRIES`] and [`MAX_BYTES`]).
pub fn format(observed: &BTreeMap<String, SocketAddr>) -> String {
    let mut map: BTreeMap<&str, String> = BTreeMap::new();
    let mut text = "{}".to_string();
    for (g, ep) in observed.iter().take(MAX_ENTRIES) {
        map.insert(g.as_str(), ep.to_string());
        let next = serde_json::to_string(&map).unwrap_or_default();
        if next.len() > MAX_BYTES {
            break;
        }
        text = next;
    }
    text
}

/// The NAT-mapped address of every gateway as the reachable gateways of `model` observed it,
/// from their annotations in `inputs`; and the refused annotations by Node name.
pub fn nat_mapped(
    model: &Model,
    inputs: &[NodeInput],
) -> (BTreeMap<String, SocketAddr>, BTreeMap<String, Error>) {
    let reachable: std::collections::BTreeSet<&str> = model
        .sites
        .values()
        .flat_map(|s| s.candidates.iter())
        .filter(|c| c.endpoint.is_some())
        .map(|c| c.name.as_str())
        .collect();
    let mut by_name: Vec<&NodeInput> = inputs
        .iter()
        .filter(|n| reachable.contains(n.name.as_str()))
        .collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    let mut mapped = BTreeMap::new();
    let mut refused = BTreeMap::new();
    for n in by_name {
        let Some(v) = n.annotations.get(OBSERVED_ENDPOINTS_ANNOTATION) else {
            continue;
        };
        match parse(v) {
            Ok(m) => {
                for (g, ep) in m {
                    mapped.entry(g).or_insert(ep);
                }
            }
            Err(e) => {
                refused.insert(n.name.clone(), e);
            }
        }
    }
    (mapped, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::node;
    use crate::model::{Holders, SiteConfig, build};

    #[test]
    fn parse_table() {
        let ok = parse(r#"{"a1":"203.0.113.10:51820","b1":"[2001:db8::1]:4500"}"#).unwrap();
        assert_eq!(ok["a1"], "203.0.113.10:51820".parse().unwrap());
        assert_eq!(ok.len(), 2);
        assert_eq!(parse("{}").unwrap().len(), 0);
        for bad in [
            "",
            "[]",
            r#"{"a1": 5}"#,
            r#"{"a1":"host.example:1"}"#,
            r#"{"a1":"0.0.0.0:1"}"#,
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(OBSERVED_ENDPOINTS_ANNOTATION), "{bad:?}: {e}");
        }
        assert!(
            parse(r#"{"a1":"host.example:1"}"#)
                .unwrap_err()
                .to_string()
                .contains("host.example:1")
        );
        let many: BTreeMap<String, SocketAddr> = (0..=MAX_ENTRIES)
            .map(|i| (format!("g{i:03}"), "203.0.113.1:1".parse().unwrap()))
            .collect();
        let text = serde_json::to_string(
            &many
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
        .unwrap();
        assert_eq!(parse(&text), Err(Error::TooMany(MAX_ENTRIES + 1)));
        // format takes the first MAX_ENTRIES and reads back.
        assert_eq!(parse(&format(&many)).unwrap().len(), MAX_ENTRIES);
    }

    #[test]
    fn only_reachable_gateways_count_and_a_bad_one_breaks_only_itself() {
        let mut nodes = vec![
            node(
                "c1",
                Some("cloud"),
                "10.0.0.0/24",
                Some((1, Some("198.51.100.1:51820"))),
            ),
            node(
                "c9",
                Some("cloud2"),
                "10.0.9.0/24",
                Some((9, Some("198.51.100.9:51820"))),
            ),
            node(
                "zz",
                Some("cloud3"),
                "10.0.8.0/24",
                Some((8, Some("198.51.100.8:51820"))),
            ),
            node("a1", Some("edge-a"), "10.1.0.0/24", Some((2, None))),
            node("b1", Some("edge-b"), "10.2.0.0/24", Some((3, None))),
        ];
        let set = |n: &mut NodeInput, v: &str| {
            n.annotations
                .insert(OBSERVED_ENDPOINTS_ANNOTATION.into(), v.into());
        };
        set(&mut nodes[0], r#"{"a1":"203.0.113.10:51820"}"#);
        set(&mut nodes[1], "not json");
        set(
            &mut nodes[2],
            r#"{"a1":"203.0.113.99:1","b1":"203.0.113.20:51820"}"#,
        );
        // A NATed gateway's claim is ignored.
        set(&mut nodes[3], r#"{"b1":"203.0.113.66:1"}"#);
        let m = build(&nodes, &SiteConfig::default(), &Holders::default());
        let (mapped, refused) = nat_mapped(&m, &nodes);
        assert_eq!(
            mapped["a1"],
            "203.0.113.10:51820".parse().unwrap(),
            "first by name"
        );
        assert_eq!(mapped["b1"], "203.0.113.20:51820".parse().unwrap());
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["c9"]);
        assert!(refused["c9"].to_string().contains("not json"));
    }
}
