//! Routes as a segment config writes them (the config's `routes` and an attachments entry's):
//! `[{"dst": CIDR, "gw"?: IP}]`, read through [`Route`], the type CNI results carry, with
//! what a config asks on top: no other key (a misspelt `via` is not silently a route without
//! its gateway), and `gw` of `dst`'s family.

use serde::Deserialize;
use serde_json::{Value, json};

use cni_protocol::Route;

/// The keys a route of a segment config may have.
const KEYS: [&str; 2] = ["dst", "gw"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0} is not a list of {{\"dst\", \"gw\"?}} objects")]
    NotAList(String),
    #[error("route {0} is not an object")]
    NotAnObject(String),
    #[error("route {route}: unknown key {key:?} (expected dst, gw)")]
    UnknownKey { route: String, key: String },
    /// `reason`: the decoder's words.
    #[error("route {route}: \"dst\" must be a CIDR such as 192.168.12.0/29 ({reason})")]
    Dst { route: String, reason: String },
    #[error("route {route}: \"gw\" must be an IP address ({reason})")]
    Gw { route: String, reason: String },
    #[error("route {0}: dst and gw are of different families")]
    Families(String),
}

/// The routes of `value`, checked; each `dst` without host bits (`10.0.0.5/8` is
/// `10.0.0.0/8`, as `ip route` takes it).
pub fn parse(value: &Value) -> Result<Vec<Route>, Error> {
    let list = value
        .as_array()
        .ok_or_else(|| Error::NotAList(value.to_string()))?;
    list.iter().map(one).collect()
}

fn one(r: &Value) -> Result<Route, Error> {
    let obj = r
        .as_object()
        .ok_or_else(|| Error::NotAnObject(r.to_string()))?;
    if let Some(key) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(Error::UnknownKey {
            route: r.to_string(),
            key: key.clone(),
        });
    }
    let mut route = Route::deserialize(r).map_err(|e| {
        let (route, reason) = (r.to_string(), e.to_string());
        // The decoder does not say which field it stopped at: `dst` alone tells.
        match Route::deserialize(json!({ "dst": obj.get("dst") })) {
            Err(_) => Error::Dst { route, reason },
            Ok(_) => Error::Gw { route, reason },
        }
    })?;
    if route
        .gw
        .is_some_and(|g| g.is_ipv4() != route.dst.addr().is_ipv4())
    {
        return Err(Error::Families(r.to_string()));
    }
    route.dst = route.dst.trunc();
    Ok(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dst_and_gw_read_through_the_result_type() {
        let routes = parse(&json!([
            {"dst": "192.168.12.0/29", "gw": "192.168.11.1"},
            {"dst": "10.0.0.5/8"},
            {"dst": "fd00:12::/64", "gw": null}
        ]))
        .unwrap();
        assert_eq!(
            routes,
            [
                Route::new(
                    "192.168.12.0/29".parse().unwrap(),
                    Some("192.168.11.1".parse().unwrap())
                ),
                Route::new("10.0.0.0/8".parse().unwrap(), None),
                Route::new("fd00:12::/64".parse().unwrap(), None),
            ]
        );
        assert_eq!(parse(&json!([])).unwrap(), []);
    }

    #[test]
    fn every_mistake_is_named() {
        for (bad, says) in [
            (json!({"dst": "10.0.0.0/8"}), "is not a list of"),
            (
                json!(["10.0.0.0/8"]),
                r#"route "10.0.0.0/8" is not an object"#,
            ),
            (
                json!([{"dst": "10.0.0.0/8", "via": "10.0.0.1"}]),
                r#"unknown key "via" (expected dst, gw)"#,
            ),
            // Fields a result's route has, but a segment does not program: refused as well.
            (
                json!([{"dst": "10.0.0.0/8", "mtu": 1400}]),
                r#"unknown key "mtu""#,
            ),
            (
                json!([{"dst": "10.0.0.0"}]),
                r#"route {"dst":"10.0.0.0"}: "dst" must be a CIDR such as 192.168.12.0/29 ("#,
            ),
            (json!([{"gw": "10.0.0.1"}]), "\"dst\" must be a CIDR"),
            (json!([{"dst": 10}]), "\"dst\" must be a CIDR"),
            (
                json!([{"dst": "10.0.0.0/8", "gw": "x"}]),
                r#"route {"dst":"10.0.0.0/8","gw":"x"}: "gw" must be an IP address ("#,
            ),
            (
                json!([{"dst": "10.0.0.0/8", "gw": 1}]),
                "\"gw\" must be an IP address",
            ),
            (
                json!([{"dst": "10.0.0.0/8", "gw": "fd00::1"}]),
                "dst and gw are of different families",
            ),
        ] {
            let msg = parse(&bad).unwrap_err().to_string();
            assert!(msg.contains(says), "{bad}: {msg}");
        }
    }
}
