//! The CNI commands of a segment network.
//!
//! Addresses, in this order of precedence (as the reference `static` IPAM reads them):
//! `runtimeConfig.ips` (the `ips` capability), `args.cni.ips` (Multus's `cni-args`), then the
//! matching `attachments` entry's `ips`. With an `ipam` section the IPAM plugin is run with the
//! call's stdin (it reads the first two itself; its ranges cut to this node's slice when
//! `nodeSlice` is set), except for a pod whose fixed addresses come from the attachments
//! table: those are assigned as given. Without `ipam` the plugin assigns the fixed addresses
//! itself, or none (an L2-only interface).
//!
//! The MAC, as the reference `bridge` plugin takes it: `runtimeConfig.mac` (the `mac`
//! capability), else `args.cni.mac`, else CNI_ARGS `MAC=`, else the kept MAC
//! ([`super::pod::kept_mac`]).

use std::path::Path;

use ipnet::IpNet;
use serde_json::Value;

use super::attachments::{self, Attachment};
use super::config::Config;
use super::pod::{self, Iface};
use super::reconcile::{self, ForPod};
use super::{Error, slice};
use crate::cni::{Call, CniResult, IpConfig, Plugin};
use crate::netlink::Socket;
use crate::netlink::link::{self, parse_mac};
use crate::vxlan::delegate::Ipam;
use crate::vxlan::kernel::Live;
use crate::vxlan::plugin::{remove_link, remove_stale_veths};
use crate::vxlan::pod::{host_alias, host_veth_name, result_interfaces};
use crate::vxlan::pods::{self, after_ipam};

pub struct Segment;

fn config(call: &Call) -> Result<Config, Error> {
    Ok(Config::from_json(&call.conf.name, &call.conf.raw)?)
}

/// The pod as `CNI_ARGS` names it: (namespace, name), or the container id without a name.
fn pod_of(call: &Call) -> (String, String) {
    match call.env.args.non_empty("K8S_POD_NAME") {
        Some(name) => (
            call.env
                .args
                .get("K8S_POD_NAMESPACE")
                .unwrap_or_default()
                .to_string(),
            name.to_string(),
        ),
        None => (String::new(), call.env.container_id.clone()),
    }
}

fn attachment<'a>(call: &Call, cfg: &'a Config) -> Option<&'a Attachment> {
    let name = call.env.args.non_empty("K8S_POD_NAME")?;
    let namespace = call.env.args.get("K8S_POD_NAMESPACE").unwrap_or_default();
    attachments::find(&cfg.attachments, namespace, name)
}

/// `args.cni.<key>` of the network config (the other way a runtime passes per-call values).
fn args_cni<'a>(call: &'a Call, key: &str) -> Option<&'a Value> {
    call.conf.raw.get("args")?.get("cni")?.get(key)
}

/// `runtimeConfig.ips`, else `args.cni.ips`, as given by the runtime (checked).
fn requested_ips(call: &Call) -> Result<Option<Vec<IpNet>>, Error> {
    let sources = [
        ("runtimeConfig.ips", call.conf.runtime_config.get("ips")),
        ("args.cni.ips", args_cni(call, "ips")),
    ];
    for (key, value) in sources {
        match value {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) if a.is_empty() => continue,
            Some(v) => {
                return attachments::parse_ips(v).map(Some).map_err(|reason| {
                    Error::RuntimeConfig {
                        key,
                        value: v.to_string(),
                        reason,
                    }
                });
            }
        }
    }
    Ok(None)
}

/// The MAC the runtime asks for, if any.
fn requested_mac(call: &Call) -> Result<Option<[u8; 6]>, Error> {
    let unicast = |m: [u8; 6]| m[0] & 1 == 0 && m != [0; 6];
    let sources = [
        ("runtimeConfig.mac", call.conf.runtime_config.get("mac")),
        ("args.cni.mac", args_cni(call, "mac")),
    ];
    for (key, value) in sources {
        match value {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) if s.is_empty() => continue,
            Some(v) => {
                return v
                    .as_str()
                    .and_then(parse_mac)
                    .filter(|m| unicast(*m))
                    .map(Some)
                    .ok_or_else(|| Error::Mac {
                        source_key: key,
                        // The text itself, quoted once by the message (a non-string as JSON).
                        value: v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    });
            }
        }
    }
    match call.env.args.non_empty("MAC") {
        None => Ok(None),
        Some(text) => parse_mac(text)
            .filter(|m| unicast(*m))
            .map(Some)
            .ok_or_else(|| Error::ArgsMac(text.to_string())),
    }
}

