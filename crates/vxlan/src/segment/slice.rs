//! The per-node slice of a segment's address ranges, so that sticky-ipam (or host-local) on
//! every node hands out addresses from the same subnet without two nodes ever handing out the
//! same one, with no coordination.
//!
//! With `"nodeSlice": P`, every IPv4 range subnet `S/p` of the IPAM section is cut into
//! `2^(P-p)` aligned blocks of size `/P`, and the node whose underlay address is `u` takes
//! block `u mod 2^(P-p)` (its *slot*), intersected with the range's own `rangeStart`/`rangeEnd`.
//! The slot depends only on the node's own address, so adding or removing a node never moves
//! another node's slice (no address in use changes hands); two nodes of the segment with the
//! same slot are refused, on both, with an error naming them.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("nodeSlice /{slice} is larger than the range subnet {subnet}: a slice must fit in it")]
    TooLarge { slice: u8, subnet: Ipv4Net },
    #[error(
        "nodes {a} and {b} both take slice {slot} of {subnet} (/{slice}: underlay address mod {count}); choose a longer nodeSlice or nodes whose addresses differ there"
    )]
    Collision {
        a: IpAddr,
        b: IpAddr,
        slot: u32,
        subnet: Ipv4Net,
        slice: u8,
        count: u32,
    },
    #[error("the ipam range {0} is not IPv4: nodeSlice cuts IPv4 ranges only")]
    NotV4(String),
    #[error("the ipam section has no range to cut (give \"subnet\" or \"ranges\")")]
    NoRange,
    #[error("range {range}: {reason}")]
    BadRange { range: String, reason: String },
    #[error("this node's slice {slice} of {subnet} lies outside its range {start}-{end}")]
    Empty {
        slice: Ipv4Net,
        subnet: Ipv4Net,
        start: Ipv4Addr,
        end: Ipv4Addr,
    },
}

/// The slot a node takes in `subnet` cut into `/slice` blocks.
pub fn slot(node: IpAddr, subnet: Ipv4Net, slice: u8) -> Result<(u32, u32), Error> {
    if slice < subnet.prefix_len() {
        return Err(Error::TooLarge { slice, subnet });
    }
    let count = 1u64 << (slice - subnet.prefix_len());
    // The address as a number: an IPv4 one as 32 bits, an IPv6 one as 128.
    let number = match node {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let slot = (number % u128::from(count)) as u32;
    Ok((slot, count.min(u64::from(u32::MAX)) as u32))
}

/// The `/slice` block of `subnet` node `local` takes, after checking no other node of `nodes`
/// takes the same one.
pub fn block(
    local: IpAddr,
    nodes: &[IpAddr],
    subnet: Ipv4Net,
    slice: u8,
) -> Result<Ipv4Net, Error> {
    let (mine, count) = slot(local, subnet, slice)?;
    for other in nodes.iter().filter(|n| **n != local) {
        if slot(*other, subnet, slice)?.0 == mine {
            return Err(Error::Collision {
                a: local,
                b: *other,
                slot: mine,
                subnet,
                slice,
                count,
            });
        }
    }
    let size = 1u64 << (32 - slice);
    let start = u64::from(u32::from(subnet.network())) + u64::from(mine) * size;
    Ipv4Net::new(Ipv4Addr::from(start as u32), slice).map_err(|_| Error::TooLarge { slice, subnet })
}

fn v4(range: &Value, key: &str) -> Result<Option<Ipv4Addr>, Error> {
    match range.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_str().and_then(|s| s.parse::<IpAddr>().ok()) {
            Some(IpAddr::V4(a)) => Ok(Some(a)),
            _ => Err(Error::BadRange {
                range: range.to_string(),
                reason: format!("{key} {v} is not an IPv4 address"),
            }),
        },
    }
}

/// One range cut to this node's slice.
fn cut(range: &Value, local: IpAddr, nodes: &[IpAddr], slice: u8) -> Result<Value, Error> {
    let text = range
        .get("subnet")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let subnet = match text.parse::<IpNet>() {
        Ok(IpNet::V4(n)) => n.trunc(),
        Ok(IpNet::V6(_)) => return Err(Error::NotV4(text.to_string())),
        Err(_) => {
            return Err(Error::BadRange {
                range: range.to_string(),
                reason: "\"subnet\" is not a CIDR".into(),
            });
        }
    };
    let b = block(local, nodes, subnet, slice)?;
    let first = |n: Ipv4Net| {
        if n.prefix_len() >= 31 {
            n.network()
        } else {
            n.hosts().next().unwrap_or(n.network())
        }
    };
    let last = |n: Ipv4Net| {
        if n.prefix_len() >= 31 {
            n.broadcast()
        } else {
            n.hosts().last().unwrap_or(n.broadcast())
        }
    };
    let start = v4(range, "rangeStart")?
        .unwrap_or(first(subnet))
        .max(first(b));
    let end = v4(range, "rangeEnd")?.unwrap_or(last(subnet)).min(last(b));
    if start > end {
        return Err(Error::Empty {
            slice: b,
            subnet,
            start,
            end,
        });
    }
    let mut out = range.clone();
    out["rangeStart"] = json!(start.to_string());
    out["rangeEnd"] = json!(end.to_string());
    Ok(out)
}

