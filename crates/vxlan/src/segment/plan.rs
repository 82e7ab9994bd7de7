//! A segment's devices on this node as a plan: what the kernel must be told, worked out as
//! pure data from the node ([`SegmentNode`]) and what was read of the segment's devices ([`Observed`]),
//! the ownership rules applied. [`super::apply`] carries it out; nothing here touches the
//! kernel.
//!
//! Everything is checked before anything is changed: a device of the segment's names without
//! the network's marker, or another device holding the VNI, is refused and nothing is
//! written. Order: the bridge (made and marked, this network's pod veths taken back; its
//! MTU; no IPv6; up), then the VXLAN device (ours that no longer fits deleted and made again,
//! marked; MTU; no IPv6; on the bridge; up), then the flood entries (new ones, then stale
//! ones unless the peers file is broken).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::Error;
use super::config::Config;
use super::node::SegmentNode;
use sticky_netlink::link::{Link, VxlanSpec};
use sticky_overlay::devices;
use sticky_overlay::kernel::LinkChange;

/// The flood entries' MAC.
pub(crate) const FLOOD: [u8; 6] = [0; 6];

/// What the kernel holds of the segment's devices, read once.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub bridge: Option<Link>,
    pub vxlan: Option<Link>,
    /// The permanent flood entries on the VXLAN device, when it is kept as it is.
    pub flood: Vec<IpAddr>,
    /// Every link, only when a device is to be made ([`makes_a_device`]): a new
    /// bridge takes this network's pod veths back, and a new VXLAN device must not take a VNI
    /// another device holds. The node's other links (a veth per pod) are not read otherwise.
    pub links: Vec<Link>,
}

/// The segment's two devices on this node, as programmed.
#[derive(Debug, Clone)]
pub struct Devices {
    pub bridge: Link,
    pub vxlan: Link,
}

/// One of the segment's two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    Bridge,
    Vxlan,
}

/// One change to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    CreateBridge {
        name: String,
        mtu: u32,
    },
    /// Our VXLAN device, whose parameters no longer match (it is made again next).
    DeleteVxlan {
        name: String,
    },
    CreateVxlan(VxlanSpec),
    /// A change to a device (its marker, once made: the kernel ignores an alias in the
    /// creating message).
    Change {
        dev: Dev,
        change: LinkChange,
    },
    /// The VXLAN device becomes a port of the bridge.
    EnslaveVxlan,
    /// A pod veth of this network back on a bridge that was made again: deleting a bridge
    /// releases its ports, and the pods behind them are still there.
    Reattach(Link),
    /// No IPv6 on the device: no link-local address, router solicitation or MLD report. The
    /// segment is the pods' L2 domain; the node only carries it.
    KeepNodeOff(Dev),
    /// An all-zero (flood) FDB entry towards another node of the segment.
    AddFlood(IpAddr),
    DeleteFlood(IpAddr),
}

/// Everything to do, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// The VXLAN device the segment wants on this node.
pub fn spec(cfg: &Config, node: &SegmentNode) -> VxlanSpec {
    devices::tunnel(
        cfg.vxlan(),
        (cfg.vni, cfg.port),
        (node.local_ip, &node.underlay),
        node.mtu,
        true,
    )
}

/// Whether the VXLAN device `l` is kept as it is (MTU aside): the unchangeable parameters
/// match, learning on.
pub fn keeps(l: &Link, want: &VxlanSpec) -> bool {
    devices::same_tunnel(l, want)
}

/// Whether a device is to be made, so that the plan needs every link ([`Observed::links`]).
pub(crate) fn makes_a_device(
    bridge: Option<&Link>,
    vxlan: Option<&Link>,
    want: &VxlanSpec,
) -> bool {
    bridge.is_none() || !vxlan.is_some_and(|l| keeps(l, want))
}

/// Refuses a device that is not ours or not of the expected kind.
fn owned(cfg: &Config, l: &Link, kind: &'static str) -> Result<(), Error> {
    let expected = cfg.marker();
    if l.alias.as_deref() != Some(expected.as_str()) {
        return Err(Error::NotOurs {
            device: l.name.clone(),
            alias: l.alias.clone().unwrap_or_default(),
            expected,
        });
    }
    devices::check_kind(l, kind).map_err(Error::Vxlan)
}

/// The flood entries to add and to remove, given those present (pure).
pub(crate) fn flood_plan(
    have: &[IpAddr],
    want: &[IpAddr],
    keep_stale: bool,
) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let have: BTreeSet<_> = have.iter().copied().collect();
    let want: BTreeSet<_> = want.iter().copied().collect();
    let add = want.difference(&have).copied().collect();
    let remove = if keep_stale {
        Vec::new()
    } else {
        have.difference(&want).copied().collect()
    };
    (add, remove)
}

