//! The segment network config (`"mode": "segment"`): every key checked, with an error that
//! names the key, quotes the bad value and says what was expected.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::attachments::{self, Attachment};
use super::routes;
use cni_protocol::Route;
use sticky_overlay::config as shared;
use sticky_overlay::peers::Peer;

const OUR_KEYS: &[&str] = &[
    "mode",
    "vni",
    "port",
    "peers",
    "peersFile",
    "nodes",
    "mtu",
    "up",
    "routes",
    "attachments",
    "nodeSlice",
    "stateDir",
];

/// Main-mode keys that mean nothing on a segment: refused, so a config that relies on one
/// is noticed instead of silently half-working.
const MAIN_ONLY_KEYS: &[&str] = &[
    "device",
    "localIp",
    "vtepName",
    "bridge",
    "isDefaultGateway",
    "hairpinMode",
    "ipMasq",
    "clusterCIDR",
    "peerOnlyPort",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// What the main mode checks too (name, keys, vni, port, peers, mtu, stateDir, ipam).
    #[error(transparent)]
    Shared(#[from] shared::Error),
    #[error("config key {0:?} belongs to the main mode and has no meaning on a segment: remove it")]
    MainOnly(String),
    #[error("config key \"routes\": {0}")]
    Routes(#[from] routes::Error),
    #[error("config key \"attachments\": {0}")]
    Attachments(#[from] attachments::Error),
    /// A fixed address IPAM may also hand out: two pods would hold it on one L2 segment.
    #[error(
        "config key \"attachments\": entry {index} (pod {pod:?}) gives {address}, which IPAM may hand out to another pod from its range {range}: give the entry an address outside every ipam range (move rangeStart/rangeEnd if need be), or leave its address to IPAM"
    )]
    FixedInIpamRange {
        index: usize,
        pod: String,
        address: IpAddr,
        range: String,
    },
}

fn bad(key: &'static str, reason: impl Into<String>) -> Error {
    Error::Shared(shared::bad(key, reason))
}

fn get<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &'static str,
    expected: &str,
) -> Result<Option<T>, Error> {
    Ok(shared::get(obj, key, expected)?)
}

/// A checked segment config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub peers: Vec<Peer>,
    pub peers_file: Option<PathBuf>,
    /// The nodes (underlay addresses) the segment spans; empty = every peer.
    pub nodes: Vec<IpAddr>,
    pub mtu: Option<u32>,
    /// Whether pod interfaces are brought up (kube-vxlan-controller's `up`).
    pub up: bool,
    pub routes: Vec<Route>,
    pub attachments: Vec<Attachment>,
    /// Prefix length of each node's slice of the IPAM ranges (sticky-ipam/host-local).
    pub node_slice: Option<u8>,
    pub state_dir: PathBuf,
    /// `ipam.type`, or `None` for an L2-only segment (or one with fixed addresses).
    pub ipam_type: Option<String>,
    /// The `ipam` section as given (`Null` without one): its ranges are cut per node when
    /// `nodeSlice` is set.
    pub ipam: Value,
}

/// How every [`Config::marker`] begins.
const MARKER: &str = "sticky-vxlan segment ";

/// The network a [`Config::marker`] names, if `alias` is one.
pub(crate) fn marked_network(alias: &str) -> Option<&str> {
    alias.strip_prefix(MARKER)?.split(' ').next()
}

