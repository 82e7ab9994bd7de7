//! The `ipam` section: host-local's whole schema plus the stickiness keys.
//!
//! Everything host-local accepts means the same here: `ranges`, the legacy flat form
//! (`subnet`, `rangeStart`, `rangeEnd`, `gateway` directly under `ipam`), `routes`, `dataDir`,
//! `resolvConf`, requested IPs from `runtimeConfig.ips`, `args.cni.ips` and CNI_ARGS `IP=`, and
//! the `ipRanges` capability (prepended to `ranges`, as host-local does).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::range::{RangeError, RangeSet, RangeSpec};
use cni_protocol::{Args, NetConf, Route, Version};

/// What ADD does when a range set has no never-used address left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenExhausted {
    /// Take the released lease released longest ago (the default).
    Reclaim,
    /// Fail with "range exhausted"; released leases stay for their pods.
    Refuse,
}

/// The validated `ipam` configuration of one call.
#[derive(Debug, Clone)]
pub struct IpamConfig {
    /// The network name: one directory under `data_dir`.
    pub network: String,
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
    /// Addresses asked for by the runtime, from every source.
    pub requested: Vec<IpAddr>,
    pub sticky: bool,
    pub when_exhausted: WhenExhausted,
    /// How long a released lease is kept before it is freed; `None` keeps it until needed.
    pub lease_hold: Option<Duration>,
    pub status_fails_when_full: bool,
    pub metrics_file: Option<PathBuf>,
}

