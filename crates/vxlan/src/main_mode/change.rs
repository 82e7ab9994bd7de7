//! A change of the peers file programmed as a change (issue 37): the node agent writes the
//! file and knows which peers it changed ([`FileChange`]). While the last reconcile's stamp
//! still holds but for the file, and says the node was programmed from the very file the
//! change starts from, only those peers' entries are written: their FDB entries, neighbours
//! and routes, and nothing is dumped. The kernel work grows with the change, not the cluster
//! (one peer among 100,000: its few entries, a route lookup per new subnet and the three link
//! lookups of the stamp).
//!
//! What this does not look at (an entry deleted by hand, a flushed table) is the full
//! reconcile's, as for the stamp: the agent's periodic resync repairs it. Whatever this cannot
//! prove (no stamp, another file applied since, this node's own entry changed, a route of
//! someone else's on a new subnet, a peer-only rule whose addresses change, the first IPv6
//! subnet) is a full reconcile, under the same lock.

use std::net::IpAddr;

use foldhash::{HashMap, HashSet};
use ipnet::IpNet;

use super::apply;
use super::plan::{Desired, Plan, Step, metric_for, route_for};
use super::reconcile::{self, Ready, Report};
use sticky_netlink::Socket;
use sticky_overlay::kernel::{Kernel, Live};
use sticky_overlay::node::Observed;
use sticky_overlay::peers::{self, Peer};
use sticky_overlay::stamp::{self, FileId};
use sticky_overlay::{Error, ROUTE_PROTOCOL};

/// One peer that changed: as it was (`None`: new) and as it is (`None`: gone).
pub type PeerChange = (Option<Peer>, Option<Peer>);

/// The peers file as its writer just replaced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// The content hash ([`stamp::hash`]) of the file it replaced.
    pub from_hash: String,
    /// The file's bytes as written, and its identity right after the write.
    pub text: Vec<u8>,
    pub id: FileId,
    /// Every peer that differs between the two files.
    pub peers: Vec<PeerChange>,
}

/// How a change was programmed.
#[derive(Debug)]
pub enum Changed {
    /// Only the changed peers' entries: this many writes.
    Entries(usize),
    /// The file was already programmed (an ADD reconciled it in full meanwhile).
    Already,
    /// In full, for the reason given.
    Full(&'static str, Box<Report>),
}

/// Programs `change` in the node's namespace: [`change_with`] through the kernel.
pub fn change(cfg: &sticky_overlay::config::Config, change: &FileChange) -> Result<Changed, Error> {
    let mut sock = Socket::open()?;
    change_with(&mut Live { sock: &mut sock }, cfg, change)
}

/// Programs `change` as a change when the stamp proves it may be, in full otherwise; under the
/// network's lock either way.
pub(crate) fn change_with(
    k: &mut impl Kernel,
    cfg: &sticky_overlay::config::Config,
    change: &FileChange,
) -> Result<Changed, Error> {
    let _guard = cfg.lock()?;
    match entries(k, cfg, change)? {
        Ok(changed) => Ok(changed),
        Err(why) => Ok(Changed::Full(why, Box::new(reconcile::full(k, cfg)?))),
    }
}

/// The change written entry by entry, or why it cannot be.
fn entries(
    k: &mut impl Kernel,
    cfg: &sticky_overlay::config::Config,
    change: &FileChange,
) -> Result<Result<Changed, &'static str>, Error> {
    let file = reconcile::stamp_file(cfg);
    let Some(standing) = file.standing::<Ready>(k, (&cfg.vtep_name, &cfg.bridge))? else {
        return Ok(Err("no stamp holds"));
    };
    let Some(path) = cfg.peers_file.as_deref() else {
        return Ok(Err("no peers file"));
    };
    if FileId::of(path) != Some(change.id) {
        return Ok(Err("the peers file changed again"));
    }
    if standing.peers_hash() == Some(stamp::hash(&change.text).as_str()) {
        return Ok(Ok(Changed::Already));
    }
    if standing.peers_hash() != Some(change.from_hash.as_str()) {
        return Ok(Err("another peers file was programmed last"));
    }
    if let Err(why) = provable(cfg, standing.ready(), &change.peers, |key| {
        standing.sets(key)
    }) {
        return Ok(Err(why));
    }
    let vtep = standing.vtep.index;
    let (was, is) = desired(cfg.vni, &change.peers);
    for dst in new_routes(&was, &is) {
        let theirs = k
            .route_on(dst)?
            .is_some_and(|r| r.oif != Some(vtep) || r.protocol != ROUTE_PROTOCOL);
        if theirs {
            return Ok(Err("a route of someone else's on a new peer subnet"));
        }
    }
    let plan = Plan {
        steps: between(vtep, &was, &is),
    };
    let seen = Observed {
        links: vec![standing.vtep.clone(), standing.bridge.clone()],
        ..Observed::default()
    };
    apply::apply(k, cfg, &plan, &seen)?;
    peers::keep_last_good(&cfg.last_good_peers_path(), &change.text);
    file.moved_on(standing, (change.id, &change.text));
    Ok(Ok(Changed::Entries(plan.steps.len())))
}

