//! The success result of ADD, in every spec version's shape, and the parsing of `prevResult`.
//!
//! One model (the 1.1.0 one) is kept in memory; [`CniResult::to_json`] renders it for the
//! caller's version: legacy `ip4`/`ip6` for 0.1.0/0.2.0, a `version` tag on each IP for
//! 0.3.x/0.4.0, and the extra route and interface fields only for 1.1.0.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Version;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub sandbox: Option<String>,
    #[serde(default)]
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    /// Address with its prefix length, e.g. `10.1.0.5/16`.
    pub address: IpNet,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default)]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default)]
    pub gw: Option<IpAddr>,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub advmss: Option<u32>,
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub table: Option<u32>,
    #[serde(default)]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Dns {
    #[serde(default)]
    pub nameservers: Vec<String>,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub search: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

/// A plugin's answer to ADD (and what CHECK and DEL get back as `prevResult`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// Why a JSON value is not a CNI result (a `prevResult`, or a delegated plugin's ADD output:
/// the caller says which).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ResultError(String);

impl CniResult {
    /// Renders the result as the given version specifies.
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if version.is_legacy() {
            for (key, v4) in [("ip4", true), ("ip6", false)] {
                if let Some(ip) = self.ips.iter().find(|ip| ip.address.addr().is_ipv4() == v4) {
                    let routes: Vec<Value> = self
                        .routes
                        .iter()
                        .filter(|r| r.dst.addr().is_ipv4() == v4)
                        .map(|r| route_json(r, version))
                        .collect();
                    let mut obj = Map::new();
                    obj.insert("ip".into(), json!(ip.address.to_string()));
                    if let Some(gw) = ip.gateway {
                        obj.insert("gateway".into(), json!(gw.to_string()));
                    }
                    if !routes.is_empty() {
                        obj.insert("routes".into(), Value::Array(routes));
                    }
                    out.insert(key.into(), Value::Object(obj));
                }
            }
        } else {
            if !self.interfaces.is_empty() {
                let list = self
                    .interfaces
                    .iter()
                    .map(|i| interface_json(i, version))
                    .collect();
                out.insert("interfaces".into(), Value::Array(list));
            }
            if !self.ips.is_empty() {
                let list = self.ips.iter().map(|ip| ip_json(ip, version)).collect();
                out.insert("ips".into(), Value::Array(list));
            }
            if !self.routes.is_empty() {
                let list = self.routes.iter().map(|r| route_json(r, version)).collect();
                out.insert("routes".into(), Value::Array(list));
            }
        }
        out.insert("dns".into(), dns_json(&self.dns));
        Value::Object(out)
    }

    /// Parses a result of any supported version (the shape tells which).
    pub fn from_json(value: &Value) -> Result<CniResult, ResultError> {
        let obj = value
            .as_object()
            .ok_or_else(|| ResultError("not an object".into()))?;
        let field = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let dns = match field("dns") {
            Some(v) => decode(v, "dns")?,
            None => Dns::default(),
        };
        if field("ips").is_none() && (field("ip4").is_some() || field("ip6").is_some()) {
            #[derive(Deserialize)]
            struct Legacy {
                ip: IpNet,
                #[serde(default)]
                gateway: Option<IpAddr>,
                #[serde(default)]
                routes: Vec<Route>,
            }
            let mut result = CniResult {
                dns,
                ..CniResult::default()
            };
            for key in ["ip4", "ip6"] {
                if let Some(v) = field(key) {
                    let legacy: Legacy = decode(v, key)?;
                    result.ips.push(IpConfig {
                        address: legacy.ip,
                        gateway: legacy.gateway,
                        interface: None,
                    });
                    result.routes.extend(legacy.routes);
                }
            }
            return Ok(result);
        }
        Ok(CniResult {
            interfaces: field("interfaces")
                .map(|v| decode(v, "interfaces"))
                .transpose()?
                .unwrap_or_default(),
            ips: field("ips")
                .map(|v| decode(v, "ips"))
                .transpose()?
                .unwrap_or_default(),
            routes: field("routes")
                .map(|v| decode(v, "routes"))
                .transpose()?
                .unwrap_or_default(),
            dns,
        })
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> Result<T, ResultError> {
    T::deserialize(value).map_err(|e| ResultError(format!("{what}: {e}")))
}

fn ip_json(ip: &IpConfig, version: Version) -> Value {
    let mut obj = Map::new();
    if version.tags_ip_version() {
        let family = if ip.address.addr().is_ipv4() {
            "4"
        } else {
            "6"
        };
        obj.insert("version".into(), json!(family));
    }
    if let Some(index) = ip.interface {
        obj.insert("interface".into(), json!(index));
    }
    obj.insert("address".into(), json!(ip.address.to_string()));
    if let Some(gw) = ip.gateway {
        obj.insert("gateway".into(), json!(gw.to_string()));
    }
    Value::Object(obj)
}

fn route_json(route: &Route, version: Version) -> Value {
    let mut obj = Map::new();
    obj.insert("dst".into(), json!(route.dst.to_string()));
    if let Some(gw) = route.gw {
        obj.insert("gw".into(), json!(gw.to_string()));
    }
    if version.has_gc_status() {
        let extras = [
            ("mtu", route.mtu),
            ("advmss", route.advmss),
            ("priority", route.priority),
            ("table", route.table),
            ("scope", route.scope.map(u32::from)),
        ];
        for (key, value) in extras {
            if let Some(v) = value {
                obj.insert(key.into(), json!(v));
            }
        }
    }
    Value::Object(obj)
}

fn interface_json(iface: &Interface, version: Version) -> Value {
    let mut obj = Map::new();
    obj.insert("name".into(), json!(iface.name));
    if let Some(mac) = &iface.mac {
        obj.insert("mac".into(), json!(mac));
    }
    if let Some(mtu) = iface.mtu.filter(|_| version.has_gc_status()) {
        obj.insert("mtu".into(), json!(mtu));
    }
    if let Some(sandbox) = &iface.sandbox {
        obj.insert("sandbox".into(), json!(sandbox));
    }
    Value::Object(obj)
}

fn dns_json(dns: &Dns) -> Value {
    let mut obj = Map::new();
    if !dns.nameservers.is_empty() {
        obj.insert("nameservers".into(), json!(dns.nameservers));
    }
    if let Some(domain) = &dns.domain {
        obj.insert("domain".into(), json!(domain));
    }
    if !dns.search.is_empty() {
        obj.insert("search".into(), json!(dns.search));
    }
    if !dns.options.is_empty() {
        obj.insert("options".into(), json!(dns.options));
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![],
            ips: vec![
                IpConfig {
                    address: "10.1.0.5/16".parse().unwrap(),
                    gateway: Some("10.1.0.1".parse().unwrap()),
                    interface: None,
                },
                IpConfig {
                    address: "2001:db8::5/64".parse().unwrap(),
                    gateway: None,
                    interface: None,
                },
                IpConfig {
                    address: "10.2.0.5/16".parse().unwrap(),
                    gateway: None,
                    interface: None,
                },
            ],
            routes: vec![
                Route {
                    mtu: Some(1400),
                    ..Route::new("0.0.0.0/0".parse().unwrap(), None)
                },
                Route::new(
                    "::/0".parse().unwrap(),
                    Some("2001:db8::1".parse().unwrap()),
                ),
            ],
            dns: Dns {
                nameservers: vec!["192.0.2.53".into()],
                ..Dns::default()
            },
        }
    }

    #[test]
    fn v1_shape() {
        let v = sample().to_json(Version::V100);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(
            v["ips"][0],
            json!({"address": "10.1.0.5/16", "gateway": "10.1.0.1"})
        );
        assert_eq!(
            v["routes"][0],
            json!({"dst": "0.0.0.0/0"}),
            "mtu is 1.1.0 only"
        );
        assert!(v.get("interfaces").is_none());
        assert_eq!(v["dns"]["nameservers"][0], "192.0.2.53");
    }

    #[test]
    fn v110_keeps_route_extras() {
        let v = sample().to_json(Version::V110);
        assert_eq!(v["routes"][0]["mtu"], 1400);
    }

    #[test]
    fn v03_tags_versions() {
        let v = sample().to_json(Version::V031);
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
    }

    #[test]
    fn legacy_takes_first_of_each_family_and_splits_routes() {
        let v = sample().to_json(Version::V020);
        assert!(v.get("ips").is_none());
        assert_eq!(v["ip4"]["ip"], "10.1.0.5/16");
        assert_eq!(v["ip4"]["routes"], json!([{"dst": "0.0.0.0/0"}]));
        assert_eq!(v["ip6"]["ip"], "2001:db8::5/64");
        assert_eq!(v["ip6"]["routes"][0]["gw"], "2001:db8::1");
        assert_eq!(v["dns"]["nameservers"][0], "192.0.2.53");
    }

    #[test]
    fn round_trips_through_every_version() {
        for version in crate::version::SUPPORTED {
            let parsed = CniResult::from_json(&sample().to_json(version)).unwrap();
            let addrs: Vec<_> = parsed.ips.iter().map(|ip| ip.address).collect();
            if version.is_legacy() {
                assert_eq!(addrs.len(), 2, "{version}");
            } else {
                assert_eq!(
                    addrs,
                    sample().ips.iter().map(|ip| ip.address).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn rejects_garbage_prev_result() {
        assert!(CniResult::from_json(&json!("x")).is_err());
        assert!(CniResult::from_json(&json!({"ips": [{"address": "nope"}]})).is_err());
    }
}
