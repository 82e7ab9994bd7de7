//! The CNI commands of `sticky-vxlan`.

use std::path::Path;

use super::config::Config;
use super::datapath;
use super::delegate::Ipam;
use super::node::{self, gateway_of};
use super::pod::{self, host_veth_name};
use super::{Error, delegate};
use crate::cni::{Attachment, Call, CniResult, Interface, IpConfig, Plugin, attachments};
use crate::netlink::link::{self, format_mac};
use crate::netlink::{Socket, addr};

pub struct StickyVxlan;

fn config(call: &Call) -> Result<Config, Error> {
    Config::from_json(&call.conf.name, &call.conf.raw).map_err(Error::from)
}

impl Plugin for StickyVxlan {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let cfg = config(call)?;
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let node_work = || {
            Socket::open().map_err(Error::from).and_then(|mut sock| {
                let (node, _vtep, bridge) = datapath::ensure_node(&mut sock, &cfg)?;
                // A leftover from an earlier, interrupted ADD of the same attachment.
                link::delete(&mut sock, &host)?;
                Ok((sock, node, bridge))
            })
        };
        let (ipam, pending, node) = if delegate::needs_ranges(&call.conf.raw) {
            // The node's own subnets are the IPAM ranges: the node first.
            let node = node_work()?;
            let ipam = Ipam::with_ranges(call, &cfg.ipam_type, &node.1.local.subnets);
            let pending = delegate::spawn(call, &ipam, "ADD")?;
            (ipam, pending, Ok(node))
        } else {
            // IPAM runs while the node's VTEP, bridge and peers are brought up to date.
            let ipam = Ipam::verbatim(call, &cfg.ipam_type);
            let pending = delegate::spawn(call, &ipam, "ADD")?;
            (ipam, pending, node_work())
        };
        crate::crash::point("vxlan add: node ready");
        let result = pending.result();
        let ((mut sock, node, bridge), result) = match (node, result) {
            (Ok(n), Ok(result)) => (n, result),
            (Err(e), Ok(_)) => {
                rollback(call, &ipam, None, &host);
                return Err(e);
            }
            // IPAM exited 0, so it may have allocated, but its answer cannot be used: give it
            // back. The node's problem, if any, is the one to fix first.
            (node, Err(e @ Error::IpamOutput { .. })) => {
                rollback(call, &ipam, None, &host);
                return Err(node.err().unwrap_or(e));
            }
            // IPAM allocated nothing; the node's problem is the one to fix first.
            (Err(e), Err(_)) => return Err(e),
            (Ok(_), Err(e)) => return Err(e),
        };
        attach(&mut sock, call, &cfg, &node, &bridge, &host, &result).inspect_err(|_| {
            rollback(call, &ipam, Some(&mut sock), &host);
        })
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        // Removing the host end removes the pair, wherever the other end is; a missing link
        // (DEL twice, netns already gone) is success. The veth goes even if the config or the
        // IPAM plugin is broken, and IPAM DEL runs even if removing the veth failed, so
        // nothing leaks; a config or IPAM error is reported before a netlink one.
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let cfg = config(call);
        let pending = cfg.as_ref().map_err(|_| ()).map(|cfg| {
            // When the node's subnets cannot be worked out any more, the section goes as it
            // is: DEL finds an allocation by container id and pod name (sticky-ipam accepts a
            // DEL without ranges), and a DEL that cannot succeed would block the pod forever.
            let ipam = Ipam::for_call(call, &cfg.ipam_type, || local_subnets(call, cfg))
                .unwrap_or_else(|_| Ipam::verbatim(call, &cfg.ipam_type));
            delegate::spawn(call, &ipam, "DEL")
        });
        let removed = Socket::open()
            .map_err(Error::from)
            .and_then(|mut sock| link::delete(&mut sock, &host).map_err(Error::from));
        let released = match pending {
            Ok(Ok(p)) => p.wait().map(drop),
            Ok(Err(e)) => Err(e),
            Err(()) => cfg.map(drop),
        };
        released.and(removed)
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        let prev = call
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| Error::Check("prevResult is missing".into()))?;
        let container = prev
            .interfaces
            .iter()
            .find(|i| i.name == call.env.ifname && i.sandbox.is_some());
        pod::check_container(
            Path::new(&call.env.netns),
            &call.env.ifname,
            container.and_then(|i| i.mac.as_deref()),
            prev,
        )?;
        let mut sock = Socket::open()?;
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let Some(host_link) = link::get(&mut sock, &host)? else {
            return Err(Error::Check(format!("host interface {host} is missing")));
        };
        let bridge = link::require(&mut sock, &cfg.bridge)?;
        if host_link.master != Some(bridge.index) {
            return Err(Error::Check(format!(
                "{host} is not on bridge {}",
                cfg.bridge
            )));
        }
        let ipam = Ipam::for_call(call, &cfg.ipam_type, || local_subnets(call, &cfg))?;
        delegate::run(call, &ipam, "CHECK")?;
        Ok(())
    }

    /// Removes this network's veths whose attachment is not in the runtime's valid list
    /// (found by their alias, so another network on the same bridge is never touched), then
    /// forwards GC to IPAM. Keeps going after an error; the first one is reported. Without a
    /// valid-attachments list nothing is removed here (IPAM decides for itself); a malformed
    /// list is refused whole before anything is removed or forwarded.
    fn gc(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        let removed = match attachments::valid_attachments(&call.conf.raw)? {
            Some(valid) => remove_stale_veths(&cfg.name, &valid),
            None => Ok(()),
        };
        let released = Ipam::for_call(call, &cfg.ipam_type, || local_subnets(call, &cfg))
            .and_then(|ipam| delegate::run(call, &ipam, "GC"))
            .map(drop);
        removed.and(released)
    }

    fn status(&self, call: &Call) -> Result<(), Error> {
        // A plugin that cannot work says so with 50, as the spec asks; an IPAM answer keeps
        // its own code. The node must be workable (underlay, this node's peer entry): every
        // ADD needs it, whether or not the IPAM ranges come from it.
        let not_ready = |e: Error| Error::NotReady(e.to_string());
        let cfg = config(call).map_err(not_ready)?;
        let node = Socket::open()
            .map_err(Error::from)
            .and_then(|mut sock| node::resolve(&mut sock, &cfg))
            .and_then(|node| node.check(cfg.vni).map(|()| node))
            .map_err(not_ready)?;
        let ipam = Ipam::for_call(call, &cfg.ipam_type, || Ok(node.local.subnets.clone()))
            .map_err(not_ready)?;
        delegate::run(call, &ipam, "STATUS")?;
        Ok(())
    }
}

