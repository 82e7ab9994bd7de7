//! The network config's `sites` object (docs/sites.md): present when the network spans sites
//! (sets of nodes that reach each other directly) joined by one WireGuard gateway per site.
//!
//! It lives here, at the plugin's layer, because the plugin reads one thing of it: the WAN's
//! MTU bound on the pod MTU ([`tunnel_overhead`]). Everything else is the agent's (labels,
//! ports, relays), read here once so that both programs check the same config the same way.
//! Nothing here links crypto: the decisions, keys and the tunnel seam are `sticky-sites`', a
//! layer up beside the agent.

use std::net::IpAddr;

use serde_json::{Map, Value};

/// Why the `sites` object is refused (the config names the key `sites` around it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Error {
    reason: String,
}

fn bad(reason: impl Into<String>) -> Error {
    Error {
        reason: reason.into(),
    }
}

/// The usual internet path MTU: the outer MTU the tunnel's packets cross (`wanMtu`).
pub const DEFAULT_WAN_MTU: u32 = 1500;
/// WireGuard's well-known port, the tunnel's default (`listenPort`).
pub const DEFAULT_LISTEN_PORT: u16 = 51820;
/// The tunnel device's default name (`interface`).
pub const DEFAULT_TUNNEL_INTERFACE: &str = "stickywg0";
/// The default site label (`siteLabel`): under `node-restriction.kubernetes.io/`, which the
/// NodeRestriction admission plugin keeps a kubelet from setting on its own Node.
pub const DEFAULT_SITE_LABEL: &str = "node-restriction.kubernetes.io/sticky-cni-site";
/// The default gateway label (`gatewayLabel`), admin-only likewise.
pub const DEFAULT_GATEWAY_LABEL: &str = "node-restriction.kubernetes.io/sticky-cni-gateway";
/// The label prefix a kubelet cannot write on its own Node (NodeRestriction).
pub const RESTRICTED_PREFIX: &str = "node-restriction.kubernetes.io/";
/// The WireGuard keepalive of peers behind NAT and of punched peers, in seconds
/// (`keepaliveSecs`). 10, not WireGuard's customary 25: a punched direct path is left for the
/// relay once silent for a keepalive and a rekey timeout (15 s, within the 20 s an edge site
/// may lose while its NAT router reboots), and it keeps NAT mappings that expire after 30 s
/// open; it costs one 32-byte datagram every 10 s per peer.
pub const DEFAULT_KEEPALIVE_SECS: u16 = 10;
/// The UDP port every node answers liveness probes on, inside its site (`probePort`).
pub const DEFAULT_PROBE_PORT: u16 = 51821;

/// The most relay sites a config may name.
const MAX_RELAYS: usize = 16;

/// The `sites` object (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sites {
    /// The path MTU between sites (`wanMtu`, default [`DEFAULT_WAN_MTU`]).
    pub wan_mtu: u32,
    /// The UDP port a gateway's tunnel listens on (`listenPort`).
    pub listen_port: u16,
    /// The tunnel's device (`interface`), made by `sticky-wg`.
    pub interface: String,
    /// The Node label holding a Node's site (`siteLabel`).
    pub site_label: String,
    /// The Node label (value `"true"`) that lets a Node carry its site's traffic
    /// (`gatewayLabel`).
    pub gateway_label: String,
    /// The sites whose active gateway may relay between two sites that cannot reach each other
    /// (`relays`), in order of preference. None named: no site relays.
    pub relays: Vec<String>,
    /// The WireGuard keepalive of every tunnel peer that has one, in seconds
    /// (`keepaliveSecs`, 1 to 3600): it keeps the NAT mappings open.
    pub keepalive_secs: u16,
    /// The UDP port every node answers liveness probes on, inside its site (`probePort`).
    pub probe_port: u16,
}

impl Sites {
    /// The configured label keys a kubelet may write on its own Node (not under
    /// [`RESTRICTED_PREFIX`]): with such a key, a node can move itself between sites or make
    /// itself a gateway candidate (docs/sites.md, "Trust").
    pub fn kubelet_writable_labels(&self) -> Vec<&str> {
        [self.site_label.as_str(), self.gateway_label.as_str()]
            .into_iter()
            .filter(|k| !k.starts_with(RESTRICTED_PREFIX))
            .collect()
    }
}

/// WireGuard's overhead on the WAN with an IPv4 outer header: IPv4 20 + UDP 8 + WireGuard's
/// header and tag 32 (measured in docs/sites-tunnel-choice.md).
pub const WIREGUARD_OVERHEAD_V4: u32 = 60;
/// The same with an IPv6 outer header (IPv6 40).
pub const WIREGUARD_OVERHEAD_V6: u32 = 80;

/// The header a relayed datagram carries before WireGuard's own message (issue 34: the relay
/// forwards end-to-end sessions it cannot read; `sticky_sites::relay`).
pub const RELAY_HEADER: u32 = 12;

