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
//!
//! The veth is the main mode's ([`sticky_overlay::pods::Pods`]), made while IPAM works, and
//! what is rolled back when is the main mode's one decision ([`after_ipam`]).

use std::path::Path;

use ipnet::IpNet;
use serde_json::Value;

use super::attachments::{self, Attachment};
use super::config::Config;
use super::pod;
use super::reconcile::{self, ForPod};
use super::{Error, slice};
use crate::delegate::{Ipam, Runner};
use cni_protocol::delegate::Exec;
use cni_protocol::{Call, CniResult, IpConfig, Plugin};
use sticky_netlink::Socket;
use sticky_netlink::link::{Link, parse_mac};
use sticky_overlay::kernel::{Kernel, Live};
use sticky_overlay::pod::{host_alias, host_veth_name, result_interfaces};
use sticky_overlay::pods::{self, LiveOnDemand, Pods, Setup, Veth, after_ipam};

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

/// This node's slice, when it can still be worked out.
fn node_slice(cfg: &Config) -> Option<Value> {
    ranges(cfg).ok().flatten()
}

/// [`addressing`] for DEL, CHECK and GC: the slice (from `slice`) only when it is needed;
/// sticky-ipam finds an allocation without ranges.
fn addressing_late(
    call: &Call,
    cfg: &Config,
    slice: impl FnOnce(&Config) -> Option<Value>,
) -> Result<Addressing, Error> {
    let ranges = match cfg.node_slice {
        Some(_) => slice(cfg),
        None => None,
    };
    addressing(call, cfg, ranges.as_ref())
}