/// The `ranges` of an `ipam` section cut to this node's slice (the flat `subnet` form becomes
/// one range set), after checking no other node of `nodes` takes the same slice.
pub(crate) fn cut_ranges(
    ipam: &Value,
    local: IpAddr,
    nodes: &[IpAddr],
    slice: u8,
) -> Result<Value, Error> {
    let sets = range_sets(ipam);
    if sets.is_empty() {
        return Err(Error::NoRange);
    }
    let mut out = Vec::new();
    for set in &sets {
        let ranges = set.as_array().ok_or_else(|| Error::BadRange {
            range: set.to_string(),
            reason: "a range set must be a list of ranges".into(),
        })?;
        let cut_set: Result<Vec<Value>, Error> =
            ranges.iter().map(|r| cut(r, local, nodes, slice)).collect();
        out.push(Value::Array(cut_set?));
    }
    Ok(Value::Array(out))
}

/// The range sets of an `ipam` section as host-local reads them: the flat range (`subnet`
/// directly under `ipam`) first, then `ranges`.
fn range_sets(ipam: &Value) -> Vec<Value> {
    let mut sets = Vec::new();
    if let Some(obj) = ipam.as_object().filter(|o| o.contains_key("subnet")) {
        let range: serde_json::Map<String, Value> = FLAT
            .iter()
            .filter_map(|key| Some((key.to_string(), obj.get(*key)?.clone())))
            .collect();
        sets.push(json!([Value::Object(range)]));
    }
    if let Some(more) = ipam.get("ranges").and_then(Value::as_array) {
        sets.extend(more.iter().cloned());
    }
    sets
}

/// One range of an `ipam` section, whole (not cut to a node's slice), with host-local's
/// defaults: what IPAM may hand out from it on some node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pool {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Pool {
    /// host-local's reading of one range; `None` for one it refuses (it says why itself).
    fn read(range: &Value) -> Option<Pool> {
        let subnet: IpNet = range.get("subnet")?.as_str()?.trim().parse().ok()?;
        let subnet = subnet.trunc();
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return None;
        }
        let address = |key: &str| -> Option<Option<IpAddr>> {
            match range.get(key) {
                None | Some(Value::Null) => Some(None),
                Some(v) => {
                    let ip: IpAddr = v.as_str()?.trim().parse().ok()?;
                    (ip.is_ipv4() == subnet.addr().is_ipv4()).then_some(Some(ip))
                }
            }
        };
        let first = step(subnet.network(), 1);
        let last = match subnet {
            IpNet::V4(n) => step(IpAddr::V4(n.broadcast()), -1),
            IpNet::V6(n) => IpAddr::V6(n.broadcast()),
        };
        Some(Pool {
            subnet,
            start: address("rangeStart")?.unwrap_or(first),
            end: address("rangeEnd")?.unwrap_or(last),
            gateway: address("gateway")?.unwrap_or(first),
        })
    }

    /// Whether IPAM may hand `ip` out: from `start` to `end`, and not the gateway, the
    /// network or the IPv4 broadcast address, which it never hands out.
    pub(crate) fn hands_out(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.start.is_ipv4()
            && (self.start..=self.end).contains(&ip)
            && ip != self.gateway
            && ip != self.subnet.network()
            && !(ip.is_ipv4() && ip == self.subnet.broadcast())
    }
}

impl std::fmt::Display for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{} of {}", self.start, self.end, self.subnet)
    }
}

/// `ip` moved by `by` (within its family, saturating).
fn step(ip: IpAddr, by: i8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(
            u32::from(a).saturating_add_signed(i32::from(by)),
        )),
        IpAddr::V6(a) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(a).saturating_add_signed(i128::from(by)),
        )),
    }
}

/// Every range of an `ipam` section in host-local's schema (`sticky-ipam`, `host-local`),
/// whole: the flat range and every range set. A range host-local would refuse is left out
/// (the IPAM plugin says why); an `ipam` of another schema has none.
pub(crate) fn pools(ipam: &Value) -> Vec<Pool> {
    range_sets(ipam)
        .iter()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(Pool::read)
        .collect()
}

/// The flat form of one range in an `ipam` section.
const FLAT: [&str; 4] = ["subnet", "rangeStart", "rangeEnd", "gateway"];

/// The network config `conf` with its `ipam` ranges replaced by `ranges` ([`cut_ranges`]).
pub(crate) fn with_ranges(conf: &Value, ranges: &Value) -> Value {
    let mut conf = conf.clone();
    if let Some(ipam) = conf.get_mut("ipam").and_then(Value::as_object_mut) {
        for key in FLAT {
            ipam.remove(key);
        }
        ipam.insert("ranges".into(), ranges.clone());
    }
    conf
}

