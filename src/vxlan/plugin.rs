//! The CNI commands of `sticky-vxlan`.

use std::path::Path;

use super::config::Config;
use super::datapath;
use super::node::gateway_of;
use super::pod::{self, host_veth_name};
use super::{Error, delegate};
use crate::cni::{Call, CniResult, Interface, IpConfig, Plugin};
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
        // IPAM runs while the node's VTEP, bridge and peers are brought up to date.
        let pending = delegate::spawn(call, &cfg.ipam_type, "ADD")?;
        let node = Socket::open().map_err(Error::from).and_then(|mut sock| {
            let (node, _vtep, bridge) = datapath::ensure_node(&mut sock, &cfg)?;
            // A leftover from an earlier, interrupted ADD of the same attachment.
            link::delete(&mut sock, &host)?;
            Ok((sock, node, bridge))
        });
        crate::crash::point("vxlan add: node ready");
        let ipam = pending.result();
        let ((mut sock, node, bridge), ipam) = match (node, ipam) {
            (Ok(n), Ok(ipam)) => (n, ipam),
            (Err(e), Ok(_)) => {
                rollback(call, &cfg, None, &host);
                return Err(e);
            }
            // IPAM allocated nothing; the node's problem is the one to fix first.
            (Err(e), Err(_)) => return Err(e),
            (Ok(_), Err(e)) => return Err(e),
        };
        attach(&mut sock, call, &cfg, node.mtu, &bridge, &host, &ipam).inspect_err(|_| {
            rollback(call, &cfg, Some(&mut sock), &host);
        })
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        // Removing the host end removes the pair, wherever the other end is; a missing link
        // (DEL twice, netns already gone) is success. IPAM DEL runs even if that failed, so
        // the address is not leaked; the first error is reported.
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let pending = delegate::spawn(call, &cfg.ipam_type, "DEL")?;
        let removed = Socket::open()
            .map_err(Error::from)
            .and_then(|mut sock| link::delete(&mut sock, &host).map_err(Error::from));
        let released = pending.wait().map(drop);
        removed.and(released)
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
        delegate::run(call, &cfg.ipam_type, "CHECK")?;
        Ok(())
    }

    fn gc(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        delegate::run(call, &cfg.ipam_type, "GC")?;
        Ok(())
    }

    fn status(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        delegate::run(call, &cfg.ipam_type, "STATUS")?;
        Ok(())
    }
}

/// Undoes an ADD after IPAM allocated: the veth, then IPAM DEL. Keeps going after errors
/// (logged): the error that caused the rollback is the one reported.
fn rollback(call: &Call, cfg: &Config, sock: Option<&mut Socket>, host: &str) {
    let removed = match sock {
        Some(sock) => link::delete(sock, host).map_err(Error::from),
        None => Socket::open()
            .map_err(Error::from)
            .and_then(|mut s| link::delete(&mut s, host).map_err(Error::from)),
    };
    if let Err(e) = removed {
        eprintln!("sticky-vxlan: rollback: removing {host}: {e}");
    }
    if let Err(e) = delegate::run(call, &cfg.ipam_type, "DEL") {
        eprintln!("sticky-vxlan: rollback: IPAM DEL: {e}");
    }
}

/// Everything after IPAM ADD; on error the caller rolls back.
fn attach(
    sock: &mut Socket,
    call: &Call,
    cfg: &Config,
    mtu: u32,
    bridge: &link::Link,
    host: &str,
    ipam: &CniResult,
) -> Result<CniResult, Error> {
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
    let host_link = pod::create_veth(
        sock,
        netns,
        host,
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