impl Plugin for Segment {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let cfg = config(call)?;
        let mut sock = Socket::open()?;
        let exec = Runner::for_type(cfg.ipam_type.as_deref().unwrap_or_default());
        add(&exec, &mut Live { sock: &mut sock }, call, &cfg)
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        del(
            call,
            &mut LiveOnDemand::default(),
            Runner::for_type,
            node_slice,
        )
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        sticky_overlay::pod::check_attachment(call, &cfg.bridge())?;
        if let Addressing::Ipam(ipam) = addressing_late(call, &cfg, node_slice)? {
            ipam.run(&ipam.runner(), call, "CHECK")?;
        }
        Ok(())
    }

    /// As the main mode: this network's veths (found by their alias) whose attachment is not
    /// in the runtime's valid list go, then GC is forwarded to IPAM.
    fn gc(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        let removed = match cni_protocol::attachments::valid_attachments(&call.conf.raw)
            .map_err(sticky_overlay::Error::from)?
        {
            Some(valid) => Ok(sticky_overlay::pod::remove_stale_veths(&cfg.name, &valid)?),
            None => Ok(()),
        };
        let released = match &cfg.ipam_type {
            Some(t) => {
                let ipam = match addressing_late(call, &cfg, node_slice)? {
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
        let not_ready = |e: Error| Error::Vxlan(sticky_overlay::Error::NotReady(Box::new(e)));
        let cfg = config(call).map_err(not_ready)?;
        cfg.check_fixed_addresses()
            .map_err(|e| not_ready(e.into()))?;
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

/// ADD: the node (first when IPAM needs its slice), IPAM (fixed addresses need none) while
/// the veth is made, then the container end once the addresses are known; any failure rolls
/// back as [`after_ipam`] decides.
fn add<E: Exec, K: Kernel + Pods>(
    exec: &E,
    k: &mut K,
    call: &Call,
    cfg: &Config,
) -> Result<CniResult, Error> {
    cfg.check_fixed_addresses()?;
    let wanted_mac = requested_mac(call)?;
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let netns = Path::new(&call.env.netns);
    let (namespace, pod_name) = pod_of(call);
    let pod = format!("{namespace}/{pod_name}");
    let mac_for = |ips: &[IpNet]| {
        wanted_mac.unwrap_or_else(|| pod::kept_mac(ips, &cfg.name, cfg.vni, &pod, &call.env.ifname))
    };
    let node_work = |k: &mut K| -> Result<ForPod, Error> {
        let node = reconcile::for_pod(k, cfg)?;
        // A leftover from an earlier, interrupted ADD of the same attachment.
        k.delete_veth(&host)?;
        Ok(node)
    };
    // The node first when IPAM needs its slice; otherwise IPAM runs while the segment's
    // devices and flood entries are brought up to date and the veth is made.
    let early = match cfg.node_slice {
        Some(_) => Some(node_work(k)?),
        None => None,
    };
    let ranges = early.as_ref().and_then(|n| n.ready.ranges.as_ref());
    let (ipam, pending) = match addressing(call, cfg, ranges)? {
        Addressing::Fixed(ips) => (None, Err(ips)),
        Addressing::Ipam(ipam) => {
            let pending = ipam.start(exec, call, "ADD")?;
            (Some(ipam), Ok(pending))
        }
    };
    // When the MAC is known before IPAM has answered, the container end is made with it.
    let known_mac = match &pending {
        Err(fixed) => Some(mac_for(fixed)),
        Ok(_) => wanted_mac,
    };
    let ready = match early {
        Some(node) => Ok(node),
        None => node_work(k),
    };
    let ready = ready.and_then(|node| {
        let host_link = k.create_veth(&Veth {
            netns,
            host: &host,
            alias: host_alias(&cfg.name, &call.env.container_id, &call.env.ifname),
            ifname: &call.env.ifname,
            mtu: node.ready.mtu,
            bridge: node.bridge.index,
            hairpin: false,
            mac: known_mac,
            ipv6_off: true,
        })?;
        Ok((node, host_link))
    });
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
        Some(ipam) => ipam.run(exec, call, "DEL").map(drop),
        None => Ok(()),
    };
    let attach = |k: &mut K, (node, host_link): (ForPod, Link), allocated: CniResult| {
        let ips: Vec<IpNet> = allocated.ips.iter().map(|ip| ip.address).collect();
        let entry = attachment(call, cfg);
        let mut routes = cfg.routes.clone();
        routes.extend(entry.map(|a| a.routes.clone()).unwrap_or_default());
        routes.extend(allocated.routes);
        // Announce the (kept) MAC when the link comes up, so neighbours update at once.
        let v4 = ips.iter().any(|ip| ip.addr().is_ipv4());
        let container = k.enter(netns, &call.env.ifname, v4)?;
        let container = k.configure(
            container,
            &Setup {
                mac: Some(mac_for(&ips)),
                addresses: &ips,
                up: entry.and_then(|a| a.up).unwrap_or(cfg.up),
                routes: &routes,
            },
        )?;
        Ok(CniResult {
            interfaces: result_interfaces(
                &node.bridge,
                &host_link,
                &container,
                (&call.env.ifname, &call.env.netns),
                node.ready.mtu,
            ),
            ips: allocated
                .ips
                .into_iter()
                .map(|ip| IpConfig {
                    interface: Some(2),
                    ..ip
                })
                .collect(),
            routes,
            dns: allocated.dns,
        })
    };
    pods::settle(k, &host, after_ipam(ready, allocated), attach, give_back)
}

/// DEL: the veth goes even if the config is broken; IPAM DEL runs (while the veth is
/// removed) even if removing the veth failed; a config or IPAM error is reported before a
/// netlink one. `runner` runs the IPAM plugin of a type; `slice` works out this node's slice
/// of the IPAM ranges when the config cuts one.
fn del<E: Exec, P: Pods>(
    call: &Call,
    veths: &mut P,
    runner: impl FnOnce(&str) -> E,
    slice: impl FnOnce(&Config) -> Option<Value>,
) -> Result<(), Error> {
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let pending = config(call).and_then(|cfg| match addressing_late(call, &cfg, slice)? {
        Addressing::Ipam(ipam) => Ok(Some(ipam.start(&runner(&ipam.plugin_type), call, "DEL")?)),
        Addressing::Fixed(_) => Ok(None),
    });
    let removed = veths.delete_veth(&host).map_err(Error::from);
    let released = pending.and_then(|p| match p {
        Some(p) => p.wait().map(drop).map_err(Error::from),
        None => Ok(()),
    });
    released.and(removed)
}

#[cfg(test)]
mod tests {
    //! ADD, DEL and their rollbacks through the fakes: the node (`Fake`), the pod's side
    //! (`fake_pods`) and IPAM (`FakeIpam`).

    use super::*;
    use cni_protocol::delegate::Error as Delegate;
    use serde_json::json;
    use sticky_overlay::fake::Fake;
    use sticky_overlay::fake_pods::{FakeIpam, NETNS, call};

    /// Segment `vxeth1` (VNI 101) on nodes 192.0.2.1 (this one) and .2, with `extra` keys.
    fn segment(dir: &tempfile::TempDir, extra: Value) -> (Value, Config) {
        let mut doc = json!({"cniVersion": "1.0.0", "name": "vxeth1", "type": "sticky-vxlan",
            "mode": "segment", "vni": 101, "stateDir": dir.path(),
            "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                      {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]}]});
        for (k, v) in extra.as_object().unwrap() {
            doc[k] = v.clone();
        }
        let cfg = Config::from_json("vxeth1", &doc).unwrap();
        (doc, cfg)
    }

    const POD: &str = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p-1";

    fn ipam_section() -> Value {
        json!({"ipam": {"type": "host-local", "subnet": "192.168.11.0/24"}})
    }

    fn handing_out(address: &str) -> FakeIpam {
        FakeIpam::handing_out(json!({"cniVersion": "1.0.0", "ips": [{"address": address}]}))
    }

    /// ADD of pod `default/p-1` on a fresh node, with the fake failing at `fail`.
    fn add_with(
        ipam: &FakeIpam,
        extra: Value,
        fail: Option<&str>,
    ) -> (Result<CniResult, Error>, Fake) {
        let dir = tempfile::tempdir().unwrap();
        let (doc, cfg) = segment(&dir, extra);
        let mut k = Fake::node("192.0.2.1/24");
        k.fail = fail.map(|f| (f.to_string(), 17));
        let result = add(ipam, &mut k, &call("ADD", &doc, POD, dir.path()), &cfg);
        (result, k)
    }

    fn host() -> String {
        host_veth_name("c1", "eth0")
    }

    fn no_veth(k: &Fake) -> bool {
        k.seen.link(&host()).is_none() && k.container(NETNS, "eth0").is_none()
    }

    fn wrote(k: &Fake, prefix: &str) -> bool {
        k.writes.iter().any(|w| w.starts_with(prefix))
    }

    #[test]
    fn a_pod_with_fixed_addresses_is_attached_without_ipam_its_veth_made_with_its_kept_mac() {
        let ipam = FakeIpam::failing(11);
        let fixed = json!({"attachments": [{"pod": "p-*", "ips": ["192.168.11.2/24"],
                                            "routes": [{"dst": "198.51.100.0/24"}]}]});
        let (result, k) = add_with(&ipam, fixed, None);
        let result = result.unwrap();
        assert!(ipam.commands().is_empty(), "no IPAM section: no IPAM");
        let bridge = k.seen.link("segbr101").unwrap().index;
        let host_end = k.seen.link(&host()).unwrap();
        assert_eq!(host_end.master, Some(bridge));
        assert!(host_end.up);
        assert_eq!(
            host_end.alias.as_deref(),
            Some("sticky-vxlan vxeth1 c1 eth0")
        );
        assert!(
            wrote(&k, &format!("disable ipv6 {}", host())),
            "the node stays off the segment: {:?}",
            k.writes
        );
        let pod = k.container(NETNS, "eth0").unwrap();
        assert_eq!(pod.link.mac, Some([0x0e, 1, 192, 168, 11, 2]));
        assert!(!wrote(&k, "set eth0 mac"), "made with it: {:?}", k.writes);
        assert!(wrote(&k, "arp_notify eth0"));
        assert_eq!(pod.addresses, ["192.168.11.2/24".parse::<IpNet>().unwrap()]);
        assert!(pod.link.up);
        assert!(wrote(&k, "add route 198.51.100.0/24 on eth0"));
        assert_eq!(result.ips[0].address.to_string(), "192.168.11.2/24");
        assert_eq!(result.ips[0].interface, Some(2));
        assert_eq!(result.interfaces[0].name, "segbr101");
        assert_eq!(result.interfaces[1].mtu, Some(1450));
        assert_eq!(result.routes.len(), 1);
    }

    #[test]
    fn an_l2_only_pod_left_down_gets_no_address_no_route_and_no_arp_notify() {
        let ipam = FakeIpam::failing(11);
        let down = json!({"up": false, "routes": [{"dst": "198.51.100.0/24"}]});
        let (result, k) = add_with(&ipam, down, None);
        result.unwrap();
        let pod = k.container(NETNS, "eth0").unwrap();
        assert_eq!(pod.link.mac.unwrap()[..2], pod::L2_PREFIX);
        assert!(!pod.link.up);
        assert!(pod.addresses.is_empty());
        for never in ["arp_notify", "set eth0 up", "add route"] {
            assert!(!wrote(&k, never), "{never}: {:?}", k.writes);
        }
    }

    #[test]
    fn an_ipam_pods_veth_is_made_while_ipam_works_and_gets_its_mac_once_it_has_answered() {
        let ipam = handing_out("192.168.11.5/24");
        let (result, k) = add_with(&ipam, ipam_section(), None);
        result.unwrap();
        assert_eq!(ipam.commands(), ["ADD"]);
        let pod = k.container(NETNS, "eth0").unwrap();
        assert_eq!(pod.link.mac, Some([0x0e, 1, 192, 168, 11, 5]));
        let at = |prefix: &str| k.writes.iter().position(|w| w.starts_with(prefix));
        assert!(at("set eth0 mac 0e:01:c0:a8:0b:05") < at("set eth0 up"));
    }

    #[test]
    fn with_a_node_slice_ipam_gets_this_nodes_slice_of_the_ranges() {
        let ipam = handing_out("192.168.11.130/24");
        let mut extra = ipam_section();
        extra["nodeSlice"] = json!(25);
        let (result, _) = add_with(&ipam, extra, None);
        result.unwrap();
        assert_eq!(
            ipam.stdin_of("ADD")["ipam"]["ranges"],
            json!([[{"subnet": "192.168.11.0/24",
                     "rangeStart": "192.168.11.129", "rangeEnd": "192.168.11.254"}]])
        );
    }

    #[test]
    fn a_segment_ipam_failure_leaves_no_veth_and_gives_nothing_back() {
        let ipam = FakeIpam::failing(11);
        let (result, k) = add_with(&ipam, ipam_section(), None);
        assert!(
            matches!(
                &result,
                Err(Error::Vxlan(sticky_overlay::Error::Ipam(
                    Delegate::Failed { code: 11, .. }
                )))
            ),
            "{result:?}"
        );
        assert_eq!(ipam.commands(), ["ADD"]);
        assert!(no_veth(&k), "{:?}", k.writes);
    }

    #[test]
    fn a_segment_veth_or_container_that_fails_after_ipam_allocated_gives_the_address_back() {
        for step in [
            "create veth",
            "enter",
            "set eth0 mac",
            "add address",
            "add route",
        ] {
            let ipam = handing_out("192.168.11.5/24");
            let mut extra = ipam_section();
            extra["routes"] = json!([{"dst": "198.51.100.0/24"}]);
            let (result, k) = add_with(&ipam, extra, Some(step));
            assert!(result.is_err(), "{step}");
            assert_eq!(ipam.commands(), ["ADD", "DEL"], "{step}");
            assert!(no_veth(&k), "{step}: {:?}", k.writes);
        }
    }

    #[test]
    fn a_fixed_address_pod_whose_container_fails_loses_its_veth_and_calls_no_ipam() {
        let ipam = FakeIpam::failing(11);
        let fixed = json!({"attachments": [{"pod": "p-1", "ips": ["192.168.11.2/24"]}]});
        let (result, k) = add_with(&ipam, fixed, Some("add address"));
        assert!(result.is_err());
        assert!(ipam.commands().is_empty());
        assert!(no_veth(&k), "{:?}", k.writes);
    }

    /// DEL of pod `default/p-1` whose veth [`add_with`] made, with `doc` on stdin.
    fn del_with(doc: &Value, ipam: &FakeIpam, fail: Option<&str>) -> (Result<(), Error>, Fake) {
        let dir = tempfile::tempdir().unwrap();
        let (_, k) = add_with(&handing_out("192.168.11.5/24"), ipam_section(), None);
        let mut k = Fake {
            fail: fail.map(|f| (f.to_string(), 16)),
            ..k
        };
        assert!(k.seen.link(&host()).is_some());
        let c = call("DEL", doc, POD, dir.path());
        let result = del(&c, &mut k, |_| ipam.clone(), |_| None);
        (result, k)
    }

    #[test]
    fn segment_del_removes_the_veth_even_when_the_config_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        let (mut doc, _) = segment(&dir, ipam_section());
        doc["vni"] = json!("one");
        let ipam = FakeIpam::handing_out(Value::Null);
        let (result, k) = del_with(&doc, &ipam, None);
        assert!(result.is_err());
        assert!(no_veth(&k));
        assert!(ipam.commands().is_empty());
    }

    #[test]
    fn segment_del_runs_ipam_del_even_when_the_veth_cannot_be_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (doc, _) = segment(&dir, ipam_section());
        let ipam = FakeIpam::handing_out(Value::Null);
        let (result, _) = del_with(&doc, &ipam, Some("delete link"));
        assert!(
            matches!(&result, Err(Error::Vxlan(sticky_overlay::Error::Link(_)))),
            "{result:?}"
        );
        assert_eq!(ipam.commands(), ["DEL"]);
    }

    #[test]
    fn segment_del_of_a_fixed_address_pod_runs_no_ipam() {
        let dir = tempfile::tempdir().unwrap();
        let (doc, _) = segment(
            &dir,
            json!({"ipam": {"type": "host-local", "subnet": "192.168.11.0/24"},
                   "attachments": [{"pod": "p-1", "ips": ["192.168.11.2/24"]}]}),
        );
        let ipam = FakeIpam::handing_out(Value::Null);
        let (result, k) = del_with(&doc, &ipam, None);
        result.unwrap();
        assert!(no_veth(&k));
        assert!(ipam.commands().is_empty());
    }
}
