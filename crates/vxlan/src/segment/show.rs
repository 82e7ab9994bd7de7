//! `sticky-vxlan show`'s segment part: every segment on this node (found by the marker on
//! its VXLAN device) with its VNI, bridge, flood entries and member interfaces, the
//! equivalent of kube-vxlan-controller's `inspect nets` / `list pods`.

use std::fmt::Write as _;

use super::plan::FLOOD;
use sticky_netlink::link::Link;
use sticky_netlink::{Socket, neigh};
use sticky_overlay::Error;
use sticky_overlay::pod::parse_alias;

/// The text for every segment among `links`.
pub fn segments(sock: &mut Socket, links: &[Link]) -> Result<String, Error> {
    let mut out = String::new();
    for dev in links.iter().filter(|l| l.vxlan.is_some()) {
        let Some(network) = dev.alias.as_deref().and_then(super::config::marked_network) else {
            continue;
        };
        let vni = dev.vxlan.as_ref().and_then(|v| v.vni).unwrap_or_default();
        let bridge = links.iter().find(|l| Some(l.index) == dev.master);
        let _ = writeln!(
            out,
            "segment {network} vni {vni} bridge {} vxlan {} mtu {} {}",
            bridge.map_or("NONE", |b| b.name.as_str()),
            dev.name,
            dev.mtu.unwrap_or(0),
            if dev.up { "up" } else { "DOWN" }
        );
        let flood: Vec<String> = neigh::list_fdb(sock, dev.index)?
            .into_iter()
            .filter(|f| f.mac == FLOOD)
            .map(|f| f.dst.to_string())
            .collect();
        let _ = writeln!(
            out,
            "  flood {}",
            if flood.is_empty() {
                "NONE".into()
            } else {
                flood.join(" ")
            }
        );
        for member in links
            .iter()
            .filter(|l| bridge.is_some_and(|b| l.master == Some(b.index)))
        {
            if let Some((_, cid, ifname)) = member.alias.as_deref().and_then(parse_alias) {
                let _ = writeln!(out, "  member {cid} {ifname} host {}", member.name);
            }
        }
    }
    Ok(out)
}
