//! Address ranges and range sets, with host-local's defaults and round-robin order.
//!
//! A range is one subnet with an optional `rangeStart`/`rangeEnd`/`gateway`; a range set is a
//! list of ranges of one family from which one address is handed out per ADD. Defaults follow
//! host-local: the gateway is network + 1, `rangeStart` is network + 1, `rangeEnd` is the last
//! address before the IPv4 broadcast (the last address for IPv6); /31 and /32 (/127, /128) are
//! too small.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// One range as written in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RangeSpec {
    #[serde(default)]
    pub subnet: Option<String>,
    #[serde(default)]
    pub range_start: Option<String>,
    #[serde(default)]
    pub range_end: Option<String>,
    #[serde(default)]
    pub gateway: Option<String>,
}

/// A validated range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

/// A validated range set: non-empty, one family, no overlaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    #[error("a range has no subnet")]
    NoSubnet,
    #[error("{what} {text:?} is not a valid {expected}")]
    Parse {
        what: &'static str,
        text: String,
        expected: &'static str,
    },
    // host-local's words (1.1.1), from here to `Overlap`: scripts grep for them.
    #[error("invalid CIDR address: {0}")]
    BadSubnet(String),
    #[error("Network {0} too small to allocate from")]
    TooSmall(IpNet),
    #[error(
        "Network has host bits set. For a subnet mask of length {} the network address is {}",
        .network.prefix_len(), .network.addr()
    )]
    HostBits { given: String, network: IpNet },
    #[error("{} {ip} not in network {subnet}", go_name(what))]
    Outside {
        what: &'static str,
        ip: IpAddr,
        subnet: IpNet,
    },
    #[error("rangeStart {start} is after rangeEnd {end}")]
    Reversed { start: IpAddr, end: IpAddr },
    #[error("empty range set")]
    EmptySet,
    #[error("mixed address families")]
    MixedFamilies(IpNet, IpNet),
    #[error("subnets {0} and {1} overlap")]
    Overlap(String, String),
}

/// host-local names the fields as its Go struct does: `RangeStart`, `RangeEnd`.
fn go_name(what: &str) -> String {
    match what {
        "rangeStart" => "RangeStart".into(),
        "rangeEnd" => "RangeEnd".into(),
        other => other.into(),
    }
}

fn parse_ip(what: &'static str, text: &str) -> Result<IpAddr, RangeError> {
    text.trim().parse().map_err(|_| RangeError::Parse {
        what,
        text: text.to_string(),
        expected: "IP address",
    })
}

