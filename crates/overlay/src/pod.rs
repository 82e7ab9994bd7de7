//! One pod's attachment: a veth pair whose host end is on the bridge and whose container end,
//! created directly in the pod's namespace, carries a MAC derived from the pod's IPv4. Here:
//! the names and aliases, the routes, the result's interfaces and CHECK; making and removing
//! the pair goes through [`super::pods::Pods`].

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::Error;
use super::mac::pod_mac_of;
use cni_protocol::{Attachment, Call, CniResult, IpConfig, Route};
use sticky_netlink::link::{self, Link};
use sticky_netlink::route::{self as nlroute};
use sticky_netlink::{Socket, addr, netns};

/// The host end's name: `sv` + 12 hex digits of SHA-256(container id, ifname). DEL finds it
/// without entering the pod's namespace (which may be gone).
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let mut h = Sha256::new();
    h.update(container_id.as_bytes());
    h.update([0]);
    h.update(ifname.as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("sv{hex}")
}

/// The routes a pod gets: the IPAM plugin's, plus default routes when `isDefaultGateway`.
pub fn pod_routes(ips: &[IpConfig], ipam_routes: &[Route], default_gateway: bool) -> Vec<Route> {
    let mut routes = ipam_routes.to_vec();
    if default_gateway {
        for v4 in [true, false] {
            let dst: IpNet = if v4 {
                IpNet::V4(Default::default())
            } else {
                IpNet::V6(Default::default())
            };
            if routes.iter().any(|r| r.dst == dst) {
                continue;
            }
            if let Some(ip) = ips.iter().find(|ip| ip.address.addr().is_ipv4() == v4) {
                let gw = ip.gateway.or_else(|| gateway_of(&ip.address.trunc()));
                routes.push(Route::new(dst, gw));
            }
        }
    }
    routes
}

/// The container end's MAC in the main mode: derived from the first IPv4 address, else the
/// first IPv6 address ([`pod_mac_of`]); without any the kernel's stays.
pub fn container_mac(ips: &[IpConfig]) -> Option<[u8; 6]> {
    pod_mac_of(ips.iter().map(|ip| ip.address.addr()))
}

/// The routes as the container end gets them: a route without `gw` takes the gateway of
/// the first address of its family ([`route_gateway`]).
pub fn with_gateways(routes: &[Route], ips: &[IpConfig]) -> Vec<Route> {
    routes
        .iter()
        .map(|r| Route {
            gw: route_gateway(r, ips),
            ..r.clone()
        })
        .collect()
}

/// The gateway a route without `gw` uses: the first address's gateway of its family.
fn route_gateway(route: &Route, ips: &[IpConfig]) -> Option<IpAddr> {
    route.gw.or_else(|| {
        ips.iter()
            .find(|ip| ip.address.addr().is_ipv4() == route.dst.addr().is_ipv4())
            .and_then(|ip| ip.gateway.or_else(|| gateway_of(&ip.address.trunc())))
    })
}

/// The host end's alias: `sticky-vxlan <network> <container id> <ifname>`. GC finds this
/// network's attachments by it (never another network's, even on a shared bridge).
pub fn host_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("sticky-vxlan {network} {container_id} {ifname}")
}

/// The host ends of `network`'s pods among `links`, found by their alias ([`host_alias`]):
/// what a bridge made again takes back (deleting a bridge releases its ports, and the pods
/// behind them are still there). Both modes find them this way.
pub fn host_ends<'a>(network: &'a str, links: &'a [Link]) -> impl Iterator<Item = &'a Link> {
    links.iter().filter(move |l| {
        l.alias
            .as_deref()
            .and_then(parse_alias)
            .is_some_and(|(net, _, _)| net == network)
    })
}

