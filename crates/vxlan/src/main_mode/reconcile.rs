//! Reconciling a node: the one entry point that brings the VTEP, the bridge, the peers, the
//! sysctls and the nftables rules to what a config says. `sticky-vxlan reconcile`, every ADD
//! and the node agent all go through [`run()`] (or [`run_with`] with a kernel of their own).
//!
//! Read once ([`Observed`]), decide ([`plan::plan`], pure), apply ([`apply::apply`]); all of
//! it under the network's lock in `stateDir`, so parallel ADDs never race to create the VTEP
//! and reconcile peers one at a time.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::apply::{self, Devices};
use super::plan::{self, Plan};
use sticky_netlink::Socket;
use sticky_netlink::link::Link;
use sticky_overlay::config::Config;
use sticky_overlay::kernel::{Kernel, Live};
use sticky_overlay::node::{self, LocalNode, Observed};
use sticky_overlay::{Error, stamp};

/// What a reconcile did and found.
#[derive(Debug, Clone)]
pub struct Report {
    pub node: LocalNode,
    /// The VTEP and the bridge as they are now (MAC, MTU, index).
    pub vtep: Link,
    pub bridge: Link,
    /// What was changed (empty when the node was already as configured).
    pub plan: Plan,
}

impl Report {
    /// Why the peers file could not be used, if it could not (then nothing was removed).
    pub fn peers_file_error(&self) -> Option<&str> {
        self.node.peers_file_error.as_deref()
    }
}

/// Reconciles the node (the network namespace of the calling thread) exactly as
/// `sticky-vxlan reconcile --config` does: this is the stable entry point for callers outside
/// the CNI path (the node agent).
pub fn run(cfg: &Config) -> Result<Report, Error> {
    let mut sock = Socket::open()?;
    run_with(&mut Live { sock: &mut sock }, cfg)
}

/// [`run()`] through a given kernel.
pub(crate) fn run_with(k: &mut impl Kernel, cfg: &Config) -> Result<Report, Error> {
    let _guard = cfg.lock()?;
    full(k, cfg)
}

/// What a pod ADD needs of the node: its address, subnets and MTU, and the bridge.
#[derive(Debug, Clone)]
pub struct ForPod {
    pub ready: Ready,
    pub bridge: Link,
}

/// ADD's way to the node: when the last full reconcile's stamp still holds (nothing a reboot,
/// an upgrade, a new peers file or a hand on the node changes has changed), what
/// [`stamped`] reads; otherwise a full reconcile ([`stamp`] says what is checked and what is
/// left to the resync). Under the network's lock either way.
pub(crate) fn for_pod(k: &mut impl Kernel, cfg: &Config) -> Result<ForPod, Error> {
    let _guard = cfg.lock()?;
    if let Some(node) = stamped(k, cfg)? {
        return Ok(node);
    }
    let report = full(k, cfg)?;
    Ok(ForPod {
        ready: ready_of(&report.node),
        bridge: report.bridge,
    })
}

/// What the last full reconcile's stamp says, if it still holds ([`stamp`]: three link
/// lookups, at most two address requests, the forwarding sysctls and a `stat`); `None` when
/// a full reconcile is needed. DEL, CHECK and GC take this node's subnets from it too, so
/// none of them reads the peer list while it holds.
pub fn stamped(k: &mut impl Kernel, cfg: &Config) -> Result<Option<ForPod>, Error> {
    let held = stamp_file(cfg).holding(k, (&cfg.vtep_name, &cfg.bridge))?;
    Ok(held.map(|(ready, bridge)| ForPod { ready, bridge }))
}

/// What an ADD needs of the node, as the stamp keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub local_ip: IpAddr,
    /// This node's own pod subnets.
    pub subnets: Vec<IpNet>,
    /// The MTU of the VTEP, the bridge and every pod interface.
    pub mtu: u32,
}

fn ready_of(node: &LocalNode) -> Ready {
    Ready {
        local_ip: node.local_ip,
        subnets: node.local.subnets.clone(),
        mtu: node.mtu,
    }
}

/// The network's stamp: `<stateDir>/<network>.stamp`, checked against the settings that shape
/// the node's programming (not those of one pod: IPAM, the default route, hairpin).
pub(super) fn stamp_file(cfg: &Config) -> stamp::StampFile<'_> {
    let shaping = format!(
        "{:?} {:?}",
        (
            &cfg.name,
            cfg.vni,
            cfg.port,
            &cfg.device,
            cfg.local_ip,
            &cfg.vtep_name,
            &cfg.bridge,
        ),
        (
            cfg.mtu,
            cfg.ip_masq,
            cfg.cluster_cidr,
            cfg.peer_only_port,
            &cfg.peers,
            &cfg.peers_file,
            &cfg.state_dir,
        )
    );
    stamp::StampFile {
        path: cfg.state_dir.join(format!("{}.stamp", cfg.name)),
        settings: stamp::hash(shaping.as_bytes()),
        peers_file: cfg.peers_file.as_deref(),
    }
}

