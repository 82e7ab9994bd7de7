//! The `sticky-vxlan` network config: every key checked, with an error that names the key,
//! quotes the bad value and says what was expected.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::peers::{Peer, PeerEntry};

/// The kernel's (and flannel's) default VXLAN port.
pub(crate) const DEFAULT_PORT: u16 = 8472;
/// VXLAN over IPv4: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
pub(crate) const IPV4_OVERHEAD: u32 = 50;
/// An IPv6 underlay's VXLAN encapsulation: outer IPv6 (40) + UDP (8) + VXLAN (8) + inner
/// Ethernet (14).
pub(crate) const IPV6_OVERHEAD: u32 = 70;

/// What VXLAN adds to a pod packet on an underlay of `local`'s family.
pub fn vxlan_overhead(local: std::net::IpAddr) -> u32 {
    if local.is_ipv4() {
        IPV4_OVERHEAD
    } else {
        IPV6_OVERHEAD
    }
}

pub(crate) const DEFAULT_BRIDGE: &str = "stickybr0";
pub const DEFAULT_STATE_DIR: &str = "/run/sticky-vxlan";
/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;

/// Keys every CNI config may carry (spec and libcni), accepted and left alone.
const STANDARD_KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "ipam",
    "dns",
    "prevResult",
    "runtimeConfig",
    "args",
    "capabilities",
    "disableCheck",
    "disableGC",
];

const OUR_KEYS: &[&str] = &[
    "vni",
    "port",
    "device",
    "localIp",
    "vtepName",
    "bridge",
    "mtu",
    "isDefaultGateway",
    "hairpinMode",
    "ipMasq",
    "clusterCIDR",
    "peerOnlyPort",
    "peers",
    "peersFile",
    "stateDir",
    "sites",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("config key {key:?}: {reason}")]
    Key { key: &'static str, reason: String },
    #[error("config key {key:?} is not known to sticky-vxlan: did you mean {meant:?}?")]
    Misspelt { key: String, meant: &'static str },
    #[error("config key {0:?} is required")]
    Missing(&'static str),
    #[error("network config must be a JSON object")]
    NotAnObject,
}

pub fn bad(key: &'static str, reason: impl Into<String>) -> Error {
    Error::Key {
        key,
        reason: reason.into(),
    }
}

/// A checked `sticky-vxlan` config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub device: Option<String>,
    pub local_ip: Option<IpAddr>,
    pub vtep_name: String,
    pub bridge: String,
    pub mtu: Option<u32>,
    pub is_default_gateway: bool,
    pub hairpin_mode: bool,
    pub ip_masq: bool,
    pub cluster_cidr: Option<IpNet>,
    pub peer_only_port: bool,
    pub peers: Vec<Peer>,
    pub peers_file: Option<PathBuf>,
    pub state_dir: PathBuf,
    /// `ipam.type`: the IPAM plugin executed from `CNI_PATH`.
    pub ipam_type: String,
    /// `sites`: the network spans sites joined by WireGuard gateways (docs/sites.md).
    pub sites: Option<crate::sites::Sites>,
    /// Whether this node's subnets (from its peer entry) are filled in as the IPAM ranges:
    /// the IPAM plugin reads host-local's schema (`sticky-ipam`, `host-local`) and nothing
    /// names a range, neither the section (`ranges`, `subnet`) nor the runtime
    /// (`runtimeConfig.ipRanges`, the ipRanges capability).
    pub ranges_from_peers: bool,
}

/// IPAM plugins whose config is host-local's schema, the ones ranges may be filled in for.
const RANGE_SCHEMA: [&str; 2] = ["sticky-ipam", "host-local"];

/// See [`Config::ranges_from_peers`].
fn ranges_from_peers(ipam_type: &str, ipam: &Map<String, Value>, raw: &Value) -> bool {
    let named = |v: Option<&Value>| match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    RANGE_SCHEMA.contains(&ipam_type)
        && !named(ipam.get("ranges"))
        && !named(ipam.get("subnet"))
        && !named(raw.get("runtimeConfig").and_then(|r| r.get("ipRanges")))
}

/// The longest network name: the devices' marker (`sticky-vxlan:bridge <name>`) must fit in
/// an interface alias (255 bytes).
const MAX_NAME: usize = 230;

pub fn get<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &'static str,
    expected: &str,
) -> Result<Option<T>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|_| bad(key, format!("{v} is not {expected}"))),
    }
}