/// What the tunnel takes of the WAN MTU with an outer header of `wan`'s family: WireGuard's
/// overhead, and the header a relayed path adds (a path moves between direct and relayed
/// under the same pod MTU).
pub fn tunnel_overhead(wan: IpAddr) -> u32 {
    let wireguard = match wan {
        IpAddr::V4(_) => WIREGUARD_OVERHEAD_V4,
        IpAddr::V6(_) => WIREGUARD_OVERHEAD_V6,
    };
    wireguard + RELAY_HEADER
}

/// The largest packet the tunnel carries whole over a WAN of `wan_mtu` with `overhead`
/// ([`tunnel_overhead`]): what is left, rounded down to a multiple of 16, because WireGuard
/// pads what it encrypts to a multiple of 16 and gotatun clamps that padding to the MTU it last
/// read from its device (every 3 s): a packet of this size is never padded past it.
pub fn tunnel_mtu(wan_mtu: u32, overhead: u32) -> u32 {
    wan_mtu.saturating_sub(overhead) / 16 * 16
}

/// `sites`, when present (see [`Sites`]).
pub fn parse(obj: &Map<String, Value>) -> Result<Option<Sites>, Error> {
    const KEYS: [&str; 8] = [
        "wanMtu",
        "listenPort",
        "interface",
        "siteLabel",
        "gatewayLabel",
        "relays",
        "keepaliveSecs",
        "probePort",
    ];
    let Some(v) = obj.get("sites") else {
        return Ok(None);
    };
    let Some(s) = v.as_object() else {
        return Err(bad(format!(
            "{v} is not an object like {{\"wanMtu\": 1500}}"
        )));
    };
    if let Some(k) = s.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(bad(format!("{k:?} is not one of {}", KEYS.join(", "))));
    }
    let field = |key: &str| s.get(key).filter(|v| !v.is_null()).cloned();
    Ok(Some(Sites {
        wan_mtu: wan_mtu(field("wanMtu"))?,
        listen_port: port("listenPort", field("listenPort"), DEFAULT_LISTEN_PORT)?,
        interface: interface(field("interface"))?,
        site_label: label("siteLabel", field("siteLabel"), DEFAULT_SITE_LABEL)?,
        gateway_label: label("gatewayLabel", field("gatewayLabel"), DEFAULT_GATEWAY_LABEL)?,
        relays: relays(field("relays"))?,
        keepalive_secs: keepalive(field("keepaliveSecs"))?,
        probe_port: port("probePort", field("probePort"), DEFAULT_PROBE_PORT)?,
    }))
}

fn wan_mtu(v: Option<Value>) -> Result<u32, Error> {
    let Some(v) = v else {
        return Ok(DEFAULT_WAN_MTU);
    };
    match v.as_u64().and_then(|m| u32::try_from(m).ok()) {
        Some(m) if (1280..=65_535).contains(&m) => Ok(m),
        _ => Err(bad(format!("wanMtu {v} is not from 1280 to 65535"))),
    }
}

/// A UDP port (`key`), `default` when absent.
fn port(key: &str, v: Option<Value>, default: u16) -> Result<u16, Error> {
    let Some(v) = v else {
        return Ok(default);
    };
    match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
        Some(p) if p != 0 => Ok(p),
        _ => Err(bad(format!("{key} {v} is not a UDP port from 1 to 65535"))),
    }
}

fn interface(v: Option<Value>) -> Result<String, Error> {
    match v {
        None => Ok(DEFAULT_TUNNEL_INTERFACE.to_string()),
        Some(Value::String(name)) => match cni_protocol::env::validate_ifname(&name) {
            Ok(()) => Ok(name),
            Err(e) => Err(bad(format!("interface {name:?}: {e}"))),
        },
        Some(v) => Err(bad(format!("interface {v} is not an interface name"))),
    }
}

/// A label key (`key`): it must contain `sticky-cni`, because the agent keeps only such
/// labels of a Node (a bound on what it holds per Node).
fn label(key: &str, v: Option<Value>, default: &str) -> Result<String, Error> {
    match v {
        None => Ok(default.to_string()),
        Some(Value::String(k))
            if k.contains("sticky-cni")
                && k.len() <= 253
                && !k.chars().any(char::is_whitespace) =>
        {
            Ok(k)
        }
        Some(v) => Err(bad(format!(
            "{key} {v} is not a label key containing \"sticky-cni\" (the agent keeps only such labels), e.g. {default}"
        ))),
    }
}

