//! One pod's interface on a segment: a veth whose host end is on the segment's bridge and
//! whose container end, created directly in the pod's namespace, carries a kept MAC, the
//! pod's addresses and routes, and is up unless the config says otherwise. The veth is made
//! as in the main mode ([`sticky_overlay::pods::Pods`]); the MAC is the segment's own.

use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use sticky_overlay::mac::pod_mac;

/// First two octets of a segment interface's MAC when it has no IPv4 address (locally
/// administered, unicast; the main mode's pod MACs start `0e:01`).
pub(crate) const L2_PREFIX: [u8; 2] = [0x0e, 0x02];

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
