//! The kept MACs: pure functions of an IPv4 address, so they survive any restart and every
//! node can compute every peer's VTEP MAC offline.
//!
//! Scheme version 1 (the only one so far; a later scheme will use another first octet, which
//! tells them apart):
//!
//! | device | MAC |
//! |---|---|
//! | VTEP (underlay IPv4 `a.b.c.d`, VNI `v`) | `0a:<v mod 256>:a:b:c:d` |
//! | pod interface (pod IPv4 `a.b.c.d`) | `0e:01:a:b:c:d` |
//!
//! Both first octets have the locally-administered bit (0x02) set and the multicast bit
//! (0x01) clear: they are unicast and can never clash with a vendor (OUI) address. The four
//! address bytes appear whole, so for a given VNI two different underlay addresses always get
//! two different MACs (a truncated hash could collide and silently misdeliver through the
//! FDB). The VNI byte keeps the VTEPs of two overlays on one host apart in captures; it does
//! not need to be unique across VNIs, since a VTEP's FDB only ever holds peers of its own VNI.

use std::net::Ipv4Addr;

/// First octet of a scheme-1 VTEP MAC.
pub const VTEP_PREFIX: u8 = 0x0a;
/// First two octets of a scheme-1 pod MAC.
pub const POD_PREFIX: [u8; 2] = [0x0e, 0x01];

/// The VTEP MAC of the node whose underlay address is `local`, for VXLAN `vni`.
pub fn vtep_mac(local: Ipv4Addr, vni: u32) -> [u8; 6] {
    let [a, b, c, d] = local.octets();
    [VTEP_PREFIX, (vni & 0xff) as u8, a, b, c, d]
}

/// The MAC of a pod interface whose (first) IPv4 address is `ip`.
pub fn pod_mac(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [POD_PREFIX[0], POD_PREFIX[1], a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn documented_examples() {
        assert_eq!(
            vtep_mac(Ipv4Addr::new(192, 0, 2, 1), 1),
            [0x0a, 0x01, 192, 0, 2, 1]
        );
        assert_eq!(
            vtep_mac(Ipv4Addr::new(192, 0, 2, 1), 0x123456),
            [0x0a, 0x56, 192, 0, 2, 1]
        );
        assert_eq!(
            pod_mac(Ipv4Addr::new(10, 244, 1, 5)),
            [0x0e, 0x01, 10, 244, 1, 5]
        );
    }

    proptest! {
        #[test]
        fn unicast_locally_administered_and_invertible(ip in any::<u32>(), vni in 1u32..(1 << 24)) {
            let ip = Ipv4Addr::from(ip);
            for mac in [vtep_mac(ip, vni), pod_mac(ip)] {
                prop_assert_eq!(mac[0] & 0x01, 0, "unicast");
                prop_assert_eq!(mac[0] & 0x02, 0x02, "locally administered");
            }
            // The scheme in the first octet(s), the address whole after it.
            let (vtep, pod) = (vtep_mac(ip, vni), pod_mac(ip));
            prop_assert_eq!((vtep[0], vtep[1]), (VTEP_PREFIX, (vni & 0xff) as u8));
            prop_assert_eq!([pod[0], pod[1]], POD_PREFIX);
            prop_assert_eq!(&vtep[2..], &ip.octets()[..]);
            prop_assert_eq!(&pod[2..], &ip.octets()[..]);
            prop_assert_ne!(vtep_mac(ip, vni), pod_mac(ip));
        }

        #[test]
        fn one_to_one_for_a_vni(a in any::<u32>(), b in any::<u32>(), vni in 1u32..(1 << 24)) {
            prop_assume!(a != b);
            prop_assert_ne!(vtep_mac(a.into(), vni), vtep_mac(b.into(), vni));
            prop_assert_ne!(pod_mac(a.into()), pod_mac(b.into()));
        }
    }
}