/// Where the pod's addresses come from.
enum Addressing {
    /// Assigned as given (possibly none: L2 only).
    Fixed(Vec<IpNet>),
    /// The IPAM plugin, run with this stdin.
    Ipam(Ipam),
}

/// `ranges`: this node's slice of the IPAM ranges, when the config cuts them per node.
fn addressing(call: &Call, cfg: &Config, ranges: Option<&Value>) -> Result<Addressing, Error> {
    let requested = requested_ips(call)?;
    let from_table = attachment(call, cfg)
        .map(|a| a.ips.clone())
        .filter(|ips| !ips.is_empty());
    let Some(plugin_type) = &cfg.ipam_type else {
        return Ok(Addressing::Fixed(
            requested.or(from_table).unwrap_or_default(),
        ));
    };
    if let (None, Some(ips)) = (&requested, from_table) {
        return Ok(Addressing::Fixed(ips));
    }
    Ok(Addressing::Ipam(Ipam {
        plugin_type: plugin_type.clone(),
        stdin: ipam_stdin(call, ranges),
    }))
}

/// The call's stdin for IPAM: its ranges cut to this node's slice when there is one.
fn ipam_stdin(call: &Call, ranges: Option<&Value>) -> Vec<u8> {
    match ranges {
        Some(r) => slice::with_ranges(&call.conf.raw, r)
            .to_string()
            .into_bytes(),
        None => call.stdin.clone(),
    }
}

/// This node's slice of the IPAM ranges, programming nothing ([`reconcile::ranges`]).
fn ranges(cfg: &Config) -> Result<Option<Value>, Error> {
    let mut sock = Socket::open()?;
    reconcile::ranges(&mut Live { sock: &mut sock }, cfg)
}

/// [`addressing`] for DEL, CHECK and GC: the slice only when it is needed and can still be
/// worked out; sticky-ipam finds an allocation without ranges.
fn addressing_late(call: &Call, cfg: &Config) -> Result<Addressing, Error> {
    let ranges = match cfg.node_slice {
        Some(_) => ranges(cfg).ok().flatten(),
        None => None,
    };
    addressing(call, cfg, ranges.as_ref())
}