/// The interfaces of an ADD result, in the order both modes report them: the bridge, the
/// host end, the container end (index 2, which the result's `ips` point at).
pub fn result_interfaces(
    bridge: &Link,
    host: &Link,
    container: &Link,
    (ifname, netns): (&str, &str),
    mtu: u32,
) -> Vec<cni_protocol::Interface> {
    let mac = |l: &Link| l.mac.as_ref().map(link::format_mac);
    let iface =
        |l: &Link, name: &str, sandbox: Option<&str>, mtu: Option<u32>| cni_protocol::Interface {
            name: name.to_string(),
            mac: mac(l),
            sandbox: sandbox.map(str::to_string),
            mtu,
        };
    vec![
        iface(bridge, &bridge.name, None, None),
        iface(host, &host.name, None, Some(mtu)),
        iface(container, ifname, Some(netns), Some(mtu)),
    ]
}

/// Reads an alias written by [`host_alias`]: (network, container id, ifname).
pub fn parse_alias(alias: &str) -> Option<(&str, &str, &str)> {
    let mut parts = alias.strip_prefix("sticky-vxlan ")?.split(' ');
    let found = (parts.next()?, parts.next()?, parts.next()?);
    parts.next().is_none().then_some(found)
}

/// What CHECK found different from `prevResult`.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("prevResult is missing")]
    NoPrevResult,
    #[error("interface {ifname} is missing in {}", netns.display())]
    NoInterface { ifname: String, netns: PathBuf },
    #[error(
        "{ifname} has MAC {}, expected {}",
        link::format_mac(have),
        link::format_mac(want)
    )]
    Mac {
        ifname: String,
        have: [u8; 6],
        want: [u8; 6],
    },
    #[error("{ifname} lacks address {address}")]
    Address { ifname: String, address: IpNet },
    #[error("route to {dst} via {ifname} is missing")]
    Route { ifname: String, dst: IpNet },
    #[error("host interface {host} is missing")]
    NoHostEnd { host: String },
    #[error("{host} is not on bridge {bridge}")]
    NotOnBridge { host: String, bridge: String },
}

/// CHECK of one attachment: the container side ([`check_container`]) against the call's
/// `prevResult`, then the host end on `bridge`. Both modes (main and segment) use it.
pub fn check_attachment(call: &Call, bridge: &str) -> Result<(), Error> {
    let prev = call
        .conf
        .prev_result
        .as_ref()
        .ok_or(Mismatch::NoPrevResult)?;
    let container = prev
        .interfaces
        .iter()
        .find(|i| i.name == call.env.ifname && i.sandbox.is_some());
    check_container(
        Path::new(&call.env.netns),
        &call.env.ifname,
        container.and_then(|i| i.mac.as_deref()),
        prev,
    )?;
    let mut sock = Socket::open()?;
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let Some(host_link) = link::get(&mut sock, &host)? else {
        return Err(Mismatch::NoHostEnd { host }.into());
    };
    let bridge = link::require(&mut sock, bridge)?;
    if host_link.master != Some(bridge.index) {
        return Err(Mismatch::NotOnBridge {
            host,
            bridge: bridge.name,
        }
        .into());
    }
    Ok(())
}

/// CHECK inside the pod's namespace: the interface, its MAC, addresses and routes.
pub(crate) fn check_container(
    netns_path: &Path,
    ifname: &str,
    mac: Option<&str>,
    prev: &CniResult,
) -> Result<(), Error> {
    let differs = |m: Mismatch| Err(Error::Check(m));
    netns::run_in(netns_path, || -> Result<(), Error> {
        let mut sock = Socket::open()?;
        let Some(link) = link::get(&mut sock, ifname)? else {
            return differs(Mismatch::NoInterface {
                ifname: ifname.to_string(),
                netns: netns_path.to_path_buf(),
            });
        };
        if let (Some(want), Some(have)) = (mac.and_then(link::parse_mac), link.mac)
            && want != have
        {
            return differs(Mismatch::Mac {
                ifname: ifname.to_string(),
                have,
                want,
            });
        }
        let have = addr::list(&mut sock, link.index)?;
        if let Some(ip) = prev.ips.iter().find(|ip| !have.contains(&ip.address)) {
            return differs(Mismatch::Address {
                ifname: ifname.to_string(),
                address: ip.address,
            });
        }
        let routes = nlroute::list(&mut sock)?;
        for r in &prev.routes {
            let dst = r.dst.trunc();
            if !routes
                .iter()
                .any(|have| have.dst == dst && have.oif == Some(link.index))
            {
                return differs(Mismatch::Route {
                    ifname: ifname.to_string(),
                    dst: r.dst,
                });
            }
        }
        Ok(())
    })?
}

