//! The CNI commands of `sticky-vxlan`.
//!
//! ADD reads the config once ([`Config`]), opens one netlink socket for the host namespace
//! and keeps it for the node ([`reconcile::node_with`]), the veth and any rollback; the pod's
//! namespace gets one socket of its own ([`pod::configure_container`]). What to do when IPAM
//! or the node fails is one pure decision, [`after_ipam`].

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use super::Error;
use super::config::Config;
use super::delegate::Ipam;
use super::devices::{self, Dev};
use super::kernel::Live;
use super::node::{self, Observed, gateway_of};
use super::pod::{self, host_veth_name};
use super::reconcile::{self, Report};
use crate::cni::delegate::{Exec, Process};
use crate::cni::{Attachment, Call, CniResult, IpConfig, Plugin, attachments};
use crate::netlink::link;
use crate::netlink::{Socket, addr};

pub struct StickyVxlan;

fn config(call: &Call) -> Result<Config, Error> {
    Config::from_json(&call.conf.name, &call.conf.raw).map_err(Error::from)
}

/// What ADD does once IPAM has answered and the node is reconciled (or failed).
#[derive(Debug)]
pub enum AfterIpam<N> {
    /// Both worked: attach the pod.
    Attach(N, CniResult),
    /// IPAM may have allocated: give it back (IPAM DEL), then report this error.
    RollBack(Error),
    /// IPAM allocated nothing: report this error.
    Fail(Error),
}

/// Pure: the node's outcome and IPAM's, to what ADD does next. The node's problem, if any,
/// is the one reported (it is the one to fix first).
pub fn after_ipam<N>(node: Result<N, Error>, ipam: Result<CniResult, Error>) -> AfterIpam<N> {
    use crate::cni::delegate::Error as Delegate;
    match (node, ipam) {
        (Ok(n), Ok(result)) => AfterIpam::Attach(n, result),
        (Err(e), Ok(_)) => AfterIpam::RollBack(e),
        // IPAM exited 0, so it may have allocated, but its answer cannot be used.
        (node, Err(e @ Error::Ipam(Delegate::Output { .. }))) => {
            AfterIpam::RollBack(node.err().unwrap_or(e))
        }
        (Err(e), Err(_)) | (Ok(_), Err(e)) => AfterIpam::Fail(e),
    }
}

impl Plugin for StickyVxlan {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let cfg = config(call)?;
        add(&Process, call, &cfg)
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        // Removing the host end removes the pair, wherever the other end is; a missing link
        // (DEL twice, netns already gone) is success. The veth goes even if the config or the
        // IPAM plugin is broken, and IPAM DEL runs even if removing the veth failed, so
        // nothing leaks; a config or IPAM error is reported before a netlink one.
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let mut sock = Socket::open();
        let pending = config(call).and_then(|cfg| {
            // When the node's subnets cannot be worked out any more, the section goes as it
            // is: DEL finds an allocation by container id and pod name (sticky-ipam accepts a
            // DEL without ranges), and a DEL that cannot succeed would block the pod forever.
            let local = || match &mut sock {
                Ok(sock) => subnets_for_del(sock, call, &cfg),
                Err(_) => Err(Error::NoRemotePeer),
            };
            let ipam = Ipam::for_call(call, &cfg, local)
                .unwrap_or_else(|_| Ipam::verbatim(call, &cfg.ipam_type));
            ipam.start(&Process, call, "DEL")
        });
        let removed = match &mut sock {
            Ok(sock) => link::delete(sock, &host).map_err(Error::from),
            Err(_) => Socket::open()
                .map_err(Error::from)
                .and_then(|mut s| link::delete(&mut s, &host).map_err(Error::from)),
        };
        let released = pending.and_then(|p| Ok(p.wait().map(drop)?));
        released.and(removed)
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        pod::check_attachment(call, &cfg.bridge)?;
        let mut sock = Socket::open()?;
        let ipam = Ipam::for_call(call, &cfg, || local_subnets(&mut sock, call, &cfg))?;
        ipam.run(&Process, call, "CHECK")?;
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
        let mut sock = Socket::open()?;
        let released = Ipam::for_call(call, &cfg, || local_subnets(&mut sock, call, &cfg))
            .and_then(|ipam| ipam.run(&Process, call, "GC"))
            .map(drop);
        removed.and(released)
    }

    fn status(&self, call: &Call) -> Result<(), Error> {
        // A plugin that cannot work says so with 50, as the spec asks; an IPAM answer keeps
        // its own code. The node must be workable (underlay, this node's peer entry): every
        // ADD needs it, whether or not the IPAM ranges come from it.
        let not_ready = |e: Error| Error::NotReady(Box::new(e));
        let cfg = config(call).map_err(not_ready)?;
        let node = Socket::open()
            .map_err(Error::from)
            .and_then(|mut sock| {
                let mut k = Live { sock: &mut sock };
                let seen = Observed::read_for_node(&mut k)?;
                node::resolve(&mut k, &cfg, &seen)
            })
            .and_then(|node| node.check(cfg.vni).map(|()| node))
            .map_err(not_ready)?;
        let ipam =
            Ipam::for_call(call, &cfg, || Ok(node.local.subnets.clone())).map_err(not_ready)?;
        ipam.run(&Process, call, "STATUS")?;
        Ok(())
    }
}

