//! The underlay family of the network the agent keeps (pure). One network has one underlay
//! family ([`sticky_overlay::peers::merge`] refuses a mix), so every Node is mapped to an
//! address of that family: it decides which InternalIP and which of flannel's annotations
//! the agent reads, and which ones it publishes.
//!
//! The family is the one of the main network's `localIp`, else that of the config's own
//! `peers`, else IPv4; `--underlay-family` says otherwise, but never against the config: a
//! network whose `localIp` or `peers` are of the other family could never take the peers the
//! agent would write.

use std::fmt;
use std::net::IpAddr;

use sticky_overlay::peers::Peer;

/// A wrong `--underlay-family` (a usage error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("--underlay-family {0:?}: expected ipv4 or ipv6")]
    Flag(String),
    #[error(
        "--underlay-family {} contradicts the config's {key} ({ip} is an {} address): one network has one underlay family",
        flag.flag_value(),
        Family::of(*ip)
    )]
    Contradicts {
        flag: Family,
        key: &'static str,
        ip: IpAddr,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    pub fn holds(self, ip: IpAddr) -> bool {
        Family::of(ip) == self
    }

    /// How `--underlay-family` names it.
    pub fn flag_value(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// `--underlay-family`'s value.
    pub fn parse_flag(value: &str) -> Result<Family, Error> {
        match value {
            "ipv4" => Ok(Family::V4),
            "ipv6" => Ok(Family::V6),
            other => Err(Error::Flag(other.to_string())),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// The network's underlay family and what decided it (for the log), from the main network's
/// `localIp` and `peers` and the `--underlay-family` flag; `Err` (a usage error) when the
/// flag contradicts the config.
pub fn decide(
    local_ip: Option<IpAddr>,
    peers: &[Peer],
    flag: Option<Family>,
) -> Result<(Family, &'static str), Error> {
    let from_config = match (local_ip, peers.first()) {
        (Some(ip), _) => Some((ip, "localIp", "the config's localIp")),
        (None, Some(p)) => Some((p.ip, "peers", "the config's peers")),
        (None, None) => None,
    };
    match (flag, from_config) {
        (Some(flag), Some((ip, key, _))) if !flag.holds(ip) => {
            Err(Error::Contradicts { flag, key, ip })
        }
        (Some(f), _) => Ok((f, "--underlay-family")),
        (None, Some((ip, _, why))) => Ok((Family::of(ip), why)),
        (None, None) => Ok((
            Family::V4,
            "the default (no localIp, no peers in the config)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(ips: &[&str]) -> Vec<Peer> {
        ips.iter()
            .enumerate()
            .map(|(i, ip)| Peer {
                carries: Vec::new(),
                ip: ip.parse().unwrap(),
                subnets: vec![format!("10.244.{i}.0/24").parse().unwrap()],
                mac: None,
            })
            .collect()
    }

    #[test]
    fn local_ip_then_the_peers_then_ipv4_unless_the_flag_says_otherwise() {
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let six = peers(&["2001:db8::2", "2001:db8::3"]);
        let four = peers(&["192.0.2.2"]);
        assert_eq!(decide(Some(v6), &[], None).unwrap().0, Family::V6);
        assert_eq!(decide(Some(v4), &[], None).unwrap().0, Family::V4);
        assert_eq!(
            decide(None, &six, None).unwrap(),
            (Family::V6, "the config's peers")
        );
        assert_eq!(decide(None, &four, None).unwrap().0, Family::V4);
        assert_eq!(decide(None, &[], None).unwrap().0, Family::V4);
        // The flag decides what the config leaves open, and agrees with what it says.
        assert_eq!(
            decide(None, &[], Some(Family::V6)).unwrap(),
            (Family::V6, "--underlay-family")
        );
        assert_eq!(
            decide(Some(v6), &six, Some(Family::V6)).unwrap().0,
            Family::V6
        );
        assert_eq!(decide(None, &four, Some(Family::V4)).unwrap().0, Family::V4);
    }

    #[test]
    fn a_flag_against_the_config_is_refused_naming_both() {
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let e = decide(Some(v6), &[], Some(Family::V4)).unwrap_err();
        assert_eq!(
            e,
            Error::Contradicts {
                flag: Family::V4,
                key: "localIp",
                ip: v6
            }
        );
        let e = e.to_string();
        assert!(
            e.contains("--underlay-family ipv4") && e.contains("localIp (2001:db8::1"),
            "{e}"
        );
        let e = decide(None, &peers(&["192.0.2.2"]), Some(Family::V6))
            .unwrap_err()
            .to_string();
        assert!(e.contains("peers (192.0.2.2 is an IPv4 address)"), "{e}");
    }

    #[test]
    fn the_flag_takes_ipv4_or_ipv6_only() {
        assert_eq!(Family::parse_flag("ipv6"), Ok(Family::V6));
        assert_eq!(Family::parse_flag("ipv4"), Ok(Family::V4));
        for bad in ["IPv6", "6", "inet6", ""] {
            assert!(Family::parse_flag(bad).is_err(), "{bad}");
        }
    }
}