impl Config {
    pub fn from_json(name: &str, raw: &Value) -> Result<Config, Error> {
        let obj = raw.as_object().ok_or(shared::Error::NotAnObject)?;
        if let Some(key) = obj.keys().find(|k| MAIN_ONLY_KEYS.contains(&k.as_str())) {
            return Err(Error::MainOnly(key.clone()));
        }
        let (vni, port) = shared::shared_head(name, obj, OUR_KEYS)?;
        let (peers, peers_file) = shared::peer_sources(obj)?;
        if peers.is_empty() && peers_file.is_none() {
            return Err(bad(
                "peers",
                "a segment needs its nodes: give \"peers\" and/or \"peersFile\"",
            ));
        }
        let nodes: Vec<IpAddr> =
            get(obj, "nodes", "a list of underlay addresses")?.unwrap_or_default();
        if let Some((n, what)) = nodes
            .iter()
            .find_map(|n| Some((n, sticky_overlay::peers::not_a_node(*n)?)))
        {
            return Err(bad(
                "nodes",
                format!("{n} is {what}: a node is named by its unicast underlay address"),
            ));
        }
        let mtu = shared::mtu(obj)?;
        let up = get(obj, "up", "true or false")?.unwrap_or(true);
        let routes = match obj.get("routes") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => routes::parse(v)?,
        };
        let attachments = match obj.get("attachments") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => attachments::parse(v)?,
        };
        let node_slice: Option<u8> = get(obj, "nodeSlice", "a prefix length such as 26")?;
        let state_dir = shared::state_dir(obj)?;
        let ipam_type = match obj.get("ipam") {
            None | Some(Value::Null) => None,
            Some(Value::Object(ipam)) if ipam.is_empty() => None,
            Some(Value::Object(ipam)) => Some(shared::ipam_type(ipam)?),
            Some(v) => return Err(bad("ipam", format!("{v} is not an object"))),
        };
        if let Some(p) = node_slice {
            if ipam_type.is_none() {
                return Err(bad(
                    "nodeSlice",
                    "cuts the IPAM ranges per node, but there is no \"ipam\"",
                ));
            }
            if !(1..=30).contains(&p) {
                return Err(bad(
                    "nodeSlice",
                    format!("{p} is not a prefix length from 1 to 30"),
                ));
            }
        }
        Ok(Config {
            name: name.to_string(),
            vni,
            port,
            peers,
            peers_file,
            nodes,
            mtu,
            up,
            routes,
            attachments,
            node_slice,
            state_dir,
            ipam_type,
            ipam: obj.get("ipam").cloned().unwrap_or(Value::Null),
        })
    }

    /// Refuses a fixed address (an `attachments` entry's `ips`) that IPAM may hand out too:
    /// one inside any range of the `ipam` section, whole (a node that joins later takes a
    /// slice of its own, so any node's slice counts), other than what IPAM never hands out
    /// (the gateway, the network and IPv4 broadcast addresses). A pod given such an address
    /// would share it, and its MAC, with the pod IPAM gives it to.
    pub(crate) fn check_fixed_addresses(&self) -> Result<(), Error> {
        let pools = super::slice::pools(&self.ipam);
        for (index, entry) in self.attachments.iter().enumerate() {
            for ip in &entry.ips {
                if let Some(pool) = pools.iter().find(|p| p.hands_out(ip.addr())) {
                    return Err(Error::FixedInIpamRange {
                        index,
                        pod: entry.pod.clone(),
                        address: ip.addr(),
                        range: pool.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The segment's bridge on every node.
    pub fn bridge(&self) -> String {
        format!("segbr{}", self.vni)
    }

    /// The segment's VXLAN device on every node.
    pub fn vxlan(&self) -> String {
        format!("segvx{}", self.vni)
    }

    /// The alias marking the devices this network made: a device of the same name without it
    /// is someone else's and is never adopted.
    pub fn marker(&self) -> String {
        format!("{MARKER}{} vni {}", self.name, self.vni)
    }

    /// A copy of the last peers file that was valid (see the main mode).
    pub fn last_good_peers_path(&self) -> PathBuf {
        self.state_dir
            .join(format!("{}.segment.peers.json", self.name))
    }

    /// The lock serializing this segment's node work.
    pub fn lock_path(&self) -> PathBuf {
        self.state_dir.join(format!("{}.segment.lock", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "vxeth1", "type": "sticky-vxlan", "mode": "segment",
            "vni": 101, "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}]
        })
    }

    fn with(key: &str, value: Value) -> Result<Config, Error> {
        let mut v = base();
        v[key] = value;
        Config::from_json("vxeth1", &v)
    }

    #[test]
    fn defaults() {
        let c = Config::from_json("vxeth1", &base()).unwrap();
        assert_eq!(c.port, 8472);
        assert!(c.up);
        assert_eq!(c.ipam_type, None);
        assert_eq!(
            (c.bridge(), c.vxlan()),
            ("segbr101".into(), "segvx101".into())
        );
        assert_eq!(c.marker(), "sticky-vxlan segment vxeth1 vni 101");
        assert!(c.bridge().len() <= 15 && format!("segbr{}", shared::MAX_VNI).len() <= 15);
    }

    #[test]
    fn every_key_is_checked() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("vni", json!(0), "vni"),
            ("vni", json!(16_777_216), "vni"),
            ("vni", json!("1"), "vni"),
            ("port", json!(0), "port"),
            ("port", json!(70000), "port"),
            ("peers", json!([{"ip": "192.0.2.1"}]), "peers"),
            ("peers", json!([]), "peers"),
            ("peersFile", json!("relative"), "peersFile"),
            ("nodes", json!(["nope"]), "nodes"),
            ("nodes", json!(["0.0.0.0"]), "nodes"),
            // No node sits at an address a peer entry may not name (the main mode's rule).
            ("nodes", json!(["127.0.0.1"]), "nodes"),
            ("nodes", json!(["169.254.0.7"]), "nodes"),
            ("nodes", json!(["255.255.255.255"]), "nodes"),
            ("mtu", json!(100), "mtu"),
            ("up", json!("yes"), "up"),
            ("nodeSlice", json!(26), "nodeSlice"),
            ("stateDir", json!("run"), "stateDir"),
            ("ipam", json!({"type": "../x"}), "ipam"),
            ("ipam", json!({"subnet": "10.0.0.0/24"}), "ipam"),
            ("ipam", json!("static"), "ipam"),
        ];
        for (key, value, blamed) in cases {
            match with(key, value.clone()) {
                Err(Error::Shared(shared::Error::Key { key: k, reason })) => {
                    assert_eq!(k, blamed, "{key}={value}: {reason}");
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
        for value in [
            json!([{"dst": "10.0.0.0/8", "via": "10.0.0.1"}]),
            json!([{"dst": "10.0.0.0"}]),
            json!([{"dst": "10.0.0.0/8", "gw": "fd00::1"}]),
            json!({"dst": "10.0.0.0/8"}),
        ] {
            let err = with("routes", value.clone()).unwrap_err();
            assert!(matches!(err, Error::Routes(_)), "{value}: {err:?}");
            assert!(
                err.to_string().starts_with("config key \"routes\": "),
                "{err}"
            );
        }
        assert!(matches!(
            with("peersfile", json!("/x")),
            Err(Error::Shared(shared::Error::Misspelt {
                meant: "peersFile",
                ..
            }))
        ));
        assert_eq!(
            with("bridge", json!("br0")),
            Err(Error::MainOnly("bridge".into()))
        );
        assert!(matches!(
            with("attachments", json!([{"pod": "a", "ips": ["x"]}])),
            Err(Error::Attachments(_))
        ));
        let mut v = base();
        v.as_object_mut().unwrap().remove("vni");
        assert_eq!(
            Config::from_json("n", &v),
            Err(Error::Shared(shared::Error::Missing("vni")))
        );
        let mut v = base();
        v["ipam"] = json!({"type": "sticky-ipam", "subnet": "192.168.11.0/24"});
        v["nodeSlice"] = json!(31);
        assert!(matches!(
            Config::from_json("n", &v),
            Err(Error::Shared(shared::Error::Key {
                key: "nodeSlice",
                ..
            }))
        ));
    }

    /// Issue 21: pod `x-1` got 192.168.11.65 from the attachments table while IPAM had leased
    /// it to `p-1` (node 192.0.2.1's slice of a /26 cut is .64/26): the same address, and so
    /// the same MAC, twice on one L2 segment.
    #[test]
    fn a_fixed_address_ipam_may_hand_out_is_refused() {
        let check = |ipam: Value, ips: Value| {
            let mut v = base();
            v["ipam"] = ipam;
            v["attachments"] = json!([
                {"pod": "gw-*", "ips": ["192.168.11.1/24"]},
                {"pod": "x-*", "ips": ips}
            ]);
            Config::from_json("vxeth1", &v)
                .unwrap()
                .check_fixed_addresses()
        };
        let sliced = json!({"type": "sticky-ipam", "subnet": "192.168.11.0/24"});
        let mut v = base();
        v["ipam"] = sliced.clone();
        v["nodeSlice"] = json!(26);
        v["attachments"] = json!([{"pod": "x-*", "ips": ["192.168.11.65/24"]}]);
        let err = Config::from_json("vxeth1", &v)
            .unwrap()
            .check_fixed_addresses()
            .unwrap_err();
        assert_eq!(
            err,
            Error::FixedInIpamRange {
                index: 0,
                pod: "x-*".into(),
                address: "192.168.11.65".parse().unwrap(),
                range: "192.168.11.1-192.168.11.254 of 192.168.11.0/24".into(),
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains(r#"entry 0 (pod "x-*") gives 192.168.11.65"#)
                && msg.contains("192.168.11.0/24"),
            "{msg}"
        );
        // Any node's slice counts, not only this one's: a node added later takes its own
        // slice, and the address would be handed out there.
        assert!(check(sliced.clone(), json!(["192.168.11.200/24"])).is_err());
        // The range sets too, and IPv6.
        let sets = json!({"type": "host-local", "ranges": [
            [{"subnet": "192.168.12.0/24", "rangeStart": "192.168.12.100"}],
            [{"subnet": "fd00:11::/64"}]
        ]});
        assert!(check(sets.clone(), json!(["192.168.12.100/24"])).is_err());
        assert!(check(sets.clone(), json!(["fd00:11::5/64"])).is_err());
        // Outside every range: below rangeStart, above rangeEnd, another subnet.
        assert_eq!(check(sets.clone(), json!(["192.168.12.99/24"])), Ok(()));
        assert_eq!(check(sets, json!(["192.168.11.5/24"])), Ok(()));
        let low = json!({"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                         "rangeStart": "192.168.11.32", "rangeEnd": "192.168.11.63"});
        assert_eq!(check(low, json!(["192.168.11.64/24"])), Ok(()));
        // What IPAM never hands out is free for a fixed address: the gateway (the `gw` pod
        // above holds .1, the subnet's default gateway) and the IPv4 broadcast address.
        assert_eq!(check(sliced.clone(), json!(["192.168.11.255/24"])), Ok(()));
        let moved = json!({"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                           "gateway": "192.168.11.9"});
        // Once the gateway moves, .1 is an address like any other: the gw entry is refused.
        assert!(matches!(
            check(moved, json!(["192.168.11.9/24"])),
            Err(Error::FixedInIpamRange { index: 0, .. })
        ));
        // Without IPAM, or with one that is not of host-local's schema, nothing to clash with.
        assert_eq!(check(Value::Null, json!(["192.168.11.65/24"])), Ok(()));
        assert_eq!(
            check(json!({"type": "static"}), json!(["192.168.11.65/24"])),
            Ok(())
        );
    }

    #[test]
    fn full_config_reads() {
        let mut v = base();
        for (k, val) in [
            ("peersFile", json!("/etc/sticky/peers.json")),
            ("nodes", json!(["192.0.2.1", "192.0.2.3"])),
            ("mtu", json!(1400)),
            ("up", json!(false)),
            (
                "routes",
                json!([{"dst": "192.168.12.0/29", "gw": "192.168.11.1"}]),
            ),
            (
                "attachments",
                json!([{"pod": "gw-*", "ips": ["192.168.11.1/29"]}]),
            ),
            (
                "ipam",
                json!({"type": "sticky-ipam", "subnet": "192.168.11.0/24"}),
            ),
            ("nodeSlice", json!(27)),
            ("capabilities", json!({"mac": true, "ips": true})),
            ("runtimeConfig", json!({"mac": "02:00:00:00:00:01"})),
        ] {
            v[k] = val;
        }
        let c = Config::from_json("vxeth1", &v).unwrap();
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.mtu, Some(1400));
        assert!(!c.up);
        assert_eq!(c.routes[0].gw, Some("192.168.11.1".parse().unwrap()));
        assert_eq!(c.attachments.len(), 1);
        assert_eq!(c.ipam_type.as_deref(), Some("sticky-ipam"));
        assert_eq!(c.node_slice, Some(27));
    }
}