/// Read, plan, apply; then stamp what it left. The caller holds the lock.
pub(super) fn full(k: &mut impl Kernel, cfg: &Config) -> Result<Report, Error> {
    let stamp_file = stamp_file(cfg);
    let before = stamp_file.before();
    let peers = node::peer_list(cfg)?;
    let copy = cfg.last_good_peers_path();
    // Read before the copy is replaced: it may be the file the last reconcile applied.
    let fdb = node::fdb_read(cfg.vni, stamp_file.applied(), &peers, &copy);
    // The file that was used is kept for when it cannot be: here, under the lock, in the
    // open (working the node out only reads).
    peers.keep_last_good(&copy);
    let seen = Observed::read(k, cfg, &fdb)?;
    let node = node::resolve(k, cfg, &seen, &peers)?;
    node.check(cfg.vni)?;
    let plan = plan::plan(cfg, &node, &seen).map_err(|e| name_device(k, e))?;
    let Devices { vtep, bridge } = apply::apply(k, cfg, &plan, &seen)?;
    let depends = depends_of(&node, &plan);
    stamp_file.after(
        &before,
        (&vtep, &bridge, &node.underlay),
        depends,
        ready_of(&node),
    );
    Ok(Report {
        node,
        vtep,
        bridge,
        plan,
    })
}

/// What the node's pods depend on beyond the devices, as the plan just set it: this node's
/// own `/32`s on the VTEP, the gateways on the bridge, the forwarding sysctls.
fn depends_of(node: &LocalNode, plan: &Plan) -> stamp::Depends {
    let (vtep_addresses, bridge_addresses) = plan::local_addresses(node);
    let sysctls = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            plan::Step::Sysctl { key, value } => Some((key.clone(), value.clone())),
            _ => None,
        })
        .collect();
    stamp::Depends {
        vtep_addresses,
        bridge_addresses,
        sysctls,
    }
}

