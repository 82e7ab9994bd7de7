//! The CNI commands of `sticky-vxlan`.

use std::path::Path;

use super::config::Config;
use super::datapath::{self, gateway_of};
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
        let mut sock = Socket::open()?;
        let (node, _vtep, bridge) = datapath::ensure_node(&mut sock, &cfg)?;
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        // A leftover from an earlier, interrupted ADD of the same attachment.
        link::delete(&mut sock, &host)?;
        crate::crash::point("vxlan add: before IPAM");
        let ipam = delegate::add(call, &cfg.ipam_type)?;
        match attach(&mut sock, call, &cfg, node.mtu, &bridge, &host, &ipam) {
            Ok(result) => Ok(result),
            Err(err) => {
                // Undo in reverse order and keep going: the original error is what matters.
                if let Err(e) = link::delete(&mut sock, &host) {
                    eprintln!("sticky-vxlan: rollback: removing {host}: {e}");
                }
                if let Err(e) = delegate::run(call, &cfg.ipam_type, "DEL") {
                    eprintln!("sticky-vxlan: rollback: IPAM DEL: {e}");
                }
                Err(err)
            }
        }
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        // Removing the host end removes the pair, wherever the other end is; a missing link
        // (DEL twice, netns already gone) is success. IPAM DEL runs even if that failed, so
        // the address is not leaked; the first error is reported.
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let removed = Socket::open()
            .map_err(Error::from)
            .and_then(|mut sock| link::delete(&mut sock, &host).map_err(Error::from));
        let released = delegate::run(call, &cfg.ipam_type, "DEL").map(drop);
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