pub(crate) const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // host-local's words (1.1.1) where it refuses the same input: scripts grep for them.
    #[error("IPAM config missing 'ipam' key")]
    NoIpam,
    #[error("ipam config is malformed: {0}")]
    Shape(#[from] serde_json::Error),
    #[error("no IP ranges specified")]
    NoRanges,
    #[error("{}", range_message(*index, source))]
    Range { index: usize, source: RangeError },
    #[error("range set {0} overlaps with {1}")]
    SetsOverlap(usize, usize),
    #[error("CNI version {0} does not support more than 1 address per family")]
    TooManyForVersion(Version),
    #[error("requested IP {0:?} is not an IP address")]
    BadRequestedIp(String),
    /// host-local's words for a bad CNI_ARGS `IP=`.
    #[error("ARGS: error parsing value of pair \"IP={value}\": invalid IP address {text}")]
    BadArgsIp { value: String, text: String },
    #[error("whenExhausted {0:?} must be \"reclaim\" or \"refuse\"")]
    BadWhenExhausted(String),
    #[error("leaseHold {0:?} is not a duration such as \"90s\", \"30m\", \"72h\" or \"7d\"")]
    BadDuration(String),
    #[error("{key} {path:?} must be an absolute path")]
    RelativePath { key: &'static str, path: PathBuf },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIpam {
    // `null` lists are absent ones, as Go's decoder (host-local) reads them.
    #[serde(default)]
    ranges: Option<Vec<Vec<RangeSpec>>>,
    #[serde(flatten)]
    legacy: RangeSpec,
    #[serde(default)]
    routes: Option<Vec<Route>>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    resolv_conf: Option<PathBuf>,
    #[serde(default)]
    sticky: Option<bool>,
    #[serde(default)]
    when_exhausted: Option<String>,
    #[serde(default)]
    lease_hold: Option<String>,
    #[serde(default)]
    status_fails_when_full: Option<bool>,
    #[serde(default)]
    metrics_file: Option<PathBuf>,
}

impl IpamConfig {
    /// Reads the `ipam` section of `conf`, with requested IPs from `args` (CNI_ARGS).
    pub fn from_netconf(conf: &NetConf, args: &Args) -> Result<IpamConfig, ConfigError> {
        IpamConfig::parse(conf, args, true)
    }

    /// As [`IpamConfig::from_netconf`], but a section without any range is accepted: DEL
    /// finds its records by container id and pod name, never by range, and must succeed even
    /// when a main plugin could not fill the ranges in (sticky-vxlan's cluster-wide conflist
    /// on a node that no longer finds itself in the peer list).
    pub fn for_release(conf: &NetConf, args: &Args) -> Result<IpamConfig, ConfigError> {
        IpamConfig::parse(conf, args, false)
    }

    fn parse(
        conf: &NetConf,
        args: &Args,
        ranges_required: bool,
    ) -> Result<IpamConfig, ConfigError> {
        let ipam = conf
            .raw
            .get("ipam")
            .filter(|v| v.is_object())
            .ok_or(ConfigError::NoIpam)?;
        let raw = RawIpam::deserialize(ipam)?;

        let mut specs: Vec<Vec<RangeSpec>> = Vec::new();
        if let Some(runtime) = conf.runtime_config.get("ipRanges").filter(|v| !v.is_null()) {
            specs.extend(Vec::<Vec<RangeSpec>>::deserialize(runtime)?);
        }
        if raw.legacy.subnet.is_some() {
            specs.push(vec![raw.legacy.clone()]);
        }
        specs.extend(raw.ranges.unwrap_or_default());
        if specs.is_empty() && ranges_required {
            return Err(ConfigError::NoRanges);
        }
        let range_sets = specs
            .iter()
            .enumerate()
            .map(|(index, set)| {
                RangeSet::from_specs(set).map_err(|source| ConfigError::Range { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (i, a) in range_sets.iter().enumerate() {
            for (j, b) in range_sets.iter().enumerate().skip(i + 1) {
                if a.check_no_overlap(b).is_err() {
                    return Err(ConfigError::SetsOverlap(i, j));
                }
            }
        }
        let v4 = range_sets.iter().filter(|s| s.is_ipv4()).count();
        if conf.version.is_legacy() && (v4 > 1 || range_sets.len() - v4 > 1) {
            return Err(ConfigError::TooManyForVersion(conf.version));
        }

        let when_exhausted = match raw.when_exhausted.as_deref() {
            None | Some("reclaim") => WhenExhausted::Reclaim,
            Some("refuse") => WhenExhausted::Refuse,
            Some(other) => return Err(ConfigError::BadWhenExhausted(other.to_string())),
        };
        let lease_hold = raw
            .lease_hold
            .as_deref()
            .map(|text| {
                parse_duration(text).ok_or_else(|| ConfigError::BadDuration(text.to_string()))
            })
            .transpose()?;
        let data_dir = raw
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        for (key, path) in [
            ("dataDir", Some(&data_dir)),
            ("metricsFile", raw.metrics_file.as_ref()),
        ] {
            if let Some(path) = path.filter(|p| p.is_relative()) {
                return Err(ConfigError::RelativePath {
                    key,
                    path: path.clone(),
                });
            }
        }

        Ok(IpamConfig {
            network: conf.name.clone(),
            range_sets,
            routes: raw.routes.unwrap_or_default(),
            data_dir,
            resolv_conf: raw.resolv_conf,
            requested: requested_ips(conf, args)?,
            sticky: raw.sticky.unwrap_or(true),
            when_exhausted,
            lease_hold,
            status_fails_when_full: raw.status_fails_when_full.unwrap_or(false),
            metrics_file: raw.metrics_file,
        })
    }

    /// `<dataDir>/<network>`.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.network)
    }
}

/// One requested address; a prefix length is ignored.
fn parse_requested(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .or_else(|_| text.parse::<IpNet>().map(|n| n.addr()))
        .ok()
}

/// host-local's words: "invalid range set N: <why>", except a subnet that does not parse,
/// which its JSON decoder reports bare.
fn range_message(index: usize, source: &RangeError) -> String {
    match source {
        RangeError::BadSubnet(_) => source.to_string(),
        _ => format!("invalid range set {index}: {source}"),
    }
}

/// Requested IPs, in host-local's order: CNI_ARGS `IP=` (comma separated), then `args.cni.ips`,
/// then `runtimeConfig.ips`. Each may carry a prefix length, which is ignored.
fn requested_ips(conf: &NetConf, args: &Args) -> Result<Vec<IpAddr>, ConfigError> {
    let mut texts: Vec<String> = Vec::new();
    if let Some(list) = args.non_empty("IP") {
        for text in list.split(',').map(str::trim) {
            if parse_requested(text).is_none() {
                return Err(ConfigError::BadArgsIp {
                    value: list.to_string(),
                    text: text.to_string(),
                });
            }
            texts.push(text.to_string());
        }
    }
    let string_list = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| x.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    texts.extend(string_list(conf.raw.pointer("/args/cni/ips")));
    texts.extend(string_list(conf.runtime_config.get("ips")));
    let mut ips: Vec<IpAddr> = Vec::new();
    for text in texts {
        let ip = parse_requested(&text).ok_or(ConfigError::BadRequestedIp(text.clone()))?;
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// `90s`, `30m`, `72h`, `7d`, or a sum such as `1h30m`.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return None,
        };
        let n: u64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
    }
    (digits.is_empty() && !text.trim().is_empty()).then_some(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(doc: &str, args: &str) -> Result<IpamConfig, ConfigError> {
        let conf = NetConf::parse(doc.as_bytes()).unwrap();
        IpamConfig::from_netconf(&conf, &Args::parse(args).unwrap())
    }

    #[test]
    fn legacy_form_and_ranges_and_runtime_ranges_in_host_local_order() {
        let c = load(
            r#"{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24"}]]},
                "ipam":{"type":"sticky-ipam","subnet":"10.1.0.0/24","ranges":[[{"subnet":"2001:db8::/64"}]]}}"#,
            "",
        )
        .unwrap();
        let firsts: Vec<String> = c
            .range_sets
            .iter()
            .map(|s| s.0[0].subnet.to_string())
            .collect();
        assert_eq!(firsts, ["10.9.0.0/24", "10.1.0.0/24", "2001:db8::/64"]);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(c.sticky);
        assert_eq!(c.when_exhausted, WhenExhausted::Reclaim);
    }

    #[test]
    fn null_lists_read_as_absent_as_in_host_local() {
        let c = load(
            r#"{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ipRanges":null},
                "ipam":{"subnet":"10.1.0.0/24","ranges":null,"routes":null}}"#,
            "",
        )
        .unwrap();
        assert_eq!(c.range_sets.len(), 1);
        assert!(c.routes.is_empty());
    }

    #[test]
    fn requested_ips_from_all_three_sources() {
        let c = load(
            r#"{"cniVersion":"1.0.0","name":"n","args":{"cni":{"ips":["10.1.0.7"]}},
                "runtimeConfig":{"ips":["10.1.0.8/24"]},"ipam":{"subnet":"10.1.0.0/24"}}"#,
            "IP=10.1.0.6",
        )
        .unwrap();
        let got: Vec<String> = c.requested.iter().map(IpAddr::to_string).collect();
        assert_eq!(got, ["10.1.0.6", "10.1.0.7", "10.1.0.8"]);
    }

    #[test]
    fn refusals() {
        let base = |ipam: &str| format!(r#"{{"cniVersion":"0.2.0","name":"n","ipam":{ipam}}}"#);
        assert!(matches!(load(&base("{}"), ""), Err(ConfigError::NoRanges)));
        let bare = NetConf::parse(base("{}").as_bytes()).unwrap();
        let release = IpamConfig::for_release(&bare, &Args::default()).unwrap();
        assert!(release.range_sets.is_empty(), "DEL needs no range");
        assert!(matches!(
            load(r#"{"cniVersion":"1.0.0","name":"n"}"#, ""),
            Err(ConfigError::NoIpam)
        ));
        assert!(matches!(
            load(
                &base(r#"{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/16"}]]}"#),
                ""
            ),
            Err(ConfigError::SetsOverlap(0, 1))
        ));
        assert!(matches!(
            load(
                &base(r#"{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/16"}]]}"#),
                ""
            ),
            Err(ConfigError::TooManyForVersion(_))
        ));
        assert!(matches!(
            load(
                &base(r#"{"subnet":"10.0.0.0/24","whenExhausted":"maybe"}"#),
                ""
            ),
            Err(ConfigError::BadWhenExhausted(_))
        ));
        assert!(matches!(
            load(&base(r#"{"subnet":"10.0.0.0/24","leaseHold":"soon"}"#), ""),
            Err(ConfigError::BadDuration(_))
        ));
        assert!(matches!(
            load(&base(r#"{"subnet":"10.0.0.0/24","dataDir":"rel"}"#), ""),
            Err(ConfigError::RelativePath { .. })
        ));
        assert!(matches!(
            load(&base(r#"{"subnet":"10.0.0.0/24"}"#), "IP=nope"),
            Err(ConfigError::BadArgsIp { .. })
        ));
        assert!(matches!(
            load(&base(r#"{"subnet":7}"#), ""),
            Err(ConfigError::Shape(_))
        ));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(604_800)));
        for bad in ["", "h", "10", "1x", "-1h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
