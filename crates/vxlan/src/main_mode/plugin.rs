//! The CNI commands of `sticky-vxlan`.
//!
//! ADD reads the config once ([`Config`]), opens one netlink socket for the host namespace
//! and keeps it for the node ([`reconcile::run_with`]), the veth and any rollback; the pod's
//! namespace gets one socket of its own, opened while IPAM works ([`Pods::enter`]) and used
//! once it has answered ([`Pods::configure`]). What to do when IPAM or the node fails is one
//! pure decision, [`after_ipam`], carried out by [`pods::settle`]; the segment mode shares
//! both.

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use super::reconcile::{self, ForPod};
use crate::delegate::{Ipam, Runner};
use cni_protocol::delegate::Exec;
use cni_protocol::{Call, CniResult, IpConfig, Plugin, attachments};
use sticky_netlink::Socket;
use sticky_netlink::link::Link;
use sticky_overlay::Error;
use sticky_overlay::config::Config;
use sticky_overlay::kernel::{Kernel, Live};
use sticky_overlay::node::{self, Observed};
use sticky_overlay::pod::gateway_of;
use sticky_overlay::pod::{self, host_veth_name};
use sticky_overlay::pods::{self, LiveOnDemand, Pods, Setup, Veth, after_ipam};

pub(crate) struct MainMode;

fn config(call: &Call) -> Result<Config, Error> {
    Config::from_json(&call.conf.name, &call.conf.raw).map_err(Error::from)
}

impl Plugin for MainMode {
    type Error = Error;

    fn add(&self, call: &Call) -> Result<CniResult, Error> {
        let cfg = config(call)?;
        let mut sock = Socket::open()?;
        let exec = Runner::for_type(&cfg.ipam_type);
        add(&exec, &mut Live { sock: &mut sock }, call, &cfg)
    }

    fn del(&self, call: &Call) -> Result<(), Error> {
        del(
            call,
            &mut LiveOnDemand::default(),
            Runner::for_type,
            |cfg| local_subnets(&mut Socket::open()?, call, cfg),
        )
    }

    fn check(&self, call: &Call) -> Result<(), Error> {
        let cfg = config(call)?;
        pod::check_attachment(call, &cfg.bridge)?;
        let mut sock = Socket::open()?;
        let ipam = Ipam::for_call(call, &cfg, || local_subnets(&mut sock, call, &cfg))?;
        ipam.run(&ipam.runner(), call, "CHECK")?;
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
            Some(valid) => pod::remove_stale_veths(&cfg.name, &valid),
            None => Ok(()),
        };
        let mut sock = Socket::open()?;
        let released = Ipam::for_call(call, &cfg, || local_subnets(&mut sock, call, &cfg))
            .and_then(|ipam| ipam.run(&ipam.runner(), call, "GC"))
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
                node::resolve(&mut k, &cfg, &seen, &node::peer_list(&cfg)?)
            })
            .and_then(|node| node.check(cfg.vni).map(|()| node))
            .map_err(not_ready)?;
        let ipam =
            Ipam::for_call(call, &cfg, || Ok(node.local.subnets.clone())).map_err(not_ready)?;
        ipam.run(&ipam.runner(), call, "STATUS")?;
        Ok(())
    }
}

