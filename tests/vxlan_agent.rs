//! `sticky-vxlan agent` against a test API server (tests/kube_support: TLS with a test CA,
//! bearer token, list + chunked watch): three node namespaces with an agent each, real packets
//! between pods. A real Kubernetes API server is not run here.

mod kube_support;
mod vxlan_support;

use std::path::PathBuf;
use std::time::Duration;

use kube_support::*;
use serde_json::{Value, json};
use vxlan_support::*;

const API_IP: &str = "192.0.2.254";

struct Cluster {
    topo: Topo,
    api: ApiServer,
    confs: Vec<Value>,
    conf_files: Vec<PathBuf>,
    ca: PathBuf,
    token: PathBuf,
}

impl Cluster {
    fn new() -> Cluster {
        let mut topo = Topo::new(1500);
        for n in 1..=3 {
            topo.add_node(n, 1500);
        }
        // The API server's address lives on the underlay bridge, in the test's namespace.
        ok(&["ip", "-n", &topo.underlay, "addr", "add", &format!("{API_IP}/24"), "dev", "br0"]);
        let netns = PathBuf::from(format!("/run/netns/{}", topo.underlay));
        let api = ApiServer::new(API_IP, Some(&netns));
        let (ca, token) = api.credentials(topo.dir.path());
        let mut confs = Vec::new();
        let mut conf_files = Vec::new();
        for n in 1..=3u8 {
            let peers = topo.dir.path().join(format!("peers-{n}.json"));
            let conf = topo.conf(n, json!({"peersFile": peers}));
            let file = topo.dir.path().join(format!("node-{n}.conf"));
            std::fs::write(&file, conf.to_string()).expect("conf");
            confs.push(conf);
            conf_files.push(file);
        }
        Cluster {
            topo,
            api,
            confs,
            conf_files,
            ca,
            token,
        }
    }

    fn node(n: u8) -> Value {
        node_json(
            &format!("node-{n}"),
            &Topo::node_ip(n),
            &[&Topo::subnet(n)],
            json!({}),
        )
    }

    fn peers_file(&self, n: u8) -> PathBuf {
        self.topo.dir.path().join(format!("peers-{n}.json"))
    }

    fn agent(&self, n: u8, extra: &[&str]) -> Agent {
        let conf = self.conf_files[usize::from(n) - 1].to_string_lossy().into_owned();
        let url = self.api.url();
        let (ca, token) = (self.ca.to_string_lossy(), self.token.to_string_lossy());
        let name = format!("node-{n}");
        let mut args = vec![
            "--config", &conf, "--server", &url, "--ca-file", &ca, "--token-file", &token,
            "--node-name", &name, "--resync", "60",
        ];
        args.extend_from_slice(extra);
        let log = self.topo.dir.path().join(format!("agent-{n}.log"));
        Agent::start(BIN, &self.topo.node_ns(n), log, &args)
    }

    /// True when node `n` routes `subnet` through its VTEP.
    fn routes(&self, n: u8, subnet: &str) -> bool {
        let out = sh(&["ip", "-n", &self.topo.node_ns(n), "route", "show", subnet]);
        String::from_utf8_lossy(&out.stdout).contains("dev sticky.1")
    }

    fn file_has(&self, n: u8, ip: &str) -> bool {
        std::fs::read_to_string(self.peers_file(n)).is_ok_and(|t| t.contains(&format!("\"{ip}\"")))
    }
}