/// Pure: why `changed` cannot be written as a change on a node stamped `ready`, if it cannot
/// (`sets`: whether the stamp counts a sysctl among those set).
fn provable(
    cfg: &sticky_overlay::config::Config,
    ready: &Ready,
    changed: &[PeerChange],
    sets: impl Fn(&str) -> bool,
) -> Result<(), &'static str> {
    if !cfg.peers.is_empty() {
        return Err("the config lists peers of its own");
    }
    let all = || changed.iter().flat_map(|(a, b)| a.iter().chain(b));
    if all().any(|p| p.ip == ready.local_ip) {
        return Err("this node's own entry changed");
    }
    let moved = changed
        .iter()
        .any(|(a, b)| a.as_ref().map(|p| p.ip) != b.as_ref().map(|p| p.ip));
    if cfg.peer_only_port && moved {
        return Err("the peer-only rule's addresses change");
    }
    let v6 = changed
        .iter()
        .filter_map(|(_, b)| b.as_ref())
        .flat_map(|p| &p.subnets)
        .any(|s| s.addr().is_ipv6());
    if v6 && !sets("net/ipv6/conf/all/forwarding") {
        return Err("the first IPv6 subnet");
    }
    Ok(())
}

/// The subnets routed to a changed peer now that were not routed to one before.
fn new_routes(was: &Desired, is: &Desired) -> Vec<IpNet> {
    let before: HashSet<IpNet> = was.routes.iter().map(|(d, _)| *d).collect();
    is.routes
        .iter()
        .map(|(d, _)| *d)
        .filter(|d| !before.contains(d))
        .collect()
}

fn desired(vni: u32, changed: &[PeerChange]) -> (Desired, Desired) {
    let (mut was, mut is) = (Desired::default(), Desired::default());
    for (before, after) in changed {
        if let Some(p) = before {
            was.add_peer(vni, p);
        }
        if let Some(p) = after {
            is.add_peer(vni, p);
        }
    }
    (was, is)
}