/// ADD: the node, the pod's veth pair and its namespace's socket, and IPAM (concurrently when
/// IPAM does not need the node's subnets; else IPAM works while the veth is made), then the
/// pod's MAC, addresses and routes; any failure after IPAM may have allocated rolls back.
fn add<E: Exec, K: Kernel + Pods>(
    exec: &E,
    k: &mut K,
    call: &Call,
    cfg: &Config,
) -> Result<CniResult, Error> {
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let netns = Path::new(&call.env.netns);
    let node_work = |k: &mut K| -> Result<ForPod, Error> {
        let node = reconcile::for_pod(k, cfg)?;
        // A leftover from an earlier, interrupted ADD of the same attachment.
        k.delete_veth(&host)?;
        Ok(node)
    };
    let veth = |k: &mut K, report: ForPod| -> Result<(ForPod, Link, K::Container), Error> {
        let host_link = k.create_veth(&Veth {
            netns,
            host: &host,
            alias: pod::host_alias(&cfg.name, &call.env.container_id, &call.env.ifname),
            ifname: &call.env.ifname,
            mtu: report.ready.mtu,
            bridge: report.bridge.index,
            hairpin: cfg.hairpin_mode,
            mac: None,
            ipv6_off: false,
        })?;
        sticky_primitives::crash::point("vxlan add: veth created");
        let container = k.enter(netns, &call.env.ifname, true)?;
        Ok((report, host_link, container))
    };
    let (ipam, node, result) = if cfg.ranges_from_peers {
        // The node's own subnets are the IPAM ranges: the node first.
        let report = node_work(k)?;
        let ipam = Ipam::with_ranges(call, &cfg.ipam_type, &report.ready.subnets);
        let pending = ipam.start(exec, call, "ADD")?;
        sticky_primitives::crash::point("vxlan add: node ready");
        let node = veth(k, report);
        (ipam, node, pending.result())
    } else {
        // IPAM runs while the node's VTEP, bridge and peers are brought up to date.
        let ipam = Ipam::verbatim(call, &cfg.ipam_type);
        let pending = ipam.start(exec, call, "ADD")?;
        let node = node_work(k).and_then(|report| {
            sticky_primitives::crash::point("vxlan add: node ready");
            veth(k, report)
        });
        (ipam, node, pending.result())
    };
    let give_back = || ipam.run(exec, call, "DEL").map(drop);
    let attach_pod =
        |k: &mut K, (report, host_link, container): (ForPod, Link, K::Container), result| {
            attach(k, call, cfg, &report, (&host_link, container), &result)
        };
    pods::settle(k, &host, after_ipam(node, result), attach_pod, give_back)
}

