//! Bringing a segment's bridge, VXLAN device and flood entries on this node to what the peers
//! say: at a pod ADD ([`for_pod`], flat in the number of nodes while the stamp holds), from
//! `sticky-vxlan reconcile --config <file>` ([`network`]: at boot, before kubelet starts pods,
//! or after the peers file changed) and from the node agent's resync.
//!
//! As in the main mode ([`sticky_overlay::stamp`]), a full reconcile ends by stamping what it
//! left and what a pod needs (this node's address, the MTU, its slice of the IPAM ranges); an
//! ADD then checks the stamp with three link lookups and a `stat` (the VXLAN device's local
//! address, learning, port, TTL, underlay device and bridge among what the lookups compare),
//! and reconciles in full only when something a reboot, an upgrade, a new peers file or a
//! hand on the node changes has changed.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::Config;
use super::datapath;
use super::node::{self, SegmentNode};
use super::plan::Devices;
use super::{Error, slice};
use sticky_netlink::Socket;
use sticky_netlink::link::Link;
use sticky_overlay::kernel::{Kernel, Live};
use sticky_overlay::stamp;

/// What a pod ADD needs of the node, as the stamp keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub local_ip: IpAddr,
    /// The MTU of the VXLAN device, the bridge and every pod interface.
    pub mtu: u32,
    /// The IPAM section's ranges cut to this node's slice (with `nodeSlice`).
    pub ranges: Option<Value>,
}

/// What a pod ADD needs of the node, and the bridge its veth goes on.
#[derive(Debug, Clone)]
pub struct ForPod {
    pub ready: Ready,
    pub bridge: Link,
}

/// The segment's stamp: `<stateDir>/<network>.segment.stamp`, checked against the whole
/// config (the IPAM section included: the stamp keeps its ranges cut).
fn stamp_file(cfg: &Config) -> stamp::StampFile<'_> {
    stamp::StampFile {
        path: cfg.state_dir.join(format!("{}.segment.stamp", cfg.name)),
        settings: stamp::hash(format!("{cfg:?}").as_bytes()),
        peers_file: cfg.peers_file.as_deref(),
    }
}

/// This node's slice of the IPAM ranges, when the config asks for one.
fn ranges_of(cfg: &Config, node: &SegmentNode) -> Result<Option<Value>, Error> {
    cfg.node_slice
        .map(|p| slice::cut_ranges(&cfg.ipam, node.local_ip, &node.members, p))
        .transpose()
        .map_err(Error::from)
}

/// Read, program; then stamp what it left. The caller holds the segment's lock. A slice that
/// cannot be cut (two nodes on one slot) is an error once the devices are programmed, and
/// nothing is stamped: every ADD looks again.
fn full<K: Kernel>(k: &mut K, cfg: &Config) -> Result<(SegmentNode, ForPod), Error> {
    let stamp_file = stamp_file(cfg);
    let before = stamp_file.before();
    let peers = node::peer_list(cfg)?;
    // The file that was used is kept for when it cannot be: here, under the lock, in the
    // open (working the node out only reads).
    peers.keep_last_good(&cfg.last_good_peers_path());
    let node = node::resolve(k, cfg, &peers)?;
    let Devices { bridge, vxlan } = datapath::ensure(k, cfg, &node)?;
    let ranges = ranges_of(cfg, &node).inspect_err(|_| stamp_file.forget())?;
    let ready = Ready {
        local_ip: node.local_ip,
        mtu: node.mtu,
        ranges,
    };
    // A segment carries frames: no address or sysctl of the node's is on its pods' way.
    let depends = stamp::Depends::default();
    stamp_file.after(
        &before,
        (&vxlan, &bridge, &node.underlay),
        depends,
        ready.clone(),
    );
    Ok((node, ForPod { ready, bridge }))
}

/// ADD's way to the node: the stamp while it holds, else a full reconcile. Under the
/// segment's lock either way.
pub(crate) fn for_pod<K: Kernel>(k: &mut K, cfg: &Config) -> Result<ForPod, Error> {
    let _guard = datapath::lock(cfg)?;
    if let Some(held) = stamped(k, cfg)? {
        return Ok(held);
    }
    full(k, cfg).map(|(_, for_pod)| for_pod)
}