/// An address as an integer, for arithmetic in either family.
pub(crate) fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address `n` in the family of `like`; `n` must fit the family.
pub(crate) fn from_int(n: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

impl Range {
    pub(crate) fn from_spec(spec: &RangeSpec) -> Result<Range, RangeError> {
        let text = spec.subnet.as_deref().ok_or(RangeError::NoSubnet)?;
        let subnet: IpNet = text
            .trim()
            .parse()
            .map_err(|_| RangeError::BadSubnet(text.to_string()))?;
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return Err(RangeError::TooSmall(subnet));
        }
        if subnet.addr() != subnet.network() {
            return Err(RangeError::HostBits {
                given: text.to_string(),
                network: subnet.trunc(),
            });
        }
        let network = to_int(subnet.network());
        let inside = |what: &'static str, ip: IpAddr| {
            if subnet.contains(&ip) {
                Ok(ip)
            } else {
                Err(RangeError::Outside { what, ip, subnet })
            }
        };
        let gateway = match &spec.gateway {
            Some(g) => parse_ip("gateway", g)?,
            None => from_int(network + 1, subnet.addr()),
        };
        if gateway.is_ipv4() != subnet.addr().is_ipv4() {
            return Err(RangeError::Outside {
                what: "gateway",
                ip: gateway,
                subnet,
            });
        }
        let start = match &spec.range_start {
            Some(s) => inside("rangeStart", parse_ip("rangeStart", s)?)?,
            None => from_int(network + 1, subnet.addr()),
        };
        let end = match &spec.range_end {
            Some(e) => inside("rangeEnd", parse_ip("rangeEnd", e)?)?,
            None => {
                let last = to_int(subnet.broadcast());
                from_int(
                    if subnet.addr().is_ipv4() {
                        last - 1
                    } else {
                        last
                    },
                    subnet.addr(),
                )
            }
        };
        if to_int(start) > to_int(end) {
            return Err(RangeError::Reversed { start, end });
        }
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }

    /// Whether `ip` lies between rangeStart and rangeEnd (inclusive).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.start.is_ipv4()
            && (to_int(self.start)..=to_int(self.end)).contains(&to_int(ip))
    }

    /// Addresses never handed out even inside the range: gateway, network, IPv4 broadcast.
    pub(crate) fn is_reserved(&self, ip: IpAddr) -> bool {
        ip == self.gateway
            || ip == self.subnet.network()
            || (ip.is_ipv4() && ip == self.subnet.broadcast())
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.start.is_ipv4() == other.start.is_ipv4()
            && to_int(self.start) <= to_int(other.end)
            && to_int(other.start) <= to_int(self.end)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

impl RangeSet {
    pub(crate) fn from_specs(specs: &[RangeSpec]) -> Result<RangeSet, RangeError> {
        let ranges = specs
            .iter()
            .map(Range::from_spec)
            .collect::<Result<Vec<_>, _>>()?;
        let first = ranges.first().ok_or(RangeError::EmptySet)?;
        if let Some(other) = ranges
            .iter()
            .find(|r| r.subnet.addr().is_ipv4() != first.subnet.addr().is_ipv4())
        {
            return Err(RangeError::MixedFamilies(first.subnet, other.subnet));
        }
        let set = RangeSet(ranges);
        set.check_no_overlap(&set)?;
        Ok(set)
    }

    pub fn is_ipv4(&self) -> bool {
        self.0.first().is_some_and(|r| r.start.is_ipv4())
    }

    /// The range holding `ip`, if any.
    pub(crate) fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.0.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    /// Whether `ip` may be handed out: inside a range and not reserved there.
    pub(crate) fn is_assignable(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some_and(|r| !r.is_reserved(ip))
    }

    /// Fails if any range of `self` overlaps a range of `other` (the same set: distinct pairs).
    pub(crate) fn check_no_overlap(&self, other: &RangeSet) -> Result<(), RangeError> {
        let same = std::ptr::eq(self, other);
        for (i, a) in self.0.iter().enumerate() {
            for (j, b) in other.0.iter().enumerate() {
                if (!same || i < j) && a.overlaps(b) {
                    return Err(RangeError::Overlap(a.to_string(), b.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Every assignable address once, in host-local's round-robin order: from the one after
    /// `last` when `last` is in the set, else from the first range's start; wrapping around.
    pub(crate) fn round_robin(
        &self,
        last: Option<IpAddr>,
    ) -> impl Iterator<Item = (IpAddr, &Range)> {
        let ranges = &self.0;
        let (first_range, first_offset) = last
            .and_then(|ip| {
                ranges
                    .iter()
                    .position(|r| r.contains(ip))
                    .map(|i| (i, to_int(ip) - to_int(ranges[i].start) + 1))
            })
            .unwrap_or((0, 0));
        // Visit the starting range from the offset, then the others, then the start of the
        // starting range up to the offset.
        let order = (0..=ranges.len()).map(move |k| (first_range + k) % ranges.len().max(1));
        order.enumerate().flat_map(move |(k, i)| {
            let r = &ranges[i];
            let size = to_int(r.end) - to_int(r.start) + 1;
            let (from, to) = if k == 0 {
                (first_offset.min(size), size)
            } else if k == ranges.len() {
                (0, first_offset.min(size))
            } else {
                (0, size)
            };
            (from..to)
                .map(move |off| (from_int(to_int(r.start) + off, r.start), r))
                .filter(|(ip, r)| !r.is_reserved(*ip))
        })
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(Range::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(subnet: &str) -> RangeSpec {
        RangeSpec {
            subnet: Some(subnet.into()),
            ..RangeSpec::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_local_defaults() {
        let r = Range::from_spec(&spec("10.1.2.0/24")).unwrap();
        assert_eq!(
            (r.start, r.end, r.gateway),
            (ip("10.1.2.1"), ip("10.1.2.254"), ip("10.1.2.1"))
        );
        let r = Range::from_spec(&spec("2001:db8::/126")).unwrap();
        assert_eq!((r.start, r.end), (ip("2001:db8::1"), ip("2001:db8::3")));
    }

    #[test]
    fn refusals() {
        assert_eq!(
            Range::from_spec(&spec("10.0.0.0/31")),
            Err(RangeError::TooSmall("10.0.0.0/31".parse().unwrap()))
        );
        assert!(matches!(
            Range::from_spec(&spec("10.0.0.1/24")),
            Err(RangeError::HostBits { .. })
        ));
        assert!(matches!(
            Range::from_spec(&spec("nonsense")),
            Err(RangeError::BadSubnet(_))
        ));
        let outside = RangeSpec {
            range_start: Some("10.0.1.5".into()),
            ..spec("10.0.0.0/24")
        };
        assert!(matches!(
            Range::from_spec(&outside),
            Err(RangeError::Outside { .. })
        ));
        let reversed = RangeSpec {
            range_start: Some("10.0.0.9".into()),
            range_end: Some("10.0.0.5".into()),
            ..spec("10.0.0.0/24")
        };
        assert!(matches!(
            Range::from_spec(&reversed),
            Err(RangeError::Reversed { .. })
        ));
        assert!(matches!(
            RangeSet::from_specs(&[spec("10.0.0.0/24"), spec("10.0.0.0/25")]),
            Err(RangeError::Overlap(..))
        ));
        assert!(matches!(
            RangeSet::from_specs(&[spec("10.0.0.0/24"), spec("2001:db8::/64")]),
            Err(RangeError::MixedFamilies(..))
        ));
    }

    #[test]
    fn round_robin_skips_gateway_and_wraps_across_ranges() {
        let set = RangeSet::from_specs(&[spec("10.0.0.0/29"), spec("10.0.1.0/30")]).unwrap();
        let all: Vec<String> = set
            .round_robin(None)
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(
            all,
            [
                "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.1.2"
            ]
        );
        let from: Vec<String> = set
            .round_robin(Some(ip("10.0.0.5")))
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(
            from,
            [
                "10.0.0.6", "10.0.1.2", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"
            ]
        );
        let unknown: Vec<_> = set.round_robin(Some(ip("192.0.2.1"))).collect();
        assert_eq!(unknown.len(), 6);
    }

    #[test]
    fn explicit_range_start_at_network_still_skips_network_and_broadcast() {
        let s = RangeSpec {
            range_start: Some("10.0.0.0".into()),
            ..spec("10.0.0.0/29")
        };
        let set = RangeSet::from_specs(&[s]).unwrap();
        let all: Vec<String> = set
            .round_robin(None)
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(
            all,
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        );
    }
}