/// Removes the veths of `network` (by their alias) whose attachment is not in `valid`; the
/// GC of both modes.
pub fn remove_stale_veths(network: &str, valid: &[Attachment]) -> Result<(), Error> {
    let mut sock = Socket::open()?;
    let mut first = Ok(());
    for l in link::list(&mut sock)? {
        let Some((net, cid, ifname)) = l.alias.as_deref().and_then(parse_alias) else {
            continue;
        };
        let listed = valid
            .iter()
            .any(|a| a.container_id == cid && a.ifname == ifname);
        if net == network
            && !listed
            && let Err(e) = link::delete(&mut sock, &l.name)
        {
            eprintln!("sticky-vxlan: GC: removing {}: {e}", l.name);
            first = first.and(Err(e.into()));
        }
    }
    first
}

/// The gateway of a pod subnet: its first address (what host-local hands out by default).
pub fn gateway_of(subnet: &IpNet) -> Option<IpAddr> {
    subnet
        .hosts()
        .next()
        .filter(|h| *h != subnet.network())
        .or_else(|| match subnet {
            // IPv6 `hosts()` starts at the network address itself.
            IpNet::V6(n) => n.hosts().nth(1).map(IpAddr::V6),
            IpNet::V4(_) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways() {
        assert_eq!(
            gateway_of(&"10.244.1.0/24".parse().unwrap()),
            Some("10.244.1.1".parse().unwrap())
        );
        assert_eq!(
            gateway_of(&"fd00:1::/64".parse().unwrap()),
            Some("fd00:1::1".parse().unwrap())
        );
    }

    #[test]
    fn a_pod_without_ipv4_keeps_a_mac_made_from_its_ipv6_address() {
        let ip = |a: &str| IpConfig {
            address: a.parse().unwrap(),
            gateway: None,
            interface: Some(2),
        };
        assert_eq!(
            container_mac(&[ip("fd00:1::7/64"), ip("10.244.1.7/24")]),
            Some([0x0e, 0x01, 10, 244, 1, 7])
        );
        assert_eq!(
            container_mac(&[ip("fd00:1::7/64")]),
            Some([0x0e, 0x03, 0, 0, 0, 7])
        );
        assert_eq!(container_mac(&[]), None);
    }

    #[test]
    fn alias_round_trips() {
        let a = host_alias("edge", "abc-1", "eth0");
        assert_eq!(parse_alias(&a), Some(("edge", "abc-1", "eth0")));
        assert_eq!(parse_alias("something else"), None);
        assert_eq!(parse_alias("sticky-vxlan a b c d"), None);
    }

    #[test]
    fn host_name_is_short_stable_and_distinct() {
        let a = host_veth_name("abc", "eth0");
        assert_eq!(a.len(), 14);
        assert_eq!(a, host_veth_name("abc", "eth0"));
        assert_ne!(a, host_veth_name("abc", "eth1"));
        assert_ne!(host_veth_name("ab", "ceth0"), host_veth_name("abc", "eth0"));
    }

    #[test]
    fn default_gateway_routes_are_added_per_family() {
        let ips = vec![
            IpConfig {
                address: "10.244.1.5/24".parse().unwrap(),
                gateway: Some("10.244.1.1".parse().unwrap()),
                interface: Some(2),
            },
            IpConfig {
                address: "fd00:1::5/64".parse().unwrap(),
                gateway: None,
                interface: Some(2),
            },
        ];
        let routes = pod_routes(&ips, &[], true);
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0].gw, Some("10.244.1.1".parse().unwrap()));
        assert_eq!(routes[1].gw, Some("fd00:1::1".parse().unwrap()));
        assert!(pod_routes(&ips, &[], false).is_empty());
        let r = Route::new("10.0.0.0/8".parse().unwrap(), None);
        assert_eq!(route_gateway(&r, &ips), Some("10.244.1.1".parse().unwrap()));
    }
}
