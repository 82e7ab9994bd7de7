//! Whose device is it? The VTEP and bridge decisions of the plan: create, keep and repair,
//! recreate, or refuse.
//!
//! A device sticky-vxlan made carries its marker, the alias `sticky-vxlan:<role> <network>`,
//! set right after creating it. The rules:
//! - no device of that name: create it (the VTEP with its kept MAC in the creating message);
//! - our marker: ours: repaired (MAC, MTU, up); a VTEP whose VNI, port, local address, underlay
//!   device, learning or TTL no longer match is deleted and created again;
//! - another network's marker: refused (two networks never share a VTEP or a bridge: each
//!   would remove the other's peers and gateways);
//! - no marker: a device made by a release before markers is adopted (marked) only when it
//!   is exactly what this config would have made: a VTEP with these parameters and the kept
//!   MAC of its local address and VNI; a bridge whose MAC is the kept MAC of one of its own
//!   addresses (what every earlier release set). Anything else is someone else's: refused
//!   with the reason, never changed;
//! - a device of another kind, or a bridge holding the underlay address (the node's uplink),
//!   is refused.

use std::net::IpAddr;

use super::Error;
use super::config::{Config, DEFAULT_PORT};
use super::kernel::LinkChange;
use super::mac::{pod_mac, vtep_mac};
use super::node::{LocalNode, Observed};
use super::pod::gateway_of;
use crate::step::{Dev, Step};
use sticky_netlink::link::{Link, VxlanSpec};

impl Dev {
    fn role(self) -> &'static str {
        match self {
            Dev::Vtep => "vtep",
            Dev::Bridge => "bridge",
        }
    }
}

/// The alias that marks `dev` as made by sticky-vxlan for `network`.
pub fn marker(dev: Dev, network: &str) -> String {
    format!("sticky-vxlan:{} {network}", dev.role())
}

/// The network named in a marker of `dev`'s role, if `alias` is one.
pub(crate) fn marked_for(dev: Dev, alias: &str) -> Option<&str> {
    alias
        .strip_prefix("sticky-vxlan:")?
        .strip_prefix(dev.role())?
        .strip_prefix(' ')
}

/// The VTEP this config and node want.
pub fn vtep_spec(cfg: &Config, node: &LocalNode) -> VxlanSpec {
    tunnel(
        cfg.vtep_name.clone(),
        (cfg.vni, cfg.port),
        (node.local_ip, &node.underlay),
        node.mtu,
        false,
    )
}

/// A VXLAN device of either mode: for `vni` on `port`, bound to the underlay address and
/// device, with the kept MAC of that address, learning as asked.
pub fn tunnel(
    name: String,
    (vni, port): (u32, u16),
    (local, underlay): (IpAddr, &Link),
    mtu: u32,
    learning: bool,
) -> VxlanSpec {
    VxlanSpec {
        name,
        vni,
        port,
        local,
        underlay: Some(underlay.index),
        mac: vtep_mac(local, vni),
        mtu,
        learning,
    }
}

/// An existing VTEP can be kept if only its MAC or MTU drifted (both are repaired).
pub fn compatible(existing: &Link, want: &VxlanSpec) -> bool {
    existing.kind.as_deref() == Some("vxlan") && same_tunnel(existing, want)
}

/// Whether a VXLAN device has the VNI, port, local address, underlay device and learning
/// `want` asks for, and the TTL every device is made with (0, `ttl auto`: the route's hop
/// limit); a kernel that reports no learning flag counts as learning off, none reporting a
/// TTL as 0. The kernel refuses to change the VNI or the port of a live device; it changes
/// the local address, learning and the TTL in place (`ip link set ... type vxlan local ...`)
/// — the drift this catches. The main mode's VTEP and a segment's device are kept, or deleted
/// and made again with their kept MAC (their entries are written again by the same
/// reconcile), by this one rule.
pub fn same_tunnel(existing: &Link, want: &VxlanSpec) -> bool {
    existing.vxlan.as_ref().is_some_and(|v| {
        v.vni == Some(want.vni)
            && v.port == Some(want.port)
            && v.local == Some(want.local)
            && v.underlay == want.underlay
            && v.learning.unwrap_or(false) == want.learning
            && v.ttl.unwrap_or(0) == 0
    })
}

/// Whether `l` is a VXLAN device receiving `vni` on `port`: another one would take the
/// packets meant for ours.
pub fn holds_vni(l: &Link, vni: u32, port: u16) -> bool {
    l.vxlan
        .as_ref()
        .is_some_and(|v| v.vni == Some(vni) && v.port.unwrap_or(DEFAULT_PORT) == port)
}

/// Refuses a device of another kind than `expected` under a name we use.
pub fn check_kind(l: &Link, expected: &'static str) -> Result<(), Error> {
    if l.kind.as_deref() == Some(expected) {
        return Ok(());
    }
    Err(Error::WrongKind {
        name: l.name.clone(),
        kind: l.kind.clone().unwrap_or_else(|| "plain".into()),
        expected,
    })
}

