//! The kept MACs: pure functions of an address (and the VNI), so they survive any restart and
//! every node can compute every peer's VTEP MAC offline.
//!
//! Scheme version 1 (the only one so far; a later scheme will use other first octets):
//!
//! | device | MAC |
//! |---|---|
//! | VTEP on an IPv4 underlay (`a.b.c.d`, VNI `v`) | `0a:<v mod 256>:a:b:c:d` |
//! | VTEP on an IPv6 underlay (`u`, VNI `v`) | `06:` + the first 5 bytes of SHA-256(`"sticky-vxlan vtep\0"`, the 16 bytes of `u`, `v` as 4 big-endian bytes) |
//! | pod interface (first IPv4 `a.b.c.d`) | `0e:01:a:b:c:d` |
//! | pod interface without IPv4 (first IPv6 `u`) | `0e:03:` + the last 4 bytes of `u` |
//!
//! Every first octet has the locally-administered bit (0x02) set and the multicast bit (0x01)
//! clear: they are unicast and can never clash with a vendor (OUI) address. On an IPv4
//! underlay the four address bytes appear whole, so for a given VNI two different underlay
//! addresses always get two different MACs; the VNI byte keeps the VTEPs of two overlays on
//! one host apart in captures (a VTEP's FDB only ever holds peers of its own VNI).
//!
//! An IPv6 address does not fit in a MAC, so the IPv6 VTEP MAC is a 40-bit hash: two nodes of
//! one network share a MAC with a probability of about n²/2⁴¹ (1 in 90,000 for 5,000 nodes).
//! Two peers with one MAC are refused by every node (the peer list's check names both), so a
//! collision never misdelivers: it stops the network from programming until the operator
//! changes one of the two nodes' underlay address, or the network's VNI (which changes every
//! MAC).
//!
//! A pod's MAC only has to be unique on its node's bridge, where the node's IPAM hands out
//! addresses from one subnet: the low 4 bytes of an IPv6 pod address are unique there unless
//! the range spans more than 2³² addresses and is used that far.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// First octet of a scheme-1 VTEP MAC on an IPv4 underlay.
pub(crate) const VTEP_PREFIX: u8 = 0x0a;
/// First octet of a scheme-1 VTEP MAC on an IPv6 underlay.
pub(crate) const VTEP6_PREFIX: u8 = 0x06;
/// First two octets of a scheme-1 pod MAC.
pub(crate) const POD_PREFIX: [u8; 2] = [0x0e, 0x01];
/// First two octets of a scheme-1 MAC of a pod without IPv4.
pub(crate) const POD6_PREFIX: [u8; 2] = [0x0e, 0x03];

/// The VTEP MAC of the node whose underlay address is `local`, for VXLAN `vni`.
pub fn vtep_mac(local: IpAddr, vni: u32) -> [u8; 6] {
    match local {
        IpAddr::V4(a) => {
            let [a, b, c, d] = a.octets();
            [VTEP_PREFIX, (vni & 0xff) as u8, a, b, c, d]
        }
        IpAddr::V6(a) => {
            let d = Sha256::new()
                .chain_update(b"sticky-vxlan vtep\0")
                .chain_update(a.octets())
                .chain_update(vni.to_be_bytes())
                .finalize();
            [VTEP6_PREFIX, d[0], d[1], d[2], d[3], d[4]]
        }
    }
}

/// The MAC of a pod interface whose (first) IPv4 address is `ip`.
pub fn pod_mac(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [POD_PREFIX[0], POD_PREFIX[1], a, b, c, d]
}

/// The MAC of a pod interface without IPv4 whose first IPv6 address is `ip`.
pub(crate) fn pod_mac_v6(ip: Ipv6Addr) -> [u8; 6] {
    let o = ip.octets();
    [POD6_PREFIX[0], POD6_PREFIX[1], o[12], o[13], o[14], o[15]]
}