/// `relays`: a list of site names (label values), at most [`MAX_RELAYS`], no repeats.
fn relays(v: Option<Value>) -> Result<Vec<String>, Error> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let refuse = |why: String| bad(format!("relays {v}: {why}"));
    let Some(list) = v.as_array() else {
        return Err(refuse(
            "is not a list of site names like [\"cloud\"]".into(),
        ));
    };
    if list.len() > MAX_RELAYS {
        return Err(refuse(format!("names more than {MAX_RELAYS} sites")));
    }
    let mut out: Vec<String> = Vec::new();
    for item in list {
        let Some(name) = item.as_str().filter(|n| is_label_value(n)) else {
            return Err(refuse(format!(
                "{item} is not a site name (a label value: at most 63 characters, alphanumeric at both ends, '-', '_' or '.' between)"
            )));
        };
        if out.iter().any(|o| o == name) {
            return Err(refuse(format!("{name:?} is named twice")));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

/// A non-empty Kubernetes label value.
fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    let alnum_ends = b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    let inner = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    v.len() <= 63 && alnum_ends && inner
}

fn keepalive(v: Option<Value>) -> Result<u16, Error> {
    let Some(v) = v else {
        return Ok(DEFAULT_KEEPALIVE_SECS);
    };
    match v.as_u64().and_then(|k| u16::try_from(k).ok()) {
        Some(k) if (1..=3600).contains(&k) => Ok(k),
        _ => Err(bad(format!(
            "keepaliveSecs {v} is not from 1 to 3600 (seconds)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_sites(v: Value) -> Result<Option<Sites>, Error> {
        let mut obj = Map::new();
        obj.insert("sites".into(), v);
        parse(&obj)
    }

    #[test]
    fn absent_is_none() {
        assert_eq!(parse(&Map::new()).unwrap(), None);
    }

    #[test]
    fn defaults_are_the_restricted_keys_and_no_relay() {
        let d = parse_sites(json!({})).unwrap().unwrap();
        assert_eq!(
            d,
            Sites {
                wan_mtu: 1500,
                listen_port: 51820,
                interface: "stickywg0".into(),
                site_label: "node-restriction.kubernetes.io/sticky-cni-site".into(),
                gateway_label: "node-restriction.kubernetes.io/sticky-cni-gateway".into(),
                relays: Vec::new(),
                keepalive_secs: 10,
                probe_port: 51821,
            }
        );
        assert!(d.kubelet_writable_labels().is_empty());
    }

    #[test]
    fn settings_are_taken() {
        let s = parse_sites(
            json!({"wanMtu": 1492, "listenPort": 4500, "interface": "wg-sites",
            "siteLabel": "sticky-cni.io/site", "gatewayLabel": "sticky-cni.io/gateway",
            "relays": ["cloud", "dc-2"], "keepaliveSecs": 5, "probePort": 4789}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                s.wan_mtu,
                s.listen_port,
                s.interface.as_str(),
                s.keepalive_secs
            ),
            (1492, 4500, "wg-sites", 5)
        );
        assert_eq!(s.probe_port, 4789);
        assert_eq!(s.relays, ["cloud", "dc-2"]);
        assert_eq!(
            s.kubelet_writable_labels(),
            ["sticky-cni.io/site", "sticky-cni.io/gateway"]
        );
    }

    #[test]
    fn refusals_quote_the_value() {
        for (v, says) in [
            (json!(true), "is not an object"),
            (json!({"wanmtu": 1400}), "\"wanmtu\" is not one of"),
            (json!({"wanMtu": 1000}), "wanMtu 1000 is not from 1280"),
            (json!({"listenPort": 0}), "listenPort 0"),
            (json!({"listenPort": 70000}), "listenPort 70000"),
            (json!({"probePort": 70000}), "probePort 70000"),
            (json!({"probePort": "51821"}), "probePort \"51821\""),
            (
                json!({"keepaliveSecs": 0}),
                "keepaliveSecs 0 is not from 1 to 3600",
            ),
            (json!({"keepaliveSecs": 3601}), "keepaliveSecs 3601"),
            (json!({"interface": "a/b"}), "interface \"a/b\""),
            (
                json!({"siteLabel": "topology.kubernetes.io/zone"}),
                "containing \"sticky-cni\"",
            ),
            (
                json!({"gatewayLabel": "gateway"}),
                "gatewayLabel \"gateway\"",
            ),
            (json!({"relays": "cloud"}), "is not a list of site names"),
            (
                json!({"relays": ["-cloud"]}),
                "\"-cloud\" is not a site name",
            ),
            (
                json!({"relays": ["cloud", "cloud"]}),
                "\"cloud\" is named twice",
            ),
            (json!({"relays": [""]}), "is not a site name"),
        ] {
            let err = parse_sites(v.clone()).unwrap_err().to_string();
            assert!(err.contains(says), "{v}: {err}");
        }
    }

    #[test]
    fn the_tunnel_mtu_is_a_multiple_of_16() {
        assert_eq!(tunnel_mtu(1500, 72), 1424);
        assert_eq!(tunnel_mtu(1500, 92), 1408);
        assert_eq!(tunnel_mtu(1492, 72), 1408);
        assert_eq!(tunnel_mtu(60, 72), 0);
    }

    #[test]
    fn tunnel_overhead_by_outer_family() {
        assert_eq!(tunnel_overhead("192.0.2.1".parse().unwrap()), 72);
        assert_eq!(tunnel_overhead("2001:db8::1".parse().unwrap()), 92);
    }
}