#[test]
fn agents_add_a_node_within_5s_survive_the_api_going_away_and_remove_deleted_nodes() {
    if !can_run() {
        return;
    }
    let mut c = Cluster::new();
    c.api.put_node(Cluster::node(1));
    c.api.put_node(Cluster::node(2));
    let mut agents: Vec<Agent> = (1..=3).map(|n| c.agent(n, &[])).collect();
    wait_for("nodes 1 and 2 to program each other", Duration::from_secs(10), || {
        c.routes(1, &Topo::subnet(2)) && c.routes(2, &Topo::subnet(1))
    });
    let p1 = c.topo.new_pod(1, "a1");
    let p2 = c.topo.new_pod(2, "a2");
    let ip1 = ip_of(&c.topo.add(&p1, &c.confs[0]), false);
    let ip2 = ip_of(&c.topo.add(&p2, &c.confs[1]), false);
    assert!(c.topo.reaches(&p1, &ip2), "pods on nodes 1 and 2 ping");
    assert!(c.topo.reaches(&p2, &ip1));

    // Node 3's Node object appears with a pod CIDR: nodes 1 and 2 program it within 5 s,
    // with no ADD on either.
    let took = {
        c.api.put_node(Cluster::node(3));
        wait_for("nodes 1 and 2 to program node 3", Duration::from_secs(5), || {
            c.routes(1, &Topo::subnet(3)) && c.routes(2, &Topo::subnet(3))
        })
    };
    eprintln!("node 3 programmed on nodes 1 and 2 after {took:?}");
    wait_for("node 3 to program itself", Duration::from_secs(5), || {
        c.routes(3, &Topo::subnet(1))
    });
    let p3 = c.topo.new_pod(3, "a3");
    let ip3 = ip_of(&c.topo.add(&p3, &c.confs[2]), false);
    assert!(c.topo.reaches(&p1, &ip3), "node 1 reaches node 3's pod");
    assert!(c.topo.reaches(&p3, &ip2));
    for a in &agents {
        assert!(a.log_text().contains("peer added: 192.0.2.3"), "{}", a.log_text());
    }

    // The API goes away; node 2 "reboots": agent gone, VTEP gone. Its new agent cannot reach
    // the API and programs the node from the file it kept, with the same MAC.
    c.api.stop();
    let node2 = c.topo.node_ns(2);
    let mac = c.topo.link_mac(&node2, "sticky.1");
    agents[1].kill();
    ok(&["ip", "-n", &node2, "link", "del", "sticky.1"]);
    assert!(!c.topo.ping(&p1, &ip2), "node 2's VTEP is gone");
    agents[1] = c.agent(2, &[]);
    wait_for("node 2's VTEP back from the file", Duration::from_secs(5), || {
        c.routes(2, &Topo::subnet(1)) && c.routes(2, &Topo::subnet(3))
    });
    assert_eq!(c.topo.link_mac(&node2, "sticky.1"), mac, "the kept MAC");
    assert!(c.topo.reaches(&p1, &ip2), "node 1 reaches node 2 again, nothing run on node 1");
    assert!(c.topo.reaches(&p3, &ip2));
    assert!(c.file_has(1, "192.0.2.3") && c.file_has(2, "192.0.2.3"), "offline removes nothing");

    // The API comes back, and node 3 was deleted meanwhile (its history is gone: the agents
    // get 410 and list again): node 3 is removed everywhere.
    c.api.delete_node("node-3");
    c.api.compact();
    c.api.start();
    wait_for("node 3 removed on nodes 1 and 2", Duration::from_secs(20), || {
        !c.routes(1, &Topo::subnet(3)) && !c.routes(2, &Topo::subnet(3))
    });
    assert!(!c.file_has(1, "192.0.2.3") && !c.file_has(2, "192.0.2.3"));
    assert!(c.topo.reaches(&p1, &ip2), "nodes 1 and 2 still talk");
    assert!(agents[0].log_text().contains("410"), "{}", agents[0].log_text());

    // An API restored from an empty backup answers an empty list: beyond the threshold,
    // nothing is removed, and the agents say so.
    c.api.restore(vec![]);
    wait_for("the agents to refuse the empty list", Duration::from_secs(20), || {
        agents[0].log_text().contains("REFUSED") && agents[1].log_text().contains("REFUSED")
    });
    assert!(c.file_has(1, "192.0.2.2") && c.file_has(2, "192.0.2.1"));
    assert!(c.routes(1, &Topo::subnet(2)) && c.routes(2, &Topo::subnet(1)));
    assert!(c.topo.reaches(&p1, &ip2), "traffic goes on");
    for a in &mut agents {
        assert!(a.running(), "{}", a.log_text());
        eprintln!("--- {}\n{}", a.log.display(), a.log_text());
    }
}