/// Pure: the steps that take the changed peers' entries on the VTEP `vtep` from those they
/// wanted (`was`) to those they want (`is`), in the full plan's order: what is no longer
/// wanted first (so a subnet that moved is cleared before its new peer takes it), then what is
/// new, then a route replaced by one of another metric (only once the new one is there).
fn between(vtep: u32, was: &Desired, is: &Desired) -> Vec<Step> {
    let is_routes: HashMap<IpNet, IpAddr> = is.routes.iter().copied().collect();
    let was_routes: HashSet<(IpNet, IpAddr)> = was.routes.iter().copied().collect();
    let is_neighbours: HashSet<(IpAddr, [u8; 6])> = is.neighbours.iter().copied().collect();
    let was_neighbours: HashSet<(IpAddr, [u8; 6])> = was.neighbours.iter().copied().collect();
    let is_fdb: HashSet<([u8; 6], IpAddr)> = is.fdb.iter().copied().collect();
    let was_fdb: HashSet<([u8; 6], IpAddr)> = was.fdb.iter().copied().collect();
    let mut steps = Vec::new();
    for &(dst, via) in &was.routes {
        if !is_routes.contains_key(&dst) {
            steps.push(Step::DeleteRoute(route_for(dst, via, vtep)));
        }
    }
    for &(ip, mac) in &was.neighbours {
        if !is_neighbours.contains(&(ip, mac)) {
            steps.push(Step::DeleteNeighbour { ip, mac });
        }
    }
    for &(mac, dst) in &was.fdb {
        if !is_fdb.contains(&(mac, dst)) {
            steps.push(Step::DeleteFdb { mac, dst });
        }
    }
    for &(mac, dst) in &is.fdb {
        if !was_fdb.contains(&(mac, dst)) {
            steps.push(Step::AddFdb { mac, dst });
        }
    }
    for &(ip, mac) in &is.neighbours {
        if !was_neighbours.contains(&(ip, mac)) {
            steps.push(Step::ReplaceNeighbour { ip, mac });
        }
    }
    for &(dst, via) in &is.routes {
        if !was_routes.contains(&(dst, via)) {
            steps.push(Step::ReplaceRoute { dst, via });
        }
    }
    for &(dst, via) in &was.routes {
        if is_routes
            .get(&dst)
            .is_some_and(|&now| metric_for(now) != metric_for(via))
        {
            steps.push(Step::DeleteRoute(route_for(dst, via, vtep)));
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::main_mode::reconcile::{for_pod, run_with};
    use serde_json::json;
    use sticky_overlay::config::Config;
    use sticky_overlay::fake::{Fake, conf, peer};
    use sticky_overlay::peers::PeerEntry;

    /// This node (192.0.2.1, 10.244.1.0/24) and `n` peers from 198.18.0.2, a /26 each of
    /// 10.64.0.0/10.
    fn peers(n: u32) -> Vec<Peer> {
        let mut all = vec![peer("192.0.2.1", "10.244.1.0/24")];
        for i in 0..n {
            let ip = std::net::Ipv4Addr::from(0xc612_0002 + i);
            let net = std::net::Ipv4Addr::from(0x0a40_0000 + (i << 6));
            all.push(peer(&ip.to_string(), &format!("{net}/26")));
        }
        all
    }

    fn text(peers: &[Peer]) -> Vec<u8> {
        let entries: Vec<PeerEntry> = peers
            .iter()
            .map(|p| PeerEntry {
                ip: p.ip,
                subnets: p.subnets.clone(),
                mac: None,
                carries: p.carries.clone(),
            })
            .collect();
        serde_json::to_vec(&entries).unwrap()
    }

    struct Node {
        _dir: tempfile::TempDir,
        cfg: Config,
        file: std::path::PathBuf,
        k: Fake,
        peers: Vec<Peer>,
    }

    impl Node {
        /// A node reconciled in full from a peers file of `n` peers.
        fn new(n: u32) -> Node {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("peers.json");
            let cfg = conf(json!({"stateDir": dir.path(), "peersFile": file}));
            let mut node = Node {
                _dir: dir,
                cfg,
                file,
                k: Fake::node("192.0.2.1/24"),
                peers: peers(n),
            };
            node.write(&node.peers.clone());
            run_with(&mut node.k, &node.cfg).unwrap();
            node
        }

        fn write(&self, peers: &[Peer]) {
            let tmp = self.file.with_extension("new");
            std::fs::write(&tmp, text(peers)).unwrap();
            std::fs::rename(&tmp, &self.file).unwrap();
        }

        /// The file written with `edit` applied to its peers, as the agent says it.
        fn change(&mut self, edit: impl FnOnce(&mut Vec<Peer>)) -> FileChange {
            let from_hash = stamp::hash(&text(&self.peers));
            let mut now = self.peers.clone();
            edit(&mut now);
            self.write(&now);
            let mut peers = Vec::new();
            for p in &self.peers {
                let after = now.iter().find(|q| q.ip == p.ip);
                if after != Some(p) {
                    peers.push((Some(p.clone()), after.cloned()));
                }
            }
            for q in now
                .iter()
                .filter(|q| !self.peers.iter().any(|p| p.ip == q.ip))
            {
                peers.push((None, Some(q.clone())));
            }
            self.peers = now;
            FileChange {
                from_hash,
                text: text(&self.peers),
                id: FileId::of(&self.file).unwrap(),
                peers,
            }
        }
    }

    fn steps(vni: u32, vtep: u32, changed: &[PeerChange]) -> Vec<Step> {
        let (was, is) = desired(vni, changed);
        between(vtep, &was, &is)
    }

    fn dumps(k: &Fake) -> usize {
        k.queries.iter().filter(|q| q.starts_with("dump")).count()
    }

    /// One peer moved to another subnet, one gone, one new.
    fn three(all: &mut Vec<Peer>) {
        all[5].subnets = vec!["10.200.0.0/26".parse().unwrap()];
        all.remove(7);
        all.push(peer("198.19.0.1", "10.201.0.0/26"));
    }

    #[test]
    fn a_change_writes_only_its_peers_entries_whatever_the_cluster_and_leaves_nothing_to_do() {
        let mut seen = Vec::new();
        for n in [50, 2_000] {
            let mut node = Node::new(n);
            let change = node.change(three);
            node.k.queries.clear();
            node.k.writes.clear();
            let done = change_with(&mut node.k, &node.cfg, &change).unwrap();
            assert!(matches!(done, Changed::Entries(10)), "{done:?}");
            assert_eq!(dumps(&node.k), 0, "{:?}", node.k.queries);
            seen.push((node.k.queries.clone(), node.k.writes.clone()));
            // What a full reconcile of the new file would still do: nothing but what it
            // always does.
            node.k.writes.clear();
            let report = run_with(&mut node.k, &node.cfg).unwrap();
            let entries: Vec<_> = report.plan.steps.iter().filter(|s| s.is_entry()).collect();
            assert!(entries.is_empty(), "{entries:?}");
            // And the stamp holds for the next ADD: no table read.
            node.k.queries.clear();
            for_pod(&mut node.k, &node.cfg).unwrap();
            assert_eq!(dumps(&node.k), 0, "{:?}", node.k.queries);
        }
        // The same requests at 50 peers as at 2,000.
        assert_eq!(seen[0], seen[1]);
        let (queries, writes) = &seen[0];
        assert_eq!(
            queries
                .iter()
                .filter(|q| q.starts_with("route on"))
                .collect::<Vec<_>>(),
            ["route on 10.200.0.0/26", "route on 10.201.0.0/26"]
        );
        assert_eq!(writes.len(), 10, "{writes:?}");
    }

    /// A site's failover as a member sees it: the other sites' subnets move from the gateway
    /// that failed to the one that took over.
    #[test]
    fn a_failover_moves_the_carried_subnets_and_leaves_nothing_to_do() {
        let mut node = Node::new(20);
        let carried: Vec<IpNet> = vec![
            "10.250.1.0/24".parse().unwrap(),
            "10.250.2.0/24".parse().unwrap(),
        ];
        node.peers[3].carries.clone_from(&carried);
        let first = node.peers.clone();
        node.write(&first);
        run_with(&mut node.k, &node.cfg).unwrap();
        let via = |k: &Fake, dst: &str| -> Vec<Option<IpAddr>> {
            let dst: IpNet = dst.parse().unwrap();
            k.seen
                .routes
                .iter()
                .filter(|r| r.dst == dst)
                .map(|r| r.gateway)
                .collect()
        };
        let gw = |i: usize| Some(node.peers[i].subnets[0].network());
        assert_eq!(via(&node.k, "10.250.1.0/24"), [gw(3)]);
        let change = node.change(|all| {
            all[3].carries.clear();
            all[4].carries.clone_from(&carried);
        });
        node.k.queries.clear();
        let done = change_with(&mut node.k, &node.cfg, &change).unwrap();
        assert!(matches!(done, Changed::Entries(4)), "{done:?}");
        assert_eq!(dumps(&node.k), 0, "{:?}", node.k.queries);
        let gw4 = Some(node.peers[4].subnets[0].network());
        assert_eq!(via(&node.k, "10.250.1.0/24"), [gw4]);
        assert_eq!(via(&node.k, "10.250.2.0/24"), [gw4]);
        node.k.writes.clear();
        let report = run_with(&mut node.k, &node.cfg).unwrap();
        let entries: Vec<_> = report.plan.steps.iter().filter(|s| s.is_entry()).collect();
        assert!(entries.is_empty(), "{entries:?}");
    }

    #[test]
    fn what_a_change_cannot_prove_is_reconciled_in_full() {
        let full = |node: &mut Node, change: &FileChange| {
            let done = change_with(&mut node.k, &node.cfg, change).unwrap();
            match done {
                Changed::Full(why, _) => why,
                other => panic!("{other:?}"),
            }
        };
        // The change does not start from the file the node was programmed from.
        let mut node = Node::new(20);
        let mut change = node.change(three);
        change.from_hash = stamp::hash(b"another file");
        assert_eq!(
            full(&mut node, &change),
            "another peers file was programmed last"
        );
        // Programmed now: the same change again is already there.
        let again = change_with(&mut node.k, &node.cfg, &change).unwrap();
        assert!(matches!(again, Changed::Already), "{again:?}");

        // This node's own entry changed.
        let mut node = Node::new(20);
        let change = node.change(|all| all[0].subnets = vec!["10.244.9.0/24".parse().unwrap()]);
        assert_eq!(full(&mut node, &change), "this node's own entry changed");

        // The file was written again since.
        let mut node = Node::new(20);
        let change = node.change(three);
        node.write(&peers(3));
        assert_eq!(full(&mut node, &change), "the peers file changed again");

        // No stamp (a reboot emptied /run).
        let mut node = Node::new(20);
        let change = node.change(three);
        std::fs::remove_file(node.cfg.state_dir.join(format!("{}.stamp", node.cfg.name))).unwrap();
        assert_eq!(full(&mut node, &change), "no stamp holds");
    }

    #[test]
    fn a_route_of_someone_elses_on_a_new_subnet_is_left_to_the_full_reconcile_which_refuses_it() {
        let mut node = Node::new(20);
        let change = node.change(three);
        let theirs = sticky_netlink::route::Route {
            dst: "10.201.0.0/26".parse().unwrap(),
            gateway: None,
            oif: Some(2),
            onlink: false,
            metric: 0,
            protocol: 4,
        };
        node.k.seen.routes.push(theirs.clone());
        node.k.writes.clear();
        let refused = change_with(&mut node.k, &node.cfg, &change).unwrap_err();
        assert!(
            matches!(&refused, Error::ForeignRoute { route, .. } if *route == theirs),
            "{refused}"
        );
        assert!(node.k.seen.routes.contains(&theirs));
        assert!(
            node.k.writes.iter().all(|w| !w.contains("10.201.0.0")),
            "{:?}",
            node.k.writes
        );
    }

    #[test]
    fn the_steps_clear_a_moved_subnet_before_its_new_peer_takes_it() {
        let a = peer("192.0.2.2", "10.244.2.0/24");
        let b = peer("192.0.2.3", "10.244.3.0/24");
        let mut a_now = a.clone();
        a_now.subnets = vec!["10.244.9.0/24".parse().unwrap()];
        let mut b_now = b.clone();
        b_now.subnets = vec!["10.244.2.0/24".parse().unwrap()];
        let steps = steps(1, 7, &[(Some(a), Some(a_now)), (Some(b), Some(b_now))]);
        let text: Vec<String> = steps.iter().map(|s| format!("{s:?}")).collect();
        let at = |what: &str| {
            text.iter()
                .position(|s| s.contains(what))
                .unwrap_or_else(|| panic!("{what} in {text:?}"))
        };
        // 10.244.2.0/24 goes from a to b: a's neighbour for it goes before b's comes. Its
        // route (via its own network address, whoever holds it) stays as it is.
        let deletes_a = at("DeleteNeighbour { ip: 10.244.2.0");
        let replaces_b = at("ReplaceNeighbour { ip: 10.244.2.0");
        assert!(deletes_a < replaces_b, "{text:?}");
        assert!(
            !text
                .iter()
                .any(|s| s.contains("Route") && s.contains("10.244.2.0/24")),
            "{text:?}"
        );
        // b's old subnet goes before anything is added; a's new one comes last.
        assert_eq!(at("DeleteRoute(Route { dst: 10.244.3.0/24"), 0, "{text:?}");
        assert_eq!(
            at("ReplaceRoute { dst: 10.244.9.0/24"),
            text.len() - 1,
            "{text:?}"
        );
    }
}
