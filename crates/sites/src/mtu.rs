//! The pod MTU when the network has sites: a full-size pod packet must cross a site's LAN in
//! VXLAN and the WAN in WireGuard without fragmentation (issue 28, "MTU").
//!
//! Cross-site traffic does not carry VXLAN inside the tunnel: a non-gateway node sends the pod
//! packet to its gateway in VXLAN; the gateway decapsulates it and routes the bare pod packet
//! (L3) into the tunnel; the other side's gateway routes it into its own VXLAN. A relay routes
//! the bare packet from one tunnel into the other, so overheads never stack. Hence
//! pod MTU = min(LAN MTU − VXLAN overhead, WAN MTU − WireGuard overhead), with
//! VXLAN 50 bytes on an IPv4 underlay, 70 on IPv6, and WireGuard 60 bytes with an IPv4 outer
//! header, 80 with IPv6 (20/40 IP + 8 UDP + 32 WireGuard header and tag: measured 60 exactly
//! in docs/sites-tunnel-choice.md).
//!
//! The default WAN MTU is 1500 ([`DEFAULT_WAN_MTU`]): it is the outer path MTU of the usual
//! internet link, which is what this setting describes. WireGuard's familiar 1420 is not a WAN
//! MTU: it is its interface (inner) MTU, 1500 − 80, i.e. the answer for an IPv6 outer header,
//! which this function gives for a 1500 WAN of that family. A PPPoE (1492) or mobile uplink
//! needs the setting lowered; a too-large value does not lose packets (the userspace tunnel's
//! socket does not set DF) but fragments them on the WAN.

/// The usual internet path MTU (see the module doc).
pub const DEFAULT_WAN_MTU: u32 = 1500;
/// The smallest MTU IPv4 guarantees.
pub const MIN_IPV4_MTU: u32 = 576;
/// The smallest MTU IPv6 allows.
pub const MIN_IPV6_MTU: u32 = 1280;

/// An underlay's (or the WAN's) address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// VXLAN's overhead over an underlay of this family.
    pub fn vxlan_overhead(self) -> u32 {
        match self {
            Family::V4 => 50,
            Family::V6 => 70,
        }
    }

    /// WireGuard's overhead with an outer header of this family.
    pub fn wireguard_overhead(self) -> u32 {
        match self {
            Family::V4 => 60,
            Family::V6 => 80,
        }
    }
}

/// What the pod MTU is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// The site LAN's (underlay interface's) MTU.
    pub lan_mtu: u32,
    pub lan_family: Family,
    /// The WAN path MTU between sites ([`DEFAULT_WAN_MTU`] unless configured).
    pub wan_mtu: u32,
    /// The family of the tunnel's outer header (the gateways' endpoints).
    pub wan_family: Family,
    /// True when the network has more than one site; false: the WAN plays no part.
    pub sites: bool,
    /// True when pods have IPv6 addresses (the result must then be at least 1280).
    pub ipv6_pods: bool,
}

/// Which link sets the pod MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Lan,
    Wan,
}

/// The pod MTU and which link set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodMtu {
    pub mtu: u32,
    pub bound_by: Bound,
}

/// A pod MTU too small to be usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "{link} MTU {mtu} leaves a pod MTU of {pod} after {overhead} bytes of overhead, below the minimum {min}"
    )]
    TooSmall {
        link: &'static str,
        mtu: u32,
        overhead: u32,
        pod: i64,
        min: u32,
    },
}

/// The pod MTU (see the module's rule).
pub fn pod_mtu(i: &Inputs) -> Result<PodMtu, Error> {
    let min = if i.ipv6_pods {
        MIN_IPV6_MTU
    } else {
        MIN_IPV4_MTU
    };
    let lan = i64::from(i.lan_mtu) - i64::from(i.lan_family.vxlan_overhead());
    let wan = i64::from(i.wan_mtu) - i64::from(i.wan_family.wireguard_overhead());
    let (pod, bound_by) = if i.sites && wan < lan {
        (wan, Bound::Wan)
    } else {
        (lan, Bound::Lan)
    };
    if pod < i64::from(min) {
        let (link, mtu, overhead) = match bound_by {
            Bound::Lan => ("LAN", i.lan_mtu, i.lan_family.vxlan_overhead()),
            Bound::Wan => ("WAN", i.wan_mtu, i.wan_family.wireguard_overhead()),
        };
        return Err(Error::TooSmall {
            link,
            mtu,
            overhead,
            pod,
            min,
        });
    }
    let mtu = u32::try_from(pod).unwrap_or(u32::MAX);
    Ok(PodMtu { mtu, bound_by })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Family::*;

    fn inputs(lan: u32, lf: Family, wan: u32, wf: Family, sites: bool) -> Inputs {
        Inputs {
            lan_mtu: lan,
            lan_family: lf,
            wan_mtu: wan,
            wan_family: wf,
            sites,
            ipv6_pods: false,
        }
    }

    #[test]
    fn pod_mtu_table() {
        type Want = Result<(u32, Bound), ()>;
        let cases: &[(Inputs, Want)] = &[
            (
                inputs(1500, V4, DEFAULT_WAN_MTU, V4, false),
                Ok((1450, Bound::Lan)),
            ), // as today
            (
                inputs(1500, V4, DEFAULT_WAN_MTU, V4, true),
                Ok((1440, Bound::Wan)),
            ),
            (
                inputs(1500, V4, DEFAULT_WAN_MTU, V6, true),
                Ok((1420, Bound::Wan)),
            ), // WireGuard's 1420
            (
                inputs(1500, V6, DEFAULT_WAN_MTU, V4, true),
                Ok((1430, Bound::Lan)),
            ),
            (inputs(1400, V4, 1500, V4, true), Ok((1350, Bound::Lan))),
            (inputs(9000, V4, 1492, V4, true), Ok((1432, Bound::Wan))), // PPPoE uplink
            (inputs(1500, V4, 1500, V4, true), Ok((1440, Bound::Wan))),
            (inputs(1500, V4, 600, V4, true), Err(())), // 540 < 576
            (inputs(40, V4, 1500, V4, false), Err(())), // no underflow
            (inputs(1500, V4, 0, V6, true), Err(())),
        ];
        for (i, want) in cases {
            let got = pod_mtu(i).map(|p| (p.mtu, p.bound_by)).map_err(|_| ());
            assert_eq!(got, *want, "{i:?}");
        }
    }

    #[test]
    fn ipv6_pods_need_1280() {
        let mut i = inputs(1330, V4, 1500, V4, true);
        assert_eq!(pod_mtu(&i).unwrap().mtu, 1280);
        i.ipv6_pods = true;
        assert_eq!(pod_mtu(&i).unwrap().mtu, 1280);
        i.lan_mtu = 1329;
        let e = pod_mtu(&i).unwrap_err().to_string();
        assert!(
            e.contains("LAN MTU 1329") && e.contains("1279") && e.contains("1280"),
            "{e}"
        );
    }
}