/// A foreign route's device, named for the error when the plan had not read that link.
fn name_device(k: &mut impl Kernel, e: Error) -> Error {
    match e {
        Error::ForeignRoute {
            route,
            device: None,
        } => {
            let device = route
                .oif
                .and_then(|i| k.link_at(i).ok().flatten())
                .map(|l| l.name);
            Error::ForeignRoute { route, device }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::main_mode::plan::Step;
    use serde_json::json;
    use sticky_overlay::fake::{Fake, conf};

    /// This node (192.0.2.1) and one peer, state in a temp dir kept alive by the caller.
    fn two_nodes() -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = conf(json!({
            "stateDir": dir.path(),
            "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                      {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]}]
        }));
        (dir, cfg)
    }

    #[test]
    fn the_entry_point_resolves_plans_and_applies_under_the_lock_and_converges() {
        let (dir, cfg) = two_nodes();
        let mut k = Fake::node("192.0.2.1/24");
        let report = run_with(&mut k, &cfg).unwrap();
        assert!(dir.path().join("edge.lock").exists());
        assert_eq!(report.node.local_ip.to_string(), "192.0.2.1");
        assert_eq!(report.node.remote.len(), 1);
        assert_eq!(report.vtep.mac, Some([0x0a, 1, 192, 0, 2, 1]));
        assert_eq!(
            report.bridge.mac,
            Some([0x0e, 1, 10, 244, 1, 1]),
            "the bridge as it is after the plan"
        );
        assert!(report.peers_file_error().is_none());
        // Something rewrote the bridge's MAC: the report has the repaired one (ADD's result
        // reports it), not the one read before the repair.
        k.link_mut("stickybr0").mac = Some([2, 0, 0, 0, 0, 0x99]);
        let repaired = run_with(&mut k, &cfg).unwrap();
        assert_eq!(repaired.bridge.mac, Some([0x0e, 1, 10, 244, 1, 1]));
        let again = run_with(&mut k, &cfg).unwrap();
        assert!(
            again
                .plan
                .steps
                .iter()
                .all(|s| matches!(s, Step::Sysctl { .. } | Step::RemoveTables { .. })),
            "{:?}",
            again.plan
        );
    }

    fn dumps(k: &Fake) -> usize {
        k.queries.iter().filter(|q| q.starts_with("dump")).count()
    }

    #[test]
    fn an_add_after_a_full_reconcile_reads_no_table_until_something_changes() {
        let (dir, cfg) = two_nodes();
        let mut k = Fake::node("192.0.2.1/24");
        let first = for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0, "the first ADD reconciles in full");
        assert!(dir.path().join("edge.stamp").exists());
        k.queries.clear();
        let writes = k.writes.len();
        let again = for_pod(&mut k, &cfg).unwrap();
        assert_eq!(dumps(&k), 0, "{:?}", k.queries);
        assert_eq!(k.writes.len(), writes, "nothing written");
        assert_eq!(again.ready, first.ready);
        assert_eq!(again.bridge.index, first.bridge.index);
        // The VTEP deleted (a reboot, `ip link del`): the next ADD reconciles in full.
        let gone = k.seen.link("sticky.1").unwrap().index;
        // The kernel takes the device's routes and entries with it.
        k.seen.links.retain(|l| l.index != gone);
        k.seen.routes.retain(|r| r.oif != Some(gone));
        k.seen.addresses.retain(|(i, _)| *i != gone);
        k.fdb.retain(|f| f.index != gone);
        k.neighbours.retain(|n| n.index != gone);
        k.queries.clear();
        for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0);
        assert!(k.seen.link("sticky.1").is_some(), "made again");
        // The underlay's MTU lowered: in full, and the new MTU for the pod.
        let underlay = k.seen.links.iter().position(|l| l.name == "eth0").unwrap();
        k.seen.links[underlay].mtu = Some(1400);
        k.queries.clear();
        let lower = for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0);
        assert_eq!(lower.ready.mtu, 1350);
        // The stamp lost (a reboot empties /run): in full.
        std::fs::remove_file(dir.path().join("edge.stamp")).unwrap();
        k.queries.clear();
        for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0);
    }

    #[test]
    fn an_add_reconciles_in_full_when_a_setting_its_pods_depend_on_changed_and_repairs_it() {
        let (_dir, cfg) = two_nodes();
        let mut k = Fake::node("192.0.2.1/24");
        for_pod(&mut k, &cfg).unwrap();
        let vtep = |k: &mut Fake| -> sticky_netlink::link::VxlanInfo {
            k.link_mut("sticky.1").vxlan.clone().unwrap()
        };
        let made = vtep(&mut k);
        let on = |k: &Fake, dev: &str, net: &str| {
            let index = k.seen.link(dev).unwrap().index;
            k.seen.addresses_of(index).contains(&net.parse().unwrap())
        };
        let off = |k: &mut Fake, dev: &str, net: &str| {
            let index = k.seen.link(dev).unwrap().index;
            let net: IpNet = net.parse().unwrap();
            k.seen.addresses.retain(|a| *a != (index, net));
        };
        type Break = Box<dyn Fn(&mut Fake)>;
        type Back = Box<dyn Fn(&mut Fake) -> bool>;
        let tunnel = |edit: fn(&mut sticky_netlink::link::VxlanInfo)| -> Break {
            Box::new(move |k| edit(k.link_mut("sticky.1").vxlan.as_mut().unwrap()))
        };
        let same = {
            let made = made.clone();
            move || -> Back {
                let made = made.clone();
                Box::new(move |k| vtep(k) == made)
            }
        };
        let cases: Vec<(&str, Break, Back)> = vec![
            (
                "local",
                tunnel(|v| v.local = Some("192.0.2.9".parse().unwrap())),
                same(),
            ),
            ("learning", tunnel(|v| v.learning = Some(true)), same()),
            ("ttl", tunnel(|v| v.ttl = Some(1)), same()),
            ("underlay", tunnel(|v| v.underlay = Some(99)), same()),
            (
                "the bridge's gateway",
                Box::new(move |k| off(k, "stickybr0", "10.244.1.1/24")),
                Box::new(move |k| on(k, "stickybr0", "10.244.1.1/24")),
            ),
            (
                "the VTEP's own /32",
                Box::new(move |k| off(k, "sticky.1", "10.244.1.0/32")),
                Box::new(move |k| on(k, "sticky.1", "10.244.1.0/32")),
            ),
            (
                "ip_forward",
                Box::new(|k| {
                    k.sysctls.insert("net/ipv4/ip_forward".into(), "0".into());
                }),
                Box::new(|k| k.sysctls["net/ipv4/ip_forward"] == "1"),
            ),
        ];
        for (what, breaks, back) in cases {
            breaks(&mut k);
            assert!(!back(&mut k), "{what}");
            k.queries.clear();
            for_pod(&mut k, &cfg).unwrap();
            assert!(dumps(&k) > 0, "{what}: not noticed");
            assert!(back(&mut k), "{what}: not repaired");
            // Repaired and stamped: the next ADD reads no table.
            k.queries.clear();
            for_pod(&mut k, &cfg).unwrap();
            assert_eq!(dumps(&k), 0, "{what}: {:?}", k.queries);
        }
    }

    #[test]
    fn a_changed_peers_file_is_programmed_by_the_next_add() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.json");
        let write = |peers: &str| {
            let tmp = dir.path().join("new");
            std::fs::write(&tmp, peers).unwrap();
            std::fs::rename(&tmp, &file).unwrap();
        };
        write(
            r#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]},{"ip":"192.0.2.2","subnets":["10.244.2.0/24"]}]"#,
        );
        let cfg = conf(json!({"stateDir": dir.path(), "peersFile": file}));
        let mut k = Fake::node("192.0.2.1/24");
        for_pod(&mut k, &cfg).unwrap();
        k.queries.clear();
        for_pod(&mut k, &cfg).unwrap();
        assert_eq!(dumps(&k), 0, "the file is the one reconciled");
        write(
            r#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]},{"ip":"192.0.2.3","subnets":["10.244.3.0/24"]}]"#,
        );
        k.queries.clear();
        for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0, "a new file: in full");
        assert!(
            k.writes.iter().any(|w| w.contains("10.244.3.0/24")),
            "{:?}",
            k.writes
        );
        // Rewritten in place within the same clock tick, same size: the content says so.
        let same_size = std::fs::read_to_string(&file)
            .unwrap()
            .replace("192.0.2.3", "192.0.2.4")
            .replace("10.244.3.", "10.244.4.");
        std::fs::write(&file, same_size).unwrap();
        k.queries.clear();
        for_pod(&mut k, &cfg).unwrap();
        assert!(dumps(&k) > 0);
        assert!(
            k.writes.iter().any(|w| w.contains("10.244.4.0/24")),
            "{:?}",
            k.writes
        );
    }

    #[test]
    fn working_out_the_node_writes_nothing_and_the_reconcile_keeps_the_peers_file_it_used() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.json");
        let text = r#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]},{"ip":"192.0.2.2","subnets":["10.244.2.0/24"]}]"#;
        std::fs::write(&file, text).unwrap();
        let cfg = conf(json!({"stateDir": dir.path(), "peersFile": file}));
        let copy = cfg.last_good_peers_path();
        let mut k = Fake::node("192.0.2.1/24");
        // What DEL, CHECK, GC and STATUS do: read, and write nothing.
        let seen = Observed::read_for_node(&mut k).unwrap();
        let peers = node::peer_list(&cfg).unwrap();
        assert!(peers.file_error.is_none());
        let found = node::resolve(&mut k, &cfg, &seen, &peers).unwrap();
        assert_eq!(found.remote.len(), 1);
        assert!(!copy.exists(), "reading never writes");
        // The reconcile keeps it, and falls back on it once the file is broken.
        run_with(&mut k, &cfg).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
        std::fs::write(&file, "[{\"ip\": ").unwrap();
        let report = run_with(&mut k, &cfg).unwrap();
        assert!(report.peers_file_error().is_some());
        assert_eq!(report.node.remote.len(), 1, "the last good copy stands in");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
    }

    #[test]
    fn a_foreign_routes_device_is_named_though_its_link_was_not_read() {
        let (_dir, cfg) = two_nodes();
        let mut k = Fake::node("192.0.2.1/24");
        let eth1 = k.add_link("eth1", "veth");
        k.seen.routes.push(sticky_netlink::route::Route {
            dst: "10.244.2.0/24".parse().unwrap(),
            gateway: Some("198.51.100.254".parse().unwrap()),
            oif: Some(eth1),
            onlink: false,
            metric: 0,
            protocol: 3,
        });
        let seen = Observed::read(&mut k, &cfg, &sticky_overlay::node::FdbRead::Whole).unwrap();
        assert!(seen.link("eth1").is_none(), "a plain link is not read");
        let err = run_with(&mut k, &cfg).unwrap_err();
        assert!(
            matches!(&err, Error::ForeignRoute { device: Some(d), .. } if d == "eth1"),
            "{err}"
        );
        assert!(err.to_string().contains("(dev eth1)"), "{err}");
        assert!(k.writes.is_empty(), "{:?}", k.writes);
    }
}