/// Removes the veths of `network` (by their alias) whose attachment is not in `valid`; the
/// segment mode's GC uses it too.
pub fn remove_stale_veths(network: &str, valid: &[Attachment]) -> Result<(), Error> {
    let mut sock = Socket::open()?;
    let mut first = Ok(());
    for l in link::list(&mut sock)? {
        let Some((net, cid, ifname)) = l.alias.as_deref().and_then(pod::parse_alias) else {
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

/// This node's pod subnets, for an IPAM section without ranges: from the peer list, or, when
/// the node cannot be worked out (a DEL after the underlay went away), from the addresses of
/// the previous result.
fn local_subnets(call: &Call, cfg: &Config) -> Result<Vec<ipnet::IpNet>, Error> {
    let resolved = Socket::open()
        .map_err(Error::from)
        .and_then(|mut sock| node::resolve(&mut sock, cfg))
        .map(|node| node.local.subnets);
    let from_prev = || -> Option<Vec<ipnet::IpNet>> {
        let prev = call.conf.prev_result.as_ref()?;
        let nets: Vec<ipnet::IpNet> = prev.ips.iter().map(|ip| ip.address.trunc()).collect();
        (!nets.is_empty()).then_some(nets)
    };
    resolved.or_else(|e| from_prev().ok_or(e))
}

/// Undoes an ADD after IPAM allocated: the veth, then IPAM DEL. Keeps going after errors
/// (logged): the error that caused the rollback is the one reported.
fn rollback(call: &Call, ipam: &Ipam, sock: Option<&mut Socket>, host: &str) {
    let removed = match sock {
        Some(sock) => link::delete(sock, host).map_err(Error::from),
        None => Socket::open()
            .map_err(Error::from)
            .and_then(|mut s| link::delete(&mut s, host).map_err(Error::from)),
    };
    if let Err(e) = removed {
        eprintln!("sticky-vxlan: rollback: removing {host}: {e}");
    }
    if let Err(e) = delegate::run(call, ipam, "DEL") {
        eprintln!("sticky-vxlan: rollback: IPAM DEL: {e}");
    }
}

/// Everything after IPAM ADD; on error the caller rolls back.
fn attach(
    sock: &mut Socket,
    call: &Call,
    cfg: &Config,
    node: &node::Node,
    bridge: &link::Link,
    host: &str,
    ipam: &CniResult,
) -> Result<CniResult, Error> {
    let mtu = node.mtu;
    // Other nodes route only this node's subnets here: an address from anywhere else (a
    // conflist copied from another node unchanged) would be another node's, and its gateway on
    // the bridge would pull that node's whole subnet onto this one.
    if let Some(ip) = ipam.ips.iter().find(|ip| {
        !node
            .local
            .subnets
            .iter()
            .any(|s| s.contains(&ip.address.addr()))
    }) {
        return Err(Error::ForeignAddress {
            address: ip.address,
            subnets: node
                .local
                .subnets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let netns = Path::new(&call.env.netns);
    // An IPAM gateway other than the subnet's first address still has to answer on the bridge.
    let have = addr::list(sock, bridge.index)?;
    for ip in &ipam.ips {
        let subnet = ip.address.trunc();
        if let Some(gw) = ip.gateway.filter(|gw| Some(*gw) != gateway_of(&subnet))
            && let Ok(net) = ipnet::IpNet::new(gw, subnet.prefix_len())
            && !have.contains(&net)
        {
            addr::add(sock, bridge.index, net)?;
        }
    }
    let alias = pod::host_alias(&cfg.name, &call.env.container_id, &call.env.ifname);
    let host_link = pod::create_veth(
        sock,
        netns,
        host,
        &alias,
        &call.env.ifname,
        &ipam.ips,
        mtu,
        bridge,
        cfg.hairpin_mode,
    )?;
    crate::crash::point("vxlan add: veth created");
    let routes = pod::pod_routes(&ipam.ips, &ipam.routes, cfg.is_default_gateway);
    let container = pod::configure_container(netns, &call.env.ifname, &ipam.ips, &routes)?;
    let mac = |l: &link::Link| l.mac.as_ref().map(format_mac);
    Ok(CniResult {
        interfaces: vec![
            Interface {
                name: bridge.name.clone(),
                mac: mac(bridge),
                sandbox: None,
                mtu: None,
            },
            Interface {
                name: host_link.name.clone(),
                mac: mac(&host_link),
                sandbox: None,
                mtu: Some(mtu),
            },
            Interface {
                name: call.env.ifname.clone(),
                mac: mac(&container),
                sandbox: Some(call.env.netns.clone()),
                mtu: Some(mtu),
            },
        ],
        ips: ipam
            .ips
            .iter()
            .map(|ip| IpConfig {
                interface: Some(2),
                ..ip.clone()
            })
            .collect(),
        routes,
        dns: ipam.dns.clone(),
    })
}
