//! One pod's interface on a segment: a veth whose host end is on the segment's bridge and
//! whose container end, created directly in the pod's namespace, carries a kept MAC, the
//! pod's addresses and routes, and is up unless the config says otherwise.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::Error;
use crate::cni::Route;
use crate::netlink::link::{self, Link};
use crate::netlink::route as nlroute;
use crate::netlink::{Socket, addr, netns, sysctl};
use crate::vxlan::mac::pod_mac;

/// `ip route add`'s protocol (`proto boot`) for the pod's own routes.
const RTPROT_BOOT: u8 = 3;

/// First two octets of a segment interface's MAC when it has no IPv4 address (locally
/// administered, unicast; the main mode's pod MACs start `0e:01`).
pub const L2_PREFIX: [u8; 2] = [0x0e, 0x02];

/// The MAC of a segment interface: derived from its first IPv4 address as in the main mode
/// (so a pod recreated on its address keeps its MAC), else stable per (pod, segment): the
/// prefix and four bytes of SHA-256 of the network, VNI, pod (or container) and interface.
pub fn kept_mac(ips: &[IpNet], network: &str, vni: u32, pod: &str, ifname: &str) -> [u8; 6] {
    if let Some(a) = ips.iter().find_map(|ip| match ip.addr() {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }) {
        return pod_mac(a);
    }
    let mut h = Sha256::new();
    for part in [
        network.as_bytes(),
        &vni.to_be_bytes(),
        pod.as_bytes(),
        ifname.as_bytes(),
    ] {
        h.update(part);
        h.update([0]);
    }
    let d = h.finalize();
    [L2_PREFIX[0], L2_PREFIX[1], d[0], d[1], d[2], d[3]]
}

/// What the pod's interface gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub ips: Vec<IpNet>,
    pub routes: Vec<Route>,
    pub mac: [u8; 6],
    pub up: bool,
    pub mtu: u32,
}

/// Creates the veth pair (host end `host`, marked with `alias`, on `bridge`, up) with the
/// container end `ifname` in `netns_path`. Returns the host end.
pub fn create_veth(
    sock: &mut Socket,
    netns_path: &Path,
    (host, alias): (&str, &str),
    ifname: &str,
    iface: &Iface,
    bridge: &Link,
) -> Result<Link, Error> {
    let ns = netns::open(netns_path)?;
    link::add_veth(
        sock,
        &link::VethSpec {
            host,
            peer: ifname,
            peer_netns: ns.as_fd(),
            peer_mac: Some(iface.mac),
            mtu: iface.mtu,
            master: None,
        },
    )?;
    let host_link = link::require(sock, host)?;
    link::set_alias(sock, &host_link, alias)?;
    link::set_master(sock, &host_link, bridge.index)?;
    super::datapath::keep_node_off(host)?;
    link::set_up(sock, &host_link)?;
    Ok(link::require(sock, host)?)
}

/// Inside the pod's namespace: addresses, link up (unless `up` is off), routes. Returns the
/// container interface.
pub fn configure_container(netns_path: &Path, ifname: &str, iface: &Iface) -> Result<Link, Error> {
    netns::run_in(netns_path, || -> Result<Link, Error> {
        let mut sock = Socket::open()?;
        let l = link::require(&mut sock, ifname)?;
        if iface.ips.iter().any(|ip| ip.addr().is_ipv4()) {
            // Announce the (kept) MAC when the link comes up, so neighbours update at once.
            sysctl::write(&format!("net/ipv4/conf/{ifname}/arp_notify"), "1")?;
        }
        for ip in &iface.ips {
            addr::add(&mut sock, l.index, *ip)?;
        }
        if !iface.up {
            return Ok(l);
        }
        link::set_up(&mut sock, &l)?;
        for r in &iface.routes {
            nlroute::replace(
                &mut sock,
                &nlroute::Route {
                    dst: r.dst.trunc(),
                    gateway: r.gw,
                    oif: Some(l.index),
                    onlink: false,
                    protocol: RTPROT_BOOT,
                },
            )?;
        }
        Ok(link::require(&mut sock, ifname)?)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_follows_the_ipv4_address_else_the_pod() {
        let v4: Vec<IpNet> = vec![
            "fd00::5/64".parse().unwrap(),
            "192.168.11.2/29".parse().unwrap(),
        ];
        assert_eq!(
            kept_mac(&v4, "n", 1, "default/a", "vxeth1"),
            [0x0e, 1, 192, 168, 11, 2]
        );
        let l2 = kept_mac(&[], "n", 101, "default/a", "vxeth1");
        assert_eq!(l2[..2], L2_PREFIX);
        assert_eq!(l2, kept_mac(&[], "n", 101, "default/a", "vxeth1"), "stable");
        for other in [
            kept_mac(&[], "n", 102, "default/a", "vxeth1"),
            kept_mac(&[], "n", 101, "default/b", "vxeth1"),
            kept_mac(&[], "n", 101, "default/a", "vxeth2"),
            kept_mac(&[], "m", 101, "default/a", "vxeth1"),
        ] {
            assert_ne!(l2, other);
        }
        assert_eq!(l2[0] & 1, 0, "unicast");
    }
}