impl Plugin for Segment {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let cfg = config(call)?;
        let wanted_mac = requested_mac(call)?;
        let mut sock = Socket::open()?;
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        let node_work = |sock: &mut Socket| {
            reconcile::for_pod(&mut Live { sock }, &cfg).and_then(|node| {
                // A leftover from an earlier, interrupted ADD of the same attachment.
                link::delete(sock, &host)?;
                Ok(node)
            })
        };
        // The node first when IPAM needs its slice; otherwise IPAM runs while the segment's
        // devices and flood entries are brought up to date.
        let early = match cfg.node_slice {
            Some(_) => Some(node_work(&mut sock)?),
            None => None,
        };
        let ranges = early.as_ref().and_then(|n| n.ready.ranges.as_ref());
        let (ipam, pending) = match addressing(call, &cfg, ranges)? {
            Addressing::Fixed(ips) => (None, Err(ips)),
            Addressing::Ipam(ipam) => {
                let pending = ipam.start(&ipam.runner(), call, "ADD")?;
                (Some(ipam), Ok(pending))
            }
        };
        let ready = match early {
            Some(node) => Ok(node),
            None => node_work(&mut sock),
        };
        // Fixed addresses stand for IPAM's answer: nothing to give back.
        let allocated = match pending {
            Err(ips) => Ok(CniResult {
                ips: ips
                    .into_iter()
                    .map(|address| IpConfig {
                        address,
                        gateway: None,
                        interface: Some(2),
                    })
                    .collect(),
                ..CniResult::default()
            }),
            Ok(p) => p.result(),
        };
        let give_back = || match &ipam {
            Some(ipam) => ipam.run(&ipam.runner(), call, "DEL").map(drop),
            None => Ok(()),
        };
        let attach_pod = |k: &mut Live, node: ForPod, allocated: CniResult| {
            let ips: Vec<IpNet> = allocated.ips.iter().map(|ip| ip.address).collect();
            let entry = attachment(call, &cfg);
            let mut routes = cfg.routes.clone();
            routes.extend(entry.map(|a| a.routes.clone()).unwrap_or_default());
            routes.extend(allocated.routes);
            let (namespace, pod_name) = pod_of(call);
            let iface = Iface {
                mac: wanted_mac.unwrap_or_else(|| {
                    pod::kept_mac(
                        &ips,
                        &cfg.name,
                        cfg.vni,
                        &format!("{namespace}/{pod_name}"),
                        &call.env.ifname,
                    )
                }),
                ips,
                routes,
                up: entry.and_then(|a| a.up).unwrap_or(cfg.up),
                mtu: node.ready.mtu,
            };
            attach(k.sock, call, &cfg, &node.bridge, &host, iface).map(|mut r| {
                r.ips = allocated
                    .ips
                    .into_iter()
                    .map(|ip| IpConfig {
                        interface: Some(2),
                        ..ip
                    })
                    .collect();
                r.dns = allocated.dns;
                r
            })
        };
        let decision = after_ipam(ready, allocated);
        pods::settle(
            &mut Live { sock: &mut sock },
            &host,
            decision,
            attach_pod,
            give_back,
        )
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        // The veth goes even if the config is broken; IPAM DEL runs even if removing the veth
        // failed; a config or IPAM error is reported before a netlink one.
        let host = host_veth_name(&call.env.container_id, &call.env.ifname);
        // IPAM DEL runs while the veth is removed.
        let pending = config(call).and_then(|cfg| match addressing_late(call, &cfg)? {
            Addressing::Ipam(ipam) => Ok(Some(ipam.start(&ipam.runner(), call, "DEL")?)),
            Addressing::Fixed(_) => Ok(None),
        });
        let removed = remove_link(&host).map_err(Error::from);
        let released = pending.and_then(|p| match p {
            Some(p) => p.wait().map(drop).map_err(|e| Error::Vxlan(e.into())),
            None => Ok(()),
        });
        released.and(removed)
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        crate::vxlan::pod::check_attachment(call, &cfg.bridge())?;
        if let Addressing::Ipam(ipam) = addressing_late(call, &cfg)? {
            ipam.run(&ipam.runner(), call, "CHECK")?;
        }
        Ok(())
    }

    /// As the main mode: this network's veths (found by their alias) whose attachment is not
    /// in the runtime's valid list go, then GC is forwarded to IPAM.
    fn gc(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        let removed = match crate::cni::attachments::valid_attachments(&call.conf.raw)
            .map_err(crate::vxlan::Error::from)?
        {
            Some(valid) => Ok(remove_stale_veths(&cfg.name, &valid)?),
            None => Ok(()),
        };
        let released = match &cfg.ipam_type {
            Some(t) => {
                let ipam = match addressing_late(call, &cfg)? {
                    Addressing::Ipam(ipam) => ipam,
                    Addressing::Fixed(_) => Ipam::verbatim(call, t),
                };
                ipam.run(&ipam.runner(), call, "GC")
                    .map(drop)
                    .map_err(Error::from)
            }
            None => Ok(()),
        };
        removed.and(released)
    }

    /// Ready when this node can be worked out as one of the segment's (and its slice cut),
    /// and IPAM says so.
    fn status(&self, call: &Call) -> Result<(), Error> {
        let not_ready = |e: Error| Error::Vxlan(crate::vxlan::Error::NotReady(Box::new(e)));
        let cfg = config(call).map_err(not_ready)?;
        let ranges = ranges(&cfg).map_err(not_ready)?;
        if let Some(t) = &cfg.ipam_type {
            let ipam = Ipam {
                plugin_type: t.clone(),
                stdin: ipam_stdin(call, ranges.as_ref()),
            };
            ipam.run(&ipam.runner(), call, "STATUS")?;
        }
        Ok(())
    }
}

/// Everything after the addresses are known; on error the caller rolls back.
fn attach(
    sock: &mut Socket,
    call: &Call,
    cfg: &Config,
    bridge: &link::Link,
    host: &str,
    iface: Iface,
) -> Result<CniResult, Error> {
    let netns = Path::new(&call.env.netns);
    let alias = host_alias(&cfg.name, &call.env.container_id, &call.env.ifname);
    let host_link = pod::create_veth(
        sock,
        netns,
        (host, &alias),
        &call.env.ifname,
        &iface,
        bridge,
    )?;
    let container = pod::configure_container(netns, &call.env.ifname, &iface)?;
    Ok(CniResult {
        interfaces: result_interfaces(
            bridge,
            &host_link,
            &container,
            (&call.env.ifname, &call.env.netns),
            iface.mtu,
        ),
        ips: Vec::new(),
        routes: iface.routes,
        dns: Default::default(),
    })
}