/// ADD: the node and IPAM (concurrently when IPAM does not need the node's subnets), then the
/// pod; any failure after IPAM may have allocated rolls back.
fn add<E: Exec>(exec: &E, call: &Call, cfg: &Config) -> Result<CniResult, Error> {
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let mut sock = Socket::open()?;
    let node_work = |sock: &mut Socket| -> Result<Report, Error> {
        let report = reconcile::node_with(&mut Live { sock }, cfg)?;
        // A leftover from an earlier, interrupted ADD of the same attachment.
        link::delete(sock, &host)?;
        Ok(report)
    };
    let (ipam, node, result) = if cfg.ranges_from_peers {
        // The node's own subnets are the IPAM ranges: the node first.
        let report = node_work(&mut sock)?;
        let ipam = Ipam::with_ranges(call, &cfg.ipam_type, &report.node.local.subnets);
        let pending = ipam.start(exec, call, "ADD")?;
        crate::crash::point("vxlan add: node ready");
        let result = pending.result().map_err(Error::from);
        (ipam, Ok(report), result)
    } else {
        // IPAM runs while the node's VTEP, bridge and peers are brought up to date.
        let ipam = Ipam::verbatim(call, &cfg.ipam_type);
        let pending = ipam.start(exec, call, "ADD")?;
        let node = node_work(&mut sock);
        crate::crash::point("vxlan add: node ready");
        (ipam, node, pending.result().map_err(Error::from))
    };
    let roll_back = |sock: &mut Socket, e: Error| {
        if let Err(err) = link::delete(sock, &host) {
            eprintln!("sticky-vxlan: rollback: removing {host}: {err}");
        }
        if let Err(err) = ipam.run(exec, call, "DEL") {
            eprintln!("sticky-vxlan: rollback: IPAM DEL: {err}");
        }
        e
    };
    match after_ipam(node, result) {
        AfterIpam::Attach(report, result) => attach(&mut sock, call, cfg, &report, &host, &result)
            .map_err(|e| roll_back(&mut sock, e)),
        AfterIpam::RollBack(e) => Err(roll_back(&mut sock, e)),
        AfterIpam::Fail(e) => Err(e),
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
fn local_subnets(sock: &mut Socket, call: &Call, cfg: &Config) -> Result<Vec<IpNet>, Error> {
    let mut k = Live { sock };
    let resolved = Observed::read_for_node(&mut k)
        .and_then(|seen| node::resolve(&mut k, cfg, &seen))
        .map(|node| node.local.subnets);
    let from_prev = || -> Option<Vec<IpNet>> {
        let prev = call.conf.prev_result.as_ref()?;
        let nets: Vec<IpNet> = prev.ips.iter().map(|ip| ip.address.trunc()).collect();
        (!nets.is_empty()).then_some(nets)
    };
    resolved.or_else(|e| from_prev().ok_or(e))
}

/// [`local_subnets`], and for a DEL after this node's peer entry went away without a
/// `prevResult`, the subnets this network's bridge still serves: some IPAM plugins
/// (host-local) refuse a DEL without ranges, which would block the pod's teardown forever.
fn subnets_for_del(sock: &mut Socket, call: &Call, cfg: &Config) -> Result<Vec<IpNet>, Error> {
    local_subnets(sock, call, cfg).or_else(|e| {
        let seen = Observed::read_for_node(&mut Live { sock })?;
        let bridge = seen.link(&cfg.bridge).filter(|b| {
            b.alias
                .as_deref()
                .and_then(|a| devices::marked_for(Dev::Bridge, a))
                == Some(cfg.name.as_str())
        });
        let nets: Vec<IpNet> = bridge
            .map(|b| seen.addresses_of(b.index))
            .unwrap_or_default()
            .into_iter()
            .filter(|n| match n.addr() {
                IpAddr::V4(a) => !a.is_link_local(),
                IpAddr::V6(a) => a.segments()[0] & 0xffc0 != 0xfe80,
            })
            .map(|n| n.trunc())
            .collect();
        if nets.is_empty() { Err(e) } else { Ok(nets) }
    })
}

/// Everything after IPAM ADD; on error the caller rolls back.
fn attach(
    sock: &mut Socket,
    call: &Call,
    cfg: &Config,
    report: &Report,
    host: &str,
    ipam: &CniResult,
) -> Result<CniResult, Error> {
    let node = &report.node;
    let bridge = &report.bridge;
    let mtu = node.mtu;
    let own = &node.local.subnets;
    let in_own = |ip: &IpAddr| own.iter().any(|s| s.contains(ip));
    // Other nodes route only this node's subnets here: an address from anywhere else (a
    // conflist copied from another node unchanged) would be another node's, and its gateway on
    // the bridge would pull that node's whole subnet onto this one.
    if let Some(ip) = ipam.ips.iter().find(|ip| !in_own(&ip.address.addr())) {
        return Err(Error::ForeignAddress {
            address: ip.address,
            subnets: own.clone(),
        });
    }
    if let Some(gw) = ipam
        .ips
        .iter()
        .filter_map(|ip| ip.gateway)
        .find(|gw| !in_own(gw))
    {
        return Err(Error::ForeignGateway {
            gateway: gw,
            subnets: own.clone(),
        });
    }
    let netns = Path::new(&call.env.netns);
    // An IPAM gateway other than the subnet's first address still has to answer on the bridge.
    let have = addr::list(sock, bridge.index)?;
    for ip in &ipam.ips {
        let subnet = ip.address.trunc();
        if let Some(gw) = ip.gateway.filter(|gw| Some(*gw) != gateway_of(&subnet))
            && let Ok(net) = IpNet::new(gw, subnet.prefix_len())
            && !have.contains(&net)
        {
            addr::add(sock, bridge.index, net)?;
        }
    }
    let host_link = pod::create_veth(
        sock,
        &pod::Veth {
            netns,
            host,
            alias: pod::host_alias(&cfg.name, &call.env.container_id, &call.env.ifname),
            ifname: &call.env.ifname,
            ips: &ipam.ips,
            mtu,
            bridge: bridge.index,
            hairpin: cfg.hairpin_mode,
        },
    )?;
    crate::crash::point("vxlan add: veth created");
    let routes = pod::pod_routes(&ipam.ips, &ipam.routes, cfg.is_default_gateway);
    let container = pod::configure_container(netns, &call.env.ifname, &ipam.ips, &routes)?;
    Ok(CniResult {
        interfaces: pod::result_interfaces(
            bridge,
            &host_link,
            &container,
            (&call.env.ifname, &call.env.netns),
            mtu,
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::delegate::Error as Delegate;
    use std::path::PathBuf;

    fn output() -> Error {
        Error::Ipam(Delegate::Output {
            plugin: PathBuf::from("/x"),
            reason: "garbage".into(),
        })
    }

    fn failed() -> Error {
        Error::Ipam(Delegate::Failed {
            plugin: PathBuf::from("/x"),
            code: 100,
            msg: "full".into(),
            details: String::new(),
        })
    }

    #[test]
    fn rollback_only_when_ipam_may_have_allocated() {
        let ok = || Ok(CniResult::default());
        let node_err = || Err::<(), _>(Error::NoRemotePeer);
        assert!(matches!(after_ipam(Ok(()), ok()), AfterIpam::Attach((), _)));
        assert!(matches!(
            after_ipam(node_err(), ok()),
            AfterIpam::RollBack(Error::NoRemotePeer)
        ));
        assert!(matches!(
            after_ipam(Ok(()), Err(output())),
            AfterIpam::RollBack(Error::Ipam(Delegate::Output { .. }))
        ));
        assert!(
            matches!(
                after_ipam(node_err(), Err(output())),
                AfterIpam::RollBack(Error::NoRemotePeer)
            ),
            "the node's problem is the one reported"
        );
        assert!(matches!(
            after_ipam(Ok(()), Err(failed())),
            AfterIpam::Fail(Error::Ipam(Delegate::Failed { code: 100, .. }))
        ));
        assert!(matches!(
            after_ipam(node_err(), Err(failed())),
            AfterIpam::Fail(Error::NoRemotePeer)
        ));
    }
}
