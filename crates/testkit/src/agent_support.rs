//! Three node namespaces joined by an underlay, the test API server on it, and an agent per
//! node: what the agent tests share.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::kube_support::*;
use crate::vxlan_support::*;

pub const API_IP: &str = "192.0.2.254";
/// The API server's address on an IPv6-only underlay ([`Cluster::new_ipv6`]).
pub const API_IP6: &str = "2001:db8::fe";

pub struct Cluster {
    pub topo: Topo,
    pub api: ApiServer,
    pub confs: Vec<Value>,
    pub conf_files: Vec<PathBuf>,
    pub ca: PathBuf,
    pub token: PathBuf,
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster::new()
    }
}

impl Cluster {
    /// Nodes 1 to 3 on an IPv4 underlay (`192.0.2.<n>/24`), the API at [`API_IP`].
    pub fn new() -> Cluster {
        Cluster::on(Topo::new(1500), API_IP, |_| json!({}))
    }

    /// Nodes 1 to 3 on an IPv6-only underlay (`2001:db8::<n>/64`, no IPv4 on it), the API at
    /// [`API_IP6`]. Each node's network is dual-stack (`10.244.<n>.0/24`, `fd00:<n>::/64`);
    /// `extra(n)`'s keys are merged into node `n`'s config (a `localIp`, say).
    pub fn new_ipv6(extra: impl Fn(u8) -> Value) -> Cluster {
        Cluster::on(Topo::new_ipv6(1500), API_IP6, |n| {
            let mut e = extra(n);
            e["v6"] = json!(true);
            e
        })
    }

    fn on(mut topo: Topo, api_ip: &str, extra: impl Fn(u8) -> Value) -> Cluster {
        for n in 1..=3 {
            topo.add_node(n, 1500);
        }
        // The API server's address lives on the underlay bridge, in the test's namespace.
        let ul = topo.underlay.clone();
        if topo.underlay6 {
            let addr = format!("{api_ip}/64");
            ok(&["ip", "-n", &ul, "addr", "add", &addr, "dev", "br0", "nodad"]);
        } else {
            let addr = format!("{api_ip}/24");
            ok(&["ip", "-n", &ul, "addr", "add", &addr, "dev", "br0"]);
        }
        let netns = PathBuf::from(format!("/run/netns/{}", topo.underlay));
        let api = ApiServer::new(api_ip, Some(&netns));
        let (ca, token) = api.credentials(topo.dir.path());
        let mut confs = Vec::new();
        let mut conf_files = Vec::new();
        for n in 1..=3u8 {
            let peers = topo.dir.path().join(format!("peers-{n}.json"));
            let mut keys = extra(n);
            keys["peersFile"] = json!(peers);
            let conf = topo.conf(n, keys);
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

    /// [`Cluster::new`] with the API server's bookmarks once a minute: a benchmark's watches
    /// carry what it measures.
    pub fn for_bench() -> Cluster {
        let mut c = Cluster::new();
        c.api.stop();
        c.api.bookmark_every = std::time::Duration::from_secs(60);
        c.api.start();
        c
    }

    pub fn node(n: u8) -> Value {
        node_json(
            &format!("node-{n}"),
            &Topo::node_ip(n),
            &[&Topo::subnet(n)],
            json!({}),
        )
    }

    /// Node `n` of [`Cluster::new_ipv6`] as a dual-stack kubelet reports it: InternalIPs
    /// `192.0.2.<n>` (not on the underlay) then `2001:db8::<n>`, pod CIDRs of both families.
    pub fn node_dual(n: u8) -> Value {
        let node = node_json(
            &format!("node-{n}"),
            &Topo::node_ip(n),
            &[&Topo::subnet(n), &Topo::subnet6(n)],
            json!({}),
        );
        with_internal_ips(node, &[&Topo::node_ip(n), &format!("2001:db8::{n}")])
    }

    pub fn peers_file(&self, n: u8) -> PathBuf {
        self.topo.dir.path().join(format!("peers-{n}.json"))
    }

    pub fn agent(&self, n: u8, extra: &[&str]) -> Agent {
        self.agent_env(n, extra, &[])
    }

    /// [`Cluster::agent`] with these environment variables (a proxy, say).
    pub fn agent_env(&self, n: u8, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let conf = &self.conf_files[usize::from(n) - 1];
        let mut args = self
            .api
            .agent_args(conf, &self.ca, &self.token, &format!("node-{n}"));
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = self.topo.dir.path().join(format!("agent-{n}.log"));
        Agent::start_env(agent_bin(), &self.topo.node_ns(n), log, &args, env)
    }

    /// An agent that finds the API through a kubeconfig file (YAML, CA by path, token).
    pub fn agent_kubeconfig(&self, n: u8) -> Agent {
        let conf = self.conf_files[usize::from(n) - 1]
            .to_string_lossy()
            .into_owned();
        let kubeconfig = self.api.kubeconfig(self.topo.dir.path());
        let log = self.topo.dir.path().join(format!("agent-{n}.log"));
        let args = [
            "--config",
            &conf,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ];
        Agent::start(agent_bin(), &self.topo.node_ns(n), log, &args)
    }

    /// True when node `n` routes `subnet` (of either family) through its VTEP.
    pub fn routes(&self, n: u8, subnet: &str) -> bool {
        // One lookup of the route itself (`fibmatch`), not `ip route show`, which dumps the
        // whole table: at 100,000 routes the dump is what a benchmark polling for one route
        // would measure, and its CPU is taken from the agent being measured.
        let family = if subnet.contains(':') { "-6" } else { "-4" };
        let ns = self.topo.node_ns(n);
        let (addr, len) = subnet.split_once('/').unwrap_or((subnet, ""));
        let out = sh(&["ip", "-n", &ns, family, "route", "get", "fibmatch", addr]);
        let text = String::from_utf8_lossy(&out.stdout);
        // The route found must be this very subnet's (a host route is printed bare).
        let prefix = text.split_whitespace().next().unwrap_or_default();
        let host = matches!(len, "32" | "128") && prefix == addr;
        (prefix == subnet || host) && text.contains("dev sticky.1")
    }

    /// How many routes node `n` holds with sticky-vxlan's protocol (one per remote peer).
    pub fn peer_routes(&self, n: u8) -> usize {
        let out = sh(&[
            "ip",
            "-n",
            &self.topo.node_ns(n),
            "route",
            "show",
            "proto",
            "118",
        ]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    pub fn file_has(&self, n: u8, ip: &str) -> bool {
        std::fs::read_to_string(self.peers_file(n)).is_ok_and(|t| t.contains(&format!("\"{ip}\"")))
    }
}