/// Whether `l` is ours, by its marker; the error that refuses it if not. `legacy` says
/// whether an unmarked device is exactly what an earlier release made for this config.
fn owned(dev: Dev, cfg: &Config, l: &Link, legacy: bool) -> Result<(), Error> {
    match l.alias.as_deref().and_then(|a| marked_for(dev, a)) {
        Some(network) if network == cfg.name => Ok(()),
        Some(network) => Err(Error::OtherNetwork {
            device: l.name.clone(),
            network: network.to_string(),
        }),
        None if legacy => Ok(()),
        None => Err(Error::NotOurs {
            device: l.name.clone(),
            role: dev.role(),
        }),
    }
}

/// Repairs of a device we keep: the marker when it has none yet, MAC, MTU, up.
fn repairs(dev: Dev, l: &Link, network: &str, mac: Option<[u8; 6]>, mtu: u32) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut change = |change| steps.push(Step::Change { dev, change });
    let mark = marker(dev, network);
    if l.alias.as_deref() != Some(mark.as_str()) {
        change(LinkChange::Alias(mark));
    }
    if let Some(mac) = mac
        && l.mac != Some(mac)
    {
        change(LinkChange::Mac(mac));
    }
    if l.mtu != Some(mtu) {
        change(LinkChange::Mtu(mtu));
    }
    if !l.up {
        change(LinkChange::Up);
    }
    steps
}

/// What follows creating `dev`: its marker (a creating message cannot carry an alias), then up.
fn after_creating(dev: Dev, network: &str) -> [Step; 2] {
    [
        Step::Change {
            dev,
            change: LinkChange::Alias(marker(dev, network)),
        },
        Step::Change {
            dev,
            change: LinkChange::Up,
        },
    ]
}

/// VTEPs marked for this network under another name than the configured one: left by an
/// earlier config (another `vni`, hence another default name, or another `vtepName`).
pub fn retired_vteps<'a>(cfg: &Config, seen: &'a Observed) -> Vec<&'a Link> {
    seen.links
        .iter()
        .filter(|l| {
            l.name != cfg.vtep_name
                && l.kind.as_deref() == Some("vxlan")
                && l.alias.as_deref().and_then(|a| marked_for(Dev::Vtep, a)) == Some(&cfg.name)
        })
        .collect()
}

/// The VTEP's steps; returns the existing VTEP when it is kept (its entries stay).
pub fn vtep<'a>(
    cfg: &Config,
    node: &LocalNode,
    seen: &'a Observed,
    steps: &mut Vec<Step>,
) -> Result<Option<&'a Link>, Error> {
    let want = vtep_spec(cfg, node);
    if let Some(l) = seen.link(&want.name) {
        check_kind(l, "vxlan")?;
        let fits = compatible(l, &want);
        let legacy = fits && l.mac == Some(want.mac);
        owned(Dev::Vtep, cfg, l, legacy)?;
        if fits {
            steps.extend(repairs(Dev::Vtep, l, &cfg.name, Some(want.mac), want.mtu));
            return Ok(Some(l));
        }
        steps.push(Step::DeleteLink {
            name: l.name.clone(),
        });
    }
    // Another device holding the VNI on this port would take the packets meant for ours.
    let retired = retired_vteps(cfg, seen);
    if let Some(holder) = seen.links.iter().find(|l| {
        l.name != want.name
            && !retired.iter().any(|r| r.index == l.index)
            && holds_vni(l, want.vni, want.port)
    }) {
        return Err(Error::VniTaken {
            device: holder.name.clone(),
            vni: want.vni,
            port: want.port,
        });
    }
    steps.push(Step::CreateVtep(want));
    steps.extend(after_creating(Dev::Vtep, &cfg.name));
    Ok(None)
}

/// The bridge's MAC: the pod scheme applied to its IPv4 gateway, so it never changes as pods
/// come and go.
pub(crate) fn bridge_mac(node: &LocalNode) -> Option<[u8; 6]> {
    match node.subnet_v4().and_then(|s| gateway_of(&s)) {
        Some(IpAddr::V4(gw)) => Some(pod_mac(gw)),
        _ => None,
    }
}

/// The bridge's steps; returns the existing bridge when it is kept.
pub fn bridge<'a>(
    cfg: &Config,
    node: &LocalNode,
    seen: &'a Observed,
    steps: &mut Vec<Step>,
) -> Result<Option<&'a Link>, Error> {
    let mac = bridge_mac(node);
    let Some(b) = seen.link(&cfg.bridge) else {
        steps.push(Step::CreateBridge {
            name: cfg.bridge.clone(),
            mtu: node.mtu,
            mac,
        });
        steps.extend(after_creating(Dev::Bridge, &cfg.name));
        return Ok(None);
    };
    let addrs = seen.addresses_of(b.index);
    if b.index == node.underlay.index || addrs.iter().any(|a| a.addr() == node.local_ip) {
        return Err(Error::UnderlayBridge {
            device: b.name.clone(),
            underlay: node.local_ip,
        });
    }
    check_kind(b, "bridge")?;
    let legacy = addrs.iter().any(|a| match a.addr() {
        IpAddr::V4(ip) => b.mac == Some(pod_mac(ip)),
        IpAddr::V6(_) => false,
    });
    owned(Dev::Bridge, cfg, b, legacy)?;
    steps.extend(repairs(Dev::Bridge, b, &cfg.name, mac, node.mtu));
    Ok(Some(b))
}