/// A name the kernel accepts for an interface.
fn check_ifname(key: &'static str, name: &str) -> Result<(), Error> {
    cni_protocol::env::validate_ifname(name).map_err(|_| {
        bad(
            key,
            format!(
                "{name:?} is not a valid interface name (1 to 15 bytes, no '/', ':' or spaces)"
            ),
        )
    })
}

/// The network name, misspelt keys (`ours` are the mode's own keys), `vni` and `port`: what
/// every sticky-vxlan config checks first, whatever its mode. Runtimes add keys of their own
/// (`cni.dev/valid-attachments`, capabilities...), so other keys are left alone; a known key
/// spelled in another case is a typo, refused.
pub fn shared_head(
    name: &str,
    obj: &Map<String, Value>,
    ours: &[&'static str],
) -> Result<(u32, u16), Error> {
    // The name is part of paths in stateDir and of the devices' marker: the CNI pattern
    // keeps it a single path component (no '/', no "..").
    if !cni_protocol::netconf::is_network_name(name) || name.len() > MAX_NAME {
        return Err(bad(
            "name",
            format!(
                "{name:?} is not a network name (letters, digits, '_', '.', '-', starting with a letter or digit, at most {MAX_NAME} bytes)"
            ),
        ));
    }
    for key in obj.keys() {
        let known = ours.contains(&key.as_str()) || STANDARD_KEYS.contains(&key.as_str());
        if let Some(meant) = ours.iter().find(|k| !known && k.eq_ignore_ascii_case(key)) {
            return Err(Error::Misspelt {
                key: key.clone(),
                meant,
            });
        }
    }
    let vni: u32 =
        get(obj, "vni", "an integer from 1 to 16777215")?.ok_or(Error::Missing("vni"))?;
    if !(1..=MAX_VNI).contains(&vni) {
        return Err(bad("vni", format!("{vni} is not from 1 to {MAX_VNI}")));
    }
    let port: u16 = get(obj, "port", "a UDP port number")?.unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return Err(bad("port", "0 is not a usable UDP port"));
    }
    Ok((vni, port))
}

/// `mtu`, when set.
pub fn mtu(obj: &Map<String, Value>) -> Result<Option<u32>, Error> {
    let mtu: Option<u32> = get(obj, "mtu", "an integer")?;
    if let Some(m) = mtu
        && !(576..=65_485).contains(&m)
    {
        return Err(bad("mtu", format!("{m} is not from 576 to 65485")));
    }
    Ok(mtu)
}

/// `peers` (checked) and `peersFile` (absolute).
pub fn peer_sources(obj: &Map<String, Value>) -> Result<(Vec<Peer>, Option<PathBuf>), Error> {
    let entries: Vec<PeerEntry> = get(
        obj,
        "peers",
        "a list of {\"ip\", \"subnets\", \"mac\"?} objects",
    )?
    .unwrap_or_default();
    let peers = super::peers::check_entries(&entries).map_err(|e| bad("peers", e.to_string()))?;
    let peers_file: Option<PathBuf> = get(obj, "peersFile", "a file path")?;
    if let Some(p) = &peers_file
        && !p.is_absolute()
    {
        return Err(bad(
            "peersFile",
            format!("{} is not an absolute path", p.display()),
        ));
    }
    Ok((peers, peers_file))
}