/// Pure: the plan that brings the segment's devices on this node from `seen` to what `cfg`
/// and `node` say.
pub fn plan(cfg: &Config, node: &SegmentNode, seen: &Observed) -> Result<Plan, Error> {
    let want = spec(cfg, node);
    if let Some(b) = &seen.bridge {
        owned(cfg, b, "bridge")?;
    }
    if let Some(v) = &seen.vxlan {
        owned(cfg, v, "vxlan")?;
    }
    let kept = seen.vxlan.as_ref().filter(|l| keeps(l, &want));
    if kept.is_none()
        && let Some(holder) = seen
            .links
            .iter()
            .find(|l| l.name != want.name && devices::holds_vni(l, want.vni, want.port))
    {
        return Err(Error::Vxlan(sticky_overlay::Error::VniTaken {
            device: holder.name.clone(),
            vni: want.vni,
            port: want.port,
        }));
    }
    let mut steps = Vec::new();
    let marker = || LinkChange::Alias(cfg.marker());
    let (mtu, up) = match &seen.bridge {
        Some(b) => (b.mtu, b.up),
        None => {
            steps.push(Step::CreateBridge {
                name: cfg.bridge(),
                mtu: node.mtu,
            });
            steps.push(Step::Change {
                dev: Dev::Bridge,
                change: marker(),
            });
            for l in sticky_overlay::pod::host_ends(&cfg.name, &seen.links) {
                steps.push(Step::Reattach(l.clone()));
            }
            (Some(node.mtu), false)
        }
    };
    finish(&mut steps, Dev::Bridge, (mtu, up), node.mtu, None);

    let (mtu, up, on_bridge) = match kept {
        Some(v) => {
            let bridge = seen.bridge.as_ref().map(|b| b.index);
            (v.mtu, v.up, bridge.is_some() && v.master == bridge)
        }
        None => {
            if let Some(old) = &seen.vxlan {
                steps.push(Step::DeleteVxlan {
                    name: old.name.clone(),
                });
            }
            steps.push(Step::CreateVxlan(want.clone()));
            steps.push(Step::Change {
                dev: Dev::Vxlan,
                change: marker(),
            });
            (Some(want.mtu), false, false)
        }
    };
    let enslave = (!on_bridge).then_some(Step::EnslaveVxlan);
    finish(&mut steps, Dev::Vxlan, (mtu, up), want.mtu, enslave);

    // Entries on a device that is made again are gone with the old one.
    let have = if kept.is_some() { &seen.flood[..] } else { &[] };
    let (add, remove) = flood_plan(have, &node.remote, node.peers_file_error.is_some());
    steps.extend(add.into_iter().map(Step::AddFlood));
    steps.extend(remove.into_iter().map(Step::DeleteFlood));
    Ok(Plan { steps })
}

