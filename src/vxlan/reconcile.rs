//! Reconciling a node: the one entry point that brings the VTEP, the bridge, the peers, the
//! sysctls and the nftables rules to what a config says. `sticky-vxlan reconcile`, every ADD
//! and the node agent all go through [`node()`] (or [`node_with`] with a kernel of their own).
//!
//! Read once ([`Observed`]), decide ([`plan::plan`], pure), apply ([`apply::apply`]); all of
//! it under the network's lock in `stateDir`, so parallel ADDs never race to create the VTEP
//! and reconcile peers one at a time.

use super::apply::{self, Devices};
use super::config::Config;
use super::kernel::{Kernel, Live};
use super::node::{self, Node, Observed};
use super::plan::{self, Plan};
use super::{Error, state_dir};
use crate::netlink::Socket;
use crate::netlink::link::Link;

/// What a reconcile did and found.
#[derive(Debug, Clone)]
pub struct Report {
    pub node: Node,
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
pub fn node(cfg: &Config) -> Result<Report, Error> {
    let mut sock = Socket::open()?;
    node_with(&mut Live { sock: &mut sock }, cfg)
}

/// [`node()`] through a given kernel (ADD passes the socket it keeps using for the pod).
pub fn node_with(k: &mut impl Kernel, cfg: &Config) -> Result<Report, Error> {
    let _guard = state_dir::lock(cfg)?;
    let seen = Observed::read(k, &cfg.vtep_name, &cfg.bridge)?;
    let node = node::resolve(k, cfg, &seen)?;
    node.check(cfg.vni)?;
    let plan = plan::plan(cfg, &node, &seen).map_err(|e| name_device(k, e))?;
    let Devices { vtep, bridge } = apply::apply(k, cfg, &plan, &seen)?;
    Ok(Report {
        node,
        vtep,
        bridge,
        plan,
    })
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
    use crate::vxlan::fake::{Fake, conf};
    use crate::vxlan::plan::Step;
    use serde_json::json;

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
        let report = node_with(&mut k, &cfg).unwrap();
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
        let repaired = node_with(&mut k, &cfg).unwrap();
        assert_eq!(repaired.bridge.mac, Some([0x0e, 1, 10, 244, 1, 1]));
        let again = node_with(&mut k, &cfg).unwrap();
        assert!(
            again
                .plan
                .steps
                .iter()
                .all(|s| matches!(s, Step::Sysctl { .. })),
            "{:?}",
            again.plan
        );
    }

    #[test]
    fn a_foreign_routes_device_is_named_though_its_link_was_not_read() {
        let (_dir, cfg) = two_nodes();
        let mut k = Fake::node("192.0.2.1/24");
        let eth1 = k.add_link("eth1", "veth");
        k.seen.routes.push(crate::netlink::route::Route {
            dst: "10.244.2.0/24".parse().unwrap(),
            gateway: Some("198.51.100.254".parse().unwrap()),
            oif: Some(eth1),
            onlink: false,
            protocol: 3,
        });
        let seen = Observed::read(&mut k, &cfg.vtep_name, &cfg.bridge).unwrap();
        assert!(seen.link("eth1").is_none(), "a plain link is not read");
        let err = node_with(&mut k, &cfg).unwrap_err();
        assert!(
            matches!(&err, Error::ForeignRoute { device: Some(d), .. } if d == "eth1"),
            "{err}"
        );
        assert!(err.to_string().contains("(dev eth1)"), "{err}");
        assert!(k.writes.is_empty(), "{:?}", k.writes);
    }
}