/// DEL. Removing the host end removes the pair, wherever the other end is; a missing link
/// (DEL twice, netns already gone) is success. The veth goes even if the config or the IPAM
/// plugin is broken, and IPAM DEL runs even if removing the veth failed, so nothing leaks; a
/// config or IPAM error is reported before a netlink one. `runner` runs the IPAM plugin of a
/// type; `subnets` works out this node's subnets when the config wants them.
///
/// The kernel takes tens of milliseconds to tear a veth down (its unregister waits for RCU
/// grace periods, asleep), and the netlink request blocks the thread that sends it until
/// then: the removal runs on a thread of its own so that IPAM is started, and does its work,
/// meanwhile. DEL then costs little more than the teardown itself.
fn del<E: Exec, P: Pods + Send>(
    call: &Call,
    veths: &mut P,
    runner: impl FnOnce(&str) -> E,
    subnets: impl FnOnce(&Config) -> Result<Vec<IpNet>, Error>,
) -> Result<(), Error> {
    let host = host_veth_name(&call.env.container_id, &call.env.ifname);
    let (released, removed) = std::thread::scope(|scope| {
        let removing = std::thread::Builder::new()
            .name("veth del".into())
            .spawn_scoped(scope, || veths.delete_veth(&host));
        let released = release(call, runner, subnets);
        let removed = removing.ok().map(|thread| {
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        (released, removed)
    });
    // No thread to be had: the same work, one after the other.
    let removed = removed.unwrap_or_else(|| veths.delete_veth(&host));
    released.and(removed)
}

/// DEL's IPAM half: the section IPAM needs (this node's subnets when the config wants them,
/// else [`Ipam::for_release`]), run to its answer.
fn release<E: Exec>(
    call: &Call,
    runner: impl FnOnce(&str) -> E,
    subnets: impl FnOnce(&Config) -> Result<Vec<IpNet>, Error>,
) -> Result<(), Error> {
    let cfg = config(call)?;
    // When the node's subnets cannot be worked out any more (its peer entry removed, no
    // prevResult), IPAM still gets what it needs to release; a DEL that cannot succeed
    // would block the pod forever.
    let ipam = Ipam::for_call(call, &cfg, || subnets(&cfg))
        .unwrap_or_else(|_| Ipam::for_release(call, &cfg));
    ipam.run(&runner(&ipam.plugin_type), call, "DEL").map(drop)
}

/// This node's pod subnets, for an IPAM section without ranges: from the stamp of the last
/// full reconcile while it holds, else from the peer list, or, when
/// the node cannot be worked out (a DEL after the underlay went away), from the addresses of
/// the previous result.
fn local_subnets(sock: &mut Socket, call: &Call, cfg: &Config) -> Result<Vec<IpNet>, Error> {
    let mut k = Live { sock };
    // What the last full reconcile left, while it holds: no peer list read at all.
    if let Ok(Some(node)) = reconcile::stamped(&mut k, cfg) {
        return Ok(node.ready.subnets);
    }
    let resolved = Observed::read_for_node(&mut k)
        .and_then(|seen| node::resolve(&mut k, cfg, &seen, &node::peer_list(cfg)?))
        .map(|node| node.local.subnets);
    let from_prev = || -> Option<Vec<IpNet>> {
        let prev = call.conf.prev_result.as_ref()?;
        let nets: Vec<IpNet> = prev.ips.iter().map(|ip| ip.address.trunc()).collect();
        (!nets.is_empty()).then_some(nets)
    };
    resolved.or_else(|e| from_prev().ok_or(e))
}

/// Pure: the IPAM gateways the bridge needs besides the ones the node's plan gives it (the
/// first address of each of its subnets, [`gateway_of`]): a gateway other than its subnet's
/// first address still has to answer on the bridge. Each with its subnet's prefix.
pub(crate) fn extra_gateways(ips: &[IpConfig]) -> Vec<IpNet> {
    ips.iter()
        .filter_map(|ip| {
            let subnet = ip.address.trunc();
            let gw = ip.gateway.filter(|gw| Some(*gw) != gateway_of(&subnet))?;
            IpNet::new(gw, subnet.prefix_len()).ok()
        })
        .collect()
}

/// Everything after IPAM ADD; on error the caller rolls back.
fn attach<K: Kernel + Pods>(
    k: &mut K,
    call: &Call,
    cfg: &Config,
    report: &ForPod,
    (host_link, container): (&Link, K::Container),
    ipam: &CniResult,
) -> Result<CniResult, Error> {
    let bridge = &report.bridge;
    let mtu = report.ready.mtu;
    let own = &report.ready.subnets;
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
    // The bridge's addresses are read only when it may lack one (seldom: host-local hands out
    // the first address by default).
    let extra = extra_gateways(&ipam.ips);
    if !extra.is_empty() {
        let have = k.addresses()?;
        for net in extra
            .into_iter()
            .filter(|net| !have.contains(&(bridge.index, *net)))
        {
            k.add_address(bridge.index, net)?;
        }
    }
    let routes = pod::pod_routes(&ipam.ips, &ipam.routes, cfg.is_default_gateway);
    let addresses: Vec<IpNet> = ipam.ips.iter().map(|ip| ip.address).collect();
    let container = k.configure(
        container,
        &Setup {
            mac: pod::container_mac(&ipam.ips),
            addresses: &addresses,
            up: true,
            routes: &pod::with_gateways(&routes, &ipam.ips),
        },
    )?;
    Ok(CniResult {
        interfaces: pod::result_interfaces(
            bridge,
            host_link,
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
    use cni_protocol::delegate::Error as Delegate;

    fn ip(address: &str, gateway: Option<&str>) -> IpConfig {
        IpConfig {
            address: address.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            interface: None,
        }
    }

    #[test]
    fn only_a_gateway_other_than_the_subnets_first_address_is_extra() {
        // What host-local hands out by default: the plan already put these on the bridge,
        // so ADD does not read the bridge's addresses.
        let usual = [
            ip("10.244.1.5/24", Some("10.244.1.1")),
            ip("fd00:1::5/64", Some("fd00:1::1")),
            ip("10.244.9.5/24", None),
        ];
        assert!(extra_gateways(&usual).is_empty());
        let other = [
            ip("10.244.1.5/24", Some("10.244.1.254")),
            ip("fd00:1::5/64", Some("fd00:1::fe")),
        ];
        assert_eq!(
            extra_gateways(&other),
            vec![
                "10.244.1.254/24".parse::<IpNet>().unwrap(),
                "fd00:1::fe/64".parse().unwrap()
            ]
        );
    }

    mod add_and_del {
        //! ADD, DEL and their rollbacks through the fakes: the node ([`Fake`]), the pod's
        //! side (`fake_pods`) and IPAM ([`FakeIpam`]).

        use super::*;
        use serde_json::{Value, json};
        use sticky_overlay::fake::Fake;
        use sticky_overlay::fake_pods::{FakeIpam, NETNS, call};

        /// This node (192.0.2.1, 10.244.1.0/24) and one peer; `ipam` as the IPAM section.
        fn network(dir: &tempfile::TempDir, ipam: Value) -> (Value, Config) {
            let doc = json!({"cniVersion": "1.0.0", "name": "edge", "type": "sticky-vxlan",
                "vni": 1, "ipam": ipam, "isDefaultGateway": true, "stateDir": dir.path(),
                "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                          {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]}]});
            let cfg = Config::from_json("edge", &doc).unwrap();
            (doc, cfg)
        }

        fn handing_out(address: &str) -> FakeIpam {
            FakeIpam::handing_out(json!({"cniVersion": "1.0.0",
                "ips": [{"address": address, "gateway": "10.244.1.1"}]}))
        }

        /// ADD with `ipam` on a fresh node; the node's kernel and pod side afterwards.
        fn add_with(
            ipam: &FakeIpam,
            section: Value,
            fail: Option<&str>,
        ) -> (Result<CniResult, Error>, Fake) {
            let dir = tempfile::tempdir().unwrap();
            let (doc, cfg) = network(&dir, section);
            let mut k = Fake::node("192.0.2.1/24");
            k.fail = fail.map(|f| (f.to_string(), 17));
            let result = add(ipam, &mut k, &call("ADD", &doc, "", dir.path()), &cfg);
            (result, k)
        }

        fn host() -> String {
            host_veth_name("c1", "eth0")
        }

        /// No veth of this attachment is left, on the host or in the pod.
        fn no_veth(k: &Fake) -> bool {
            k.seen.link(&host()).is_none() && k.container(NETNS, "eth0").is_none()
        }

        fn position(k: &Fake, prefix: &str) -> usize {
            k.writes
                .iter()
                .position(|w| w.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix:?} in {:?}", k.writes))
        }

        #[test]
        fn an_add_gives_the_pod_its_veth_kept_mac_addresses_and_routes() {
            let ipam = handing_out("10.244.1.5/24");
            let (result, k) = add_with(&ipam, json!({"type": "host-local"}), None);
            let result = result.unwrap();
            // The ranges are this node's subnets, filled in from its peer entry.
            assert_eq!(
                ipam.stdin_of("ADD")["ipam"]["ranges"],
                json!([[{"subnet": "10.244.1.0/24"}]])
            );
            assert_eq!(ipam.commands(), ["ADD"]);
            let bridge = k.seen.link("stickybr0").unwrap().index;
            let host_end = k.seen.link(&host()).unwrap();
            assert_eq!(host_end.master, Some(bridge));
            assert!(host_end.up);
            assert_eq!(host_end.alias.as_deref(), Some("sticky-vxlan edge c1 eth0"));
            let pod = k.container(NETNS, "eth0").unwrap();
            assert_eq!(pod.link.mac, Some([0x0e, 1, 10, 244, 1, 5]));
            assert!(pod.link.up);
            assert_eq!(pod.addresses, ["10.244.1.5/24".parse::<IpNet>().unwrap()]);
            // Made down, its MAC set before it comes up, then addresses, up, routes.
            let order = [
                "create veth",
                "enter",
                "arp_notify",
                "set eth0 mac 0e:01:0a:f4:01:05",
                "add address 10.244.1.5/24",
                "set eth0 up",
                "add route 0.0.0.0/0 via 10.244.1.1 on eth0",
            ]
            .map(|w| position(&k, w));
            assert!(order.is_sorted(), "{:?}", k.writes);
            let names: Vec<&str> = result.interfaces.iter().map(|i| i.name.as_str()).collect();
            assert_eq!(names, ["stickybr0", host().as_str(), "eth0"]);
            assert_eq!(result.interfaces[2].sandbox.as_deref(), Some(NETNS));
            assert_eq!(result.ips[0].interface, Some(2));
        }

        #[test]
        fn an_ipam_failure_leaves_no_veth_and_gives_nothing_back() {
            for section in [
                json!({"type": "host-local"}),
                json!({"type": "host-local", "subnet": "10.244.1.0/24"}),
            ] {
                let ipam = FakeIpam::failing(11);
                let (result, k) = add_with(&ipam, section, None);
                assert!(
                    matches!(result, Err(Error::Ipam(Delegate::Failed { code: 11, .. }))),
                    "{result:?}"
                );
                assert!(no_veth(&k), "{:?}", k.writes);
                assert_eq!(ipam.commands(), ["ADD"], "nothing was allocated");
            }
        }

        #[test]
        fn a_veth_that_cannot_be_made_after_ipam_allocated_gives_the_address_back() {
            let ipam = handing_out("10.244.1.5/24");
            let (result, k) = add_with(&ipam, json!({"type": "host-local"}), Some("create veth"));
            assert!(matches!(result, Err(Error::Link(_))), "{result:?}");
            assert_eq!(ipam.commands(), ["ADD", "DEL"]);
            assert!(no_veth(&k));
            assert!(
                k.writes
                    .last()
                    .is_some_and(|w| *w == format!("delete link {}", host())),
                "whatever was made of the pair is removed: {:?}",
                k.writes
            );
        }

        #[test]
        fn a_container_that_cannot_be_configured_rolls_back_the_veth_and_the_allocation() {
            for step in [
                "enter",
                "set eth0 mac",
                "add address 10.244.1.5",
                "add route",
            ] {
                let ipam = handing_out("10.244.1.5/24");
                let (result, k) = add_with(&ipam, json!({"type": "host-local"}), Some(step));
                assert!(result.is_err(), "{step}");
                assert_eq!(ipam.commands(), ["ADD", "DEL"], "{step}");
                assert!(no_veth(&k), "{step}: {:?}", k.writes);
            }
        }

        #[test]
        fn an_answer_from_ipam_that_cannot_be_read_is_given_back() {
            let ipam = FakeIpam::printing_garbage();
            let (result, k) = add_with(&ipam, json!({"type": "host-local"}), None);
            assert!(
                matches!(result, Err(Error::Ipam(Delegate::Output { .. }))),
                "{result:?}"
            );
            assert_eq!(ipam.commands(), ["ADD", "DEL"]);
            assert!(no_veth(&k));
        }

        #[test]
        fn an_address_outside_this_nodes_subnets_is_refused_and_given_back() {
            let ipam = handing_out("10.244.2.5/24");
            let section = json!({"type": "host-local", "subnet": "10.244.2.0/24"});
            let (result, k) = add_with(&ipam, section, None);
            assert!(
                matches!(result, Err(Error::ForeignAddress { .. })),
                "{result:?}"
            );
            assert_eq!(ipam.commands(), ["ADD", "DEL"]);
            assert!(no_veth(&k));
        }

        #[test]
        fn a_node_that_cannot_be_reconciled_gives_back_what_ipam_allocated_meanwhile() {
            let ipam = handing_out("10.244.1.5/24");
            let section = json!({"type": "host-local", "subnet": "10.244.1.0/24"});
            // This node is not 192.0.2.1: no peer entry names it.
            let dir = tempfile::tempdir().unwrap();
            let (doc, cfg) = network(&dir, section);
            let mut k = Fake::node("198.51.100.1/24");
            let result = add(&ipam, &mut k, &call("ADD", &doc, "", dir.path()), &cfg);
            assert!(result.is_err());
            assert_eq!(ipam.commands(), ["ADD", "DEL"]);
            assert!(no_veth(&k));
        }

        /// DEL of the attachment that [`add_with`] made, with `doc` on stdin.
        fn del_with(
            doc: &Value,
            ipam: &FakeIpam,
            fail: Option<&str>,
            subnets: Result<Vec<IpNet>, Error>,
        ) -> (Result<(), Error>, Fake) {
            let dir = tempfile::tempdir().unwrap();
            let (_, k) = add_with(&handing_out("10.244.1.5/24"), doc["ipam"].clone(), None);
            let mut k = Fake {
                fail: fail.map(|f| (f.to_string(), 16)),
                ..k
            };
            assert!(k.seen.link(&host()).is_some());
            let c = call("DEL", doc, "", dir.path());
            let result = del(&c, &mut k, |_| ipam.clone(), |_| subnets);
            (result, k)
        }

        #[test]
        fn del_removes_the_veth_even_when_the_config_is_broken() {
            let dir = tempfile::tempdir().unwrap();
            let (mut doc, _) = network(&dir, json!({"type": "host-local"}));
            doc["vni"] = json!("one");
            let ipam = FakeIpam::handing_out(Value::Null);
            let (result, k) = del_with(&doc, &ipam, None, Ok(vec![]));
            assert!(matches!(result, Err(Error::Config(_))), "{result:?}");
            assert!(no_veth(&k));
            assert!(ipam.commands().is_empty());
        }

        #[test]
        fn del_runs_ipam_del_even_when_the_veth_cannot_be_removed() {
            let dir = tempfile::tempdir().unwrap();
            let (doc, _) = network(&dir, json!({"type": "host-local"}));
            let ipam = FakeIpam::handing_out(Value::Null);
            let subnets = Ok(vec!["10.244.1.0/24".parse().unwrap()]);
            let (result, _) = del_with(&doc, &ipam, Some("delete link"), subnets);
            assert!(matches!(result, Err(Error::Link(_))), "{result:?}");
            assert_eq!(ipam.commands(), ["DEL"]);
            assert_eq!(
                ipam.stdin_of("DEL")["ipam"]["ranges"],
                json!([[{"subnet": "10.244.1.0/24"}]])
            );
        }

        #[test]
        fn del_reports_ipams_error_first_and_releases_without_this_nodes_subnets() {
            let dir = tempfile::tempdir().unwrap();
            let (doc, _) = network(&dir, json!({"type": "host-local"}));
            let ipam = FakeIpam::handing_out(Value::Null).failing_del();
            let gone = Err(Error::NoRemotePeer);
            let (result, k) = del_with(&doc, &ipam, Some("delete link"), gone);
            assert!(
                matches!(result, Err(Error::Ipam(Delegate::Failed { code: 11, .. }))),
                "{result:?}"
            );
            assert!(k.seen.link(&host()).is_some(), "its removal failed");
            // host-local is handed a range it only parses: it releases by container id.
            assert_eq!(
                ipam.stdin_of("DEL")["ipam"]["ranges"],
                json!([[{"subnet": "192.0.2.0/24"}]])
            );
        }
    }
}