/// The kept MAC of a pod interface with these addresses: from its first IPv4 address, else
/// its first IPv6 address; `None` without any.
pub(crate) fn pod_mac_of(ips: impl IntoIterator<Item = IpAddr>) -> Option<[u8; 6]> {
    let ips: Vec<IpAddr> = ips.into_iter().collect();
    let v4 = ips.iter().find_map(|ip| match ip {
        IpAddr::V4(a) => Some(pod_mac(*a)),
        IpAddr::V6(_) => None,
    });
    v4.or_else(|| {
        ips.iter().find_map(|ip| match ip {
            IpAddr::V6(a) => Some(pod_mac_v6(*a)),
            IpAddr::V4(_) => None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn documented_examples() {
        assert_eq!(vtep_mac(v4(192, 0, 2, 1), 1), [0x0a, 0x01, 192, 0, 2, 1]);
        assert_eq!(
            vtep_mac(v4(192, 0, 2, 1), 0x123456),
            [0x0a, 0x56, 192, 0, 2, 1]
        );
        assert_eq!(
            pod_mac(Ipv4Addr::new(10, 244, 1, 5)),
            [0x0e, 0x01, 10, 244, 1, 5]
        );
        assert_eq!(
            pod_mac_v6("fd00:1::a:5".parse().unwrap()),
            [0x0e, 0x03, 0, 0x0a, 0, 5]
        );
    }

    /// Pinned: every node of every release must compute the same MAC for a peer.
    #[test]
    fn the_ipv6_vtep_mac_is_stable_across_releases() {
        let u: IpAddr = "2001:db8::1".parse().unwrap();
        let mac = sticky_netlink::link::format_mac(&vtep_mac(u, 1));
        // Computed from the documented formula with Python's hashlib, not by this code.
        assert_eq!(mac, "06:be:aa:cc:39:99");
        assert_ne!(vtep_mac(u, 1), vtep_mac(u, 2), "the VNI is part of it");
        assert_ne!(vtep_mac(u, 1), vtep_mac("2001:db8::2".parse().unwrap(), 1));
    }

    #[test]
    fn a_pod_without_ipv4_takes_its_mac_from_its_first_ipv6_address() {
        let v6: IpAddr = "fd00:1::7".parse().unwrap();
        let v4: IpAddr = "10.244.1.7".parse().unwrap();
        assert_eq!(
            pod_mac_of([v6, v4]),
            Some([0x0e, 1, 10, 244, 1, 7]),
            "IPv4 first"
        );
        assert_eq!(pod_mac_of([v6]), Some([0x0e, 3, 0, 0, 0, 7]));
        assert_eq!(pod_mac_of([]), None);
    }

    proptest! {
        #[test]
        fn unicast_and_locally_administered(ip in any::<u32>(), ip6 in any::<u128>(), vni in 1u32..(1 << 24)) {
            let ip = Ipv4Addr::from(ip);
            let ip6 = Ipv6Addr::from(ip6);
            for mac in [vtep_mac(ip.into(), vni), vtep_mac(ip6.into(), vni), pod_mac(ip), pod_mac_v6(ip6)] {
                prop_assert_eq!(mac[0] & 0x01, 0, "unicast");
                prop_assert_eq!(mac[0] & 0x02, 0x02, "locally administered");
            }
            let all = [vtep_mac(ip.into(), vni)[..2].to_vec(), vtep_mac(ip6.into(), vni)[..1].to_vec(), pod_mac(ip)[..2].to_vec(), pod_mac_v6(ip6)[..2].to_vec()];
            prop_assert_eq!(all[0][0], VTEP_PREFIX);
            prop_assert_eq!(all[1][0], VTEP6_PREFIX);
            prop_assert_eq!(&all[2][..], &POD_PREFIX[..]);
            prop_assert_eq!(&all[3][..], &POD6_PREFIX[..]);
        }

        #[test]
        fn one_to_one_for_a_vni_on_ipv4(a in any::<u32>(), b in any::<u32>(), vni in 1u32..(1 << 24)) {
            prop_assume!(a != b);
            prop_assert_ne!(vtep_mac(Ipv4Addr::from(a).into(), vni), vtep_mac(Ipv4Addr::from(b).into(), vni));
            prop_assert_ne!(pod_mac(a.into()), pod_mac(b.into()));
        }
    }
}