/// `stateDir` (absolute), or its default.
pub fn state_dir(obj: &Map<String, Value>) -> Result<PathBuf, Error> {
    let state_dir: PathBuf = get(obj, "stateDir", "a directory path")?
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    if !state_dir.is_absolute() {
        return Err(bad(
            "stateDir",
            format!("{} is not an absolute path", state_dir.display()),
        ));
    }
    Ok(state_dir)
}

/// `ipam.type`: a plugin file name looked up on `CNI_PATH`.
pub fn ipam_type(ipam: &Map<String, Value>) -> Result<String, Error> {
    match ipam.get("type") {
        Some(Value::String(t)) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => {
            Ok(t.clone())
        }
        Some(v) => Err(bad("ipam", format!("type {v} is not a plugin file name"))),
        None => Err(bad(
            "ipam",
            "has no \"type\" (the IPAM plugin to run, e.g. \"sticky-ipam\")",
        )),
    }
}

impl Config {
    /// Reads the plugin's keys from a parsed network config (`name` comes from it too).
    pub fn from_json(name: &str, raw: &Value) -> Result<Config, Error> {
        let obj = raw.as_object().ok_or(Error::NotAnObject)?;
        let (vni, port) = shared_head(name, obj, OUR_KEYS)?;
        let device: Option<String> = get(obj, "device", "an interface name")?;
        if let Some(d) = &device {
            check_ifname("device", d)?;
        }
        let local_ip = match get::<IpAddr>(obj, "localIp", "an IPv4 or IPv6 address")? {
            None => None,
            Some(a) => match super::peers::not_a_node(a) {
                None => Some(a),
                Some(what) => {
                    return Err(bad(
                        "localIp",
                        format!("{a} is {what}, not a unicast address other nodes can reach"),
                    ));
                }
            },
        };
        let vtep_name: String =
            get(obj, "vtepName", "an interface name")?.unwrap_or_else(|| format!("sticky.{vni}"));
        check_ifname("vtepName", &vtep_name)?;
        let bridge: String =
            get(obj, "bridge", "an interface name")?.unwrap_or_else(|| DEFAULT_BRIDGE.into());
        check_ifname("bridge", &bridge)?;
        if bridge == vtep_name {
            return Err(bad("bridge", format!("{bridge:?} is also the VTEP's name")));
        }
        let mtu = mtu(obj)?;
        let flag = |key: &'static str| -> Result<bool, Error> {
            Ok(get(obj, key, "true or false")?.unwrap_or(false))
        };
        let is_default_gateway = flag("isDefaultGateway")?;
        let hairpin_mode = flag("hairpinMode")?;
        let ip_masq = flag("ipMasq")?;
        let peer_only_port = flag("peerOnlyPort")?;
        let cluster_cidr: Option<IpNet> = get(obj, "clusterCIDR", "a CIDR such as 10.244.0.0/16")?;
        if ip_masq && cluster_cidr.is_none() {
            return Err(bad(
                "clusterCIDR",
                "is required with ipMasq: traffic to other pods (the cluster CIDR) is never masqueraded",
            ));
        }
        if let Some(c) = cluster_cidr
            && c.trunc() != c
        {
            return Err(bad(
                "clusterCIDR",
                format!("{c} has host bits set (did you mean {}?)", c.trunc()),
            ));
        }
        let (peers, peers_file) = peer_sources(obj)?;
        if let Some(local) = local_ip
            && let Some(other) = peers.iter().find(|p| p.ip.is_ipv4() != local.is_ipv4())
        {
            return Err(bad(
                "localIp",
                format!(
                    "{local} and peer {} are of two families: one network's underlay is IPv4 or IPv6",
                    other.ip
                ),
            ));
        }
        let state_dir = state_dir(obj)?;
        let sites = crate::sites::parse(obj).map_err(|e| bad("sites", e.to_string()))?;
        let ipam = obj
            .get("ipam")
            .and_then(Value::as_object)
            .ok_or(Error::Missing("ipam"))?;
        let ipam_type = ipam_type(ipam)?;
        Ok(Config {
            name: name.to_string(),
            vni,
            port,
            device,
            local_ip,
            vtep_name,
            bridge,
            mtu,
            is_default_gateway,
            hairpin_mode,
            ip_masq,
            cluster_cidr,
            peer_only_port,
            peers,
            peers_file,
            state_dir,
            ranges_from_peers: ranges_from_peers(&ipam_type, ipam, raw),
            ipam_type,
            sites,
        })
    }

    /// A copy of the last peers file that was valid, used (for the local entry and the
    /// peers to keep) while the real one cannot be read.
    pub fn last_good_peers_path(&self) -> PathBuf {
        self.state_dir.join(format!("{}.peers.json", self.name))
    }

    /// The lock serializing peer reconciliation for this network.
    pub fn lock_path(&self) -> PathBuf {
        self.state_dir.join(format!("{}.lock", self.name))
    }

    /// Takes the network's lock, `<stateDir>/<name>.lock`, waiting for it.
    pub fn lock(&self) -> Result<super::state_dir::Lock, super::state_dir::LockError> {
        super::state_dir::lock_at(&self.state_dir, &self.lock_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    fn base() -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "edge", "type": "sticky-vxlan", "vni": 1,
            "ipam": {"type": "host-local", "subnet": "10.244.1.0/24"}
        })
    }

    fn with(key: &str, value: Value) -> Result<Config, Error> {
        let mut v = base();
        v[key] = value;
        Config::from_json("edge", &v)
    }

    #[test]
    fn defaults() {
        let c = Config::from_json("edge", &base()).unwrap();
        assert_eq!(c.port, 8472);
        assert_eq!(c.vtep_name, "sticky.1");
        assert_eq!(c.bridge, "stickybr0");
        assert_eq!(c.mtu, None);
        assert!(!c.ip_masq && !c.is_default_gateway && !c.hairpin_mode && !c.peer_only_port);
        assert_eq!(c.ipam_type, "host-local");
        assert_eq!(c.lock_path(), PathBuf::from("/run/sticky-vxlan/edge.lock"));
    }

    #[test]
    fn every_key_is_checked() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("vni", json!(0), "vni"),
            ("vni", json!(16_777_216), "vni"),
            ("vni", json!("1"), "vni"),
            ("port", json!(0), "port"),
            ("port", json!(70000), "port"),
            ("device", json!("a/b"), "device"),
            ("localIp", json!("fe80::1"), "localIp"),
            ("localIp", json!("::ffff:192.0.2.1"), "localIp"),
            ("localIp", json!("0.0.0.0"), "localIp"),
            ("localIp", json!("127.0.0.1"), "localIp"),
            ("localIp", json!("169.254.0.1"), "localIp"),
            ("localIp", json!("nope"), "localIp"),
            ("vtepName", json!("much-too-long-name"), "vtepName"),
            ("bridge", json!(""), "bridge"),
            ("bridge", json!("sticky.1"), "bridge"),
            ("mtu", json!(100), "mtu"),
            ("isDefaultGateway", json!("yes"), "isDefaultGateway"),
            ("hairpinMode", json!(1), "hairpinMode"),
            ("ipMasq", json!(true), "clusterCIDR"),
            ("clusterCIDR", json!("10.244.1.0/8"), "clusterCIDR"),
            ("peerOnlyPort", json!("true"), "peerOnlyPort"),
            ("peers", json!([{"ip": "192.0.2.1"}]), "peers"),
            ("peersFile", json!("relative/peers.json"), "peersFile"),
            ("stateDir", json!("run"), "stateDir"),
            ("ipam", json!({"type": "../x"}), "ipam"),
        ];
        for (key, value, blamed) in cases {
            match with(key, value.clone()) {
                Err(Error::Key { key: k, reason }) => {
                    assert_eq!(k, blamed, "{key}={value}: {reason}");
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
        assert!(matches!(
            with("vtepname", json!("x")),
            Err(Error::Misspelt {
                meant: "vtepName",
                ..
            })
        ));
        assert!(with("cni.dev/valid-attachments", json!([])).is_ok());
        let mut v = base();
        v.as_object_mut().unwrap().remove("vni");
        assert_eq!(Config::from_json("edge", &v), Err(Error::Missing("vni")));
        let mut v = base();
        v.as_object_mut().unwrap().remove("ipam");
        assert_eq!(Config::from_json("edge", &v), Err(Error::Missing("ipam")));
    }

    #[test]
    fn ranges_come_from_peers_only_when_nothing_names_them() {
        let from_peers = |ipam: Value, runtime: Option<Value>| {
            let mut v = base();
            v["ipam"] = ipam;
            if let Some(r) = runtime {
                v["runtimeConfig"] = r;
            }
            Config::from_json("edge", &v).unwrap().ranges_from_peers
        };
        assert!(from_peers(json!({"type": "sticky-ipam"}), None));
        assert!(from_peers(
            json!({"type": "host-local", "ranges": []}),
            None
        ));
        assert!(from_peers(
            json!({"type": "sticky-ipam"}),
            Some(json!({"ipRanges": []}))
        ));
        assert!(!from_peers(
            json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"}),
            None
        ));
        assert!(!from_peers(
            json!({"type": "sticky-ipam", "ranges": [[{"subnet": "10.0.0.0/24"}]]}),
            None
        ));
        assert!(!from_peers(json!({"type": "dhcp"}), None));
        // The ipRanges capability: the runtime's ranges, never the node's on top of them.
        assert!(!from_peers(
            json!({"type": "sticky-ipam"}),
            Some(json!({"ipRanges": [[{"subnet": "10.9.0.0/24"}]]}))
        ));
    }

    #[test]
    fn network_names_that_could_leave_the_state_dir_are_refused() {
        for name in ["../../x", "a/b", "", ".hidden", &"n".repeat(231)] {
            assert!(
                matches!(
                    Config::from_json(name, &base()),
                    Err(Error::Key { key: "name", .. })
                ),
                "{name}"
            );
        }
        assert!(Config::from_json("edge_1.a-b", &base()).is_ok());
    }

    #[test]
    fn an_ipv6_local_ip_is_taken_and_a_mix_of_families_refused() {
        let c = with("localIp", json!("2001:db8::1")).unwrap();
        assert_eq!(c.local_ip, Some("2001:db8::1".parse().unwrap()));
        let mut v = base();
        v["localIp"] = json!("2001:db8::1");
        v["peers"] = json!([{"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]}]);
        let err = Config::from_json("edge", &v).unwrap_err().to_string();
        assert!(
            err.contains("2001:db8::1")
                && err.contains("192.0.2.2")
                && err.contains("two families"),
            "{err}"
        );
        let mut v = base();
        v["peers"] = json!([{"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]},
                            {"ip": "2001:db8::3", "subnets": ["10.244.3.0/24"]}]);
        let err = Config::from_json("edge", &v).unwrap_err().to_string();
        assert!(
            err.contains("192.0.2.2") && err.contains("2001:db8::3"),
            "{err}"
        );
    }

    #[test]
    fn full_config_reads() {
        let mut v = base();
        for (k, val) in [
            ("port", json!(4789)),
            ("localIp", json!("192.0.2.1")),
            ("device", json!("eth0")),
            ("mtu", json!(1350)),
            ("ipMasq", json!(true)),
            ("clusterCIDR", json!("10.244.0.0/16")),
            (
                "peers",
                json!([{"ip": "192.0.2.2", "subnets": ["10.244.2.0/24", "fd00:2::/64"], "mac": "aa:bb:cc:dd:ee:02"}]),
            ),
            ("peersFile", json!("/etc/sticky/peers.json")),
        ] {
            v[k] = val;
        }
        let c = Config::from_json("edge", &v).unwrap();
        assert_eq!(c.port, 4789);
        assert_eq!(c.local_ip, Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.peers[0].mac, Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x02]));
    }
}