/// The config with its `ipam` ranges cut to this node's slice.
pub fn apply(conf: &Value, local: IpAddr, nodes: &[IpAddr], slice: u8) -> Result<Value, Error> {
    let ranges = cut_ranges(&conf["ipam"], local, nodes, slice)?;
    Ok(with_ranges(conf, &ranges))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    /// A node's underlay address.
    fn node(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn slot_follows_the_node_address_only() {
        let subnet: Ipv4Net = "192.168.11.0/24".parse().unwrap();
        let nodes = [node("192.0.2.1"), node("192.0.2.2"), node("192.0.2.3")];
        let b = block(nodes[0], &nodes, subnet, 27).unwrap();
        assert_eq!(b.to_string(), "192.168.11.32/27");
        // A node added (or removed) elsewhere never moves this node's slice.
        let more = [nodes[0], nodes[1], nodes[2], node("192.0.2.6")];
        assert_eq!(block(nodes[0], &more, subnet, 27).unwrap(), b);
        assert_eq!(block(nodes[0], &nodes[..1], subnet, 27).unwrap(), b);
        // 192.0.2.9 = 1 mod 8: the same slot as 192.0.2.1.
        let clash = [nodes[0], node("192.0.2.9")];
        assert!(matches!(
            block(nodes[0], &clash, subnet, 27),
            Err(Error::Collision { slot: 1, .. })
        ));
        assert!(matches!(
            block(nodes[0], &nodes, subnet, 23),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn on_an_ipv6_underlay_the_slot_follows_the_whole_address() {
        let subnet: Ipv4Net = "192.168.11.0/24".parse().unwrap();
        // 2001:db8::9 = 1 mod 8 (the low bits), as 2001:db8::1 and 2001:db8:1::1.
        assert_eq!(slot(node("2001:db8::1"), subnet, 27).unwrap(), (1, 8));
        assert_eq!(slot(node("2001:db8::a"), subnet, 27).unwrap(), (2, 8));
        let clash = [node("2001:db8::1"), node("2001:db8:1::1")];
        assert!(matches!(
            block(clash[0], &clash, subnet, 27),
            Err(Error::Collision { slot: 1, .. })
        ));
    }

    #[test]
    fn slices_of_all_nodes_are_disjoint_and_inside_the_range() {
        let conf = json!({"ipam": {"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                                   "rangeStart": "192.168.11.40"}});
        let nodes: Vec<IpAddr> = (1..=6).map(|n| node(&format!("192.0.2.{n}"))).collect();
        let mut seen = Vec::new();
        for n in &nodes[1..] {
            let out = apply(&conf, *n, &nodes, 27).unwrap();
            let r = &out["ipam"]["ranges"][0][0];
            assert_eq!(r["subnet"], "192.168.11.0/24", "pods keep the whole subnet");
            let s: Ipv4Addr = r["rangeStart"].as_str().unwrap().parse().unwrap();
            let e: Ipv4Addr = r["rangeEnd"].as_str().unwrap().parse().unwrap();
            assert!(s >= ip("192.168.11.40") && s <= e);
            for (a, b) in &seen {
                assert!(e < *a || s > *b, "{s}-{e} overlaps {a}-{b}");
            }
            seen.push((s, e));
            assert!(out["ipam"].get("subnet").is_none());
        }
        // Node 1's slice (.32/27) ends below rangeStart .40? No: .33-.62 ∩ .40- = .40-.62.
        let one = apply(&conf, nodes[0], &nodes, 27).unwrap();
        assert_eq!(one["ipam"]["ranges"][0][0]["rangeStart"], "192.168.11.40");
        let low = json!({"ipam": {"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                                  "rangeEnd": "192.168.11.20"}});
        assert!(matches!(
            apply(&low, nodes[0], &nodes, 27),
            Err(Error::Empty { .. })
        ));
        let v6 = json!({"ipam": {"type": "sticky-ipam", "ranges": [[{"subnet": "fd00::/64"}]]}});
        assert!(matches!(
            apply(&v6, nodes[0], &nodes, 27),
            Err(Error::NotV4(_))
        ));
        let none = json!({"ipam": {"type": "sticky-ipam"}});
        assert_eq!(apply(&none, nodes[0], &nodes, 27), Err(Error::NoRange));
        // Both forms, as host-local reads them: the flat range and every range set, each cut
        // (none left whole for IPAM to hand out beyond the slice).
        let both = json!({"ipam": {"type": "sticky-ipam", "subnet": "192.168.11.0/24",
                                   "ranges": [[{"subnet": "192.168.12.0/24"}]]}});
        let out = apply(&both, nodes[0], &nodes, 27).unwrap();
        let sets = out["ipam"]["ranges"].as_array().unwrap();
        assert_eq!(sets.len(), 2);
        for (set, net) in sets.iter().zip(["192.168.11", "192.168.12"]) {
            assert_eq!(set[0]["rangeStart"], format!("{net}.33"));
            assert_eq!(set[0]["rangeEnd"], format!("{net}.62"));
        }
        assert!(out["ipam"].get("subnet").is_none());
    }
}