/// What the last full reconcile's stamp says, if it still holds; `None` when a full
/// reconcile is needed.
pub fn stamped<K: Kernel>(k: &mut K, cfg: &Config) -> Result<Option<ForPod>, Error> {
    let held = stamp_file(cfg).holding(k, (&cfg.vxlan(), &cfg.bridge()))?;
    Ok(held.map(|(ready, bridge)| ForPod { ready, bridge }))
}

/// This node's slice of the IPAM ranges for DEL, CHECK, GC and STATUS, programming nothing:
/// the stamp's while it holds, else worked out from the peers (which also proves this node
/// is one of the segment's).
pub fn ranges<K: Kernel>(k: &mut K, cfg: &Config) -> Result<Option<Value>, Error> {
    if let Some(held) = stamped(k, cfg)? {
        return Ok(held.ready.ranges);
    }
    ranges_of(cfg, &node::resolve(k, cfg, &node::peer_list(cfg)?)?)
}

/// What a segment's reconcile did: its bridge and VXLAN device are up, and broadcast frames
/// flood to `flood_to` other nodes. Shown as `sticky-vxlan reconcile` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    pub network: String,
    pub vni: u32,
    pub port: u16,
    pub bridge: String,
    pub vxlan: String,
    pub flood_to: usize,
}

impl std::fmt::Display for Reconciled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "segment {} vni {} port {}: {} and {} up, flood to {} node(s)",
            self.network, self.vni, self.port, self.bridge, self.vxlan, self.flood_to
        )
    }
}

