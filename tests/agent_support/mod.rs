//! Three node namespaces joined by an underlay, the test API server on it, and an agent per
//! node: what the agent tests share.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::kube_support::*;
use crate::vxlan_support::*;

pub const API_IP: &str = "192.0.2.254";

pub struct Cluster {
    pub topo: Topo,
    pub api: ApiServer,
    pub confs: Vec<Value>,
    pub conf_files: Vec<PathBuf>,
    pub ca: PathBuf,
    pub token: PathBuf,
}

impl Cluster {
    pub fn new() -> Cluster {
        let mut topo = Topo::new(1500);
        for n in 1..=3 {
            topo.add_node(n, 1500);
        }
        // The API server's address lives on the underlay bridge, in the test's namespace.
        ok(&[
            "ip",
            "-n",
            &topo.underlay,
            "addr",
            "add",
            &format!("{API_IP}/24"),
            "dev",
            "br0",
        ]);
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

    pub fn node(n: u8) -> Value {
        node_json(
            &format!("node-{n}"),
            &Topo::node_ip(n),
            &[&Topo::subnet(n)],
            json!({}),
        )
    }

    pub fn peers_file(&self, n: u8) -> PathBuf {
        self.topo.dir.path().join(format!("peers-{n}.json"))
    }

    pub fn agent(&self, n: u8, extra: &[&str]) -> Agent {
        let conf = self.conf_files[usize::from(n) - 1]
            .to_string_lossy()
            .into_owned();
        let url = self.api.url();
        let (ca, token) = (self.ca.to_string_lossy(), self.token.to_string_lossy());
        let name = format!("node-{n}");
        let mut args = vec![
            "--config",
            &conf,
            "--server",
            &url,
            "--ca-file",
            &ca,
            "--token-file",
            &token,
            "--node-name",
            &name,
            "--resync",
            "60",
        ];
        args.extend_from_slice(extra);
        let log = self.topo.dir.path().join(format!("agent-{n}.log"));
        Agent::start(AGENT_BIN, &self.topo.node_ns(n), log, &args)
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
        Agent::start(AGENT_BIN, &self.topo.node_ns(n), log, &args)
    }

    /// True when node `n` routes `subnet` through its VTEP.
    pub fn routes(&self, n: u8, subnet: &str) -> bool {
        let out = sh(&["ip", "-n", &self.topo.node_ns(n), "route", "show", subnet]);
        String::from_utf8_lossy(&out.stdout).contains("dev sticky.1")
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