/// The steps that leave `dev` (as it is: its MTU, up or not) at MTU `want`, off the node's
/// IPv6, on the bridge (`enslave`, the VXLAN device's) and up.
fn finish(
    steps: &mut Vec<Step>,
    dev: Dev,
    (mtu, up): (Option<u32>, bool),
    want: u32,
    enslave: Option<Step>,
) {
    if mtu != Some(want) {
        steps.push(Step::Change {
            dev,
            change: LinkChange::Mtu(want),
        });
    }
    steps.push(Step::KeepNodeOff(dev));
    steps.extend(enslave);
    if !up {
        steps.push(Step::Change {
            dev,
            change: LinkChange::Up,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::Ipv4Addr;
    use sticky_netlink::link::VxlanInfo;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))
    }

    /// Segment `vxeth1` (VNI 101).
    fn cfg() -> Config {
        let raw = json!({"type": "sticky-vxlan", "mode": "segment", "vni": 101,
                         "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]}]});
        Config::from_json("vxeth1", &raw).unwrap()
    }

    /// Node 1 (underlay `eth0`, index 2) of a segment with the `remote` nodes.
    fn node(remote: &[u8]) -> SegmentNode {
        SegmentNode {
            local_ip: ip(1),
            underlay: Link {
                index: 2,
                name: "eth0".into(),
                mtu: Some(1500),
                ..Link::default()
            },
            mtu: 1450,
            members: [1].iter().chain(remote).map(|n| ip(*n)).collect(),
            remote: remote.iter().map(|n| ip(*n)).collect(),
            peers_file_error: None,
        }
    }

    const MARKER: &str = "sticky-vxlan segment vxeth1 vni 101";

    /// The bridge and VXLAN device as an earlier reconcile left them.
    fn programmed() -> (Link, Link) {
        let bridge = Link {
            index: 10,
            name: "segbr101".into(),
            kind: Some("bridge".into()),
            alias: Some(MARKER.into()),
            mtu: Some(1450),
            up: true,
            ..Link::default()
        };
        let vxlan = Link {
            index: 11,
            name: "segvx101".into(),
            kind: Some("vxlan".into()),
            alias: Some(MARKER.into()),
            mtu: Some(1450),
            up: true,
            master: Some(10),
            vxlan: Some(VxlanInfo {
                vni: Some(101),
                port: Some(8472),
                local: Some(ip(1)),
                underlay: Some(2),
                learning: Some(true),
                ttl: Some(0),
            }),
            ..Link::default()
        };
        (bridge, vxlan)
    }

    fn veth(name: &str, alias: &str) -> Link {
        Link {
            index: 20,
            name: name.into(),
            kind: Some("veth".into()),
            alias: Some(alias.into()),
            ..Link::default()
        }
    }

    fn marker(dev: Dev) -> Step {
        Step::Change {
            dev,
            change: LinkChange::Alias(MARKER.into()),
        }
    }

    fn up(dev: Dev) -> Step {
        Step::Change {
            dev,
            change: LinkChange::Up,
        }
    }

    #[test]
    fn a_fresh_node_plans_the_bridge_then_the_vxlan_device_then_one_flood_entry_per_node() {
        let (c, n) = (cfg(), node(&[2, 3]));
        let ours = veth("sv0123456789ab", "sticky-vxlan vxeth1 c1 net1");
        let seen = Observed {
            links: vec![ours.clone(), veth("sv_other", "sticky-vxlan other c2 net1")],
            ..Observed::default()
        };
        assert!(makes_a_device(None, None, &spec(&c, &n)));
        let plan = plan(&c, &n, &seen).unwrap();
        assert_eq!(
            plan.steps,
            [
                Step::CreateBridge {
                    name: "segbr101".into(),
                    mtu: 1450
                },
                marker(Dev::Bridge),
                Step::Reattach(ours),
                Step::KeepNodeOff(Dev::Bridge),
                up(Dev::Bridge),
                Step::CreateVxlan(spec(&c, &n)),
                marker(Dev::Vxlan),
                Step::KeepNodeOff(Dev::Vxlan),
                Step::EnslaveVxlan,
                up(Dev::Vxlan),
                Step::AddFlood(ip(2)),
                Step::AddFlood(ip(3)),
            ]
        );
        assert!(spec(&c, &n).learning);
        assert_eq!(spec(&c, &n).mac, sticky_overlay::mac::vtep_mac(ip(1), 101));
    }

    #[test]
    fn kept_devices_plan_only_what_differs_and_the_flood_entries_follow_the_nodes() {
        let (c, n) = (cfg(), node(&[2, 3]));
        let (bridge, vxlan) = programmed();
        assert!(!makes_a_device(Some(&bridge), Some(&vxlan), &spec(&c, &n)));
        let seen = Observed {
            bridge: Some(bridge.clone()),
            vxlan: Some(vxlan.clone()),
            flood: vec![ip(2), ip(4)],
            links: Vec::new(),
        };
        assert_eq!(
            plan(&c, &n, &seen).unwrap().steps,
            [
                Step::KeepNodeOff(Dev::Bridge),
                Step::KeepNodeOff(Dev::Vxlan),
                Step::AddFlood(ip(3)),
                Step::DeleteFlood(ip(4)),
            ]
        );
        // The peers file broken: nothing removed.
        let broken = SegmentNode {
            peers_file_error: Some("half-written".into()),
            ..n.clone()
        };
        assert!(
            !plan(&c, &broken, &seen)
                .unwrap()
                .steps
                .contains(&Step::DeleteFlood(ip(4)))
        );
        // Down, off the bridge, another MTU: repaired.
        let seen = Observed {
            bridge: Some(Link {
                up: false,
                mtu: Some(1500),
                ..bridge
            }),
            vxlan: Some(Link {
                master: None,
                ..vxlan
            }),
            flood: vec![ip(2), ip(3)],
            links: Vec::new(),
        };
        assert_eq!(
            plan(&c, &n, &seen).unwrap().steps,
            [
                Step::Change {
                    dev: Dev::Bridge,
                    change: LinkChange::Mtu(1450)
                },
                Step::KeepNodeOff(Dev::Bridge),
                up(Dev::Bridge),
                Step::KeepNodeOff(Dev::Vxlan),
                Step::EnslaveVxlan,
            ]
        );
    }

    #[test]
    fn our_vxlan_device_that_no_longer_fits_is_made_again_with_every_flood_entry() {
        let (c, n) = (cfg(), node(&[2]));
        let (bridge, mut vxlan) = programmed();
        if let Some(v) = vxlan.vxlan.as_mut() {
            v.learning = Some(false);
        }
        assert!(makes_a_device(Some(&bridge), Some(&vxlan), &spec(&c, &n)));
        let seen = Observed {
            bridge: Some(bridge),
            // Read before: gone with the old device.
            flood: vec![ip(2)],
            links: vec![vxlan.clone()],
            vxlan: Some(vxlan),
        };
        assert_eq!(
            plan(&c, &n, &seen).unwrap().steps,
            [
                Step::KeepNodeOff(Dev::Bridge),
                Step::DeleteVxlan {
                    name: "segvx101".into()
                },
                Step::CreateVxlan(spec(&c, &n)),
                marker(Dev::Vxlan),
                Step::KeepNodeOff(Dev::Vxlan),
                Step::EnslaveVxlan,
                up(Dev::Vxlan),
                Step::AddFlood(ip(2)),
            ],
            "the old device holds the VNI, and is no obstacle: it goes first"
        );
    }

    #[test]
    fn a_device_that_is_not_ours_or_another_holding_the_vni_is_refused_before_any_step() {
        let (c, n) = (cfg(), node(&[2]));
        let (bridge, vxlan) = programmed();
        let unmarked = Observed {
            bridge: Some(Link {
                alias: None,
                ..bridge.clone()
            }),
            ..Observed::default()
        };
        assert!(matches!(
            plan(&c, &n, &unmarked),
            Err(Error::NotOurs { .. })
        ));
        let others = Observed {
            vxlan: Some(Link {
                alias: Some("sticky-vxlan segment other vni 101".into()),
                ..vxlan.clone()
            }),
            ..Observed::default()
        };
        assert!(matches!(plan(&c, &n, &others), Err(Error::NotOurs { .. })));
        let theirs = Observed {
            bridge: Some(bridge),
            links: vec![Link {
                name: "theirs".into(),
                alias: None,
                ..vxlan
            }],
            ..Observed::default()
        };
        let err = plan(&c, &n, &theirs).unwrap_err();
        assert!(
            matches!(&err, Error::Vxlan(sticky_overlay::Error::VniTaken { device, .. }) if device == "theirs"),
            "{err}"
        );
    }

    #[test]
    fn flood_entries_follow_the_nodes_unless_the_peers_file_is_broken() {
        let ip = |n: u8| IpAddr::V4(Ipv4Addr::new(192, 0, 2, n));
        let (add, remove) = flood_plan(&[ip(2), ip(4)], &[ip(2), ip(3)], false);
        assert_eq!((add, remove), (vec![ip(3)], vec![ip(4)]));
        let (add, remove) = flood_plan(&[ip(2), ip(4)], &[ip(3)], true);
        assert_eq!((add, remove), (vec![ip(3)], vec![]));
    }

    #[test]
    fn only_a_learning_device_of_the_same_vni_port_and_underlay_is_kept() {
        let want = VxlanSpec {
            name: "segvx101".into(),
            vni: 101,
            port: 8472,
            local: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            underlay: Some(2),
            mac: [0; 6],
            mtu: 1450,
            learning: true,
        };
        let info = sticky_netlink::link::VxlanInfo {
            vni: Some(101),
            port: Some(8472),
            local: Some(want.local),
            underlay: Some(2),
            learning: Some(true),
            ttl: None,
        };
        let l = |info| Link {
            vxlan: Some(info),
            ..Link::default()
        };
        assert!(keeps(&l(info.clone()), &want));
        for changed in [
            sticky_netlink::link::VxlanInfo {
                learning: Some(false),
                ..info.clone()
            },
            sticky_netlink::link::VxlanInfo {
                vni: Some(102),
                ..info.clone()
            },
            sticky_netlink::link::VxlanInfo {
                underlay: Some(3),
                ..info.clone()
            },
            sticky_netlink::link::VxlanInfo {
                ttl: Some(1),
                ..info.clone()
            },
        ] {
            assert!(!keeps(&l(changed), &want));
        }
    }
}