/// Brings the segment network `name` (its config entry `entry`) to what the peers say and
/// says what it did. `sticky-vxlan reconcile` calls it for a file whose entry has
/// `"mode": "segment"`, the node agent for each `--segment-config`.
pub fn network(name: &str, entry: &Value) -> Result<Reconciled, Error> {
    let cfg = Config::from_json(name, entry)?;
    let mut sock = Socket::open()?;
    let k = &mut Live { sock: &mut sock };
    let _guard = datapath::lock(&cfg)?;
    let (node, ForPod { bridge, .. }) = full(k, &cfg)?;
    Ok(Reconciled {
        network: cfg.name.clone(),
        vni: cfg.vni,
        port: cfg.port,
        bridge: bridge.name,
        vxlan: cfg.vxlan(),
        flood_to: node.remote.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::Ipv4Addr;
    use sticky_overlay::fake::Fake;

    /// Segment `vxeth1` (VNI 101) on nodes 1 to 3, with its state in `dir` and this node's
    /// slice of 192.168.11.0/24 a /27.
    fn cfg(dir: &tempfile::TempDir) -> Config {
        let raw = json!({"type": "sticky-vxlan", "mode": "segment", "vni": 101,
            "peers": [{"ip": "192.0.2.1", "subnets": ["10.244.1.0/24"]},
                      {"ip": "192.0.2.2", "subnets": ["10.244.2.0/24"]},
                      {"ip": "192.0.2.3", "subnets": ["10.244.3.0/24"]}],
            "ipam": {"type": "sticky-ipam", "subnet": "192.168.11.0/24"},
            "nodeSlice": 27,
            "stateDir": dir.path()});
        Config::from_json("vxeth1", &raw).unwrap()
    }

    fn dumps(k: &Fake) -> usize {
        k.queries.iter().filter(|q| q.starts_with("dump")).count()
    }

    #[test]
    fn an_add_after_a_full_reconcile_reads_no_table_until_something_changes() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(&dir);
        let mut k = Fake::node("192.0.2.1/24");
        let first = for_pod(&mut k, &c).unwrap();
        assert!(dumps(&k) > 0, "the first ADD reconciles in full");
        assert_eq!(
            first.ready.ranges,
            Some(json!([[{"subnet": "192.168.11.0/24",
                          "rangeStart": "192.168.11.33", "rangeEnd": "192.168.11.62"}]]))
        );
        k.queries.clear();
        let writes = k.writes.len();
        let again = for_pod(&mut k, &c).unwrap();
        assert_eq!(dumps(&k), 0, "{:?}", k.queries);
        assert_eq!(k.writes.len(), writes, "nothing written");
        assert_eq!(again.ready, first.ready);
        assert_eq!(again.bridge.index, first.bridge.index);
        // DEL, CHECK, GC and STATUS take the slice from the stamp too.
        assert_eq!(ranges(&mut k, &c).unwrap(), first.ready.ranges);
        assert_eq!(dumps(&k), 0, "{:?}", k.queries);
        // The VXLAN device deleted (a reboot, `ip link del`): the next ADD makes it again.
        let gone = k.seen.link("segvx101").unwrap().index;
        k.seen.links.retain(|l| l.index != gone);
        k.fdb.retain(|f| f.index != gone);
        k.queries.clear();
        for_pod(&mut k, &c).unwrap();
        assert!(dumps(&k) > 0);
        let made = k.seen.link("segvx101").expect("made again").index;
        assert_eq!(
            k.fdb.iter().filter(|f| f.index == made).count(),
            2,
            "flood to nodes 2, 3"
        );
        // Another config (the slice's length): in full, and the new slice for the pod.
        let mut other = c.clone();
        other.node_slice = Some(26);
        k.queries.clear();
        let wider = for_pod(&mut k, &other).unwrap();
        assert!(dumps(&k) > 0);
        assert_eq!(
            wider.ready.ranges.unwrap()[0][0]["rangeEnd"],
            "192.168.11.126"
        );
    }

    #[test]
    fn an_add_repairs_a_vxlan_device_changed_in_place_or_taken_off_its_bridge() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(&dir);
        let mut k = Fake::node("192.0.2.1/24");
        for_pod(&mut k, &c).unwrap();
        let made = k.seen.link("segvx101").cloned().unwrap();
        type Edit = fn(&mut sticky_netlink::link::Link);
        let edits: [(&str, Edit); 5] = [
            ("local", |l| {
                l.vxlan.as_mut().unwrap().local = Some("192.0.2.9".parse().unwrap());
            }),
            ("learning", |l| {
                l.vxlan.as_mut().unwrap().learning = Some(false)
            }),
            ("port", |l| l.vxlan.as_mut().unwrap().port = Some(4789)),
            ("ttl", |l| l.vxlan.as_mut().unwrap().ttl = Some(1)),
            ("master", |l| l.master = None),
        ];
        for (what, edit) in edits {
            edit(k.link_mut("segvx101"));
            k.queries.clear();
            for_pod(&mut k, &c).unwrap();
            assert!(dumps(&k) > 0, "{what}: not noticed");
            let now = k.seen.link("segvx101").cloned().unwrap();
            assert_eq!(
                (&now.vxlan, now.master.is_some()),
                (&made.vxlan, true),
                "{what}: not repaired"
            );
        }
    }

    #[test]
    fn reading_the_slice_writes_no_last_good_copy_and_the_reconcile_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.json");
        let text = r#"[{"ip":"192.0.2.2","subnets":["10.244.2.0/24"]}]"#;
        std::fs::write(&file, text).unwrap();
        let mut c = cfg(&dir);
        c.peers
            .retain(|p| p.ip != IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)));
        c.peers_file = Some(file.clone());
        let copy = c.last_good_peers_path();
        let mut k = Fake::node("192.0.2.1/24");
        // What DEL, CHECK, GC and STATUS do without a stamp: read, and write nothing.
        assert!(ranges(&mut k, &c).unwrap().is_some());
        assert!(!copy.exists(), "reading never writes");
        let made = for_pod(&mut k, &c).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
        // Broken: the copy stands in, and no flood entry goes.
        std::fs::write(&file, "[{\"ip\": ").unwrap();
        let (node, _) = full(&mut k, &c).unwrap();
        assert!(node.peers_file_error.is_some());
        assert!(
            node.remote
                .contains(&IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)))
        );
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
        assert_eq!(made.ready.local_ip, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    }

    #[test]
    fn nodes_on_one_slice_fail_every_add_and_are_never_stamped() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(&dir);
        // 192.0.2.9 takes slot 1 of /27, as 192.0.2.1 does.
        c.peers
            .push(sticky_overlay::fake::peer("192.0.2.9", "10.244.9.0/24"));
        let mut k = Fake::node("192.0.2.1/24");
        for _ in 0..2 {
            assert!(matches!(
                for_pod(&mut k, &c),
                Err(Error::Slice(slice::Error::Collision { .. }))
            ));
            assert!(!dir.path().join("vxeth1.segment.stamp").exists());
        }
        assert!(
            k.seen.link("segvx101").is_some(),
            "the devices are programmed"
        );
    }
}
